//! What the running kernel offers: kprobes, symbols.
//!
//! Everything is read below a root directory (`/` on a live system), so the decisions are
//! unit-tested against fixture trees in `tests/fixtures/<kernel>/`.

use std::{
    fs,
    path::{Path, PathBuf},
};

/// A kernel to inspect, rooted at `/` or at a fixture directory.
#[derive(Clone, Debug)]
pub struct Kernel {
    root: PathBuf,
}

/// Where `/proc/kallsyms` places a function.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Symbol {
    pub name: String,
    /// `None` for vmlinux, else the module name (`ib_uverbs`).
    pub module: Option<String>,
    /// How many text symbols carry this exact name (kprobes reject ambiguous names since 6.6).
    pub occurrences: usize,
}

impl Kernel {
    /// The running kernel.
    pub fn live() -> Self {
        Self::at("/")
    }

    /// A kernel described by files below `root` (tests).
    pub fn at(root: impl AsRef<Path>) -> Self {
        Self {
            root: root.as_ref().to_path_buf(),
        }
    }

    fn path(&self, abs: &str) -> PathBuf {
        self.root.join(abs.trim_start_matches('/'))
    }

    /// The kernel release (`uname -r`), if readable.
    pub fn release(&self) -> Option<String> {
        fs::read_to_string(self.path("/proc/sys/kernel/osrelease"))
            .ok()
            .map(|s| s.trim().to_owned())
    }

    /// kprobes can be created through perf (the kprobe PMU, which aya uses).
    pub fn has_kprobes(&self) -> bool {
        self.path("/sys/bus/event_source/devices/kprobe/type")
            .is_file()
    }

    /// Look a function up in `/proc/kallsyms`.
    pub fn find_function(&self, name: &str) -> Option<Symbol> {
        let text = fs::read_to_string(self.path("/proc/kallsyms")).ok()?;
        find_function_in(&text, name)
    }
}

/// Find text symbol `name` in kallsyms-formatted `text` (`addr type name [module]`).
pub fn find_function_in(text: &str, name: &str) -> Option<Symbol> {
    let mut found: Option<Symbol> = None;
    for line in text.lines() {
        let mut it = line.split_whitespace();
        let (Some(_addr), Some(kind), Some(sym)) = (it.next(), it.next(), it.next()) else {
            continue;
        };
        if sym != name || !matches!(kind, "t" | "T") {
            continue;
        }
        let module = it
            .next()
            .map(|m| m.trim_start_matches('[').trim_end_matches(']').to_owned());
        match &mut found {
            Some(s) => s.occurrences += 1,
            None => {
                found = Some(Symbol {
                    name: name.to_owned(),
                    module,
                    occurrences: 1,
                })
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> Kernel {
        Kernel::at(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/fixtures")
                .join(name),
        )
    }

    #[test]
    fn rxe_guest_has_kprobes_tracepoints_and_rdma_functions() {
        let k = fixture("guest-6.1-rxe");
        assert!(k.has_kprobes());
        let s = k
            .find_function("ib_uverbs_comp_handler")
            .expect("in kallsyms");
        assert_eq!(s.module.as_deref(), Some("ib_uverbs"));
        assert_eq!(s.occurrences, 1);
        let napi = k.find_function("__napi_poll").expect("vmlinux function");
        assert_eq!(napi.module, None);
        assert!(k.release().unwrap().starts_with("6.1."));
    }

    #[test]
    fn host_without_rdma_or_kprobes() {
        let k = fixture("host-6.18-no-rdma");
        assert!(!k.has_kprobes());
        assert_eq!(k.find_function("ib_uverbs_comp_handler"), None);
    }

    #[test]
    fn kallsyms_parsing_ignores_data_symbols_and_counts_duplicates() {
        let text = "\
ffffffff81000000 T startup_64
ffffffffc0a01000 t dup_fn\t[mod_a]
ffffffffc0b01000 t dup_fn\t[mod_b]
ffffffffc0c01000 d data_sym\t[mod_a]
ffffffffc0c02000 t data_sym.cold\t[mod_a]
";
        let d = find_function_in(text, "dup_fn").unwrap();
        assert_eq!(d.occurrences, 2);
        assert_eq!(d.module.as_deref(), Some("mod_a"));
        assert_eq!(find_function_in(text, "data_sym"), None);
        assert_eq!(find_function_in(text, "startup_64").unwrap().module, None);
    }
}

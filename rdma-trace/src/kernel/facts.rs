//! What the running kernel offers: kprobes, BTF, symbols, tracepoints, RDMA devices, IRQs.
//!
//! Everything is read below a root directory (`/` on a live system), so probe selection is
//! unit-tested against fixture trees in `tests/fixtures/<kernel>/` (an mlx5 host, the rxe guest,
//! a host without RDMA).

use std::{
    collections::{HashMap, HashSet},
    fs,
    path::{Path, PathBuf},
};

use crate::kernel::probes::Driver;

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

/// An RDMA device from `/sys/class/infiniband`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RdmaDevice {
    pub name: String,
    /// Kernel driver of the parent device (`mlx5_core`), when it has one.
    pub driver: Option<String>,
    /// Netdev a software device (rxe, siw) runs on.
    pub parent_netdev: Option<String>,
}

impl RdmaDevice {
    /// Soft-RoCE: rxe devices have a parent netdev and no device driver.
    pub fn is_rxe(&self) -> bool {
        self.name.starts_with("rxe") || (self.driver.is_none() && self.parent_netdev.is_some())
    }

    pub fn is_mlx5(&self) -> bool {
        self.driver
            .as_deref()
            .is_some_and(|d| d.starts_with("mlx5"))
    }

    /// The hardware driver path of this device. `device/driver` names the PCI driver the
    /// RDMA driver sits on (ib_device's parent is the PCI function): mlx5_core, ice or i40e
    /// (irdma), bnxt_en (bnxt_re), mana (mana_ib).
    pub fn hardware(&self) -> Option<Driver> {
        let drv = self.driver.as_deref().unwrap_or("");
        let name = self.name.as_str();
        if self.is_mlx5() {
            Some(Driver::Mlx5)
        } else if matches!(drv, "irdma" | "ice" | "i40e") || name.starts_with("irdma") {
            Some(Driver::Irdma)
        } else if drv.starts_with("bnxt") || name.starts_with("bnxt_re") {
            Some(Driver::BnxtRe)
        } else if drv.starts_with("mana") || name.starts_with("mana_") {
            Some(Driver::Mana)
        } else {
            None
        }
    }
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

    /// The directory the kernel's files are read below (`/` for the running kernel).
    pub fn root(&self) -> &Path {
        &self.root
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

    /// The kernel describes its own types (needed by fentry/fexit).
    pub fn has_btf(&self) -> bool {
        self.path("/sys/kernel/btf/vmlinux").is_file()
    }

    /// Value of a build option from `/boot/config-<release>`, or `/lib/modules/<release>/config`
    /// where Debian's split kernel packages (6.17 on) put it (`y`, `m`, or `None` when unset or
    /// when neither file is there).
    pub fn config(&self, option: &str) -> Option<String> {
        let release = self.release()?;
        let text = [
            format!("/boot/config-{release}"),
            format!("/lib/modules/{release}/config"),
        ]
        .iter()
        .find_map(|p| fs::read_to_string(self.path(p)).ok())?;
        let prefix = format!("{option}=");
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix).map(str::to_owned))
    }

    /// Look the given functions up in `/proc/kallsyms` (one pass over the file).
    pub fn functions(&self, names: &[&str]) -> HashMap<String, Symbol> {
        fs::read_to_string(self.path("/proc/kallsyms"))
            .map(|text| find_functions_in(&text, names))
            .unwrap_or_default()
    }

    /// The kernel text symbol each of `addrs` lies in (`/proc/kallsyms`, one pass), by address.
    pub fn symbols_at(&self, addrs: &[u64]) -> HashMap<u64, TextSymbol> {
        if addrs.is_empty() {
            return HashMap::new();
        }
        fs::read_to_string(self.path("/proc/kallsyms"))
            .map(|text| symbols_at_in(&text, addrs))
            .unwrap_or_default()
    }

    /// Names of the loaded modules (`/proc/modules`), `None` when unreadable.
    pub fn loaded_modules(&self) -> Option<HashSet<String>> {
        let text = fs::read_to_string(self.path("/proc/modules")).ok()?;
        Some(
            text.lines()
                .filter_map(|l| l.split_whitespace().next())
                .map(str::to_owned)
                .collect(),
        )
    }

    /// Which of `names` are on the kprobe blacklist (`NOKPROBE_SYMBOL`, `__kprobes`, noinstr
    /// sections): kprobes refuse them. `None` when debugfs is not mounted.
    pub fn kprobe_blacklisted(&self, names: &[&str]) -> Option<HashSet<String>> {
        let text = fs::read_to_string(self.path("/sys/kernel/debug/kprobes/blacklist")).ok()?;
        let wanted: HashSet<&str> = names.iter().copied().collect();
        Some(
            text.lines()
                .filter_map(|l| l.split_whitespace().nth(1))
                .filter(|n| wanted.contains(n))
                .map(str::to_owned)
                .collect(),
        )
    }

    /// A file of tracefs (`available_events`), from the first of its usual mount points that
    /// has it. `None` when tracefs is not mounted there (or the file is not readable).
    fn tracefs(&self, file: &str) -> Option<String> {
        ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"]
            .into_iter()
            .find_map(|dir| fs::read_to_string(self.path(dir).join(file)).ok())
    }

    /// The `format` file of tracepoint `event` (`sched/sched_switch`), when tracefs is mounted.
    pub fn event_format(&self, event: &str) -> Option<String> {
        self.tracefs(&format!("events/{event}/format"))
    }

    /// Which of `names` ftrace can trace (`available_filter_functions`; fentry needs it,
    /// `notrace` functions are missing). `None` when tracefs is not mounted.
    pub fn traceable(&self, names: &[&str]) -> Option<HashSet<String>> {
        let text = self.tracefs("available_filter_functions")?;
        let wanted = Wanted::new(names);
        Some(
            text.lines()
                .filter_map(|l| l.split_ascii_whitespace().next())
                .filter(|n| wanted.contains(n))
                .map(str::to_owned)
                .collect(),
        )
    }

    /// `category:name` of every tracepoint, when tracefs is mounted (`None` otherwise).
    pub fn available_events(&self) -> Option<HashSet<String>> {
        let text = self.tracefs("available_events")?;
        Some(
            text.lines()
                .map(|l| l.trim().to_owned())
                .filter(|l| !l.is_empty())
                .collect(),
        )
    }

    /// RDMA devices and their drivers.
    pub fn rdma_devices(&self) -> Vec<RdmaDevice> {
        let class = self.path("/sys/class/infiniband");
        let Ok(entries) = fs::read_dir(&class) else {
            return Vec::new();
        };
        let mut devices: Vec<RdmaDevice> = entries
            .filter_map(Result::ok)
            .map(|e| {
                let dir = e.path();
                RdmaDevice {
                    name: e.file_name().to_string_lossy().into_owned(),
                    driver: fs::read_link(dir.join("device/driver"))
                        .ok()
                        .and_then(|t| t.file_name().map(|n| n.to_string_lossy().into_owned())),
                    parent_netdev: fs::read_to_string(dir.join("parent"))
                        .ok()
                        .map(|s| s.trim().to_owned())
                        .filter(|s| !s.is_empty()),
                }
            })
            .collect();
        devices.sort_by(|a, b| a.name.cmp(&b.name));
        devices
    }

    /// Path of shared library `name` (`libibverbs.so.1`) in the usual library directories.
    pub fn find_library(&self, name: &str) -> Option<PathBuf> {
        [
            "/usr/lib/x86_64-linux-gnu",
            "/lib/x86_64-linux-gnu",
            "/usr/lib/aarch64-linux-gnu",
            "/usr/lib64",
            "/lib64",
            "/usr/lib",
            "/lib",
        ]
        .into_iter()
        .map(|dir| self.path(dir).join(name))
        .find(|p| p.is_file())
    }

    /// Hard IRQs from `/proc/interrupts`: (number, action name).
    pub fn interrupts(&self) -> Vec<(u32, String)> {
        fs::read_to_string(self.path("/proc/interrupts"))
            .map(|t| parse_interrupts(&t))
            .unwrap_or_default()
    }
}

/// A kernel function an address lies in: its name, and its module (none: built in).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TextSymbol {
    pub name: String,
    pub module: Option<String>,
}

/// A function is taken to hold an address at most this far past its start.
const MAX_FUNCTION_BYTES: u64 = 1 << 16;

/// For each of `addrs`, the text symbol of kallsyms-formatted `text` that starts at it or
/// nearest below it (within [`MAX_FUNCTION_BYTES`]); addresses with none are left out.
pub fn symbols_at_in(text: &str, addrs: &[u64]) -> HashMap<u64, TextSymbol> {
    let mut syms: Vec<(u64, &str, Option<&str>)> = text
        .lines()
        .filter_map(|line| {
            let mut it = line.split_ascii_whitespace();
            let (addr, kind, name) = (it.next()?, it.next()?, it.next()?);
            if !matches!(kind, "t" | "T") {
                return None;
            }
            let addr = u64::from_str_radix(addr, 16).ok().filter(|&a| a != 0)?;
            let module = it
                .next()
                .map(|m| m.trim_start_matches('[').trim_end_matches(']'));
            Some((addr, name, module))
        })
        .collect();
    syms.sort_unstable_by_key(|s| s.0);
    addrs
        .iter()
        .filter_map(|&a| {
            let i = syms.partition_point(|s| s.0 <= a).checked_sub(1)?;
            let (start, name, module) = syms[i];
            (a - start < MAX_FUNCTION_BYTES).then(|| {
                (
                    a,
                    TextSymbol {
                        name: name.to_owned(),
                        module: module.map(str::to_owned),
                    },
                )
            })
        })
        .collect()
}

/// Find the text symbols `names` in kallsyms-formatted `text` (`addr type name [module]`).
pub fn find_functions_in(text: &str, names: &[&str]) -> HashMap<String, Symbol> {
    let wanted = Wanted::new(names);
    let mut found: HashMap<String, Symbol> = HashMap::new();
    for line in text.lines() {
        let mut it = line.split_ascii_whitespace();
        let (Some(_addr), Some(kind), Some(sym)) = (it.next(), it.next(), it.next()) else {
            continue;
        };
        if !matches!(kind, "t" | "T") || !wanted.contains(sym) {
            continue;
        }
        let module = it
            .next()
            .map(|m| m.trim_start_matches('[').trim_end_matches(']').to_owned());
        found
            .entry(sym.to_owned())
            .and_modify(|s| s.occurrences += 1)
            .or_insert(Symbol {
                name: sym.to_owned(),
                module,
                occurrences: 1,
            });
    }
    found
}

/// A few names looked up among the ~10^5 lines of kallsyms or `available_filter_functions`:
/// a name of a length none of them has is rejected before it is hashed (most are), which
/// matters where start-up runs slowly (an emulated guest).
struct Wanted<'a> {
    names: HashSet<&'a str>,
    /// Bit `n` set: some name is `n` bytes long (names of 64 bytes or more share bit 63).
    lengths: u64,
}

impl<'a> Wanted<'a> {
    fn new(names: &[&'a str]) -> Self {
        Self {
            names: names.iter().copied().collect(),
            lengths: names.iter().fold(0, |m, n| m | Self::bit(n)),
        }
    }

    fn bit(name: &str) -> u64 {
        1 << name.len().min(63)
    }

    fn contains(&self, name: &str) -> bool {
        self.lengths & Self::bit(name) != 0 && self.names.contains(name)
    }
}

/// Offset of `field` in a tracepoint record, from the event's tracefs `format` text
/// (`\tfield:pid_t next_pid;\toffset:56;\tsize:4;\tsigned:1;`). Array (`comm[16]`) and pointer
/// (`char *name`) declarations match their bare name; `common_pid` is not `pid`.
pub fn format_offset(format: &str, field: &str) -> Option<u32> {
    format.lines().find_map(|line| {
        let decl = line.trim().strip_prefix("field:")?.split(';').next()?;
        let name = decl
            .rsplit(|c: char| c.is_whitespace() || c == '*')
            .next()?;
        if name.split('[').next()? != field {
            return None;
        }
        line.split(';')
            .find_map(|part| part.trim().strip_prefix("offset:"))?
            .trim()
            .parse()
            .ok()
    })
}

/// Numbered lines of `/proc/interrupts`: `  24:  10  20  PCI-MSIX-0000:00:03.0  1-edge  mlx5_comp0@pci:...`.
/// The action name is the last column.
pub fn parse_interrupts(text: &str) -> Vec<(u32, String)> {
    text.lines()
        .filter_map(|line| {
            let (num, rest) = line.trim_start().split_once(':')?;
            let irq = num.trim().parse().ok()?;
            let name = rest.split_whitespace().last()?;
            (name.parse::<u64>().is_err()).then(|| (irq, name.to_owned()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    pub fn fixture(name: &str) -> Kernel {
        Kernel::at(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/fixtures")
                .join(name),
        )
    }

    #[test]
    fn config_of_a_split_kernel_package() {
        let dir = std::env::temp_dir().join(format!("facts-split-{}", std::process::id()));
        let modules = dir.join("lib/modules/7.3.4+deb13-amd64");
        fs::create_dir_all(&modules).unwrap();
        fs::create_dir_all(dir.join("proc/sys/kernel")).unwrap();
        fs::write(dir.join("proc/sys/kernel/osrelease"), "7.3.4+deb13-amd64\n").unwrap();
        fs::write(modules.join("config"), "CONFIG_KPROBES=y\n").unwrap();
        let k = Kernel::at(dir.clone());
        assert_eq!(k.config("CONFIG_KPROBES").as_deref(), Some("y"));
        assert_eq!(k.config("CONFIG_RDMA_RXE"), None);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn rxe_guest() {
        let k = fixture("guest-6.1-rxe");
        assert!(k.has_kprobes() && k.has_btf());
        assert_eq!(k.config("CONFIG_KPROBES").as_deref(), Some("y"));
        assert_eq!(k.config("CONFIG_RDMA_RXE").as_deref(), Some("m"));
        let f = k.functions(&["ib_uverbs_comp_handler", "__napi_poll", "mlx5_ib_poll_cq"]);
        assert_eq!(
            f["ib_uverbs_comp_handler"].module.as_deref(),
            Some("ib_uverbs")
        );
        assert_eq!(f["__napi_poll"].module, None);
        assert!(!f.contains_key("mlx5_ib_poll_cq"));
        let devs = k.rdma_devices();
        assert_eq!(
            devs.iter().map(|d| d.name.as_str()).collect::<Vec<_>>(),
            ["rxe0", "rxe1"]
        );
        assert!(devs.iter().all(RdmaDevice::is_rxe));
        assert_eq!(devs[0].parent_netdev.as_deref(), Some("va"));
        assert!(k.available_events().unwrap().contains("irq:softirq_entry"));
    }

    #[test]
    fn mlx5_host() {
        let k = fixture("mlx5-6.1");
        let devs = k.rdma_devices();
        assert_eq!(devs.len(), 1);
        assert!(devs[0].is_mlx5() && !devs[0].is_rxe());
        assert_eq!(devs[0].hardware(), Some(Driver::Mlx5));
        let m = k.loaded_modules().unwrap();
        assert!(m.contains("mlx5_ib") && m.contains("mlx5_core") && !m.contains("irdma"));
        assert_eq!(
            k.kprobe_blacklisted(&["mlx5_ib_cq_comp"]),
            Some(HashSet::new())
        );
        let t = k
            .traceable(&["mlx5_ib_cq_comp", "no_such_function"])
            .unwrap();
        assert_eq!(t, HashSet::from(["mlx5_ib_cq_comp".to_owned()]));
        let irqs = k.interrupts();
        assert!(
            irqs.iter().any(|(_, n)| n.starts_with("mlx5_comp0")),
            "{irqs:?}"
        );
        assert!(irqs.iter().all(|(_, n)| n != "Non-maskable"), "{irqs:?}");
    }

    #[test]
    fn hardware_paths_from_the_pci_driver_or_the_name() {
        let dev = |name: &str, driver: Option<&str>| RdmaDevice {
            name: name.to_owned(),
            driver: driver.map(str::to_owned),
            parent_netdev: None,
        };
        assert_eq!(
            dev("rocep59s0f0", Some("ice")).hardware(),
            Some(Driver::Irdma)
        );
        assert_eq!(dev("irdma1", None).hardware(), Some(Driver::Irdma));
        assert_eq!(
            dev("bnxt_re0", Some("bnxt_en")).hardware(),
            Some(Driver::BnxtRe)
        );
        assert_eq!(dev("mana_0", Some("mana")).hardware(), Some(Driver::Mana));
        assert_eq!(
            dev("mlx5_0", Some("mlx5_core")).hardware(),
            Some(Driver::Mlx5)
        );
        assert_eq!(dev("siw0", None).hardware(), None);
    }

    #[test]
    fn host_without_rdma_or_kprobes() {
        let k = fixture("host-6.18-no-rdma");
        assert!(!k.has_kprobes());
        assert!(k.rdma_devices().is_empty());
        assert!(k.functions(&["ib_uverbs_comp_handler"]).is_empty());
        assert_eq!(k.available_events(), None, "tracefs not mounted");
    }

    /// The fields every tracepoint record starts with (6.1).
    macro_rules! common_fields {
        () => {
            "\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;
\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;
"
        };
    }

    const SWITCH_6_1: &str = concat!(
        "name: sched_switch\nID: 316\nformat:\n",
        common_fields!(),
        "
\tfield:char prev_comm[16];\toffset:8;\tsize:16;\tsigned:0;
\tfield:pid_t prev_pid;\toffset:24;\tsize:4;\tsigned:1;
\tfield:int prev_prio;\toffset:28;\tsize:4;\tsigned:1;
\tfield:long prev_state;\toffset:32;\tsize:8;\tsigned:1;
\tfield:char next_comm[16];\toffset:40;\tsize:16;\tsigned:0;
\tfield:pid_t next_pid;\toffset:56;\tsize:4;\tsigned:1;
\tfield:int next_prio;\toffset:60;\tsize:4;\tsigned:1;
"
    );

    const WAKING_6_1: &str = "name: sched_waking
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:char comm[16];\toffset:8;\tsize:16;\tsigned:0;
\tfield:pid_t pid;\toffset:24;\tsize:4;\tsigned:1;
\tfield:int prio;\toffset:28;\tsize:4;\tsigned:1;
\tfield:int target_cpu;\toffset:32;\tsize:4;\tsigned:1;
";

    const NEWTASK: &str = concat!(
        "name: task_newtask\nID: 130\nformat:\n",
        common_fields!(),
        "
\tfield:pid_t pid;\toffset:8;\tsize:4;\tsigned:1;
\tfield:char comm[16];\toffset:12;\tsize:16;\tsigned:0;
\tfield:unsigned long clone_flags;\toffset:32;\tsize:8;\tsigned:0;
\tfield:short oom_score_adj;\toffset:40;\tsize:2;\tsigned:1;

print fmt: \"pid=%d comm=%s clone_flags=%lx oom_score_adj=%hd\", REC->pid, REC->comm, REC->clone_flags, REC->oom_score_adj
"
    );

    #[test]
    fn tracepoint_offsets_from_format_files() {
        assert_eq!(format_offset(SWITCH_6_1, "next_pid"), Some(56));
        assert_eq!(format_offset(SWITCH_6_1, "prev_pid"), Some(24));
        assert_eq!(format_offset(SWITCH_6_1, "next_comm"), Some(40));
        assert_eq!(
            format_offset(SWITCH_6_1, "pid"),
            None,
            "common_pid is not pid"
        );
        assert_eq!(format_offset(WAKING_6_1, "pid"), Some(24));
        assert_eq!(format_offset(WAKING_6_1, "target_cpu"), Some(32));
        assert_eq!(format_offset(NEWTASK, "pid"), Some(8));
        assert_eq!(format_offset(NEWTASK, "clone_flags"), Some(32));
        assert_eq!(format_offset(NEWTASK, "comm"), Some(12));
        assert_eq!(format_offset(NEWTASK, "common_pid"), Some(4));
        assert_eq!(format_offset(NEWTASK, "flags"), None);
        assert_eq!(
            format_offset("\tfield:const char * name;\toffset:16;\tsize:8;", "name"),
            Some(16),
            "a pointer's name"
        );
        assert_eq!(format_offset("garbage", "pid"), None);
    }

    #[test]
    fn wanted_names_match_exactly_whatever_their_length() {
        let long = "a_function_name_of_more_than_sixty_four_bytes_which_shares_bit_63_x";
        let w = Wanted::new(&["rxe_rcv", long]);
        assert!(w.contains("rxe_rcv"));
        assert!(w.contains(long));
        // Same length as a wanted name, or longer than 63 bytes: hashed, and still refused.
        assert!(!w.contains("rxe_req"));
        assert!(!w.contains(&long.replace('x', "y")));
        assert!(!w.contains("rxe_rcv_"));
        assert!(!w.contains(""));
    }

    #[test]
    fn event_formats_from_either_tracefs_mount_point() {
        let root = std::env::temp_dir().join(format!("rdma-trace-kernel-{}", std::process::id()));
        let dir = root.join("sys/kernel/debug/tracing/events/task/task_newtask");
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("format"), NEWTASK).unwrap();
        let k = Kernel::at(&root);
        let format = k.event_format("task/task_newtask");
        let other = k.event_format("sched/sched_switch");
        fs::remove_dir_all(&root).unwrap();
        assert_eq!(format.as_deref(), Some(NEWTASK));
        assert_eq!(other, None);
    }

    #[test]
    fn an_address_is_named_by_the_text_symbol_it_lies_in() {
        // The truth: the listing itself, in kallsyms' unsorted module order, with data
        // symbols between the functions and a hidden (zero) address.
        let text = "\
ffffffffc0a20000 t nvmet_rdma_recv_done\t[nvmet_rdma]
ffffffffc0a10000 t nvme_rdma_recv_done\t[nvme_rdma]
ffffffffc0a10100 d nvme_rdma_data\t[nvme_rdma]
ffffffff81000000 T _stext
0000000000000000 t hidden
ffffffffc0a10200 t nvme_rdma_send_done\t[nvme_rdma]
";
        let got = symbols_at_in(
            text,
            &[
                0xffffffffc0a10000,
                0xffffffffc0a10150,
                0xffffffffc0a20010,
                0xffffffff81000000 + MAX_FUNCTION_BYTES,
                0x10,
            ],
        );
        let named = |a: u64| got.get(&a).map(|s| (s.name.as_str(), s.module.as_deref()));
        assert_eq!(
            named(0xffffffffc0a10000),
            Some(("nvme_rdma_recv_done", Some("nvme_rdma")))
        );
        // In the function before the data symbol.
        assert_eq!(
            named(0xffffffffc0a10150),
            Some(("nvme_rdma_recv_done", Some("nvme_rdma")))
        );
        assert_eq!(
            named(0xffffffffc0a20010),
            Some(("nvmet_rdma_recv_done", Some("nvmet_rdma")))
        );
        assert_eq!(
            named(0xffffffff81000000 + MAX_FUNCTION_BYTES),
            None,
            "too far"
        );
        assert_eq!(named(0x10), None, "below every function");
        assert_eq!(got.len(), 3);
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
        let f = find_functions_in(text, &["dup_fn", "data_sym", "startup_64"]);
        assert_eq!(f["dup_fn"].occurrences, 2);
        assert_eq!(f["dup_fn"].module.as_deref(), Some("mod_a"));
        assert!(!f.contains_key("data_sym"));
        assert_eq!(f["startup_64"].module, None);
    }

    #[test]
    fn interrupts_parsing() {
        let text = "\
           CPU0       CPU1
  0:         44          0   IO-APIC   2-edge      timer
 24:       1200         30   PCI-MSI 49152-edge      virtio0-input.0
 25:          0          0   PCI-MSIX-0000:3b:00.0 1-edge mlx5_comp0@pci:0000:3b:00.0
NMI:          0          0   Non-maskable interrupts
";
        let irqs = parse_interrupts(text);
        assert_eq!(
            irqs,
            [
                (0, "timer".to_owned()),
                (24, "virtio0-input.0".to_owned()),
                (25, "mlx5_comp0@pci:0000:3b:00.0".to_owned())
            ]
        );
    }
}

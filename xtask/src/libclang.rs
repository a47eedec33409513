//! Which libclang rdma-sys' bindgen gets.
//!
//! rdma-sys 0.3 runs bindgen 0.59, which panics with libclang 16 and newer. clang-sys (under
//! bindgen) takes `LIBCLANG_PATH` when it is set, else the newest libclang it finds. So a host
//! whose newest libclang is older than 16 needs nothing, and one that also has a newer libclang
//! needs `LIBCLANG_PATH`. [`configure`] finds that out before xtask runs cargo: when the newest
//! libclang is 16 or later and an older one exists, it sets `LIBCLANG_PATH` to the newest older
//! one for every cargo that xtask starts. A plain `cargo build` on such a host needs the variable
//! set by hand (docs/install.md says so).

use std::path::{Path, PathBuf};

use crate::util::say;

/// bindgen 0.59 works with libclang versions below this.
pub const FIRST_BAD_VERSION: u32 = 16;

/// Where libclang shared libraries are looked for: like clang-sys, `/usr/lib*` and
/// `/usr/local/lib*` and two levels below them (`/usr/lib/llvm-14/lib`,
/// `/usr/lib/x86_64-linux-gnu`, `/usr/lib64/llvm15/lib`).
fn candidates() -> Vec<(PathBuf, u32)> {
    let mut roots = Vec::new();
    for parent in ["/usr", "/usr/local"] {
        let Ok(entries) = std::fs::read_dir(parent) else {
            continue;
        };
        for e in entries.flatten() {
            if e.file_name().to_string_lossy().starts_with("lib") {
                roots.push(e.path());
            }
        }
    }
    let mut dirs = roots.clone();
    let mut level = roots;
    for _ in 0..2 {
        let next: Vec<PathBuf> = level.iter().flat_map(|d| subdirs(d)).collect();
        dirs.extend(next.iter().cloned());
        level = next;
    }
    let mut found = Vec::new();
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if !is_libclang(&name) {
                continue;
            }
            let real = std::fs::canonicalize(e.path()).unwrap_or_else(|_| e.path());
            let real_name = real
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or(name);
            if let Some(v) = version(&real_name) {
                found.push((dir.clone(), v));
            }
        }
    }
    found
}

fn subdirs(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default()
}

/// A libclang shared library (not libclang-cpp, not a static archive).
fn is_libclang(name: &str) -> bool {
    name.starts_with("libclang")
        && name.contains(".so")
        && !name.contains("-cpp")
        && (name.starts_with("libclang.so") || name.starts_with("libclang-"))
}

/// The major version in a libclang file name: `libclang-14.0.6.so`, `libclang-14.so.1`,
/// `libclang.so.19.1.7`.
pub fn version(name: &str) -> Option<u32> {
    let rest = name
        .strip_prefix("libclang-")
        .or_else(|| name.strip_prefix("libclang.so."))?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// What to do about `LIBCLANG_PATH`, given the libclang libraries found (directory, version).
#[derive(Debug, PartialEq, Eq)]
pub enum Choice {
    /// The newest libclang is one bindgen 0.59 handles (or there is none): leave it to clang-sys.
    Default,
    /// Point `LIBCLANG_PATH` at this directory.
    Set(PathBuf),
    /// Only libclang 16 or newer: the rdma-demo build will fail.
    NoneUsable(u32),
}

pub fn choose(found: &[(PathBuf, u32)]) -> Choice {
    let Some(newest) = found.iter().map(|(_, v)| *v).max() else {
        return Choice::Default;
    };
    if newest < FIRST_BAD_VERSION {
        return Choice::Default;
    }
    // clang-sys takes the newest libclang of the directory it is pointed at: a directory that
    // also holds a bad one is no use.
    let bad_dirs: Vec<&PathBuf> = found
        .iter()
        .filter(|(_, v)| *v >= FIRST_BAD_VERSION)
        .map(|(d, _)| d)
        .collect();
    let mut good: Vec<&(PathBuf, u32)> = found
        .iter()
        .filter(|(d, v)| *v < FIRST_BAD_VERSION && !bad_dirs.contains(&d))
        .collect();
    // The newest good version; on a tie an `llvm-N` directory, then the path, so the choice
    // does not depend on the order the directories were read in.
    good.sort_by_key(|(d, v)| {
        (
            std::cmp::Reverse(*v),
            !d.to_string_lossy().contains("llvm-"),
            d.clone(),
        )
    });
    good.first()
        .map_or(Choice::NoneUsable(newest), |(d, _)| Choice::Set(d.clone()))
}

pub fn configure() {
    if std::env::var_os("LIBCLANG_PATH").is_some() {
        return;
    }
    match choose(&candidates()) {
        Choice::Default => {}
        Choice::Set(dir) => {
            // SAFETY: called first thing in main, before xtask starts any thread.
            unsafe { std::env::set_var("LIBCLANG_PATH", &dir) };
        }
        Choice::NoneUsable(newest) => say(format!(
            "warning: only libclang {newest} found; rdma-sys' bindgen needs libclang < \
             {FIRST_BAD_VERSION} (install one, e.g. libclang-14-dev, and/or set LIBCLANG_PATH): \
             see docs/install.md"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_read_off_file_names() {
        assert_eq!(version("libclang-14.0.6.so"), Some(14));
        assert_eq!(version("libclang-14.so.14.0.6"), Some(14));
        assert_eq!(version("libclang.so.19.1.7"), Some(19));
        assert_eq!(version("libclang.so"), None);
        assert!(!is_libclang("libclang-cpp.so.22.1"));
        assert!(!is_libclang("libclangAST.a"));
        assert!(is_libclang("libclang-14.so.1"));
    }

    #[test]
    fn an_older_libclang_is_chosen_only_when_a_newer_one_would_win() {
        let llvm14 = || (PathBuf::from("/usr/lib/llvm-14/lib"), 14);
        let llvm15 = || (PathBuf::from("/usr/lib64/llvm15/lib"), 15);
        let multiarch = |v| (PathBuf::from("/usr/lib/x86_64-linux-gnu"), v);
        let set = |(dir, _): (PathBuf, u32)| Choice::Set(dir);
        let cases = [
            (vec![], Choice::Default),
            (vec![llvm14()], Choice::Default),
            (vec![llvm14(), multiarch(19), multiarch(14)], set(llvm14())),
            (vec![llvm14(), llvm15(), multiarch(18)], set(llvm15())),
            (vec![multiarch(18)], Choice::NoneUsable(18)),
            // The order the directories were read in does not matter: the multiarch directory
            // also holds a 19, so the llvm-14 one wins whichever comes first.
            (vec![multiarch(14), multiarch(19), llvm14()], set(llvm14())),
            // Only the multiarch directory has a good one, beside a bad one: none is usable.
            (vec![multiarch(14), multiarch(19)], Choice::NoneUsable(19)),
        ];
        for (found, want) in cases {
            assert_eq!(choose(&found), want, "{found:?}");
        }
    }
}

//! The kernel's BPF run-time statistics: per attached program, how often it ran and for how
//! long ([`ProgramStat`]), kept on while a [`RunTimeStats`] lives.

use std::{fs, os::fd::OwnedFd};

const SYSCTL: &str = "/proc/sys/kernel/bpf_stats_enabled";

/// Keeps the kernel's BPF run-time statistics on while it lives.
#[derive(Debug)]
pub struct RunTimeStats {
    /// How the statistics were turned on (`bpf_enable_stats`, `sysctl`, `already on`), or why
    /// not (`unavailable: ...`).
    pub how: String,
    _fd: Option<OwnedFd>,
    /// The sysctl was 0 and we set it: set it back on drop.
    restore_sysctl: bool,
}

impl RunTimeStats {
    /// BPF_ENABLE_STATS (Linux 5.8; the statistics stop when the fd closes), else the
    /// `kernel.bpf_stats_enabled` sysctl (restored on drop). Never fails: without statistics
    /// the report says so and the figures are 0.
    pub fn enable() -> Self {
        match aya::sys::enable_stats(aya::sys::Stats::RunTime) {
            Ok(fd) => Self {
                how: "bpf_enable_stats".to_owned(),
                _fd: Some(fd),
                restore_sysctl: false,
            },
            Err(e) => {
                let syscall_err = crate::error::chain(&e);
                match fs::read_to_string(SYSCTL).map(|s| s.trim().to_owned()) {
                    Ok(v) if v == "1" => Self {
                        how: "already on (kernel.bpf_stats_enabled = 1)".to_owned(),
                        _fd: None,
                        restore_sysctl: false,
                    },
                    Ok(_) => match fs::write(SYSCTL, "1") {
                        Ok(()) => Self {
                            how: "sysctl".to_owned(),
                            _fd: None,
                            restore_sysctl: true,
                        },
                        Err(w) => {
                            Self::unavailable(format!("{syscall_err}; writing {SYSCTL}: {w}"))
                        }
                    },
                    Err(r) => Self::unavailable(format!("{syscall_err}; reading {SYSCTL}: {r}")),
                }
            }
        }
    }

    fn unavailable(why: String) -> Self {
        Self {
            how: format!("unavailable: {why}"),
            _fd: None,
            restore_sysctl: false,
        }
    }
}

impl Drop for RunTimeStats {
    fn drop(&mut self) {
        if self.restore_sysctl {
            let _ = fs::write(SYSCTL, "0");
        }
    }
}

/// Cumulative statistics of one attached program.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProgramStat {
    /// The program's name in the eBPF object (`kentry_3`).
    pub name: String,
    /// What it is attached to (a kernel function or a tracepoint).
    pub target: String,
    pub runs: u64,
    pub run_ns: u64,
}

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

/// Statistics of one attached program: cumulative as the kernel keeps them, or over a window
/// ([`ProgramStat::since`]).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ProgramStat {
    /// The program's name in the eBPF object (`kentry_3`).
    pub name: String,
    /// What it is attached to (a kernel function or a tracepoint).
    pub target: String,
    pub runs: u64,
    pub run_ns: u64,
    /// Runs the kernel skipped because a BPF program was already running on the CPU
    /// (`recursion_misses`; `None` where the kernel does not report it).
    pub recursion_misses: Option<u64>,
    /// Misses of the kprobes or kretprobes it is attached to (`None` before Linux 6.7, or for
    /// another kind of program): see [`kprobe_misses`].
    pub kprobe_misses: Option<u64>,
}

impl ProgramStat {
    /// The counts added since `before` (the same program's earlier snapshot; counts from 0
    /// without one). A miss count stays `None` when this snapshot has none.
    pub fn since(&self, before: Option<&Self>) -> Self {
        let delta = |now: u64, then: Option<u64>| now.saturating_sub(then.unwrap_or(0));
        let misses =
            |count: fn(&Self) -> Option<u64>| count(self).map(|m| delta(m, before.and_then(count)));
        Self {
            name: self.name.clone(),
            target: self.target.clone(),
            runs: delta(self.runs, before.map(|b| b.runs)),
            run_ns: delta(self.run_ns, before.map(|b| b.run_ns)),
            recursion_misses: misses(|s| s.recursion_misses),
            kprobe_misses: misses(|s| s.kprobe_misses),
        }
    }

    /// `program`'s statistics now (attached to `target`), with its kprobes' misses from
    /// `kprobe_misses` (by program id, [`kprobe_misses`]); `None` when the kernel gives none.
    pub fn of(
        name: &str,
        target: &str,
        program: &aya::programs::Program,
        kprobe_misses: Option<&std::collections::HashMap<u32, u64>>,
    ) -> Option<Self> {
        use std::os::fd::{AsFd as _, AsRawFd as _};
        let info = program.info().ok()?;
        let runs = info.run_count();
        let run_ns = info.run_time().as_nanos() as u64;
        let recursion_misses = program
            .fd()
            .ok()
            .and_then(|fd| recursion_misses(fd.as_fd().as_raw_fd(), runs, run_ns));
        Some(Self {
            name: name.to_owned(),
            target: target.to_owned(),
            runs,
            run_ns,
            recursion_misses,
            kprobe_misses: kprobe_misses.and_then(|m| m.get(&info.id()).copied()),
        })
    }
}

const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;

/// Offsets in `struct bpf_prog_info` (uapi `linux/bpf.h`): `run_time_ns`, `run_cnt` (5.1) and
/// `recursion_misses` (5.12), and the size up to its end.
const RUN_TIME_NS_AT: usize = 192;
const RUN_CNT_AT: usize = 200;
const RECURSION_MISSES_AT: usize = 208;
const INFO_LEN_WITH_MISSES: usize = RECURSION_MISSES_AT + 8;

/// `union bpf_attr` for `BPF_OBJ_GET_INFO_BY_FD`.
#[repr(C)]
struct InfoAttr {
    bpf_fd: u32,
    info_len: u32,
    info: u64,
}

/// Runs of the program behind `prog_fd` that the kernel skipped because another BPF program
/// was running on the same CPU (`bpf_prog_info.recursion_misses`, Linux 5.12; kprobe programs
/// are counted from 6.7). aya 0.14 does not expose it: one raw `BPF_OBJ_GET_INFO_BY_FD`. `None`
/// on a kernel without the field, or when the run count and time read with it are below
/// `runs_before` and `run_ns_before` (read earlier through aya): the layout is not the one
/// expected.
fn recursion_misses(prog_fd: i32, runs_before: u64, run_ns_before: u64) -> Option<u64> {
    let (info, len) = obj_info(prog_fd)?;
    let at = |offset: usize| info[offset / 8];
    (len >= INFO_LEN_WITH_MISSES
        && at(RUN_CNT_AT) >= runs_before
        && at(RUN_TIME_NS_AT) >= run_ns_before)
        .then(|| at(RECURSION_MISSES_AT))
}

const BPF_LINK_GET_FD_BY_ID: libc::c_long = 30;
const BPF_LINK_GET_NEXT_ID: libc::c_long = 31;
/// `BPF_LINK_TYPE_PERF_EVENT`, and `enum bpf_perf_event_type`'s `BPF_PERF_EVENT_KPROBE` and
/// `BPF_PERF_EVENT_KRETPROBE`.
const BPF_LINK_TYPE_PERF_EVENT: u32 = 7;
const KPROBE_TYPES: [u32; 2] = [3, 4];
/// Offsets in `struct bpf_link_info` of `type`, `prog_id`, `perf_event.type` and
/// `perf_event.kprobe.missed` (Linux 6.7).
const LINK_INFO_AT: [usize; 4] = [0, 8, 16, 48];

/// `union bpf_attr` for `BPF_LINK_GET_NEXT_ID` (`start_id`) and `BPF_LINK_GET_FD_BY_ID`
/// (`link_id`, at the same place).
#[repr(C)]
#[derive(Default)]
struct IdAttr {
    id: u32,
    next_id: u32,
    open_flags: u32,
}

/// Per program id: how often the kernel's kprobes and kretprobes that run it missed (a
/// kretprobe without a free instance, `maxactive`; a kprobe hit while another ran), summed over
/// its perf-event links (`bpf_link_info.perf_event.kprobe.missed`). `None` before Linux 6.7,
/// which does not report it: the field reads 0 there. Walks every BPF link of the system
/// (`BPF_LINK_GET_NEXT_ID`): for reports and scrapes, not for every refresh.
pub fn kprobe_misses() -> Option<std::collections::HashMap<u32, u64>> {
    use std::os::fd::{AsRawFd as _, FromRawFd as _};
    static SINCE_6_7: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let reported = *SINCE_6_7.get_or_init(|| {
        fs::read_to_string("/proc/sys/kernel/osrelease")
            .ok()
            .and_then(|r| crate::kernel::plan::release_version(r.trim()))
            .is_some_and(|v| v >= (6, 7))
    });
    if !reported {
        return None;
    }
    let mut out = std::collections::HashMap::new();
    let mut id = 0u32;
    loop {
        let mut next = IdAttr {
            id,
            ..IdAttr::default()
        };
        // SAFETY: a valid BPF_LINK_GET_NEXT_ID attribute (plain integers, no pointers).
        if unsafe { super::batch::sys_bpf(BPF_LINK_GET_NEXT_ID, &mut next) } != 0 {
            break; // ENOENT: no link after `id`
        }
        id = next.next_id;
        let mut by_id = IdAttr {
            id,
            ..IdAttr::default()
        };
        // SAFETY: a valid BPF_LINK_GET_FD_BY_ID attribute (plain integers, no pointers).
        let fd = unsafe { super::batch::sys_bpf(BPF_LINK_GET_FD_BY_ID, &mut by_id) };
        let Ok(fd) = i32::try_from(fd) else { continue };
        if fd < 0 {
            continue; // the link went away meanwhile
        }
        // SAFETY: the kernel just returned this new descriptor; nothing else owns it.
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
        let Some((info, _)) = obj_info(fd.as_raw_fd()) else {
            continue;
        };
        let word = |at: usize| info[at / 8];
        let half = |at: usize| (word(at) >> (8 * (at % 8))) as u32;
        let [link_type, prog_id, perf_event_type, missed] = LINK_INFO_AT;
        if half(link_type) == BPF_LINK_TYPE_PERF_EVENT
            && KPROBE_TYPES.contains(&half(perf_event_type))
        {
            *out.entry(half(prog_id)).or_default() += word(missed);
        }
    }
    Some(out)
}

/// `BPF_OBJ_GET_INFO_BY_FD` of `fd` into 512 bytes (more than any kernel's struct for a program
/// or a link), and the bytes the kernel wrote; `None` when the call fails. The rest of the
/// buffer stays 0.
fn obj_info(fd: i32) -> Option<([u64; 64], usize)> {
    let mut info = [0u64; 64];
    let mut attr = InfoAttr {
        bpf_fd: u32::try_from(fd).ok()?,
        info_len: std::mem::size_of_val(&info) as u32,
        info: info.as_mut_ptr() as u64,
    };
    // SAFETY: `attr` is a valid BPF_OBJ_GET_INFO_BY_FD attribute: `info` points to a writable
    // buffer of `info_len` bytes that outlives the call; the kernel writes at most that many
    // and sets `info_len` to what it wrote.
    let rc = unsafe { super::batch::sys_bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr) };
    (rc == 0).then_some((info, attr.info_len as usize))
}

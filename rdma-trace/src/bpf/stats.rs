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
                        Err(w) if w.kind() == std::io::ErrorKind::PermissionDenied => {
                            Self::unavailable(format!(
                                "needs CAP_SYS_ADMIN ({syscall_err}; writing {SYSCTL}: {w})"
                            ))
                        }
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
/// which does not report it: the field reads 0 there.
///
/// The first call walks every BPF link of the system (`BPF_LINK_GET_NEXT_ID`); later calls
/// read again only the kprobe links found so far, and look for new links only above the
/// highest id seen (the kernel hands out link ids in increasing order): one call per refresh
/// costs two system calls per kprobe link, not three per link of the whole system.
pub fn kprobe_misses() -> Option<std::collections::HashMap<u32, u64>> {
    static SINCE_6_7: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    static LINKS: std::sync::Mutex<KprobeLinks> = std::sync::Mutex::new(KprobeLinks::new());
    let reported = *SINCE_6_7.get_or_init(|| {
        fs::read_to_string("/proc/sys/kernel/osrelease")
            .ok()
            .and_then(|r| crate::kernel::plan::release_version(r.trim()))
            .is_some_and(|v| v >= (6, 7))
    });
    if !reported {
        return None;
    }
    let mut links = LINKS.lock().unwrap_or_else(|e| e.into_inner());
    Some(links.misses(&mut SysLinks))
}

/// What [`KprobeLinks`] asks of the kernel's BPF links.
trait LinkSource {
    /// The first link id above `id`; `None` when there is none.
    fn next_id(&mut self, id: u32) -> Option<u32>;
    /// Link `id`: `None` when it is gone; `Some(None)` when it is not a kprobe perf-event link;
    /// else its program id and miss count.
    fn kprobe(&mut self, id: u32) -> Option<Option<(u32, u64)>>;
}

/// The kprobe links seen so far, and the highest link id looked at.
struct KprobeLinks {
    kprobes: Vec<u32>,
    highest: u32,
}

impl KprobeLinks {
    const fn new() -> Self {
        Self {
            kprobes: Vec::new(),
            highest: 0,
        }
    }

    /// Misses by program id: the known kprobe links read again (those gone are forgotten),
    /// then each link above the highest id seen.
    fn misses(&mut self, src: &mut impl LinkSource) -> std::collections::HashMap<u32, u64> {
        let mut out = std::collections::HashMap::new();
        let mut add = |found: Option<(u32, u64)>| {
            if let Some((prog, missed)) = found {
                *out.entry(prog).or_default() += missed;
            }
        };
        self.kprobes.retain(|&id| match src.kprobe(id) {
            Some(found) => {
                add(found);
                true
            }
            None => false,
        });
        while let Some(id) = src.next_id(self.highest) {
            self.highest = id;
            if let Some(found @ Some(_)) = src.kprobe(id) {
                add(found);
                self.kprobes.push(id);
            }
        }
        out
    }
}

/// The running kernel's links, through raw `bpf(2)` calls (aya 0.14 has no link iteration).
struct SysLinks;

impl LinkSource for SysLinks {
    fn next_id(&mut self, id: u32) -> Option<u32> {
        let mut next = IdAttr {
            id,
            ..IdAttr::default()
        };
        // SAFETY: a valid BPF_LINK_GET_NEXT_ID attribute (plain integers, no pointers).
        let rc = unsafe { super::batch::sys_bpf(BPF_LINK_GET_NEXT_ID, &mut next) };
        (rc == 0).then_some(next.next_id) // ENOENT: no link after `id`
    }

    fn kprobe(&mut self, id: u32) -> Option<Option<(u32, u64)>> {
        use std::os::fd::{AsRawFd as _, FromRawFd as _};
        let mut by_id = IdAttr {
            id,
            ..IdAttr::default()
        };
        // SAFETY: a valid BPF_LINK_GET_FD_BY_ID attribute (plain integers, no pointers).
        let fd = unsafe { super::batch::sys_bpf(BPF_LINK_GET_FD_BY_ID, &mut by_id) };
        let fd = i32::try_from(fd).ok().filter(|&fd| fd >= 0)?; // gone meanwhile
        // SAFETY: the kernel just returned this new descriptor; nothing else owns it.
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
        let (info, _) = obj_info(fd.as_raw_fd())?;
        let word = |at: usize| info[at / 8];
        let half = |at: usize| (word(at) >> (8 * (at % 8))) as u32;
        let [link_type, prog_id, perf_event_type, missed] = LINK_INFO_AT;
        Some(
            (half(link_type) == BPF_LINK_TYPE_PERF_EVENT
                && KPROBE_TYPES.contains(&half(perf_event_type)))
            .then(|| (half(prog_id), word(missed))),
        )
    }
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

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashMap};

    use super::*;

    /// A made-up link table (id → kprobe (program, misses) or another kind), counting what was
    /// asked of it.
    #[derive(Default)]
    struct FakeLinks {
        links: BTreeMap<u32, Option<(u32, u64)>>,
        reads: Vec<u32>,
    }

    impl LinkSource for FakeLinks {
        fn next_id(&mut self, id: u32) -> Option<u32> {
            self.links.range(id + 1..).next().map(|(&id, _)| id)
        }

        fn kprobe(&mut self, id: u32) -> Option<Option<(u32, u64)>> {
            self.reads.push(id);
            self.links.get(&id).copied()
        }
    }

    #[test]
    fn kprobe_links_are_found_once_and_then_read_alone() {
        let mut src = FakeLinks::default();
        // Links 1-3: a cgroup link, our kprobe and kretprobe of program 7 (two links of one
        // program add up), a kprobe of program 9.
        src.links.insert(1, None);
        src.links.insert(2, Some((7, 5)));
        src.links.insert(3, Some((7, 1)));
        src.links.insert(4, Some((9, 0)));
        let mut cache = KprobeLinks::new();
        assert_eq!(cache.misses(&mut src), HashMap::from([(7, 6), (9, 0)]));
        assert_eq!(src.reads, [1, 2, 3, 4], "the first call walks every link");
        // Later: more misses, link 4 gone, a new kprobe link 6 and another kind 5.
        src.reads.clear();
        src.links.insert(2, Some((7, 50)));
        src.links.remove(&4);
        src.links.insert(5, None);
        src.links.insert(6, Some((11, 2)));
        assert_eq!(cache.misses(&mut src), HashMap::from([(7, 51), (11, 2)]));
        assert_eq!(
            src.reads,
            [2, 3, 4, 5, 6],
            "known kprobes, then only new ids"
        );
        src.reads.clear();
        cache.misses(&mut src);
        assert_eq!(
            src.reads,
            [2, 3, 6],
            "the other kinds and the gone link are not read"
        );
    }
}

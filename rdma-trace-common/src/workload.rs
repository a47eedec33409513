//! Workloads other than the demo (`rdma-trace run -- CMD`, `--pid`, `--all`) and the timeline
//! sample (`--timeline`): what the eBPF side shares with the loader.

/// `WORKLOAD` global: no per-process counts (the demo runs, `export`).
pub const WL_OFF: u32 = 0;
/// Per-process counts for the processes in `TGIDS`; their children join it at fork.
pub const WL_TREE: u32 = 1;
/// Per-process counts for every process (`--all`).
pub const WL_ALL: u32 = 2;

/// Processes whose counts and names one run keeps.
pub const MAX_PROCS: u32 = 1024;
/// (process, probe or function) counters one run keeps.
pub const MAX_PROC_KEYS: u32 = 16384;

/// In a `PROC_EVENTS` key: the low half names a kernel-function slot (calls of that function),
/// not a probe.
pub const PROC_KEY_SLOT: u32 = 0x1_0000;

/// `PROC_EVENTS` key: events of probe `probe` (or, with [`PROC_KEY_SLOT`], calls of the function
/// in slot `n`) while a thread of process `tgid` was current.
#[inline(always)]
pub fn proc_key(tgid: u32, what: u32) -> u64 {
    ((tgid as u64) << 32) | what as u64
}

/// `CLONE_THREAD` of clone(2): a new thread, not a new process.
pub const CLONE_THREAD: u64 = 0x0001_0000;

/// Timeline record kinds.
pub const TL_FUNC_ENTRY: u32 = 0;
pub const TL_FUNC_RETURN: u32 = 1;
pub const TL_SOFTIRQ_ENTRY: u32 = 2;
pub const TL_SOFTIRQ_EXIT: u32 = 3;
pub const TL_IRQ_ENTRY: u32 = 4;
pub const TL_IRQ_EXIT: u32 = 5;
/// A NAPI poll finished (`arg` = packets handled).
pub const TL_NAPI_POLL: u32 = 6;

/// Ring buffer size with `--timeline` (without it, one page: the map must exist but stays empty).
pub const TIMELINE_RING_BYTES: u32 = 8 << 20;

/// One record of the timeline ring buffer.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimelineEvent {
    /// bpf_ktime_get_ns (CLOCK_MONOTONIC).
    pub ts_ns: u64,
    /// tgid << 32 | tid of the current task.
    pub pid_tgid: u64,
    pub cpu: u32,
    /// `TL_*`.
    pub kind: u32,
    /// Function slot, softirq vector or IRQ number.
    pub id: u32,
    /// Packets of a NAPI poll; 0 otherwise.
    pub arg: u32,
}

#[cfg(feature = "user")]
mod user {
    // SAFETY: TimelineEvent is repr(C), Copy, made of integers with no padding (8 + 8 + 4 × 4
    // bytes): any bit pattern is valid.
    unsafe impl aya::Pod for super::TimelineEvent {}
}

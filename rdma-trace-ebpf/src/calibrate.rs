//! Empty programs for the loader's start-up calibration of what each attach mechanism costs
//! (`rdma-trace/src/calibrate.rs`): it attaches one at a time to the umask path, calls
//! umask a known number of times and times the loop against a loop without the probe. The
//! bodies do nothing on purpose: the difference is the mechanism itself.

use aya_ebpf::{
    macros::{fentry, kprobe, kretprobe, raw_tracepoint, tracepoint},
    programs::{
        FEntryContext, ProbeContext, RawTracePointContext, RetProbeContext, TracePointContext,
    },
};

#[kprobe(function = "__x64_sys_umask")]
pub fn cal_kprobe(_ctx: ProbeContext) -> u32 {
    0
}

#[kretprobe(function = "__x64_sys_umask")]
pub fn cal_kretprobe(_ctx: RetProbeContext) -> u32 {
    0
}

#[raw_tracepoint(tracepoint = "sys_enter")]
pub fn cal_raw_tp(_ctx: RawTracePointContext) -> i32 {
    0
}

/// The perf-event form of the same tracepoint as `cal_raw_tp` (the waterfall's
/// `sched_waking` and `sched_switch` programs use this form).
#[tracepoint]
pub fn cal_tracepoint(_ctx: TracePointContext) -> u32 {
    0
}

#[fentry(function = "__x64_sys_umask")]
pub fn cal_fentry(_ctx: FEntryContext) -> u32 {
    0
}

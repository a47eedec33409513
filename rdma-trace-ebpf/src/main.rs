//! eBPF programs of rdma-trace.
//!
//! Two shapes so far, both building per-CPU log2 histograms (nanoseconds) that the loader sums:
//! - softirq duration: tracepoints `irq:softirq_entry` → `irq:softirq_exit`, per vector,
//!   attached as raw tracepoints (no tracefs needed, and cheaper than perf tracepoints);
//! - function duration: a kprobe/kretprobe pair per function slot (`func_entry_N`/`func_return_N`), the
//!   loader decides which kernel function each slot is attached to.
#![no_std]
#![no_main]

use aya_ebpf::{
    helpers::bpf_ktime_get_ns,
    macros::{kprobe, kretprobe, map, raw_tracepoint},
    maps::PerCpuArray,
    programs::{ProbeContext, RawTracePointContext, RetProbeContext},
};
use rdma_trace_common::{
    FC_ENTRY, FC_RETURN, FC_RETURN_NO_ENTRY, FUNC_SLOTS, NR_FC, NR_SOFTIRQS, SLOTS, func_counter,
    func_hist_index, log2_slot, softirq_hist_index,
};

/// Start time of the running softirq, per vector (softirqs do not nest on one CPU).
#[map]
static SOFTIRQ_START: PerCpuArray<u64> = PerCpuArray::with_max_entries(NR_SOFTIRQS, 0);
/// Softirq duration histograms, see `softirq_hist_index`.
#[map]
static SOFTIRQ_HIST: PerCpuArray<u64> = PerCpuArray::with_max_entries(NR_SOFTIRQS * SLOTS, 0);
/// Entry time of the function in each slot on this CPU (the traced functions do not sleep).
#[map]
static FUNC_START: PerCpuArray<u64> = PerCpuArray::with_max_entries(FUNC_SLOTS, 0);
/// Function duration histograms, see `func_hist_index`.
#[map]
static FUNC_HIST: PerCpuArray<u64> = PerCpuArray::with_max_entries(FUNC_SLOTS * SLOTS, 0);
/// Function counters, see `func_counter`.
#[map]
static FUNC_COUNTS: PerCpuArray<u64> = PerCpuArray::with_max_entries(FUNC_SLOTS * NR_FC, 0);

#[inline(always)]
fn bump(map: &PerCpuArray<u64>, index: u32) {
    if let Some(p) = map.get_ptr_mut(index) {
        // SAFETY: `p` points into this CPU's slot of a per-CPU array; nothing else on this CPU
        // runs this program concurrently (BPF programs are not re-entered on one CPU).
        unsafe { *p += 1 };
    }
}

/// Take the start time stored at `index` (clearing it) and return the elapsed ns, if any.
#[inline(always)]
fn take_elapsed(map: &PerCpuArray<u64>, index: u32) -> Option<u64> {
    let p = map.get_ptr_mut(index)?;
    // SAFETY: as in `bump`, the per-CPU slot is only touched by this CPU.
    let start = unsafe { core::mem::replace(&mut *p, 0) };
    if start == 0 {
        return None;
    }
    // SAFETY: bpf_ktime_get_ns has no preconditions.
    Some(unsafe { bpf_ktime_get_ns() }.saturating_sub(start))
}

#[inline(always)]
fn store_now(map: &PerCpuArray<u64>, index: u32) {
    if let Some(p) = map.get_ptr_mut(index) {
        // SAFETY: as in `bump`; bpf_ktime_get_ns has no preconditions.
        unsafe { *p = bpf_ktime_get_ns() };
    }
}

/// The softirq vector: the tracepoint's only argument, `TP_PROTO(unsigned int vec_nr)`.
#[inline(always)]
fn softirq_vec(ctx: &RawTracePointContext) -> Option<u32> {
    let vec: u64 = ctx.arg(0);
    (vec < NR_SOFTIRQS as u64).then_some(vec as u32)
}

#[raw_tracepoint(tracepoint = "softirq_entry")]
pub fn softirq_entry(ctx: RawTracePointContext) -> i32 {
    if let Some(vec) = softirq_vec(&ctx) {
        store_now(&SOFTIRQ_START, vec);
    }
    0
}

#[raw_tracepoint(tracepoint = "softirq_exit")]
pub fn softirq_exit(ctx: RawTracePointContext) -> i32 {
    if let Some(vec) = softirq_vec(&ctx)
        && let Some(ns) = take_elapsed(&SOFTIRQ_START, vec)
    {
        bump(&SOFTIRQ_HIST, softirq_hist_index(vec, log2_slot(ns)));
    }
    0
}

#[inline(always)]
fn func_entry(slot: u32) -> u32 {
    bump(&FUNC_COUNTS, func_counter(slot, FC_ENTRY));
    store_now(&FUNC_START, slot);
    0
}

#[inline(always)]
fn func_return(slot: u32) -> u32 {
    bump(&FUNC_COUNTS, func_counter(slot, FC_RETURN));
    match take_elapsed(&FUNC_START, slot) {
        Some(ns) => bump(&FUNC_HIST, func_hist_index(slot, log2_slot(ns))),
        None => bump(&FUNC_COUNTS, func_counter(slot, FC_RETURN_NO_ENTRY)),
    }
    0
}

/// One kprobe/kretprobe pair per function slot; the slot number is part of the program.
macro_rules! func_slot {
    ($slot:literal, $entry:ident, $exit:ident) => {
        #[kprobe]
        pub fn $entry(_ctx: ProbeContext) -> u32 {
            func_entry($slot)
        }
        #[kretprobe]
        pub fn $exit(_ctx: RetProbeContext) -> u32 {
            func_return($slot)
        }
    };
}

func_slot!(0, func_entry_0, func_return_0);
func_slot!(1, func_entry_1, func_return_1);
func_slot!(2, func_entry_2, func_return_2);
func_slot!(3, func_entry_3, func_return_3);
func_slot!(4, func_entry_4, func_return_4);
func_slot!(5, func_entry_5, func_return_5);
func_slot!(6, func_entry_6, func_return_6);
func_slot!(7, func_entry_7, func_return_7);

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";

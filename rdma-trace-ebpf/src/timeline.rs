//! `--timeline`: every kernel-function entry and return of the probe table, and the softirq,
//! IRQ and NAPI events of its probes, as records in a ring buffer. Only with `TIMELINE` = 1
//! (set by the loader); otherwise the verifier drops this path (a read-only global) and the
//! ring buffer is one page. The loader keeps a bounded sample of what arrives.

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_get_smp_processor_id},
    macros::map,
    maps::{PerCpuArray, RingBuf},
};
use rdma_trace_common::workload::TimelineEvent;

use crate::config;

/// 1: emit timeline records.
#[unsafe(no_mangle)]
static TIMELINE: u32 = 0;

/// Timeline records (the loader sets its size: `TIMELINE_RING_BYTES` with `--timeline`).
#[map]
static TIMELINE_EVENTS: RingBuf = RingBuf::with_byte_size(4096, 0);
/// Records lost because the ring buffer was full, per CPU.
#[map]
static TIMELINE_DROPS: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// Whether timeline records are emitted (a constant for the verifier).
#[inline(always)]
pub fn on() -> bool {
    config(&TIMELINE) != 0
}

#[inline(always)]
pub fn emit(kind: u32, id: u32, arg: u32, ts_ns: u64) {
    if !on() {
        return;
    }
    match TIMELINE_EVENTS.reserve::<TimelineEvent>(0) {
        Some(mut entry) => {
            entry.write(TimelineEvent {
                ts_ns,
                pid_tgid: bpf_get_current_pid_tgid(),
                // SAFETY: bpf_get_smp_processor_id has no preconditions.
                cpu: unsafe { bpf_get_smp_processor_id() },
                kind,
                id,
                arg,
            });
            entry.submit(0);
        }
        None => {
            if let Some(p) = TIMELINE_DROPS.get_ptr_mut(0) {
                // SAFETY: this CPU's value of a per-CPU array; no re-entry on one CPU.
                unsafe { *p += 1 };
            }
        }
    }
}

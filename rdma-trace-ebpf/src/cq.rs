//! `rdma-trace cq`: one kprobe per CQ-path function (`cq_N` → `CQ_FUNCTIONS[N]`) pushes a
//! [`CqEvent`] with the caller's kernel stack id into a ring buffer: a function log like
//! ftrace's, for `rdma-trace cq` (not for the histogram path, which never uses the ring).

use aya_ebpf::{
    helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_get_smp_processor_id},
    macros::{kprobe, map},
    maps::{Array, RingBuf, StackTrace},
    programs::{ProbeContext, tracing::StackIdContext as _},
};
use rdma_trace_common::cq::CqEvent;

use crate::now;

/// Events for user space (256 KiB; when full, events are dropped and counted in CQ_DROPS).
#[map]
static CQ_EVENTS: RingBuf = RingBuf::with_byte_size(256 * 1024, 0);
/// Kernel stacks of the events, by id.
#[map]
static CQ_STACKS: StackTrace = StackTrace::with_max_entries(8192, 0);
/// Entry 0: only this process (tgid), 0 for every process. Set by the loader before attach.
#[map]
static CQ_PID: Array<u32> = Array::with_max_entries(1, 0);
/// Entry 0: events lost because the ring buffer was full.
#[map]
static CQ_DROPS: Array<u64> = Array::with_max_entries(1, 0);

#[inline(always)]
fn cq_event(ctx: &ProbeContext, function: u32) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let want = CQ_PID.get(0).copied().unwrap_or(0);
    if want != 0 && (pid_tgid >> 32) as u32 != want {
        return 0;
    }
    let stack_id = ctx.get_stackid(&CQ_STACKS, 0).unwrap_or(-1);
    match CQ_EVENTS.reserve::<CqEvent>(0) {
        Some(mut entry) => {
            let ev = CqEvent {
                ts_ns: now(),
                pid_tgid,
                stack_id,
                function,
                // SAFETY: bpf_get_smp_processor_id has no preconditions.
                cpu: unsafe { bpf_get_smp_processor_id() },
                comm: bpf_get_current_comm().unwrap_or([0; 16]),
            };
            entry.write(ev);
            entry.submit(0);
        }
        None => {
            crate::rare::ring_full(0);
            if let Some(p) = CQ_DROPS.get_ptr_mut(0) {
                // SAFETY: a u64 in an array map; a racing increment may be lost, which only
                // undercounts drops.
                unsafe { *p += 1 };
            }
        }
    }
    0
}

macro_rules! cq_probe {
    ($name:ident, $n:literal) => {
        #[kprobe]
        pub fn $name(ctx: ProbeContext) -> u32 {
            cq_event(&ctx, $n)
        }
    };
}

cq_probe!(cq_0, 0);
cq_probe!(cq_1, 1);
cq_probe!(cq_2, 2);
cq_probe!(cq_3, 3);
cq_probe!(cq_4, 4);
cq_probe!(cq_5, 5);
cq_probe!(cq_6, 6);
cq_probe!(cq_7, 7);

//! The NVMe over RDMA I/O split (the `nvme io` row), per host request (`struct request *`):
//!
//! - issue: `nvme:nvme_setup_cmd`, in `queue_rq`, just before the block layer starts it;
//! - sent: `nvme_rdma_post_send` (kprobe), the command's post, on the same thread;
//! - CQ scheduled and poll started: the ib_cq API's `cq_schedule` and `cq_process` of the poll
//!   round that found the response (a per-CPU slot, see the eBPF side);
//! - callback: `blk_mq_complete_request_remote` (kprobe), called by nvme-rdma's done callback
//!   in that round;
//! - completed: `nvme:nvme_complete_rq` (on the submitting CPU, after an IPI when the poll ran
//!   elsewhere).
//!
//! Admin commands (keep-alive, AER, identify: `REQ_OP_DRV_IN`/`OUT`) are left out.

use crate::HIST_SLOTS;

/// Stage: issue → sent.
pub const NV_ISSUE_SENT: usize = 0;
/// Stage: sent → CQ scheduled (the wire, the target, the response's CQE, the interrupt).
pub const NV_SENT_SCHEDULED: usize = 1;
/// Stage: CQ scheduled → its poll started (softirq or workqueue delay).
pub const NV_SCHEDULED_STARTED: usize = 2;
/// Stage: poll started → the request's callback (the completions polled before it).
pub const NV_STARTED_CALLBACK: usize = 3;
/// Stage: sent → callback, for a request without a poll round of its own after its send (a
/// poll already under way found its response, or the CQ is polled directly).
pub const NV_SENT_CALLBACK: usize = 4;
/// Stage: callback → completed.
pub const NV_CALLBACK_COMPLETED: usize = 5;
/// Issue → completed.
pub const NV_TOTAL: usize = 6;
pub const NV_STAGES: usize = 7;

/// Stage names, by index.
pub const NV_STAGE_NAMES: [&str; NV_STAGES] = [
    "issue → sent",
    "sent → CQ scheduled",
    "CQ scheduled → poll started",
    "poll started → callback",
    "sent → callback (no poll round of its own)",
    "callback → completed",
    "issue → completed",
];

/// Counter: completed reads (`REQ_OP_READ`).
pub const NV_READS: usize = 0;
/// Counter: completed writes (`REQ_OP_WRITE`).
pub const NV_WRITES: usize = 1;
/// Counter: other block operations completed (flush, discard, write zeroes).
pub const NV_OTHER_OPS: usize = 2;
/// Counter: completions of requests issued before the window (no stamps).
pub const NV_ISSUED_BEFORE: usize = 3;
/// Counter: completed requests whose post was not seen.
pub const NV_UNSENT: usize = 4;
/// Counter: completed requests whose callback was not seen.
pub const NV_NO_CALLBACK: usize = 5;
/// Counter: requests not stamped because the in-flight map was full.
pub const NV_LOST: usize = 6;
pub const NV_COUNTERS: usize = 8;

/// `REQ_OP_MASK` of `rq->cmd_flags` (include/linux/blk_types.h).
pub const REQ_OP_MASK: u32 = 0xff;
/// `REQ_OP_DRV_IN`, `REQ_OP_DRV_OUT`: passthrough (the admin queue's commands).
pub const REQ_OP_DRV_IN: u32 = 34;
pub const REQ_OP_DRV_OUT: u32 = 35;

/// One stage over the window: how many requests had it, their sum and histogram (ns).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NvmeStage {
    pub count: u64,
    pub sum_ns: u64,
    pub slots: [u64; HIST_SLOTS as usize],
}

/// The split's counts on one CPU.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NvmeStats {
    pub counters: [u64; NV_COUNTERS],
    pub stages: [NvmeStage; NV_STAGES],
}

/// A request in flight: its stamps (0: not seen) and block operation.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NvmeRequest {
    pub issue: u64,
    pub sent: u64,
    pub scheduled: u64,
    pub started: u64,
    pub callback: u64,
    pub op: u32,
    pub _pad: u32,
}

/// The poll round running on a CPU: its CQ, when it was scheduled (0: not seen) and started.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NvmeRound {
    pub cq: u64,
    pub scheduled: u64,
    pub started: u64,
}

#[cfg(feature = "user")]
mod user {
    // SAFETY: repr(C) structs of u64 (and two u32 in NvmeRequest, which fill 8 bytes): no
    // padding, any bit pattern valid.
    unsafe impl aya::Pod for super::NvmeStats {}
    unsafe impl aya::Pod for super::NvmeRequest {}
    unsafe impl aya::Pod for super::NvmeRound {}
}

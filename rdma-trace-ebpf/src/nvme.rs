//! The `nvme io` row: each NVMe over RDMA host request split into stages (see
//! `rdma_trace_common::nvme`). The row itself counts the completed requests and times issue →
//! completed; `NVME_STATS` holds every stage.
//!
//! The poll round that finds a response is this CPU's `NVME_ROUND`: `ibcq_process` sets it
//! when a CQ's poll starts, and a `cq_poll` of another CQ on this CPU voids it (a direct poll
//! has no `cq_process`). nvme-rdma's host CQs are polled in softirq, where rounds do not nest.

use aya_ebpf::{
    helpers::bpf_get_current_pid_tgid,
    macros::{kprobe, map, raw_tracepoint},
    maps::{HashMap, PerCpuArray},
    programs::{ProbeContext, RawTracePointContext},
};
use rdma_trace_common::{
    C_EVENTS, NO_PROBE, hist_slot,
    nvme::{
        NV_CALLBACK_COMPLETED, NV_ISSUE_SENT, NV_ISSUED_BEFORE, NV_LOST, NV_NO_CALLBACK,
        NV_OTHER_OPS, NV_READS, NV_SCHEDULED_STARTED, NV_SENT_CALLBACK, NV_SENT_SCHEDULED,
        NV_STARTED_CALLBACK, NV_TOTAL, NV_UNSENT, NV_WRITES, NvmeRequest, NvmeRound, NvmeStats,
        REQ_OP_DRV_IN, REQ_OP_DRV_OUT, REQ_OP_MASK,
    },
};

// Stats are added atomically: a program in an interrupt can add to the same CPU's value (see
// "recording" in main.rs).
use crate::{atomic_add as add, config, count_in, now, read_at, read_u32, record_in, row};

/// Probe of the `nvme io` row, or NO_PROBE.
#[unsafe(no_mangle)]
pub static NVME_IO_PROBE: u32 = NO_PROBE;
/// Offset of `cmd_flags` in `struct request` (vmlinux BTF).
#[unsafe(no_mangle)]
static NVME_OFF_CMD_FLAGS: u32 = 0;

/// Requests in flight, by `struct request *` (a tag's request is reused: a new issue
/// overwrites).
#[map]
static NVME_INFLIGHT: HashMap<u64, NvmeRequest> = HashMap::with_max_entries(4096, 0);
/// The request each thread has set up and not posted yet, by thread id.
#[map]
static NVME_SENDER: HashMap<u32, u64> = HashMap::with_max_entries(1024, 0);
#[map]
static NVME_ROUND: PerCpuArray<NvmeRound> = PerCpuArray::with_max_entries(1, 0);
#[map]
static NVME_STATS: PerCpuArray<NvmeStats> = PerCpuArray::with_max_entries(1, 0);

#[inline(always)]
fn on() -> bool {
    config(&NVME_IO_PROBE) != NO_PROBE
}

#[inline(always)]
fn bump(s: *mut NvmeStats, c: usize) {
    // SAFETY: this CPU's value of a per-CPU array; only the field's address is formed.
    if let Some(p) = unsafe { (*s).counters.get_mut(c) } {
        add(p, 1);
    }
}

#[inline(always)]
fn stage(s: *mut NvmeStats, i: usize, ns: u64) {
    // SAFETY: as in `bump`.
    let Some(st) = (unsafe { (*s).stages.get_mut(i) }) else {
        return;
    };
    add(&mut st.count, 1);
    add(&mut st.sum_ns, ns);
    let slot = hist_slot(ns) as usize;
    // SAFETY: a volatile read of a local just written (keeps the bounds check for the verifier).
    let slot = unsafe { core::ptr::read_volatile(&slot) };
    if let Some(p) = st.slots.get_mut(slot) {
        add(p, 1);
    }
}

/// The block operation of `rq`, or None for a passthrough (admin) command; `u32::MAX` when
/// the offset of `cmd_flags` is unknown (no BTF: every command counts, as another op).
#[inline(always)]
fn block_op(rq: u64) -> Option<u32> {
    let off = config(&NVME_OFF_CMD_FLAGS);
    if off == 0 {
        return Some(u32::MAX);
    }
    let op = read_u32(rq, off) & REQ_OP_MASK;
    (op != REQ_OP_DRV_IN && op != REQ_OP_DRV_OUT).then_some(op)
}

/// A CQ's poll round starts on this CPU (from `ibcq_process`); `scheduled` is 0 when its
/// schedule was not seen.
#[inline(always)]
pub fn round_started(cq: u64, scheduled: u64, started: u64) {
    if on()
        && let Some(r) = NVME_ROUND.get_ptr_mut(0)
    {
        // SAFETY: this CPU's value; plain stores (a nested round on this CPU overwrites it,
        // which the callback then reads as the newer round).
        unsafe {
            (*r).cq = cq;
            (*r).scheduled = scheduled;
            (*r).started = started;
        }
    }
}

/// A poll of `cq` on this CPU (from `ibcq_poll`): a round of another CQ is over.
#[inline(always)]
pub fn cq_polled(cq: u64) {
    if on()
        && let Some(r) = NVME_ROUND.get_ptr_mut(0)
    {
        // SAFETY: as in `round_started`.
        unsafe {
            if (*r).cq != cq {
                (*r).started = 0;
            }
        }
    }
}

/// TP_PROTO(struct request *req, struct nvme_command *cmd).
#[raw_tracepoint(tracepoint = "nvme_setup_cmd")]
pub fn nvme_setup_cmd(ctx: RawTracePointContext) -> i32 {
    if !on() {
        return 0;
    }
    let rq: u64 = ctx.arg(0);
    let Some(op) = block_op(rq) else {
        return 0;
    };
    let req = NvmeRequest {
        issue: now(),
        op,
        ..Default::default()
    };
    if NVME_INFLIGHT.insert(rq, req, 0).is_err() {
        if let Some(s) = NVME_STATS.get_ptr_mut(0) {
            bump(s, NV_LOST);
        }
        return 0;
    }
    let tid = bpf_get_current_pid_tgid() as u32;
    let _ = NVME_SENDER.insert(tid, rq, 0);
    0
}

/// `nvme_rdma_post_send(queue, qe, sge, num_sge, first)`: the thread's set-up request is sent.
#[kprobe]
pub fn nvme_post_send(_ctx: ProbeContext) -> u32 {
    if !on() {
        return 0;
    }
    let tid = bpf_get_current_pid_tgid() as u32;
    // SAFETY: the value is copied out before the entry is removed.
    if let Some(rq) = unsafe { NVME_SENDER.get(tid) }.copied() {
        let _ = NVME_SENDER.remove(tid);
        if let Some(r) = NVME_INFLIGHT.get_ptr_mut(rq) {
            // SAFETY: a map value, valid while the program runs; one aligned store.
            unsafe {
                if (*r).sent == 0 {
                    (*r).sent = now();
                }
            }
        }
    }
    0
}

/// `blk_mq_complete_request_remote(rq)`: nvme-rdma's done callback completes `rq`, in the poll
/// round running on this CPU.
#[kprobe]
pub fn nvme_callback(ctx: ProbeContext) -> u32 {
    if !on() {
        return 0;
    }
    let Some(rq) = ctx.arg::<u64>(0) else {
        return 0;
    };
    let Some(r) = NVME_INFLIGHT.get_ptr_mut(rq) else {
        return 0;
    };
    let t = now();
    let round = NVME_ROUND.get(0).copied().unwrap_or_default();
    // SAFETY: as in `nvme_post_send`.
    unsafe {
        if (*r).callback == 0 {
            (*r).callback = t;
            if round.started != 0 && round.started <= t {
                (*r).scheduled = round.scheduled;
                (*r).started = round.started;
            }
        }
    }
    0
}

/// TP_PROTO(struct request *req): the request completes; its stages are added.
#[raw_tracepoint(tracepoint = "nvme_complete_rq")]
pub fn nvme_complete_rq(ctx: RawTracePointContext) -> i32 {
    let probe = config(&NVME_IO_PROBE);
    if probe == NO_PROBE {
        return 0;
    }
    let rq: u64 = ctx.arg(0);
    if block_op(rq).is_none() {
        return 0;
    }
    let t = now();
    let Some(s) = NVME_STATS.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: the value is copied out before the entry is removed.
    let Some(q) = (unsafe { NVME_INFLIGHT.get(rq) }).copied() else {
        bump(s, NV_ISSUED_BEFORE);
        return 0;
    };
    let _ = NVME_INFLIGHT.remove(rq);
    bump(
        s,
        match q.op {
            0 => NV_READS,
            1 => NV_WRITES,
            _ => NV_OTHER_OPS,
        },
    );
    let total = t.saturating_sub(q.issue);
    stage(s, NV_TOTAL, total);
    if let Some(r) = row(probe) {
        count_in(probe, r, C_EVENTS);
        record_in(r, total);
    }
    let sent = q.sent != 0 && q.sent >= q.issue && q.sent <= t;
    if sent {
        stage(s, NV_ISSUE_SENT, q.sent - q.issue);
    } else {
        bump(s, NV_UNSENT);
    }
    if q.callback == 0 || q.callback > t {
        bump(s, NV_NO_CALLBACK);
        return 0;
    }
    stage(s, NV_CALLBACK_COMPLETED, t - q.callback);
    if !sent || q.callback < q.sent {
        return 0;
    }
    if q.scheduled != 0
        && q.scheduled >= q.sent
        && q.started >= q.scheduled
        && q.callback >= q.started
    {
        stage(s, NV_SENT_SCHEDULED, q.scheduled - q.sent);
        stage(s, NV_SCHEDULED_STARTED, q.started - q.scheduled);
        stage(s, NV_STARTED_CALLBACK, q.callback - q.started);
    } else {
        stage(s, NV_SENT_CALLBACK, q.callback - q.sent);
    }
    0
}

// ---- the `nvmet io` row: the NVMe over RDMA target's time per I/O command, from the command's
// start (nvmet:nvmet_req_init, once nvmet-rdma has parsed the received command) to its
// completion (nvmet:nvmet_req_complete, the backend done, before the response is posted).

/// Probe of the `nvmet io` row, or NO_PROBE.
#[unsafe(no_mangle)]
pub static NVMET_IO_PROBE: u32 = NO_PROBE;
/// Offsets of `sq` in `struct nvmet_req` and of `qid` in `struct nvmet_sq` (nvmet's BTF): the
/// admin queue (qid 0) is left out. 0: unknown, every command counts.
#[unsafe(no_mangle)]
static NVMET_OFF_SQ: u32 = 0;
#[unsafe(no_mangle)]
static NVMET_OFF_QID: u32 = 0;

/// Start of each target command in flight, by `struct nvmet_req *` (a request is reused for
/// the queue's next command: a new start overwrites).
#[map]
static NVMET_INFLIGHT: HashMap<u64, u64> = HashMap::with_max_entries(4096, 0);

/// Whether `req` is an I/O queue's command (not the admin queue's), or its queue is unknown.
#[inline(always)]
fn nvmet_io_queue(req: u64) -> bool {
    let off_sq = config(&NVMET_OFF_SQ);
    if off_sq == 0 {
        return true;
    }
    let sq: u64 = read_at(req, off_sq);
    let qid: u16 = read_at(sq, config(&NVMET_OFF_QID));
    sq == 0 || qid != 0
}

/// TP_PROTO(struct nvmet_req *req, struct nvme_command *cmd): a received command starts.
#[raw_tracepoint(tracepoint = "nvmet_req_init")]
pub fn nvmet_req_init(ctx: RawTracePointContext) -> i32 {
    let probe = config(&NVMET_IO_PROBE);
    if probe == NO_PROBE {
        return 0;
    }
    let req: u64 = ctx.arg(0);
    if !nvmet_io_queue(req) {
        return 0;
    }
    let t = now();
    if let Some(r) = row(probe) {
        count_in(probe, r, C_EVENTS);
        if NVMET_INFLIGHT.insert(req, t, 0).is_err() {
            // The map is full: this command's time is not taken (counted as unmatched).
            count_in(probe, r, rdma_trace_common::C_UNMATCHED);
        }
    }
    0
}

/// TP_PROTO(struct nvmet_req *req): the command completes (its status set, the response next).
#[raw_tracepoint(tracepoint = "nvmet_req_complete")]
pub fn nvmet_req_complete(ctx: RawTracePointContext) -> i32 {
    let probe = config(&NVMET_IO_PROBE);
    if probe == NO_PROBE {
        return 0;
    }
    let req: u64 = ctx.arg(0);
    // SAFETY: the value is copied out before the entry is removed.
    let Some(start) = (unsafe { NVMET_INFLIGHT.get(req) }).copied() else {
        return 0;
    };
    let _ = NVMET_INFLIGHT.remove(req);
    let t = now();
    if let Some(r) = row(probe) {
        record_in(r, t.saturating_sub(start));
    }
    0
}

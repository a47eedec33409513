//! The completion waterfall: per completion event, T0 (driver) → T1 (`ib_uverbs_comp_handler`)
//! → T2 (its waiter woken, `sched_waking` inside the handler) → T3 (the waiter on a CPU,
//! `sched_switch`) → T4 (`ib_uverbs_comp_event_read` returns), aggregated per reading thread.
//!
//! Keys, so that concurrent waiters never mix:
//! - T0 → T1: rxe posts a CQE (`rxe_cq_post`) and may run the handler later from a tasklet:
//!   keyed by the CQ (`struct rxe_cq` starts with its `ib_cq`); T0 is the first CQE posted
//!   since the CQ was armed (`rxe_req_notify_cq`), the one that raised the event. mlx5 calls the handler nested
//!   in `mlx5_ib_cq_comp`: a per-CPU stamp, taken back to the entry of the `mlx5_comp*` hard IRQ
//!   that ran before it on the same CPU (within `IRQ_T0_WINDOW_NS`), when there is one.
//! - T1 → T2: the handler runs on one CPU and `sched_waking` fires inside it, on that CPU: a
//!   per-CPU "handler in progress" slot names the channel and the event.
//! - Each handler call appends its event to its channel's queue (`ev_queue`, the handler's
//!   `cq_context`); each read takes the oldest one of its channel (`filp->private_data` +
//!   offset of `ev_queue`, offsets from BTF): the kernel's own FIFO, mirrored.
//! - From T2 on, the woken thread is the key (`WF_WAKE`), and the wake-up names its event, so a
//!   read counts it as woken only if it reads that very event. T3 is the first switch-in after
//!   T2; a thread woken before it slept has none (T3 = T2).
//!
//! At the read, T2 and T3 are clamped into [T1, T4]: the stages partition T1→T4 exactly. The
//! events that needed it are counted (`L_CLAMPED`), and so is every loss (`L_*`: failed map
//! writes, a full sample ring, missed read returns), in the per-CPU row the event or thread
//! already uses, or the shared last slot's when no thread is known.
//! With `--sample-every N` (`WF_SAMPLE_EVERY`), each channel's handler stamps one event in
//! N: the others keep their place in the mirror, marked [`SLOT_UNSTAMPED`], so reads stay
//! matched, but their wake-up is not kept and their read only counts them (`W_UNSTAMPED`).
//! Only threads woken inside a handler are in `WF_WAKE`, so `sched_switch` costs one hash
//! lookup for everyone else, and `sched_waking` one per-CPU read outside handlers.

use aya_ebpf::{
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_get_current_task,
        bpf_get_smp_processor_id, bpf_probe_read_kernel,
    },
    macros::{kprobe, kretprobe, map, raw_tracepoint, tracepoint},
    maps::{Array, HashMap, LruHashMap, PerCpuArray, PerCpuHashMap, RingBuf},
    programs::{ProbeContext, RawTracePointContext, RetProbeContext, TracePointContext},
};
use rdma_trace_common::{
    HIST_SLOTS, hist_slot,
    waterfall::{
        CLASS_UNKNOWN, CPU_HANDLER, CPU_READ, CPU_WAITER, CQ_SUMS, H_AWAKE, H_CLASS, H_DRIVER,
        H_READ, H_RUNQ, H_TOTAL, H_WAKE, L_CLAMPED, L_CQ_ROW_NOT_STORED, L_MIRROR_RESYNCED,
        L_NO_QUEUE, L_NO_SLOT, L_READ_NOT_STORED, L_RETURN_MISSED, L_SAMPLES, L_SLOT_NOT_STORED,
        L_SLOT_REFOUND, L_WAKE_NOT_STORED, NR_CLASSES, SF_CLAMPED, SF_NO_SWITCH, SF_WOKEN,
        SLOT_UNSTAMPED, W_AWAKE, W_AWAKE_ON_CPU_SUM, W_AWAKE_RUNNABLE_SUM, W_AWAKE_SPLIT_SHORT,
        W_AWAKE_UNKEPT_SUM, W_DRIVER_WOKEN_SUM, W_DROPPED, W_EVENTS, W_NO_DRIVER, W_NO_SWITCH,
        W_SUM, W_UNMATCHED, W_UNSTAMPED, W_WOKEN, WF_CQ_ROWS, WF_NHIST, WF_QUEUE_LEN,
        WF_RUNNABLE_LEN, WF_THREADS, WfConfig, WfCounts, WfCpuTopo, WfCq, WfCqKey, WfCqRow, WfHist,
        WfQueue as Queue, WfReading as Reading, WfRunnable, WfSample, WfThread, WfWake as Wake,
    },
};

use rdma_trace_common::waterfall::{FAULT_PHANTOMS_AT, NO_ID, cpu_event_index};

use crate::{atomic_add, config, now};

/// Offsets and the sample bound, patched by the loader.
#[unsafe(no_mangle)]
static WF_CONFIG: WfConfig = WfConfig::UNSET;

/// The probe table's slot (`KSLOTS`) of `ib_uverbs_comp_handler` and of `rxe_cq_post`, when
/// the table times them through these programs (the loader then attaches no `kentry_N` or
/// `kreturn_N` of its own where these run: one program per hook instead of two); out of range
/// (the default) otherwise.
#[unsafe(no_mangle)]
static WF_KSLOT_HANDLER: u32 = u32::MAX;
#[unsafe(no_mangle)]
static WF_KSLOT_CQ_POST: u32 = u32::MAX;

/// The probe table's entry work for the slot in `global`, if the loader set one.
#[inline(always)]
fn table_entry(global: &u32) {
    crate::kentry(config(global) as usize);
}

/// The probe table's return work for the slot in `global`, if the loader set one.
#[inline(always)]
fn table_return(global: &u32) {
    crate::kreturn(config(global) as usize);
}

const QMASK: u64 = WF_QUEUE_LEN as u64 - 1;
const _: () = assert!(HIST_SLOTS.is_power_of_two());
const BPF_NOEXIST: u64 = 1;
const EEXIST: i64 = 17;

/// The handler running on this CPU.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Handler {
    queue: u64,
    /// Position of its event in the channel's queue.
    event: u64,
    /// 0: none running; [`STAMPING`]: running, its event stamped; [`NOT_STAMPING`]: running,
    /// its event left unstamped (`--sample-every`): its wake-up is not kept.
    active: u64,
}

const STAMPING: u64 = 1;
const NOT_STAMPING: u64 = 2;

/// `--sample-every N`: the handler stamps event k of a channel when k % N == 0 (0 or 1: every
/// one). A map, not a global: `--enforce` raises it while the run goes on.
#[map]
static WF_SAMPLE_EVERY: Array<u32> = Array::with_max_entries(1, 0);

#[map]
static WF_QUEUES: HashMap<u64, Queue> = HashMap::with_max_entries(1024, 0);
/// All zero: the initial value of a new queue (too big for the BPF stack).
#[map]
static WF_ZERO: PerCpuArray<Queue> = PerCpuArray::with_max_entries(1, 0);
#[map]
static WF_HANDLER: PerCpuArray<Handler> = PerCpuArray::with_max_entries(1, 0);
/// rxe: per CQ, T0 (the first CQE posted since its last arm or handler call) and the
/// stall doctor's links: the last arm, post and handler call.
#[map]
static WF_CQ: LruHashMap<u64, WfCq> = LruHashMap::with_max_entries(4096, 0);
/// mlx5: the driver's completion callback running on this CPU.
#[map]
static WF_T0_CPU: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);
/// mlx5: the IRQ numbers of its completion vectors (`mlx5_comp*`, from /proc/interrupts),
/// filled by the loader.
#[map]
static WF_T0_IRQS: HashMap<u32, u8> = HashMap::with_max_entries(256, 0);
/// mlx5: when the last of those IRQs began on this CPU (0: none since the last callback).
#[map]
static WF_T0_IRQ_AT: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);
/// A completion IRQ older than this is not the one that led to the callback.
const IRQ_T0_WINDOW_NS: u64 = 10_000_000;
#[map]
static WF_WAKE: LruHashMap<u32, Wake> = LruHashMap::with_max_entries(4096, 0);
#[map]
static WF_READING: LruHashMap<u32, Reading> = LruHashMap::with_max_entries(4096, 0);
/// Reader thread → its last periods runnable off a CPU (from its first read on).
#[map]
static WF_RUNNABLE: LruHashMap<u32, WfRunnable> = LruHashMap::with_max_entries(1024, 0);
/// A zeroed record to insert from (too big for the BPF stack).
#[map]
static WF_RUNNABLE_ZERO: PerCpuArray<WfRunnable> = PerCpuArray::with_max_entries(1, 0);
/// Thread id → slot.
#[map]
static WF_SLOT_OF: LruHashMap<u32, u32> = LruHashMap::with_max_entries(4096, 0);
/// Slot → owning thread id; taken with BPF_NOEXIST, so two threads never share a slot.
#[map]
static WF_SLOT_OWNER: HashMap<u32, u32> = HashMap::with_max_entries(WF_THREADS, 0);
#[map]
static WF_THREAD: Array<WfThread> = Array::with_max_entries(WF_THREADS, 0);
#[map]
static WF_COUNTS: PerCpuArray<WfCounts> = PerCpuArray::with_max_entries(WF_THREADS, 0);
/// Histogram `h` of slot `s` at `s * WF_NHIST + h`.
#[map]
static WF_HIST: PerCpuArray<WfHist> = PerCpuArray::with_max_entries(WF_THREADS * WF_NHIST, 0);
/// Each CPU's core, LLC and node, filled by the loader, which sizes it for the machine's
/// possible CPUs (`WfConfig::ncpus`).
#[map]
static WF_CPU_TOPO: Array<WfCpuTopo> = Array::with_max_entries(1, 0);
/// Events per thread slot, kind (`CPU_*`) and CPU, at `cpu_event_index`; sized at load for
/// the possible CPUs, and added to atomically (a slot's readers may run on several CPUs).
#[map]
static WF_CPU_EVENTS: Array<u64> = Array::with_max_entries(1, 0);
/// Per-event samples (`--sample N`; the loader sizes the ring).
#[map]
static WF_SAMPLES: RingBuf = RingBuf::with_byte_size(4096, 0);
/// (reading process, CQ) → the events it read of that CQ: the waterfall per CQ.
#[map]
static WF_CQ_ROWS_MAP: PerCpuHashMap<WfCqKey, WfCqRow> =
    PerCpuHashMap::with_max_entries(WF_CQ_ROWS, 0);
/// All zero: a new CQ row before its labels.
#[map]
static WF_CQ_ROW_ZERO: PerCpuArray<WfCqRow> = PerCpuArray::with_max_entries(1, 0);
/// Samples emitted on this CPU.
#[map]
static WF_SAMPLED: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

#[inline(always)]
fn cpu() -> u32 {
    // SAFETY: bpf_get_smp_processor_id has no preconditions.
    unsafe { bpf_get_smp_processor_id() }
}

#[inline(always)]
fn tid() -> u32 {
    bpf_get_current_pid_tgid() as u32
}

// ---- T0

/// rxe_cq_post(cq, ...): a CQE is posted. The first post since the CQ was armed (or since its
/// last handler call) raised the event: T0.
#[kprobe]
pub fn wf_rxe_cq_post(ctx: ProbeContext) -> u32 {
    table_entry(&WF_KSLOT_CQ_POST);
    let t = now();
    if let Some(c) = cq_stamps(&ctx) {
        if c.t0 == 0 {
            c.t0 = t;
        }
        c.posted_at = t;
        c.posts_since_arm += 1;
        c.posts_since_handler += 1;
    }
    0
}

/// rxe_req_notify_cq(ibcq, flags): the CQ is armed; the next CQE posted raises the event.
#[kprobe]
pub fn wf_rxe_arm(ctx: ProbeContext) -> u32 {
    let t = now();
    if let Some(c) = cq_stamps(&ctx) {
        c.t0 = 0;
        c.armed_at = t;
        c.posts_since_arm = 0;
    }
    // The thread that arms its CQ (in its own context: rxe's arm is a system call) will most
    // likely read its events: its periods are kept from here, before the first event can be
    // raised, so that its first already-awake event is split whole.
    keep_periods(tid());
    0
}

/// The stamps of the CQ in the probed function's first argument (a `struct ib_cq *`, or rxe's
/// `struct rxe_cq *`, which begins with its `ib_cq`: one key for both), created with its restrack id when the CQ is first seen. rxe
/// posts a CQ's CQEs under its lock; an arm or a handler call on another CPU may race these
/// plain stores: they are stamps, not counts of record.
#[inline(always)]
fn cq_stamps(ctx: &ProbeContext) -> Option<&'static mut WfCq> {
    let cq: u64 = ctx.arg(0).unwrap_or(0);
    if cq == 0 {
        return None;
    }
    if WF_CQ.get_ptr_mut(cq).is_none() {
        let fresh = WfCq {
            res_id: res_id(cq),
            ..WfCq::default()
        };
        // BPF_NOEXIST: a CQ first seen on two CPUs at once keeps the first one's stamps.
        let _ = WF_CQ.insert(cq, fresh, BPF_NOEXIST);
    }
    // SAFETY: a hash map value, valid while the program runs; see above for the races.
    WF_CQ.get_ptr_mut(cq).map(|c| unsafe { &mut *c })
}

/// The restrack id of `struct ib_cq` at `cq` (once per CQ, when it is first seen).
#[inline(always)]
fn res_id(cq: u64) -> u32 {
    let off = config(&WF_CONFIG).cq_res_id;
    if off == 0 {
        return rdma_trace_common::waterfall::NO_ID;
    }
    // SAFETY: bpf_probe_read_kernel checks the address; a bad one gives an error, not a fault.
    unsafe { bpf_probe_read_kernel((cq + u64::from(off)) as *const u32) }
        .unwrap_or(rdma_trace_common::waterfall::NO_ID)
}

/// irq_handler_entry(irq, action): an mlx5 completion vector's hard IRQ begins on this CPU.
#[raw_tracepoint(tracepoint = "irq_handler_entry")]
pub fn wf_mlx5_irq(ctx: RawTracePointContext) -> i32 {
    let irq = ctx.arg::<u64>(0) as u32;
    // SAFETY: only the presence of the key is used.
    if unsafe { WF_T0_IRQS.get(irq) }.is_some()
        && let Some(p) = WF_T0_IRQ_AT.get_ptr_mut(0)
    {
        // SAFETY: this CPU's slot of a per-CPU array; hard IRQ handlers do not nest.
        unsafe { *p = now() };
    }
    0
}

#[kprobe]
pub fn wf_mlx5_cq_comp(_ctx: ProbeContext) -> u32 {
    let t = now();
    // The completion IRQ that ran before this callback on this CPU, if recent: it is T0.
    let irq_at = WF_T0_IRQ_AT
        .get_ptr_mut(0)
        // SAFETY: this CPU's slot, taken and cleared.
        .map_or(0, |p| unsafe { core::mem::replace(&mut *p, 0) });
    let t0 = if irq_at != 0 && t.saturating_sub(irq_at) <= IRQ_T0_WINDOW_NS {
        irq_at
    } else {
        t
    };
    if let Some(p) = WF_T0_CPU.get_ptr_mut(0) {
        // SAFETY: this CPU's slot of a per-CPU array; programs do not re-enter on one CPU.
        unsafe { *p = t0 };
    }
    0
}

/// ib_uverbs_init_event_queue(ev_queue): a new channel; forget what a freed one at the same
/// address left queued.
#[kprobe]
pub fn wf_queue_init(ctx: ProbeContext) -> u32 {
    let queue: u64 = ctx.arg(0).unwrap_or(0);
    let _ = WF_QUEUES.remove(queue);
    0
}

// ---- T1: ib_uverbs_comp_handler(struct ib_cq *cq, void *cq_context = ev_queue)

#[kprobe]
pub fn wf_handler_entry(ctx: ProbeContext) -> u32 {
    table_entry(&WF_KSLOT_HANDLER);
    let t1 = now();
    let cq: u64 = ctx.arg(0).unwrap_or(0);
    let queue: u64 = ctx.arg(1).unwrap_or(0);
    let mut t0 = match WF_CQ.get_ptr_mut(cq) {
        Some(c) => {
            // SAFETY: a hash map value; see `cq_stamps`.
            let c = unsafe { &mut *c };
            c.handler_at = t1;
            c.posts_since_handler = 0;
            core::mem::replace(&mut c.t0, 0)
        }
        None => 0,
    };
    if let Some(p) = WF_T0_CPU.get_ptr_mut(0) {
        // SAFETY: this CPU's slot, see `wf_mlx5_cq_comp`; taken and cleared.
        let nested = unsafe { core::mem::replace(&mut *p, 0) };
        if t0 == 0 {
            t0 = nested;
        }
    }
    if queue == 0 {
        return 0;
    }
    if WF_QUEUES.get_ptr_mut(queue).is_none() {
        let Some(zero) = WF_ZERO.get_ptr(0) else {
            return 0;
        };
        #[allow(
            clippy::needless_borrows_for_generic_args,
            reason = "by value, the queue would be copied onto the BPF stack, which it does not fit"
        )]
        // SAFETY: a map value pointer, valid for the call; the helper copies it (by reference:
        // a queue is too big for the BPF stack).
        let _ = WF_QUEUES.insert(queue, unsafe { &*zero }, BPF_NOEXIST);
    }
    let Some(q) = WF_QUEUES.get_ptr_mut(queue) else {
        // The map is full (or out of memory): this event is not mirrored.
        lose(WF_THREADS - 1, L_NO_QUEUE);
        return 0;
    };
    // SAFETY: a hash map value; the kernel serialises a channel's handler calls under its
    // lock (taken after this entry: two handler calls of one channel on two CPUs can race
    // here, which the read's check against the kernel's queue puts right), and the reader only
    // moves `head`.
    let q = unsafe { &mut *q };
    // Before `tail` moves: a read that sees the new `tail` sees this call running.
    q.handler_at = t1;
    if q.cq != cq {
        q.cq = cq;
        q.buf = 0;
    }
    let mut event = q.tail;
    let phantoms = config(&WF_CONFIG).fault_phantoms;
    if phantoms != 0 && event == FAULT_PHANTOMS_AT {
        event += u64::from(phantoms);
    }
    q.tail = event + 1;
    let every = WF_SAMPLE_EVERY.get(0).copied().unwrap_or(0);
    let stamped = every <= 1 || event % u64::from(every) == 0;
    // Kept only when its slot's event has been read: the kernel hands events out oldest first,
    // so overwriting an unread one would pair this channel's next reads with the wrong events.
    let i = (event & QMASK) as usize;
    if event.saturating_sub(q.head) < WF_QUEUE_LEN as u64 {
        if let (Some(a), Some(b), Some(c), Some(n), Some(k)) = (
            q.t0.get_mut(i),
            q.t1.get_mut(i),
            q.cpu.get_mut(i),
            q.seq.get_mut(i),
            q.cqs.get_mut(i),
        ) {
            *a = t0;
            *b = t1;
            *c = if stamped {
                u64::from(cpu())
            } else {
                u64::from(cpu()) | SLOT_UNSTAMPED
            };
            *n = event + 1;
            *k = cq;
        }
    } else {
        count_global(W_DROPPED);
    }
    if let Some(h) = WF_HANDLER.get_ptr_mut(0) {
        // SAFETY: this CPU's slot of a per-CPU array.
        unsafe {
            *h = Handler {
                queue,
                event,
                active: if stamped { STAMPING } else { NOT_STAMPING },
            }
        };
    }
    0
}

#[kretprobe]
pub fn wf_handler_return(_ctx: RetProbeContext) -> u32 {
    table_return(&WF_KSLOT_HANDLER);
    if let Some(h) = WF_HANDLER.get_ptr_mut(0) {
        // SAFETY: this CPU's slot of a per-CPU array.
        let h = unsafe { &mut *h };
        // The kernel's queue has the event now (or the kernel dropped it).
        if h.active != 0
            && let Some(q) = WF_QUEUES.get_ptr_mut(h.queue)
        {
            // SAFETY: a hash map value; only handler returns write `handler_done_at`.
            unsafe { (*q).handler_done_at = now() };
        }
        h.active = 0;
    }
    0
}

/// A thread exits: its slot, if it has one of its own, is marked for the loader, which banks
/// the slot's counts under the thread, clears them and frees the slot (`WF_SLOT_OWNER`). The
/// thread's `WF_SLOT_OF` entry goes now, so that a later thread with the same id takes a slot
/// of its own. One hash lookup per thread exit, machine-wide.
#[tracepoint]
pub fn wf_thread_exit(_ctx: TracePointContext) -> u32 {
    let tid = tid();
    // SAFETY: copied out at once.
    let Some(slot) = (unsafe { WF_SLOT_OF.get(tid) }).copied() else {
        return 0;
    };
    let _ = WF_SLOT_OF.remove(tid);
    if slot >= WF_THREADS - 1 {
        return 0;
    }
    if let Some(t) = WF_THREAD.get_ptr_mut(slot) {
        // SAFETY: an array map value; only this slot's owner writes its ids, and it is exiting.
        unsafe {
            if (*t).tid == tid {
                (*t).exited = 1;
            }
        }
    }
    0
}

// ---- T2, T3: scheduler tracepoints (field offsets from their tracefs format files)

#[tracepoint]
pub fn wf_sched_waking(ctx: TracePointContext) -> u32 {
    let cfg = config(&WF_CONFIG);
    // SAFETY: offsets of fields of this tracepoint's record, read from its format file.
    let pid: i32 = unsafe { ctx.read_at(cfg.waking_pid as usize) }.unwrap_or(0);
    if pid <= 0 {
        return 0;
    }
    let t2 = now();
    // A reader woken by anything starts a runnable period (it ends at its switch-in).
    if let Some(r) = WF_RUNNABLE.get_ptr_mut(pid as u32) {
        // SAFETY: a hash map value; see `wf_sched_switch`.
        let r = unsafe { &mut *r };
        if r.since == 0 {
            r.since = t2;
        }
    }
    let Some(h) = WF_HANDLER.get_ptr(0) else {
        return 0;
    };
    // SAFETY: this CPU's slot, copied.
    let h = unsafe { *h };
    if h.active != STAMPING {
        return 0; // not inside a completion handler (not ours), or its event is not stamped
    }
    // SAFETY: as above.
    let target: i32 = unsafe { ctx.read_at(cfg.waking_target_cpu as usize) }.unwrap_or(-1);
    let w = Wake {
        queue: h.queue,
        event: h.event,
        t2,
        t3: 0,
        cpu_target: target as u32,
        cpu_on: u32::MAX,
    };
    if WF_WAKE.insert(pid as u32, w, 0).is_err() {
        lose(WF_THREADS - 1, L_WAKE_NOT_STORED);
    }
    0
}

#[tracepoint]
pub fn wf_sched_switch(ctx: TracePointContext) -> u32 {
    let cfg = config(&WF_CONFIG);
    let t = now();
    // SAFETY: offsets of this tracepoint's record's fields, from its format file.
    let prev: i32 = unsafe { ctx.read_at(cfg.switch_prev_pid as usize) }.unwrap_or(0);
    // SAFETY: as above; `prev_state` is a `long`, its low 32 bits hold the state bits.
    let state: u32 = unsafe { ctx.read_at(cfg.switch_prev_state as usize) }.unwrap_or(1);
    // SAFETY: as above.
    let next: i32 = unsafe { ctx.read_at(cfg.switch_next_pid as usize) }.unwrap_or(0);
    // Switched out while runnable (no sleep bit below 0x100; 0x100 and up mark preemption), or
    // to sleep with its wake-up already under way: a runnable period starts. Switched out to
    // sleep: none is open (a wake-up seen while the thread was still on its CPU started none).
    if prev > 0
        && let Some(r) = WF_RUNNABLE.get_ptr_mut(prev as u32)
    {
        // SAFETY: a hash map value; only this thread's own switches and wake-ups touch it,
        // and a thread switches on one CPU at a time.
        let r = unsafe { &mut *r };
        r.since = if state & 0xff == 0 || wake_under_way(&cfg) {
            t
        } else {
            0
        };
        if r.on_since != 0 {
            let i = (r.on_count % u64::from(WF_RUNNABLE_LEN)) as usize;
            if let (Some(a), Some(b)) = (r.on_start.get_mut(i), r.on_end.get_mut(i)) {
                *a = r.on_since;
                *b = t;
            }
            r.on_count += 1;
            r.on_since = 0;
        }
    }
    if let Some(r) = WF_RUNNABLE.get_ptr_mut(next as u32) {
        // SAFETY: as above.
        let r = unsafe { &mut *r };
        if r.since != 0 {
            let i = (r.count % u64::from(WF_RUNNABLE_LEN)) as usize;
            if let (Some(a), Some(b)) = (r.start.get_mut(i), r.end.get_mut(i)) {
                *a = r.since;
                *b = t;
            }
            r.count += 1;
            r.since = 0;
        }
        r.on_since = t;
    }
    let Some(w) = WF_WAKE.get_ptr_mut(next as u32) else {
        return 0; // not a thread woken by a completion handler
    };
    // SAFETY: a hash map value; only this thread's switch-in and its read touch it, and a
    // thread is switched in on one CPU at a time.
    let w = unsafe { &mut *w };
    if w.t3 == 0 {
        w.t3 = t;
        w.cpu_on = cpu();
    }
    0
}

/// From now on, keep the periods of thread `tid` (the current one) for the split of its
/// already-awake events, unless they are kept already. (Looked up first: an LRU insert takes a
/// free node and copies the value before it checks the key.) The thread is on its CPU now: its
/// first on-CPU period starts here.
#[inline(always)]
fn keep_periods(tid: u32) {
    if WF_RUNNABLE.get_ptr(tid).is_some() {
        return;
    }
    let Some(zero) = WF_RUNNABLE_ZERO.get_ptr(0) else {
        return;
    };
    #[allow(
        clippy::needless_borrows_for_generic_args,
        reason = "by value, the record would be copied onto the BPF stack, which it does not fit"
    )]
    // SAFETY: a map value pointer, valid for the call; never written.
    let _ = WF_RUNNABLE.insert(tid, unsafe { &*zero }, BPF_NOEXIST);
    if let Some(r) = WF_RUNNABLE.get_ptr_mut(tid) {
        let t = now();
        // SAFETY: a hash map value; see `wf_sched_switch`. Only this thread makes its record.
        unsafe {
            (*r).kept_since = t;
            (*r).on_since = t;
        }
    }
}

/// TASK_WAKING: `try_to_wake_up` sets it before it waits for the task to leave its CPU.
const TASK_WAKING: u32 = 0x200;

/// Whether the thread switching out (the current one, at `sched_switch`) to sleep is already
/// being woken. Since 5.18 `sched_switch` reports the state `__schedule` read before a wake-up
/// that raced with the switch-out; that wake-up has set the task's state to TASK_WAKING (or
/// RUNNING) by now, and puts the thread back on a run queue as soon as it is off its CPU.
#[inline(always)]
fn wake_under_way(cfg: &WfConfig) -> bool {
    if cfg.task_state == 0 {
        return false;
    }
    // SAFETY: bpf_get_current_task has no preconditions.
    let task = unsafe { bpf_get_current_task() };
    // SAFETY: bpf_probe_read_kernel checks the address; a bad one gives an error, not a fault.
    let state: u32 =
        unsafe { bpf_probe_read_kernel((task + u64::from(cfg.task_state)) as *const u32) }
            .unwrap_or(1);
    state == 0 || state & TASK_WAKING != 0
}

/// Of `t1`..`t4`, the time thread `tid` spent runnable but off a CPU (woken or preempted, not
/// yet switched in) and on a CPU, from its kept periods; and whether older periods it no longer
/// keeps may have fallen in it too. The thread is on its CPU at `t4` (its read returns).
#[inline(always)]
fn split_within(tid: u32, t1: u64, t4: u64) -> Split {
    // SAFETY: copied out at once.
    let Some(r) = (unsafe { WF_RUNNABLE.get(tid) }) else {
        return Split {
            unkept: t4.saturating_sub(t1),
            ..Split::default()
        };
    };
    let overlap = |a: u64, b: u64| b.min(t4).saturating_sub(a.max(t1));
    let (mut runnable, mut on) = (0, 0);
    for i in 0..WF_RUNNABLE_LEN as usize {
        runnable += overlap(r.start[i], r.end[i]);
        on += overlap(r.on_start[i], r.on_end[i]);
    }
    if r.on_since != 0 {
        on += overlap(r.on_since, t4);
    }
    // The oldest kept period is the next one to be overwritten; the periods no longer kept
    // ended before it started.
    let len = u64::from(WF_RUNNABLE_LEN);
    let short = (r.count > len
        && r.start
            .get((r.count % len) as usize)
            .is_some_and(|&a| a > t1))
        || (r.on_count > len
            && r.on_start
                .get((r.on_count % len) as usize)
                .is_some_and(|&a| a > t1));
    Split {
        runnable,
        on,
        unkept: r.kept_since.min(t4).saturating_sub(t1),
        short,
    }
}

/// An already-awake event's T1→T4, split by its reader's kept periods: runnable off a CPU, on
/// a CPU, and the part before its periods were kept; `short` when older periods that may
/// have fallen in it are no longer kept.
#[derive(Clone, Copy, Default)]
struct Split {
    runnable: u64,
    on: u64,
    unkept: u64,
    short: bool,
}

// ---- T4: ib_uverbs_comp_event_read(struct file *filp, ...)

#[kprobe]
pub fn wf_read_entry(ctx: ProbeContext) -> u32 {
    let filp: u64 = ctx.arg(0).unwrap_or(0);
    if filp == 0 {
        return 0;
    }
    let cfg = config(&WF_CONFIG);
    // SAFETY: bpf_probe_read_kernel checks the address; a bad one gives an error, not a fault.
    let private: u64 =
        unsafe { bpf_probe_read_kernel((filp + u64::from(cfg.file_private_data)) as *const u64) }
            .unwrap_or(0);
    if private == 0 {
        return 0;
    }
    let queue = private + u64::from(cfg.ev_queue);
    let (cq, unpolled, counted) = match WF_QUEUES.get_ptr_mut(queue) {
        // SAFETY: a hash map value; `cq` and `buf` are written by handler calls and here, and
        // a stale pair only misreads a count of the stall doctor's; `readers` is only added
        // to atomically.
        Some(q) => unsafe {
            atomic_add(&mut (*q).readers, 1);
            ((*q).cq, unpolled(&mut *q, &cfg), 1)
        },
        None => (0, NO_ID, 0),
    };
    let pid_tgid = bpf_get_current_pid_tgid();
    let r = Reading {
        queue,
        since: now(),
        cq,
        tgid: (pid_tgid >> 32) as u32,
        unpolled,
        counted,
        _pad: 0,
    };
    let tid = pid_tgid as u32;
    // From its first read on (or its first arm, on rxe), the thread's periods are kept.
    keep_periods(tid);
    if let Err(e) = WF_READING.insert(tid, r, BPF_NOEXIST) {
        // A read of this thread is still open: its return was missed (a thread reads one
        // event at a time). It most likely returned its channel's oldest event: take that one
        // from the mirror too, or the channel's later reads would all be matched one off.
        if i64::from(e) == -EEXIST {
            lose(WF_THREADS - 1, L_RETURN_MISSED);
            // SAFETY: copied out at once.
            if let Some(missed) = unsafe { WF_READING.get(tid) }.copied()
                && let Some(q) = WF_QUEUES.get_ptr_mut(missed.queue)
            {
                // SAFETY: a hash map value; as in `wf_read_return`, reads only move `head`.
                let q = unsafe { &mut *q };
                if q.head < q.tail {
                    q.head += 1;
                }
                if missed.counted != 0 {
                    atomic_add(&mut q.readers, u64::MAX);
                }
            }
        }
        if WF_READING.insert(tid, r, 0).is_err() {
            lose(WF_THREADS - 1, L_READ_NOT_STORED);
        }
    }
    0
}

/// rxe: the CQEs in the channel's CQ that user space has not polled (producer − consumer index
/// of the queue it shares with rxe), [`NO_ID`] when not known.
#[inline(always)]
fn unpolled(q: &mut Queue, cfg: &WfConfig) -> u32 {
    if q.cq == 0 || cfg.rxe_cq_queue == 0 || cfg.buf_producer == 0 {
        return NO_ID;
    }
    if q.buf == 0 {
        // SAFETY: bpf_probe_read_kernel checks the addresses; a bad one gives an error.
        let queue: u64 =
            unsafe { bpf_probe_read_kernel((q.cq + u64::from(cfg.rxe_cq_queue)) as *const u64) }
                .unwrap_or(0);
        if queue == 0 {
            return NO_ID;
        }
        // SAFETY: as above.
        q.buf =
            unsafe { bpf_probe_read_kernel((queue + u64::from(cfg.rxe_queue_buf)) as *const u64) }
                .unwrap_or(0);
        if q.buf == 0 {
            return NO_ID;
        }
    }
    let read = |off: u32| {
        // SAFETY: as above.
        unsafe { bpf_probe_read_kernel((q.buf + u64::from(off)) as *const u32) }.ok()
    };
    match (
        read(cfg.buf_mask),
        read(cfg.buf_producer),
        read(cfg.buf_consumer),
    ) {
        (Some(mask), Some(p), Some(c)) => p.wrapping_sub(c) & mask,
        _ => NO_ID,
    }
}

#[kretprobe]
pub fn wf_read_return(ctx: RetProbeContext) -> u32 {
    let t4 = now();
    let tid = tid();
    // SAFETY: copied out before the entry is removed.
    let Some(r) = (unsafe { WF_READING.get(tid) }).copied() else {
        return 0;
    };
    let _ = WF_READING.remove(tid);
    read_returned(&ctx, tid, &r, t4);
    if r.counted != 0
        && let Some(q) = WF_QUEUES.get_ptr_mut(r.queue)
    {
        // SAFETY: a hash map value; `readers` is only added to atomically, and `head` is
        // moved by this channel's reads (which `readers` says are none but this one).
        let q = unsafe { &mut *q };
        resync(q, r.queue);
        atomic_add(&mut q.readers, u64::MAX);
    }
    0
}

/// After a read of channel `queue` returned (`q` its mirror): when no handler call of the
/// channel is running and no other read is open, the mirror holds an event for every one in
/// the kernel's queue. If the kernel's queue is empty then and the mirror is not, the mirror
/// is out of step: it drops what it holds, counted ([`L_MIRROR_RESYNCED`]).
#[inline(always)]
fn resync(q: &mut Queue, queue: u64) {
    let off = config(&WF_CONFIG).event_list;
    // `tail` before `handler_at`: a handler call that moved `tail` had stamped it first.
    let tail = q.tail;
    if off == 0 || q.head >= tail || q.handler_at > q.handler_done_at || q.readers != 1 {
        return;
    }
    let list = queue + u64::from(off);
    // SAFETY: bpf_probe_read_kernel checks the address; a list_head's `next` is its first member.
    let next: u64 = unsafe { bpf_probe_read_kernel(list as *const u64) }.unwrap_or(0);
    if next != list {
        return; // events wait in the kernel's queue (or it could not be read)
    }
    let stale = tail - q.head;
    q.head = tail;
    if let Some(c) = WF_COUNTS.get_ptr_mut(WF_THREADS - 1) {
        // SAFETY: this CPU's value of a per-CPU array; programs do not re-enter on one CPU.
        if let Some(v) = unsafe { (*c).lost.get_mut(L_MIRROR_RESYNCED as usize) } {
            *v += stale;
        }
    }
}

/// The read of thread `tid` (`r`) returned at `t4`: pair the event it returned with its
/// handler call in the mirror, and record it.
#[inline(always)]
fn read_returned(ctx: &RetProbeContext, tid: u32, r: &Reading, t4: u64) {
    let ret: i64 = ctx.ret();
    if ret <= 0 {
        return; // no event returned (EAGAIN, a signal, an error)
    }
    let Some(slot) = thread_slot(tid) else {
        return;
    };
    let Some(q) = WF_QUEUES.get_ptr_mut(r.queue) else {
        count(slot, W_UNMATCHED);
        return;
    };
    // SAFETY: a hash map value; this read is the channel's only consumer (the kernel holds
    // the queue lock while a read takes an event), and the handler only moves `tail`.
    let q = unsafe { &mut *q };
    if q.head >= q.tail {
        count(slot, W_UNMATCHED);
        return;
    }
    let event = q.head;
    let i = (event & QMASK) as usize;
    // The slot is read before `head` moves: a handler on another CPU may keep its next event
    // in this slot as soon as it has.
    let (Some(&t0), Some(&t1), Some(&cpu1), Some(&seq), Some(&event_cq)) = (
        q.t0.get(i),
        q.t1.get(i),
        q.cpu.get(i),
        q.seq.get(i),
        q.cqs.get(i),
    ) else {
        return;
    };
    q.head = event + 1;
    q.read_at = t4;
    if seq != event + 1 {
        // Its event found the mirror full and was not kept.
        count(slot, W_UNMATCHED);
        return;
    }
    if cpu1 & SLOT_UNSTAMPED != 0 {
        // Matched but not stamped (`--sample-every`): counted, and nothing more.
        count(slot, W_UNSTAMPED);
        return;
    }
    let cpu4 = cpu();
    let mut s = WfSample {
        t0,
        t1,
        t2: 0,
        t3: 0,
        t4,
        tid,
        tgid: (bpf_get_current_pid_tgid() >> 32) as u32,
        cpu_handler: cpu1 as u32,
        cpu_target: u32::MAX,
        cpu_on: cpu4,
        cpu_read: cpu4,
        flags: 0,
        class: CLASS_UNKNOWN,
        awake_runnable: 0,
        awake_on_cpu: 0,
        awake_unkept: 0,
    };
    // SAFETY: copied out; removed below when consumed or stale.
    if let Some(w) = unsafe { WF_WAKE.get(tid) }.copied() {
        if w.queue == r.queue && w.event == event {
            if w.t2 < t1 || w.t2 > t4 || (w.t3 != 0 && (w.t3 < w.t2 || w.t3 > t4)) {
                s.flags |= SF_CLAMPED;
            }
            let t2 = w.t2.max(t1).min(t4);
            s.t2 = t2;
            s.flags |= SF_WOKEN;
            s.cpu_target = w.cpu_target;
            if w.t3 == 0 {
                s.t3 = t2;
                s.flags |= SF_NO_SWITCH;
            } else {
                s.t3 = w.t3.max(t2).min(t4);
                s.cpu_on = w.cpu_on;
            }
            let _ = WF_WAKE.remove(tid);
        } else if w.queue != r.queue || w.event < event {
            // A wake-up for an event this thread will never read from here: stale.
            let _ = WF_WAKE.remove(tid);
        }
    }
    if s.flags & SF_WOKEN != 0 {
        q.woken_at = s.t2;
        q.on_cpu_at = s.t3;
    }
    s.class = class(s.cpu_handler, s.cpu_on);
    let split = if s.flags & SF_WOKEN == 0 {
        split_within(tid, t1, t4)
    } else {
        Split::default()
    };
    s.awake_runnable = split.runnable;
    s.awake_on_cpu = split.on;
    s.awake_unkept = split.unkept;
    record(slot, &s, split.short);
    cq_row(slot, event_cq, &s);
}

/// Adds event `s` to its CQ's row of the reading process, made (with the CQ's labels) on its
/// first event; a full map is counted in the reader's slot.
#[inline(always)]
fn cq_row(slot: u32, cq: u64, s: &WfSample) {
    if cq == 0 {
        return;
    }
    let key = WfCqKey {
        cq,
        tgid: s.tgid,
        _pad: 0,
    };
    let row = match WF_CQ_ROWS_MAP.get_ptr_mut(key) {
        Some(r) => r,
        None => {
            let Some(zero) = WF_CQ_ROW_ZERO.get_ptr(0) else {
                return;
            };
            #[allow(
                clippy::needless_borrows_for_generic_args,
                reason = "by value, the row would be copied onto the BPF stack"
            )]
            // SAFETY: a map value pointer, valid for the call; never written.
            if WF_CQ_ROWS_MAP
                .insert(key, unsafe { &*zero }, BPF_NOEXIST)
                .is_err()
                && WF_CQ_ROWS_MAP.get_ptr_mut(key).is_none()
            {
                lose(slot, L_CQ_ROW_NOT_STORED);
                return;
            }
            let Some(r) = WF_CQ_ROWS_MAP.get_ptr_mut(key) else {
                lose(slot, L_CQ_ROW_NOT_STORED);
                return;
            };
            label_cq_row(r, cq);
            r
        }
    };
    // SAFETY: this CPU's value of a per-CPU hash map; programs do not re-enter on one CPU.
    let row = unsafe { &mut *row };
    row.events += 1;
    let mut add = |i: usize, v: u64| {
        if let Some(x) = row.sums.get_mut(i) {
            *x += v;
        }
    };
    if s.t0 != 0 && s.t0 <= s.t1 {
        add(0, s.t1 - s.t0);
    }
    if s.flags & SF_WOKEN != 0 {
        add(1, s.t2 - s.t1);
        add(2, s.t3 - s.t2);
        add(3, s.t4 - s.t3);
    } else {
        add(4, s.t4.saturating_sub(s.t1));
    }
    add(CQ_SUMS - 1, s.t4.saturating_sub(s.t1));
    if s.t0 != 0 && s.t0 <= s.t1 {
        row.driver_events += 1;
    }
    if s.flags & SF_WOKEN != 0 {
        row.woken += 1;
    }
    if s.flags & SF_CLAMPED != 0 {
        row.clamped += 1;
    }
}

/// The CQ's restrack id and device name, into this CPU's value of its new row.
#[inline(always)]
fn label_cq_row(r: *mut WfCqRow, cq: u64) {
    let cfg = config(&WF_CONFIG);
    // SAFETY: this CPU's value of a per-CPU hash map, just made.
    let r = unsafe { &mut *r };
    r.res_id = res_id(cq);
    r.labelled = 1;
    // `device` is `struct ib_cq`'s first member (offset 0): the name's offset tells known.
    if cfg.dev_name == 0 {
        return;
    }
    // SAFETY: bpf_probe_read_kernel checks the address; a bad one gives an error, not a fault.
    let dev: u64 = unsafe { bpf_probe_read_kernel((cq + u64::from(cfg.cq_device)) as *const u64) }
        .unwrap_or(0);
    if dev != 0 {
        let name = (dev + u64::from(cfg.dev_name)) as *const u8;
        // SAFETY: as above; the buffer is the row's own.
        let _ = unsafe { aya_ebpf::helpers::bpf_probe_read_kernel_buf(name, &mut r.device) };
    }
}

#[inline(always)]
fn class(handler: u32, waiter: u32) -> u32 {
    match (WF_CPU_TOPO.get(handler), WF_CPU_TOPO.get(waiter)) {
        (Some(x), Some(y)) => WfCpuTopo::class(handler, x, waiter, y),
        _ => CLASS_UNKNOWN,
    }
}

// ---- aggregation per thread slot

/// This thread's slot, taken on its first event; the last slot when all are taken.
#[inline(always)]
fn thread_slot(tid: u32) -> Option<u32> {
    // SAFETY: copied out at once.
    if let Some(&s) = unsafe { WF_SLOT_OF.get(tid) } {
        return Some(s);
    }
    let mut slot = WF_THREADS - 1;
    let mut refound = false;
    let start = tid % (WF_THREADS - 1);
    for k in 0..WF_THREADS - 1 {
        let s = (start + k) % (WF_THREADS - 1);
        if WF_SLOT_OWNER.insert(s, tid, BPF_NOEXIST).is_ok() {
            slot = s;
            break;
        }
        // SAFETY: copied out at once.
        if unsafe { WF_SLOT_OWNER.get(s) }.copied() == Some(tid) {
            // Its own slot: WF_SLOT_OF (LRU) forgot it.
            slot = s;
            refound = true;
            break;
        }
    }
    if refound {
        lose(slot, L_SLOT_REFOUND);
    } else if slot == WF_THREADS - 1 {
        lose(slot, L_NO_SLOT);
    }
    if let Some(t) = WF_THREAD.get_ptr_mut(slot) {
        let info = WfThread {
            tid: if slot == WF_THREADS - 1 { 0 } else { tid },
            tgid: if slot == WF_THREADS - 1 {
                0
            } else {
                (bpf_get_current_pid_tgid() >> 32) as u32
            },
            comm: bpf_get_current_comm().unwrap_or([0; 16]),
            exited: 0,
        };
        // SAFETY: an array map value; the slot is this thread's own (or the shared last one,
        // whose name is only a hint).
        unsafe { *t = info };
    }
    if WF_SLOT_OF.insert(tid, slot, 0).is_err() {
        lose(slot, L_SLOT_NOT_STORED);
    }
    Some(slot)
}

#[inline(always)]
fn count(slot: u32, counter: u32) {
    if let Some(c) = WF_COUNTS.get_ptr_mut(slot) {
        // SAFETY: this CPU's value of a per-CPU array; programs do not re-enter on one CPU.
        if let Some(v) = unsafe { (*c).counters.get_mut(counter as usize) } {
            *v += 1;
        }
    }
}

/// Loss counter `l` (`L_*`) of `slot`.
#[inline(always)]
fn lose(slot: u32, l: u32) {
    if let Some(c) = WF_COUNTS.get_ptr_mut(slot) {
        // SAFETY: this CPU's value of a per-CPU array; programs do not re-enter on one CPU.
        if let Some(v) = unsafe { (*c).lost.get_mut(l as usize) } {
            *v += 1;
        }
    }
}

/// Global counters (no thread to blame) go to the last slot.
#[inline(always)]
fn count_global(counter: u32) {
    count(WF_THREADS - 1, counter);
}

#[inline(always)]
fn hist(slot: u32, h: u32, value: u64) {
    if let Some(row) = WF_HIST.get_ptr_mut(slot * WF_NHIST + h) {
        let i = hist_slot(value) as usize;
        // SAFETY: a volatile read of a local: keeps the bounds check visible to the verifier.
        // The mask gives the index bounds of its own: 6.1's verifier derived impossible ones
        // (min above max) for `hist_slot`'s small-value branch and refused the access.
        let i = unsafe { core::ptr::read_volatile(&i) } & (HIST_SLOTS as usize - 1);
        // SAFETY: this CPU's value of a per-CPU array.
        if let Some(s) = unsafe { (*row).slots.get_mut(i) } {
            *s += 1;
        }
    }
}

#[inline(always)]
fn add(c: &mut WfCounts, h: u32, slot: u32, value: u64) {
    if let Some(v) = c.counters.get_mut((W_SUM + h) as usize) {
        *v += value;
    }
    hist(slot, h, value);
}

/// Counts one event of slot `slot` for CPU `cpu` as kind `kind` (`CPU_*`).
#[inline(always)]
fn bump(slot: u32, kind: u32, cpu: u32) {
    let ncpus = config(&WF_CONFIG).ncpus;
    if cpu >= ncpus {
        return;
    }
    if let Some(v) = WF_CPU_EVENTS.get_ptr_mut(cpu_event_index(slot, kind, cpu, ncpus)) {
        atomic_add(v, 1);
    }
}

#[inline(always)]
fn record(slot: u32, s: &WfSample, short: bool) {
    let Some(c) = WF_COUNTS.get_ptr_mut(slot) else {
        return;
    };
    // SAFETY: this CPU's value of a per-CPU array; programs do not re-enter on one CPU.
    let c = unsafe { &mut *c };
    c.counters[W_EVENTS as usize] += 1;
    if s.flags & SF_CLAMPED != 0 {
        c.lost[L_CLAMPED as usize] += 1;
    }
    if s.t0 != 0 && s.t0 <= s.t1 {
        add(c, H_DRIVER, slot, s.t1 - s.t0);
        if s.flags & SF_WOKEN != 0 {
            c.counters[W_DRIVER_WOKEN_SUM as usize] += s.t1 - s.t0;
        }
    } else {
        c.counters[W_NO_DRIVER as usize] += 1;
    }
    if s.flags & SF_WOKEN != 0 {
        c.counters[W_WOKEN as usize] += 1;
        if s.flags & SF_NO_SWITCH != 0 {
            c.counters[W_NO_SWITCH as usize] += 1;
        }
        add(c, H_WAKE, slot, s.t2 - s.t1);
        add(c, H_RUNQ, slot, s.t3 - s.t2);
        add(c, H_READ, slot, s.t4 - s.t3);
        if s.class < NR_CLASSES {
            hist(slot, H_CLASS + s.class, s.t3 - s.t2);
        }
    } else {
        c.counters[W_AWAKE as usize] += 1;
        c.counters[W_AWAKE_RUNNABLE_SUM as usize] += s.awake_runnable;
        c.counters[W_AWAKE_ON_CPU_SUM as usize] += s.awake_on_cpu;
        c.counters[W_AWAKE_UNKEPT_SUM as usize] += s.awake_unkept;
        if short {
            c.counters[W_AWAKE_SPLIT_SHORT as usize] += 1;
        }
        add(c, H_AWAKE, slot, s.t4.saturating_sub(s.t1));
    }
    add(c, H_TOTAL, slot, s.t4.saturating_sub(s.t1));
    if let Some(v) = c.classes.get_mut(s.class as usize) {
        *v += 1;
    }
    bump(slot, CPU_HANDLER, s.cpu_handler);
    bump(slot, CPU_WAITER, s.cpu_on);
    bump(slot, CPU_READ, s.cpu_read);
    sample(c, s);
}

/// Emit `s` to the sample ring (up to the bound); a full ring is counted in `c`.
#[inline(always)]
fn sample(c: &mut WfCounts, s: &WfSample) {
    let max = config(&WF_CONFIG).sample_max;
    if max == 0 {
        return;
    }
    let Some(n) = WF_SAMPLED.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: this CPU's value of a per-CPU array.
    let n = unsafe { &mut *n };
    if *n >= max {
        return;
    }
    if WF_SAMPLES.output::<WfSample>(s, 0).is_ok() {
        *n += 1;
    } else {
        c.lost[L_SAMPLES as usize] += 1;
    }
}

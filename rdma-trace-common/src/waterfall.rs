//! Layout of the completion waterfall (see `rdma-trace-ebpf/src/waterfall.rs`).
//!
//! For every completion event that a thread reads from a completion channel:
//! T0 the driver posted the completion, T1 `ib_uverbs_comp_handler` was entered, T2 the handler
//! woke the waiting thread (`sched_waking`), T3 the thread got a CPU (`sched_switch`), T4 its
//! `ib_uverbs_comp_event_read` returned. An event whose reader was already awake (no wake-up
//! inside its handler) has only T1 and T4. The eBPF side clamps T1 ≤ T2 ≤ T3 ≤ T4 per event, so
//! the stages partition T1→T4 exactly, and sums them in nanoseconds beside the histograms; it
//! counts the events it had to clamp ([`L_CLAMPED`]) and every other loss (`L_*`).

use crate::HIST_SLOTS;

/// Thread slots: per slot, one row of counters and [`WF_NHIST`] histograms. The last slot
/// collects the threads that found no free slot. A thread's slot is freed by the loader after
/// the thread exits (`WfThread::exited`).
pub const WF_THREADS: u32 = 32;

/// The per-CPU event counts (`WF_CPU_EVENTS`): per thread slot, for each of these kinds, one
/// count per possible CPU. The loader sizes that map and the topology map (`WF_CPU_TOPO`) for
/// the machine's possible CPUs at load ([`WfConfig::ncpus`]).
pub const CPU_HANDLER: u32 = 0;
/// The CPU the waiter ran on: T3's for woken events, T4's for the others.
pub const CPU_WAITER: u32 = 1;
/// The CPU of the read's return (T4).
pub const CPU_READ: u32 = 2;
pub const NR_CPU_KINDS: u32 = 3;

/// Index in `WF_CPU_EVENTS` of slot `slot`'s count of kind `kind` (`CPU_*`) for CPU `cpu`, on
/// a machine of `ncpus` possible CPUs.
#[inline(always)]
pub fn cpu_event_index(slot: u32, kind: u32, cpu: u32, ncpus: u32) -> u32 {
    (slot * NR_CPU_KINDS + kind) * ncpus + cpu
}

/// Completion events remembered per channel between the handler and the read.
pub const WF_QUEUE_LEN: u32 = 16;

/// Histogram: T0→T1, the driver posted → the handler runs (only when T0 is known).
pub const H_DRIVER: u32 = 0;
/// Histogram: T1→T2, handler entry → the waiter is woken (woken events).
pub const H_WAKE: u32 = 1;
/// Histogram: T2→T3, woken → on a CPU: run-queue wait (woken events).
pub const H_RUNQ: u32 = 2;
/// Histogram: T3→T4, on a CPU → the read returns (woken events).
pub const H_READ: u32 = 3;
/// Histogram: T1→T4 of events whose reader was already awake.
pub const H_AWAKE: u32 = 4;
/// Histogram: T1→T4 of every event, measured directly (not as a sum).
pub const H_TOTAL: u32 = 5;
/// Histograms `H_CLASS + class`: T2→T3 per CPU-placement class (woken events).
pub const H_CLASS: u32 = 6;
/// Histograms per thread slot.
pub const WF_NHIST: u32 = H_CLASS + NR_CLASSES;

/// CPU placement of the handler's CPU against the waiter's: same CPU.
pub const CLASS_SAME_CPU: u32 = 0;
/// SMT siblings (same core).
pub const CLASS_SMT: u32 = 1;
/// Same last-level cache.
pub const CLASS_LLC: u32 = 2;
/// Same NUMA node.
pub const CLASS_NODE: u32 = 3;
/// Another NUMA node.
pub const CLASS_OTHER_NODE: u32 = 4;
/// A CPU the loader found no topology for.
pub const CLASS_UNKNOWN: u32 = 5;
pub const NR_CLASSES: u32 = 6;

/// Counter: events read with their handler's T1 and stamped (every event the waterfall covers,
/// but those left unstamped by `--sample-every`: [`W_UNSTAMPED`]).
pub const W_EVENTS: u32 = 0;
/// Counter: events whose reader was woken inside their handler.
pub const W_WOKEN: u32 = 1;
/// Counter: events whose reader was already awake (no wake-up inside their handler).
pub const W_AWAKE: u32 = 2;
/// Counter: woken events without a switch-in after the wake-up (woken while still on its CPU).
pub const W_NO_SWITCH: u32 = 3;
/// Counter: events without a driver time stamp (T0).
pub const W_NO_DRIVER: u32 = 4;
/// Counter: reads that returned an event the handler was not seen to queue (attached mid-run).
pub const W_UNMATCHED: u32 = 5;
/// Counter: queued events dropped because more than [`WF_QUEUE_LEN`] waited on one channel.
pub const W_DROPPED: u32 = 6;
/// Counter: sum in ns of T0→T1 of the woken events (the driver stage on their critical path).
pub const W_DRIVER_WOKEN_SUM: u32 = 7;
/// Counters `W_SUM + h`: sum in ns of histogram `h`'s values (`h` < `H_CLASS`).
pub const W_SUM: u32 = 8;
/// Counter: sum in ns of the time the readers of already-awake events spent runnable but off
/// a CPU (woken or preempted, not yet switched in) within T1→T4: the part of
/// [`H_AWAKE`] that was spent waiting for a CPU.
pub const W_AWAKE_RUNNABLE_SUM: u32 = W_SUM + H_CLASS;
/// Counter: already-awake events whose reader had more runnable periods within T1→T4 than its
/// record keeps ([`WF_RUNNABLE_LEN`]): their runnable part is a lower bound.
pub const W_AWAKE_SPLIT_SHORT: u32 = W_AWAKE_RUNNABLE_SUM + 1;
/// Counter: sum in ns of the time the readers of already-awake events spent on a CPU within
/// T1→T4 (the rest of [`H_AWAKE`] they were asleep on something else).
pub const W_AWAKE_ON_CPU_SUM: u32 = W_AWAKE_SPLIT_SHORT + 1;
/// Counter: events read and matched to their handler call but not stamped (`--sample-every
/// N` stamps 1 in N of each channel's events): counted, in no stage, histogram or class.
/// Every event the waterfall covers is `W_EVENTS + W_UNSTAMPED`.
pub const W_UNSTAMPED: u32 = W_AWAKE_ON_CPU_SUM + 1;
/// Counter: sum in ns of the part of already-awake events' T1→T4 that came before their
/// reader's periods were kept (its record is made at its first arm, on rxe, or else at its
/// first read): neither runnable, on a CPU nor asleep is known there.
pub const W_AWAKE_UNKEPT_SUM: u32 = W_UNSTAMPED + 1;
pub const NR_WCOUNTERS: u32 = W_AWAKE_UNKEPT_SUM + 1;

/// In a queue slot's `cpu` (`WfQueue::cpu`): the handler call did not stamp this event
/// (`--sample-every`): its wake-up is not kept and its read only counts it ([`W_UNSTAMPED`]).
pub const SLOT_UNSTAMPED: u64 = 1 << 32;

/// Loss counter: events whose T2 or T3 lay outside [T1, T4] (or T3 before T2) and were clamped
/// into it: their stages are approximate (the wake-up or switch-in was likely another event's).
pub const L_CLAMPED: u32 = 0;
/// Loss counter: handler calls not mirrored because the queue map (`WF_QUEUES`, one entry per
/// completion channel) was full: their reads count as unmatched.
pub const L_NO_QUEUE: u32 = 1;
/// Loss counter: threads that found every thread slot taken: counted in the shared last slot.
pub const L_NO_SLOT: u32 = 2;
/// Loss counter: wake-ups not stored (`WF_WAKE` insert failed): their events count as awake.
pub const L_WAKE_NOT_STORED: u32 = 3;
/// Loss counter: read entries not stored (`WF_READING` insert failed): the read is not seen.
pub const L_READ_NOT_STORED: u32 = 4;
/// Loss counter: thread → slot entries not stored (`WF_SLOT_OF` insert failed).
pub const L_SLOT_NOT_STORED: u32 = 5;
/// Loss counter: samples the ring had no room for (`--sample`, `--timeline`).
pub const L_SAMPLES: u32 = 6;
/// Loss counter: reads that began while the same thread's previous read was still open: that
/// read's return was missed (kretprobe `maxactive`), its event is not in the waterfall. The
/// mirror drops its channel's oldest event then, the one such a read most likely returned.
pub const L_RETURN_MISSED: u32 = 7;
/// Loss counter: threads whose slot was forgotten (`WF_SLOT_OF` is LRU) and found again.
pub const L_SLOT_REFOUND: u32 = 8;
/// Loss counter: events left out of their CQ's row ([`WfCqRow`]) because the map of
/// (process, CQ) rows (`WF_CQ_ROWS`, [`WF_CQ_ROWS`] entries) was full.
pub const L_CQ_ROW_NOT_STORED: u32 = 9;
/// Loss counter: events the queue mirror still held when the kernel's queue was found empty
/// (at a read's return, with no handler call running and no other read open), dropped to put
/// the mirror back in step: handler calls the kernel dropped (a closed channel, no memory),
/// updates lost to a race, or a missed read return's event. Without it, every later read of
/// the channel would be paired with an older event.
pub const L_MIRROR_RESYNCED: u32 = 10;
pub const NR_LOSSES: u32 = 11;

/// (process, CQ) rows at most: the per-CQ split of each process's waterfall.
pub const WF_CQ_ROWS: u32 = 1024;

/// The sums a [`WfCqRow`] keeps, per stage: T0→T1 (events with a driver stamp), T1→T2, T2→T3,
/// T3→T4 (woken events), T1→T4 of the already-awake events and T1→T4 of every event, in ns.
pub const CQ_SUMS: usize = 6;

/// The key of a (process, CQ) row: the CQ's `struct ib_cq *` and the reading process.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct WfCqKey {
    pub cq: u64,
    pub tgid: u32,
    pub _pad: u32,
}

/// The completion events one process read of one CQ (per CPU), with the CQ's labels, read on
/// the row's first event (on that CPU's value only: the others stay unlabelled).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WfCqRow {
    /// The CQ's restrack id (`rdma res show cq`'s `cqn`), [`NO_ID`] when not known.
    pub res_id: u32,
    /// 1 when this value carries the labels.
    pub labelled: u32,
    /// The CQ's device name, NUL-padded (cut at 16 bytes); empty when not known.
    pub device: [u8; 16],
    pub events: u64,
    pub woken: u64,
    /// Events with a driver stamp (T0).
    pub driver_events: u64,
    /// Events whose T2 or T3 had to be clamped.
    pub clamped: u64,
    /// The stage sums (see [`CQ_SUMS`]).
    pub sums: [u64; CQ_SUMS],
}

/// The loader's arithmetic on the rows: it sums a row's per-CPU values and takes differences
/// between snapshots.
impl WfCqRow {
    /// The CQ's restrack id, when known.
    pub fn id(&self) -> Option<u32> {
        (self.res_id != NO_ID).then_some(self.res_id)
    }

    /// Adds `o`'s counts and sums; takes its labels when it carries them.
    pub fn add(&mut self, o: &WfCqRow) {
        if o.labelled == 1 {
            (self.res_id, self.device, self.labelled) = (o.res_id, o.device, 1);
        }
        self.each_with(o, |x, y| *x += y);
    }

    /// Takes `o`'s counts and sums from these, down to 0 at the least; the labels stay.
    pub fn subtract(&mut self, o: &WfCqRow) {
        self.each_with(o, |x, y| *x = x.saturating_sub(y));
    }

    fn each_with(&mut self, o: &WfCqRow, f: impl Fn(&mut u64, u64)) {
        for (x, y) in [
            (&mut self.events, o.events),
            (&mut self.woken, o.woken),
            (&mut self.driver_events, o.driver_events),
            (&mut self.clamped, o.clamped),
        ] {
            f(x, y);
        }
        for (x, y) in self.sums.iter_mut().zip(o.sums) {
            f(x, y);
        }
    }
}

/// Per thread slot and CPU: counters and placement classes (the CPUs of the stages are counted
/// in `WF_CPU_EVENTS`, sized at load).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WfCounts {
    pub counters: [u64; NR_WCOUNTERS as usize],
    /// Events per placement class (handler CPU against the waiter's CPU).
    pub classes: [u64; NR_CLASSES as usize],
    /// Loss counters (`L_*`): per thread where a thread is known, else in the last slot.
    pub lost: [u64; NR_LOSSES as usize],
}

/// The loader's arithmetic on the records: it sums a thread's per-CPU records, merges thread
/// slots, and takes differences between snapshots.
impl WfCounts {
    /// Nothing counted.
    pub const ZERO: WfCounts = WfCounts {
        counters: [0; NR_WCOUNTERS as usize],
        classes: [0; NR_CLASSES as usize],
        lost: [0; NR_LOSSES as usize],
    };

    /// Adds every count of `o` to this one's.
    pub fn add(&mut self, o: &WfCounts) {
        self.each_with(o, |x, y| *x += y);
    }

    /// Takes every count of `o` from this one's, down to 0 at the least.
    pub fn subtract(&mut self, o: &WfCounts) {
        self.each_with(o, |x, y| *x = x.saturating_sub(y));
    }

    /// Nothing counted in `counters` nor lost (the other arrays only break the events down).
    pub fn is_zero(&self) -> bool {
        self.counters.iter().chain(&self.lost).all(|&c| c == 0)
    }

    /// Counter `counter` (`W_*`).
    pub fn get(&self, counter: u32) -> u64 {
        self.counters[counter as usize]
    }

    /// `f` on each count and `o`'s count at the same place.
    fn each_with(&mut self, o: &WfCounts, f: impl Fn(&mut u64, u64)) {
        let pairs: [(&mut [u64], &[u64]); 3] = [
            (&mut self.counters, &o.counters),
            (&mut self.classes, &o.classes),
            (&mut self.lost, &o.lost),
        ];
        for (a, b) in pairs {
            for (x, y) in a.iter_mut().zip(b) {
                f(x, *y);
            }
        }
    }
}

impl Default for WfCounts {
    fn default() -> Self {
        WfCounts::ZERO
    }
}

/// One histogram (same slots as the probe rows; see `hist_slot`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WfHist {
    pub slots: [u64; HIST_SLOTS as usize],
}

/// Who owns a thread slot.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WfThread {
    pub tid: u32,
    pub tgid: u32,
    /// The thread's name when it took the slot.
    pub comm: [u8; 16],
    /// Non-zero once the thread has exited (`sched_process_exit`): the loader banks the slot's
    /// counts under the thread, clears them and frees the slot for the next thread.
    pub exited: u32,
}

impl WfThread {
    /// A slot no thread owns.
    pub const NONE: WfThread = WfThread {
        tid: 0,
        tgid: 0,
        comm: [0; 16],
        exited: 0,
    };
}

/// One completion event, as sampled (`--sample N`). Times in ns of CLOCK_MONOTONIC; T2 = T3 = 0
/// for events whose reader was awake; T0 = 0 without a driver stamp. For those events,
/// `awake_runnable`, `awake_on_cpu` and `awake_unkept` split T1→T4 as the waterfall's sums do
/// (0 for woken events).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WfSample {
    pub t0: u64,
    pub t1: u64,
    pub t2: u64,
    pub t3: u64,
    pub t4: u64,
    pub tid: u32,
    pub tgid: u32,
    /// CPUs of T1, T2's target, T3 and T4 (u32::MAX: none).
    pub cpu_handler: u32,
    pub cpu_target: u32,
    pub cpu_on: u32,
    pub cpu_read: u32,
    /// SF_* bits.
    pub flags: u32,
    pub class: u32,
    /// Of an already-awake event's T1→T4, the reader's kept periods runnable off a CPU and
    /// on a CPU (ns).
    pub awake_runnable: u64,
    pub awake_on_cpu: u64,
    /// Of it, the part before the reader's periods were kept ([`W_AWAKE_UNKEPT_SUM`]).
    pub awake_unkept: u64,
}

/// Sample flag: the reader was woken inside the event's handler.
pub const SF_WOKEN: u32 = 1;
/// Sample flag: woken, but never switched in after the wake-up (T3 = T2).
pub const SF_NO_SWITCH: u32 = 2;
/// Sample flag: T2 or T3 was out of order and clamped into [T1, T4] ([`L_CLAMPED`]).
pub const SF_CLAMPED: u32 = 4;

/// Per CQ (rxe: `rxe_req_notify_cq` and `rxe_cq_post`, and the handler's calls): the links
/// of the completion chain the driver shows, kept for the stall doctor and for T0. Times in ns
/// of CLOCK_MONOTONIC, 0: not seen.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WfCq {
    /// The first CQE posted since the last arm or handler call: T0 of the next event.
    pub t0: u64,
    /// The last arm (`ibv_req_notify_cq`).
    pub armed_at: u64,
    /// The last CQE posted.
    pub posted_at: u64,
    /// The last handler call (`ib_uverbs_comp_handler`).
    pub handler_at: u64,
    pub posts_since_arm: u64,
    pub posts_since_handler: u64,
    /// The CQ's restrack id (`rdma res show cq`'s `cqn`); [`NO_ID`] when not known.
    pub res_id: u32,
    pub _pad: u32,
}

/// An id or count that is not known.
pub const NO_ID: u32 = u32::MAX;

/// Events a channel's handler queued that no read has taken yet (the kernel's FIFO, mirrored),
/// and what the stall doctor needs of the channel. Events are numbered in queue order: `tail`
/// counts the handler's events, `head` the reads. Event `n` is kept in slot `n % WF_QUEUE_LEN`
/// when that slot's event has been read; otherwise it is not kept (`W_DROPPED`) and its read,
/// finding another event's number in the slot, counts as unmatched. A read is thus paired with
/// its own event or with none while `head` keeps step with the kernel's reads (a read whose
/// return was not seen leaves it behind: docs/waterfall.md, "What it loses").
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WfQueue {
    pub head: u64,
    pub tail: u64,
    pub t0: [u64; WF_QUEUE_LEN as usize],
    pub t1: [u64; WF_QUEUE_LEN as usize],
    pub cpu: [u64; WF_QUEUE_LEN as usize],
    /// Each slot's event number + 1 (0: never kept).
    pub seq: [u64; WF_QUEUE_LEN as usize],
    /// T1 of the channel's last handler call, kept or not.
    pub handler_at: u64,
    /// The CQ of the channel's last handler call.
    pub cq: u64,
    /// rxe: that CQ's `rxe_queue_buf` (shared with user space), 0 when not resolved.
    pub buf: u64,
    /// When a read last returned one of its events.
    pub read_at: u64,
    /// Each slot's CQ (the handler's `struct ib_cq *`): a channel may serve several CQs.
    pub cqs: [u64; WF_QUEUE_LEN as usize],
    /// T2 and T3 of the last event read whose reader was woken by its handler.
    pub woken_at: u64,
    pub on_cpu_at: u64,
    /// When the channel's last handler call returned: a call runs while `handler_at` is
    /// later. The mirror is checked against the kernel's queue only when no handler call runs
    /// and one read is open ([`L_MIRROR_RESYNCED`]).
    pub handler_done_at: u64,
    /// Reads of the channel between their entry and return (added to atomically).
    pub readers: u64,
}

/// A read of a completion channel in progress (`ib_uverbs_comp_event_read`): the waiter.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WfReading {
    /// The channel's `ev_queue`.
    pub queue: u64,
    /// When the read began.
    pub since: u64,
    /// The channel's CQ then (0: none seen yet).
    pub cq: u64,
    pub tgid: u32,
    /// rxe: CQEs in that CQ that nobody had polled when the read began ([`NO_ID`]: unknown).
    pub unpolled: u32,
    /// 1 when the read counts in its channel's `WfQueue::readers` (the channel was mirrored
    /// when it began).
    pub counted: u32,
    pub _pad: u32,
}

/// A thread woken inside a handler, until it reads.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WfWake {
    pub queue: u64,
    /// Position of the event in its channel's queue.
    pub event: u64,
    pub t2: u64,
    pub t3: u64,
    pub cpu_target: u32,
    pub cpu_on: u32,
}

/// Runnable periods a reader thread's record keeps (see [`WfRunnable`]).
pub const WF_RUNNABLE_LEN: u32 = 32;

/// Per reader thread (from its first arm, on rxe, or else its first read): its last
/// [`WF_RUNNABLE_LEN`] periods on a CPU, and as many runnable but off a CPU (from a wake-up, or
/// a switch-out while runnable, to the switch-in), for the part of an already-awake event's
/// T1→T4 spent waiting for a CPU. A reader preempted more often than that within one
/// event's T1→T4 has its oldest periods left out (the split is then a lower bound).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WfRunnable {
    /// When this record was made (ns): no period before it is kept.
    pub kept_since: u64,
    /// Woken or switched out while runnable at this time (ns), not switched in since; 0: on a
    /// CPU or asleep.
    pub since: u64,
    /// Periods recorded: period `n` is in slot `n % WF_RUNNABLE_LEN`.
    pub count: u64,
    pub start: [u64; WF_RUNNABLE_LEN as usize],
    pub end: [u64; WF_RUNNABLE_LEN as usize],
    /// Switched in at this time (ns), not switched out since; 0: off a CPU.
    pub on_since: u64,
    /// The same for the periods on a CPU (switch-in to switch-out).
    pub on_count: u64,
    pub on_start: [u64; WF_RUNNABLE_LEN as usize],
    pub on_end: [u64; WF_RUNNABLE_LEN as usize],
}

/// Offsets the loader patches in (`WF_CONFIG` global).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WfConfig {
    /// `struct file`'s `private_data`.
    pub file_private_data: u32,
    /// `struct ib_uverbs_completion_event_file`'s `ev_queue`.
    pub ev_queue: u32,
    /// `sched_waking` tracepoint record: `pid` and `target_cpu`.
    pub waking_pid: u32,
    pub waking_target_cpu: u32,
    /// `sched_switch` tracepoint record: `next_pid`, `prev_pid` and `prev_state` (read as its
    /// low 32 bits: a `long` on 5.10 to 7.x, and the state bits lie below 0x100).
    pub switch_next_pid: u32,
    pub switch_prev_pid: u32,
    pub switch_prev_state: u32,
    /// `struct ib_cq`'s `res.id` (its restrack id); 0: unknown.
    pub cq_res_id: u32,
    /// Samples to emit at most, per CPU (0: none).
    pub sample_max: u64,
    /// rxe, for the CQEs left unpolled: `struct rxe_cq`'s `queue`, `struct rxe_queue`'s
    /// `buf`, and `struct rxe_queue_buf`'s `index_mask`, `producer_index`, `consumer_index`
    /// (0: unknown).
    pub rxe_cq_queue: u32,
    pub rxe_queue_buf: u32,
    pub buf_mask: u32,
    pub buf_producer: u32,
    pub buf_consumer: u32,
    /// `struct task_struct`'s state (`__state` from 5.14, `state` before; its low 32 bits): a
    /// thread switched out to sleep whose wake-up is already under way reads TASK_WAKING or
    /// RUNNING there (0: unknown).
    pub task_state: u32,
    /// `struct ib_cq`'s `device` (its first member: 0) and `struct ib_device`'s `name`, for
    /// the CQ rows' labels (`dev_name` 0: unknown).
    pub cq_device: u32,
    pub dev_name: u32,
    /// The machine's possible CPUs (the highest id + 1): the loader sizes the per-CPU maps
    /// (`WF_CPU_TOPO`, `WF_CPU_EVENTS`) for them; 0 before it does (no CPU is counted).
    pub ncpus: u32,
    /// `struct ib_uverbs_event_queue`'s `event_list` (ib_uverbs' BTF), to check the mirror
    /// against the kernel's queue (0: unknown, no check).
    pub event_list: u32,
    /// Fault injection for the tests (`RDMA_TRACE_FAULT_MIRROR_PHANTOMS`): at each channel's
    /// handler call number [`FAULT_PHANTOMS_AT`], the mirror counts this many events more
    /// than the kernel queued, as if the kernel had dropped them (0: none).
    pub fault_phantoms: u32,
    pub _pad: u32,
}

/// The channel's handler call at which `WfConfig::fault_phantoms` are counted.
pub const FAULT_PHANTOMS_AT: u64 = 100;

impl WfConfig {
    pub const UNSET: WfConfig = WfConfig {
        file_private_data: 0,
        ev_queue: 0,
        waking_pid: 0,
        waking_target_cpu: 0,
        switch_next_pid: 0,
        switch_prev_pid: 0,
        switch_prev_state: 0,
        cq_res_id: 0,
        sample_max: 0,
        rxe_cq_queue: 0,
        rxe_queue_buf: 0,
        buf_mask: 0,
        buf_producer: 0,
        buf_consumer: 0,
        task_state: 0,
        cq_device: 0,
        dev_name: 0,
        ncpus: 0,
        event_list: 0,
        fault_phantoms: 0,
        _pad: 0,
    };
}

/// One CPU's place in the machine, for the placement classes: the lowest CPU id of its core
/// (SMT siblings), of its last-level cache and its NUMA node, [`NO_ID`] where not known.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WfCpuTopo {
    pub core: u32,
    pub llc: u32,
    pub node: u32,
    /// 1 when the loader read this CPU's topology (0: an entry it never filled).
    pub known: u32,
}

impl WfCpuTopo {
    /// Not read.
    pub const UNKNOWN: WfCpuTopo = WfCpuTopo {
        core: NO_ID,
        llc: NO_ID,
        node: NO_ID,
        known: 0,
    };

    /// Placement class (`CLASS_*`) of a completion handled on CPU `a` (with topology `x`) for
    /// a waiter on CPU `b` (topology `y`); the eBPF side and the loader both use this one.
    #[inline(always)]
    pub fn class(a: u32, x: &WfCpuTopo, b: u32, y: &WfCpuTopo) -> u32 {
        if x.known == 0 || y.known == 0 {
            CLASS_UNKNOWN
        } else if a == b {
            CLASS_SAME_CPU
        } else if x.core != NO_ID && x.core == y.core {
            CLASS_SMT
        } else if x.llc != NO_ID && x.llc == y.llc {
            CLASS_LLC
        } else if x.node == NO_ID || y.node == NO_ID || x.node == y.node {
            // No NUMA information: one node.
            CLASS_NODE
        } else {
            CLASS_OTHER_NODE
        }
    }
}

#[cfg(feature = "user")]
mod user {
    // SAFETY (all): repr(C), Copy, integer fields and arrays without padding; any bit pattern
    // is a valid value.
    unsafe impl aya::Pod for super::WfCounts {}
    // SAFETY: see above.
    unsafe impl aya::Pod for super::WfHist {}
    // SAFETY: see above.
    unsafe impl aya::Pod for super::WfThread {}
    // SAFETY: see above.
    unsafe impl aya::Pod for super::WfConfig {}
    // SAFETY: see above.
    unsafe impl aya::Pod for super::WfCpuTopo {}
    // SAFETY: see above.
    unsafe impl aya::Pod for super::WfCq {}
    // SAFETY: see above.
    unsafe impl aya::Pod for super::WfQueue {}
    // SAFETY: see above.
    unsafe impl aya::Pod for super::WfReading {}
    // SAFETY: see above.
    unsafe impl aya::Pod for super::WfWake {}
    // SAFETY: see above.
    unsafe impl aya::Pod for super::WfRunnable {}
    // SAFETY: see above (the key's padding is an explicit field, written as 0).
    unsafe impl aya::Pod for super::WfCqKey {}
    // SAFETY: see above.
    unsafe impl aya::Pod for super::WfCqRow {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_cpu_values_fit_and_have_no_padding() {
        assert!(core::mem::size_of::<WfCounts>() <= 32 * 1024);
        assert_eq!(
            core::mem::size_of::<WfCounts>(),
            8 * (NR_WCOUNTERS + NR_CLASSES + NR_LOSSES) as usize
        );
        assert_eq!(core::mem::size_of::<WfSample>(), 8 * 8 + 8 * 4);
        assert_eq!(core::mem::size_of::<WfConfig>(), 88);
        assert_eq!(core::mem::size_of::<WfCqKey>(), 16);
        assert_eq!(core::mem::size_of::<WfCqRow>(), 24 + 8 * (4 + CQ_SUMS));
        assert_eq!(
            core::mem::size_of::<WfRunnable>(),
            8 * (5 + 4 * WF_RUNNABLE_LEN as usize)
        );
        assert_eq!(core::mem::size_of::<WfCq>(), 56);
        assert_eq!(
            core::mem::size_of::<WfQueue>(),
            8 * (10 + 5 * WF_QUEUE_LEN as usize)
        );
        assert_eq!(core::mem::size_of::<WfReading>(), 40);
        assert_eq!(core::mem::size_of::<WfWake>(), 40);
        assert_eq!(core::mem::size_of::<WfThread>(), 28);
        assert_eq!(core::mem::size_of::<WfCpuTopo>(), 16);
    }

    fn topo(core: u32, llc: u32, node: u32) -> WfCpuTopo {
        WfCpuTopo {
            core,
            llc,
            node,
            known: 1,
        }
    }

    #[test]
    fn classes_from_topology_ids() {
        let (a, b) = (topo(0, 0, 0), topo(0, 0, 0));
        assert_eq!(WfCpuTopo::class(3, &a, 3, &a), CLASS_SAME_CPU);
        assert_eq!(WfCpuTopo::class(0, &a, 1, &b), CLASS_SMT);
        assert_eq!(WfCpuTopo::class(0, &a, 2, &topo(2, 0, 0)), CLASS_LLC);
        assert_eq!(WfCpuTopo::class(0, &a, 8, &topo(8, 8, 0)), CLASS_NODE);
        assert_eq!(WfCpuTopo::class(0, &a, 9, &topo(9, 9, 1)), CLASS_OTHER_NODE);
        // No LLC or node known: not the same LLC, one node.
        let bare = |c| topo(c, NO_ID, NO_ID);
        assert_eq!(WfCpuTopo::class(0, &bare(0), 1, &bare(1)), CLASS_NODE);
        assert_eq!(
            WfCpuTopo::class(0, &a, 1, &WfCpuTopo::UNKNOWN),
            CLASS_UNKNOWN
        );
        assert_eq!(
            WfCpuTopo::class(1, &WfCpuTopo::UNKNOWN, 1, &WfCpuTopo::UNKNOWN),
            CLASS_UNKNOWN
        );
    }

    #[test]
    fn cpu_event_indices_of_slots_kinds_and_cpus_do_not_overlap() {
        const N: u32 = 256;
        const ALL: usize = (WF_THREADS * NR_CPU_KINDS * N) as usize;
        let mut seen = [false; ALL];
        for slot in 0..WF_THREADS {
            for kind in 0..NR_CPU_KINDS {
                for cpu in 0..N {
                    let i = cpu_event_index(slot, kind, cpu, N) as usize;
                    assert!(
                        i < ALL && !seen[i],
                        "slot {slot} kind {kind} cpu {cpu}: {i}"
                    );
                    seen[i] = true;
                }
            }
        }
        assert!(seen.iter().all(|&s| s));
    }
}

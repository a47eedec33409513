//! eBPF programs of rdma-trace: generic entry/exit mechanisms that feed per-CPU histograms.
//!
//! The loader numbers the probes and tells each program what to feed through read-only globals
//! (`KSLOTS`, `SOFTIRQ_PROBE`, `NAPI_PROBE`, `INTERVAL_PROBE`), set before load, so the verifier
//! sees constants and the programs carry no per-probe code. Shapes:
//! - kernel function duration: `kentry_N` (kprobe, or `fentry_N`) stores the entry time in
//!   this CPU's slot N; `kreturn_N` (kretprobe, or `fexit_N`) records return − entry;
//! - interval: the entry of one function starts it, the return of another ends it
//!   (e.g. `ib_uverbs_comp_handler` → the demo's read of the completion event = wake-up latency);
//! - softirq duration per vector, from the `softirq_entry`/`softirq_exit` raw tracepoints;
//! - hard IRQ handler duration per IRQ number, from `irq_handler_entry`/`irq_handler_exit`;
//! - NAPI polls: count, and a histogram of packets handled per poll (`napi_poll`);
//! - the ib_cq API's wake-up delay: a kernel consumer's CQ scheduled (`rdma_core:cq_schedule`
//!   or `cq_reschedule`) → its poll starts (`cq_process`), per CQ (`CQ_WAKEUP_PROBE`);
//! - rdma_cm connection set-up: REQ sent or CONNECT_REQUEST → ESTABLISHED, per connection
//!   (`rdma_cma` tracepoints, `cma.rs`; `CM_CONNECT_PROBE`);
//! - user-space function duration (`uentry`/`ureturn`, uprobes; the probe id is the attach
//!   cookie), counted only for the processes the loader puts in `TGIDS`.
//!
//! No per-event ring buffer by default: everything is aggregated here. `--timeline` turns on
//! a sample path (`timeline.rs`); `run -- CMD`, `--pid` and `--all` per-process counts
//! (`workload.rs`).
#![no_std]
#![no_main]
// For `core::intrinsics::atomic_xadd` (see `add_one`); the eBPF build already runs with
// RUSTC_BOOTSTRAP for build-std.
#![feature(core_intrinsics)]
#![allow(internal_features)]

mod calibrate;
mod cma;
mod cq;
mod nvme;
mod rare;

mod syscalls;

mod timeline;

mod waterfall;

mod workload;

use aya_ebpf::{
    EbpfContext as _,
    helpers::{bpf_get_attach_cookie, bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    helpers::{bpf_probe_read_kernel, bpf_probe_read_kernel_buf, bpf_probe_read_kernel_str_bytes},
    macros::{fentry, fexit, kprobe, kretprobe, map, raw_tracepoint, uprobe, uretprobe},
    maps::{Array, HashMap, PerCpuArray},
    programs::{FEntryContext, FExitContext, ProbeContext, RawTracePointContext, RetProbeContext},
};
use rdma_trace_common::{
    C_EVENTS, C_UNMATCHED, IntervalProbes, KSlot, MAX_INTERVALS, MAX_IRQS, MAX_KSLOTS, MAX_PROBES,
    NO_PROBE, NR_SOFTIRQS, ProbeRow, hist_slot,
    ibcq::{IBCQ_COMPLETIONS, IBCQ_DELAY_NS, IBCQ_POLLS, IBCQ_UNMATCHED, IBCQ_WAKEUPS, IbCqStat},
    workload::{
        MAX_PROCS, TL_FUNC_ENTRY, TL_FUNC_RETURN, TL_IRQ_ENTRY, TL_IRQ_EXIT, TL_NAPI_POLL,
        TL_SOFTIRQ_ENTRY, TL_SOFTIRQ_EXIT,
    },
};

// ---- configuration, set by the loader before load (read-only for the programs)

/// What each kernel-function program pair feeds.
#[unsafe(no_mangle)]
static KSLOTS: [KSlot; MAX_KSLOTS as usize] = [KSlot::UNUSED; MAX_KSLOTS as usize];
/// Probe timing each softirq vector, or NO_PROBE.
#[unsafe(no_mangle)]
static SOFTIRQ_PROBE: [u32; NR_SOFTIRQS as usize] = [NO_PROBE; NR_SOFTIRQS as usize];
/// Probe counting NAPI polls (histogram: packets per poll), or NO_PROBE.
#[unsafe(no_mangle)]
static NAPI_PROBE: u32 = NO_PROBE;
/// Probe timing the ib_cq API's wake-ups (cq_schedule → cq_process), or NO_PROBE.
#[unsafe(no_mangle)]
static CQ_WAKEUP_PROBE: u32 = NO_PROBE;
/// Probe timing rdma_cm connection set-up (`cma.rs`), or NO_PROBE.
#[unsafe(no_mangle)]
static CM_CONNECT_PROBE: u32 = NO_PROBE;
/// Where the per-CQ labels are in `struct ib_cq` (`res.id`, `poll_ctx`, `comp_vector`,
/// `device`) and `struct ib_device` (`name`), from BTF, when `IBCQ_LABELS` is 1.
#[unsafe(no_mangle)]
static IBCQ_LABELS: u32 = 0;
#[unsafe(no_mangle)]
static IBCQ_OFF_RES_ID: u32 = 0;
#[unsafe(no_mangle)]
static IBCQ_OFF_POLL_CTX: u32 = 0;
#[unsafe(no_mangle)]
static IBCQ_OFF_COMP_VECTOR: u32 = 0;
#[unsafe(no_mangle)]
static IBCQ_OFF_DEVICE: u32 = 0;
#[unsafe(no_mangle)]
static IBCQ_OFF_DEV_NAME: u32 = 0;
/// Where `res.kern_name` (a `const char *`) is in `struct ib_cq`.
#[unsafe(no_mangle)]
static IBCQ_OFF_KERN_NAME: u32 = 0;
/// Where the poll buffer `wc` (a `struct ib_wc *`) is in `struct ib_cq`, `wr_cqe` in
/// `struct ib_wc`, and `done` in `struct ib_cqe`: the consumer's callback of a polled
/// completion. `IBCQ_OFF_WC` 0: not read.
#[unsafe(no_mangle)]
static IBCQ_OFF_WC: u32 = 0;
#[unsafe(no_mangle)]
static IBCQ_OFF_WR_CQE: u32 = 0;
#[unsafe(no_mangle)]
static IBCQ_OFF_CQE_DONE: u32 = 0;
/// Probe of each interval.
#[unsafe(no_mangle)]
static INTERVAL_PROBE: IntervalProbes = [NO_PROBE; MAX_INTERVALS as usize];

/// 1: user-space probes count only processes in `TGIDS` (the demo's); 0: every process.
#[unsafe(no_mangle)]
static FILTER_TGIDS: u32 = 1;

#[inline(always)]
fn config<T: Copy>(v: &T) -> T {
    // SAFETY: reading a static; volatile so the compiler keeps the load the loader patches.
    unsafe { core::ptr::read_volatile(v) }
}

// ---- maps

/// Per probe, its counters, histogram and start time on this CPU. A kernel function's entry
/// time is its row's `start`: the traced functions run in softirq, tasklet or non-sleeping
/// process context, so entry and return happen on one CPU with nothing of the same function in
/// between. A call that sleeps or migrates anyway ends unmatched (counted) instead of being
/// mis-timed by much. Cheaper than a hash map keyed by thread, and an entry or a return looks up
/// one map value (each probe times one function, softirq vector or set of IRQ lines).
#[map]
static ROWS: PerCpuArray<ProbeRow> = PerCpuArray::with_max_entries(MAX_PROBES, 0);
/// Entry time per (thread id << 32 | user-probe marker | probe): user threads block inside
/// the probed functions (ibv_get_cq_event) and may migrate.
#[map]
static USTART: HashMap<u64, u64> = HashMap::with_max_entries(4096, 0);
/// Processes the user-space probes watch (set by the loader once it has spawned them), and the
/// traced process tree of `run -- CMD` / `--pid` (see `workload.rs`).
#[map]
static TGIDS: HashMap<u32, u8> = HashMap::with_max_entries(MAX_PROCS, 0);
/// Start time of each interval (global: the end usually runs on another CPU and thread).
#[map]
static INTERVAL_START: Array<u64> = Array::with_max_entries(MAX_INTERVALS, 0);
/// When each kernel CQ (keyed by its `struct ib_cq *`) was last scheduled and not yet
/// processed.
#[map]
static CQ_SCHEDULED: HashMap<u64, u64> = HashMap::with_max_entries(4096, 0);
/// Per kernel CQ (keyed by its `struct ib_cq *`): its labels and ib_cq API counts.
#[map]
static IBCQ: HashMap<u64, IbCqStat> = HashMap::with_max_entries(1024, 0);
/// Probe timing the handlers of each traced IRQ number.
#[map]
static IRQ_PROBE: HashMap<u32, u32> = HashMap::with_max_entries(MAX_IRQS, 0);

// ---- recording
//
// A program can be interrupted on its CPU, and the interrupt can run another of our programs
// that adds to the same row. Kprobe and uprobe programs cannot nest (the kernel skips one while
// another runs on the CPU: `bpf_prog_active`). Raw tracepoint and fentry/fexit programs have at
// most a guard per program, none across programs: a function traced by fentry/fexit that also
// runs in hard IRQ context gets its fentry program run in an IRQ while its fexit program, on
// the same row, is interrupted; and `napi_poll` can fire from netpoll in a hard IRQ over the
// same tracepoint in NET_RX where the kernel has no per-program guard for raw tracepoints. A
// plain `+= 1` (load, add, store) would then lose the inner add, so every add to ROWS is an
// atomic add (BPF_XADD: a `lock` add on this CPU's value, uncontended and cheap).
//
// The start times (a row's `start`) need no atomics: each access is one aligned 8-byte load or
// store, so a nested program sees a whole value, and a nested entry always returns before the
// code it interrupted goes on. Softirqs do not nest on a CPU (the start of a softirq row is that
// of its vector), nor do hard IRQ handlers. A traced function that runs again in an interrupt on
// the same CPU overwrites and clears its start: the interrupted call then finds none and is
// counted as unmatched, never mis-timed.

/// Adds `n` to the u64 at `p` atomically. `AtomicU64::fetch_add` is not offered on this
/// target (its spec says no compare-and-swap), but the add is a plain BPF instruction: the
/// intrinsic with an unused result compiles to BPF_XADD, which every kernel with BPF has.
/// `p` must point into a map value (valid while the program runs; its u64 fields are 8-byte
/// aligned) whose every writer adds atomically.
#[inline(always)]
pub(crate) fn atomic_add(p: *mut u64, n: u64) {
    // SAFETY: see above: an aligned u64 in a map value, valid for the program's run.
    unsafe {
        core::intrinsics::atomic_xadd::<u64, u64, { core::intrinsics::AtomicOrdering::Relaxed }>(
            p, n,
        )
    };
}

/// Adds 1 to the u64 at `p` atomically (see [`atomic_add`]); every writer of ROWS adds so.
#[inline(always)]
fn add_one(p: *mut u64) {
    atomic_add(p, 1);
}

/// This CPU's row of `probe` (one map lookup).
#[inline(always)]
fn row(probe: u32) -> Option<*mut ProbeRow> {
    ROWS.get_ptr_mut(probe)
}

/// Adds 1 to `counter` of `probe`, whose row on this CPU is `row`.
#[inline(always)]
fn count_in(probe: u32, row: *mut ProbeRow, counter: u32) {
    if counter == C_EVENTS {
        workload::count_probe(probe);
    }
    // SAFETY: `row` points to this CPU's value of a per-CPU array: only a reference to the
    // field is formed, and it is written through `add_one`.
    if let Some(c) = unsafe { (*row).counters.get_mut(counter as usize) } {
        add_one(c);
    }
}

/// Adds `value` to the histogram of `row`.
#[inline(always)]
fn record_in(row: *mut ProbeRow, value: u64) {
    // LLVM knows hist_slot() < HIST_SLOTS and drops the bounds check, but the verifier cannot
    // follow its arithmetic: make the slot opaque so the check stays in the program.
    let slot = hist_slot(value) as usize;
    // SAFETY: a volatile read of a local that was just written.
    let slot = unsafe { core::ptr::read_volatile(&slot) };
    // SAFETY: as in `count_in`.
    if let Some(s) = unsafe { (*row).slots.get_mut(slot) } {
        add_one(s);
    }
}

/// Takes the start time of `row` on this CPU and clears it (0: none).
#[inline(always)]
fn take_start(row: *mut ProbeRow) -> u64 {
    // SAFETY: this CPU's row; one aligned 8-byte load and store, see "recording" above.
    unsafe { core::mem::replace(&mut (*row).start, 0) }
}

/// Sets the start time of `row` on this CPU; returns the one it replaces (0: none).
#[inline(always)]
fn set_start(row: *mut ProbeRow, t: u64) -> u64 {
    // SAFETY: as in `take_start`.
    unsafe { core::mem::replace(&mut (*row).start, t) }
}

/// The end of what `row` times, at `t`: its duration recorded, or an unmatched end counted.
/// Returns false for an end without its start.
#[inline(always)]
fn end_in(probe: u32, row: *mut ProbeRow, t: u64) -> bool {
    let start = take_start(row);
    if start != 0 {
        record_in(row, t.saturating_sub(start));
        true
    } else {
        count_in(probe, row, C_UNMATCHED);
        false
    }
}

#[inline(always)]
fn count(probe: u32, counter: u32) {
    if let Some(r) = row(probe) {
        count_in(probe, r, counter);
    }
}

#[inline(always)]
fn record(probe: u32, value: u64) {
    if let Some(r) = row(probe) {
        record_in(r, value);
    }
}

#[inline(always)]
fn now() -> u64 {
    // SAFETY: bpf_ktime_get_ns has no preconditions.
    unsafe { bpf_ktime_get_ns() }
}

// ---- kernel functions: entry → return, and intervals

/// The entry of slot `slot`'s function. Called with a literal by its own program, and with
/// the slot the loader sets by the waterfall's programs that share a hook with the table
/// (`waterfall::table_entry`): out of range does nothing.
#[inline(always)]
pub(crate) fn kentry(slot: usize) -> u32 {
    let Some(cfg) = KSLOTS.get(slot) else {
        return 0;
    };
    let cfg: KSlot = config(cfg);
    let t = now();
    timeline::emit(TL_FUNC_ENTRY, slot as u32, 0, t);
    workload::count_call(slot as u32);
    if cfg.duration != NO_PROBE
        && let Some(r) = row(cfg.duration)
    {
        count_in(cfg.duration, r, C_EVENTS);
        if set_start(r, t) != 0 {
            rare::busy_slot(slot as u32);
        }
    }
    if cfg.starts < MAX_INTERVALS {
        let probe = config(&INTERVAL_PROBE)[cfg.starts as usize];
        count(probe, C_EVENTS);
        if let Some(p) = INTERVAL_START.get_ptr_mut(cfg.starts) {
            // SAFETY: `p` points into an array map value; a racing writer on another CPU
            // stores a timestamp too, and either value is a valid start.
            unsafe {
                if *p == 0 {
                    *p = t;
                }
            }
        }
    }
    0
}

/// The return of slot `slot`'s function (see [`kentry`]).
#[inline(always)]
pub(crate) fn kreturn(slot: usize) -> u32 {
    let Some(cfg) = KSLOTS.get(slot) else {
        return 0;
    };
    let cfg: KSlot = config(cfg);
    let t = now();
    timeline::emit(TL_FUNC_RETURN, slot as u32, 0, t);
    if cfg.duration != NO_PROBE
        && let Some(r) = row(cfg.duration)
        && !end_in(cfg.duration, r, t)
    {
        rare::unmatched_return(slot as u32);
    }
    if cfg.ends < MAX_INTERVALS
        && let Some(p) = INTERVAL_START.get_ptr_mut(cfg.ends)
    {
        let probe = config(&INTERVAL_PROBE)[cfg.ends as usize];
        // SAFETY: as in `kentry`; taking the start and clearing it is one read and one write.
        let start = unsafe { core::mem::replace(&mut *p, 0) };
        if start != 0 {
            record(probe, t.saturating_sub(start));
        } else {
            count(probe, C_UNMATCHED);
            rare::unmatched_interval_end(cfg.ends);
        }
    }
    0
}

/// Per slot, a kprobe/kretprobe pair and an fentry/fexit pair (for vmlinux functions where
/// kprobes are missing); the bodies are the generic functions above. The loader attaches one
/// pair per slot and names the function at attach (kprobe) or load (fentry) time.
macro_rules! kslot {
    ($slot:literal, $entry:ident, $ret:ident, $fentry:ident, $fexit:ident) => {
        #[kprobe]
        pub fn $entry(_ctx: ProbeContext) -> u32 {
            kentry($slot)
        }
        #[kretprobe]
        pub fn $ret(_ctx: RetProbeContext) -> u32 {
            kreturn($slot)
        }
        #[fentry]
        pub fn $fentry(_ctx: FEntryContext) -> u32 {
            kentry($slot)
        }
        #[fexit]
        pub fn $fexit(_ctx: FExitContext) -> u32 {
            kreturn($slot)
        }
    };
}

kslot!(0, kentry_0, kreturn_0, fentry_0, fexit_0);
kslot!(1, kentry_1, kreturn_1, fentry_1, fexit_1);
kslot!(2, kentry_2, kreturn_2, fentry_2, fexit_2);
kslot!(3, kentry_3, kreturn_3, fentry_3, fexit_3);
kslot!(4, kentry_4, kreturn_4, fentry_4, fexit_4);
kslot!(5, kentry_5, kreturn_5, fentry_5, fexit_5);
kslot!(6, kentry_6, kreturn_6, fentry_6, fexit_6);
kslot!(7, kentry_7, kreturn_7, fentry_7, fexit_7);
kslot!(8, kentry_8, kreturn_8, fentry_8, fexit_8);
kslot!(9, kentry_9, kreturn_9, fentry_9, fexit_9);
kslot!(10, kentry_10, kreturn_10, fentry_10, fexit_10);
kslot!(11, kentry_11, kreturn_11, fentry_11, fexit_11);
kslot!(12, kentry_12, kreturn_12, fentry_12, fexit_12);
kslot!(13, kentry_13, kreturn_13, fentry_13, fexit_13);
kslot!(14, kentry_14, kreturn_14, fentry_14, fexit_14);
kslot!(15, kentry_15, kreturn_15, fentry_15, fexit_15);

// ---- user-space functions (uprobe/uretprobe): one program pair attached once per probe, the
// probe id in the attach cookie; only the watched processes count.

/// Marks user-space entries in USTART keys.
const USER_KEY: u64 = 1 << 31;

#[inline(always)]
fn watched() -> bool {
    if config(&FILTER_TGIDS) == 0 {
        return true;
    }
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    // SAFETY: only the presence of the key is used.
    unsafe { TGIDS.get(tgid) }.is_some()
}

#[uprobe]
pub fn uentry(ctx: ProbeContext) -> u32 {
    if !watched() {
        return 0;
    }
    // SAFETY: the context pointer is the program's own; the helper only reads the link's cookie.
    let probe = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) } as u32;
    count(probe, C_EVENTS);
    let key = (bpf_get_current_pid_tgid() << 32) | USER_KEY | (probe as u64 & 0xFFFF);
    let _ = USTART.insert(key, now(), 0);
    0
}

#[uretprobe]
pub fn ureturn(ctx: RetProbeContext) -> u32 {
    if !watched() {
        return 0;
    }
    // SAFETY: as in `uentry`.
    let probe = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) } as u32;
    let key = (bpf_get_current_pid_tgid() << 32) | USER_KEY | (probe as u64 & 0xFFFF);
    // SAFETY: the value is copied out before the entry is removed.
    match unsafe { USTART.get(key) }.copied() {
        Some(start) => {
            let _ = USTART.remove(key);
            record(probe, now().saturating_sub(start));
        }
        None => count(probe, C_UNMATCHED),
    }
    0
}

// ---- softirqs: TP_PROTO(unsigned int vec_nr)

#[inline(always)]
fn softirq_probe(ctx: &RawTracePointContext) -> Option<(u32, u32)> {
    let vec: u64 = ctx.arg(0);
    if vec >= NR_SOFTIRQS as u64 {
        return None;
    }
    let probe = config(&SOFTIRQ_PROBE)[vec as usize];
    (probe != NO_PROBE).then_some((vec as u32, probe))
}

#[raw_tracepoint(tracepoint = "softirq_entry")]
pub fn softirq_entry(ctx: RawTracePointContext) -> i32 {
    if let Some((vec, probe)) = softirq_probe(&ctx)
        && let Some(r) = row(probe)
    {
        count_in(probe, r, C_EVENTS);
        let t = now();
        timeline::emit(TL_SOFTIRQ_ENTRY, vec, 0, t);
        set_start(r, t);
    }
    0
}

#[raw_tracepoint(tracepoint = "softirq_exit")]
pub fn softirq_exit(ctx: RawTracePointContext) -> i32 {
    if let Some((vec, probe)) = softirq_probe(&ctx)
        && let Some(r) = row(probe)
    {
        let t = now();
        timeline::emit(TL_SOFTIRQ_EXIT, vec, 0, t);
        end_in(probe, r, t);
    }
    0
}

// ---- hard IRQs: TP_PROTO(int irq, struct irqaction *action[, int ret])

#[inline(always)]
fn irq_probe(ctx: &RawTracePointContext) -> Option<u32> {
    let irq: u64 = ctx.arg(0);
    // SAFETY: the value is copied out of the map at once.
    unsafe { IRQ_PROBE.get(irq as u32) }.copied()
}

#[raw_tracepoint(tracepoint = "irq_handler_entry")]
pub fn irq_handler_entry(ctx: RawTracePointContext) -> i32 {
    if let Some(probe) = irq_probe(&ctx)
        && let Some(r) = row(probe)
    {
        count_in(probe, r, C_EVENTS);
        let t = now();
        timeline::emit(TL_IRQ_ENTRY, ctx.arg::<u64>(0) as u32, 0, t);
        set_start(r, t);
    }
    0
}

#[raw_tracepoint(tracepoint = "irq_handler_exit")]
pub fn irq_handler_exit(ctx: RawTracePointContext) -> i32 {
    if let Some(probe) = irq_probe(&ctx)
        && let Some(r) = row(probe)
    {
        let t = now();
        timeline::emit(TL_IRQ_EXIT, ctx.arg::<u64>(0) as u32, 0, t);
        end_in(probe, r, t);
    }
    0
}

// ---- NAPI: TP_PROTO(struct napi_struct *napi, int work, int budget)

#[raw_tracepoint(tracepoint = "napi_poll")]
pub fn napi_poll(ctx: RawTracePointContext) -> i32 {
    let probe = config(&NAPI_PROBE);
    if probe != NO_PROBE
        && let Some(r) = row(probe)
    {
        count_in(probe, r, C_EVENTS);
        let work: u64 = ctx.arg(1);
        // The clock is read only for the timeline: a helper call is most of this program's cost.
        if timeline::on() {
            timeline::emit(TL_NAPI_POLL, 0, (work & 0xFFFF_FFFF) as u32, now());
        }
        record_in(r, work & 0xFFFF_FFFF);
    }
    0
}

// ---- the ib_cq API (rdma_core tracepoints of ib_core): TP_PROTO(struct ib_cq *cq) for
// cq_schedule, cq_reschedule, cq_process and cq_free. The tracepoints' own fields (cq->res.id,
// the latency from cq->timestamp) are filled only for ftrace; a raw tracepoint gets the CQ
// pointer, which keys the start here.

/// The CQ was scheduled (its completion handler ran, or a full budget re-scheduled it): its
/// wake-up starts now. A second schedule before the poll restarts it, as the kernel's own
/// `cq->timestamp` does.
#[inline(always)]
fn cq_scheduled(ctx: &RawTracePointContext) -> i32 {
    if config(&CQ_WAKEUP_PROBE) != NO_PROBE || config(&nvme::NVME_IO_PROBE) != NO_PROBE {
        let cq: u64 = ctx.arg(0);
        let _ = CQ_SCHEDULED.insert(cq, now(), 0);
    }
    0
}

#[raw_tracepoint(tracepoint = "cq_schedule")]
pub fn ibcq_schedule(ctx: RawTracePointContext) -> i32 {
    cq_scheduled(&ctx)
}

#[raw_tracepoint(tracepoint = "cq_reschedule")]
pub fn ibcq_reschedule(ctx: RawTracePointContext) -> i32 {
    cq_scheduled(&ctx)
}

/// The `T` at `base + off` in kernel memory (zero when unreadable).
#[inline(always)]
pub(crate) fn read_at<T: Default>(base: u64, off: u32) -> T {
    // SAFETY: bpf_probe_read_kernel checks the address; a fault gives an error, not a crash.
    unsafe { bpf_probe_read_kernel((base + off as u64) as *const T) }.unwrap_or_default()
}

/// The `u32` at `base + off` in kernel memory (0 when unreadable).
#[inline(always)]
fn read_u32(base: u64, off: u32) -> u32 {
    read_at(base, off)
}

/// The IBCQ entry of `cq`, made (with the CQ's labels, when their offsets are known) on its
/// first event.
#[inline(always)]
fn ibcq_stat(cq: u64) -> Option<*mut IbCqStat> {
    if let Some(p) = IBCQ.get_ptr_mut(cq) {
        return Some(p);
    }
    let mut s = IbCqStat::default();
    if config(&IBCQ_LABELS) == 1 {
        let dev_off = config(&IBCQ_OFF_DEVICE);
        s.id = read_u32(cq, config(&IBCQ_OFF_RES_ID));
        s.poll_ctx = read_u32(cq, config(&IBCQ_OFF_POLL_CTX));
        s.comp_vector = read_u32(cq, config(&IBCQ_OFF_COMP_VECTOR));
        let dev: u64 = read_at(cq, dev_off);
        if dev != 0 {
            let name = (dev + config(&IBCQ_OFF_DEV_NAME) as u64) as *const u8;
            // SAFETY: as in `read_u32`; the buffer is the local's own.
            let _ = unsafe { bpf_probe_read_kernel_buf(name, &mut s.device) };
            s.labelled = 1;
        }
        let owner: u64 = read_at(cq, config(&IBCQ_OFF_KERN_NAME));
        if owner != 0 {
            // SAFETY: as in `read_u32`; the buffer is the local's own. A name longer than the
            // buffer is cut (the helper NUL-terminates within it).
            let _ = unsafe { bpf_probe_read_kernel_str_bytes(owner as *const u8, &mut s.owner) };
        }
    }
    // BPF_NOEXIST: another CPU may have made it meanwhile; either entry is the CQ's.
    let _ = IBCQ.insert(cq, s, 1);
    IBCQ.get_ptr_mut(cq)
}

/// Adds `n` to counter `c` of a CQ's entry (atomically: CPUs share it).
#[inline(always)]
fn ibcq_add(s: *mut IbCqStat, c: usize, n: u64) {
    // SAFETY: `s` points into a map value, valid while the program runs; only the field's
    // address is formed.
    if let Some(p) = unsafe { (*s).counters.get_mut(c) } {
        atomic_add(p, n);
    }
}

/// The CQ's poll starts (softirq or kworker): one wake-up, timed from its schedule; the NVMe
/// split's poll round on this CPU.
#[raw_tracepoint(tracepoint = "cq_process")]
pub fn ibcq_process(ctx: RawTracePointContext) -> i32 {
    let probe = config(&CQ_WAKEUP_PROBE);
    if probe == NO_PROBE && config(&nvme::NVME_IO_PROBE) == NO_PROBE {
        return 0;
    }
    let t = now();
    let cq: u64 = ctx.arg(0);
    // SAFETY: the value is copied out before the entry is removed.
    let start = unsafe { CQ_SCHEDULED.get(cq) }.copied();
    if start.is_some() {
        let _ = CQ_SCHEDULED.remove(cq);
    }
    nvme::round_started(cq, start.unwrap_or(0), t);
    if probe != NO_PROBE
        && let Some(r) = row(probe)
    {
        count_in(probe, r, C_EVENTS);
        let stat = ibcq_stat(cq);
        if let Some(s) = stat {
            ibcq_add(s, IBCQ_WAKEUPS, 1);
        }
        match start {
            Some(start) => {
                let delay = t.saturating_sub(start);
                record_in(r, delay);
                if let Some(s) = stat {
                    ibcq_add(s, IBCQ_DELAY_NS, delay);
                }
            }
            None => {
                count_in(probe, r, C_UNMATCHED);
                if let Some(s) = stat {
                    ibcq_add(s, IBCQ_UNMATCHED, 1);
                }
            }
        }
    }
    0
}

/// One poll of the ib_cq API: TP_PROTO(struct ib_cq *cq, int requested, int rc).
#[raw_tracepoint(tracepoint = "cq_poll")]
pub fn ibcq_poll(ctx: RawTracePointContext) -> i32 {
    let cq: u64 = ctx.arg(0);
    nvme::cq_polled(cq);
    if config(&CQ_WAKEUP_PROBE) != NO_PROBE {
        let rc = ctx.arg::<u64>(2) as u32 as i32;
        if let Some(s) = ibcq_stat(cq) {
            ibcq_add(s, IBCQ_POLLS, 1);
            if rc > 0 {
                ibcq_add(s, IBCQ_COMPLETIONS, rc as u64);
                consumer_callback(cq, s);
            }
        }
    }
    0
}

/// `enum ib_poll_context`'s IB_POLL_DIRECT: its polls fill a buffer on the poller's stack.
const IB_POLL_DIRECT: u32 = 3;

/// Once per CQ, the `done` callback of the first completion a poll returned: `__ib_process_cq`
/// polls into `cq->wc` (softirq and workqueue CQs) and fires `cq_poll` before it calls each
/// completion's `wc->wr_cqe->done`. Three reads, on the CQ's first poll with completions.
#[inline(always)]
fn consumer_callback(cq: u64, s: *mut IbCqStat) {
    let off_wc = config(&IBCQ_OFF_WC);
    // SAFETY: `s` points into a map value, valid while the program runs; plain loads and one
    // store of an aligned u64 (two CPUs may both store a callback: either is the CQ's).
    let (done, poll_ctx) = unsafe { ((*s).done, (*s).poll_ctx) };
    if off_wc == 0 || done != 0 || poll_ctx == IB_POLL_DIRECT {
        return;
    }
    let wc: u64 = read_at(cq, off_wc);
    if wc == 0 {
        return;
    }
    let cqe: u64 = read_at(wc, config(&IBCQ_OFF_WR_CQE));
    if cqe == 0 {
        return;
    }
    let f: u64 = read_at(cqe, config(&IBCQ_OFF_CQE_DONE));
    // SAFETY: as above.
    unsafe { (*s).done = f };
}

/// A CQ is freed: its pending start and its entry go (the address can be a new CQ's next; a
/// CQ freed within the window leaves the per-CQ list, its wake-ups stay in the row).
#[raw_tracepoint(tracepoint = "cq_free")]
pub fn ibcq_free(ctx: RawTracePointContext) -> i32 {
    if config(&CQ_WAKEUP_PROBE) != NO_PROBE {
        let cq: u64 = ctx.arg(0);
        let _ = CQ_SCHEDULED.remove(cq);
        let _ = IBCQ.remove(cq);
    }
    0
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";

//! The traced processes of `rdma-trace run -- CMD`, `--pid` and `--all`.
//!
//! - `WORKLOAD` = `WL_TREE`: the processes in `TGIDS` and their descendants. The loader puts the
//!   `--pid` processes there; with a CMD, `TRACER_TGID` is rdma-trace itself, whose next child
//!   is the CMD. `task_newtask` adds every new process (not thread) of a traced parent, before
//!   it runs, so no child escapes by forking early.
//! - `WORKLOAD` = `WL_ALL`: every process.
//!
//! Per traced process, `PROC_EVENTS` counts each probe's events and each kernel function's calls
//! that happened while one of its threads was current (its syscalls, and softirqs that ran on its
//! time). `PROC_COMM` keeps its name, updated at exec, so it survives the process.

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid},
    macros::{map, raw_tracepoint, tracepoint},
    maps::{HashMap, PerCpuHashMap},
    programs::{RawTracePointContext, TracePointContext},
};
use rdma_trace_common::workload::{
    CLONE_THREAD, MAX_PROC_KEYS, MAX_PROCS, PROC_KEY_SLOT, WL_ALL, WL_OFF, WL_TREE, proc_key,
};

use crate::{TGIDS, config};

/// `WL_OFF`, `WL_TREE` or `WL_ALL` (set by the loader).
#[unsafe(no_mangle)]
static WORKLOAD: u32 = WL_OFF;
/// With `WL_TREE`: a process whose new children are traced (rdma-trace, which spawns the CMD);
/// 0 for none.
#[unsafe(no_mangle)]
static TRACER_TGID: u32 = 0;
/// Offsets of `pid` and `clone_flags` in the `task:task_newtask` record (from its tracefs
/// format file).
#[unsafe(no_mangle)]
static NEWTASK_PID_OFFSET: u32 = 8;
#[unsafe(no_mangle)]
static NEWTASK_FLAGS_OFFSET: u32 = 32;

/// Per (process << 32 | probe, or `PROC_KEY_SLOT` | function slot): events in its context.
#[map]
static PROC_EVENTS: PerCpuHashMap<u64, u64> = PerCpuHashMap::with_max_entries(MAX_PROC_KEYS, 0);
/// Name of each traced process.
#[map]
static PROC_COMM: HashMap<u32, [u8; 16]> = HashMap::with_max_entries(MAX_PROCS, 0);

#[inline(always)]
fn traced(tgid: u32) -> bool {
    match config(&WORKLOAD) {
        WL_ALL => true,
        // SAFETY: only the presence of the key is used.
        WL_TREE => unsafe { TGIDS.get(tgid) }.is_some(),
        _ => false,
    }
}

#[inline(always)]
fn bump(what: u32) {
    if config(&WORKLOAD) == WL_OFF {
        return;
    }
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if !traced(tgid) {
        return;
    }
    let key = proc_key(tgid, what);
    match PROC_EVENTS.get_ptr_mut(key) {
        // SAFETY: this CPU's value of a per-CPU hash map; BPF programs do not re-enter on one CPU.
        Some(p) => unsafe { *p += 1 },
        None => {
            // A full map drops the count (bounded memory); MAX_PROC_KEYS is far above what
            // one workload produces.
            let _ = PROC_EVENTS.insert(key, 1, BPF_NOEXIST as u64);
            if config(&WORKLOAD) == WL_ALL {
                let comm = bpf_get_current_comm().unwrap_or([0; 16]);
                let _ = PROC_COMM.insert(tgid, comm, BPF_NOEXIST as u64);
            }
        }
    }
}

/// An event of `probe` (called for every C_EVENTS count).
#[inline(always)]
pub fn count_probe(probe: u32) {
    bump(probe);
}

/// A call of the kernel function in `slot`.
#[inline(always)]
pub fn count_call(slot: u32) {
    bump(PROC_KEY_SLOT | slot);
}

/// A new task: a new process of a traced parent becomes traced.
#[tracepoint]
pub fn task_newtask(ctx: TracePointContext) -> u32 {
    if config(&WORKLOAD) != WL_TREE {
        return 0;
    }
    let parent = (bpf_get_current_pid_tgid() >> 32) as u32;
    let tracer = config(&TRACER_TGID);
    let by_tracer = tracer != 0 && parent == tracer;
    if !by_tracer && !traced(parent) {
        return 0;
    }
    // SAFETY: offsets of the record's fields, from its format file; the helper checks the read.
    let flags: u64 =
        unsafe { ctx.read_at(config(&NEWTASK_FLAGS_OFFSET) as usize) }.unwrap_or(CLONE_THREAD);
    if flags & CLONE_THREAD != 0 {
        return 0;
    }
    // SAFETY: as above.
    let Ok(pid) = (unsafe { ctx.read_at::<u32>(config(&NEWTASK_PID_OFFSET) as usize) }) else {
        return 0;
    };
    let _ = TGIDS.insert(pid, 1, 0);
    let comm = bpf_get_current_comm().unwrap_or([0; 16]);
    let _ = PROC_COMM.insert(pid, comm, 0);
    0
}

/// A traced process executes a new program: its new name.
#[raw_tracepoint(tracepoint = "sched_process_exec")]
pub fn proc_exec(_ctx: RawTracePointContext) -> i32 {
    if config(&WORKLOAD) == WL_OFF {
        return 0;
    }
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if traced(tgid) {
        let comm = bpf_get_current_comm().unwrap_or([0; 16]);
        let _ = PROC_COMM.insert(tgid, comm, 0);
    }
    0
}

/// A traced process ends (its main thread exits): it leaves `TGIDS`, so a long-running CMD that
/// starts many short processes never fills the map. Its counts and name stay for the report.
#[raw_tracepoint(tracepoint = "sched_process_exit")]
pub fn proc_exit(_ctx: RawTracePointContext) -> i32 {
    if config(&WORKLOAD) != WL_TREE {
        return 0;
    }
    let pid_tgid = bpf_get_current_pid_tgid();
    let (tgid, tid) = ((pid_tgid >> 32) as u32, pid_tgid as u32);
    if tgid == tid {
        let _ = TGIDS.remove(tgid);
    }
    0
}

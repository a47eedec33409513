//! The `rdma_cm connect` row: rdma_cm connection set-up, from the rdma_cma tracepoints of the
//! rdma_cm module (raw tracepoints: the arguments are the kernel's pointers).
//!
//! - `cm_send_req(id_priv)`: the active side sent its REQ (`rdma_connect`): its set-up starts;
//! - `cm_event_handler(id_priv, event)`: the CM hands an event to its consumer (ucma for
//!   user space, nvme-rdma, rpcrdma, ...): counted by type in `CM_EVENTS`. A CONNECT_REQUEST
//!   starts the passive side's new id; ESTABLISHED ends either side's set-up (the row's
//!   histogram, and its `events`), and so does CONNECT_RESPONSE, the REP that an active side
//!   whose QP user space owns gets instead (librdmacm sends the RTU and makes ESTABLISHED
//!   itself); a failure drops the start;
//! - `cm_event_done(id_priv, event, ret)`: the consumer's handler returned.
//! - `cm_id_destroy(id_priv)`: the id is gone, and its start with it.
//!
//! A listener bound to a wildcard address gets each CONNECT_REQUEST through a per-device
//! listener, whose handler (`cma_listen_handler`) traces the same event again, for the
//! wildcard id, from inside the first trace's handler. `CM_INFLIGHT` holds the event each
//! thread is handling, so that the inner trace is not counted twice (nor started for the
//! listener, which never gets ESTABLISHED).
//!
//! Nothing runs per completion: these fire a few times per connection.

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_probe_read_kernel},
    macros::{map, raw_tracepoint},
    maps::{Array, HashMap, LruHashMap},
    programs::RawTracePointContext,
};
use rdma_trace_common::{
    C_EVENTS,
    cma::{
        CM_CONNECT_REQUEST, CM_CONNECT_RESPONSE, CM_COUNTERS, CM_ESTABLISHED, CM_EVENT_KINDS,
        CM_NONZERO_STATUS, CM_START_LOST, cm_event_fails,
    },
};

use crate::{CM_CONNECT_PROBE, add_one, config, count_in, now, record_in, row};
use rdma_trace_common::{C_UNMATCHED, NO_PROBE};

/// Set-up start time per `struct rdma_id_private *`.
#[map]
static CM_START: HashMap<u64, u64> = HashMap::with_max_entries(1024, 0);
/// The `struct rdma_cm_event *` each thread (by thread id) is handing to a consumer, from
/// cm_event_handler to cm_event_done.
#[map]
static CM_INFLIGHT: LruHashMap<u32, u64> = LruHashMap::with_max_entries(1024, 0);
/// Events by type (`rdma_trace_common::cma`), then the non-zero statuses and lost starts.
#[map]
static CM_EVENTS: Array<u64> = Array::with_max_entries(CM_COUNTERS, 0);

#[inline(always)]
fn bump(i: u32) {
    if let Some(p) = CM_EVENTS.get_ptr_mut(i) {
        add_one(p);
    }
}

#[inline(always)]
fn start(id: u64) {
    // BPF_ANY: a REQ sent again (a retry on the same id) restarts it.
    if CM_START.insert(id, now(), 0).is_err() {
        bump(CM_START_LOST);
    }
}

#[raw_tracepoint(tracepoint = "cm_send_req")]
pub fn cm_send_req(ctx: RawTracePointContext) -> i32 {
    if config(&CM_CONNECT_PROBE) != NO_PROBE {
        start(ctx.arg(0));
    }
    0
}

#[raw_tracepoint(tracepoint = "cm_event_handler")]
pub fn cm_event_handler(ctx: RawTracePointContext) -> i32 {
    let probe = config(&CM_CONNECT_PROBE);
    if probe == NO_PROBE {
        return 0;
    }
    let id: u64 = ctx.arg(0);
    let event: u64 = ctx.arg(1);
    let tid = bpf_get_current_pid_tgid() as u32;
    // SAFETY: the value is copied out at once.
    if unsafe { CM_INFLIGHT.get(tid) }.copied() == Some(event) {
        // The same event again, traced for a wildcard listener by its per-device listener.
        return 0;
    }
    let _ = CM_INFLIGHT.insert(tid, event, 0);
    // struct rdma_cm_event { enum rdma_cm_event_type event; int status; ... }.
    // SAFETY: bpf_probe_read_kernel checks the address; a fault gives an error, not a crash.
    let kind = unsafe { bpf_probe_read_kernel(event as *const u32) }.unwrap_or(u32::MAX);
    // SAFETY: as above.
    let status = unsafe { bpf_probe_read_kernel((event + 4) as *const i32) }.unwrap_or(0);
    bump(kind.min(CM_EVENT_KINDS - 1));
    if status != 0 {
        bump(CM_NONZERO_STATUS);
    }
    if kind == CM_CONNECT_REQUEST {
        start(id);
    } else if kind == CM_ESTABLISHED || kind == CM_CONNECT_RESPONSE {
        if let Some(r) = row(probe) {
            count_in(probe, r, C_EVENTS);
            // SAFETY: the value is copied out before the entry is removed.
            match unsafe { CM_START.get(id) }.copied() {
                Some(t0) => {
                    let _ = CM_START.remove(id);
                    record_in(r, now().saturating_sub(t0));
                }
                None => count_in(probe, r, C_UNMATCHED),
            }
        }
    } else if cm_event_fails(kind) {
        let _ = CM_START.remove(id);
    }
    0
}

#[raw_tracepoint(tracepoint = "cm_event_done")]
pub fn cm_event_done(_ctx: RawTracePointContext) -> i32 {
    if config(&CM_CONNECT_PROBE) != NO_PROBE {
        let _ = CM_INFLIGHT.remove(bpf_get_current_pid_tgid() as u32);
    }
    0
}

#[raw_tracepoint(tracepoint = "cm_id_destroy")]
pub fn cm_id_destroy(ctx: RawTracePointContext) -> i32 {
    if config(&CM_CONNECT_PROBE) != NO_PROBE {
        let id: u64 = ctx.arg(0);
        let _ = CM_START.remove(id);
    }
    0
}

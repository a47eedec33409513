//! rdma_cm connection set-up (the `rdma_cm connect` row): the rdma_cma tracepoints of the
//! rdma_cm module. `CM_EVENTS` counts every event the CM delivered to its consumers by
//! `enum rdma_cm_event_type` (include/rdma/rdma_cm.h, the same numbers since 2.6); the row's
//! histogram times each connection from its start (the active side's REQ sent, the passive
//! side's CONNECT_REQUEST) to its end: ESTABLISHED, or CONNECT_RESPONSE on an active side whose
//! QP user space owns.

/// `RDMA_CM_EVENT_CONNECT_REQUEST`: a passive side's new connection starts here.
pub const CM_CONNECT_REQUEST: u32 = 4;
/// `RDMA_CM_EVENT_CONNECT_RESPONSE`: the active side's REP arrived for a QP that user space
/// owns (ucma): librdmacm then moves the QP and sends the RTU itself, and the kernel never
/// delivers ESTABLISHED to that side. Its set-up ends here.
pub const CM_CONNECT_RESPONSE: u32 = 5;
/// `RDMA_CM_EVENT_ESTABLISHED`: a connection's set-up ends here (the passive side, and an
/// active side with a kernel QP).
pub const CM_ESTABLISHED: u32 = 9;

/// The event types' names, by number (`RDMA_CM_EVENT_` left out).
pub const CM_EVENT_NAMES: [&str; 16] = [
    "ADDR_RESOLVED",
    "ADDR_ERROR",
    "ROUTE_RESOLVED",
    "ROUTE_ERROR",
    "CONNECT_REQUEST",
    "CONNECT_RESPONSE",
    "CONNECT_ERROR",
    "UNREACHABLE",
    "REJECTED",
    "ESTABLISHED",
    "DISCONNECTED",
    "DEVICE_REMOVAL",
    "MULTICAST_JOIN",
    "MULTICAST_ERROR",
    "ADDR_CHANGE",
    "TIMEWAIT_EXIT",
];

/// Entries of `CM_EVENTS`: one per event type, the last for numbers past them (a newer kernel).
pub const CM_EVENT_KINDS: u32 = CM_EVENT_NAMES.len() as u32 + 1;

/// Whether event `e` ends a connection attempt without ESTABLISHED (its start is dropped).
pub const fn cm_event_fails(e: u32) -> bool {
    matches!(e, 1 | 3 | 6 | 7 | 8 | 11)
}

/// `CM_EVENTS`' last entries: events whose status was non-zero, and connection starts the
/// start map had no room for.
pub const CM_NONZERO_STATUS: u32 = CM_EVENT_KINDS;
pub const CM_START_LOST: u32 = CM_EVENT_KINDS + 1;
/// Entries of the `CM_EVENTS` array.
pub const CM_COUNTERS: u32 = CM_EVENT_KINDS + 2;

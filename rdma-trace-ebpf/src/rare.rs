//! Rare events, reported to the loader through aya-log (`rdma-trace -v`, or `RUST_LOG`): an end
//! without its start, an entry slot that is still busy, a full sample ring. Only those paths
//! call these; the per-event path never logs. The loader patches the level (`AYA_LOG_LEVEL`)
//! before load: at 0 (no `-v`) a call costs a load and a branch, and the loader rate-limits what
//! does come through. Messages about a kernel-function slot start with `kslot N:`, which the
//! loader replaces by the function's name.

use aya_log_ebpf::warn;

/// A kernel function returned on a CPU whose slot holds no entry time: the call slept and
/// migrated, or entered before the probes were attached.
#[inline(always)]
pub fn unmatched_return(slot: u32) {
    warn!(
        (),
        "kslot {}: a return without its entry on this CPU (the call slept or migrated); counted as unmatched",
        slot
    );
}

/// A kernel function entered while its slot on this CPU still held another call's entry time
/// (a nested, or sleeping, call): the older start is overwritten.
#[inline(always)]
pub fn busy_slot(slot: u32) {
    warn!(
        (),
        "kslot {}: entered while this CPU's slot still held another call's start (nested or sleeping call); the older start is dropped",
        slot
    );
}

/// An interval's end came without its start.
#[inline(always)]
pub fn unmatched_interval_end(interval: u32) {
    warn!(
        (),
        "interval {}: an end without its start; counted as unmatched", interval
    );
}

/// A sample ring had no room: the event is dropped (and counted by the caller).
#[inline(always)]
pub fn ring_full(ring: u32) {
    warn!(
        (),
        "sample ring {} is full: an event was dropped (user space reads too slowly)", ring
    );
}

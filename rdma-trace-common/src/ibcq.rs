//! The ib_cq API of the kernel's own RDMA consumers, per CQ: what the `ib_cq wakeup` row's
//! programs count for each `struct ib_cq` (the key of the `IBCQ` map is its address), with the
//! labels read from the CQ when the map first sees it.

/// Counter: wake-ups (cq_process).
pub const IBCQ_WAKEUPS: usize = 0;
/// Counter: wake-ups without a schedule seen before them (the workqueue's re-queue, direct
/// polling, or a schedule before the window).
pub const IBCQ_UNMATCHED: usize = 1;
/// Counter: the matched wake-ups' delays summed (ns).
pub const IBCQ_DELAY_NS: usize = 2;
/// Counter: polls (cq_poll).
pub const IBCQ_POLLS: usize = 3;
/// Counter: completions the polls returned (cq_poll's rc, when positive).
pub const IBCQ_COMPLETIONS: usize = 4;
pub const IBCQ_COUNTERS: usize = 5;

/// Bytes of the device name kept (`ib_device.name` is longer; rxe0, mlx5_0 fit).
pub const IBCQ_DEVICE_NAME: usize = 16;

/// One kernel CQ.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IbCqStat {
    /// The CQ's restrack id (`rdma res show cq`'s cqn), per device.
    pub id: u32,
    /// `enum ib_poll_context`: 0 softirq, 1 workqueue, 2 unbound workqueue, 3 direct.
    pub poll_ctx: u32,
    pub comp_vector: u32,
    /// 1 when the labels were read.
    pub labelled: u32,
    /// The device's name, NUL-padded (truncated at [`IBCQ_DEVICE_NAME`] bytes).
    pub device: [u8; IBCQ_DEVICE_NAME],
    /// The module that allocated the CQ (its restrack `kern_name`, what `rdma res show cq`
    /// prints as `comm [rpcrdma]`; `ib_core` for the shared CQ pools), NUL-padded; empty when
    /// unknown.
    pub owner: [u8; IBCQ_DEVICE_NAME],
    pub counters: [u64; IBCQ_COUNTERS],
    /// The `done` callback of the first completion a poll of the CQ returned (a kernel text
    /// address: the consumer's function, which names the consumer of a pooled CQ); 0 when
    /// none was read (direct polling, no BTF offsets).
    pub done: u64,
}

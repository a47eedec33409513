//! `rdma-trace cq`: the event each CQ-path kprobe pushes into the `CQ_EVENTS` ring buffer.

/// Kernel functions `rdma-trace cq` traces, by index: program `cq_N` is attached to entry N.
/// ib_uverbs delivers events; rxe posts and polls completions and arms CQs; mlx5's EQ interrupt,
/// completion callback, polling and arming.
pub const CQ_FUNCTIONS: [&str; 8] = [
    "ib_uverbs_comp_handler",
    "rxe_cq_post",
    "rxe_poll_cq",
    "rxe_req_notify_cq",
    "mlx5_eq_comp_int",
    "mlx5_ib_cq_comp",
    "mlx5_ib_poll_cq",
    "mlx5_ib_arm_cq",
];

/// Kernel stack depth the `CQ_STACKS` map keeps (the kernel's PERF_MAX_STACK_DEPTH).
pub const CQ_STACK_DEPTH: usize = 127;

/// One call of a CQ-path function.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CqEvent {
    /// bpf_ktime_get_ns (CLOCK_MONOTONIC).
    pub ts_ns: u64,
    /// tgid << 32 | tid.
    pub pid_tgid: u64,
    /// Key into `CQ_STACKS`, or negative when the stack could not be taken.
    pub stack_id: i64,
    /// Index into [`CQ_FUNCTIONS`].
    pub function: u32,
    pub cpu: u32,
    /// The task's comm, NUL-padded.
    pub comm: [u8; 16],
}

#[cfg(feature = "user")]
mod user {
    // SAFETY: CqEvent is repr(C), Copy, made of integers and a byte array with no padding
    // (8 + 8 + 8 + 4 + 4 + 16 bytes): any bit pattern is valid.
    unsafe impl aya::Pod for super::CqEvent {}
}

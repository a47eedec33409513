//! The two system calls the user-space stamps need (see `crate::stamps`): CLOCK_MONOTONIC, the
//! clock of `bpf_ktime_get_ns`, and the calling thread's id.

/// CLOCK_MONOTONIC now, in nanoseconds: the clock a tracer's `bpf_ktime_get_ns` reads, so the
/// two compare directly. A vDSO call, no system call.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists on Linux.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    debug_assert_eq!(rc, 0, "clock_gettime(CLOCK_MONOTONIC)");
    u64::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(ts.tv_nsec).unwrap_or(0)
}

/// The calling thread's id (gettid(2)), as the kernel and its tracers name the thread.
pub fn thread_id() -> u32 {
    // SAFETY: gettid has no preconditions and cannot fail.
    let tid = unsafe { libc::gettid() };
    u32::try_from(tid).unwrap_or(0)
}

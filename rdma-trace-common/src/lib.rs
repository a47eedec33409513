//! Layout shared by the eBPF programs (`rdma-trace-ebpf`) and the loader (`rdma-trace`).
//!
//! Every map is a per-CPU array of `u64` indexed by the helpers below, so both sides agree on
//! one index formula and the loader only sums the per-CPU values.
#![no_std]

/// log2 histogram slots: slot `i` holds durations in `[2^i, 2^(i+1))` nanoseconds
/// (slot 0 also holds 0 ns).
pub const SLOTS: u32 = 64;

/// Softirq vectors in Linux (`HI_SOFTIRQ` .. `RCU_SOFTIRQ`).
pub const NR_SOFTIRQS: u32 = 10;

/// Names of the softirq vectors, in kernel order (as in `/proc/softirqs`).
pub const SOFTIRQ_NAMES: [&str; NR_SOFTIRQS as usize] = [
    "HI", "TIMER", "NET_TX", "NET_RX", "BLOCK", "IRQ_POLL", "TASKLET", "SCHED", "HRTIMER", "RCU",
];

/// Kernel functions that can be timed at once (entry → return), one kprobe pair per slot.
pub const FUNC_SLOTS: u32 = 8;

/// Per-function counters (index with [`func_counter`]).
pub const FC_ENTRY: u32 = 0;
/// Returns seen.
pub const FC_RETURN: u32 = 1;
/// Returns without a recorded entry (the entry was missed or attached mid-call).
pub const FC_RETURN_NO_ENTRY: u32 = 2;
/// Counters per function slot.
pub const NR_FC: u32 = 3;

/// Index of histogram slot `slot` of softirq vector `vec` in `SOFTIRQ_HIST`.
#[inline(always)]
pub const fn softirq_hist_index(vec: u32, slot: u32) -> u32 {
    vec * SLOTS + slot
}

/// Index of histogram slot `slot` of function slot `func` in `FUNC_HIST`.
#[inline(always)]
pub const fn func_hist_index(func: u32, slot: u32) -> u32 {
    func * SLOTS + slot
}

/// Index of counter `counter` (`FC_*`) of function slot `func` in `FUNC_COUNTS`.
#[inline(always)]
pub const fn func_counter(func: u32, counter: u32) -> u32 {
    func * NR_FC + counter
}

/// floor(log2(v)), with log2(0) = 0, clamped to the last slot. Written without
/// count-leading-zeros because BPF has no such instruction.
#[inline(always)]
pub fn log2_slot(mut v: u64) -> u32 {
    let mut r: u32 = ((v > 0xFFFF_FFFF) as u32) << 5;
    v >>= r;
    let mut shift = ((v > 0xFFFF) as u32) << 4;
    v >>= shift;
    r |= shift;
    shift = ((v > 0xFF) as u32) << 3;
    v >>= shift;
    r |= shift;
    shift = ((v > 0xF) as u32) << 2;
    v >>= shift;
    r |= shift;
    shift = ((v > 0x3) as u32) << 1;
    v >>= shift;
    r |= shift;
    let r = r | ((v >> 1) as u32);
    if r >= SLOTS { SLOTS - 1 } else { r }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log2_slot_matches_leading_zeros() {
        assert_eq!(log2_slot(0), 0);
        let mut samples = [0u64; 200];
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for s in samples.iter_mut() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *s = x >> (x % 64);
        }
        for v in samples
            .into_iter()
            .chain((1..=4096).map(|v| v as u64))
            .chain([u64::MAX])
        {
            if v == 0 {
                continue;
            }
            assert_eq!(log2_slot(v), 63 - v.leading_zeros(), "v = {v}");
        }
    }

    #[test]
    fn powers_of_two_start_their_slot() {
        for i in 0..64 {
            assert_eq!(log2_slot(1u64 << i), i);
            if i > 0 {
                assert_eq!(log2_slot((1u64 << i) - 1), i - 1);
            }
        }
    }

    #[test]
    fn indexes_do_not_overlap() {
        assert_eq!(softirq_hist_index(1, 0), SLOTS);
        assert_eq!(
            func_hist_index(FUNC_SLOTS - 1, SLOTS - 1),
            FUNC_SLOTS * SLOTS - 1
        );
        assert_eq!(func_counter(1, FC_ENTRY), NR_FC);
        assert_eq!(
            func_counter(FUNC_SLOTS - 1, FC_RETURN_NO_ENTRY),
            FUNC_SLOTS * NR_FC - 1
        );
    }
}

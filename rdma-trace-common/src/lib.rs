//! Layout shared by the eBPF programs (`rdma-trace-ebpf`) and the loader (`rdma-trace`).
//!
//! The loader numbers the probes it attaches (`0..MAX_PROBES`). Every probe owns one
//! [`ProbeRow`] (counters and histogram slots) in the per-CPU array `ROWS`; the loader sums the
//! CPUs. What each attached program feeds is decided at load time
//! through read-only globals (`KSLOTS`, `SOFTIRQ_PROBE`, ...), so the programs stay generic.
#![no_std]

pub mod cma;
pub mod cq;
pub mod ibcq;
pub mod nvme;

pub mod syscalls;

pub mod waterfall;

pub mod workload;

/// Probes one run can attach.
pub const MAX_PROBES: u32 = 48;

/// Kernel-function program pairs (`kentry_N` / `kreturn_N`): one per traced kernel function.
pub const MAX_KSLOTS: u32 = 16;

/// Intervals (point A in one function → point B in another) one run can measure.
pub const MAX_INTERVALS: u32 = 4;

/// "No probe here" in the configuration globals.
pub const NO_PROBE: u32 = u32::MAX;

/// Softirq vectors in Linux (`HI_SOFTIRQ` .. `RCU_SOFTIRQ`).
pub const NR_SOFTIRQS: u32 = 10;

/// Names of the softirq vectors, in kernel order (as in `/proc/softirqs`).
pub const SOFTIRQ_NAMES: [&str; NR_SOFTIRQS as usize] = [
    "HI", "TIMER", "NET_TX", "NET_RX", "BLOCK", "IRQ_POLL", "TASKLET", "SCHED", "HRTIMER", "RCU",
];

/// Hard IRQ numbers whose handlers can be timed at once.
pub const MAX_IRQS: u32 = 16;

/// Sub-buckets per power of two in the histograms.
pub const SUB_BUCKETS: u32 = 4;
/// Histogram slots per probe: 64 powers of two × [`SUB_BUCKETS`].
pub const HIST_SLOTS: u32 = 64 * SUB_BUCKETS;

/// Counter: events seen (calls, entries, softirq runs, interval starts).
pub const C_EVENTS: u32 = 0;
/// Counter: values recorded in the histogram.
pub const C_RECORDED: u32 = 1;
/// Counter: ends without a start (attached mid-call, lost entry, map full).
pub const C_UNMATCHED: u32 = 2;
/// Counters per probe.
pub const NR_COUNTERS: u32 = 3;

/// What a kernel-function program pair feeds (one entry of the `KSLOTS` global).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KSlot {
    /// Probe timing entry → return of this function, or [`NO_PROBE`].
    pub duration: u32,
    /// Interval (index into `INTERVALS`) that entry of this function starts, or [`NO_PROBE`].
    pub starts: u32,
    /// Interval that the return of this function ends, or [`NO_PROBE`].
    pub ends: u32,
    /// Unused; keeps the struct free of padding.
    pub _pad: u32,
}

impl KSlot {
    pub const UNUSED: KSlot = KSlot {
        duration: NO_PROBE,
        starts: NO_PROBE,
        ends: NO_PROBE,
        _pad: 0,
    };
}

/// Interval `i`'s probe (entry `i` of the `INTERVAL_PROBE` global).
pub type IntervalProbes = [u32; MAX_INTERVALS as usize];

/// Everything one probe records on one CPU: one value of the per-CPU array `ROWS`, so the
/// loader reads a probe with a single lookup.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProbeRow {
    /// C_EVENTS, C_RECORDED, C_UNMATCHED. The programs leave C_RECORDED at 0: it is the sum of
    /// the slots, which the loader computes (one atomic add fewer per recorded value).
    pub counters: [u64; NR_COUNTERS as usize],
    /// Start time of the running call, softirq or IRQ handler this row times, on this CPU (0:
    /// none). Kept in the row, not in a map of its own, so that an entry or a return looks up
    /// one map value.
    pub start: u64,
    /// Histogram slots (see [`hist_slot`]).
    pub slots: [u64; HIST_SLOTS as usize],
}

/// floor(log2(v)) for v > 0 (0 for 0), without count-leading-zeros: BPF has no such instruction.
#[inline(always)]
pub fn log2(mut v: u64) -> u32 {
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
    r | ((v >> 1) as u32)
}

/// Histogram slot of `v`: values below 4 have a slot each (0..=3); from 4 on, power of two `p`
/// is split into [`SUB_BUCKETS`] equal parts at slots `4p .. 4p + 3`. A slot's width is at most
/// 25 % of its lower bound.
#[inline(always)]
pub fn hist_slot(v: u64) -> u32 {
    if v < 4 {
        return v as u32;
    }
    let p = log2(v);
    let sub = ((v >> (p - 2)) & 3) as u32;
    let slot = p * SUB_BUCKETS + sub;
    if slot >= HIST_SLOTS {
        HIST_SLOTS - 1
    } else {
        slot
    }
}

/// `[lo, hi)` of histogram slot `slot` (`hi` saturates at `u64::MAX`); slots 4..=7 are never used.
pub const fn slot_bounds(slot: u32) -> (u64, u64) {
    if slot < 4 {
        return (slot as u64, slot as u64 + 1);
    }
    let p = slot / SUB_BUCKETS;
    let sub = (slot % SUB_BUCKETS) as u64;
    if p < 2 {
        return (0, 0);
    }
    let unit = 1u64 << (p - 2);
    let lo = (4 + sub) * unit;
    let hi = match (5 + sub).checked_mul(unit) {
        Some(h) => h,
        None => u64::MAX,
    };
    (lo, hi)
}

#[cfg(feature = "user")]
mod user {
    // SAFETY: KSlot is repr(C), Copy, made of u32s with no padding: any bit pattern is valid.
    unsafe impl aya::Pod for super::KSlot {}
    // SAFETY: ProbeRow is repr(C), Copy, made of u64 arrays with no padding.
    unsafe impl aya::Pod for super::ProbeRow {}
    // SAFETY: IbCqStat is repr(C), Copy, u32s then bytes then u64s, 8-byte aligned with no
    // padding (16 + 16 + 40 bytes): any bit pattern is valid.
    unsafe impl aya::Pod for super::ibcq::IbCqStat {}
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples() -> impl Iterator<Item = u64> {
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        (0..500)
            .map(move |_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x >> (x % 64)
            })
            .chain(0..=5000)
            .chain([u64::MAX, u64::MAX - 1, 1 << 63])
    }

    #[test]
    fn log2_matches_leading_zeros() {
        assert_eq!(log2(0), 0);
        for v in samples().filter(|&v| v > 0) {
            assert_eq!(log2(v), 63 - v.leading_zeros(), "v = {v}");
        }
    }

    #[test]
    fn every_value_falls_inside_its_slot() {
        for v in samples() {
            let s = hist_slot(v);
            assert!(s < HIST_SLOTS);
            assert!(!(4..8).contains(&s), "slots 4..8 are unused, v = {v}");
            let (lo, hi) = slot_bounds(s);
            assert!(
                lo <= v && (v < hi || hi == u64::MAX),
                "v = {v} slot {s} [{lo}, {hi})"
            );
        }
    }

    #[test]
    fn slots_are_at_most_a_quarter_wide_and_contiguous() {
        let mut prev_hi = 4;
        for s in 8..HIST_SLOTS {
            let (lo, hi) = slot_bounds(s);
            assert_eq!(lo, prev_hi, "slot {s} starts where slot {} ended", s - 1);
            if hi != u64::MAX {
                assert!((hi - lo) * 4 <= lo, "slot {s} [{lo}, {hi}) wider than 25 %");
            }
            prev_hi = hi;
        }
        assert_eq!(slot_bounds(3), (3, 4));
    }

    #[test]
    fn a_probe_row_fits_a_per_cpu_map_value() {
        // The kernel caps a per-CPU value at 32 KiB.
        assert!(core::mem::size_of::<ProbeRow>() <= 32 * 1024);
        // Counters, the start time and the slots, without padding.
        assert_eq!(
            core::mem::size_of::<ProbeRow>(),
            8 * (NR_COUNTERS + 1 + HIST_SLOTS) as usize
        );
    }
}

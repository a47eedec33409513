//! Histograms as the eBPF side builds them (log-linear slots, see `rdma_trace_common::hist_slot`)
//! and what reports read off them: counts, percentiles, bpftrace-style log2 rows.

use rdma_trace_common::{HIST_SLOTS, slot_bounds};
use serde::Serialize;

/// A histogram of `HIST_SLOTS` log-linear slots (4 per power of two).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Histogram {
    slots: Vec<u64>,
}

impl Default for Histogram {
    fn default() -> Self {
        Self {
            slots: vec![0; HIST_SLOTS as usize],
        }
    }
}

/// One row of a report: values in `[lo, hi)`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Bucket {
    pub lo: u64,
    pub hi: u64,
    pub count: u64,
}

/// Summary figures; values in the histogram's unit.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Summary {
    pub count: u64,
    pub p50: Option<f64>,
    pub p90: Option<f64>,
    pub p99: Option<f64>,
    /// Upper bound of the highest non-empty slot.
    pub max: Option<u64>,
}

impl Histogram {
    /// From the slot counts read off the map (missing slots count 0, extra ones are ignored).
    pub fn from_slots(mut slots: Vec<u64>) -> Self {
        slots.resize(HIST_SLOTS as usize, 0);
        Self { slots }
    }

    /// The histogram of `values`, as the eBPF side would fill it (for tests).
    #[cfg(test)]
    pub fn of_values(values: &[u64]) -> Self {
        let mut slots = vec![0; HIST_SLOTS as usize];
        for &v in values {
            slots[rdma_trace_common::hist_slot(v) as usize] += 1;
        }
        Self { slots }
    }

    /// Counts per slot (`HIST_SLOTS` of them; see `rdma_trace_common::slot_bounds`).
    pub fn slots(&self) -> &[u64] {
        &self.slots
    }

    pub fn count(&self) -> u64 {
        self.slots.iter().sum()
    }

    /// Quantile `q` (0 < q ≤ 1), interpolated linearly inside the slot that holds it; within
    /// a slot's width (≤ 25 %) of the exact value.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        let total = self.count();
        if total == 0 {
            return None;
        }
        let rank = (q.clamp(0.0, 1.0) * total as f64).max(1.0);
        let mut before = 0.0;
        for (i, &c) in self.slots.iter().enumerate() {
            if c == 0 {
                continue;
            }
            let after = before + c as f64;
            if after >= rank {
                let (lo, hi) = slot_bounds(i as u32);
                let frac = (rank - before) / c as f64;
                return Some(lo as f64 + (hi.saturating_sub(lo)) as f64 * frac);
            }
            before = after;
        }
        None
    }

    pub fn max(&self) -> Option<u64> {
        let i = self.slots.iter().rposition(|&c| c != 0)?;
        Some(slot_bounds(i as u32).1)
    }

    /// The sum of the recorded values, estimated from the slot midpoints (each slot's values
    /// lie within 12.5 % of its midpoint; the open last slot counts at its lower bound).
    pub fn sum_estimate(&self) -> f64 {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, c)| **c != 0)
            .map(|(i, &c)| {
                let (lo, hi) = slot_bounds(i as u32);
                let mid = if hi == u64::MAX {
                    lo as f64
                } else {
                    (lo as f64 + hi as f64) / 2.0
                };
                mid * c as f64
            })
            .sum()
    }

    pub fn summary(&self) -> Summary {
        Summary {
            count: self.count(),
            p50: self.quantile(0.50),
            p90: self.quantile(0.90),
            p99: self.quantile(0.99),
            max: self.max(),
        }
    }

    /// The slots merged into power-of-two rows `[2^k, 2^(k+1))` (and `[0, 1)`), from the first
    /// to the last non-empty row: what bpftrace's `hist()` prints.
    pub fn log2_rows(&self) -> Vec<Bucket> {
        let mut rows: Vec<Bucket> = Vec::new();
        for (i, &c) in self.slots.iter().enumerate() {
            let (lo, _) = slot_bounds(i as u32);
            if (4..8).contains(&i) {
                continue; // never used
            }
            let (rlo, rhi) = if lo == 0 { (0, 1) } else { pow2_row(lo) };
            match rows.last_mut() {
                Some(last) if last.lo == rlo => last.count += c,
                _ => rows.push(Bucket {
                    lo: rlo,
                    hi: rhi,
                    count: c,
                }),
            }
        }
        let first = rows.iter().position(|r| r.count != 0);
        let last = rows.iter().rposition(|r| r.count != 0);
        match (first, last) {
            (Some(f), Some(l)) => rows[f..=l].to_vec(),
            _ => Vec::new(),
        }
    }

    /// Both histograms' counts together.
    pub fn add(&self, other: &Histogram) -> Histogram {
        Histogram {
            slots: self
                .slots
                .iter()
                .zip(&other.slots)
                .map(|(a, b)| a + b)
                .collect(),
        }
    }

    /// The counts added since `earlier` (a snapshot of the same probe).
    pub fn subtract(&self, earlier: &Histogram) -> Histogram {
        Histogram {
            slots: self
                .slots
                .iter()
                .zip(&earlier.slots)
                .map(|(a, b)| a.saturating_sub(*b))
                .collect(),
        }
    }
}

/// bpftrace-style rows for `rows`, bars scaled to the largest row.
pub fn render_rows(rows: &[Bucket], width: usize, fmt: fn(u64) -> String) -> String {
    let max = rows.iter().map(|b| b.count).max().unwrap_or(0);
    let mut out = String::new();
    for b in rows {
        let bar = if max == 0 {
            0
        } else {
            (b.count as u128 * width as u128).div_ceil(max as u128) as usize
        };
        let range = format!("[{}, {})", fmt(b.lo), fmt(b.hi));
        out.push_str(&format!(
            "  {range:<22} {:>9} |{:<width$}|\n",
            b.count,
            "@".repeat(bar)
        ));
    }
    out
}

fn pow2_row(lo: u64) -> (u64, u64) {
    let k = 63 - lo.leading_zeros();
    let start = 1u64 << k;
    (start, start.saturating_mul(2))
}

/// `1.5us`, `512ns`, `2.1ms`, `3.0s`, `inf`.
pub fn human_ns(ns: u64) -> String {
    human_ns_f(ns as f64).replace(".0", "")
}

/// Bounds of power-of-two rows as bpftrace prints them: `[2us, 4us)` for [2048, 4096) ns
/// (K = 1024), not `[2us, 4.1us)`; other values as [`human_ns`].
pub fn pow2_label(ns: u64) -> String {
    if ns == u64::MAX || !ns.is_power_of_two() || ns < 1024 {
        return human_ns(ns);
    }
    let k = 63 - ns.leading_zeros();
    match k {
        10..=19 => format!("{}us", ns >> 10),
        20..=29 => format!("{}ms", ns >> 20),
        _ => format!("{}s", ns >> 30),
    }
}

/// Like [`human_ns`] for fractional values, one decimal.
pub fn human_ns_f(ns: f64) -> String {
    match ns {
        v if v >= u64::MAX as f64 => "inf".to_owned(),
        v if v < 1e3 => format!("{v:.0}ns"),
        v if v < 1e6 => format!("{:.1}us", v / 1e3),
        v if v < 1e9 => format!("{:.1}ms", v / 1e6),
        v => format!("{:.1}s", v / 1e9),
    }
}

/// Plain numbers (packets).
pub fn plain(v: u64) -> String {
    if v == u64::MAX {
        "inf".to_owned()
    } else {
        v.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from_values(values: impl IntoIterator<Item = u64>) -> Histogram {
        Histogram::of_values(&values.into_iter().collect::<Vec<_>>())
    }

    #[test]
    fn empty_histogram() {
        let h = Histogram::default();
        assert_eq!(h.summary(), Summary::default());
        assert!(h.log2_rows().is_empty());
        assert_eq!(render_rows(&h.log2_rows(), 10, human_ns), "");
    }

    #[test]
    fn percentiles_are_within_a_fifth_of_the_truth() {
        // 1..=100_000 ns uniformly: p50 = 50 000, p90 = 90 000, p99 = 99 000.
        let h = from_values(1..=100_000);
        assert_eq!(h.count(), 100_000);
        for (q, truth) in [(0.5, 50_000.0), (0.9, 90_000.0), (0.99, 99_000.0)] {
            let got = h.quantile(q).unwrap();
            assert!((got - truth).abs() / truth < 0.2, "q{q}: {got} vs {truth}");
        }
        assert!(h.max().unwrap() >= 100_000);
    }

    #[test]
    fn bimodal_values_keep_their_modes() {
        let h = from_values((0..900).map(|_| 3_000).chain((0..100).map(|_| 3_000_000)));
        let p50 = h.quantile(0.5).unwrap();
        assert!((2_400.0..=3_600.0).contains(&p50), "{p50}");
        let p99 = h.quantile(0.99).unwrap();
        assert!((2_400_000.0..=3_600_000.0).contains(&p99), "{p99}");
    }

    #[test]
    fn log2_rows_merge_sub_buckets_and_span_first_to_last() {
        let h = from_values([5, 6, 7, 1_000, 1_500, 2_000]);
        let rows = h.log2_rows();
        assert_eq!(
            rows.first().unwrap(),
            &Bucket {
                lo: 4,
                hi: 8,
                count: 3
            }
        );
        assert_eq!(
            rows.last().unwrap(),
            &Bucket {
                lo: 1024,
                hi: 2048,
                count: 2
            }
        );
        assert_eq!(rows.iter().map(|r| r.count).sum::<u64>(), 6);
        assert!(
            rows.windows(2).all(|w| w[0].hi == w[1].lo),
            "contiguous: {rows:?}"
        );
        let text = render_rows(&rows, 4, human_ns);
        assert!(
            text.lines().next().unwrap().contains("[4ns, 8ns)"),
            "{text}"
        );
        assert!(text.contains("|@@@@|"), "{text}");
    }

    #[test]
    fn subtract_gives_the_interval_counts() {
        let a = from_values([10, 20, 30]);
        let b = from_values([10, 20, 30, 40, 50]);
        assert_eq!(b.subtract(&a).count(), 2);
        assert_eq!(a.subtract(&b).count(), 0, "saturates");
    }

    #[test]
    fn power_of_two_labels_read_like_bpftrace() {
        assert_eq!(pow2_label(2048), "2us");
        assert_eq!(pow2_label(4096), "4us");
        assert_eq!(pow2_label(1 << 20), "1ms");
        assert_eq!(pow2_label(1 << 31), "2s");
        assert_eq!(pow2_label(512), "512ns");
        assert_eq!(pow2_label(3000), "3us");
        assert_eq!(pow2_label(u64::MAX), "inf");
        let rows = from_values([3_000, 5_000, 70_000]).log2_rows();
        let text = render_rows(&rows, 4, pow2_label);
        assert!(
            text.contains("[2us, 4us)") && text.contains("[64us, 128us)"),
            "{text}"
        );
    }

    #[test]
    fn human_units() {
        assert_eq!(human_ns(512), "512ns");
        assert_eq!(human_ns(2_000), "2us");
        assert_eq!(human_ns_f(2_500_000.0), "2.5ms");
        assert_eq!(human_ns(u64::MAX), "inf");
    }
}

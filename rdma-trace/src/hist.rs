//! Log2 latency histograms as the eBPF side builds them, and what we read off them.

use rdma_trace_common::SLOTS;
use serde::Serialize;

/// A log2 histogram of nanoseconds: bucket `i` counts values in `[2^i, 2^(i+1))`
/// (bucket 0 also counts 0).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Log2Hist {
    buckets: [u64; SLOTS as usize],
}

impl Default for Log2Hist {
    fn default() -> Self {
        Self {
            buckets: [0; SLOTS as usize],
        }
    }
}

/// One non-empty bucket, for reports.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Bucket {
    /// Inclusive lower bound, ns.
    pub lo_ns: u64,
    /// Exclusive upper bound, ns.
    pub hi_ns: u64,
    pub count: u64,
}

impl Log2Hist {
    pub fn from_buckets(buckets: [u64; SLOTS as usize]) -> Self {
        Self { buckets }
    }

    /// Bounds of bucket `i`: `[2^i, 2^(i+1))`, with bucket 0 starting at 0.
    pub fn bounds(i: usize) -> (u64, u64) {
        let lo = if i == 0 { 0 } else { 1u64 << i };
        let hi = if i + 1 >= 64 {
            u64::MAX
        } else {
            1u64 << (i + 1)
        };
        (lo, hi)
    }

    pub fn count(&self) -> u64 {
        self.buckets.iter().sum()
    }

    /// Upper bound (ns) of the bucket holding quantile `q` (0 < q ≤ 1): the value is below it.
    /// `None` when the histogram is empty.
    pub fn quantile_upper_ns(&self, q: f64) -> Option<u64> {
        let total = self.count();
        if total == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, &c) in self.buckets.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Some(Self::bounds(i).1);
            }
        }
        None
    }

    /// The non-empty range of buckets, for display and JSON.
    pub fn buckets(&self) -> Vec<Bucket> {
        let Some(first) = self.buckets.iter().position(|&c| c != 0) else {
            return Vec::new();
        };
        let last = self.buckets.iter().rposition(|&c| c != 0).unwrap_or(first);
        (first..=last)
            .map(|i| {
                let (lo_ns, hi_ns) = Self::bounds(i);
                Bucket {
                    lo_ns,
                    hi_ns,
                    count: self.buckets[i],
                }
            })
            .collect()
    }

    /// Text rendering in the style of bcc's `print_log2_hist`, in microseconds when
    /// the values are large enough.
    pub fn render(&self, width: usize) -> String {
        let rows = self.buckets();
        let max = rows.iter().map(|b| b.count).max().unwrap_or(0);
        let mut out = String::new();
        for b in rows {
            let bar = if max == 0 {
                0
            } else {
                (b.count as u128 * width as u128 / max as u128) as usize
            };
            out.push_str(&format!(
                "{:>12} -> {:<12} : {:<9} |{:<width$}|\n",
                human_ns(b.lo_ns),
                human_ns(b.hi_ns),
                b.count,
                "*".repeat(bar),
            ));
        }
        out
    }
}

/// `1.5us`, `512ns`, `2.1ms`, `3.0s`.
pub fn human_ns(ns: u64) -> String {
    match ns {
        u64::MAX => "inf".to_owned(),
        0..1_000 => format!("{ns}ns"),
        1_000..1_000_000 => format!("{:.1}us", ns as f64 / 1e3),
        1_000_000..1_000_000_000 => format!("{:.1}ms", ns as f64 / 1e6),
        _ => format!("{:.1}s", ns as f64 / 1e9),
    }
}

/// Summary of a histogram for JSON reports.
#[derive(Debug, Serialize)]
pub struct HistReport {
    pub count: u64,
    /// Upper bound of the bucket holding the median, ns.
    pub p50_upper_ns: Option<u64>,
    /// Upper bound of the bucket holding the 99th percentile, ns.
    pub p99_upper_ns: Option<u64>,
    pub buckets: Vec<Bucket>,
}

impl From<&Log2Hist> for HistReport {
    fn from(h: &Log2Hist) -> Self {
        Self {
            count: h.count(),
            p50_upper_ns: h.quantile_upper_ns(0.5),
            p99_upper_ns: h.quantile_upper_ns(0.99),
            buckets: h.buckets(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hist(pairs: &[(usize, u64)]) -> Log2Hist {
        let mut b = [0; SLOTS as usize];
        for &(i, c) in pairs {
            b[i] = c;
        }
        Log2Hist::from_buckets(b)
    }

    #[test]
    fn empty_histogram_has_no_quantiles_or_rows() {
        let h = Log2Hist::default();
        assert_eq!(h.count(), 0);
        assert_eq!(h.quantile_upper_ns(0.5), None);
        assert!(h.buckets().is_empty());
        assert_eq!(h.render(40), "");
    }

    #[test]
    fn quantiles_pick_the_bucket_holding_the_rank() {
        // 90 values in [1024, 2048), 9 in [4096, 8192), 1 in [2^20, 2^21).
        let h = hist(&[(10, 90), (12, 9), (20, 1)]);
        assert_eq!(h.count(), 100);
        assert_eq!(h.quantile_upper_ns(0.5), Some(2048));
        assert_eq!(h.quantile_upper_ns(0.90), Some(2048));
        assert_eq!(h.quantile_upper_ns(0.91), Some(8192));
        assert_eq!(h.quantile_upper_ns(0.99), Some(8192));
        assert_eq!(h.quantile_upper_ns(1.0), Some(1 << 21));
    }

    #[test]
    fn buckets_span_first_to_last_non_empty() {
        let h = hist(&[(3, 2), (5, 1)]);
        let rows = h.buckets();
        assert_eq!(rows.len(), 3);
        assert_eq!(
            rows[0],
            Bucket {
                lo_ns: 8,
                hi_ns: 16,
                count: 2
            }
        );
        assert_eq!(rows[1].count, 0);
        assert_eq!(
            rows[2],
            Bucket {
                lo_ns: 32,
                hi_ns: 64,
                count: 1
            }
        );
    }

    #[test]
    fn render_scales_bars_to_the_largest_bucket() {
        let text = hist(&[(10, 4), (11, 2)]).render(8);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2);
        assert!(lines[0].ends_with("|********|"), "{text}");
        assert!(lines[1].ends_with("|****    |"), "{text}");
        assert!(lines[0].contains("1.0us"), "{text}");
    }

    #[test]
    fn bucket_zero_and_last_bucket_bounds() {
        assert_eq!(Log2Hist::bounds(0), (0, 2));
        assert_eq!(Log2Hist::bounds(63), (1 << 63, u64::MAX));
        assert_eq!(human_ns(u64::MAX), "inf");
        assert_eq!(human_ns(2_500_000), "2.5ms");
    }
}

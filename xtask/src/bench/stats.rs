//! Confidence intervals and verdicts that noise cannot flip.
//!
//! Every ratio of the bench tables is a ratio of medians over rounds. Its 95 % confidence
//! interval is a percentile bootstrap over rounds: the rounds are resampled with replacement
//! (paired: a resampled round brings both of its figures, since both ran side by side in it and
//! share its drift), the ratio of medians is computed for each resample, and the 2.5th and
//! 97.5th percentiles of those ratios are the interval. A goal `≤ G` is then
//! - met when the whole interval is at or below G,
//! - MISSED when the whole interval is above G,
//! - undecided when the interval spans G: more rounds are needed to tell.
//!
//! The resampling is deterministic (a fixed-seed generator), so the same results give the same
//! page.

/// Bootstrap resamples per interval.
pub const RESAMPLES: usize = 4000;
/// Fewer paired figures than this give no interval (and so no verdict but "undecided").
pub const MIN_N: usize = 3;
const SEED: u64 = 0x5eed_0fb0_0007;

/// A point estimate with its 95 % confidence interval.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Estimate {
    pub value: f64,
    pub lo: f64,
    pub hi: f64,
    /// Figures (rounds) it comes from.
    pub n: usize,
}

/// splitmix64: small, fast, and good enough to draw resampling indices.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0; the modulo bias is negligible for n of a few dozen).
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// The finite ones of `values`, sorted.
pub fn sorted_finite(values: &[f64]) -> Vec<f64> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    v.sort_by(f64::total_cmp);
    v
}

/// The median of sorted values (the mean of the middle two for an even count); `None` when
/// empty.
pub fn median_of_sorted(sorted: &[f64]) -> Option<f64> {
    let n = sorted.len();
    if n == 0 {
        return None;
    }
    Some(if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
    })
}

/// The median of the finite ones of `values` (the mean of the middle two for an even count);
/// `None` when there are none.
pub fn median(values: &[f64]) -> Option<f64> {
    median_of_sorted(&sorted_finite(values))
}

/// The `q`-quantile (0..=1) of sorted values, linear between neighbours.
pub fn percentile(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let pos = q.clamp(0.0, 1.0) * (sorted.len() - 1) as f64;
    let (i, frac) = (pos.floor() as usize, pos.fract());
    let a = sorted[i];
    let b = sorted[(i + 1).min(sorted.len() - 1)];
    Some(a + (b - a) * frac)
}

/// 2.5th and 97.5th percentiles of bootstrap statistics (non-finite ones dropped).
fn interval(stats: &[f64]) -> Option<(f64, f64)> {
    let stats = sorted_finite(stats);
    Some((percentile(&stats, 0.025)?, percentile(&stats, 0.975)?))
}

/// `value` (the statistic of `sample`) with a bootstrap CI: `stat` over [`RESAMPLES`] resamples
/// of `sample` drawn with replacement. With fewer than [`MIN_N`] items the interval is
/// unbounded (−∞..∞).
fn bootstrap<T: Copy>(
    sample: &[T],
    value: f64,
    mut stat: impl FnMut(&[T]) -> f64,
) -> Option<Estimate> {
    let n = sample.len();
    if n < MIN_N {
        return Some(Estimate {
            value,
            lo: f64::NEG_INFINITY,
            hi: f64::INFINITY,
            n,
        });
    }
    let mut rng = Rng(SEED);
    let mut buf: Vec<T> = sample.to_vec();
    let stats: Vec<f64> = (0..RESAMPLES)
        .map(|_| {
            for x in &mut buf {
                *x = sample[rng.below(n)];
            }
            stat(&buf)
        })
        .collect();
    let (lo, hi) = interval(&stats)?;
    Some(Estimate { value, lo, hi, n })
}

/// The median of one figure over rounds, with a bootstrap CI. `None` without figures; with
/// fewer than [`MIN_N`] the interval is unbounded (−∞..∞).
pub fn median_ci(values: &[f64]) -> Option<Estimate> {
    let v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    let value = median(&v)?;
    bootstrap(&v, value, |b| median(b).unwrap_or(f64::NAN))
}

/// `median(a) / median(b)` over the rounds where both have a figure (`pairs`: one `(a, b)` per
/// round), with a paired bootstrap CI. `None` without a usable pair or when median(b) is 0.
pub fn ratio_ci(pairs: &[(f64, f64)]) -> Option<Estimate> {
    let p: Vec<(f64, f64)> = pairs
        .iter()
        .copied()
        .filter(|(a, b)| a.is_finite() && b.is_finite())
        .collect();
    let stat = |rows: &[(f64, f64)]| {
        let (a, b): (Vec<f64>, Vec<f64>) = rows.iter().copied().unzip();
        match (median(&a), median(&b)) {
            (Some(a), Some(b)) if b != 0.0 => a / b,
            _ => f64::NAN,
        }
    };
    let value = stat(&p);
    if !value.is_finite() {
        return None;
    }
    bootstrap(&p, value, stat)
}

/// Pairs of figures by round: rounds where both `a` and `b` have one.
pub fn paired(a: &[Option<f64>], b: &[Option<f64>]) -> Vec<(f64, f64)> {
    a.iter()
        .zip(b)
        .filter_map(|(a, b)| Some(((*a)?, (*b)?)))
        .collect()
}

/// The outcome of a goal `value ≤ goal`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Met,
    Missed,
    /// The interval spans the goal (or there are too few figures for one).
    Undecided,
    NoData,
}

pub fn judge(e: Option<Estimate>, goal: f64) -> Verdict {
    match e {
        None => Verdict::NoData,
        Some(e) if e.hi <= goal => Verdict::Met,
        Some(e) if e.lo > goal => Verdict::Missed,
        Some(_) => Verdict::Undecided,
    }
}

/// The goal column: `met (≤ G)`, `**MISSED** (goal ≤ G)`, `undecided (CI spans the goal ≤ G)`,
/// `undecided (n < 3, goal ≤ G)`, `no data`.
pub fn verdict_text(e: Option<Estimate>, goal: f64) -> String {
    match judge(e, goal) {
        Verdict::Met => format!("met (≤ {goal})"),
        Verdict::Missed => format!("**MISSED** (goal ≤ {goal})"),
        Verdict::Undecided if e.is_some_and(|e| e.n < MIN_N) => {
            format!("undecided (n < {MIN_N}, goal ≤ {goal})")
        }
        Verdict::Undecided => format!("undecided (CI spans the goal ≤ {goal})"),
        Verdict::NoData => "no data".into(),
    }
}

/// `1.234 [1.100–1.400]`, `-` without an estimate, `1.234 [n<3]` without an interval.
pub fn with_ci(e: Option<Estimate>, decimals: usize) -> String {
    match e {
        None => "-".into(),
        Some(e) if e.n < MIN_N => format!("{:.decimals$} [n={}]", e.value, e.n),
        Some(e) => format!(
            "{:.decimals$} [{:.decimals$}–{:.decimals$}]",
            e.value, e.lo, e.hi
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_and_percentiles() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(&[f64::NAN]), None);
        let s = [0.0, 10.0, 20.0, 30.0, 40.0];
        assert_eq!(percentile(&s, 0.0), Some(0.0));
        assert_eq!(percentile(&s, 1.0), Some(40.0));
        assert_eq!(percentile(&s, 0.5), Some(20.0));
        assert_eq!(percentile(&s, 0.125), Some(5.0));
        assert_eq!(percentile(&[], 0.5), None);
    }

    #[test]
    fn rng_is_deterministic_and_covers_the_range() {
        let mut a = Rng(1);
        let mut b = Rng(1);
        let xs: Vec<usize> = (0..1000).map(|_| a.below(5)).collect();
        let ys: Vec<usize> = (0..1000).map(|_| b.below(5)).collect();
        assert_eq!(xs, ys);
        for k in 0..5 {
            let c = xs.iter().filter(|&&x| x == k).count();
            assert!((150..250).contains(&c), "{k}: {c}");
        }
    }

    #[test]
    fn constant_figures_give_a_point_interval() {
        let e = ratio_ci(&[(2.0, 1.0); 6]).unwrap();
        assert_eq!((e.value, e.lo, e.hi, e.n), (2.0, 2.0, 2.0, 6));
        let m = median_ci(&[5.0; 4]).unwrap();
        assert_eq!((m.value, m.lo, m.hi), (5.0, 5.0, 5.0));
    }

    #[test]
    fn interval_holds_the_estimate_and_lies_within_the_data() {
        let pairs: Vec<(f64, f64)> = [
            (110.0, 100.0),
            (95.0, 100.0),
            (130.0, 98.0),
            (105.0, 102.0),
            (99.0, 101.0),
            (120.0, 97.0),
            (101.0, 100.0),
        ]
        .to_vec();
        let e = ratio_ci(&pairs).unwrap();
        assert!((e.value - 105.0 / 100.0).abs() < 1e-12, "{e:?}");
        assert!(e.lo <= e.value && e.value <= e.hi, "{e:?}");
        // Every resampled ratio is a ratio of two of the figures: bounded by the extremes.
        assert!(e.lo >= 95.0 / 102.0 && e.hi <= 130.0 / 97.0, "{e:?}");
        assert!(e.hi > e.lo, "noisy figures give a real interval");
        // Same input, same interval.
        assert_eq!(ratio_ci(&pairs), Some(e));
    }

    #[test]
    fn more_rounds_narrow_the_interval() {
        let noisy = |n: usize| -> Vec<(f64, f64)> {
            (0..n)
                .map(|i| (100.0 + ((i * 37) % 11) as f64 * 3.0, 100.0))
                .collect()
        };
        let few = ratio_ci(&noisy(5)).unwrap();
        let many = ratio_ci(&noisy(45)).unwrap();
        assert!(many.hi - many.lo < few.hi - few.lo, "{few:?} vs {many:?}");
    }

    #[test]
    fn too_few_or_unusable_figures() {
        let e = ratio_ci(&[(2.0, 1.0), (3.0, 1.0)]).unwrap();
        assert_eq!(e.n, 2);
        assert!(e.lo.is_infinite() && e.hi.is_infinite());
        assert_eq!(judge(Some(e), 10.0), Verdict::Undecided);
        assert_eq!(verdict_text(Some(e), 10.0), "undecided (n < 3, goal ≤ 10)");
        assert_eq!(with_ci(Some(e), 2), "2.50 [n=2]");
        assert_eq!(ratio_ci(&[]), None);
        assert_eq!(ratio_ci(&[(1.0, 0.0); 4]), None, "median of b is 0");
        assert_eq!(median_ci(&[]), None);
        assert_eq!(
            paired(&[Some(1.0), None, Some(3.0)], &[Some(2.0), Some(5.0), None]),
            vec![(1.0, 2.0)]
        );
    }

    #[test]
    fn verdicts_follow_the_interval_not_the_point() {
        let e = |value, lo, hi| {
            Some(Estimate {
                value,
                lo,
                hi,
                n: 5,
            })
        };
        assert_eq!(judge(e(1.0, 0.9, 1.02), 1.02), Verdict::Met);
        assert_eq!(judge(e(1.05, 1.021, 1.1), 1.02), Verdict::Missed);
        // The point is under the goal but the interval is not: undecided, not met.
        assert_eq!(judge(e(1.0, 0.9, 1.1), 1.02), Verdict::Undecided);
        assert_eq!(judge(e(1.1, 1.0, 1.2), 1.02), Verdict::Undecided);
        assert_eq!(judge(None, 1.0), Verdict::NoData);
        assert_eq!(verdict_text(e(1.0, 0.9, 1.0), 1.02), "met (≤ 1.02)");
        assert_eq!(
            verdict_text(e(2.0, 1.5, 2.5), 1.02),
            "**MISSED** (goal ≤ 1.02)"
        );
        assert_eq!(
            verdict_text(e(1.0, 0.9, 1.1), 1.02),
            "undecided (CI spans the goal ≤ 1.02)"
        );
        assert_eq!(verdict_text(None, 1.02), "no data");
        assert_eq!(with_ci(e(1.0, 0.9, 1.1), 3), "1.000 [0.900–1.100]");
        assert_eq!(with_ci(None, 3), "-");
    }

    #[test]
    fn a_clear_gap_is_decided_and_a_tie_is_not() {
        // Ours clearly slower than C in every round: MISSED with confidence.
        let slow: Vec<(f64, f64)> = (0..8)
            .map(|i| (150.0 + i as f64, 100.0 + i as f64))
            .collect();
        assert_eq!(judge(ratio_ci(&slow), 1.02), Verdict::Missed);
        // Ours and C alternate around the same figure: the interval spans 1.02.
        let tie: Vec<(f64, f64)> = (0..8)
            .map(|i| {
                if i % 2 == 0 {
                    (90.0, 100.0)
                } else {
                    (110.0, 100.0)
                }
            })
            .collect();
        assert_eq!(judge(ratio_ci(&tie), 1.02), Verdict::Undecided);
    }
}

//! Confidence intervals and verdicts that noise cannot flip.
//!
//! Every figure of the bench tables is a median over rounds, with an exact, distribution-free
//! 95 % confidence interval from order statistics: for n figures sorted, `[x(j), x(n+1-j)]`
//! holds the true median with probability `1 - 2·P(Binomial(n, 1/2) < j)`, and `j` is the
//! largest rank that keeps this at 95 % or more ([`median_rank`]). With fewer than [`MIN_N`]
//! figures no rank does: the interval is unbounded and the verdict undecided. A ratio is the
//! median of the per-round ratios (paired: both figures of a round ran side by side in it and
//! share its drift), with the same interval over those ratios. A goal `≤ G` is then
//! - met when the whole interval is at or below G,
//! - MISSED when the whole interval is above G,
//! - undecided when the interval spans G: more rounds are needed to tell.

/// The fewest figures for which an order-statistic interval of the median reaches 95 %
/// (n = 6: `[x(1), x(6)]`, 96.9 %); fewer give an unbounded interval.
pub const MIN_N: usize = 6;
/// The coverage the intervals are built for.
const COVERAGE: f64 = 0.95;

/// A point estimate with its 95 % confidence interval.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Estimate {
    pub value: f64,
    pub lo: f64,
    pub hi: f64,
    /// Figures (rounds) it comes from.
    pub n: usize,
}

/// `P(Binomial(n, 1/2) <= k)`, summed in log space (exact enough for any bench size).
fn binomial_half_cdf(n: usize, k: usize) -> f64 {
    let ln2 = std::f64::consts::LN_2;
    let mut ln_choose = 0.0; // ln C(n, 0)
    let mut sum = 0.0;
    for i in 0..=k.min(n) {
        if i > 0 {
            ln_choose += ((n - i + 1) as f64).ln() - (i as f64).ln();
        }
        sum += (ln_choose - n as f64 * ln2).exp();
    }
    sum.min(1.0)
}

/// The largest 1-based rank `j` such that `[x(j), x(n+1-j)]` of n sorted figures covers the
/// median with probability at least 95 %; `None` when even `[x(1), x(n)]` does not (n < 6).
pub fn median_rank(n: usize) -> Option<usize> {
    let alpha = (1.0 - COVERAGE) / 2.0;
    // Coverage of rank j: 1 - 2·P(B <= j - 1).
    (1..=n.div_ceil(2))
        .take_while(|&j| binomial_half_cdf(n, j - 1) <= alpha)
        .last()
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

/// The median of `values` with its order-statistic interval (see the module doc): unbounded
/// with fewer than [`MIN_N`] finite figures; `None` without any.
pub fn median_ci(values: &[f64]) -> Option<Estimate> {
    let sorted = sorted_finite(values);
    let n = sorted.len();
    let value = median_of_sorted(&sorted)?;
    let (lo, hi) = match median_rank(n) {
        Some(j) => (sorted[j - 1], sorted[n - j]),
        None => (f64::NEG_INFINITY, f64::INFINITY),
    };
    Some(Estimate { value, lo, hi, n })
}

/// The median of the per-round ratios `a / b` over the rounds where both have a finite figure
/// and `b` is not 0 (`pairs`: one `(a, b)` per round), with its order-statistic interval. `None`
/// without a usable pair.
pub fn ratio_ci(pairs: &[(f64, f64)]) -> Option<Estimate> {
    let ratios: Vec<f64> = pairs
        .iter()
        .filter(|(a, b)| a.is_finite() && b.is_finite() && *b != 0.0)
        .map(|(a, b)| a / b)
        .collect();
    median_ci(&ratios)
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
    fn medians() {
        let median = |v: &[f64]| median_of_sorted(&sorted_finite(v));
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(&[f64::NAN]), None);
    }

    /// The truth: the binomial tables of the sign test (Conover, Practical Nonparametric
    /// Statistics): the ranks of the 95 % interval of a median, and its coverage.
    #[test]
    fn ranks_and_coverage_follow_the_binomial_table() {
        assert!((binomial_half_cdf(9, 1) - 10.0 / 512.0).abs() < 1e-12);
        assert!((binomial_half_cdf(6, 0) - 1.0 / 64.0).abs() < 1e-12);
        assert!((binomial_half_cdf(10, 10) - 1.0).abs() < 1e-12);
        for (n, rank) in [
            (3, None),
            (5, None),
            (6, Some(1)),
            (8, Some(1)),
            (9, Some(2)),
            (10, Some(2)),
            (12, Some(3)),
            (20, Some(6)),
            (45, Some(16)),
        ] {
            assert_eq!(median_rank(n), rank, "n = {n}");
            if let Some(j) = rank {
                let covered = 1.0 - 2.0 * binomial_half_cdf(n, j - 1);
                let wider = 1.0 - 2.0 * binomial_half_cdf(n, j);
                assert!(
                    covered >= 0.95 && wider < 0.95,
                    "n = {n}: {covered} {wider}"
                );
            }
        }
    }

    #[test]
    fn the_interval_is_the_order_statistics_of_the_figures() {
        let nine = [5.0, 1.0, 9.0, 3.0, 7.0, 2.0, 8.0, 4.0, 6.0];
        let e = median_ci(&nine).unwrap();
        assert_eq!((e.value, e.lo, e.hi, e.n), (5.0, 2.0, 8.0, 9));
        // Ratios are per round: 8 rounds, one a clear outlier, one unusable.
        let pairs = [
            (110.0, 100.0),
            (95.0, 100.0),
            (130.0, 98.0),
            (105.0, 100.0),
            (99.0, 100.0),
            (120.0, 100.0),
            (101.0, 100.0),
            (1.0, 0.0),
        ];
        let e = ratio_ci(&pairs).unwrap();
        assert_eq!(e.n, 7);
        assert!((e.value - 1.05).abs() < 1e-12, "{e:?}");
        assert_eq!((e.lo, e.hi), (0.95, 130.0 / 98.0), "n = 7: [x(1), x(7)]");
    }

    #[test]
    fn constant_figures_give_a_point_interval() {
        let e = ratio_ci(&[(2.0, 1.0); 6]).unwrap();
        assert_eq!((e.value, e.lo, e.hi, e.n), (2.0, 2.0, 2.0, 6));
        let m = median_ci(&[5.0; 6]).unwrap();
        assert_eq!((m.value, m.lo, m.hi), (5.0, 5.0, 5.0));
    }

    #[test]
    fn more_rounds_narrow_the_interval() {
        let noisy = |n: usize| -> Vec<(f64, f64)> {
            (0..n)
                .map(|i| (100.0 + ((i * 37) % 11) as f64 * 3.0, 100.0))
                .collect()
        };
        let few = ratio_ci(&noisy(9)).unwrap();
        let many = ratio_ci(&noisy(45)).unwrap();
        assert!(many.hi - many.lo < few.hi - few.lo, "{few:?} vs {many:?}");
    }

    #[test]
    fn too_few_or_unusable_figures() {
        let e = ratio_ci(&[(2.0, 1.0), (3.0, 1.0)]).unwrap();
        assert_eq!(e.n, 2);
        assert!(e.lo.is_infinite() && e.hi.is_infinite());
        assert_eq!(judge(Some(e), 10.0), Verdict::Undecided);
        assert_eq!(verdict_text(Some(e), 10.0), "undecided (n < 6, goal ≤ 10)");
        assert_eq!(with_ci(Some(e), 2), "2.50 [n=2]");
        // Five clearly slow rounds are still too few for a 95 % interval.
        let five = ratio_ci(&[(3.0, 1.0); 5]).unwrap();
        assert_eq!(judge(Some(five), 1.02), Verdict::Undecided);
        assert_eq!(ratio_ci(&[]), None);
        assert_eq!(ratio_ci(&[(1.0, 0.0); 4]), None, "no usable round");
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
                n: 9,
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

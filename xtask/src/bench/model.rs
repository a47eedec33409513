//! `cargo xtask bench model`: what each probe preset would add to a real host's round trip.
//!
//! Under TCG every figure of the trace bench is slow, so its ratios flatter the tracer. The model
//! takes the two things that carry over to a real host and multiplies them:
//! - **hook hits per round trip, by attach mechanism**: counted in the 6.1 guest by the kernel's
//!   BPF run-time statistics of `rdma-trace run --mode event --probes P` (minimal, default,
//!   full), over the round trips the demo did. The completion path's hits per round trip do not
//!   depend on the CPU's speed; the scheduler's (`sched_switch`, `sched_waking`) do, a little:
//!   an emulated kernel switches more often.
//! - **the cost of one hit of each mechanism on this host's real CPU**: `rdma-trace calibrate`
//!   (empty programs on the umask path, timed with and without them) run here, on the host.
//!   A mechanism the host cannot attach (kprobes missing, fentry refused) is priced at the
//!   host's raw tracepoint cost times its ratio to it in the guest's own calibration rounds
//!   (`derived` on the page): an estimate from emulated ratios, not a measurement.
//!
//! Each hit is priced at its mechanism's floor (an empty program): with measured costs, a lower
//! bound. What our programs' bodies add beyond an empty one is not modelled: their run times
//! under TCG (map updates, kernel reads, atomics) do not scale to a real CPU by any ratio the
//! calibration measures; the page lists them as measured in the guest. The verdict's interval
//! combines the hit counts' spread over rounds with each cost's own interval: a preset misses
//! the budget when even its low end is over it. The budget is [`BUDGET_PERCENT`] % of an
//! [`REAL_RTT_NS`] ns event-mode round trip (a ConnectX-class NIC).

use std::{
    collections::BTreeMap, fmt::Write as _, fs, path::Path, process::Command, time::Duration,
};

use anyhow::{Context as _, Result, bail};
use serde_json::Value;

use super::{
    Section, read_json,
    stats::{self, Estimate},
    table,
};
use crate::util::{say, target_dir};

/// Round trips per run (event mode; about 0.7 s under TCG).
const ITERATIONS: u32 = 500;
const PRESETS: [&str; 3] = ["minimal", "default", "full"];
/// Calibration rounds, on the host and in the guest.
const CALIBRATION_ROUNDS: u32 = 15;
/// The real host's event-mode round trip the model prices against.
pub const REAL_RTT_NS: f64 = 8000.0;
pub const BUDGET_PERCENT: f64 = 5.0;
/// The mechanisms our programs use, in the page's order.
const MECHANISMS: [&str; 6] = [
    "kprobe",
    "kretprobe",
    "tracepoint",
    "raw_tp",
    "fentry",
    "uprobe",
];

pub fn run(rounds: u32) -> Result<Section> {
    // First, and never fatal: a bench run without root still writes its page.
    let host = match host_calibration() {
        Ok(h) => h,
        Err(e) => {
            say(format!("no real-host model: {e:#}"));
            return Ok(Section::new(
                "Real-host model",
                format!("No model: {e:#}.\n"),
                &target_dir().join("bench"),
                &[],
            ));
        }
    };
    let g = super::run_guest(
        "model",
        &|first| script(first, rounds),
        rounds,
        Duration::from_secs(900),
        false,
    )?;
    Ok(report(&g.dir, rounds, &host).cut_short(g.cut_short))
}

/// `rdma-trace calibrate` on this host (root: it loads and attaches programs), as JSON.
fn host_calibration() -> Result<Value> {
    let dir = target_dir().join("bench");
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let json = dir.join("host-calibration.json");
    let bin = target_dir().join("release").join("rdma-trace");
    say(format!(
        "calibrating the attach mechanisms on this host ({CALIBRATION_ROUNDS} rounds)"
    ));
    let out = Command::new(&bin)
        .args([
            "calibrate",
            "--rounds",
            &CALIBRATION_ROUNDS.to_string(),
            "--json",
        ])
        .arg(&json)
        .output()
        .with_context(|| format!("running {}", bin.display()))?;
    if !out.status.success() {
        bail!(
            "rdma-trace calibrate failed on the host ({}; it needs root): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    read_json(&json).with_context(|| format!("reading {}", json.display()))
}

/// The guest script for rounds `first..=rounds`: the guest's calibration once, then each round
/// runs every preset (in alternating order).
fn script(first: u32, rounds: u32) -> String {
    let mut s = format!(
        "[ -s $R/guest-calibration.json ] || rdma-trace calibrate --rounds {CALIBRATION_ROUNDS} \
         --json $R/guest-calibration.json > $R/guest-calibration.err 2>&1 \
         || echo \"guest calibration: status $?\"\n"
    );
    for round in first..=rounds {
        let _ = writeln!(s, "echo \"== round {round}\"");
        let order: Vec<&str> = if round % 2 == 1 {
            PRESETS.to_vec()
        } else {
            PRESETS.iter().rev().copied().collect()
        };
        for p in order {
            let _ = writeln!(
                s,
                "N=r{round}-{p}; timeout 300 rdma-trace run --no-tui --mode event -n {ITERATIONS} \
                 --probes {p} --json $R/$N.json > $R/$N.out 2> $R/$N.err \
                 || {{ echo \"$N: status $?\"; tail -3 $R/$N.err; }}"
            );
        }
    }
    s
}

/// Per mechanism: the median cost per hit over a calibration's rounds, and the median cost of
/// the empty body (its BPF run time).
#[derive(Debug, Default, PartialEq)]
struct Costs {
    per_hit: BTreeMap<String, Estimate>,
    /// Each round's cost per hit (`None`: not measured in that round), for paired ratios.
    rounds: BTreeMap<String, Vec<Option<f64>>>,
    empty_body: BTreeMap<String, f64>,
    /// Why a mechanism could not be measured (the first round's reason).
    unavailable: BTreeMap<String, String>,
}

fn costs(calibration: &Value) -> Costs {
    let mut hits: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let mut bodies: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let mut out = Costs::default();
    let rounds = calibration["rounds"]
        .as_array()
        .map_or(&[][..], Vec::as_slice);
    let round_mechanisms = rounds.iter().enumerate().flat_map(|(i, r)| {
        let ms = r["mechanisms"].as_array().map_or(&[][..], Vec::as_slice);
        ms.iter().map(move |m| (i, m))
    });
    for (i, m) in round_mechanisms {
        let Some(name) = m["mechanism"].as_str() else {
            continue;
        };
        out.rounds
            .entry(name.to_owned())
            .or_insert_with(|| vec![None; rounds.len()])[i] = m["ns_per_hit"].as_f64();
        if let Some(ns) = m["ns_per_hit"].as_f64() {
            hits.entry(name.to_owned()).or_default().push(ns);
        }
        if let Some(ns) = m["empty_body_ns"].as_f64() {
            bodies.entry(name.to_owned()).or_default().push(ns);
        }
        if let Some(why) = m["unavailable"].as_str() {
            out.unavailable
                .entry(name.to_owned())
                .or_insert_with(|| why.to_owned());
        }
    }
    for (m, v) in hits {
        if let Some(e) = stats::median_ci(&v) {
            out.per_hit.insert(m, e);
        }
    }
    for (m, v) in bodies {
        if let Some(e) = stats::median_ci(&v) {
            out.empty_body.insert(m, e.value);
        }
    }
    out
}

/// A host's cost per hit of one mechanism: measured here, or `derived`: the host's raw
/// tracepoint times the median of the guest rounds' ratios of this mechanism to the raw
/// tracepoint (paired by round), with that ratio's interval.
#[derive(Debug, PartialEq)]
struct HostCost {
    ns: Estimate,
    derived: bool,
}

/// The host's cost per hit of each mechanism it or the guest measured. Empty without a raw
/// tracepoint figure on the host.
fn host_costs(host: &Costs, guest: &Costs) -> BTreeMap<String, HostCost> {
    let mut out = BTreeMap::new();
    let Some(raw) = host.per_hit.get("raw_tp").copied() else {
        return out;
    };
    let none = Vec::new();
    let guest_raw = guest.rounds.get("raw_tp").unwrap_or(&none);
    for m in MECHANISMS {
        let cost = if let Some(e) = host.per_hit.get(m) {
            HostCost {
                ns: *e,
                derived: false,
            }
        } else {
            let pairs = stats::paired(guest.rounds.get(m).unwrap_or(&none), guest_raw);
            let Some(r) = stats::ratio_ci(&pairs) else {
                continue;
            };
            HostCost {
                ns: Estimate {
                    value: raw.value * r.value,
                    lo: raw.value * r.lo,
                    hi: raw.value * r.hi,
                    n: r.n,
                },
                derived: true,
            }
        };
        out.insert(m.to_owned(), cost);
    }
    out
}

/// One run's figures: hits per round trip, in all and by mechanism, and what the bodies took
/// per round trip in the guest beyond empty programs (TCG ns: listed, not modelled).
#[derive(Debug, Default, PartialEq)]
struct RunHits {
    per_round_trip: f64,
    by_mechanism: BTreeMap<String, f64>,
    guest_body_ns_per_round_trip: f64,
}

fn run_hits(report: &Value, guest: &Costs) -> Option<RunHits> {
    let phase = &report["phases"][0];
    let round_trips = phase["overhead"]["hook_hits"]["round_trips"].as_f64()?;
    if round_trips <= 0.0 {
        return None;
    }
    let mut out = RunHits::default();
    for p in phase["overhead"]["programs"].as_array()? {
        let runs = p["runs"].as_f64().unwrap_or(0.0);
        // A program of no known mechanism is left unpriced, not priced as the cheapest.
        let m = p["mechanism"].as_str().unwrap_or("unknown");
        *out.by_mechanism.entry(m.to_owned()).or_default() += runs / round_trips;
        out.per_round_trip += runs / round_trips;
        if let (Some(per_run), Some(empty)) = (p["ns_per_run"].as_f64(), guest.empty_body.get(m)) {
            out.guest_body_ns_per_round_trip += runs / round_trips * (per_run - empty).max(0.0);
        }
    }
    Some(out)
}

/// What one run's hits add on the host, in ns per round trip, each hit at its mechanism's floor
/// (`cost` picks the figure of a cost: its value, or an end of its interval), and the hits per
/// round trip of mechanisms without a host cost (not in the sum).
fn floor_ns(
    hits: &RunHits,
    host: &BTreeMap<String, HostCost>,
    cost: fn(&Estimate) -> f64,
) -> (f64, f64) {
    let (mut ns, mut unpriced) = (0.0, 0.0);
    for (m, h) in &hits.by_mechanism {
        match host.get(m) {
            Some(c) => ns += h * cost(&c.ns),
            None => unpriced += h,
        }
    }
    (ns, unpriced)
}

fn report(dir: &Path, rounds: u32, host_cal: &Value) -> Section {
    let host = costs(host_cal);
    let guest = read_json(&dir.join("guest-calibration.json"))
        .map(|v| costs(&v))
        .unwrap_or_default();
    let mut md = String::new();
    let _ = writeln!(
        md,
        "What the hook hits of each preset would add to a real host's {:.0} µs event-mode round \
         trip: hits per round trip counted in the guest (`rdma-trace run --mode event -n \
         {ITERATIONS} --probes P`, BPF run-time statistics over the demo's round trips), times \
         each mechanism's cost per hit calibrated on this host's CPU (`rdma-trace calibrate`, \
         {CALIBRATION_ROUNDS} rounds). Medians over {rounds} rounds with 95 % intervals.\n",
        REAL_RTT_NS / 1000.0
    );
    let host_cost = host_costs(&host, &guest);
    if host_cost.is_empty() {
        let _ = writeln!(
            md,
            "No model: the raw tracepoint's cost is missing on the host ({}).",
            host.unavailable
                .get("raw_tp")
                .map_or("no figure", String::as_str)
        );
        return Section::new("Real-host model", md, dir, &[]);
    }
    let mut rows = Vec::new();
    for (m, c) in MECHANISMS
        .iter()
        .filter_map(|m| Some((*m, host_cost.get(*m)?)))
    {
        let host_figure = if c.derived {
            format!("{} (derived)", stats::with_ci(Some(c.ns), 0))
        } else {
            stats::with_ci(Some(c.ns), 0)
        };
        rows.push(vec![
            m.to_owned(),
            host_figure,
            stats::with_ci(guest.per_hit.get(m).copied(), 0),
        ]);
    }
    let _ = writeln!(
        md,
        "{}",
        table(&["mechanism", "host ns per hit", "guest ns per hit"], &rows)
    );
    let unmeasured: Vec<String> = host_cost
        .iter()
        .filter(|(_, c)| c.derived)
        .map(|(m, _)| {
            format!(
                "{m} ({})",
                host.unavailable.get(m).map_or("no figure", String::as_str)
            )
        })
        .collect();
    if !unmeasured.is_empty() {
        let _ = writeln!(
            md,
            "Derived (the host's raw tracepoint × the guest rounds' ratio to it): {}.\n",
            unmeasured.join("; ")
        );
    }
    let mut rows = Vec::new();
    let mut failed = Vec::new();
    for p in PRESETS {
        let runs: Vec<RunHits> = (1..=rounds)
            .filter_map(|r| {
                let hits = read_json(&dir.join(format!("r{r}-{p}.json")))
                    .and_then(|v| run_hits(&v, &guest));
                if hits.is_none() {
                    failed.push(format!("r{r}-{p}"));
                }
                hits
            })
            .collect();
        let median =
            |f: &dyn Fn(&RunHits) -> f64| stats::median_ci(&runs.iter().map(f).collect::<Vec<_>>());
        let by_mechanism = MECHANISMS
            .iter()
            .filter_map(|m| {
                let e = median(&|h| h.by_mechanism.get(*m).copied().unwrap_or(0.0))?;
                (e.value > 0.0).then(|| format!("{m} {:.1}", e.value))
            })
            .collect::<Vec<_>>()
            .join(", ");
        // The median at the costs' values, its interval from the rounds' spread at the costs'
        // own low and high ends.
        let at = |cost: fn(&Estimate) -> f64| median(&|h| floor_ns(h, &host_cost, cost).0);
        let floor = match (at(|e| e.value), at(|e| e.lo), at(|e| e.hi)) {
            (Some(v), Some(lo), Some(hi)) => Some(Estimate {
                value: v.value,
                lo: lo.lo,
                hi: hi.hi,
                n: v.n,
            }),
            _ => None,
        };
        let unpriced = median(&|h| floor_ns(h, &host_cost, |e| e.value).1).map_or(0.0, |e| e.value);
        let percent = floor.map(|e| Estimate {
            value: 100.0 * e.value / REAL_RTT_NS,
            lo: 100.0 * e.lo / REAL_RTT_NS,
            hi: 100.0 * e.hi / REAL_RTT_NS,
            n: e.n,
        });
        let verdict = match stats::judge(percent, BUDGET_PERCENT) {
            stats::Verdict::Missed => {
                format!("**no**: even its low end is over {BUDGET_PERCENT} %")
            }
            stats::Verdict::NoData => "no data".into(),
            _ => "undecided: the floors fit, the bodies are not modelled".into(),
        };
        rows.push(vec![
            p.to_owned(),
            stats::with_ci(median(&|h| h.per_round_trip), 1),
            by_mechanism,
            if unpriced > 0.0 {
                format!(
                    "{} (+{unpriced:.1} hits unpriced)",
                    stats::with_ci(floor, 0)
                )
            } else {
                stats::with_ci(floor, 0)
            },
            stats::with_ci(percent, 1),
            verdict,
            stats::with_ci(median(&|h| h.guest_body_ns_per_round_trip), 0),
        ]);
    }
    let _ = writeln!(
        md,
        "{}",
        table(
            &[
                "preset",
                "hook hits / round trip",
                "by mechanism",
                "adds, at the floors (ns)",
                "% of 8 µs",
                "within 5 %",
                "bodies in the guest (TCG ns, not modelled)",
            ],
            &rows
        )
    );
    Section::new("Real-host model", md, dir, &failed)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn calibration(rounds: &[(f64, f64, Option<f64>)]) -> Value {
        // (raw_tp, tracepoint, kprobe) per round; kprobe None: unavailable.
        json!({"rounds": rounds.iter().map(|(raw, tp, kp)| json!({"mechanisms": [
            {"mechanism": "raw_tp", "ns_per_hit": raw, "empty_body_ns": 10.0},
            {"mechanism": "tracepoint", "ns_per_hit": tp, "empty_body_ns": 10.0},
            match kp {
                Some(k) => json!({"mechanism": "kprobe", "ns_per_hit": k, "empty_body_ns": 20.0}),
                None => json!({"mechanism": "kprobe", "unavailable": "no kprobe PMU"}),
            },
        ]})).collect::<Vec<_>>()})
    }

    /// The independent truth: hand-computed products of made-up hits and costs.
    #[test]
    fn the_model_multiplies_hits_by_host_costs_and_derives_kprobes_from_the_guest_ratio() {
        let host = costs(&calibration(&[(100.0, 120.0, None); 7]));
        let guest = costs(&calibration(&[(1000.0, 1500.0, Some(3000.0)); 7]));
        assert_eq!(host.unavailable["kprobe"], "no kprobe PMU");
        let hc = host_costs(&host, &guest);
        assert_eq!(hc["raw_tp"].ns.value, 100.0);
        assert!(!hc["raw_tp"].derived);
        // The guest's kprobe is 3 × its raw tracepoint in every round.
        assert_eq!(hc["kprobe"].ns.value, 300.0);
        assert!(hc["kprobe"].derived);
        // 1000 round trips: 2000 kprobe runs of 50 ns (30 beyond the empty body), 3000 tracepoint
        // runs of 10 ns (none beyond).
        let report = json!({"phases": [{"overhead": {
            "hook_hits": {"round_trips": 1000},
            "programs": [
                {"runs": 2000, "mechanism": "kprobe", "ns_per_run": 50.0},
                {"runs": 3000, "mechanism": "tracepoint", "ns_per_run": 10.0},
            ],
        }}]});
        let hits = run_hits(&report, &guest).unwrap();
        assert_eq!(hits.per_round_trip, 5.0);
        assert_eq!(hits.by_mechanism["kprobe"], 2.0);
        assert_eq!(hits.guest_body_ns_per_round_trip, 60.0);
        // Floors: 2 × 300 + 3 × 120 = 960.
        assert_eq!(floor_ns(&hits, &hc, |e| e.value), (960.0, 0.0));
        // A mechanism without any cost is counted apart, not priced at 0 silently.
        let mut uprobe = hits;
        uprobe.by_mechanism.insert("uprobe".into(), 1.5);
        assert_eq!(floor_ns(&uprobe, &hc, |e| e.value), (960.0, 1.5));
    }

    #[test]
    fn without_a_raw_tracepoint_on_both_there_is_no_model() {
        let host = costs(&json!({"rounds": []}));
        let guest = costs(&calibration(&[(1000.0, 1500.0, Some(3000.0)); 7]));
        assert!(host_costs(&host, &guest).is_empty());
    }

    #[test]
    fn the_script_calibrates_once_and_alternates_the_presets() {
        let s = script(1, 2);
        assert_eq!(s.matches("rdma-trace calibrate").count(), 1);
        let r1 = s.find("N=r1-minimal").unwrap();
        assert!(r1 < s.find("N=r1-full").unwrap());
        assert!(s.find("N=r2-full").unwrap() < s.find("N=r2-minimal").unwrap());
        assert!(s.contains("--probes default --json $R/$N.json"));
    }
}

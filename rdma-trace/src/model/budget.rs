//! The overhead budget: what tracing adds per round trip, and which programs to drop to stay
//! under `--overhead-budget PCT`.
//!
//! The cost of one attached program over a window is its BPF run time (the kernel's run-time
//! statistics) plus, per run, what its attach mechanism costs outside the body (the start-up
//! calibration, [`crate::bpf::calibrate`]). Their sum over the round trips of the window is what
//! tracing adds to one round trip. It is an estimate: the cost of a hit is measured on the
//! umask path, not on the traced functions, and caches and interrupts differ there.

use serde::Serialize;

use crate::{
    bpf::calibrate::Calibration,
    model::overhead::{Added, Overhead, ProgramOverhead},
};

/// `--overhead-budget PCT`: a percentage in (0, 100].
pub fn parse_percent(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v > 0.0 && v <= 100.0 => Ok(v),
        _ => Err(format!(
            "{s:?} is not a percentage in (0, 100] (e.g. --overhead-budget 5)"
        )),
    }
}

/// `--probes`, whose rows the probe table names (`kernel::probes`).
pub use crate::kernel::probes::Preset;

/// The attach mechanism of a program (kept with the overhead model it feeds).
pub use crate::model::overhead::mechanism_of;

/// What one program cost over a window.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ProgramCost {
    pub name: String,
    pub target: String,
    pub mechanism: &'static str,
    pub runs: u64,
    /// Body time + runs × the mechanism's cost outside the body.
    pub cost_ns: f64,
}

/// Every program's cost, from its statistics over a window and the calibration.
pub fn costs(programs: &[ProgramOverhead], cal: Option<&Calibration>) -> Vec<ProgramCost> {
    programs
        .iter()
        .map(|p| {
            let mechanism = mechanism_of(&p.counts.name);
            let outside = cal
                .and_then(|c| c.get(mechanism))
                .and_then(|m| m.outside_body_ns())
                .unwrap_or(0.0);
            ProgramCost {
                name: p.counts.name.clone(),
                target: p.counts.target.clone(),
                mechanism,
                runs: p.counts.runs,
                cost_ns: p.counts.run_ns as f64 + p.counts.runs as f64 * outside,
            }
        })
        .collect()
}

/// `None` without round trips or a round-trip time.
pub fn added(costs: &[ProgramCost], round_trips: u64, round_trip_us: f64) -> Option<Added> {
    if round_trips == 0 || round_trip_us.is_nan() || round_trip_us <= 0.0 {
        return None;
    }
    let total: f64 = costs.iter().map(|c| c.cost_ns).sum();
    let us = total / round_trips as f64 / 1e3;
    Some(Added {
        per: "round trip",
        us_per_round_trip: us,
        percent: 100.0 * us / round_trip_us,
        round_trip_us,
        round_trips,
    })
}

/// One step of enforcing the budget: programs detached together, and what is lost.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Dropped {
    pub programs: Vec<String>,
    pub target: String,
    /// What the report no longer has.
    pub lost: String,
    /// Its share of the round trip, in %.
    pub percent: f64,
}

/// The program that ends what `entry` starts (`kentry_3` → `kreturn_3`, `softirq_entry` →
/// `softirq_exit`): dropping the start makes the end useless.
fn partner(entry: &str) -> Option<String> {
    if let Some(n) = entry.strip_prefix("kentry_") {
        return Some(format!("kreturn_{n}"));
    }
    if let Some(n) = entry.strip_prefix("fentry_") {
        return Some(format!("fexit_{n}"));
    }
    match entry {
        "softirq_entry" => Some("softirq_exit".into()),
        "irq_handler_entry" => Some("irq_handler_exit".into()),
        "uentry" => Some("ureturn".into()),
        _ => None,
    }
}

/// An end program alone: dropping it loses durations, the start keeps counting.
fn is_end(program: &str) -> bool {
    [
        "kreturn_",
        "fexit_",
        "softirq_exit",
        "irq_handler_exit",
        "ureturn",
    ]
    .iter()
    .any(|p| program.starts_with(p))
}

/// Which programs to drop so that the rest stays within `budget_percent` of the round trip:
/// the most expensive first. A return program alone loses durations but keeps the entry's
/// counts; an entry program goes with its return program. The cheapest program is always
/// kept. Empty when the estimate is within the budget.
pub fn plan_drops(costs: &[ProgramCost], added: &Added, budget_percent: f64) -> Vec<Dropped> {
    if added.percent <= budget_percent || added.us_per_round_trip <= 0.0 {
        return Vec::new();
    }
    let mut order: Vec<&ProgramCost> = costs.iter().collect();
    order.sort_by(|a, b| b.cost_ns.total_cmp(&a.cost_ns));
    let cheapest = order.last().map(|c| c.name.clone());
    let mut gone: Vec<String> = Vec::new();
    let mut drops = Vec::new();
    let mut percent = added.percent;
    for c in &order {
        if percent <= budget_percent {
            break;
        }
        if gone.contains(&c.name) || Some(&c.name) == cheapest.as_ref() {
            continue;
        }
        let mut programs = vec![c.name.clone()];
        let mut ns = c.cost_ns;
        if let Some(ret) = partner(&c.name)
            && !gone.contains(&ret)
            && let Some(r) = costs.iter().find(|x| x.name == ret)
        {
            programs.push(ret);
            ns += r.cost_ns;
        }
        let lost = if is_end(&c.name) {
            format!("durations of {} (its calls are still counted)", c.target)
        } else if programs.len() > 1 {
            format!("{}: counts and durations", c.target)
        } else {
            format!("{}: everything it feeds", c.target)
        };
        let pct = percent_of_round_trip(added, ns);
        percent -= pct;
        gone.extend(programs.iter().cloned());
        drops.push(Dropped {
            programs,
            target: c.target.clone(),
            lost,
            percent: pct,
        });
    }
    drops
}

/// What `ns` of cost over `added`'s window is, per round trip, in % of its round trip.
pub fn percent_of_round_trip(added: &Added, ns: f64) -> f64 {
    100.0 * ns / added.round_trips as f64 / 1e3 / added.round_trip_us.max(f64::MIN_POSITIVE)
}

/// The lines the report and the live view print about the budget.
pub fn render_drops(drops: &[Dropped], budget_percent: f64) -> String {
    let mut out = format!("over the {budget_percent} % overhead budget; dropped:\n");
    for d in drops {
        // A step without programs (the waterfall's sampling raised) is named by its target.
        let what = if d.programs.is_empty() {
            d.target.clone()
        } else {
            d.programs.join("+")
        };
        out.push_str(&format!(
            "  {:<22} {:>5.1} %  {}\n",
            what, d.percent, d.lost
        ));
    }
    out
}

/// The overhead budget of a run.
#[derive(Clone, Copy)]
pub struct Budget<'a> {
    pub percent: f64,
    pub enforce: bool,
    pub calibration: Option<&'a Calibration>,
}

impl Budget<'_> {
    /// What tracing adds per round trip over `o`'s window; `None` without the kernel's BPF
    /// run-time statistics (every program's run count reads 0 then, not its real cost).
    pub fn added(&self, o: &Overhead, round_trips: u64, rtt_us: f64) -> Option<Added> {
        if o.stats_off() {
            return None;
        }
        added(&costs(&o.programs, self.calibration), round_trips, rtt_us)
    }

    /// The report's lines about the budget, for a window's `overhead`. Without the kernel's
    /// BPF run-time statistics the programs' own time is unknown: no verdict then, never
    /// "within".
    pub fn verdict(&self, overhead: &Overhead, dropped: &[Dropped]) -> String {
        let mut out = String::new();
        if overhead.stats_off() {
            out.push_str(&format!(
                "  no verdict on the {} % overhead budget: the BPF run-time statistics are off ({})\n",
                self.percent, overhead.stats
            ));
            return out;
        }
        let added = overhead.tracing_adds.as_ref();
        if !dropped.is_empty() {
            out.push_str(&render_drops(dropped, self.percent));
            out.push_str("  (the estimate above counts what is left after the drop)\n");
        }
        match added {
            Some(a) if a.percent > self.percent && !self.enforce => out.push_str(&format!(
                "  over the {} % overhead budget: --enforce would drop the most expensive programs\n",
                self.percent
            )),
            Some(a) if a.percent > self.percent => out.push_str(&format!(
                "  still over the {} % overhead budget\n",
                self.percent
            )),
            Some(_) => out.push_str(&format!(
                "  within the {} % overhead budget\n",
                self.percent
            )),
            None => {}
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bpf::calibrate::MechanismCost;

    /// The truth: an estimate under the budget, with and without the kernel's statistics.
    #[test]
    fn no_within_budget_verdict_without_the_bpf_statistics() {
        let c = costs(&[prog("kentry_0", "f", 100, 1_000)], None);
        let o = |stats: &str| Overhead {
            stats: stats.to_owned(),
            programs: Vec::new(),
            bpf_cpu_percent: 0.0,
            loader_cpu_percent: 0.0,
            loader_peak_rss_kib: 0,
            tracing_adds: added(&c, 10, 200.0),
            hook_hits: None,
        };
        let b = Budget {
            percent: 5.0,
            enforce: false,
            calibration: None,
        };
        assert_eq!(
            b.verdict(&o("bpf_enable_stats"), &[]),
            "  within the 5 % overhead budget\n"
        );
        let off = b.verdict(&o("unavailable: EPERM"), &[]);
        // Nor an estimate or hook hits from run counts that read 0.
        assert!(b.added(&o("unavailable: EPERM"), 10, 200.0).is_none());
        assert!(
            o("unavailable: EPERM")
                .hook_hits(10, "round trip")
                .is_none()
        );
        assert!(b.added(&o("bpf_enable_stats"), 10, 200.0).is_some());
        assert!(!off.contains("within"), "{off}");
        assert!(
            off.starts_with("  no verdict on the 5 % overhead budget"),
            "{off}"
        );
    }

    fn prog(name: &str, target: &str, runs: u64, run_ns: u64) -> ProgramOverhead {
        ProgramOverhead::new(crate::bpf::stats::ProgramStat {
            name: name.into(),
            target: target.into(),
            runs,
            run_ns,
            recursion_misses: None,
            kprobe_misses: None,
        })
    }

    fn cal() -> Calibration {
        let m = |mechanism, ns: f64| MechanismCost {
            mechanism,
            ns_per_hit: Some(ns),
            empty_body_ns: Some(100.0),
            unavailable: None,
            setup_ms: 1.0,
        };
        Calibration {
            mechanisms: vec![
                m("kprobe", 600.0),
                m("kretprobe", 1100.0),
                m("raw_tp", 150.0),
                m("tracepoint", 400.0),
            ],
            baseline_ns_per_call: 200.0,
            took_ms: 10.0,
        }
    }

    #[test]
    fn budget_percentages() {
        assert_eq!(parse_percent("5"), Ok(5.0));
        assert_eq!(parse_percent("0.5"), Ok(0.5));
        assert_eq!(parse_percent("100"), Ok(100.0));
        for bad in ["0", "-1", "101", "five", "NaN", ""] {
            let e = parse_percent(bad).unwrap_err();
            assert!(e.contains("not a percentage in (0, 100]"), "{bad}: {e}");
        }
    }

    #[test]
    fn ends_go_alone_starts_take_their_end_along() {
        assert_eq!(partner("kentry_3").as_deref(), Some("kreturn_3"));
        assert_eq!(partner("fentry_0").as_deref(), Some("fexit_0"));
        assert_eq!(partner("softirq_entry").as_deref(), Some("softirq_exit"));
        assert_eq!(partner("napi_poll"), None);
        assert!(is_end("softirq_exit") && is_end("kreturn_12") && !is_end("kentry_1"));
        let c = costs(
            &[
                prog("softirq_exit", "raw_tp softirq_exit", 1, 30_000),
                prog("softirq_entry", "raw_tp softirq_entry", 1, 20_000),
                prog("napi_poll", "raw_tp napi_poll", 1, 10_000),
                prog("kentry_0", "f", 1, 1_000),
            ],
            None,
        );
        let a = added(&c, 10, 100.0).unwrap();
        let d = plan_drops(&c, &a, 0.5);
        assert_eq!(d[0].programs, ["softirq_exit"]);
        assert!(d[0].lost.contains("still counted"), "{d:?}");
        assert_eq!(d[1].programs, ["softirq_entry"], "its end is gone already");
        assert_eq!(d[2].programs, ["napi_poll"]);
        assert!(d[2].lost.contains("everything it feeds"));
        assert_eq!(d.len(), 3, "kentry_0 is the cheapest: kept");
    }

    #[test]
    fn mechanisms_by_program_name() {
        for (program, mechanism) in [
            ("kentry_3", "kprobe"),
            ("kreturn_12", "kretprobe"),
            ("fexit_0", "fentry"),
            ("ureturn", "uprobe"),
            ("softirq_entry", "raw_tp"),
            ("cq_2", "kprobe"),
            ("wf_read_entry", "kprobe"),
            ("wf_read_return", "kretprobe"),
            ("wf_handler_return", "kretprobe"),
            ("wf_sched_waking", "tracepoint"),
            ("wf_mlx5_irq", "raw_tp"),
        ] {
            assert_eq!(mechanism_of(program), mechanism, "{program}");
        }
    }

    /// Every program of the embedded object is priced as the mechanism its ELF section says.
    #[test]
    fn every_program_of_the_object_is_priced_by_its_section() {
        let sections = crate::bpf::programs::object_program_sections();
        assert!(sections.len() > 20, "the object is read: {sections:?}");
        let mut wrong = Vec::new();
        for (program, family) in &sections {
            let want = match family.as_str() {
                "kprobe" => "kprobe",
                "kretprobe" => "kretprobe",
                "fentry" | "fexit" => "fentry",
                "uprobe" | "uretprobe" => "uprobe",
                "tracepoint" => "tracepoint",
                "raw_tp" | "raw_tracepoint" => "raw_tp",
                other => panic!("{program}: section {other} has no price"),
            };
            if mechanism_of(program) != want {
                wrong.push(format!(
                    "{program}: {} (section {family})",
                    mechanism_of(program)
                ));
            }
        }
        assert!(wrong.is_empty(), "priced as the wrong mechanism: {wrong:?}");
    }

    /// A waterfall read return is priced as a kretprobe, not as a raw tracepoint (#22).
    #[test]
    fn waterfall_programs_cost_their_own_mechanism() {
        let c = costs(
            &[
                prog("wf_read_return", "ib_uverbs_comp_event_read", 10, 1_000),
                prog("wf_sched_switch", "sched/sched_switch", 10, 1_000),
            ],
            Some(&cal()),
        );
        assert_eq!(c[0].mechanism, "kretprobe");
        assert_eq!(c[0].cost_ns, 1_000.0 + 10.0 * 1_000.0);
        assert_eq!(c[1].mechanism, "tracepoint");
        assert_eq!(c[1].cost_ns, 1_000.0 + 10.0 * 300.0);
    }

    #[test]
    fn cost_is_body_plus_mechanism_outside_the_body() {
        let c = costs(
            &[
                prog("kentry_0", "rxe_rcv", 10, 2_000),
                prog("kreturn_0", "rxe_rcv", 10, 3_000),
                prog("softirq_entry", "raw_tp softirq_entry", 20, 1_000),
                prog("uentry", "ibv_get_cq_event", 5, 500),
            ],
            Some(&cal()),
        );
        assert_eq!(c[0].cost_ns, 2_000.0 + 10.0 * 500.0);
        assert_eq!(c[1].cost_ns, 3_000.0 + 10.0 * 1_000.0);
        assert_eq!(c[2].cost_ns, 1_000.0 + 20.0 * 50.0);
        assert_eq!(c[3].cost_ns, 500.0, "no calibration for uprobes: body only");
        let none = costs(&[prog("kentry_0", "f", 10, 2_000)], None);
        assert_eq!(none[0].cost_ns, 2_000.0);
    }

    #[test]
    fn added_per_round_trip() {
        let c = costs(&[prog("kentry_0", "f", 100, 100_000)], None);
        let a = added(&c, 10, 200.0).unwrap();
        assert_eq!(a.us_per_round_trip, 10.0);
        assert_eq!(a.percent, 5.0);
        assert_eq!(
            a.render(),
            "tracing adds ≈ 10 us per round trip (5.0 % of 200 us)"
        );
        assert!(added(&c, 0, 200.0).is_none());
        assert!(added(&c, 10, 0.0).is_none());
        let small = added(&costs(&[prog("x", "t", 1, 500)], None), 1, 100.0).unwrap();
        assert!(small.render().starts_with("tracing adds ≈ 500 ns"));
        // No false precision: 216.6 us of 761.8 us is "≈ 220 us (28 % of 762 us)".
        let big = added(&costs(&[prog("x", "t", 1, 216_600)], None), 1, 761.8).unwrap();
        assert_eq!(
            big.render(),
            "tracing adds ≈ 220 us per round trip (28 % of 762 us)"
        );
    }

    #[test]
    fn drops_the_most_expensive_first_until_within_budget() {
        // 10 round trips of 100 µs: 1 µs of cost per round trip is 1 %.
        let c = costs(
            &[
                prog("kentry_0", "rxe_rcv", 1, 20_000),          // 2 %
                prog("kreturn_0", "rxe_rcv", 1, 50_000),         // 5 %
                prog("kentry_1", "rxe_cq_post", 1, 10_000),      // 1 %
                prog("kreturn_1", "rxe_cq_post", 1, 10_000),     // 1 %
                prog("napi_poll", "raw_tp napi_poll", 1, 5_000), // 0.5 %
            ],
            None,
        );
        let a = added(&c, 10, 100.0).unwrap();
        assert!((a.percent - 9.5).abs() < 1e-9, "{a:?}");
        assert!(plan_drops(&c, &a, 10.0).is_empty(), "within budget");
        let d = plan_drops(&c, &a, 5.0);
        assert_eq!(d.len(), 1, "{d:?}");
        assert_eq!(d[0].programs, ["kreturn_0"]);
        assert!(d[0].lost.contains("still counted"), "{}", d[0].lost);
        assert!((d[0].percent - 5.0).abs() < 1e-9);
        // A tighter budget: then the rxe_rcv entry goes, then a pair whose entry costs most.
        let d = plan_drops(&c, &a, 1.0);
        let names: Vec<String> = d.iter().map(|d| d.programs.join("+")).collect();
        assert_eq!(
            names,
            ["kreturn_0", "kentry_0", "kentry_1+kreturn_1"],
            "{d:?}"
        );
        assert!(d[2].lost.contains("counts and durations"));
        // Nothing left but the cheapest, which stays even when over budget.
        let d = plan_drops(&c, &a, 0.0);
        assert!(
            d.iter()
                .all(|d| !d.programs.contains(&"napi_poll".to_owned()))
        );
        let mut d = d;
        d.push(Dropped {
            programs: Vec::new(),
            target: "waterfall".into(),
            lost: "stamps 1 in 4 completion events".into(),
            percent: 2.0,
        });
        let text = render_drops(&d, 0.0);
        assert!(
            text.lines()
                .last()
                .is_some_and(|l| l.trim_start().starts_with("waterfall")),
            "a sampling step is named by its target: {text}"
        );
        assert!(
            text.starts_with("over the 0 % overhead budget; dropped:"),
            "{text}"
        );
        assert!(text.contains("kreturn_0") && text.contains("durations of rxe_rcv"));
    }
}

//! Guest tests of issue 14 (overhead budget): the start-up calibration, the estimate of what
//! tracing adds per round trip, `--probes` presets, and `--overhead-budget PCT --enforce`.
//!
//! The `--enforce` test detaches kprobes while the demo's traffic runs. Under QEMU TCG with one
//! host thread per vCPU, that has crashed the 6.1 guest kernel (kernel text patched while the
//! other vCPU runs it is the suspect). `cargo xtask test` runs that test alone, in its own boot
//! with both vCPUs in one TCG thread, where a patch is seen at once; it is `#[ignore]`d so
//! that the suites' boots leave it out.

use serde_json::Value;

use super::harness::{attached, demo_cq_events, find_by, rdma_trace, run_demo};

#[test]
fn run_reports_the_estimate_and_the_minimal_preset_attaches_fewer_probes() {
    let run = run_demo("poll", 300, &["--probes", "minimal"], "budget-minimal");
    run.assert_success("rdma-trace run");
    let (stdout, phase) = (&run.stdout, &run.report["phases"][0]);
    let attached: Vec<&str> = attached(phase)
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert!(attached.contains(&"rxe_cq_post"), "{attached:?}");
    for name in ["rxe_rcv", "rxe_requester", "__napi_poll"] {
        assert!(
            !attached.contains(&name),
            "{name} is not minimal: {attached:?}"
        );
    }
    assert!(stdout.contains("tracing adds ≈"), "{stdout}");
    assert!(
        stdout.contains("5 % overhead budget"),
        "the default budget is judged: {stdout}"
    );
    assert!(
        phase["dropped"].as_array().unwrap().is_empty(),
        "no --enforce"
    );
}

/// What one event-mode run of `preset` hit: the names of its attached probes, the JSON's hook
/// hits per round trip, and the same recomputed from the independent counts.
///
/// The independent truth: the kernel's own BPF run count of every attached program (the
/// kernel's run-time statistics, listed per program in the JSON), over the round trips the
/// demo timed itself (its client's `round_trip_us.count`). The loader only divides the one by
/// the other; here the division is done again from those two sources.
struct PresetRun {
    attached: Vec<String>,
    reported: f64,
    measured: f64,
    /// The run's phase, as the JSON has it.
    phase: Value,
}

fn event_run_with(preset: &str, iters: u64) -> PresetRun {
    let run = run_demo(
        "event",
        iters,
        &["--probes", preset],
        &format!("preset-{preset}"),
    );
    run.assert_success(&format!("rdma-trace run --probes {preset}"));
    assert_eq!(run.report["preset"], preset);
    let phase = &run.report["phases"][0];
    let reports = phase["demo"]["reports"].as_array().expect("demo reports");
    let client = find_by(reports, "role", "client").expect("the client's report");
    let round_trips = client["round_trip_us"]["count"]
        .as_u64()
        .unwrap_or_else(|| panic!("no round-trip count: {client}"));
    assert_eq!(round_trips, iters, "{client}");
    let runs: u64 = phase["overhead"]["programs"]
        .as_array()
        .expect("overhead.programs")
        .iter()
        .map(|p| p["runs"].as_u64().expect("runs"))
        .sum();
    let hits = &phase["overhead"]["hook_hits"];
    assert_eq!(hits["round_trips"].as_u64(), Some(round_trips), "{hits}");
    PresetRun {
        attached: attached(phase)
            .map(|p| p["name"].as_str().unwrap().to_owned())
            .collect(),
        reported: hits["per_round_trip"]
            .as_f64()
            .unwrap_or_else(|| panic!("no hook hits per round trip: {hits}")),
        measured: runs as f64 / round_trips as f64,
        phase: phase.clone(),
    }
}

/// Issue 23: the default preset is the lean one, `--probes full` attaches every row that can
/// attach here and hits our programs more often; the JSON's hook hits are the kernel's counts.
#[test]
fn the_default_preset_hits_fewer_hooks_than_full() {
    let iters = 1000;
    let default = event_run_with("default", iters);
    let full = event_run_with("full", iters);
    for (name, r) in [("default", &default), ("full", &full)] {
        assert!(
            (r.reported - r.measured).abs() <= 0.01 * r.measured,
            "{name}: the JSON says {:.1} hook hits per round trip, the kernel's run counts over the demo's round trips {:.1}",
            r.reported,
            r.measured
        );
    }
    assert!(
        default
            .attached
            .contains(&"ib_uverbs_comp_handler".to_owned())
            && default.attached.contains(&"rxe_cq_post".to_owned()),
        "the handler and rxe's CQ post: {:?}",
        default.attached
    );
    for name in &default.attached {
        assert!(full.attached.contains(name), "{name} not in full");
    }
    // Rows that attach on 6.1 and 6.12 (6.12 inlines rxe_responder).
    for name in ["wakeup", "rxe_rcv", "softirq NET_RX", "__napi_poll"] {
        assert!(
            full.attached.contains(&name.to_owned())
                && !default.attached.contains(&name.to_owned()),
            "{name}: default {:?}, full {:?}",
            default.attached,
            full.attached
        );
    }
    assert!(
        full.measured > default.measured,
        "full {:.1} hook hits per round trip, default {:.1}",
        full.measured,
        default.measured
    );
}

/// Issue 23's goal for the default: at most 40 hook hits per event-mode round trip, counted
/// as in [`the_default_preset_hits_fewer_hooks_than_full`]. The waterfall's programs on the
/// completion handler and on rxe's CQE post do the probe table's work there too, so the
/// table's rows of those functions must still count and time every call. The independent
/// truths: the demo's own counts, its completion events (`cq_events`, both sides) for the
/// handler's calls, and 4 CQEs per iteration (a send and a receive on each side) for rxe's
/// posts; and the kernel's run counts, which show that no second program runs on those hooks.
#[test]
fn the_default_preset_stays_within_40_hook_hits_per_round_trip() {
    let iters = 1000;
    let default = event_run_with("default", iters);
    assert!(
        default.measured <= 40.0,
        "{:.1} hook hits per round trip",
        default.measured
    );
    let row = |name: &str| {
        attached(&default.phase)
            .find(|p| p["name"] == name)
            .unwrap_or_else(|| panic!("no attached row {name}: {:?}", default.attached))
            .clone()
    };
    let events = demo_cq_events(&default.phase["demo"]);
    for (name, low, high) in [
        // A channel's last events can be left unread when the demo ends.
        ("ib_uverbs_comp_handler", events, events + 4),
        ("rxe_cq_post", 4 * iters, 4 * iters + 4),
    ] {
        let r = row(name);
        let count = r["count"].as_u64().expect("count");
        assert!(
            (low..=high).contains(&count),
            "{name}: {count} calls counted, the demo's own count gives {low}..={high}"
        );
        let timed = r["summary"]["count"].as_u64().expect("summary.count");
        let unmatched = r["unmatched"].as_u64().expect("unmatched");
        assert!(
            timed + unmatched == count && unmatched <= count / 100,
            "{name}: {timed} timed and {unmatched} unmatched of {count} calls"
        );
    }
    // One program per hook: the waterfall's, and the table's own only where the waterfall's
    // do not do its part (rxe_cq_post's return).
    let programs = default.phase["overhead"]["programs"]
        .as_array()
        .expect("overhead.programs");
    let on = |target: &str| -> Vec<&str> {
        programs
            .iter()
            .filter(|p| p["target"] == target)
            .map(|p| p["name"].as_str().unwrap())
            .collect()
    };
    let handler = on("ib_uverbs_comp_handler");
    assert!(
        handler.len() == 2 && handler.iter().all(|p| p.starts_with("wf_handler_")),
        "programs on ib_uverbs_comp_handler: {handler:?}"
    );
    let post = on("rxe_cq_post");
    assert!(
        post.len() == 2
            && post.contains(&"wf_rxe_cq_post")
            && post.iter().any(|p| p.starts_with("kreturn_")),
        "programs on rxe_cq_post: {post:?}"
    );
}

/// Run in its own boot with one TCG thread (`cargo xtask test`, see the module doc).
#[test]
#[ignore = "cargo xtask test runs it in a boot of its own, with one TCG thread"]
fn run_over_a_tight_budget_with_enforce_drops_probes_and_says_which() {
    let run = run_demo(
        "event",
        2000,
        &["--interval", "0.3", "--overhead-budget", "1", "--enforce"],
        "budget-enforce",
    );
    run.assert_success("rdma-trace run --enforce");
    let (stdout, stderr, report) = (&run.stdout, &run.stderr, &run.report);
    // The calibration measured every mechanism the guest has kprobes and raw tracepoints for.
    assert!(stderr.contains("calibration ("), "{stderr}");
    let mechanisms = report["calibration"]["mechanisms"]
        .as_array()
        .expect("calibration.mechanisms");
    for m in ["kprobe", "kretprobe", "raw_tp"] {
        let c = find_by(mechanisms, "mechanism", m)
            .unwrap_or_else(|| panic!("no {m} in {mechanisms:?}"));
        assert!(c["ns_per_hit"].is_number(), "{m} not measured: {c}");
    }
    assert_eq!(report["overhead_budget_percent"].as_f64(), Some(1.0));

    let phase = &report["phases"][0];
    let adds = &phase["overhead"]["tracing_adds"];
    assert!(adds["us_per_round_trip"].as_f64().unwrap() > 0.0, "{adds}");
    assert!(stdout.contains("tracing adds ≈"), "{stdout}");

    // Under emulation every probe costs far more than 1 % of a round trip: some were dropped,
    // named in the report with what was lost, and ran no more after the drop.
    let dropped = phase["dropped"].as_array().expect("dropped");
    assert!(!dropped.is_empty(), "nothing dropped: {phase}");
    assert!(
        stdout.contains("over the 1 % overhead budget; dropped:"),
        "{stdout}"
    );
    let left: Vec<&str> = phase["overhead"]["programs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert!(!left.is_empty(), "the cheapest program is always kept");
    for d in dropped {
        assert!(!d["lost"].as_str().unwrap().is_empty(), "{d}");
        let target = d["target"].as_str().unwrap();
        assert!(stdout.contains(target), "{target} not named in the report");
        for p in d["programs"].as_array().unwrap() {
            let p = p.as_str().unwrap();
            assert!(stdout.contains(p), "{p} not named in the report");
            assert!(!left.contains(&p), "{p} dropped but still attached");
        }
    }
    // Issue 23 item 5: the waterfall's programs cost the most under TCG, so the first step
    // stamps fewer of its events rather than drop a row; each such step is named, and every
    // event is still counted. The independent truth: the demo's own count of the completion
    // events it read.
    let steps: Vec<&Value> = dropped
        .iter()
        .filter(|d| d["target"] == "waterfall")
        .collect();
    assert!(
        !steps.is_empty(),
        "the waterfall's sampling was not raised: {dropped:?}"
    );
    for d in &steps {
        assert!(d["programs"].as_array().unwrap().is_empty(), "{d}");
        assert!(d["lost"].as_str().unwrap().contains("stamps 1 in"), "{d}");
    }
    let procs = phase["waterfall"]["processes"]
        .as_array()
        .expect("waterfall");
    let events: u64 = procs.iter().map(|p| p["events"].as_u64().unwrap()).sum();
    let stamped: u64 = procs.iter().map(|p| p["stamped"].as_u64().unwrap()).sum();
    let unmatched = phase["losses"]["unmatched_reads"]
        .as_u64()
        .expect("unmatched_reads");
    let cq_events = demo_cq_events(&phase["demo"]);
    assert!(
        stamped < events && events + unmatched == cq_events,
        "{stamped} stamped of {events} events and {unmatched} unmatched reads, the demo read {cq_events}"
    );
    assert!(
        stdout.contains("of them stamped, --sample-every"),
        "{stdout}"
    );
    // The demo itself was not disturbed by the drops: its client sent every message.
    let reports = phase["demo"]["reports"].as_array().expect("demo reports");
    let client = find_by(reports, "role", "client").expect("the client's report");
    assert_eq!(
        client["totals"]["messages_sent"].as_u64(),
        Some(2000),
        "{client}"
    );
}

/// `-v` says where start-up time went, step by step, before the probe table.
#[test]
fn run_v_says_where_the_start_up_time_went() {
    let out = rdma_trace(&[
        "run",
        "-v",
        "--no-tui",
        "--no-waterfall",
        "--mode",
        "poll",
        "-n",
        "20",
    ]);
    out.assert_success("rdma-trace run -v");
    let line = out
        .stderr
        .lines()
        .find_map(|l| l.strip_prefix("rdma-trace: start-up "))
        .unwrap_or_else(|| panic!("no start-up line:\n{}", out.stderr));
    // "2.41 s: attach 0.53 s, kernel facts and plan 0.46 s, …"
    let (total, steps) = line.split_once(" s: ").expect(line);
    let total: f64 = total.parse().expect(line);
    let steps: Vec<(&str, f64)> = steps
        .split(", ")
        .map(|s| {
            let (name, secs) = s.trim_end_matches(" s").rsplit_once(' ').expect(s);
            (name, secs.parse().expect(s))
        })
        .collect();
    for name in [
        "checks and devices",
        "kernel facts and plan",
        "object and maps",
        "attach",
        "calibration",
    ] {
        assert!(steps.iter().any(|(n, _)| *n == name), "no {name}: {line}");
    }
    let sum: f64 = steps.iter().map(|(_, s)| s).sum();
    // Each step is rounded to 10 ms; together they are the whole start-up.
    assert!(
        (sum - total).abs() <= 0.01 * steps.len() as f64 + 0.011,
        "steps add up to {sum}, not {total}: {line}"
    );
    let table = out.stderr.find("probes:").expect("probe table");
    assert!(
        out.stderr.find("start-up").unwrap() < table,
        "the start-up line comes before the probe table:\n{}",
        out.stderr
    );
}

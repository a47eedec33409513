//! Guest tests of issue 14 (overhead budget): the start-up calibration, the estimate of what
//! tracing adds per round trip, `--probes` presets, and `--overhead-budget PCT --enforce`.
//!
//! The `--enforce` test detaches kprobes while the demo's traffic runs. Under QEMU TCG with one
//! host thread per vCPU, that has crashed the 6.1 guest kernel (kernel text patched while the
//! other vCPU runs it is the suspect). `cargo xtask test` runs that test alone, in its own boot
//! with both vCPUs in one TCG thread, where a patch is seen at once; it is `#[ignore]`d so
//! that the suites' boots leave it out.

use super::harness::{attached, find_by, rdma_trace, run_demo};

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
        for p in d["programs"].as_array().unwrap() {
            let p = p.as_str().unwrap();
            assert!(stdout.contains(p), "{p} not named in the report");
            assert!(!left.contains(&p), "{p} dropped but still attached");
        }
    }
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

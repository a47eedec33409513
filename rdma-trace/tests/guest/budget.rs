//! Guest tests of issue 14 (overhead budget): the start-up calibration, the estimate of what
//! tracing adds per round trip, `--overhead-budget PCT --enforce`, and `--probes` presets.

use std::process::Command;

use serde_json::Value;

use super::{RDMA_TRACE, read_json, temp_json};

fn run(args: &[&str], name: &str) -> (String, String, Value) {
    let json = temp_json(name);
    let out = Command::new(RDMA_TRACE)
        .args(["run", "--no-tui"])
        .args(args)
        .arg("--json")
        .arg(&json)
        .output()
        .expect("run rdma-trace run");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "rdma-trace run failed ({}):\n{stderr}",
        out.status
    );
    (stdout, stderr, read_json(&json))
}

#[test]
fn run_over_a_tight_budget_with_enforce_drops_probes_and_says_which() {
    let (stdout, stderr, report) = run(
        &[
            "--mode",
            "event",
            "-i",
            "2000",
            "--interval",
            "0.3",
            "--overhead-budget",
            "1",
            "--enforce",
        ],
        "budget-enforce",
    );
    // The calibration measured every mechanism the guest has kprobes and raw tracepoints for.
    assert!(stderr.contains("calibration ("), "{stderr}");
    let mechanisms = report["calibration"]["mechanisms"]
        .as_array()
        .expect("calibration.mechanisms");
    for m in ["kprobe", "kretprobe", "raw_tp"] {
        let c = mechanisms
            .iter()
            .find(|c| c["mechanism"] == m)
            .unwrap_or_else(|| panic!("no {m} in {mechanisms:?}"));
        assert!(c["ns_per_hit"].is_number(), "{m} not measured: {c}");
    }
    // How long it took is a bench figure, not a test: only that it was recorded.
    assert!(report["calibration"]["took_ms"].as_f64().unwrap() > 0.0);
    assert_eq!(report["overhead_budget_percent"].as_f64(), Some(1.0));

    let phase = &report["phases"][0];
    let adds = &phase["overhead"]["tracing_adds"];
    assert!(adds["us_per_round_trip"].as_f64().unwrap() > 0.0, "{adds}");
    assert!(adds["percent"].as_f64().unwrap() > 0.0, "{adds}");
    assert!(stdout.contains("tracing adds ≈"), "{stdout}");
    assert!(stdout.contains("per round trip"), "{stdout}");

    // Under emulation every probe costs far more than 1 % of a round trip: some were dropped,
    // named in the report, and are no longer among the programs that ran.
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
}

#[test]
fn run_reports_the_estimate_and_the_minimal_preset_attaches_fewer_probes() {
    let (stdout, _, report) = run(
        &["--mode", "poll", "-i", "300", "--probes", "minimal"],
        "budget-minimal",
    );
    let phase = &report["phases"][0];
    let attached: Vec<&str> = phase["probes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["attach"].is_string())
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

//! Guest tests of issue 14 (overhead budget): the start-up calibration, the estimate of what
//! tracing adds per round trip, and `--probes` presets. `--enforce` has no guest test: it
//! detaches kprobes while traffic runs, which has crashed the 6.1 guest kernel under QEMU TCG
//! (README, "What does not work").

use super::harness::run_json;

#[test]
fn run_reports_the_estimate_and_the_minimal_preset_attaches_fewer_probes() {
    let run = run_json(
        &[
            "run", "--no-tui", "--mode", "poll", "-i", "300", "--probes", "minimal",
        ],
        "budget-minimal",
    );
    run.assert_success("rdma-trace run");
    let (stdout, phase) = (&run.stdout, &run.report["phases"][0]);
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

//! The smoke suite of the guest kernels that do not get the full suite (5.10 and the newest 7.x,
//! `cargo xtask test`): `run --mode both` with the completion waterfall, `run -- CMD`,
//! `probes --check`, and that nothing is left attached afterwards. What the kernel lacks must be
//! named: a row skipped gives its reason, a waterfall that is off says why. Runs in the QEMU test
//! bed (rxe0 on 10.9.0.1, rxe1 on 10.9.0.2); also on 6.1 and 6.12 with `cargo xtask vm`.

use std::path::Path;

use serde_json::Value;

const RDMA_TRACE: &str = env!("CARGO_BIN_EXE_rdma-trace");

// The smoke suite uses a few of the guest suite's helpers.
#[allow(dead_code, unused_imports)]
#[path = "guest/harness.rs"]
mod harness;
#[allow(dead_code)]
#[path = "guest/kill_on_drop.rs"]
mod kill_on_drop;

use harness::{
    assert_events_match_demo, bpf_programs, count, demo_processes, eventually, kprobes_strict,
    rdma_trace, run_demo, run_json,
};

/// The kernel has BTF for its modules (5.11 on): the waterfall can run.
fn has_module_btf() -> bool {
    Path::new("/sys/kernel/btf/ib_uverbs").is_file()
}

/// Nothing of rdma-trace is left behind: no kprobe, no BPF program, no demo. The kernel frees a
/// closed run's programs after an RCU grace period (7.x lists them for a moment longer), so each
/// is given the hardening suite's 10 s.
fn assert_clean(after: &str) {
    eventually(&format!("kprobes left after {after}"), || {
        let k = kprobes_strict();
        (!k.trim().is_empty()).then_some(k)
    });
    eventually(&format!("BPF programs left after {after}"), || {
        let p = bpf_programs();
        (!p.is_empty()).then(|| format!("{p:?}"))
    });
    eventually(&format!("rdma-demo left after {after}"), || {
        let d = demo_processes();
        (!d.is_empty()).then(|| format!("{d:?}"))
    });
}

/// Every row of a report's probe list says how it attached or why not.
fn assert_rows_explained(phase: &Value) {
    for p in phase["probes"].as_array().expect("probes") {
        let why = p["skipped"].as_str().unwrap_or("");
        assert!(
            p["attach"].is_string() != p["skipped"].is_string()
                && (p["attach"].is_string() || !why.is_empty()),
            "{p}"
        );
    }
}

#[test]
fn smoke_probes_check() {
    let out = rdma_trace(&["probes", "--check"]);
    out.assert_success("rdma-trace probes --check");
    let release = harness::kernel_release();
    assert!(
        out.stdout
            .contains(&format!("kernel {release}: kprobes yes")),
        "{}",
        out.stdout
    );
    let mut rows = 0;
    for line in out
        .stdout
        .lines()
        .skip_while(|l| !l.starts_with("PROBE"))
        .skip(1)
    {
        rows += 1;
        let explained = line.contains("attached by ")
            || line.split_once("skip (").is_some_and(|(_, why)| {
                why.split_once("): ")
                    .is_some_and(|(_, r)| !r.trim().is_empty())
            });
        assert!(explained, "a row without a decision or reason: {line}");
    }
    assert!(rows >= 10, "{}", out.stdout);
    for core in ["ib_uverbs_comp_handler ", "rxe_cq_post "] {
        let line = out
            .stdout
            .lines()
            .find(|l| l.starts_with(core))
            .expect(core);
        assert!(line.contains("attached by kprobe"), "{line}");
    }
    assert_clean("probes --check");
}

#[test]
fn smoke_run_both_modes_with_the_waterfall() {
    let iters = 200u64;
    let run = run_demo("both", iters, &[], "smoke-both");
    run.assert_success("rdma-trace run --mode both");
    let (poll, event) = (&run.report["phases"][0], &run.report["phases"][1]);
    assert_events_match_demo(poll, event, iters);
    for phase in [poll, event] {
        assert!(
            count(phase, "rxe_cq_post") >= 2 * iters,
            "{}",
            phase["mode"]
        );
        assert_rows_explained(phase);
    }
    if has_module_btf() {
        let procs = event["waterfall"]["processes"]
            .as_array()
            .unwrap_or_else(|| panic!("no waterfall on a kernel with module BTF: {}", run.stderr));
        let w = procs.first().expect("a process in the waterfall");
        let events = w["events"].as_u64().expect("events");
        assert!(events > 0, "{w}");
        assert_eq!(
            w["woken"].as_u64().unwrap() + w["awake"].as_u64().unwrap(),
            events,
            "{w}"
        );
        let comp = count(event, "ib_uverbs_comp_handler");
        assert!(
            events <= comp + 4,
            "{events} waterfall events, {comp} handler calls"
        );
        assert!(run.stdout.contains("waterfall of pid"), "{}", run.stdout);
    } else {
        // 5.10: no module BTF, so no offsets into ib_uverbs' types: off, and said why.
        assert!(event["waterfall"].is_null(), "{}", event["waterfall"]);
        let line = run
            .stderr
            .lines()
            .find(|l| l.starts_with("rdma-trace: completion waterfall off: "))
            .unwrap_or_else(|| panic!("the waterfall's absence is not explained: {}", run.stderr));
        assert!(line.contains("no module BTF"), "{line}");
    }
    assert!(
        run.stdout.contains("poll n") && run.stdout.contains("event n"),
        "{}",
        run.stdout
    );
    assert_clean("run --mode both");
}

#[test]
fn smoke_run_cmd_traces_the_bundled_demo() {
    let iters = "300";
    let mut args = vec!["run", "--no-tui", "--", "rdma-demo"];
    args.extend(rdma_demo::pingpong::loopback_args("rxe1", "rxe0"));
    args.extend(["--event", "-n", iters]);
    let out = run_json(&args, "smoke-cmd");
    out.assert_success("rdma-trace run -- rdma-demo");
    let phases = out.report["phases"].as_array().expect("phases");
    assert_eq!(phases.len(), 1, "a command run has one window");
    let phase = &phases[0];
    assert_eq!(
        out.report["load"]["kind"], "command",
        "{}",
        out.report["load"]
    );
    assert_eq!(phase["window"]["command_status"], 0);
    assert_eq!(phase["completion_mode"], "completion events");
    let handled = count(phase, "ib_uverbs_comp_handler");
    assert!(
        handled >= 300,
        "{handled} completion events for 300 round trips"
    );
    let read: u64 = phase["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .filter(|p| {
            p["comm"]
                .as_str()
                .is_some_and(|c| c.starts_with("rdma-demo"))
        })
        .map(|p| p["completion_events_read"].as_u64().unwrap_or(0))
        .sum();
    // A read takes one queued event, so reads beyond the handler's count can only be runs of
    // the handler's counting program that the kernel skipped, and the report must show them.
    // That program is the table's own entry program, or the waterfall's where the row says the
    // waterfall's programs do its work (`shared_hooks`).
    let handler_row = phase["probes"]
        .as_array()
        .expect("probes")
        .iter()
        .find(|p| p["name"] == "ib_uverbs_comp_handler")
        .expect("the handler's row");
    let shared_entry = handler_row["shared_hooks"]
        .as_array()
        .expect("shared_hooks")
        .iter()
        .any(|h| h["function"] == "ib_uverbs_comp_handler" && h["entry"] == true);
    let counting = |n: &str| {
        if shared_entry {
            n == "wf_handler_entry"
        } else {
            n.starts_with("kentry")
        }
    };
    let counters: Vec<&Value> = phase["overhead"]["programs"]
        .as_array()
        .expect("overhead.programs")
        .iter()
        .filter(|p| {
            p["target"] == "ib_uverbs_comp_handler" && p["name"].as_str().is_some_and(counting)
        })
        .collect();
    assert_eq!(
        counters.len(),
        1,
        "one program counts the handler: {counters:?}"
    );
    let missed = ["recursion_misses", "kprobe_misses"]
        .iter()
        .filter_map(|k| counters[0][k].as_u64())
        .sum::<u64>();
    let losses = &phase["losses"];
    eprintln!("{read} read, {handled} queued, {missed} handler runs missed; losses: {losses}");
    assert!(
        read > 0 && read <= handled + missed + 2,
        "{read} read, {handled} queued, {missed} runs of the handler's program missed: {}; losses: {losses}",
        phase["processes"]
    );
    assert_rows_explained(phase);
    assert_clean("run -- rdma-demo");
}

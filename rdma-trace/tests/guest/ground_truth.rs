//! The waterfall against a known cause: the time a busy loop takes from the demo must land in
//! the stages where a runnable reader waits for a CPU, not where the kernel does its work.
//!
//! The independent truth is the injected cause itself: a CPU hog pinned with the demo, at the
//! higher priority (nice -5), adds no work to the completion path (no handler, no wake-up, no read does
//! more), it only takes the CPU away from the demo's threads. So whatever time it adds must sit
//! between a thread becoming runnable and it getting the CPU back: in "run queue" (T2→T3) for
//! the woken events, and in "already awake" for the others. A waterfall
//! that took T3 from the wrong switch (or T2 from the wrong wake-up) would put that time in
//! "handler → wake-up" or "on CPU → read" and fail here. The demo's own CQ event counts check
//! that every event was seen once, also when its reader was starved.

use std::process::Command;

use serde_json::Value;

use super::{
    harness::{KillOnDrop, find_by, run_json},
    read_json, temp_json,
};

/// A stage's summed time (ns) over the threads of the run's waterfall processes.
fn stage_sum(phase: &Value, key: &str) -> f64 {
    processes(phase)
        .iter()
        .map(|p| {
            find_by(p["stages"].as_array().expect("stages"), "key", key)
                .unwrap_or_else(|| panic!("no stage {key} in {p}"))["sum_ns"]
                .as_f64()
                .expect("sum_ns")
        })
        .sum()
}

/// A per-process field of the waterfall (ns), summed: the already-awake events' time their
/// readers spent runnable off a CPU (`awake_runnable_sum_ns`) or on a CPU (`awake_on_cpu_sum_ns`).
fn awake_part(phase: &Value, key: &str) -> f64 {
    processes(phase)
        .iter()
        .map(|p| p[key].as_f64().unwrap_or_else(|| panic!("no {key} in {p}")))
        .sum()
}

fn awake_runnable(phase: &Value) -> f64 {
    awake_part(phase, "awake_runnable_sum_ns")
}

fn processes(phase: &Value) -> &Vec<Value> {
    phase["waterfall"]["processes"]
        .as_array()
        .unwrap_or_else(|| panic!("no waterfall: {phase}"))
}

/// Each demo thread's waterfall counts as many events as the demo took CQ events (the demo's
/// own count, from its JSON); the client is the main thread (tid = pid).
fn counts_match_the_demo(phase: &Value, demo: &Value, what: &str) {
    let procs = processes(phase);
    assert_eq!(procs.len(), 1, "{what}: one demo process: {procs:?}");
    let p = &procs[0];
    let reports = demo["reports"].as_array().expect("demo reports");
    for t in p["threads"].as_array().expect("threads") {
        let role = if t["tid"] == p["pid"] { 0 } else { 1 };
        let (got, want) = (&t["events"], &reports[role]["cq_events"]);
        assert_eq!(
            got, want,
            "{what}: the {} thread's waterfall counted {got} events, the demo took {want} CQ events",
            reports[role]["role"]
        );
    }
}

/// A copy of `rdma-demo` in memory (the guest's /tmp): run from the host's 9p share, the demo's
/// threads page their code in from it during the data phase, and sleep there (kernel stacks in
/// `p9_virtio_zc_request`, seen with ftrace in the 6.1 guest). With the hog starving the I/O's
/// completion on the demo's CPU, those sleeps grew into "asleep elsewhere": a cause of the
/// environment, not the injected one.
pub(super) fn demo_in_memory() -> &'static str {
    static COPY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    COPY.get_or_init(|| {
        let path = std::env::var_os("PATH").expect("PATH");
        let demo = std::env::split_paths(&path)
            .map(|d| d.join("rdma-demo"))
            .find(|p| p.is_file())
            .expect("rdma-demo on PATH");
        let copy = std::env::temp_dir().join(format!("rdma-demo-{}", std::process::id()));
        std::fs::copy(&demo, &copy).expect("copy rdma-demo to /tmp");
        copy.to_str().expect("a UTF-8 path").to_owned()
    })
}

/// `rdma-trace run -- taskset -c CPU rdma-demo pingpong ...` (event mode, the demo run from
/// memory): the demo pinned, the tracer not; the run's phase and the demo's own JSON.
fn pinned_run(cpu: &str, name: &str) -> (Value, Value) {
    let demo_json = temp_json(&format!("{name}-demo"));
    let mut args = vec![
        "run",
        "--no-tui",
        "--",
        "taskset",
        "-c",
        cpu,
        demo_in_memory(),
    ];
    args.extend(rdma_demo::pingpong::loopback_args("rxe1", "rxe0"));
    args.extend(["--mode", "event", "-n", "200", "--json"]);
    args.push(demo_json.to_str().expect("a UTF-8 path"));
    let run = run_json(&args, name);
    run.assert_success("rdma-trace run -- taskset rdma-demo");
    let demo = read_json(&demo_json);
    (run.report["phases"][0].clone(), demo)
}

/// The machine's last CPU, where the hog tests pin the demo and the hog.
pub(super) fn last_cpu() -> String {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    (cpus - 1).to_string()
}

/// The injected cause: a busy loop pinned to `cpu`, at nice -5, killed when dropped. At nice -5
/// the hog weighs 3 times the demo's threads. (At -20, 87 times: a 100-round-trip demo then
/// took 3 minutes under TCG.)
pub(super) fn cpu_hog(cpu: &str) -> KillOnDrop {
    let hog = KillOnDrop::spawn(Command::new("taskset").args([
        "-c",
        cpu,
        "sh",
        "-c",
        "while :; do :; done",
    ]));
    let renice = Command::new("renice")
        .args(["-n", "-5", "-p", &hog.id().to_string()])
        .status()
        .expect("run renice");
    assert!(renice.success(), "renice -5 the hog: {renice}");
    hog
}

#[test]
fn a_cpu_hog_pinned_with_the_demo_adds_its_time_where_readers_wait_for_a_cpu() {
    let cpu = last_cpu();
    let (base, base_demo) = pinned_run(&cpu, "truth-base");
    let hog = cpu_hog(&cpu);
    let (loaded, loaded_demo) = pinned_run(&cpu, "truth-hog");
    drop(hog);
    counts_match_the_demo(&base, &base_demo, "without the hog");
    counts_match_the_demo(&loaded, &loaded_demo, "with the hog");

    let delta = |key: &str| stage_sum(&loaded, key) - stage_sum(&base, key);
    let added = delta("total");
    let base_total = stage_sum(&base, "total");
    let sums = |phase: &Value| {
        let stages = ["wake", "runq", "read", "awake", "total"]
            .map(|k| format!("{k} {:.1} ms", stage_sum(phase, k) / 1e6))
            .join(", ");
        let short: u64 = processes(phase)
            .iter()
            .map(|p| p["awake_split_short"].as_u64().expect("awake_split_short"))
            .sum();
        format!(
            "{stages} (awake: runnable {:.1} ms, on CPU {:.1} ms; {short} events with more switches than kept)",
            awake_runnable(phase) / 1e6,
            awake_part(phase, "awake_on_cpu_sum_ns") / 1e6
        )
    };
    let evidence = format!(
        "without the hog: {}\nwith the hog: {}",
        sums(&base),
        sums(&loaded)
    );
    // The hog starves the demo: its completions take longer to be read (measured in the 6.1
    // guest with 100 round trips: 2.1 times as long in all).
    assert!(
        added > 0.5 * base_total,
        "the hog added less than half the summed T1→T4:\n{evidence}"
    );
    // Where a runnable reader waits for a CPU: woken events' run queue, and the events whose
    // reader was already awake (runnable, or on a CPU doing other work). Measured: 95 %.
    let waiting = delta("runq") + delta("awake");
    assert!(
        waiting >= 0.9 * added,
        "only {:.1} % of the added {:.1} ms is in run queue + already awake:\n{evidence}",
        100.0 * waiting / added,
        added / 1e6
    );
    // "Already awake" split by the reader's own switches: the hog's time is where the reader
    // was runnable but off its CPU (preempted), not where it was on a CPU doing other work.
    // A split that took its periods from the wrong thread, or missed the preemptions
    // (`prev_state` misread), puts it in the rest.
    let awake_added = delta("awake");
    let runnable_added = awake_runnable(&loaded) - awake_runnable(&base);
    eprintln!(
        "ground truth: {evidence}\nadded {:.1} ms, of it {:.1} ms already awake, {:.1} ms of that runnable",
        added / 1e6,
        awake_added / 1e6,
        runnable_added / 1e6
    );
    // Measured in the 6.1 guest with the demo run from memory, where already awake takes
    // 4–47 % of the added time: 53–70 % of it runnable (run from the 9p share, 31–71 %: its
    // code was paged in during the data phase). On 6.12 the hog's time lands in the run queue;
    // already awake takes 2–11 % of it, and of that only 8–91 % is runnable, the rest "asleep
    // elsewhere" (mostly each thread's first event, raised before its first read, from which
    // alone its periods were kept; now they are kept from its first arm: docs/waterfall.md),
    // so the split is held to the truth where it carries the hog's time.
    if awake_added >= 0.25 * added {
        assert!(
            runnable_added >= 0.5 * awake_added,
            "only {:.1} ms of the {:.1} ms the hog added to already awake is in its runnable part:\n{evidence}",
            runnable_added / 1e6,
            awake_added / 1e6
        );
    }
    // Not where the kernel works: handler → wake-up and on CPU → read. Measured: 1.3 %.
    let working = delta("wake").abs() + delta("read").abs();
    assert!(
        working <= 0.1 * added,
        "{:.1} % of the added {:.1} ms moved into handler → wake-up or on CPU → read:\n{evidence}",
        100.0 * working / added,
        added / 1e6
    );
}

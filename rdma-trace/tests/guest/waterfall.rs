//! Guest tests of the completion waterfall (`rdma-trace run`, JSON `phases[].waterfall`).

use std::process::Command;

use serde_json::Value;

use super::{
    RDMA_TRACE,
    harness::{demo_cq_events, find_by, read_json, run_demo, run_json, run_json_with, temp_json},
    stamps::stamps,
};

/// `a` within 1 % of `b` (and both positive).
fn within_1pct(a: f64, b: f64) -> bool {
    a > 0.0 && b > 0.0 && (a - b).abs() <= b / 100.0
}

fn processes(phase: &Value) -> &Vec<Value> {
    phase["waterfall"]["processes"]
        .as_array()
        .unwrap_or_else(|| panic!("no waterfall in {}", phase["mode"]))
}

fn stage<'a>(w: &'a Value, key: &str) -> &'a Value {
    find_by(w["stages"].as_array().expect("stages"), "key", key)
        .unwrap_or_else(|| panic!("no stage {key}"))
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"))
}

/// Checks that hold for every waterfall (a process's or a thread's).
fn check_partition(who: &str, w: &Value) {
    let events = u(&w["events"]);
    assert!(events > 0, "{who}: no events");
    assert_eq!(u(&w["woken"]) + u(&w["awake"]), events, "{who}: {w}");
    // The stage means add up to the directly measured mean T1→T4 (within 1 %).
    let per_event: f64 = ["wake", "runq", "read", "awake"]
        .iter()
        .map(|k| stage(w, k)["sum_ns"].as_f64().unwrap())
        .sum::<f64>()
        / events as f64;
    let total = w["total_mean_ns"].as_f64().expect("total mean");
    assert!(
        within_1pct(per_event, total),
        "{who}: stages add up to {per_event} ns per event, measured T1→T4 mean {total} ns"
    );
    assert_eq!(u(&stage(w, "total")["count"]), events, "{who}");
    // Woken events have the three woken stages, the others the awake one.
    for k in ["wake", "runq", "read"] {
        assert_eq!(u(&stage(w, k)["count"]), u(&w["woken"]), "{who}: stage {k}");
    }
    assert_eq!(u(&stage(w, "awake")["count"]), u(&w["awake"]), "{who}");
    // The placement classes add up to the total.
    let placed: u64 = w["placement"]
        .as_array()
        .expect("placement")
        .iter()
        .map(|p| u(&p["count"]))
        .sum();
    assert_eq!(
        placed, events,
        "{who}: placement classes {}",
        w["placement"]
    );
    let on_cpu: u64 = w["waiter_cpus"]
        .as_object()
        .expect("waiter_cpus")
        .values()
        .map(u)
        .sum();
    assert_eq!(on_cpu, events, "{who}: {}", w["waiter_cpus"]);
}

#[test]
fn waterfall_stages_add_up_and_each_thread_gets_its_own_cq_events() {
    let run = run_demo("both", 300, &["--sample", "200"], "waterfall-both");
    run.assert_success("rdma-trace run");
    let (report, stdout) = (&run.report, &run.stdout);
    let (poll, event) = (&report["phases"][0], &report["phases"][1]);
    assert!(
        processes(poll).is_empty(),
        "no completion event is read in poll mode: {}",
        poll["waterfall"]
    );
    let procs = processes(event);
    assert_eq!(procs.len(), 1, "one demo process: {procs:?}");
    let p = &procs[0];
    check_partition("the demo", p);
    // The demo runs its client in the main thread (tid = pid), its server in another; the JSON
    // reports come client first.
    let reports = event["demo"]["reports"].as_array().expect("demo reports");
    let threads = p["threads"].as_array().expect("threads");
    assert_eq!(threads.len(), 2, "client and server threads: {threads:?}");
    for t in threads {
        check_partition(&format!("thread {}", t["tid"]), t);
    }
    let client = threads
        .iter()
        .find(|t| t["tid"] == p["pid"])
        .expect("the client (main) thread");
    let server = threads
        .iter()
        .find(|t| t["tid"] != p["pid"])
        .expect("the server thread");
    for (t, r) in [(client, &reports[0]), (server, &reports[1])] {
        let got = u(&t["events"]) as f64;
        let want = u(&r["cq_events"]) as f64;
        assert!(
            within_1pct(got, want),
            "{} thread: waterfall counted {got} events, the demo took {want} CQ events",
            r["role"]
        );
    }
    assert_eq!(u(&p["unmatched_reads"]), 0, "{p}");
    // The waterfall's own programs are in the self-cost table.
    let progs = event["overhead"]["programs"].as_array().expect("programs");
    for name in [
        "wf_handler_entry",
        "wf_sched_waking",
        "wf_sched_switch",
        "wf_read_return",
    ] {
        let prog = find_by(progs, "name", name)
            .unwrap_or_else(|| panic!("{name} not in the overhead table: {progs:?}"));
        assert!(u(&prog["runs"]) > 0, "{prog}");
    }
    // rxe stamps T0 (rxe_cq_post) for the events it raised.
    assert!(
        u(&stage(p, "driver")["count"]) * 2 > u(&p["events"]),
        "driver stamps: {}",
        stage(p, "driver")
    );
    // Per-event samples: ordered stamps, stages that add up, bounded by --sample.
    let samples = report["waterfall_samples"].as_array().expect("samples");
    assert!(
        !samples.is_empty() && samples.len() <= 200,
        "{}",
        samples.len()
    );
    for s in samples {
        let t1 = u(&s["t1"]);
        let t4 = u(&s["t4"]);
        assert!(t1 <= t4, "{s}");
        if s["woken"] == true {
            let (t2, t3) = (u(&s["t2"]), u(&s["t3"]));
            assert!(t1 <= t2 && t2 <= t3 && t3 <= t4, "{s}");
            assert_eq!((t2 - t1) + (t3 - t2) + (t4 - t3), t4 - t1);
        } else {
            assert!(s["t2"].is_null() && s["t3"].is_null(), "{s}");
        }
        assert_eq!(s["pid"], p["pid"], "{s}");
    }
    assert!(
        stdout.contains("waterfall of pid") && stdout.contains("CPU placement"),
        "{stdout}"
    );
    assert!(
        stdout.contains("event mode adds") && stdout.contains("run-queue wait"),
        "the explanation by stage:\n{stdout}"
    );
}

#[test]
fn waterfall_of_a_pinned_demo_shows_its_cpu_for_every_on_cpu_stage() {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let cpu = (cpus - 1).to_string();
    let run = run_json_with(
        Command::new("taskset").args(["-c", &cpu, RDMA_TRACE]),
        &["run", "--no-tui", "--mode", "event", "-n", "200"],
        "waterfall-pinned",
    );
    run.assert_success("taskset rdma-trace run");
    let phase = &run.report["phases"][0];
    let p = &processes(phase)[0];
    check_partition("the pinned demo", p);
    let events = u(&p["events"]);
    for key in ["waiter_cpus", "read_cpus"] {
        assert_eq!(
            p[key].as_object().expect(key).len(),
            1,
            "{key}: {} (pinned to CPU {cpu})",
            p[key]
        );
        assert_eq!(u(&p[key][&cpu]), events, "{key}: {}", p[key]);
    }
}

/// Whether the guest kernel reports kprobe misses in `bpf_link_info` (Linux 6.7).
fn kernel_reports_kprobe_misses() -> bool {
    let release = super::harness::kernel_release();
    let mut v = release.split(|c: char| !c.is_ascii_digit());
    let mut next = || v.next().and_then(|s| s.parse::<u32>().ok()).unwrap_or(0);
    (next(), next()) >= (6, 7)
}

/// `rdma-trace run --no-tui EXTRA -- sh SCRIPT DIR` with the shell script `body` (DIR is `$1`,
/// a fresh temporary directory for what the load writes), run to its end: its outcome and DIR.
fn run_script(
    name: &str,
    extra: &[&str],
    body: &str,
) -> (super::harness::Outcome, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("rdma-trace-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let script = dir.join("load.sh");
    std::fs::write(&script, body).expect("script");
    let run = run_json(
        &[
            &["run", "--no-tui"],
            extra,
            &["--", "sh", script.to_str().unwrap(), dir.to_str().unwrap()],
        ]
        .concat(),
        name,
    );
    run.assert_success(&format!("rdma-trace run -- sh {name}.sh"));
    (run, dir)
}

/// A demo a load script started as `sh -c 'echo $$ > "$0.pid"; exec rdma-demo ... --json "$0"'`:
/// its pid (from `JSON.pid`) and its JSON report.
fn demo_pid_and_json(json: &std::path::Path) -> (u64, Value) {
    let pid = std::fs::read_to_string(json.with_extension("json.pid"))
        .expect("pid file")
        .trim()
        .parse()
        .expect("pid");
    let demo = serde_json::from_slice(&std::fs::read(json).expect("demo JSON")).expect("JSON");
    (pid, demo)
}

#[test]
fn three_concurrent_event_mode_pairs_each_get_their_own_count() {
    // Three loopback ping-pongs at once (client and server threads each), with different
    // iteration counts; each writes its pid and its JSON results.
    let (run, dir) = run_script(
        "waterfall-three",
        &[],
        r#"set -e
for n in 150 300 450; do
  sh -c 'echo $$ > "$0.pid"; exec rdma-demo pingpong --loopback --port 0 -d rxe1 --server-device rxe0 --mode event -n "$1" --json "$0"' "$1/demo-$n.json" "$n" &
done
wait
"#,
    );
    let report = &run.report["phases"][0];
    let procs = report["waterfall"]["processes"]
        .as_array()
        .expect("waterfall processes");
    assert_eq!(procs.len(), 3, "three demo processes: {procs:?}");
    for n in [150, 300, 450] {
        let (pid, demo) = demo_pid_and_json(&dir.join(format!("demo-{n}.json")));
        let cq_events = demo_cq_events(&demo);
        let p = find_by(procs, "pid", pid)
            .unwrap_or_else(|| panic!("no waterfall for pid {pid} (-n {n}): {procs:?}"));
        check_partition(&format!("pid {pid}"), p);
        let got = u(&p["events"]) as f64;
        assert!(
            within_1pct(got, cq_events as f64),
            "pid {pid} (-n {n}): waterfall counted {got} events, the demo took {cq_events} CQ events"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// More reader threads than the waterfall has slots for (31, and a shared last one): 17
/// loopback ping-pongs at once in event mode, each a server and a client thread that read
/// completion events. The independent truth is the load's own: the threads whose demo took
/// CQ events. The run must report, in its JSON and on its first lines, that the threads beyond
/// the 31 slots were mixed into pid 0, and a run after it (a fresh load of the programs) must
/// find every slot free again. The loader frees an exited thread's slot at its next refresh:
/// with one refresh an hour, none is freed during the load, whose threads then overlap in
/// full (the next test frees them).
#[test]
fn more_reader_threads_than_slots_are_counted_and_reported() {
    const DEMOS: usize = 17;
    const SLOTS: u64 = 31;
    let (run, dir) = run_script(
        "waterfall-slots",
        &["--interval", "3600"],
        &format!(
            r#"set -e
i=0
while [ $i -lt {DEMOS} ]; do
  rdma-demo pingpong --loopback --port 0 -d rxe1 --server-device rxe0 --mode event -n 200 --json "$1/demo-$i.json" > /dev/null &
  i=$((i + 1))
done
wait
"#
        ),
    );
    // The truth: every side (thread) of every demo that took CQ events read them.
    let mut readers = 0u64;
    let mut cq_events = 0u64;
    for i in 0..DEMOS {
        let demo: Value = serde_json::from_slice(
            &std::fs::read(dir.join(format!("demo-{i}.json"))).expect("demo JSON"),
        )
        .expect("JSON");
        for side in demo["reports"].as_array().expect("demo reports") {
            let n = u(&side["cq_events"]);
            cq_events += n;
            readers += u64::from(n > 0);
        }
    }
    assert!(
        readers > SLOTS,
        "the load must have more reader threads than slots: {readers}"
    );
    let phase = &run.report["phases"][0];
    let losses = &phase["losses"];
    eprintln!("{readers} reader threads, {cq_events} CQ events; losses: {losses}");
    assert_eq!(
        u(&losses["threads_without_slot"]),
        readers - SLOTS,
        "threads beyond the slots: {losses}"
    );
    let procs = processes(phase);
    let shared = find_by(procs, "pid", 0)
        .unwrap_or_else(|| panic!("no pid 0 (threads beyond the slots): {procs:?}"));
    assert!(u(&shared["events"]) > 0, "{shared}");
    // Every event the demos read is in the waterfall or counted lost: read unmatched, or its
    // return missed (seen when the thread reads again, so each thread's last read may be
    // neither), or its read's entry skipped by the kernel (a recursion miss).
    let events: u64 = procs.iter().map(|p| u(&p["events"])).sum();
    let accounted = events + u(&losses["unmatched_reads"]) + u(&losses["read_returns_missed"]);
    let entries_skipped = losses["recursion_misses"]["wf_read_entry"]
        .as_u64()
        .unwrap_or(0);
    assert!(
        accounted.abs_diff(cq_events) <= readers + entries_skipped,
        "{cq_events} CQ events read by the demos; the waterfall has {events} and counts {} unmatched and {} missed returns",
        losses["unmatched_reads"],
        losses["read_returns_missed"]
    );
    // From 6.7 the kernel counts the kretprobe's misses itself: at least the returns the
    // programs saw missed (less those the kernel skipped running the program for), and at most
    // one more per thread (a thread's last missed read is not seen by the programs).
    let ours = u(&losses["read_returns_missed"]);
    let kernel = &losses["kprobe_misses"]["wf_read_return"];
    if kernel_reports_kprobe_misses() {
        let kernel = u(kernel);
        let skipped = losses["recursion_misses"]["wf_read_return"]
            .as_u64()
            .unwrap_or(0);
        assert!(
            ours <= kernel + skipped && kernel <= ours + readers,
            "the kernel counts {kernel} missed returns, the programs {ours}: {losses}"
        );
    } else {
        assert!(losses["kprobe_misses"].is_null(), "{losses}");
    }
    let lost_line = run
        .stdout
        .lines()
        .find(|l| l.starts_with("lost: "))
        .unwrap_or_else(|| panic!("no lost: line in\n{}", run.stdout));
    assert!(
        lost_line.contains(&format!(
            "{} threads beyond the {SLOTS} thread slots",
            readers - SLOTS
        )),
        "{lost_line}"
    );
    let _ = std::fs::remove_dir_all(&dir);

    // A fresh run has every slot free.
    let after = run_demo("event", 50, &[], "waterfall-slots-after");
    after.assert_success("rdma-trace run --mode event -n 50");
    assert_eq!(
        u(&after.report["phases"][0]["losses"]["threads_without_slot"]),
        0,
        "{}",
        after.report["phases"][0]["losses"]
    );
}

/// Reader threads that come and go: 17 loopback ping-pongs one after the other in event mode,
/// 34 reader threads in all, more than the 31 slots, but never more than two alive at once.
/// Each exited thread's slot is freed at the loader's next refresh (1 s), so every thread gets
/// a slot of its own: no thread is mixed into pid 0, and each demo process's waterfall counts
/// the CQ events that demo took (its own JSON, the independent truth). Without the freeing,
/// the last 3 threads would share the last slot. The script waits half a second after each
/// demo: a warm guest runs a 40-iteration demo in about 80 ms, so 17 of them fitted between two
/// refreshes, and no slot could be freed in time (seen on 6.12 right after another test).
#[test]
fn reader_threads_that_exit_free_their_slots_for_the_next_ones() {
    const DEMOS: usize = 17;
    let (run, dir) = run_script(
        "waterfall-slots-freed",
        &[],
        &format!(
            r#"set -e
i=0
while [ $i -lt {DEMOS} ]; do
  sh -c 'echo $$ > "$0.pid"; exec rdma-demo pingpong --loopback --port 0 -d rxe1 --server-device rxe0 --mode event -n 40 --json "$0" > /dev/null' "$1/demo-$i.json"
  sleep 0.5
  i=$((i + 1))
done
"#
        ),
    );
    let phase = &run.report["phases"][0];
    let losses = &phase["losses"];
    assert_eq!(
        u(&losses["threads_without_slot"]),
        0,
        "every thread had a slot of its own: {losses}"
    );
    let procs = processes(phase);
    assert!(
        find_by(procs, "pid", 0).is_none(),
        "no thread shared the last slot: {procs:?}"
    );
    let mut readers = 0;
    for i in 0..DEMOS {
        let (pid, demo) = demo_pid_and_json(&dir.join(format!("demo-{i}.json")));
        let cq_events = demo_cq_events(&demo);
        readers += demo["reports"]
            .as_array()
            .expect("demo reports")
            .iter()
            .filter(|r| u(&r["cq_events"]) > 0)
            .count();
        let p = find_by(procs, "pid", pid)
            .unwrap_or_else(|| panic!("no waterfall for demo {i} (pid {pid}): {procs:?}"));
        let got = u(&p["events"]) as f64;
        assert!(
            within_1pct(got, cq_events as f64),
            "demo {i} (pid {pid}): the waterfall counted {got} events, the demo took {cq_events} CQ events"
        );
        let threads = p["threads"].as_array().map_or(1, Vec::len);
        assert!(threads <= 2, "demo {i}: {threads} threads: {p}");
    }
    assert!(readers > 31, "the load had {readers} reader threads");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A program that lets completion events pile up on its channel past the waterfall's 16-deep
/// mirror of it (`rdma-demo --fault-unread-events N`: its client polls the first N completions
/// with the CQ armed, leaving each event queued, then reads them all in one burst). The truths:
/// the demo's own count of the events it read in that burst, and its own stamps of its posts.
/// The text report's `lost:` line names a loss whose text holds `says`.
fn assert_lost_line_says(stdout: &str, says: &str) {
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("lost:") && l.contains(says)),
        "no lost: line says {says:?}:\n{stdout}"
    );
}

/// Every event past the mirror's 16 is counted as lost, twice (not kept, and its read
/// unmatched), and the 16 that were kept are the oldest: the burst's first read gets the first
/// event's handler time, from the client's first round trip (the kernel hands events out
/// oldest first; a mirror that dropped its oldest would give it the 33rd's).
#[test]
fn events_piled_up_past_the_mirror_are_counted_and_the_kept_ones_are_the_oldest() {
    let demo_json = temp_json("overflow-demo");
    let demo_json_arg = demo_json.to_str().expect("a UTF-8 path").to_owned();
    let mut args = vec!["run", "--no-tui", "--sample", "1000", "--", "rdma-demo"];
    args.extend(rdma_demo::pingpong::loopback_args("rxe1", "rxe0"));
    args.extend([
        "-e",
        "-n",
        "100",
        "--stamps",
        "1000",
        "--fault-unread-events",
        "48",
        "--json",
        &demo_json_arg,
    ]);
    let run = run_json(&args, "overflow");
    run.assert_success("rdma-trace run -- rdma-demo --fault-unread-events 48");
    let demo = read_json(&demo_json);
    let client = find_by(
        demo["reports"].as_array().expect("reports"),
        "role",
        "client",
    )
    .expect("the client's report");
    let burst = u(&client["cq_events_burst"]);
    assert!(burst > 24, "the burst must overflow the mirror: {client}");
    let phase = &run.report["phases"][0];
    let losses = &phase["losses"];
    assert_eq!(u(&losses["queue_overflow"]), burst - 16, "{losses}");
    assert_eq!(u(&losses["unmatched_reads"]), burst - 16, "{losses}");
    assert_lost_line_says(&run.stdout, "mirror was full");
    // The client thread's first sampled event is the burst's first read (it read nothing
    // before): its T1 lies in the client's first round trip, between its first two posts.
    let tid = u(&client["stamps"]["tid"]);
    let (_, posts) = stamps(client);
    let first = run.report["waterfall_samples"]
        .as_array()
        .expect("waterfall_samples")
        .iter()
        .filter(|s| u(&s["tid"]) == tid)
        .min_by_key(|s| u(&s["t4"]))
        .expect("a sampled event of the client");
    let t1 = u(&first["t1"]);
    assert!(
        posts[0] < t1 && t1 < posts[1],
        "the burst's first read got T1 {t1}, not from the first round trip (posts at {}, {}, …): {first}",
        posts[0],
        posts[1]
    );
}

/// A queue mirror put out of step is found against the kernel's queue and put back in step,
/// counted. The injected cause (`RDMA_TRACE_FAULT_MIRROR_PHANTOMS=5`): at each side's 100th
/// handler call, the mirror counts 5 events the kernel never queued, as when the kernel drops a
/// handler call's event (a closed channel, no memory) or two CPUs' updates race. Without the
/// check, each later read of those channels would be paired with the handler call of the event
/// 5 before its own. Independent truths: the demo's own CQ event counts, and its round trips:
/// a correctly paired event's T1→T4 (handler → read return) lies inside one of the client's
/// round trips, so the mean T1→T4 stays below the mean round trip; paired 5 events off, it is
/// several round trips.
#[test]
fn a_mirror_out_of_step_with_the_kernels_queue_is_put_back_and_counted() {
    const PHANTOMS: u64 = 5;
    let mut cmd = Command::new(RDMA_TRACE);
    cmd.env("RDMA_TRACE_FAULT_MIRROR_PHANTOMS", PHANTOMS.to_string());
    let run = run_json_with(
        &mut cmd,
        &["run", "--no-tui", "--mode", "event", "-n", "1000"],
        "mirror-resync",
    );
    run.assert_success("rdma-trace run --mode event -n 1000 with phantom events");
    let phase = &run.report["phases"][0];
    let losses = &phase["losses"];
    // Each channel's mirror holds its real events and 5 more; reads take one each (the reads
    // that met a phantom before the check count as unmatched), and the check drops what is
    // left once the kernel's queue is empty: 5 per channel, both sides' channels.
    let (resynced, unmatched) = (u(&losses["mirror_resynced"]), u(&losses["unmatched_reads"]));
    assert_eq!(resynced, 2 * PHANTOMS, "{losses}");
    assert!(
        (1..=2 * PHANTOMS).contains(&unmatched),
        "reads that met a phantom before the check: {losses}"
    );
    let procs = processes(phase);
    assert_eq!(procs.len(), 1, "{procs:?}");
    let p = &procs[0];
    let cq_events = demo_cq_events(&phase["demo"]);
    let events = u(&p["events"]);
    assert!(
        events + unmatched == cq_events,
        "the waterfall's events ({events}) and unmatched reads ({unmatched}) against the demo's CQ events ({cq_events})"
    );
    let reports = phase["demo"]["reports"].as_array().expect("demo reports");
    let client = find_by(reports, "role", "client").expect("the client's report");
    let rtt_ns = client["round_trip_us"]["t_avg"].as_f64().expect("t_avg") * 1000.0;
    let t1_t4 = p["total_mean_ns"].as_f64().expect("total mean");
    assert!(
        t1_t4 < rtt_ns,
        "mean T1→T4 {t1_t4} ns is not inside the client's mean round trip {rtt_ns} ns: events paired with older handler calls; {losses}"
    );
    assert_lost_line_says(&run.stdout, "back in step");
}

/// Issue 23 item 4: `--sample-every 4` stamps 1 in 4 of each channel's events and counts
/// every one. The independent truths: the demo's own count of the completion events each side
/// read (`reports[].cq_events`), and the client's own mean round trip, which bounds a correctly
/// paired event's T1→T4.
#[test]
fn sample_every_n_counts_every_event_and_stamps_one_in_n() {
    const N: u64 = 4;
    let run = run_demo(
        "event",
        1000,
        &["--sample-every", &N.to_string()],
        "sample-every",
    );
    run.assert_success("rdma-trace run --sample-every 4");
    let phase = &run.report["phases"][0];
    let procs = processes(phase);
    assert_eq!(procs.len(), 1, "{procs:?}");
    let p = &procs[0];
    let reports = phase["demo"]["reports"].as_array().expect("demo reports");
    let threads = p["threads"].as_array().expect("threads");
    assert_eq!(threads.len(), 2, "client and server threads: {threads:?}");
    assert_eq!(
        u(&phase["losses"]["unmatched_reads"]),
        0,
        "{}",
        phase["losses"]
    );
    for t in threads {
        let who = format!("thread {}", t["tid"]);
        let role = if t["tid"] == p["pid"] {
            "client"
        } else {
            "server"
        };
        let r = find_by(reports, "role", role).expect("the side's report");
        let (events, stamped) = (u(&t["events"]), u(&t["stamped"]));
        // Every event counted: the side's own count (a channel's last event may be unread).
        let cq_events = u(&r["cq_events"]);
        assert!(
            events <= cq_events && events + 1 >= cq_events,
            "{who}: {events} events counted, the {role} read {cq_events}"
        );
        // One channel per side, its events numbered from 0: event k is stamped when k % 4 == 0.
        assert!(
            stamped.abs_diff(events.div_ceil(N)) <= 1,
            "{who}: {stamped} of {events} events stamped with --sample-every {N}"
        );
        // The stages are over the stamped events only.
        assert_eq!(u(&t["woken"]) + u(&t["awake"]), stamped, "{who}: {t}");
        assert_eq!(u(&stage(t, "total")["count"]), stamped, "{who}");
    }
    let client = find_by(reports, "role", "client").expect("the client's report");
    let rtt_ns = client["round_trip_us"]["t_avg"].as_f64().expect("t_avg") * 1000.0;
    let t1_t4 = p["total_mean_ns"].as_f64().expect("total mean");
    assert!(
        t1_t4 > 0.0 && t1_t4 < rtt_ns,
        "mean T1→T4 {t1_t4} ns of the stamped events is not inside the client's mean round trip {rtt_ns} ns"
    );
    assert!(
        run.stdout.contains("of them stamped, --sample-every"),
        "the report says the stages are over the stamped events:\n{}",
        run.stdout
    );
}

/// One process with two CQs: the loopback ping-pong's client thread waits on its CQ on rxe1,
/// its server thread on its own on rxe0. The process's waterfall has one row per CQ. Independent
/// truths: each side's own count of the CQ events it read (`reports[].cq_events`, with its
/// device), and RDMA netlink's list of the process's CQs (`rdma res show cq`: device, cqn, and
/// as `pid` the id of the thread that made the CQ), taken while the demo runs.
#[test]
fn a_process_with_two_cqs_has_a_waterfall_row_per_cq() {
    let demo_json = temp_json("two-cqs-demo");
    let res_json = temp_json("two-cqs-res");
    let demo = [
        &["rdma-demo"][..],
        &rdma_demo::pingpong::loopback_args("rxe1", "rxe0"),
        &["--mode", "event", "-n", "3000", "--json"],
    ]
    .concat()
    .join(" ");
    // The CQs are listed once both exist (each side makes its own before the exchange).
    let script = format!(
        r#"{demo} {dj} & d=$!
i=0
while [ $i -lt 400 ]; do
  rdma -j res show cq > {rj}
  [ "$(grep -o '"comm":"rdma-demo' {rj} | wc -l)" -ge 2 ] && break
  i=$((i+1)); sleep 0.05
done
wait $d"#,
        dj = demo_json.display(),
        rj = res_json.display(),
    );
    let run = run_json(&["run", "--no-tui", "--", "sh", "-c", &script], "two-cqs");
    run.assert_success("rdma-trace run -- the loopback demo with rdma res show cq");
    let demo = read_json(&demo_json);
    let res = read_json(&res_json);
    let _ = std::fs::remove_file(&res_json);
    let procs = processes(&run.report["phases"][0]);
    let p = procs
        .iter()
        .find(|p| {
            p["comm"]
                .as_str()
                .is_some_and(|c| c.starts_with("rdma-demo"))
        })
        .unwrap_or_else(|| panic!("no rdma-demo process in {procs:?}"));
    let pid = u(&p["pid"]);
    let tids: Vec<u64> = p["threads"]
        .as_array()
        .expect("threads")
        .iter()
        .map(|t| u(&t["tid"]))
        .collect();
    let mut listed: Vec<(String, u64)> = res
        .as_array()
        .expect("rdma res show cq: a list")
        .iter()
        .filter(|c| {
            c["pid"]
                .as_u64()
                .is_some_and(|t| t == pid || tids.contains(&t))
        })
        .map(|c| {
            (
                c["ifname"].as_str().expect("ifname").to_owned(),
                u(&c["cqn"]),
            )
        })
        .collect();
    listed.sort();
    let rows = p["cqs"].as_array().expect("cqs");
    eprintln!(
        "two CQs: rows {rows:?}; rdma res show cq of pid {pid} (threads {tids:?}): {listed:?}"
    );
    let mut labelled: Vec<(String, u64)> = rows
        .iter()
        .map(|c| {
            (
                c["device"].as_str().expect("device").to_owned(),
                u(&c["cq"]),
            )
        })
        .collect();
    labelled.sort();
    assert_eq!(
        labelled, listed,
        "the waterfall's CQ rows of pid {pid} against rdma res show cq: {res}"
    );
    for r in demo["reports"].as_array().expect("demo reports") {
        let device = r["device"].as_str().expect("device");
        let row = rows
            .iter()
            .find(|c| c["device"] == device)
            .unwrap_or_else(|| panic!("no CQ row on {device}: {rows:?}"));
        assert_eq!(
            row["events"], r["cq_events"],
            "the {} side's CQ on {device}: the row counted {} events, the demo read {}",
            r["role"], row["events"], r["cq_events"]
        );
        let (woken, total) = (
            u(&row["woken"]),
            row["total_mean_ns"].as_f64().expect("mean"),
        );
        assert!(woken > 0 && total > 0.0, "{row}");
    }
    let events: u64 = rows.iter().map(|c| u(&c["events"])).sum();
    assert_eq!(
        events,
        u(&p["events"]),
        "the rows split the process's events"
    );
}

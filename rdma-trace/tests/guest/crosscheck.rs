//! The completion waterfall against a second tracer: bpftrace, run at the same time, measures
//! what rdma-trace measures on its own, keyed another way.
//!
//! rdma-trace pairs each read with its handler call through the per-channel queue mirror (the
//! read takes the channel's oldest event), splits that span into stages, and splits an
//! already-awake event's span by the reader's kept scheduler periods. The scripts below know
//! nothing of queues or events:
//! - handler → read: a wake-up that runs inside `ib_uverbs_comp_handler` on a CPU is keyed by
//!   the thread it wakes, and that thread's next return from `ib_uverbs_comp_event_read` ends
//!   the span. Per thread, the woken events' count and summed handler → read (rdma-trace: the
//!   woken events' wake-up + run queue + read stages) must agree with bpftrace's.
//! - already awake: bpftrace logs every switch of the demo's threads; from that log, each
//!   sampled already-awake event's T1→T4 splits into the time its reader was runnable (switched
//!   out runnable, until its switch-in), on a CPU, and asleep. rdma-trace's sums must agree.
//!
//! The bench image has bpftrace; `cargo xtask test` runs these tests in a boot of it on each
//! kernel of the guest suites.

use std::{
    collections::BTreeMap,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;

use super::{
    ground_truth::{cpu_hog, demo_in_memory, last_cpu},
    harness::{find_by, run_demo, run_json, signal},
    kill_on_drop::KillOnDrop,
};

/// Handler → read per woken thread, from bpftrace's own stamps: the handler's entry time on
/// this CPU, taken by the first wake-up it makes of a thread, given back at that thread's next
/// read return.
const HANDLER_TO_READ: &str = r#"
kprobe:ib_uverbs_comp_handler { @in[cpu] = nsecs; }
kretprobe:ib_uverbs_comp_handler { delete(@in[cpu]); }
tracepoint:sched:sched_waking /@in[cpu] != 0 && @t1[args->pid] == 0/ { @t1[args->pid] = @in[cpu]; }
kretprobe:ib_uverbs_comp_event_read /@t1[tid] != 0/ {
  @n[tid] = count();
  @sum[tid] = sum(nsecs - @t1[tid]);
  delete(@t1[tid]);
}
END { clear(@in); clear(@t1); }
"#;

/// Every switch and wake-up of the demo's threads (`rdma-demo…` by name): `O tid ns
/// prev_state` when one leaves its CPU, `I tid ns` when one gets it, `W tid ns` when one is
/// woken.
const SWITCHES: &str = r#"
tracepoint:sched:sched_switch /strncmp(args->prev_comm, "rdma-demo", 9) == 0/ { printf("O %d %llu %d\n", args->prev_pid, nsecs, args->prev_state); }
tracepoint:sched:sched_switch /strncmp(args->next_comm, "rdma-demo", 9) == 0/ { printf("I %d %llu\n", args->next_pid, nsecs); }
tracepoint:sched:sched_waking /strncmp(args->comm, "rdma-demo", 9) == 0/ { printf("W %d %llu\n", args->pid, nsecs); }
"#;

/// How far the two tracers may disagree on handler → read: the woken events' count by 2 %
/// (a wake-up that raced with a read which was already taking its event is one tracer's woken
/// event and the other's already awake) and by the wake-ups the kernel's recursion guard
/// skipped (counted in `losses`), the mean by 10 % and 20 µs (each tracer's own programs run
/// inside the other's span: under TCG a program run is a few µs).
const COUNT_SHARE: f64 = 0.02;
const MEAN_SHARE: f64 = 0.10;
const MEAN_SLACK_NS: f64 = 20_000.0;

/// How far the already-awake split's runnable and on-CPU sums may be from bpftrace's: a tenth
/// of the already-awake time (each switch is stamped by both tracers' programs, one after the
/// other; under a hog, a vCPU can stall between them).
const SPLIT_SHARE: f64 = 0.10;

/// bpftrace running `script` (with a `BEGIN` that says when every probe is attached), its
/// standard output in a file; [`Bpftrace::stop`] ends it and returns what it printed.
struct Bpftrace {
    child: KillOnDrop,
    out: std::path::PathBuf,
}

impl Bpftrace {
    fn start(script: &str) -> Self {
        let out = std::env::temp_dir().join(format!("crosscheck-{}.txt", std::process::id()));
        let file = std::fs::File::create(&out).expect("bpftrace's output file");
        // BEGIN runs once every other probe is attached.
        let script = format!("BEGIN {{ printf(\"ready\\n\"); }}\n{script}");
        let mut child = KillOnDrop::spawn(
            Command::new("bpftrace")
                .args(["-e", &script])
                .stdout(file)
                .stderr(Stdio::inherit()),
        );
        let started = Instant::now();
        while !std::fs::read_to_string(&out)
            .unwrap_or_default()
            .contains("ready")
        {
            assert!(
                started.elapsed() < Duration::from_secs(120),
                "bpftrace attached nothing in 2 minutes"
            );
            if let Some(status) = child.try_wait().expect("wait for bpftrace") {
                panic!("bpftrace ended before it attached ({status})");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Self { child, out }
    }

    /// SIGINT: bpftrace prints its maps and exits.
    fn stop(mut self) -> String {
        assert!(signal(&self.child, "-INT"), "signal bpftrace");
        let status = self.child.wait().expect("wait for bpftrace");
        assert!(status.success(), "bpftrace: {status}");
        let printed = std::fs::read_to_string(&self.out).expect("bpftrace's output");
        let _ = std::fs::remove_file(&self.out);
        printed
    }
}

/// bpftrace's maps as printed at its exit: `@n[TID]: N` and `@sum[TID]: NS`.
fn per_thread(out: &str, map: &str) -> BTreeMap<u64, u64> {
    let prefix = format!("@{map}[");
    out.lines()
        .filter_map(|l| {
            let rest = l.trim().strip_prefix(&prefix)?;
            let (tid, value) = rest.split_once("]: ")?;
            Some((tid.parse().ok()?, value.trim().parse().ok()?))
        })
        .collect()
}

fn stage_sum(t: &Value, key: &str) -> u64 {
    find_by(t["stages"].as_array().expect("stages"), "key", key)
        .unwrap_or_else(|| panic!("no stage {key}: {t}"))["sum_ns"]
        .as_u64()
        .expect("sum_ns")
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"))
}

/// The demo's threads in a run's waterfall (one process, client and server threads).
fn demo_threads(phase: &Value) -> &Vec<Value> {
    let procs = phase["waterfall"]["processes"]
        .as_array()
        .expect("waterfall processes");
    assert_eq!(procs.len(), 1, "one demo process: {procs:?}");
    let threads = procs[0]["threads"].as_array().expect("threads");
    assert_eq!(threads.len(), 2, "client and server threads: {threads:?}");
    threads
}

/// The wake-ups the kernel skipped running `wf_sched_waking` for (its recursion guard).
fn skipped_wake_ups(phase: &Value) -> u64 {
    phase["losses"]["recursion_misses"]["wf_sched_waking"]
        .as_u64()
        .unwrap_or(0)
}

/// Per thread of `phase`: its woken events' count and mean handler → read against bpftrace's
/// (`printed`, from [`HANDLER_TO_READ`]).
fn handler_to_read_agrees(phase: &Value, printed: &str) {
    let (n, sum) = (per_thread(printed, "n"), per_thread(printed, "sum"));
    let skipped = skipped_wake_ups(phase) as f64;
    for t in demo_threads(phase) {
        let tid = u(&t["tid"]);
        let woken = u(&t["woken"]);
        let ours = stage_sum(t, "wake") + stage_sum(t, "runq") + stage_sum(t, "read");
        let (Some(&bt_n), Some(&bt_sum)) = (n.get(&tid), sum.get(&tid)) else {
            panic!("bpftrace saw no woken read of thread {tid}");
        };
        let mean = |s: u64, c: u64| s as f64 / c.max(1) as f64;
        let (our_mean, bt_mean) = (mean(ours, woken), mean(bt_sum, bt_n));
        eprintln!(
            "crosscheck: thread {tid}: rdma-trace {woken} woken, handler → read mean {:.1} us; bpftrace {bt_n}, {:.1} us; {skipped} wake-ups skipped",
            our_mean / 1e3,
            bt_mean / 1e3
        );
        assert!(woken > 100, "thread {tid}: only {woken} woken events: {t}");
        assert!(
            (woken as f64 - bt_n as f64).abs() <= COUNT_SHARE * bt_n as f64 + 1.0 + skipped,
            "thread {tid}: rdma-trace counted {woken} woken events, bpftrace {bt_n} ({skipped} wake-ups skipped)"
        );
        assert!(
            (our_mean - bt_mean).abs() <= MEAN_SHARE * bt_mean + MEAN_SLACK_NS,
            "thread {tid}: handler → read of the woken events: rdma-trace {:.1} us, bpftrace {:.1} us",
            our_mean / 1e3,
            bt_mean / 1e3
        );
    }
}

#[test]
#[ignore = "needs bpftrace: cargo xtask test runs it in a boot of the bench image"]
fn handler_to_read_per_thread_agrees_with_bpftrace() {
    let bpftrace = Bpftrace::start(HANDLER_TO_READ);
    let run = run_demo("event", 300, &[], "crosscheck");
    run.assert_success("rdma-trace run --mode event");
    let printed = bpftrace.stop();
    handler_to_read_agrees(&run.report["phases"][0], &printed);
}

/// What a thread's scheduler event in bpftrace's log makes it.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Became {
    /// Switched in: on a CPU.
    On,
    /// Switched out without a sleep bit (0, or 0x100 and up for preemption): runnable.
    Preempted,
    /// Switched out with a sleep bit: asleep.
    Slept,
    /// Woken: runnable, if it was asleep.
    Woken,
}

/// Per thread, its scheduler events from bpftrace's log, in time order.
type Log = BTreeMap<u64, Vec<(u64, Became)>>;

fn scheduler_log(printed: &str) -> Log {
    let mut by_tid: Log = BTreeMap::new();
    for line in printed.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let num = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok());
        let became = match (f.first().copied(), num(3)) {
            (Some("I"), _) => Became::On,
            (Some("W"), _) => Became::Woken,
            (Some("O"), Some(state)) if state & 0xff == 0 => Became::Preempted,
            (Some("O"), Some(_)) => Became::Slept,
            _ => continue,
        };
        if let (Some(tid), Some(t)) = (num(1), num(2)) {
            by_tid.entry(tid).or_default().push((t, became));
        }
    }
    for v in by_tid.values_mut() {
        v.sort_unstable();
    }
    by_tid
}

/// bpftrace's split of `t1`..`t4` for thread `tid`: (runnable, on a CPU, asleep) in ns, or
/// `None` when its log has no event of the thread before `t1` (its state then is unknown).
fn split_from_log(log: &Log, tid: u64, t1: u64, t4: u64) -> Option<[u64; 3]> {
    const RUNNABLE: usize = 0;
    const ON: usize = 1;
    const ASLEEP: usize = 2;
    let events = log.get(&tid)?;
    let mut now: Option<usize> = None;
    let (mut parts, mut at) = ([0u64; 3], t1);
    for &(t, b) in events.iter().take_while(|e| e.0 < t4) {
        if t > t1 {
            parts[now?] += t - at;
            at = t;
        }
        now = match (now, b) {
            (_, Became::On) => Some(ON),
            (_, Became::Preempted) => Some(RUNNABLE),
            (_, Became::Slept) => Some(ASLEEP),
            (Some(ASLEEP), Became::Woken) => Some(RUNNABLE),
            (n, Became::Woken) => n,
        };
    }
    parts[now?] += t4 - at;
    Some(parts)
}

/// A known cause, with a second tracer to check it: a CPU hog pinned with the demo (as in the
/// ground-truth test) makes its readers wait for their CPU, so many events find their reader
/// awake, preempted. bpftrace logs every switch and wake-up of the demo's threads; the sampled
/// already-awake events' runnable and on-CPU time, from that log, must match rdma-trace's
/// split, and the handler → read of the woken events must still agree.
#[test]
#[ignore = "needs bpftrace: cargo xtask test runs it in a boot of the bench image"]
fn already_awake_split_agrees_with_bpftraces_switch_log_under_a_cpu_hog() {
    let cpu = last_cpu();
    let hog = cpu_hog(&cpu);
    let bpftrace = Bpftrace::start(&format!("{HANDLER_TO_READ}{SWITCHES}"));
    let mut args = vec![
        "run",
        "--no-tui",
        "--sample",
        "100000",
        "--",
        "taskset",
        "-c",
        &cpu,
        demo_in_memory(),
    ];
    args.extend(rdma_demo::pingpong::loopback_args("rxe1", "rxe0"));
    args.extend(["--mode", "event", "-n", "300"]);
    let run = run_json(&args, "crosscheck-hog");
    run.assert_success("rdma-trace run -- taskset rdma-demo");
    let printed = bpftrace.stop();
    drop(hog);
    let phase = &run.report["phases"][0];
    handler_to_read_agrees(phase, &printed);

    let log = scheduler_log(&printed);
    let samples = run.report["waterfall_samples"]
        .as_array()
        .expect("waterfall_samples");
    let events: u64 = demo_threads(phase).iter().map(|t| u(&t["events"])).sum();
    assert_eq!(samples.len() as u64, events, "every event sampled");
    let (mut ours, mut theirs, mut span, mut awake, mut unknown) =
        ([0u64; 3], [0u64; 3], 0u64, 0u64, 0u64);
    for s in samples.iter().filter(|s| s["woken"] == false) {
        let (tid, t1, t4) = (u(&s["tid"]), u(&s["t1"]), u(&s["t4"]));
        let Some(parts) = split_from_log(&log, tid, t1, t4) else {
            unknown += 1;
            continue;
        };
        awake += 1;
        span += t4 - t1;
        let (run, on, unkept) = (
            u(&s["awake_runnable_ns"]),
            u(&s["awake_on_cpu_ns"]),
            u(&s["awake_unkept_ns"]),
        );
        ours[0] += run;
        ours[1] += on;
        ours[2] += (t4 - t1).saturating_sub(run + on + unkept);
        for (a, b) in theirs.iter_mut().zip(parts) {
            *a += b;
        }
    }
    let ms = |v: [u64; 3]| v.map(|ns| format!("{:.1}", ns as f64 / 1e6)).join(" / ");
    let evidence = format!(
        "{awake} already-awake events ({unknown} before bpftrace's first switch of their reader), {:.1} ms; runnable / on a CPU / asleep, ms: rdma-trace {}, bpftrace {}",
        span as f64 / 1e6,
        ms(ours),
        ms(theirs)
    );
    eprintln!("crosscheck: {evidence}");
    assert!(
        awake >= 20,
        "the hog left too few already-awake events to compare: {evidence}"
    );
    let slack = SPLIT_SHARE * span as f64;
    for (i, what) in ["runnable", "on a CPU"].iter().enumerate() {
        assert!(
            (ours[i] as f64 - theirs[i] as f64).abs() <= slack,
            "already awake, {what}: rdma-trace and bpftrace disagree by more than {:.0} % of it: {evidence}",
            100.0 * SPLIT_SHARE
        );
    }
    // Asleep: where bpftrace saw the reader asleep, or a wake-up the kernel skipped for both.
    assert!(
        ours[2] as f64 <= theirs[2] as f64 + slack,
        "rdma-trace has its readers asleep elsewhere where bpftrace had them runnable or on a CPU: {evidence}"
    );
}

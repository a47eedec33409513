//! Guest tests: run inside the QEMU test bed (`cargo xtask vm`), which has kprobes and two
//! Soft-RoCE devices, rxe0 (on veth end va, 10.9.0.1) and rxe1 (on vb, 10.9.0.2), whose RoCE
//! traffic crosses the IP stack. `cargo xtask test` builds this target (`test = false`) and runs
//! it in the 6.1 and 6.12 guests.

use std::{
    io::Read as _,
    path::PathBuf,
    process::{Child, Command, ExitStatus, Output, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;

use harness::{
    KillOnDrop, assert_events_match_demo, attached, count, demo_cq_events, demo_processes, find_by,
    loopback_pingpong, probe, rdma_trace, read_json, run_demo, run_json_with, signal, stderr_until,
    temp_json,
};

const RDMA_TRACE: &str = env!("CARGO_BIN_EXE_rdma-trace");

#[path = "guest/budget.rs"]
mod budget;
#[path = "guest/consumers.rs"]
mod consumers;
#[path = "guest/crosscheck.rs"]
mod crosscheck;
#[path = "guest/ground_truth.rs"]
mod ground_truth;
mod guest_drivers;
mod guest_ebpf_log;
#[path = "guest/hardening.rs"]
mod hardening;
#[path = "guest/harness.rs"]
mod harness;
#[path = "guest/kill_on_drop.rs"]
mod kill_on_drop;

#[path = "guest/export.rs"]
mod export;
#[path = "guest/exposition.rs"]
mod exposition;
#[path = "guest/nfs.rs"]
mod nfs;
#[path = "guest/nvme.rs"]
mod nvme;
#[path = "guest/privileges.rs"]
mod privileges;
#[path = "guest/stall.rs"]
mod stall;
#[path = "guest/stamps.rs"]
mod stamps;
#[path = "guest/workload.rs"]
mod workload;

/// Index of the RoCE v2 GID of `dev` that maps IPv4 address `ip` (from sysfs).
fn roce_v2_gid_index(dev: &str, ip: [u8; 4]) -> u32 {
    let want = format!(
        "0000:0000:0000:0000:0000:ffff:{:02x}{:02x}:{:02x}{:02x}",
        ip[0], ip[1], ip[2], ip[3]
    );
    let port = PathBuf::from(format!("/sys/class/infiniband/{dev}/ports/1"));
    for i in 0..16 {
        let gid = std::fs::read_to_string(port.join(format!("gids/{i}"))).unwrap_or_default();
        let kind =
            std::fs::read_to_string(port.join(format!("gid_attrs/types/{i}"))).unwrap_or_default();
        if gid.trim() == want && kind.trim() == "RoCE v2" {
            return i;
        }
    }
    panic!("{dev} has no RoCE v2 GID for {ip:?} (is this the rxe guest?)");
}

fn wait_timeout(child: &mut Child, limit: Duration) -> ExitStatus {
    try_wait_timeout(child, limit).unwrap_or_else(|| {
        let _ = child.kill();
        panic!("process did not finish within {limit:?}")
    })
}

/// The child's status, or `None` when it is still running after `limit`.
fn try_wait_timeout(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return Some(status);
        }
        if start.elapsed() > limit {
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Wait until a TCP socket listens on `port` (so the ping-pong client does not race the server).
fn wait_listening(port: u16) {
    let needle = format!(":{port:04X} 00000000:0000 0A");
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(20) {
        let tcp = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default()
            + &std::fs::read_to_string("/proc/net/tcp6").unwrap_or_default();
        if tcp.contains(&needle) {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("nothing listens on TCP port {port}");
}

fn net_rx_total() -> u64 {
    let text = std::fs::read_to_string("/proc/softirqs").expect("/proc/softirqs");
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with("NET_RX:"))
        .expect("NET_RX line");
    line.split_whitespace()
        .skip(1)
        .map(|v| v.parse::<u64>().unwrap_or(0))
        .sum()
}

/// Registered kprobes (perf and tracefs ones alike) and tracefs kprobe events. Panics when they
/// cannot be read, rather than pass as none.
fn kprobes_left() -> String {
    harness::kprobes_strict()
}

/// `ibv_rc_pingpong` between rxe1 (server) and rxe0 (client), the client under
/// `rdma-trace funclat ib_uverbs_comp_handler`; returns the report.
fn pingpong_under_funclat(event: bool, port: u16, iters: u32) -> Value {
    let g0 = roce_v2_gid_index("rxe0", [10, 9, 0, 1]).to_string();
    let g1 = roce_v2_gid_index("rxe1", [10, 9, 0, 2]).to_string();
    let port_s = port.to_string();
    let iters_s = iters.to_string();
    let mode: &[&str] = if event { &["-e"] } else { &[] };
    let mut server = KillOnDrop::spawn(
        Command::new("ibv_rc_pingpong")
            .args(["-d", "rxe1", "-g", &g1, "-n", &iters_s, "-p", &port_s])
            .args(mode)
            .stdout(Stdio::null()),
    );
    wait_listening(port);
    let json = temp_json(&format!("funclat-{port}"));
    let mut tracer = KillOnDrop::spawn(
        Command::new(RDMA_TRACE)
            .args([
                "funclat",
                "ib_uverbs_comp_handler",
                "--json",
                json.to_str().unwrap(),
                "--",
            ])
            .args([
                "ibv_rc_pingpong",
                "-d",
                "rxe0",
                "-g",
                &g0,
                "-n",
                &iters_s,
                "-p",
                &port_s,
            ])
            .args(mode)
            .arg("127.0.0.1"),
    );
    let traced = wait_timeout(&mut tracer, Duration::from_secs(120));
    let served = wait_timeout(&mut server, Duration::from_secs(30));
    assert!(
        traced.success(),
        "rdma-trace funclat (with the client) failed: {traced}"
    );
    assert!(served.success(), "ibv_rc_pingpong server failed: {served}");
    read_json(&json)
}

fn comp_handler_calls(report: &Value) -> u64 {
    let f = &report["functions"][0];
    assert_eq!(f["name"], "ib_uverbs_comp_handler");
    assert_eq!(f["attach"], "kprobe");
    assert_eq!(report["window"]["ended_by"], "command");
    assert_eq!(report["window"]["command_status"], 0);
    f["count"].as_u64().expect("count")
}

#[test]
fn funclat_event_mode_calls_ib_uverbs_comp_handler() {
    let iters = 500;
    let before = net_rx_total();
    let report = pingpong_under_funclat(true, 18601, iters);
    let net_rx = net_rx_total() - before;
    let calls = comp_handler_calls(&report);
    assert!(
        calls >= u64::from(iters),
        "only {calls} calls for {iters} event-mode iterations: {report}"
    );
    let f = &report["functions"][0];
    assert_eq!(f["summary"]["count"], f["count"], "every call timed: {f}");
    assert_eq!(f["unmatched"], 0, "{f}");
    // RoCE between rxe0 and rxe1 crosses the IP stack over the veth pair.
    assert!(
        net_rx >= u64::from(iters),
        "NET_RX rose by {net_rx} only: traffic took rxe's loopback?"
    );
    assert_eq!(kprobes_left(), "", "kprobes left behind");
}

#[test]
fn funclat_poll_mode_never_calls_ib_uverbs_comp_handler() {
    let before = net_rx_total();
    let report = pingpong_under_funclat(false, 18602, 500);
    assert_eq!(
        comp_handler_calls(&report),
        0,
        "poll mode must not take completion events: {report}"
    );
    assert!(
        net_rx_total() - before >= 500,
        "the ping-pong's packets did not cross NET_RX"
    );
}

#[test]
fn run_both_modes_between_rxe0_and_rxe1() {
    let iters = 200u64;
    // Every row that attaches here (the default has no wakeup, NET_RX, NAPI or rxe_rcv).
    let run = run_demo("both", iters, &["--probes", "full"], "run-both");
    run.assert_success("rdma-trace run");
    let (report, stdout) = (&run.report, &run.stdout);
    assert_eq!(report["load"]["demo"]["server_device"], "rxe0");
    assert_eq!(report["load"]["demo"]["client_device"], "rxe1");
    let (poll, event) = (&report["phases"][0], &report["phases"][1]);
    assert_events_match_demo(poll, event, iters);
    assert_eq!(probe(event, "ib_uverbs_comp_handler")["attach"], "kprobe");
    assert!(count(event, "wakeup") > 0);
    for phase in [poll, event] {
        for name in [
            "softirq NET_RX",
            "__napi_poll",
            "napi_poll packets",
            "rxe_udp_encap_recv",
            "rxe_rcv",
            "rxe_cq_post",
        ] {
            assert!(
                count(phase, name) >= iters,
                "{name} in {}: {}",
                phase["mode"],
                probe(phase, name)
            );
        }
        assert_eq!(
            count(phase, "rxe_poll_cq"),
            0,
            "user space polls the mapped CQ"
        );
        // Every probe says how it attached or why not.
        for p in phase["probes"].as_array().unwrap() {
            assert!(p["attach"].is_string() != p["skipped"].is_string(), "{p}");
        }
        assert_eq!(phase["window"]["command_status"], 0);
        assert!(
            phase["demo"].is_object(),
            "the demo's own results are embedded: {phase}"
        );
    }
    assert!(
        stdout.contains("=== Results ==="),
        "the demo's results block is shown:\n{stdout}"
    );
    assert!(
        stdout.contains("poll n") && stdout.contains("event n"),
        "side-by-side table:\n{stdout}"
    );
    assert_eq!(kprobes_left(), "", "kprobes left behind after exit");
    assert!(demo_processes().is_empty(), "rdma-demo left running");
}

#[test]
fn run_cleans_up_after_sigterm() {
    let mut child = KillOnDrop::spawn(
        Command::new(RDMA_TRACE)
            .args(["run", "--mode", "event", "--no-tui", "-n", "1000000"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped()),
    );
    // Wait until the probes are attached and the demo is in its data phase.
    let start = Instant::now();
    while !kprobes_left().contains("ib_uverbs_comp_handler")
        || !demo_processes()
            .iter()
            .any(|c| c.trim() == "rdma-demo:data")
    {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "run never attached / started the demo"
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "rdma-trace run exited early"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(signal(&child, "-TERM"));
    let status = wait_timeout(&mut child, Duration::from_secs(30));
    assert!(!status.success(), "interrupted run must exit non-zero");
    assert_eq!(kprobes_left(), "", "kprobes left behind after SIGTERM");
    assert!(
        demo_processes().is_empty(),
        "rdma-demo left running after SIGTERM"
    );
}

#[test]
fn run_with_unknown_device_names_the_available_ones() {
    let out = rdma_trace(&["run", "--no-tui", "-d", "nosuch0"]);
    out.assert_fails_in_one_line(3, "available: rxe0, rxe1");
}

// ---- rdma-trace verify: socket syscalls per phase

/// `rdma-trace verify ARGS --json`; returns (exit code, stdout + stderr, report or Null).
fn verify(args: &[&str], name: &str) -> (Option<i32>, String, Value) {
    let out = run_json_with(
        Command::new(RDMA_TRACE).stdin(Stdio::inherit()),
        &[&["verify"], args].concat(),
        name,
    );
    (out.status.code(), out.stdout + &out.stderr, out.report)
}

fn calls(phase: &Value, class: &str) -> u64 {
    phase[class]
        .as_array()
        .unwrap_or_else(|| panic!("no {class} in {phase}"))
        .iter()
        .map(|c| c["calls"].as_u64().unwrap())
        .sum()
}

fn names(phase: &Value, class: &str) -> Vec<String> {
    phase[class]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["syscall"].as_str().unwrap().to_owned())
        .collect()
}

/// Fails the test unless `named` (syscalls) holds each of `all` and one of `any` at least;
/// `context` (where they come from) goes into the message.
fn assert_named(named: &[String], all: &[&str], any: &[&str], context: &str) {
    for want in all {
        assert!(
            named.iter().any(|n| n == want),
            "{want} not named: {named:?}\n{context}"
        );
    }
    assert!(
        named.iter().any(|n| any.contains(&n.as_str())),
        "none of {any:?} named: {named:?}\n{context}"
    );
}

/// verify passes for `demo` in both modes: no socket call in the data phase, while the
/// setup phase shows the TCP exchange (so sockets were recognised) and the data phase shows
/// the demo's RDMA doorbells.
fn verify_passes(demo: &str, iters: &str) {
    for mode in ["poll", "event"] {
        let (code, text, report) = verify(
            &["--demo", demo, "--mode", mode, "-n", iters],
            &format!("verify-{demo}-{mode}"),
        );
        assert_eq!(code, Some(0), "{demo} {mode}:\n{text}");
        assert!(
            text.contains("data phase: 0 socket syscalls, "),
            "{demo} {mode}: no verdict\n{text}"
        );
        let phases = report["phases"].as_array().expect("phases");
        let (setup, data, teardown) = (&phases[0], &phases[1], &phases[2]);
        assert_eq!(data["phase"], "data");
        assert_eq!(calls(data, "socket"), 0, "{demo} {mode}: {data}");
        assert_eq!(report["data_phase_clean"], true);
        // The TCP exchange, and a write to its socket, in setup.
        assert_named(
            &names(setup, "socket"),
            &["socket", "setsockopt"],
            &["write", "sendto"],
            &format!("{demo} {mode}: setup {setup}"),
        );
        // rxe: every posted send is a write on the uverbs descriptor.
        assert!(
            calls(data, "rdma") >= iters.parse::<u64>().unwrap(),
            "{demo} {mode}: too few RDMA calls in the data phase: {data}"
        );
        assert!(
            calls(setup, "rdma") > 0 && calls(teardown, "rdma") > 0,
            "{demo} {mode}: resources are created in setup and destroyed in teardown: {setup} {teardown}"
        );
    }
    assert!(demo_processes().is_empty(), "a demo outlived verify");
}

#[test]
fn verify_pingpong_data_phase_uses_no_socket() {
    verify_passes("pingpong", "50");
}

#[test]
fn verify_write_read_data_phase_uses_no_socket() {
    verify_passes("write-read", "20");
}

#[test]
fn verify_atomic_data_phase_uses_no_socket() {
    verify_passes("atomic", "10");
}

#[test]
fn verify_fails_and_names_the_calls_when_the_data_phase_sends_over_tcp() {
    let (code, text, report) = verify(
        &["-n", "20", "--", "--inject-fault", "tcp-in-data"],
        "verify-tcp-in-data",
    );
    assert_eq!(code, Some(10), "{text}");
    let data = &report["phases"][1];
    // std's TcpStream::write is send(2), i.e. sendto on x86_64.
    assert_named(
        &names(data, "socket"),
        &["socket", "connect"],
        &["write", "sendto", "sendmsg"],
        &text,
    );
    assert_eq!(report["data_phase_clean"], false);
    let verdict = text
        .lines()
        .find(|l| l.starts_with("data phase: "))
        .unwrap_or_else(|| panic!("no verdict in\n{text}"));
    assert!(
        verdict.contains("connect ×1") && !verdict.starts_with("data phase: 0 socket"),
        "{verdict}"
    );
}

#[test]
fn verify_reports_a_failing_demo_as_such() {
    // rdma-demo exits 3 for an unknown device; verify reports that (exit 11, no verdict), with
    // the demo's status and message.
    let (code, text, report) = verify(&["-d", "rxe9"], "verify-rxe9");
    assert_eq!(code, Some(11), "{text}");
    assert!(
        text.contains("failed with status 3 (no or unknown RDMA device)"),
        "{text}"
    );
    assert!(text.contains("rxe9"), "{text}");
    assert!(report.is_null(), "no verdict for a failed demo: {report}");
    assert!(demo_processes().is_empty());
}

/// The attach targets of a probe of the JSON report, as the overhead block names them, and the
/// number of programs on each: kernel-function probes are named after their function (entry
/// and return programs); `wakeup` spans two functions; softirq, IRQ and NAPI probes use raw
/// tracepoints (one program each); `nvme io` two raw tracepoints and two kprobes of one
/// program each; user-space probes a uprobe pair.
fn program_targets(probe: &Value) -> (Vec<String>, usize) {
    let name = probe["name"].as_str().expect("probe name");
    let owned = |v: &[&str]| v.iter().map(|t| (*t).to_owned()).collect::<Vec<_>>();
    match (probe["attach"].as_str().expect("attach"), name) {
        ("raw_tp", n) if n.starts_with("softirq ") => {
            (owned(&["raw_tp softirq_entry", "raw_tp softirq_exit"]), 1)
        }
        ("raw_tp", n) if n.starts_with("irq ") => (
            owned(&["raw_tp irq_handler_entry", "raw_tp irq_handler_exit"]),
            1,
        ),
        ("raw_tp", "napi_poll packets") => (owned(&["raw_tp napi_poll"]), 1),
        ("raw_tp", "ib_cq wakeup") => (
            owned(&[
                "raw_tp cq_schedule",
                "raw_tp cq_reschedule",
                "raw_tp cq_process",
                "raw_tp cq_poll",
                "raw_tp cq_free",
            ]),
            1,
        ),
        // Its own programs: the ib_cq API's tracepoints are the `ib_cq wakeup` row's.
        ("raw_tp", "nvme io") => (
            owned(&[
                "raw_tp nvme_setup_cmd",
                "raw_tp nvme_complete_rq",
                "nvme_rdma_post_send",
                "blk_mq_complete_request_remote",
            ]),
            1,
        ),
        ("raw_tp", "nvmet io") => (
            owned(&["raw_tp nvmet_req_init", "raw_tp nvmet_req_complete"]),
            1,
        ),
        ("raw_tp", "rdma_cm connect") => (
            owned(&[
                "raw_tp cm_send_req",
                "raw_tp cm_event_handler",
                "raw_tp cm_event_done",
                "raw_tp cm_id_destroy",
            ]),
            1,
        ),
        ("uprobe", n) => (vec![format!("uprobe {n}")], 2),
        ("kprobe" | "fentry", "wakeup") => (
            owned(&["ib_uverbs_comp_handler", "ib_uverbs_comp_event_read"]),
            2,
        ),
        ("kprobe" | "fentry", n) => (vec![n.to_owned()], 2),
        (how, n) => panic!("probe {n} attached by {how}: teach program_targets about it"),
    }
}

#[test]
fn run_json_carries_self_overhead_for_every_attached_program() {
    // Every mechanism (kprobe, raw tracepoint, uprobe) and interval: the full preset.
    let run = run_demo("event", 200, &["--probes", "full"], "run-overhead");
    run.assert_success("rdma-trace run");
    let phase = &run.report["phases"][0];
    let o = &phase["overhead"];
    let progs = o["programs"].as_array().expect("overhead.programs");
    let attached: Vec<&Value> = attached(phase).collect();
    assert!(attached.len() >= 8, "{} attached probes", attached.len());
    // The completion waterfall's programs (`wf_*`) share some functions with the probes; they
    // are checked apart, after the probes' own.
    let is_waterfall = |p: &&Value| p["name"].as_str().is_some_and(|n| n.starts_with("wf_"));
    let (wf_progs, progs): (Vec<&Value>, Vec<&Value>) = progs.iter().partition(is_waterfall);
    let programs_on = |target: &str| -> Vec<&Value> {
        progs
            .iter()
            .copied()
            .filter(|p| p["target"] == target)
            .collect()
    };
    // Every attached probe has all its programs listed: an entry and a return program per
    // kernel function, one program per raw tracepoint. A probe that counted had them all run.
    // Where the waterfall's programs do a row's work on a hook (`shared_hooks`: the entry and
    // the return of the completion handler, the entry of rxe's CQE post), the row has no
    // program of its own there, and the waterfall has one.
    let mut expected = std::collections::BTreeSet::new();
    for probe in &attached {
        let (targets, per_target) = program_targets(probe);
        for target in targets {
            let shared: usize = probe["shared_hooks"]
                .as_array()
                .expect("shared_hooks")
                .iter()
                .filter(|h| h["function"] == target.as_str())
                .map(|h| usize::from(h["entry"] == true) + usize::from(h["return"] == true))
                .sum();
            let on = programs_on(&target);
            assert_eq!(
                on.len(),
                per_target - shared,
                "programs on {target} for probe {} ({shared} of its hooks shared): {o}",
                probe["name"]
            );
            let theirs = wf_progs.iter().filter(|p| p["target"] == target.as_str());
            assert!(
                theirs.count() >= shared,
                "{target}: {shared} hooks shared, but the waterfall's programs there are not listed: {o}"
            );
            // A counting ib_cq wakeup ran on cq_process and cq_schedule; a re-schedule (a full
            // budget) and a CQ's free need not happen.
            let may_idle = ["raw_tp cq_reschedule", "raw_tp cq_free"].contains(&target.as_str());
            if probe["count"].as_u64().unwrap() > 0 && !may_idle {
                for p in &on {
                    assert!(
                        p["runs"].as_u64().unwrap() > 0,
                        "{} counted: {p}",
                        probe["name"]
                    );
                }
            }
            expected.insert(target);
        }
    }
    // And every program listed belongs to an attached probe, with a cost for each run.
    for p in &progs {
        let target = p["target"].as_str().expect("target");
        assert!(
            expected.contains(target),
            "program of no attached probe: {p}"
        );
        let runs = p["runs"].as_u64().expect("runs");
        if runs > 0 {
            assert!(p["ns_per_run"].as_f64().unwrap() > 0.0, "{p}");
        } else {
            assert!(p["ns_per_run"].is_null(), "{p}");
        }
    }
    // The waterfall's programs are listed too, with their runs: the handler's and the read's
    // once per completion event at least; and so are these probes' programs.
    let wf = ["wf_handler_entry", "wf_read_return", "wf_sched_switch"].map(|name| {
        find_by(wf_progs.iter().copied(), "name", name)
            .unwrap_or_else(|| panic!("no waterfall program {name}: {o}"))
    });
    let on = ["rxe_cq_post", "raw_tp softirq_entry"].map(|target| {
        find_by(progs.iter().copied(), "target", target)
            .unwrap_or_else(|| panic!("no program on {target}: {o}"))
    });
    for p in wf.into_iter().chain(on) {
        assert!(p["runs"].as_u64().unwrap() >= 200, "{p}");
        assert!(p["ns_per_run"].as_f64().unwrap() > 0.0, "{p}");
    }
    assert!(o["bpf_cpu_percent"].as_f64().unwrap() > 0.0, "{o}");
    assert!(o["loader_cpu_percent"].as_f64().unwrap() > 0.0, "{o}");
    assert!(o["loader_peak_rss_kib"].as_u64().unwrap() > 0, "{o}");
    let stdout = &run.stdout;
    assert!(stdout.contains("tracing: eBPF"), "text report:\n{stdout}");
    // The text view printed interval blocks while the demo ran.
    assert!(stdout.contains("[Event mode"), "interval blocks:\n{stdout}");
}

/// `rdma-trace cq ARGS` logging while `loopback_pingpong(DEMO)` runs as load, then ended early
/// by SIGTERM, like Ctrl-C: its output, and its whole stderr.
fn cq_during_pingpong(args: &[&str], demo: &[&str]) -> (Output, String) {
    let mut cq = KillOnDrop::spawn(
        Command::new(RDMA_TRACE)
            .arg("cq")
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
    );
    // Attach takes a moment: the load starts once it logs (probes attached).
    let (head, mut err) = stderr_until(&mut cq, "rdma-trace: logging calls of");
    // Keep draining stderr so the logger never blocks on it.
    let rest = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let demo = loopback_pingpong(demo);
    assert!(demo.success(), "rdma-demo failed: {demo}");
    assert!(signal(&cq, "-TERM"));
    let out = cq.wait_with_output();
    (out, head + &rest.join().unwrap())
}

#[test]
fn cq_logs_calls_with_callers_while_a_demo_runs() {
    let (out, stderr) = cq_during_pingpong(
        &["--duration", "25", "--json", "-"],
        &["--mode", "event", "-n", "100"],
    );
    assert!(out.status.success(), "rdma-trace cq failed: {stderr}");
    let events: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad line {l:?}: {e}")))
        .collect();
    let of = |f: &str| events.iter().filter(|e| e["function"] == f).count();
    assert!(
        of("rxe_cq_post") >= 400,
        "{} rxe_cq_post events",
        of("rxe_cq_post")
    );
    assert!(of("ib_uverbs_comp_handler") >= 100, "event mode: {stderr}");
    for e in &events {
        assert!(
            e["ts_ns"].as_u64().unwrap() > 0 && e["pid"].is_u64() && e["comm"].is_string(),
            "{e}"
        );
    }
    let with_callers = events.iter().filter(|e| e["caller"].is_string()).count();
    assert!(
        with_callers * 10 >= events.len() * 9,
        "{with_callers} of {} events have a caller",
        events.len()
    );
    // rxe posts completions from its responder and completer tasks.
    assert!(
        events.iter().any(|e| e["function"] == "rxe_cq_post"
            && e["caller"].as_str().is_some_and(|c| c.starts_with("rxe_"))),
        "rxe_cq_post called from rxe: {:?}",
        events.iter().find(|e| e["function"] == "rxe_cq_post")
    );
    assert!(stderr.contains("ns/run"), "overhead summary: {stderr}");
    assert_eq!(kprobes_left(), "", "kprobes left behind");
}

#[test]
fn cq_text_lines_look_like_ftrace() {
    let (out, _) = cq_during_pingpong(&["--duration", "20"], &["-n", "20"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    // `comm-tid [cpu] secs: function <-caller`
    let line = text
        .lines()
        .find(|l| l.contains(": rxe_cq_post <-rxe_"))
        .unwrap_or_else(|| panic!("no rxe_cq_post line with an rxe caller:\n{text}"));
    let (head, _) = line.split_once(": rxe_cq_post").unwrap();
    assert!(head.contains("-") && head.contains("[00"), "{line}");
}

fn sh(cmd: &str) -> String {
    let out = Command::new("sh").args(["-c", cmd]).output().expect("sh");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Delete the test bed's Soft-RoCE devices (rdma_rxe stays loaded): a host-like setup with no
/// RDMA device. `RestoreRxe` brings them back.
fn delete_testbed_devices() {
    for dev in ["rxe0", "rxe1"] {
        assert!(
            Command::new("rdma")
                .args(["link", "delete", dev])
                .status()
                .unwrap()
                .success(),
            "rdma link delete {dev}"
        );
    }
}

/// Puts rxe0/rxe1 back (as the guest's init made them) when dropped.
struct RestoreRxe;

impl Drop for RestoreRxe {
    fn drop(&mut self) {
        for (dev, netdev) in [("rxe0", "va"), ("rxe1", "vb")] {
            if !std::path::Path::new("/sys/class/infiniband")
                .join(dev)
                .exists()
            {
                let _ = Command::new("rdma")
                    .args(["link", "add", dev, "type", "rxe", "netdev", netdev])
                    .status();
            }
        }
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(15) {
            let ready = ["rxe0", "rxe1"].iter().all(|d| {
                std::fs::read_to_string(format!("/sys/class/infiniband/{d}/ports/1/gids/1"))
                    .is_ok_and(|g| g.contains("ffff"))
            });
            if ready {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

#[test]
fn run_without_devices_uses_a_temporary_soft_roce_device_and_leaves_routing_alone() {
    let rules = sh("ip rule show");
    let routes = sh("ip route show table all");
    let _restore = RestoreRxe;
    delete_testbed_devices();
    let run = run_demo("poll", 50, &[], "temp-rxe");
    run.assert_success("rdma-trace run");
    let stderr = &run.stderr;
    assert!(
        stderr.contains("temporary Soft-RoCE device rdmatrace0"),
        "{stderr}"
    );
    assert!(
        stderr.contains("removed the temporary Soft-RoCE device rdmatrace0"),
        "{stderr}"
    );
    let report = &run.report;
    assert_eq!(report["load"]["demo"]["server_device"], "rdmatrace0");
    assert_eq!(report["load"]["demo"]["client_device"], "rdmatrace0");
    assert!(
        !std::path::Path::new("/sys/class/infiniband/rdmatrace0").exists(),
        "device left behind"
    );
    assert_eq!(sh("ip rule show"), rules, "policy rules changed");
    assert_eq!(sh("ip route show table all"), routes, "routes changed");
}

#[test]
fn uprobes_time_the_demos_blocking_wait_when_asked() {
    let run = run_demo("both", 100, &["--uprobes"], "uprobes");
    run.assert_success("rdma-trace run --uprobes");
    let report = &run.report;
    let (poll, event) = (&report["phases"][0], &report["phases"][1]);
    assert_eq!(probe(event, "ibv_get_cq_event")["attach"], "uprobe");
    assert_eq!(
        count(poll, "ibv_get_cq_event"),
        0,
        "polling never blocks on the channel"
    );
    let cq_events = demo_cq_events(&event["demo"]);
    // One call per event taken: the uprobe sees exactly the demo's calls (the versioned
    // default symbol, in the demo's process only).
    assert_eq!(count(event, "ibv_get_cq_event"), cq_events);
    let p = probe(event, "ibv_get_cq_event");
    assert_eq!(p["summary"]["count"], p["count"], "every call timed: {p}");
    // Without the flag the probe says why it is off.
    let run = run_demo("poll", 20, &[], "no-uprobes");
    run.assert_success("rdma-trace run");
    let report = &run.report;
    let skipped = probe(&report["phases"][0], "ibv_get_cq_event")["skipped"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(skipped.contains("--uprobes"), "{skipped}");
}

#[path = "guest/waterfall.rs"]
mod waterfall;

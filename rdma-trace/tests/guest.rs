//! Guest tests: run inside the QEMU test bed (`cargo xtask vm`), which has kprobes and two
//! Soft-RoCE devices, rxe0 (on veth end va, 10.9.0.1) and rxe1 (on vb, 10.9.0.2), whose RoCE
//! traffic crosses the IP stack. `cargo xtask test` builds this target (`test = false`) and runs
//! it in the 6.1 and 6.12 guests.

use std::{
    path::PathBuf,
    process::{Child, Command, ExitStatus, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;

const RDMA_TRACE: &str = env!("CARGO_BIN_EXE_rdma-trace");

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
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            panic!("process did not finish within {limit:?}");
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

fn temp_json(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!(
        "rdma-trace-guest-{}-{name}.json",
        std::process::id()
    ))
}

fn read_json(path: &PathBuf) -> Value {
    let v = serde_json::from_slice(&std::fs::read(path).expect("JSON report")).expect("valid JSON");
    let _ = std::fs::remove_file(path);
    v
}

/// Registered kprobes (perf and tracefs ones alike) and tracefs kprobe events.
fn kprobes_left() -> String {
    let list = std::fs::read_to_string("/sys/kernel/debug/kprobes/list").unwrap_or_default();
    let events = std::fs::read_to_string("/sys/kernel/tracing/kprobe_events").unwrap_or_default();
    list + &events
}

fn demo_processes() -> Vec<String> {
    std::fs::read_dir("/proc")
        .expect("/proc")
        .filter_map(Result::ok)
        .filter_map(|e| std::fs::read_to_string(e.path().join("comm")).ok())
        .filter(|c| c.trim() == "rdma-demo")
        .collect()
}

/// `ibv_rc_pingpong` between rxe1 (server) and rxe0 (client), the client under
/// `rdma-trace funclat ib_uverbs_comp_handler`; returns the report.
fn pingpong_under_funclat(event: bool, port: u16, iters: u32) -> Value {
    let g0 = roce_v2_gid_index("rxe0", [10, 9, 0, 1]).to_string();
    let g1 = roce_v2_gid_index("rxe1", [10, 9, 0, 2]).to_string();
    let port_s = port.to_string();
    let iters_s = iters.to_string();
    let mode: &[&str] = if event { &["-e"] } else { &[] };
    let mut server = Command::new("ibv_rc_pingpong")
        .args(["-d", "rxe1", "-g", &g1, "-n", &iters_s, "-p", &port_s])
        .args(mode)
        .stdout(Stdio::null())
        .spawn()
        .expect("start ibv_rc_pingpong server");
    wait_listening(port);
    let json = temp_json(&format!("funclat-{port}"));
    let mut tracer = Command::new(RDMA_TRACE)
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
        .arg("127.0.0.1")
        .spawn()
        .expect("start rdma-trace");
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

fn probe<'a>(phase: &'a Value, name: &str) -> &'a Value {
    phase["probes"]
        .as_array()
        .expect("probes")
        .iter()
        .find(|p| p["name"] == name)
        .unwrap_or_else(|| panic!("no probe {name} in {phase}"))
}

fn count(phase: &Value, name: &str) -> u64 {
    let p = probe(phase, name);
    assert!(p["attach"].is_string(), "{name} not attached: {p}");
    p["count"].as_u64().expect("count")
}

#[test]
fn run_both_modes_between_rxe0_and_rxe1() {
    let iters = 200u64;
    let json = temp_json("run-both");
    let out = Command::new(RDMA_TRACE)
        .args([
            "run",
            "--mode",
            "both",
            "--no-tui",
            "-i",
            &iters.to_string(),
            "--json",
        ])
        .arg(&json)
        .output()
        .expect("run rdma-trace run");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "rdma-trace run failed: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report = read_json(&json);
    assert_eq!(report["server_device"], "rxe0");
    assert_eq!(report["client_device"], "rxe1");
    let (poll, event) = (&report["phases"][0], &report["phases"][1]);
    assert_eq!(poll["mode"], "poll");
    assert_eq!(event["mode"], "event");
    // The defining difference: completion events only in event mode.
    assert_eq!(count(poll, "ib_uverbs_comp_handler"), 0);
    let comp = count(event, "ib_uverbs_comp_handler");
    // Every CQ event the demo took (both sides) was queued by one ib_uverbs_comp_handler call.
    let cq_events: u64 = event["demo"]["reports"]
        .as_array()
        .expect("demo reports")
        .iter()
        .map(|r| r["cq_events"].as_u64().expect("cq_events"))
        .sum();
    assert!(
        cq_events >= iters,
        "{cq_events} CQ events for {iters} iterations"
    );
    // kprobes can miss a few hits when another kprobe handler runs on that CPU (nmissed).
    assert!(
        comp + cq_events / 100 + 2 >= cq_events && comp <= cq_events + cq_events / 20 + 4,
        "ib_uverbs_comp_handler ran {comp} times for {cq_events} CQ events taken by the demo"
    );
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
    let mut child = Command::new(RDMA_TRACE)
        .args(["run", "--mode", "event", "--no-tui", "-i", "1000000"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start rdma-trace run");
    // Wait until the probes are attached and the demo runs.
    let start = Instant::now();
    while !kprobes_left().contains("ib_uverbs_comp_handler") || demo_processes().is_empty() {
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
    std::thread::sleep(Duration::from_millis(500));
    let pid = child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
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
    let out = Command::new(RDMA_TRACE)
        .args(["run", "--no-tui", "-d", "nosuch0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("available: rxe0, rxe1"), "{stderr}");
}

//! Guest tests: run inside the QEMU test bed (`cargo xtask vm`), which has kprobes and two
//! Soft-RoCE devices, rxe0 (on veth end va, 10.9.0.1) and rxe1 (on vb, 10.9.0.2), whose RoCE
//! traffic crosses the IP stack. `cargo xtask test` builds this target (`test = false`) and runs
//! it in the 6.1 and 6.12 guests.

use std::{
    path::PathBuf,
    process::{Child, Command, ExitStatus, Stdio},
    time::{Duration, Instant},
};

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

/// `ibv_rc_pingpong` between rxe1 (server) and rxe0 (client), the client under
/// `rdma-trace funclat ib_uverbs_comp_handler`; returns the report.
fn pingpong_under_funclat(event: bool, port: u16, iters: u32) -> serde_json::Value {
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
    let json = std::env::temp_dir().join(format!("funclat-{port}.json"));
    let mut tracer = Command::new(env!("CARGO_BIN_EXE_rdma-trace"))
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
    let report =
        serde_json::from_slice(&std::fs::read(&json).expect("JSON report")).expect("valid JSON");
    let _ = std::fs::remove_file(&json);
    report
}

fn comp_handler_calls(report: &serde_json::Value) -> u64 {
    let f = &report["functions"][0];
    assert_eq!(f["name"], "ib_uverbs_comp_handler");
    assert_eq!(f["module"], "ib_uverbs");
    assert_eq!(f["attach"], "kprobe");
    assert_eq!(report["window"]["ended_by"], "command");
    assert_eq!(report["window"]["command_status"], 0);
    f["calls"].as_u64().expect("calls")
}

#[test]
fn event_mode_calls_ib_uverbs_comp_handler() {
    let iters = 500;
    let before = net_rx_total();
    let report = pingpong_under_funclat(true, 18601, iters);
    let net_rx = net_rx_total() - before;
    let calls = comp_handler_calls(&report);
    // Each side arms its CQ and gets one event per send and per receive completion batch.
    assert!(
        calls > 0,
        "no ib_uverbs_comp_handler calls in event mode: {report}"
    );
    assert!(
        calls >= u64::from(iters),
        "only {calls} calls for {iters} event-mode iterations"
    );
    let f = &report["functions"][0];
    assert_eq!(f["returns"], f["calls"], "every call returned: {f}");
    assert_eq!(f["duration"]["count"], f["calls"], "every call timed: {f}");
    // RoCE between rxe0 and rxe1 crosses the IP stack over the veth pair.
    assert!(
        net_rx >= u64::from(iters),
        "NET_RX rose by {net_rx} only: traffic took rxe's loopback?"
    );
}

#[test]
fn poll_mode_never_calls_ib_uverbs_comp_handler() {
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

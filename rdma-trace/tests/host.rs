//! Host eBPF tests: they load and attach programs on the running kernel, so they need root.
//! Run by `cargo xtask test` (this target has `test = false`; plain `cargo test` skips it).

use std::{
    io::{Read as _, Write as _},
    net::{TcpListener, TcpStream},
    path::PathBuf,
    process::{Command, Output},
    time::{Duration, Instant},
};

fn rdma_trace(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rdma-trace"))
        .args(args)
        .output()
        .expect("run rdma-trace")
}

fn temp_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("rdma-trace-host-{}-{name}", std::process::id()))
}

/// Push bytes through a loopback TCP connection for `d`: every segment is received through
/// the NET_RX softirq (loopback xmit queues to the backlog NAPI).
fn loopback_traffic(d: Duration) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let reader = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().expect("accept");
            let mut buf = [0u8; 65536];
            let mut total = 0u64;
            while let Ok(n) = s.read(&mut buf) {
                if n == 0 {
                    break;
                }
                total += n as u64;
            }
            total
        });
        let mut c = TcpStream::connect(addr).expect("connect");
        c.set_nodelay(true).expect("nodelay");
        let start = Instant::now();
        while start.elapsed() < d {
            c.write_all(&[7u8; 1024]).expect("write");
        }
        drop(c);
        reader.join().expect("reader")
    })
}

#[test]
fn softirqs_counts_net_rx_under_loopback_traffic() {
    let json = temp_path("softirqs.json");
    let traffic = loopback_traffic(Duration::from_secs(3));
    let out = rdma_trace(&[
        "softirqs",
        "--duration",
        "2",
        "--json",
        json.to_str().unwrap(),
    ]);
    let bytes = traffic.join().expect("traffic thread");
    assert!(bytes > 0, "no loopback traffic was generated");
    assert!(
        out.status.success(),
        "rdma-trace softirqs failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json).expect("JSON report")).expect("valid JSON");
    let _ = std::fs::remove_file(&json);
    let vectors = report["vectors"].as_array().expect("vectors");
    assert_eq!(vectors.len(), 10, "one entry per softirq vector");
    let net_rx = vectors
        .iter()
        .find(|v| v["name"] == "NET_RX")
        .expect("NET_RX");
    let count = net_rx["count"].as_u64().expect("count");
    assert!(
        count > 0,
        "NET_RX count is 0 under loopback traffic: {net_rx}"
    );
    let recorded = net_rx["summary"]["count"].as_u64().expect("summary count");
    let row_sum: u64 = net_rx["log2"]
        .as_array()
        .expect("log2 rows")
        .iter()
        .map(|b| b["count"].as_u64().unwrap())
        .sum();
    assert_eq!(
        row_sum, recorded,
        "histogram rows add up to the recorded count"
    );
    // A softirq running on some CPU at the snapshot has its entry counted but no duration yet.
    assert!(
        recorded <= count && count <= recorded + 64,
        "{count} runs, {recorded} timed"
    );
    let (p50, p99) = (
        net_rx["summary"]["p50"].as_f64().unwrap(),
        net_rx["summary"]["p99"].as_f64().unwrap(),
    );
    assert!(0.0 < p50 && p50 <= p99, "p50 {p50} p99 {p99}");
    assert_eq!(net_rx["attach"], "raw_tp");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("NET_RX"),
        "text report names NET_RX:\n{stdout}"
    );
    assert_eq!(report["window"]["ended_by"], "duration");
}

#[test]
fn funclat_on_unknown_function_is_one_line_and_exit_3() {
    // No kprobes on this kernel, or no such function: both are "unsupported here" (3).
    let out = rdma_trace(&[
        "funclat",
        "no_such_function_rdma_trace_test",
        "--duration",
        "1",
    ]);
    assert_eq!(
        out.status.code(),
        Some(3),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");
    assert!(stderr.starts_with("rdma-trace: "), "{stderr}");
}

#[test]
fn bad_durations_are_usage_errors() {
    for bad in ["0", "-3", "soon"] {
        let out = rdma_trace(&["softirqs", &format!("--duration={bad}")]);
        assert_eq!(out.status.code(), Some(2), "--duration {bad}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("seconds"));
    }
}

#[test]
fn run_without_rdma_says_why_and_names_the_guest() {
    let has_rdma = std::fs::read_dir("/sys/class/infiniband").is_ok_and(|mut d| d.next().is_some());
    if has_rdma {
        // A host with RDMA devices runs the demo instead; the guest tests cover that path.
        return;
    }
    let out = rdma_trace(&["run", "--no-tui", "-i", "10"]);
    assert_eq!(
        out.status.code(),
        Some(3),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");
    assert!(
        stderr.contains("no RDMA device") && stderr.contains("cargo xtask run"),
        "{stderr}"
    );
}

#[test]
fn run_without_privileges_asks_for_root() {
    // setpriv (util-linux) drops to nobody with no capabilities.
    let out = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
        ])
        .arg(env!("CARGO_BIN_EXE_rdma-trace"))
        .args(["run", "--no-tui", "-i", "10"])
        .output()
        .expect("run setpriv");
    assert_eq!(
        out.status.code(),
        Some(3),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("needs root"), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");
}

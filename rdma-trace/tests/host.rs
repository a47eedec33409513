//! Host eBPF tests: they load and attach programs on the running kernel, so they need root.
//! Run by `cargo xtask test` (this target has `test = false`; plain `cargo test` skips it).

#[path = "guest/exposition.rs"]
mod exposition;
use exposition::{http_get, parse_exposition, sample, start_exporter};

use std::{
    io::{Read as _, Write as _},
    net::{TcpListener, TcpStream},
    path::PathBuf,
    process::{Command, Output},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

/// Load that runs in a thread for at least its minimum time and until [`Load::join`]: a tracer
/// that is slow to start (a loaded machine) still sees it once attached.
struct Load {
    stop: Arc<AtomicBool>,
    handle: std::thread::JoinHandle<u64>,
}

impl Load {
    fn spawn(min: Duration, step: impl FnMut() -> u64 + Send + 'static) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let mut step = step;
        let handle = std::thread::spawn(move || {
            let start = Instant::now();
            let mut total = 0;
            while start.elapsed() < min || !flag.load(Ordering::Relaxed) {
                total += step();
            }
            total
        });
        Self { stop, handle }
    }

    /// Stop the load and return what it did.
    fn join(self) -> std::thread::Result<u64> {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join()
    }
}

fn rdma_trace(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rdma-trace"))
        .args(args)
        .output()
        .expect("run rdma-trace")
}

/// Fails the test, showing `out`'s stderr, unless `what` succeeded.
fn assert_success(out: &Output, what: &str) {
    assert!(
        out.status.success(),
        "{what} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Fails the test unless `out` exited with `code` and said why in one line of stderr (its
/// trailing white space aside); returns that stderr.
fn one_line_failure(out: &Output, code: i32) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(code), "stderr: {stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");
    stderr
}

/// The entry named `name` of the report's list `list` (`vectors`, `softirqs`).
fn named<'a>(report: &'a serde_json::Value, list: &str, name: &str) -> &'a serde_json::Value {
    report[list]
        .as_array()
        .unwrap_or_else(|| panic!("no {list} in {report}"))
        .iter()
        .find(|v| v["name"] == name)
        .unwrap_or_else(|| panic!("no {name} in {list}"))
}

/// `rdma-trace ARGS --json <temp_path(name)>` run to its end, and its JSON report when it
/// wrote one (the file then removed).
fn rdma_trace_json(args: &[&str], name: &str) -> (Output, Option<serde_json::Value>) {
    let path = temp_path(name);
    let out = rdma_trace(&[args, &["--json", path.to_str().unwrap()]].concat());
    let report = std::fs::read(&path)
        .ok()
        .map(|json| serde_json::from_slice(&json).expect("valid JSON"));
    let _ = std::fs::remove_file(&path);
    (out, report)
}

fn temp_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("rdma-trace-host-{}-{name}", std::process::id()))
}

/// Push bytes through a loopback TCP connection for at least `d`, and until joined: every
/// segment is received through the NET_RX softirq (loopback xmit queues to the backlog NAPI).
/// Returns the bytes sent.
fn loopback_traffic(d: Duration) -> Load {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    std::thread::spawn(move || {
        let (mut s, _) = listener.accept().expect("accept");
        let mut buf = [0u8; 65536];
        while let Ok(n) = s.read(&mut buf) {
            if n == 0 {
                break;
            }
        }
    });
    let mut c = TcpStream::connect(addr).expect("connect");
    c.set_nodelay(true).expect("nodelay");
    // The connection closes when the load thread ends (it owns `c`).
    Load::spawn(d, move || {
        c.write_all(&[7u8; 1024]).expect("write");
        1024
    })
}

#[test]
fn softirqs_counts_net_rx_under_loopback_traffic() {
    let traffic = loopback_traffic(Duration::from_secs(3));
    let (out, report) = rdma_trace_json(&["softirqs", "--duration", "2"], "softirqs.json");
    let bytes = traffic.join().expect("traffic thread");
    assert!(bytes > 0, "no loopback traffic was generated");
    assert_success(&out, "rdma-trace softirqs");
    let report = report.expect("JSON report");
    let vectors = report["vectors"].as_array().expect("vectors");
    assert_eq!(vectors.len(), 10, "one entry per softirq vector");
    let net_rx = named(&report, "vectors", "NET_RX");
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
    // Every timed run was counted at entry. On this host kernel a small share of
    // softirq_exit hits never reach the program (the entry is counted, no duration follows;
    // seen up to ~0.5 % under saturating loopback traffic), so timed may trail the count.
    assert!(
        recorded <= count && count - recorded <= count / 50 + 64,
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

/// `softirqs INTERVAL COUNT`, as BCC's: COUNT blocks, each of its own interval only; the JSON
/// covers the whole window.
#[test]
fn softirqs_prints_count_intervals_of_the_last_interval_each() {
    let traffic = loopback_traffic(Duration::from_secs(3));
    let (out, report) = rdma_trace_json(&["softirqs", "0.5", "3"], "softirqs-intervals.json");
    traffic.join().expect("traffic thread");
    assert_success(&out, "rdma-trace softirqs 0.5 3");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let blocks: Vec<&str> = stdout
        .split("softirq durations over the last ")
        .skip(1)
        .collect();
    assert_eq!(blocks.len(), 3, "{stdout}");
    assert!(blocks.iter().all(|b| b.contains("NET_RX")), "{stdout}");
    assert!(
        !stdout.contains("softirq durations over 1"),
        "no whole-window block: {stdout}"
    );
    let report = report.expect("JSON report");
    assert_eq!(report["window"]["ended_by"], "count");
    assert!(
        report["window"]["seconds"].as_f64().unwrap() >= 1.4,
        "{report}"
    );
}

/// `probes --json PATH` writes the listing there and prints the table; `--json -` prints only
/// the JSON.
#[test]
fn probes_json_takes_a_path_or_stdout() {
    let (out, report) = rdma_trace_json(&["probes"], "probes.json");
    assert_success(&out, "rdma-trace probes --json PATH");
    assert!(report.expect("JSON report")["rows"].is_array());
    assert!(!out.stdout.is_empty(), "the table is printed too");
    let out = rdma_trace(&["probes", "--json", "-"]);
    assert_success(&out, "rdma-trace probes --json -");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("only JSON on stdout");
    assert!(v["rows"].is_array());
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
    let stderr = one_line_failure(&out, 3);
    assert!(stderr.starts_with("rdma-trace: "), "{stderr}");
}

#[test]
fn a_json_path_that_cannot_be_written_is_refused_before_attaching() {
    let out = rdma_trace(&[
        "softirqs",
        "--duration",
        "3",
        "--json",
        "/nonexistent-rdma-trace-dir/s.json",
    ]);
    // One line, before "timing softirqs" (printed once the programs are attached).
    let stderr = one_line_failure(&out, 1);
    assert!(
        stderr.contains("/nonexistent-rdma-trace-dir") && stderr.contains("does not exist"),
        "{stderr}"
    );
    assert!(out.stdout.is_empty(), "nothing collected");
}

#[test]
fn bad_durations_are_usage_errors() {
    for bad in ["0", "-3", "soon"] {
        let out = rdma_trace(&["softirqs", &format!("--duration={bad}")]);
        assert_eq!(out.status.code(), Some(2), "--duration {bad}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("seconds"));
    }
}

/// Without RDMA devices `run` says why in one line (exit 3); with them (an RDMA host, or this
/// binary run in the guest) it runs the demo and reports, which is checked instead.
#[test]
fn run_says_why_without_rdma_and_reports_with_it() {
    let has_rdma = std::fs::read_dir("/sys/class/infiniband").is_ok_and(|mut d| d.next().is_some());
    let out = rdma_trace(&["run", "--no-tui", "-n", "10"]);
    if has_rdma {
        eprintln!("this machine has RDMA devices: checking that `run` works instead");
        assert_eq!(
            out.status.code(),
            Some(0),
            "with RDMA devices: stderr: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            stdout.contains("rdma-trace run: ") && stdout.contains("tracing: eBPF"),
            "no report: {stdout}"
        );
        return;
    }
    let stderr = one_line_failure(&out, 3);
    assert!(
        stderr.contains("no RDMA device") && stderr.contains("cargo xtask run"),
        "{stderr}"
    );
}

#[test]
fn run_without_privileges_names_what_is_missing() {
    // setpriv (util-linux) drops to nobody with no capabilities.
    let out = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
        ])
        .arg(env!("CARGO_BIN_EXE_rdma-trace"))
        .args(["run", "--no-tui", "-n", "10"])
        .output()
        .expect("run setpriv");
    let stderr = one_line_failure(&out, 3);
    assert!(
        stderr.contains("needs CAP_BPF and CAP_PERFMON")
            && stderr.contains("it holds none of them")
            && stderr.contains("sudo"),
        "{stderr}"
    );
}

// ---- rdma-trace export: Prometheus text format over HTTP

#[test]
fn export_serves_growing_prometheus_histograms() {
    let (mut child, addr) = start_exporter(env!("CARGO_BIN_EXE_rdma-trace"), "testhost");
    let traffic_time = Duration::from_secs(3);
    let traffic = loopback_traffic(traffic_time);
    let traffic_start = Instant::now();
    let (status, first) = http_get(&addr, "/metrics");
    assert!(status.contains("200"), "{status}");
    let before = parse_exposition(&first);
    let net_rx = "probe=\"softirq NET_RX\",driver=\"network\",device=\"\",host=\"testhost\"";
    let count_key = format!("rdma_trace_probe_duration_seconds_count{{{net_rx}}}");
    let c1 = sample(&before, &count_key);
    // Scrape until the count grows (the exporter refreshes every 0.2 s), while traffic flows.
    let (second, after, c2) = loop {
        std::thread::sleep(Duration::from_millis(100));
        let (_, second) = http_get(&addr, "/metrics");
        let after = parse_exposition(&second);
        let c2 = sample(&after, &count_key);
        if c2 > c1 || traffic_start.elapsed() > traffic_time {
            break (second, after, c2);
        }
    };
    assert!(traffic.join().unwrap() > 0);
    assert!(
        c2 > c1,
        "NET_RX count did not grow under traffic: {c1} then {c2}"
    );
    assert!(
        sample(
            &after,
            &format!("rdma_trace_probe_events_total{{{net_rx}}}")
        ) >= c2,
        "events count every run"
    );
    assert_eq!(
        sample(&after, &format!("rdma_trace_probe_attached{{{net_rx}}}")),
        1.0
    );
    // The histogram is cumulative, in seconds, and ends with +Inf = _count.
    let buckets: Vec<f64> = after
        .iter()
        .filter(|(s, _)| {
            s.starts_with(&format!(
                "rdma_trace_probe_duration_seconds_bucket{{{net_rx},le="
            ))
        })
        .map(|(_, v)| *v)
        .collect();
    assert!(buckets.len() > 10, "{second}");
    assert!(buckets.windows(2).all(|w| w[0] <= w[1]), "{buckets:?}");
    assert_eq!(*buckets.last().unwrap(), c2);
    let sum = sample(
        &after,
        &format!("rdma_trace_probe_duration_seconds_sum{{{net_rx}}}"),
    );
    assert!(
        sum > 0.0 && sum / c2 < 0.1,
        "mean NET_RX run of {}s",
        sum / c2
    );
    assert!(second.contains("# TYPE rdma_trace_probe_duration_seconds histogram"));
    // Every loss counter is served, nothing lost or not (a counter exists before it grows);
    // the traffic here reads no completion event, so no reader lost a slot or a return.
    let lost = |what: &str| {
        sample(
            &after,
            &format!("rdma_trace_lost_total{{what=\"{what}\",host=\"testhost\"}}"),
        )
    };
    assert_eq!(lost("threads_without_slot"), 0.0);
    assert_eq!(lost("read_returns_missed"), 0.0);
    // Served whatever the kernel (`sample` fails without it); its value is the kernel's.
    lost("recursion_misses");
    let (status, _) = http_get(&addr, "/nothing-here");
    assert!(status.contains("404"), "{status}");

    // SIGTERM: exits 0, promptly.
    // SAFETY: sends a signal to our own child, which has not been reaped yet.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "export ignored SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status}");
}

#[test]
fn export_refuses_a_bad_address_as_usage() {
    let out = rdma_trace(&["export", "--listen", "not-an-address"]);
    assert_eq!(out.status.code(), Some(2));
}

/// Disk writes with fsync for at least `d`, and until joined: each flush completes through the block device's IRQ.
fn disk_traffic(d: Duration) -> Load {
    /// Removes the file when the load ends.
    struct Temp(PathBuf, std::fs::File);
    impl Drop for Temp {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
    let path = temp_path("disk-traffic");
    let f = std::fs::File::create(&path).expect("temp file");
    let mut t = Temp(path, f);
    Load::spawn(d, move || {
        t.1.write_all(&[1u8; 4096]).expect("write");
        t.1.sync_data().expect("fsync");
        1
    })
}

#[test]
fn irq_counts_virtio_interrupts_and_net_rx() {
    let disk = disk_traffic(Duration::from_secs(3));
    let net = loopback_traffic(Duration::from_secs(3));
    let (out, report) = rdma_trace_json(
        &["irq", "--match", "virtio*", "--duration", "2", "--no-tui"],
        "irq.json",
    );
    assert!(disk.join().expect("disk thread") > 0);
    assert!(net.join().expect("traffic thread") > 0);
    assert_success(&out, "rdma-trace irq");
    let report = report.expect("JSON report");
    let irqs = report["irqs"].as_array().expect("irqs");
    assert!(!irqs.is_empty(), "no virtio IRQ on this host: {report}");
    let busy: Vec<&serde_json::Value> = irqs
        .iter()
        .filter(|i| i["count"].as_u64().unwrap() > 0)
        .collect();
    assert!(
        !busy.is_empty(),
        "no virtio IRQ fired under disk I/O: {report}"
    );
    for i in &busy {
        let name = i["name"].as_str().unwrap();
        assert!(name.starts_with("irq virtio"), "{name}");
        assert_eq!(i["attach"], "raw_tp");
        let cpus: u64 = i["cpus"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c.as_u64().unwrap())
            .sum();
        assert!(
            cpus >= i["count"].as_u64().unwrap(),
            "CPU spread covers the count: {i}"
        );
        assert!(
            i["summary"]["p50"].as_f64().unwrap() > 0.0,
            "handler durations: {i}"
        );
    }
    let net_rx = named(&report, "softirqs", "NET_RX");
    assert!(net_rx["count"].as_u64().unwrap() > 0, "{net_rx}");
    // Self-overhead: every attached program ran, with a cost per run.
    let progs = report["overhead"]["programs"].as_array().expect("programs");
    assert_eq!(progs.len(), 4, "softirq and irq entry/exit: {progs:?}");
    for p in progs {
        assert!(p["runs"].as_u64().unwrap() > 0, "{p}");
        assert!(p["ns_per_run"].as_f64().unwrap() > 0.0, "{p}");
    }
    assert!(report["overhead"]["loader_peak_rss_kib"].as_u64().unwrap() > 0);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("CPU spread") && stdout.contains("ns/run"),
        "{stdout}"
    );
}

#[test]
fn irq_with_nothing_matching_is_one_line_and_exit_3() {
    let out = rdma_trace(&["irq", "--match", "no-such-irq-*", "--duration", "1"]);
    let stderr = one_line_failure(&out, 3);
    assert!(stderr.contains("--match"), "{stderr}");
}

/// A tmux server of our own (its own socket), killed when dropped.
struct Tmux(String);

impl Tmux {
    fn cmd(&self, args: &[&str]) -> Output {
        Command::new("tmux")
            .args(["-L", &self.0])
            .args(args)
            .output()
            .expect("run tmux (apt-get install tmux)")
    }

    fn screen(&self) -> String {
        String::from_utf8_lossy(&self.cmd(&["capture-pane", "-p", "-t", "t"]).stdout).into_owned()
    }

    fn wait_for(&self, what: &str, ok: impl Fn(&str) -> bool) -> String {
        let start = Instant::now();
        loop {
            let s = self.screen();
            if ok(&s) {
                return s;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "tmux: {what} never showed:\n{s}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.cmd(&["kill-server"]);
    }
}

/// Non-zero counts in the probe table of the live view (`│irq virtio1-req.0  1812 ...`).
fn table_counts(screen: &str, prefix: &str) -> Vec<u64> {
    screen
        .lines()
        .filter_map(|l| {
            let at = l.find(prefix)?;
            let rest = &l[at..];
            rest.split_whitespace()
                .nth(prefix.split_whitespace().count() + usize::from(prefix.starts_with("irq")))?
                .parse()
                .ok()
        })
        .collect()
}

#[test]
fn live_view_in_tmux_draws_counts_and_quits_on_q() {
    let tmux = Tmux(format!("rdma-trace-test-{}", std::process::id()));
    let exe = env!("CARGO_BIN_EXE_rdma-trace");
    let script = format!(
        "'{exe}' irq --match 'virtio*'; echo \"@@EXIT=$?@@\"; stty -a | tr ' ;' '\\n\\n' | grep -x -- '-\\?icanon'; sleep 60"
    );
    let out = tmux.cmd(&[
        "new-session",
        "-d",
        "-s",
        "t",
        "-x",
        "120",
        "-y",
        "40",
        "sh",
        "-c",
        &script,
    ]);
    assert!(
        out.status.success(),
        "tmux: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let disk = disk_traffic(Duration::from_secs(4));
    let net = loopback_traffic(Duration::from_secs(4));
    let screen = tmux.wait_for("a probe table with non-zero IRQ and NET_RX counts", |s| {
        s.contains("probes (Tab")
            && table_counts(s, "irq virtio").iter().any(|&c| c > 0)
            && table_counts(s, "NET_RX").iter().any(|&c| c > 0)
    });
    assert!(screen.contains("q quit"), "{screen}");
    assert!(screen.contains("overhead: eBPF"), "{screen}");
    // Under the table, the selected probe's latency heat map (its cells: tui::draw tests).
    assert!(screen.contains(" over time (rows"), "{screen}");
    // Tab moves the selection: the pane title changes.
    tmux.cmd(&["send-keys", "-t", "t", "Tab"]);
    tmux.cmd(&["send-keys", "-t", "t", "q"]);
    let after = tmux.wait_for("the exit status", |s| s.contains("@@EXIT="));
    disk.join().unwrap();
    net.join().unwrap();
    assert!(after.contains("@@EXIT=0@@"), "q exits 0:\n{after}");
    // Back on the normal screen, in canonical mode, with the final report.
    assert!(!after.contains("q quit"), "the live view is gone:\n{after}");
    assert!(after.contains("CPU spread"), "the report follows:\n{after}");
    let after = tmux.wait_for("stty", |s| {
        s.lines()
            .any(|l| l.trim() == "icanon" || l.trim() == "-icanon")
    });
    assert!(
        after.lines().any(|l| l.trim() == "icanon"),
        "the terminal is back in canonical mode:\n{after}"
    );
}

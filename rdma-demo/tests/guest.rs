//! Guest tests: need the QEMU test bed's two Soft-RoCE devices, `rxe0` on netdev `va`
//! (10.9.0.1) and `rxe1` on netdev `vb` (10.9.0.2). Declared `test = false` in Cargo.toml, so a
//! plain `cargo test` skips them; `cargo xtask test` builds this binary and runs it in the guest.
//!
//! The `rdma-demo` binary is `$RDMA_DEMO_BIN` if set, else the path Cargo compiled in, else the
//! `rdma-demo` next to this test's `deps/` directory.

use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::Value;

struct Rxe {
    name: &'static str,
    netdev: &'static str,
    ipv4: &'static str,
    gid: &'static str,
}

const RXE0: Rxe = Rxe {
    name: "rxe0",
    netdev: "va",
    ipv4: "10.9.0.1",
    gid: "0000:0000:0000:0000:0000:ffff:0a09:0001",
};
const RXE1: Rxe = Rxe {
    name: "rxe1",
    netdev: "vb",
    ipv4: "10.9.0.2",
    gid: "0000:0000:0000:0000:0000:ffff:0a09:0002",
};

fn bin() -> PathBuf {
    if let Some(p) = std::env::var_os("RDMA_DEMO_BIN") {
        return p.into();
    }
    let built = PathBuf::from(env!("CARGO_BIN_EXE_rdma-demo"));
    if built.exists() {
        return built;
    }
    let exe = std::env::current_exe().expect("current_exe");
    let target_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("test binary in <target>/deps");
    target_dir.join("rdma-demo")
}

fn rdma_demo(args: &[&str]) -> Output {
    let bin = bin();
    let out = Command::new(&bin)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", bin.display()));
    assert!(
        out.status.code().is_some(),
        "rdma-demo {args:?} killed by a signal: {:?}",
        out.status
    );
    out
}

fn success_stdout(args: &[&str]) -> String {
    let out = rdma_demo(args);
    assert_eq!(
        out.status.code(),
        Some(0),
        "rdma-demo {args:?}: stderr {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8 stdout")
}

/// The text block of one device: from `device <name>` up to the next device (or the legend).
fn text_block<'a>(stdout: &'a str, name: &str) -> Vec<&'a str> {
    let header = format!("device {name}");
    let mut lines = stdout.lines().skip_while(|l| *l != header);
    let first = lines
        .next()
        .unwrap_or_else(|| panic!("no `{header}` line in:\n{stdout}"));
    std::iter::once(first)
        .chain(lines.take_while(|l| l.starts_with(' ')))
        .collect()
}

/// The value of `key:` in a block (first match).
fn text_value<'a>(block: &[&'a str], key: &str) -> Option<&'a str> {
    let prefix = format!("{key}:");
    block
        .iter()
        .find_map(|l| l.trim_start().strip_prefix(prefix.as_str()).map(str::trim))
}

fn check_text_block(stdout: &str, rxe: &Rxe) {
    let block = text_block(stdout, rxe.name);
    let shown = block.join("\n");
    assert_eq!(
        text_value(&block, "parent netdev"),
        Some(rxe.netdev),
        "{shown}"
    );
    assert_eq!(text_value(&block, "state"), Some("PORT_ACTIVE"), "{shown}");
    assert_eq!(
        text_value(&block, "link layer"),
        Some("Ethernet"),
        "{shown}"
    );
    let mapped = format!("::ffff:{}", rxe.ipv4);
    let v2 = block.iter().find(|l| {
        let t: Vec<&str> = l.split_whitespace().collect();
        t.first() == Some(&"*")
            && t.contains(&rxe.gid)
            && t.windows(2).any(|w| w == ["RoCE", "v2"])
            && t.contains(&rxe.netdev)
            && t.last() == Some(&mapped.as_str())
    });
    assert!(
        v2.is_some(),
        "no marked RoCE v2 GID {mapped} on {}:\n{shown}",
        rxe.netdev
    );
}

fn json_device<'a>(v: &'a Value, name: &str) -> &'a Value {
    v["devices"]
        .as_array()
        .expect("devices array")
        .iter()
        .find(|d| d["name"] == name)
        .unwrap_or_else(|| panic!("{name} not in {v:#}"))
}

fn check_json_device(v: &Value, rxe: &Rxe) {
    let dev = json_device(v, rxe.name);
    assert_eq!(dev["parent_netdev"], rxe.netdev, "{dev:#}");
    assert_eq!(dev["transport"], "InfiniBand", "{dev:#}");
    let port = &dev["ports"][0];
    assert_eq!(port["port"], 1, "{dev:#}");
    assert_eq!(port["state"], "PORT_ACTIVE", "{dev:#}");
    assert_eq!(port["link_layer"], "Ethernet", "{dev:#}");
    assert!(port["active_mtu"].as_u64().is_some(), "{dev:#}");
    let gids = port["gids"].as_array().expect("gids array");
    let found = gids.iter().any(|g| {
        g["type"] == "RoCE v2"
            && g["gid"] == rxe.gid
            && g["ipv4"] == rxe.ipv4
            && g["netdev"] == rxe.netdev
            && g["roce_v2_ipv4"] == true
    });
    assert!(
        found,
        "no RoCE v2 GID ::ffff:{} on {}: {dev:#}",
        rxe.ipv4, rxe.netdev
    );
    for g in gids {
        assert_ne!(
            g["gid"], "0000:0000:0000:0000:0000:0000:0000:0000",
            "zero GID listed: {dev:#}"
        );
    }
}

#[test]
fn devices_lists_both_rxe() {
    let stdout = success_stdout(&["devices"]);
    check_text_block(&stdout, &RXE0);
    check_text_block(&stdout, &RXE1);
    assert!(
        !text_block(&stdout, "rxe0").join("\n").contains(RXE1.ipv4),
        "{stdout}"
    );
    assert!(
        !text_block(&stdout, "rxe1").join("\n").contains(RXE0.ipv4),
        "{stdout}"
    );
}

#[test]
fn devices_json_lists_both_rxe() {
    let stdout = success_stdout(&["devices", "--json"]);
    let v: Value =
        serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("bad JSON ({e}):\n{stdout}"));
    check_json_device(&v, &RXE0);
    check_json_device(&v, &RXE1);
}

#[test]
fn device_filter_shows_only_rxe1() {
    let stdout = success_stdout(&["devices", "-d", "rxe1"]);
    check_text_block(&stdout, &RXE1);
    let headers: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("device "))
        .collect();
    assert_eq!(headers, ["device rxe1"], "{stdout}");

    let stdout = success_stdout(&["devices", "--device", "rxe1", "--json"]);
    let v: Value = serde_json::from_str(&stdout).expect("JSON");
    assert_eq!(v["devices"].as_array().map(Vec::len), Some(1), "{v:#}");
    check_json_device(&v, &RXE1);
}

#[test]
fn unknown_device_names_the_available_ones() {
    let out = rdma_demo(&["devices", "-d", "nosuchdev"]);
    assert_eq!(out.status.code(), Some(3));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(
        lines[0].starts_with("rdma-demo: no RDMA device named \"nosuchdev\" (available: "),
        "{stderr}"
    );
    assert!(
        lines[0].contains("rxe0") && lines[0].contains("rxe1"),
        "{stderr}"
    );
}

// ---------------------------------------------------------------- demos

use std::io::Write as _;
use std::process::Stdio;
use std::time::{Duration, Instant};

#[path = "../../rdma-trace/tests/guest/kill_on_drop.rs"]
mod kill_on_drop;
use kill_on_drop::KillOnDrop;

/// A spawned rdma-demo, killed (and reaped) when dropped, also when a test fails: a demo left
/// behind (some run `-n 1000000`) would run on through the tests after it.
type Running = KillOnDrop;

fn spawn(args: &[&str]) -> Running {
    KillOnDrop::spawn(
        Command::new(bin())
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
    )
}

/// Waits for `child` at most `limit`; kills it and fails the test if it does not exit.
fn wait_within(mut child: Running, limit: Duration, what: &str) -> (Output, Duration) {
    let start = Instant::now();
    loop {
        if child.try_wait().expect("try_wait").is_some() {
            return (child.wait_with_output(), start.elapsed());
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output();
            panic!(
                "{what} still running after {limit:?}; stderr: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Polls `ok` every 20 ms for up to 60 s (a debug build under TCG on a busy machine can be
/// slow); fails the test with `what` otherwise.
fn wait_until(what: &str, mut ok: impl FnMut() -> bool) {
    let start = Instant::now();
    while !ok() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "timed out waiting until {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Until a TCP socket listens on `port` (from /proc/net/tcp{,6}; connecting would use up the
/// server's one accept).
fn wait_listening(port: u16) {
    let needle = format!(":{port:04X} 00000000:0000 0A");
    let needle6 = format!(":{port:04X} 00000000000000000000000000000000:0000 0A");
    wait_until(&format!("something listens on TCP port {port}"), || {
        let tcp = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
        let tcp6 = std::fs::read_to_string("/proc/net/tcp6").unwrap_or_default();
        tcp.contains(&needle) || tcp6.contains(&needle6)
    });
}

/// Whether process `pid` has an RDMA device open (`/dev/infiniband/uverbs*`).
fn device_open(pid: u32) -> bool {
    std::fs::read_dir(format!("/proc/{pid}/fd")).is_ok_and(|d| {
        d.filter_map(Result::ok).any(|e| {
            std::fs::read_link(e.path())
                .is_ok_and(|t| t.to_string_lossy().starts_with("/dev/infiniband/uverbs"))
        })
    })
}

/// Until process `pid` has an RDMA device open: it set up its endpoint and goes on to the TCP
/// exchange.
fn wait_device_open(child: &mut Running) {
    wait_until(
        &format!("rdma-demo {} opened its device", child.id()),
        || {
            assert_eq!(child.try_wait().unwrap(), None, "rdma-demo ended early");
            device_open(child.id())
        },
    );
}

/// Until `child` is in its data phase (its thread renames itself `rdma-demo:data`).
fn wait_data_phase(child: &mut Running) {
    let comm = format!("/proc/{}/comm", child.id());
    wait_until(
        &format!("rdma-demo {} is in its data phase", child.id()),
        || {
            assert_eq!(child.try_wait().unwrap(), None, "rdma-demo ended early");
            std::fs::read_to_string(&comm).is_ok_and(|c| c.trim() == "rdma-demo:data")
        },
    );
}

/// Asserts that rdma-demo exited with `code` and one stderr line that contains each of `says`.
fn assert_failed(out: &Output, code: i32, says: &[&str]) {
    assert_eq!(
        out.status.code(),
        Some(code),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = one_error_line(out);
    for part in says {
        assert!(line.contains(part), "want {part:?} in: {line}");
    }
}

fn one_error_line(out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "want one stderr line: {stderr}");
    assert!(lines[0].starts_with("rdma-demo: "), "{stderr}");
    lines[0].to_string()
}

fn results_dir() -> PathBuf {
    std::env::var_os("RESULTS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir)
}

/// `DEMO --loopback -p 0 -d rxe0 --server-device rxe1 EXTRA`: one process, its client on rxe0
/// and its server on rxe1.
fn loopback<'a>(demo: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let base = [
        demo,
        "--loopback",
        "-p",
        "0",
        "-d",
        "rxe0",
        "--server-device",
        "rxe1",
    ];
    [&base[..], extra].concat()
}

/// Runs a loopback demo rxe0 (client) ↔ rxe1 (server) with --json; returns stdout and JSON.
fn loopback_json(demo: &str, extra: &[&str]) -> (String, Value) {
    let json = results_dir().join(format!("{demo}-{}.json", extra.join("")));
    let json_s = json.to_str().unwrap().to_string();
    let stdout = success_stdout(&loopback(demo, &[&["--json", &json_s], extra].concat()));
    let v: Value =
        serde_json::from_slice(&std::fs::read(&json).expect("JSON written")).expect("JSON parses");
    (stdout, v)
}

fn check_results_block(stdout: &str, sent: u64) {
    for key in [
        "=== Results ===",
        "Total time:",
        "Avg latency:",
        "Total wait/CQ:",
        "Throughput:",
    ] {
        assert!(stdout.contains(key), "no {key:?} in:\n{stdout}");
    }
    assert!(
        stdout.contains(&format!("Messages:       {sent} sent, {sent} received")),
        "{stdout}"
    );
}

fn check_pingpong(mode: &str) {
    let (stdout, v) = loopback_json("pingpong", &["-n", "200", "-s", "64", "--mode", mode]);
    check_results_block(&stdout, 200);
    assert!(
        stdout.contains("rxe0 port 1: using GID index 1 (RoCE v2, ::ffff:10.9.0.1)"),
        "{stdout}"
    );
    assert!(stdout.contains("t_typical[usec]"), "{stdout}");
    assert!(
        stdout.contains("one-way latency = round trip / 2"),
        "{stdout}"
    );
    assert_eq!(v["demo"], "pingpong");
    assert_eq!(v["params"]["iterations"], 200);
    let reports = v["reports"].as_array().expect("reports");
    assert_eq!(reports.len(), 2, "{v:#}");
    let (client, server) = (&reports[0], &reports[1]);
    assert_eq!(client["role"], "client");
    assert_eq!(client["device"], "rxe0");
    assert_eq!(server["device"], "rxe1");
    assert_eq!(client["mode"], mode);
    assert_eq!(client["totals"]["messages_received"], 200);
    let rtt = &client["round_trip_us"];
    let one = &client["one_way_us"];
    assert_eq!(rtt["count"], 200);
    let (min, med, max) = (
        rtt["t_min"].as_f64().unwrap(),
        rtt["t_typical"].as_f64().unwrap(),
        rtt["t_max"].as_f64().unwrap(),
    );
    assert!(0.0 < min && min <= med && med <= max, "{rtt:#}");
    assert!((one["t_typical"].as_f64().unwrap() * 2.0 - med).abs() < 1e-6);
    if mode == "event" {
        assert!(client["cq_events"].as_u64().unwrap() > 0, "{client:#}");
        assert!(server["cq_events"].as_u64().unwrap() > 0, "{server:#}");
    } else {
        assert_eq!(client["cq_events"], 0);
    }
}

#[test]
fn pingpong_poll_rxe0_rxe1() {
    check_pingpong("poll");
}

#[test]
fn pingpong_event_rxe0_rxe1() {
    check_pingpong("event");
}

#[test]
fn pingpong_two_processes_over_10_9() {
    let server = spawn(&[
        "pingpong", "--server", "-d", "rxe1", "-e", "-n", "300", "-s", "128", "--bind", "10.9.0.2",
        "-p", "18610",
    ]);
    wait_listening(18610);
    let client = spawn(&[
        "pingpong", "-d", "rxe0", "-n", "300", "-s", "128", "-p", "18610", "10.9.0.2",
    ]);
    let (c, _) = wait_within(client, Duration::from_secs(60), "client");
    let (s, _) = wait_within(server, Duration::from_secs(60), "server");
    for (out, who) in [(&c, "client"), (&s, "server")] {
        assert_eq!(
            out.status.code(),
            Some(0),
            "{who}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        check_results_block(&String::from_utf8_lossy(&out.stdout), 300);
    }
}

fn check_write_read(mode: &str) {
    let (stdout, v) = loopback_json("write-read", &["-n", "50", "-s", "1000", "--mode", mode]);
    assert!(
        stdout.contains("read from the server: 07 26 45 64"),
        "{stdout}"
    );
    assert!(stdout.contains("RDMA WRITE latency"), "{stdout}");
    assert!(stdout.contains("RDMA READ latency"), "{stdout}");
    let client = &v["reports"][0];
    let server = &v["reports"][1];
    assert_eq!(client["bytes_verified"], 51 * 1000, "{client:#}");
    assert_eq!(server["bytes_verified"], 1000, "{server:#}");
    assert_eq!(client["write_us"]["count"], 50);
    assert_eq!(client["read_us"]["count"], 50);
    assert_eq!(server["totals"]["messages_received"], 1);
}

#[test]
fn write_read_poll_rxe0_rxe1() {
    check_write_read("poll");
}

#[test]
fn write_read_event_rxe0_rxe1() {
    check_write_read("event");
}

#[test]
fn write_pingpong_rxe0_rxe1_like_ib_write_lat() {
    let (stdout, v) = loopback_json("write-pingpong", &["-n", "200", "-s", "4096"]);
    assert!(
        stdout.contains("one-way latency = round trip / 2 (as ib_write_lat)"),
        "{stdout}"
    );
    let client = &v["reports"][0];
    let server = &v["reports"][1];
    assert_eq!(client["role"], "client");
    assert_eq!(server["role"], "server");
    let (rtt, one) = (&client["round_trip_us"], &client["one_way_us"]);
    assert_eq!(rtt["count"], 200);
    let med = rtt["t_typical"].as_f64().unwrap();
    assert!(0.0 < rtt["t_min"].as_f64().unwrap() && med > 0.0, "{rtt:#}");
    assert!((one["t_typical"].as_f64().unwrap() * 2.0 - med).abs() < 1e-6);
    assert_eq!(server["totals"]["messages_received"], 200);
}

/// utime + stime of a running process, in clock ticks (USER_HZ, 100 on Linux).
fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After "pid (comm)": field 3 (state) is index 0, utime (14) index 11, stime (15) index 12.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}

/// The server of a one-sided demo only waits for its client's final message: in poll mode it
/// must not spin a core away from the client and the Soft-RoCE work being measured.
#[test]
fn one_sided_servers_do_not_spin_in_poll_mode() {
    for (demo, port, iterations) in [("write-read", 18620, "1500"), ("atomic", 18621, "1500")] {
        let p = port.to_string();
        let server = spawn(&[
            demo, "--server", "-d", "rxe1", "-n", iterations, "--bind", "10.9.0.2", "-p", &p,
        ]);
        wait_listening(port);
        let pid = server.id();
        let before = cpu_ticks(pid).expect("server's /proc stat");
        let start = Instant::now();
        let mut client = spawn(&[demo, "-d", "rxe0", "-n", iterations, "-p", &p, "10.9.0.2"]);
        // The server's last reading before it exits (it ends right after the client).
        let mut last = before;
        while client.try_wait().expect("try_wait").is_none() {
            assert!(
                start.elapsed() < Duration::from_secs(120),
                "{demo} client still running after 120 s"
            );
            if let Some(t) = cpu_ticks(pid) {
                last = t;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let wall = start.elapsed().as_secs_f64();
        let c = client.wait_with_output();
        assert_eq!(
            c.status.code(),
            Some(0),
            "{demo} client: {}",
            String::from_utf8_lossy(&c.stderr)
        );
        let (s, _) = wait_within(server, Duration::from_secs(60), "server");
        assert_eq!(
            s.status.code(),
            Some(0),
            "{demo} server: {}",
            String::from_utf8_lossy(&s.stderr)
        );
        let busy = (last - before) as f64 / 100.0;
        // Spinning, the server would take about the whole client run.
        assert!(
            busy < 0.25 * wall,
            "{demo} server used {busy:.2} s of CPU during the client's {wall:.2} s"
        );
    }
}

// ---------------------------------------------------------------- faults

#[test]
fn unknown_device_in_a_demo() {
    let out = rdma_demo(&["pingpong", "-d", "nosuchdev", "127.0.0.1", "-p", "1"]);
    assert_failed(&out, 3, &["\"nosuchdev\"", "rxe0, rxe1"]);
}

#[test]
fn gid_index_out_of_range_or_empty() {
    let with_gid = |g| rdma_demo(&["pingpong", "-d", "rxe0", "-x", g, "127.0.0.1", "-p", "1"]);
    let out = with_gid("999");
    assert_failed(&out, 4, &["GID index 999 is out of range"]);
    let out = with_gid("200");
    assert_failed(&out, 4, &["GID index 200 of rxe0 port 1 is empty"]);
}

/// Runs rdma-demo with `args` until it exits; returns its output and the time from when it had
/// its device open (its setup done, under TCG on a busy machine that alone can take seconds)
/// to its exit.
fn time_after_setup(args: &[&str]) -> (Output, Duration) {
    let mut child = spawn(args);
    wait_until("rdma-demo opened its device or ended", || {
        child.try_wait().unwrap().is_some() || device_open(child.id())
    });
    let start = Instant::now();
    let (out, _) = wait_within(child, Duration::from_secs(60), "rdma-demo");
    (out, start.elapsed())
}

#[test]
fn connect_refused_and_accept_timeout() {
    // --timeout 1, not the default 10 s: over well before 8 s once set up.
    let fails_in_time = |args: &[&str], says: &str| {
        let (out, took) =
            time_after_setup(&[&["pingpong", "-d", "rxe0", "--timeout", "1"], args].concat());
        assert!(took < Duration::from_secs(8), "{took:?}");
        assert_failed(&out, 5, &[says]);
    };
    fails_in_time(&["-p", "1", "127.0.0.1"], "Connection refused");
    fails_in_time(&["--server", "-p", "18611"], "no client connected");
}

fn connect_retrying(port: u16) -> std::net::TcpStream {
    // Generous: a debug build starting under TCG on a busy machine can take seconds.
    for _ in 0..600 {
        if let Ok(s) = std::net::TcpStream::connect(("127.0.0.1", port)) {
            return s;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("server on port {port} never listened");
}

/// A pingpong server on rxe1 and `port` with `--timeout timeout`, and a raw TCP client
/// connected to it (in place of an rdma-demo client).
fn server_with_raw_client(port: u16, timeout: &str) -> (Running, std::net::TcpStream) {
    let p = port.to_string();
    let server = spawn(&[
        "pingpong",
        "--server",
        "-d",
        "rxe1",
        "-p",
        &p,
        "--timeout",
        timeout,
    ]);
    (server, connect_retrying(port))
}

/// The server gets `bytes` from a raw TCP client, then the client closes.
fn server_fed(port: u16, bytes: &[u8], keep_open: bool) -> (Output, Duration) {
    let (server, mut s) = server_with_raw_client(port, "2");
    s.write_all(bytes).unwrap();
    if !keep_open {
        drop(s);
        return wait_within(server, Duration::from_secs(8), "server");
    }
    let r = wait_within(server, Duration::from_secs(8), "server");
    drop(s);
    r
}

#[test]
fn garbage_ends_the_server_with_a_clear_error() {
    let (out, took) = server_fed(18612, b"GET / HTTP/1.0\r\n\r\n", true);
    assert!(took < Duration::from_secs(4), "{took:?}");
    assert_failed(&out, 6, &["malformed message", "bad magic"]);
}

#[test]
fn bad_exchange_messages() {
    // Wrong version, oversized, truncated (then closed), and nothing at all (closed).
    let (out, _) = server_fed(18613, b"RDMO\x00\x07\x00\x3c", true);
    assert_failed(&out, 6, &["unsupported protocol version 7"]);
    let (out, _) = server_fed(18614, b"RDMO\x00\x01\xff\xff", true);
    assert_failed(&out, 6, &["oversized message"]);
    let (out, _) = server_fed(18615, b"RDMO\x00\x01\x00\x3c\x01\x00", false);
    assert_failed(&out, 6, &["truncated message"]);
    let (out, _) = server_fed(18616, b"", false);
    assert_failed(&out, 6, &["closed the connection during the exchange"]);
    // Silent peer: the exchange times out.
    let (out, took) = server_fed(18617, b"RDMO", true);
    assert!(took < Duration::from_secs(5), "{took:?}");
    assert_failed(
        &out,
        6,
        &["sent 4 of the 68 bytes of its message within 2 s"],
    );
}

/// A peer that sends a byte every 100 ms gets the whole message's deadline (--timeout 1), not
/// one per read (which would let it hold the server for 68 × 1 s).
#[test]
fn a_slow_drip_peer_is_cut_off_at_the_deadline_of_the_whole_message() {
    let (server, mut s) = server_with_raw_client(18623, "1");
    let start = Instant::now();
    let drip = std::thread::spawn(move || {
        for &b in b"RDMO\x00\x01\x00\x3c".iter().chain(&[0u8; 60]) {
            if s.write_all(&[b]).is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    let (out, _) = wait_within(server, Duration::from_secs(10), "server");
    let took = start.elapsed();
    assert!(took < Duration::from_secs(4), "{took:?}");
    assert_failed(&out, 6, &["bytes of its message within 1 s"]);
    drip.join().unwrap();
}

#[test]
fn mtu_mismatch_fails_both_sides() {
    let server = spawn(&[
        "pingpong", "--server", "-d", "rxe1", "-p", "18618", "--mtu", "512", "-n", "10",
    ]);
    wait_listening(18618);
    let out = rdma_demo(&[
        "pingpong",
        "-d",
        "rxe0",
        "-p",
        "18618",
        "-n",
        "10",
        "127.0.0.1",
    ]);
    assert_failed(&out, 6, &["MTU mismatch: ours is 1024"]);
    let (s, _) = wait_within(server, Duration::from_secs(10), "server");
    assert_failed(&s, 6, &["MTU mismatch: ours is 512"]);
}

#[test]
fn different_runs_on_the_two_sides_are_refused() {
    for (demo, port, extra) in [
        ("pingpong", "18620", &["-s", "64"][..]),
        ("write-read", "18621", &["-s", "64"][..]),
        ("atomic", "18622", &[][..]),
    ] {
        let mut server_args = vec![demo, "--server", "-d", "rxe1", "-p", port, "-n", "10"];
        server_args.extend(extra);
        let server = spawn(&server_args);
        let mut client_args = vec![demo, "-d", "rxe0", "-p", port, "-n", "20"];
        client_args.extend(extra);
        client_args.push("127.0.0.1");
        let out = rdma_demo(&client_args);
        assert_eq!(out.status.code(), Some(6), "{demo} client");
        let line = one_error_line(&out);
        assert!(
            line.contains("we run -n 20") && line.contains("use the same on both sides"),
            "{line}"
        );
        let (s, _) = wait_within(server, Duration::from_secs(15), "server");
        assert_eq!(s.status.code(), Some(6), "{demo} server");
        assert!(one_error_line(&s).contains("we run -n 10"), "{demo} server");
    }
}

/// Kills the client once both sides are in the data phase; the server must end within its
/// --timeout (2 s) with one line: no completion (7), or its last answer failing for want of an
/// ACK (8, when the kill lands while that answer is in flight).
fn peer_dies_mid_run(mode: &str, port: &str) {
    // The client first: it retries connecting, so the server (whose short --timeout also
    // bounds its accept) connects at once however slowly the guest starts processes.
    // The run both sides agree on.
    let both = ["--mode", mode, "-p", port, "-n", "1000000", "-s", "64"];
    let mut client = spawn(&[&["pingpong", "-d", "rxe0"], &both[..], &["127.0.0.1"]].concat());
    wait_device_open(&mut client);
    let mut server = spawn(
        &[
            &["pingpong", "--server", "-d", "rxe1"],
            &both[..],
            &["--timeout", "2"],
        ]
        .concat(),
    );
    wait_data_phase(&mut client);
    wait_data_phase(&mut server);
    client.kill().unwrap();
    let _ = client.wait();
    let (out, took) = wait_within(server, Duration::from_secs(10), "server");
    assert!(took < Duration::from_secs(6), "{took:?}");
    let line = one_error_line(&out);
    let mode_name = if mode == "poll" { "Poll" } else { "Event" };
    match out.status.code() {
        Some(7) => assert!(
            line.contains(&format!("no completion within 2 s ({mode_name} mode)")),
            "{line}"
        ),
        Some(8) => assert!(line.contains("work completion with error status"), "{line}"),
        other => panic!("server exit {other:?}: {line}"),
    }
}

#[test]
fn peer_dies_mid_run_in_event_mode() {
    peer_dies_mid_run("event", "18619");
}

#[test]
fn peer_dies_mid_run_in_poll_mode() {
    peer_dies_mid_run("poll", "18624");
}

/// A short loopback run of `demo` with `--inject-fault FAULT`.
fn with_fault(demo: &str, fault: &str) -> Output {
    let run = [
        "-n",
        "5",
        "-s",
        "64",
        "--timeout",
        "2",
        "--inject-fault",
        fault,
    ];
    rdma_demo(&loopback(demo, &run))
}

#[test]
fn remote_access_error_is_reported() {
    let out = with_fault("write-read", "bad-rkey");
    assert_failed(
        &out,
        8,
        &["client: the first RDMA READ: work completion with error status \"remote access error\""],
    );
}

#[test]
fn failed_qp_transition_names_it_and_the_errno() {
    let out = with_fault("pingpong", "bad-sgid");
    assert_failed(&out, 1, &["ibv_modify_qp(INIT->RTR)", "(os error "]);
}

/// Brings `vb` back up (and waits for rxe1's RoCE v2 GID) even if the test fails.
struct LinkUp;

impl Drop for LinkUp {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "set", "vb", "up"])
            .status();
        for _ in 0..100 {
            let out = rdma_demo(&["devices", "-d", "rxe1"]);
            let s = String::from_utf8_lossy(&out.stdout);
            if s.contains("PORT_ACTIVE") && s.contains("::ffff:10.9.0.2") {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

#[test]
fn port_not_active() {
    let _restore = LinkUp;
    let st = Command::new("ip")
        .args(["link", "set", "vb", "down"])
        .status()
        .expect("run ip");
    assert!(st.success());
    let client = || rdma_demo(&["pingpong", "-d", "rxe1", "-p", "1", "127.0.0.1"]);
    let mut out = client();
    for _ in 0..50 {
        if out.status.code() == Some(4) {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
        out = client();
    }
    assert_failed(&out, 4, &["rxe1 port 1 is PORT_DOWN, not PORT_ACTIVE"]);
}

fn check_atomic(mode: &str, clients: &str) {
    let (stdout, v) = loopback_json(
        "atomic",
        &["-n", "20", "--clients", clients, "--mode", mode],
    );
    let n: u64 = clients.parse().unwrap();
    let expected = n * (n + 1) / 2 * 20;
    assert!(
        stdout.contains(&format!(
            "final counter: {expected} (expected {expected}: correct)"
        )),
        "{stdout}"
    );
    let reports = v["reports"].as_array().expect("reports");
    assert_eq!(reports.len() as u64, n + 1, "{v:#}");
    let server = &reports[n as usize];
    assert_eq!(server["role"], "server");
    assert_eq!(server["final_counter"], expected);
    assert_eq!(server["final_lock"], 0);
    assert_eq!(server["final_inside"], 0);
    let mut ids: Vec<u64> = reports[..n as usize]
        .iter()
        .map(|r| {
            assert_eq!(r["role"], "client");
            let attempts = r["lock_attempts"].as_u64().unwrap();
            let retries = r["lock_retries"].as_u64().unwrap();
            assert_eq!(attempts - retries, 20, "{r:#}");
            assert_eq!(r["hold_us"]["count"], 20);
            r["client_id"].as_u64().unwrap()
        })
        .collect();
    ids.sort_unstable();
    assert_eq!(ids, (1..=n).collect::<Vec<_>>());
}

#[test]
fn atomic_one_client_event() {
    check_atomic("event", "1");
}

#[test]
fn atomic_four_clients_poll_no_overlap() {
    check_atomic("poll", "4");
}

#[test]
fn atomic_two_clients_event_no_overlap() {
    check_atomic("event", "2");
}

/// `--repeat OP`: one atomic on one word, `-n` times per client, as ib_atomic_lat measures.
/// Two clients share the word, so a CAS can lose to the other client and is retried.
fn check_atomic_repeat(op: &str, mode: &str) {
    let (stdout, v) = loopback_json(
        "atomic",
        &["-n", "30", "--clients", "2", "--repeat", op, "--mode", mode],
    );
    // Clients 1 and 2 each add their id 30 times.
    assert!(
        stdout.contains("final counter: 90 (expected 90: correct)"),
        "{stdout}"
    );
    let reports = v["reports"].as_array().expect("reports");
    assert_eq!(reports.len(), 3, "{v:#}");
    assert_eq!(reports[2]["role"], "server");
    assert_eq!(reports[2]["final_counter"], 90);
    assert_eq!(reports[2]["final_lock"], 0, "the lock word is untouched");
    assert!(
        !stdout.contains("no overlap seen"),
        "no lock was taken: {stdout}"
    );
    for r in &reports[..2] {
        assert_eq!(r["role"], "client");
        assert_eq!(r["repeat"], op, "{r:#}");
        assert!(r["hold_us"].is_null(), "no lock rounds: {r:#}");
        match op {
            "faa" => {
                assert_eq!(r["fetch_add_us"]["count"], 30, "{r:#}");
                assert!(r["cmp_swap_us"].is_null(), "{r:#}");
                assert!(r["lock_attempts"].is_null(), "{r:#}");
                // Its last add saw at least its own 29 earlier ones.
                let id = r["client_id"].as_u64().unwrap();
                assert!(r["last_fetched"].as_u64().unwrap() >= 29 * id, "{r:#}");
            }
            _ => {
                let attempts = r["lock_attempts"].as_u64().unwrap();
                let retries = r["lock_retries"].as_u64().unwrap();
                assert_eq!(attempts - retries, 30, "{r:#}");
                assert_eq!(
                    r["cmp_swap_us"]["count"], attempts,
                    "every CAS is timed: {r:#}"
                );
                assert!(r["fetch_add_us"].is_null(), "{r:#}");
                assert!(r["last_fetched"].is_null(), "no Fetch-and-Add: {r:#}");
            }
        }
    }
    let line = match op {
        "faa" => "Fetch-and-Add repeated on one word, 30 rounds",
        _ => "Compare-and-Swap repeated on one word, 30 rounds",
    };
    assert!(stdout.contains(line), "{stdout}");
}

#[test]
fn atomic_repeat_fetch_add_poll() {
    check_atomic_repeat("faa", "poll");
}

#[test]
fn atomic_repeat_compare_swap_event() {
    check_atomic_repeat("cas", "event");
}

//! `rdma-trace run -- CMD`, `--pid`, `--all` and `--timeline` on programs nobody here wrote
//! (ibv_rc_pingpong, perftest's ib_send_lat), between rxe0 and rxe1.

use std::{
    collections::HashMap,
    process::{Command, Stdio},
    time::Duration,
};

use serde_json::Value;

use super::{
    RDMA_TRACE,
    harness::{
        KillOnDrop, Outcome, find_by, kernel_release, probe, rdma_trace, run_demo, run_json,
        signal, wait_tracing,
    },
    kprobes_left, read_json, roce_v2_gid_index, temp_json, wait_timeout,
};

/// A shell line that waits (up to 60 s) until a TCP socket listens on `port`.
fn wait_port(port: u16) -> String {
    format!(
        "i=0; until grep -q ':{port:04X} 00000000:0000 0A' /proc/net/tcp; do \
         i=$((i+1)); [ $i -gt 600 ] && exit 99; sleep 0.1; done"
    )
}

/// `server & wait until it listens; client`, as one CMD: server on rxe1, client on rxe0. Its
/// status is the client's when that failed, else the server's.
fn pair(server: &str, client: &str, port: u16) -> String {
    format!(
        "{server} & s=$!; {} ; {client}; c=$?; wait $s; w=$?; [ $c -ne 0 ] && exit $c; exit $w",
        wait_port(port)
    )
}

fn gids() -> (String, String) {
    (
        roce_v2_gid_index("rxe0", [10, 9, 0, 1]).to_string(),
        roce_v2_gid_index("rxe1", [10, 9, 0, 2]).to_string(),
    )
}

fn rc_pingpong_pair(event: bool, iters: u32, port: u16) -> String {
    let (g0, g1) = gids();
    let e = if event { " -e" } else { "" };
    pair(
        &format!("timeout 180 ibv_rc_pingpong -d rxe1 -g {g1} -n {iters} -p {port}{e} >/dev/null"),
        &format!(
            "timeout 180 ibv_rc_pingpong -d rxe0 -g {g0} -n {iters} -p {port}{e} 10.9.0.2 >/dev/null"
        ),
        port,
    )
}

/// An `ib_send_lat` pair whose sides `timeout` ends after `limit` seconds (status 124).
fn send_lat_pair(event: bool, iters: u32, port: u16, limit: u32) -> String {
    let (g0, g1) = gids();
    let e = if event { " -e" } else { "" };
    pair(
        &format!(
            "timeout {limit} ib_send_lat -F -d rxe1 -x {g1} -n {iters} -p {port}{e} >/dev/null"
        ),
        &format!(
            "timeout {limit} ib_send_lat -F -d rxe0 -x {g0} -n {iters} -p {port}{e} 10.9.0.2 >/dev/null"
        ),
        port,
    )
}

/// Whether this guest runs the 6.1 kernel.
fn kernel_6_1() -> bool {
    kernel_release().starts_with("6.1.")
}

/// `rdma-trace run --no-tui --json J [extra] -- sh -c CMD`: (status, stdout, the JSON
/// document).
fn run_cmd(extra: &[&str], cmd: &str, name: &str) -> (Option<i32>, String, Value) {
    let out = run_json(
        &[&["run", "--no-tui"], extra, &["--", "sh", "-c", cmd]].concat(),
        name,
    );
    assert!(!out.report.is_null(), "no report; stderr: {}", out.stderr);
    (out.status.code(), out.stdout, out.report)
}

/// A workload run's one phase, after checking the document's shape: schema 1, one phase, the
/// load named with `kind`.
fn only_phase<'a>(doc: &'a Value, kind: &str) -> &'a Value {
    assert_eq!(doc["schema_version"], 1, "{doc}");
    assert_eq!(doc["load"]["kind"], kind, "{}", doc["load"]);
    let phases = doc["phases"].as_array().expect("phases");
    assert_eq!(phases.len(), 1, "a workload run has one window");
    &phases[0]
}

/// The window of a `-- CMD` run whose command (`what`) exited 0 and took completion events: it
/// ended with the command, whose status the report carries.
fn event_command_window<'a>(
    doc: &'a Value,
    status: Option<i32>,
    what: &str,
    stdout: &str,
) -> &'a Value {
    let report = only_phase(doc, "command");
    assert_eq!(status, Some(0), "{what} (timeout: 124): {stdout}");
    assert_eq!(report["window"]["ended_by"], "command");
    assert_eq!(report["window"]["command_status"], 0);
    assert_eq!(report["completion_mode"], "completion events");
    report
}

fn probe_count(report: &Value, name: &str) -> u64 {
    let p = probe(report, name);
    assert!(p["skipped"].is_null(), "{name} skipped: {}", p["skipped"]);
    p["count"].as_u64().expect("count")
}

fn processes<'a>(report: &'a Value, comm: &str) -> Vec<&'a Value> {
    report["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .filter(|p| p["comm"] == comm)
        .collect()
}

#[test]
fn run_cmd_ibv_rc_pingpong_event_pair_counts_completion_events_per_process() {
    let iters = 300;
    let (status, stdout, doc) = run_cmd(&[], &rc_pingpong_pair(true, iters, 18_601), "rc-e");
    let report = event_command_window(&doc, status, "ibv_rc_pingpong -e pair", &stdout);
    let handled = probe_count(report, "ib_uverbs_comp_handler");
    assert!(
        handled >= u64::from(iters),
        "{handled} completion events for {iters} iterations"
    );
    // Both processes, each reading completion events; their reads add up to the events.
    let both = processes(report, "ibv_rc_pingpong");
    assert_eq!(both.len(), 2, "{}", report["processes"]);
    let pids: Vec<u64> = both.iter().map(|p| p["pid"].as_u64().unwrap()).collect();
    assert_ne!(pids[0], pids[1]);
    let mut read = 0;
    for p in &both {
        let n = p["completion_events_read"].as_u64().expect("events read");
        assert!(n >= u64::from(iters) / 2, "{p}");
        read += n;
    }
    assert!(read <= handled + 2, "{read} read, {handled} queued");
    assert!(
        stdout.contains("completion mode seen: completion events"),
        "{stdout}"
    );
    assert!(stdout.contains("ibv_rc_pingpong"), "{stdout}");
    assert!(kprobes_left().trim().is_empty(), "{}", kprobes_left());
}

#[test]
fn run_cmd_ibv_rc_pingpong_polling_pair_takes_no_completion_events() {
    let (status, stdout, doc) = run_cmd(&[], &rc_pingpong_pair(false, 300, 18_602), "rc-p");
    let report = only_phase(&doc, "command");
    assert_eq!(status, Some(0), "{stdout}");
    assert_eq!(probe_count(report, "ib_uverbs_comp_handler"), 0);
    assert_eq!(report["completion_mode"], "none");
    // The traffic itself was seen: rxe posted the completions.
    assert!(probe_count(report, "rxe_cq_post") >= 300);
    let both = processes(report, "ibv_rc_pingpong");
    assert_eq!(both.len(), 2, "{}", report["processes"]);
    for p in both {
        assert_eq!(p["completion_events_read"], 0, "{p}");
    }
    assert!(stdout.contains("completion mode seen: none"), "{stdout}");
}

/// perftest's `ib_send_lat -e` pair under `run -- CMD`.
///
/// In the 6.12 guest the bare pair (without rdma-trace) loses a completion event in most runs:
/// both sides then block in `ib_uverbs_event_read` for good (measured: 3 of 4 bare runs; polling
/// pairs and `ibv_rc_pingpong -e` never do). On 6.1 it mostly completes, but one full test run
/// on a loaded host saw it stall there too (the `--pid` test's pair). So the test accepts that
/// outcome on both kernels, and checks what rdma-trace reports about it: the command's status (124 or 143
/// from `timeout`), both processes, and the events they read before the stall, no more than the
/// handler queued.
#[test]
fn run_cmd_ib_send_lat_event_pair() {
    let on_6_1 = kernel_6_1();
    let limit = if on_6_1 { 180 } else { 60 };
    let (status, stdout, doc) = run_cmd(&[], &send_lat_pair(true, 300, 18_603, limit), "sl-e");
    let report = only_phase(&doc, "command");
    // `timeout` ends a stalled side: 124, or 143 when the TERM reached the shell first.
    let stalled = matches!(status, Some(124 | 143));
    if stalled {
        eprintln!(
            "note: the ib_send_lat -e pair lost a completion event and stalled (a known \
             rxe/perftest behaviour, seen without rdma-trace on 6.12): checking the report of \
             the stall"
        );
    } else {
        assert_eq!(
            status,
            Some(0),
            "ib_send_lat -e pair (timeout: 124): {stdout}"
        );
    }
    assert_eq!(report["window"]["command_status"], status.unwrap_or(-1));
    assert_eq!(report["completion_mode"], "completion events");
    let handled = probe_count(report, "ib_uverbs_comp_handler");
    let both = processes(report, "ib_send_lat");
    assert_eq!(both.len(), 2, "{}", report["processes"]);
    let mut read = 0;
    for p in &both {
        let n = p["completion_events_read"].as_u64().expect("events read");
        assert!(n >= if stalled { 1 } else { 150 }, "{p}");
        read += n;
    }
    assert!(read <= handled + 2, "{read} read, {handled} queued");
    if !stalled {
        assert!(handled >= 300, "{handled}");
    }
}

#[test]
fn run_cmd_ib_send_lat_polling_pair() {
    let (status, stdout, doc) = run_cmd(&[], &send_lat_pair(false, 300, 18_604, 180), "sl-p");
    let report = only_phase(&doc, "command");
    assert_eq!(status, Some(0), "ib_send_lat pair (timeout: 124): {stdout}");
    assert_eq!(probe_count(report, "ib_uverbs_comp_handler"), 0);
    assert_eq!(report["completion_mode"], "none");
    assert!(probe_count(report, "rxe_cq_post") >= 300);
    assert_eq!(
        processes(report, "ib_send_lat").len(),
        2,
        "{}",
        report["processes"]
    );
}

#[test]
fn run_cmd_exits_with_the_commands_status_and_names_its_children() {
    let (status, stdout, doc) = run_cmd(&[], "sleep 0.2 & sleep 0.3 & wait; exit 7", "status");
    let report = only_phase(&doc, "command");
    assert_eq!(status, Some(7), "{stdout}");
    assert_eq!(report["window"]["command_status"], 7);
    assert_eq!(report["completion_mode"], "none");
    assert_eq!(
        processes(report, "sleep").len(),
        2,
        "{}",
        report["processes"]
    );
    assert_eq!(processes(report, "sh").len(), 1, "{}", report["processes"]);
}

/// A shell line that waits (up to 60 s) until an rdma_cm id listens on `port` (its
/// `rdma res show cm_id` line: `state LISTEN`, `src-addr ADDR:PORT`).
fn wait_cm_listen(port: u16) -> String {
    format!(
        "i=0; until /usr/bin/rdma res show cm_id | grep 'state LISTEN' | grep -q ':{port} '; do \
         i=$((i+1)); [ $i -gt 600 ] && exit 99; sleep 0.1; done"
    )
}

/// `server & wait until LISTEN; client`, as one CMD, with the status of [`pair`].
fn cm_pair(server: &str, client: &str, listen: &str) -> String {
    format!(
        "{server} & s=$!; {listen} ; {client}; c=$?; wait $s; w=$?; [ $c -ne 0 ] && exit $c; exit $w"
    )
}

/// The traced processes named `comm` that read completion events, each with its waterfall
/// (`waterfall.processes`, by pid) of events > 0; `want` of them.
fn with_events_and_waterfall<'a>(report: &'a Value, comm: &str, want: usize) -> Vec<&'a Value> {
    let procs: Vec<&Value> = processes(report, comm)
        .into_iter()
        .filter(|p| p["completion_events_read"].as_u64().expect("events read") > 0)
        .collect();
    assert_eq!(procs.len(), want, "{comm}: {}", report["processes"]);
    let waterfall = report["waterfall"]["processes"]
        .as_array()
        .expect("waterfall processes");
    for p in &procs {
        let w = find_by(waterfall, "pid", p["pid"].clone())
            .unwrap_or_else(|| panic!("no waterfall for {p}: {waterfall:?}"));
        assert_eq!(w["comm"], comm, "{w}");
        let events = w["events"].as_u64().expect("waterfall events");
        assert!(events > 0, "{w}");
        // The waterfall counts the events the process waited for, which it then read.
        let read = p["completion_events_read"].as_u64().unwrap();
        assert!(events <= read + 2, "waterfall {events}, read {read}: {w}");
    }
    procs
}

/// rping (librdmacm's ping: rdma_cm connection, a completion channel read by its cq thread)
/// between rxe1 (server, 10.9.0.2) and rxe0 (client, bound to 10.9.0.1), under `run -- CMD`.
/// Each ping is a SEND, an RDMA READ, a SEND, an RDMA WRITE and a SEND between the two sides,
/// each side blocking in `ibv_get_cq_event` for its completions: both processes read completion
/// events, and each gets its own waterfall.
#[test]
fn run_cmd_rping_pair_reads_completion_events_with_a_waterfall_per_side() {
    let (count, port) = (200u64, 18_611);
    let cmd = cm_pair(
        &format!("timeout 180 rping -s -a 10.9.0.2 -p {port} -C {count} >/dev/null"),
        &format!("timeout 180 rping -c -a 10.9.0.2 -I 10.9.0.1 -p {port} -C {count} >/dev/null"),
        &wait_cm_listen(port),
    );
    let (status, stdout, doc) = run_cmd(&[], &cmd, "rping");
    let report = event_command_window(&doc, status, "rping pair", &stdout);
    let handled = probe_count(report, "ib_uverbs_comp_handler");
    let both = with_events_and_waterfall(report, "rping", 2);
    assert_ne!(both[0]["pid"], both[1]["pid"]);
    let mut read = 0;
    for p in &both {
        let n = p["completion_events_read"].as_u64().unwrap();
        assert!(n >= count, "{count} pings: {p}");
        read += n;
    }
    assert!(read <= handled + 2, "{read} read, {handled} queued");
    assert!(
        stdout.contains("completion mode seen: completion events"),
        "{stdout}"
    );
    check_one_rdma_cm_connection(report, &stdout);
    assert!(kprobes_left().trim().is_empty(), "{}", kprobes_left());
}

/// librdmacm's own examples, rdma_server and rdma_client (one SEND each way over an rdma_cm
/// connection), under `run -- CMD`. `rdma_get_recv_comp`/`rdma_get_send_comp` poll first and
/// block in `ibv_get_cq_event` only when nothing is there: with one message each way, a side
/// whose message arrived while it was still in `rdma_accept` or `rdma_connect` reads no event
/// (one run in three here read none at all). What is certain is their one rdma_cm connection,
/// and that each process that read an event has its waterfall.
#[test]
fn run_cmd_rdma_server_and_client_make_one_rdma_cm_connection() {
    let port = 18_613;
    let cmd = cm_pair(
        &format!("timeout 120 rdma_server -s 10.9.0.2 -p {port} >/dev/null"),
        &format!("timeout 120 rdma_client -s 10.9.0.2 -p {port} >/dev/null"),
        &wait_cm_listen(port),
    );
    let (status, stdout, doc) = run_cmd(&[], &cmd, "rdma-server-client");
    let report = only_phase(&doc, "command");
    assert_eq!(
        status,
        Some(0),
        "rdma_server/rdma_client (timeout: 124): {stdout}"
    );
    assert_eq!(report["window"]["command_status"], 0);
    let handled = probe_count(report, "ib_uverbs_comp_handler");
    let mut read = 0;
    for comm in ["rdma_server", "rdma_client"] {
        assert_eq!(processes(report, comm).len(), 1, "{}", report["processes"]);
        let waited = processes(report, comm)
            .into_iter()
            .filter(|p| p["completion_events_read"].as_u64().unwrap() > 0)
            .count();
        for p in with_events_and_waterfall(report, comm, waited) {
            read += p["completion_events_read"].as_u64().unwrap();
        }
    }
    // One receive and one send completion per side at most woke it.
    assert!(
        read <= 4 && read <= handled + 2,
        "{read} read, {handled} queued"
    );
    check_one_rdma_cm_connection(report, &stdout);
    assert!(kprobes_left().trim().is_empty(), "{}", kprobes_left());
}

/// The rdma_cm section and row of a window in which one librdmacm client connected to one
/// librdmacm server (the truth: the pair's own programs make one connection): the client
/// resolved its address and route once and got the REP (CONNECT_RESPONSE: its QP is user
/// space's, so librdmacm makes its ESTABLISHED), the server got one CONNECT_REQUEST and one
/// ESTABLISHED; both ends have a set-up time (the client's from its REQ, the server's from the
/// request), within the window.
fn check_one_rdma_cm_connection(report: &Value, stdout: &str) {
    let cm = &report["rdma_cm"];
    let events = &cm["events"];
    for (kind, n) in [
        ("ADDR_RESOLVED", 1),
        ("ROUTE_RESOLVED", 1),
        ("CONNECT_REQUEST", 1),
        ("CONNECT_RESPONSE", 1),
        ("ESTABLISHED", 1),
    ] {
        assert_eq!(events[kind], n, "{kind}: {cm}");
    }
    assert_eq!(cm["failures"], 0, "{cm}");
    assert_eq!(cm["starts_lost"], 0, "{cm}");
    let row = probe(report, "rdma_cm connect");
    assert_eq!(row["attach"], "raw_tp", "{row}");
    assert_eq!(row["count"], 2, "one set-up end per end: {row}");
    assert_eq!(
        row["unmatched"], 0,
        "both ends started in the window: {row}"
    );
    assert_eq!(row["summary"]["count"], 2, "{row}");
    let max_ns = row["summary"]["max"].as_u64().expect("set-up max");
    let window_ns = report["window"]["seconds"].as_f64().unwrap() * 1e9;
    assert!(max_ns > 0 && (max_ns as f64) < 2.0 * window_ns, "{row}");
    assert!(stdout.contains("rdma_cm events ("), "{stdout}");
    assert!(stdout.contains("ESTABLISHED 1"), "{stdout}");
}

/// The event-mode pair that `--pid` attaches to: (program, server args, client args).
///
/// `ibv_rc_pingpong -e` on both kernels: an `ib_send_lat -e` pair loses a completion event in
/// most runs in the 6.12 guest, without rdma-trace too, and it stalled once in the 6.1 guest too
/// (under `--pid`, on a loaded host; see `run_cmd_ib_send_lat_event_pair`). The README says so.
fn pid_pair(iters: u32, port: u16) -> (&'static str, Vec<String>, Vec<String>) {
    let (g0, g1) = gids();
    let (iters, port) = (iters.to_string(), port.to_string());
    let args = |v: &[&str]| v.iter().map(|a| (*a).to_owned()).collect::<Vec<_>>();
    (
        "ibv_rc_pingpong",
        args(&["-e", "-d", "rxe1", "-g", &g1, "-n", &iters, "-p", &port]),
        args(&[
            "-e", "-d", "rxe0", "-g", &g0, "-n", &iters, "-p", &port, "10.9.0.2",
        ]),
    )
}

#[test]
fn pid_counts_the_completion_events_of_a_running_event_mode_server() {
    // The server runs (it listens) before rdma-trace attaches to it; its client starts once
    // rdma-trace traces.
    let (iters, port) = (300, 18_605);
    let (program, server_args, client_args) = pid_pair(iters, port);
    let mut server = KillOnDrop::spawn(
        Command::new(program)
            .args(&server_args)
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    );
    super::wait_listening(port);
    let json = temp_json("pid");
    let mut tracer = KillOnDrop::spawn(
        Command::new(RDMA_TRACE)
            .args(["run", "--no-tui", "--json", json.to_str().unwrap()])
            .args(["--pid", &server.id().to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::piped()),
    );
    // Attached once it says what it traces.
    let mut err = wait_tracing(&mut tracer);
    let client = Command::new("timeout")
        .arg("180")
        .arg(program)
        .args(&client_args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("run the client");
    assert!(
        client.success(),
        "{program} client (timeout: 124): {client}"
    );
    assert!(wait_timeout(&mut server, Duration::from_secs(120)).success());
    // The server exited: the run ends, a success (status 0), saying so in one line.
    let status = wait_timeout(&mut tracer, Duration::from_secs(120));
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut err, &mut rest).unwrap();
    assert_eq!(status.code(), Some(0), "{rest}");
    let last = rest.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("rdma-trace: every traced process exited"),
        "{rest}"
    );
    let doc = read_json(&json);
    let report = only_phase(&doc, "pids");
    assert_eq!(report["window"]["ended_by"], "exited");
    let traced = processes(report, program);
    assert_eq!(traced.len(), 1, "{}", report["processes"]);
    assert_eq!(traced[0]["pid"], server.id());
    let read = traced[0]["completion_events_read"].as_u64().unwrap();
    assert!(read >= u64::from(iters) / 2, "server read {read} events");
    assert!(probe_count(report, "ib_uverbs_comp_handler") >= read);
}

#[test]
fn all_traces_every_process_until_ctrl_c() {
    let json = temp_json("all");
    let mut tracer = KillOnDrop::spawn(
        Command::new(RDMA_TRACE)
            .args(["run", "--no-tui", "--all", "--duration", "600"])
            .args(["--json", json.to_str().unwrap()])
            .stdout(Stdio::null())
            .stderr(Stdio::piped()),
    );
    let mut err = wait_tracing(&mut tracer);
    let load = Command::new("sh")
        .args(["-c", &rc_pingpong_pair(true, 300, 18_606)])
        .status()
        .expect("run the load");
    assert!(load.success(), "the ping-pong pair failed: {load}");
    // kill(1) sends SIGINT, as Ctrl-C does.
    let _ = signal(&tracer, "-INT");
    let status = wait_timeout(&mut tracer, Duration::from_secs(60));
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut err, &mut rest).unwrap();
    assert!(status.success(), "{status}: {rest}");
    let doc = read_json(&json);
    let report = only_phase(&doc, "all");
    assert_eq!(doc["load"]["target"], "all");
    assert_eq!(report["window"]["ended_by"], "interrupted");
    let handled = probe_count(report, "ib_uverbs_comp_handler");
    assert!(
        handled >= 300,
        "{handled} completion handler calls: {}\n{}",
        report["probes"],
        report["processes"]
    );
    let pp = processes(report, "ibv_rc_pingpong");
    assert_eq!(pp.len(), 2, "{}", report["processes"]);
    for p in pp {
        assert!(p["completion_events_read"].as_u64() > Some(0), "{p}");
    }
    assert!(report["processes"].as_array().unwrap().len() <= 20);
}

#[test]
fn a_pid_that_does_not_exist_fails_before_attaching() {
    let out = rdma_trace(&["run", "--no-tui", "--pid", "4194304"]);
    out.assert_fails_in_one_line(1, "--pid 4194304: no such process");
    assert!(kprobes_left().trim().is_empty());
}

/// A strict reader of Chrome trace-event JSON, independent of the writer: the top level, every
/// event's fields and types, B/E balance and matching per (pid, tid) track, and time order.
/// Returns the slices (name, pid, tid) in the order they begin.
fn check_trace_events(doc: &Value) -> Vec<(String, u64, u64)> {
    let obj = doc.as_object().expect("top level is an object");
    for k in obj.keys() {
        assert!(
            ["traceEvents", "displayTimeUnit", "otherData"].contains(&k.as_str()),
            "unknown top-level key {k}"
        );
    }
    let events = doc["traceEvents"].as_array().expect("traceEvents array");
    let mut open: HashMap<(u64, u64), Vec<(String, f64)>> = HashMap::new();
    let mut slices = Vec::new();
    let mut last = 0.0f64;
    let mut metadata_done = false;
    for e in events {
        let e = e.as_object().expect("event object");
        let ph = e["ph"].as_str().expect("ph");
        let pid = e["pid"].as_u64().expect("integer pid");
        let tid = e["tid"].as_u64().expect("integer tid");
        if ph == "M" {
            assert!(!metadata_done, "metadata after events");
            assert!(
                ["process_name", "thread_name", "process_sort_index"]
                    .contains(&e["name"].as_str().unwrap()),
                "{e:?}"
            );
            assert!(e["args"].is_object());
            continue;
        }
        metadata_done = true;
        let ts = e["ts"].as_f64().expect("numeric ts");
        assert!(ts.is_finite() && ts >= 0.0, "ts {ts}");
        assert!(ts >= last, "time goes back: {ts} after {last}");
        last = ts;
        let stack = open.entry((pid, tid)).or_default();
        match ph {
            "B" => {
                let name = e["name"].as_str().expect("name").to_owned();
                assert!(!name.is_empty());
                assert!(e["cat"].is_string());
                stack.push((name.clone(), ts));
                slices.push((name, pid, tid));
            }
            "E" => {
                let (name, start) = stack.pop().expect("E without a B on its track");
                assert!(ts >= start, "{name} ends before it begins");
            }
            "i" => assert_eq!(e["s"], "t", "instant scope"),
            other => panic!("unexpected phase {other}"),
        }
    }
    for (track, stack) in open {
        assert!(stack.is_empty(), "unclosed slices on {track:?}: {stack:?}");
    }
    slices
}

#[test]
fn timeline_of_an_event_pair_is_valid_nested_and_bounded() {
    let path = temp_json("timeline");
    let path_s = path.to_str().unwrap().to_owned();
    // The full preset: softirq rows (raw tracepoints) have slices too.
    let (status, stdout, run_doc) = run_cmd(
        &[
            "--timeline",
            &path_s,
            "--timeline-sample",
            "10",
            "--probes",
            "full",
        ],
        &rc_pingpong_pair(true, 300, 18_607),
        "tl",
    );
    only_phase(&run_doc, "command");
    assert_eq!(status, Some(0), "{stdout}");
    assert!(stdout.contains("ui.perfetto.dev"), "{stdout}");
    let doc: Value =
        serde_json::from_slice(&std::fs::read(&path).expect("timeline file")).expect("JSON");
    let slices = check_trace_events(&doc);
    let summary = &run_doc["timeline"];
    assert_eq!(
        summary["track_slices"].as_u64().unwrap(),
        slices.len() as u64
    );
    // The probe table's slices are on two tracks (CPU and thread), the waterfall's stages on
    // the reading thread's only.
    let is_stage = |n: &str| n == "completion event" || n.contains(" → ");
    let stage_slices = slices.iter().filter(|(n, _, _)| is_stage(n)).count() as u64;
    let distinct = summary["slices"].as_u64().unwrap() - stage_slices;
    let on_tracks = slices.len() as u64 - stage_slices;
    assert!(distinct * 2 >= on_tracks && distinct * 19 / 10 <= on_tracks);
    assert!(summary["completions"].as_u64().unwrap() >= 10, "{summary}");
    assert!(
        summary["waterfall_events"].as_u64().unwrap() >= 10,
        "{summary}"
    );
    let names: Vec<&str> = slices.iter().map(|(n, _, _)| n.as_str()).collect();
    for want in ["ib_uverbs_comp_handler", "rxe_cq_post", "softirq NET_RX"] {
        assert!(names.contains(&want), "no {want} slice: {summary}");
    }
    // On CPU tracks and on the pingpong threads' tracks.
    let meta: Vec<&Value> = doc["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "M" && e["name"] == "process_name")
        .collect();
    let pid_of = |prefix: &str| {
        meta.iter()
            .filter(|m| m["args"]["name"].as_str().unwrap().starts_with(prefix))
            .map(|m| m["pid"].as_u64().unwrap())
            .collect::<Vec<_>>()
    };
    let cpus = pid_of("CPUs");
    assert_eq!(cpus.len(), 1);
    assert!(slices.iter().any(|(_, p, _)| *p == cpus[0]));
    let pp = pid_of("ibv_rc_pingpong");
    assert!(!pp.is_empty(), "{meta:?}");
    assert!(slices.iter().any(|(_, p, _)| pp.contains(p)));
    // Each completion event of the waterfall is on a pingpong thread's track, with its stages
    // (checked nested above): the read's at least.
    let events: Vec<_> = slices
        .iter()
        .filter(|(n, _, _)| n == "completion event")
        .collect();
    assert!(events.len() >= 10, "{} completion events", events.len());
    assert!(events.iter().all(|(_, p, _)| pp.contains(p)), "{events:?}");
    assert!(
        names
            .iter()
            .any(|n| n.starts_with("on CPU → read returns") || n.starts_with("already awake")),
        "no read stage: {names:?}"
    );

    // The size bound holds.
    let (status, _, run_doc) = run_cmd(
        &["--timeline", &path_s, "--timeline-max-events", "300"],
        &rc_pingpong_pair(true, 300, 18_608),
        "tl-small",
    );
    only_phase(&run_doc, "command");
    assert_eq!(status, Some(0));
    let doc: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let _ = std::fs::remove_file(&path);
    check_trace_events(&doc);
    let n = doc["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] != "M")
        .count();
    assert!(n > 0 && n <= 300, "{n} events");
    assert!(run_doc["timeline"]["left_out"].as_u64().unwrap() > 0);
}

#[test]
fn an_unwritable_timeline_fails_before_attaching() {
    let out = rdma_trace(&[
        "run",
        "--no-tui",
        "--timeline",
        "/proc/version/trace.json",
        "--",
        "true",
    ]);
    out.assert_fails_in_one_line(1, "cannot write there");
    assert!(kprobes_left().trim().is_empty());
}

#[test]
fn timeline_of_the_demo_run_names_the_demo_threads() {
    let path = temp_json("timeline-demo");
    let run = run_demo(
        "event",
        200,
        &["--timeline", path.to_str().unwrap()],
        "timeline-demo-report",
    );
    run.assert_success("rdma-trace run");
    let doc: Value =
        serde_json::from_slice(&std::fs::read(&path).expect("timeline file")).expect("JSON");
    let _ = std::fs::remove_file(&path);
    let slices = check_trace_events(&doc);
    assert!(slices.iter().any(|(n, _, _)| n == "ib_uverbs_comp_handler"));
    assert_eq!(
        run.report["timeline"]["track_slices"].as_u64().unwrap(),
        slices.len() as u64
    );
    assert!(
        doc["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["name"] == "process_name"
                && e["args"]["name"].as_str().unwrap().starts_with("rdma-demo")),
        "no track of the demo"
    );
}

#[test]
fn json_on_stdout_is_all_of_stdout_and_a_demo_run_has_the_keys_of_a_command_run() {
    let (demo, doc) = Outcome::json_on_stdout(&[
        "run",
        "--no-tui",
        "--mode",
        "event",
        "--iterations",
        "100",
        "--json",
        "-",
    ]);
    assert_eq!(doc["load"]["kind"], "demo");
    // The text report is not lost: it went to stderr.
    assert!(demo.stderr.contains("--- rdma-demo ---"), "{}", demo.stderr);
    let (status, _, cmd) = run_cmd(&[], "true", "shape");
    assert_eq!(status, Some(0));
    only_phase(&cmd, "command");
    let keys =
        |v: &Value| -> Vec<String> { v.as_object().expect("an object").keys().cloned().collect() };
    assert_eq!(keys(&doc), keys(&cmd));
    assert_eq!(keys(&doc["phases"][0]), keys(&cmd["phases"][0]));
    assert_eq!(doc["schema_version"], cmd["schema_version"]);
}

#[test]
fn the_default_report_leads_with_its_header_and_fits_in_60_lines() {
    // What `cargo xtask run` prints after its live view: the report of an event-mode run.
    let out = rdma_trace(&["run", "--no-tui", "--mode", "event", "--iterations", "200"]);
    out.assert_success("rdma-trace run");
    // Without a terminal the interval blocks come first; the report starts at its header.
    let at = out
        .stdout
        .find("rdma-trace run: ")
        .unwrap_or_else(|| panic!("no header line:\n{}", out.stdout));
    let report = &out.stdout[at..];
    let lines: Vec<&str> = report.lines().collect();
    assert!(lines.len() <= 60, "{} lines:\n{report}", lines.len());
    assert!(
        lines[0].contains("kernel ") && lines[0].contains(" attached"),
        "{}",
        lines[0]
    );
    // The skipped rows take one line in all (the guest has no mlx5, irdma, bnxt_re or MANA). Only
    // lines that start with it: a `lost:` line may name program runs the kernel skipped.
    let skipped: Vec<&&str> = lines.iter().filter(|l| l.starts_with("skipped")).collect();
    assert_eq!(skipped.len(), 1, "{report}");
    assert!(
        skipped[0].starts_with("skipped ") && skipped[0].contains("no_device"),
        "{report}"
    );
    // The order: the demo's own latency, the cost, the waterfall, the kernel path.
    let pos = |what: &str| {
        report
            .find(what)
            .unwrap_or_else(|| panic!("no {what:?} in the report:\n{report}"))
    };
    assert!(pos("--- rdma-demo ---") < pos("tracing: eBPF"));
    assert!(pos("tracing: eBPF") < pos("waterfall of pid"));
    assert!(pos("waterfall of pid") < pos("kernel path, machine-wide, by total time"));
    assert!(report.contains("◀ largest"), "{report}");
}

#[test]
fn json_on_stdout_leaves_the_commands_own_output_to_stderr() {
    let (out, doc) = Outcome::json_on_stdout(&[
        "run",
        "--no-tui",
        "--json",
        "-",
        "--",
        "sh",
        "-c",
        "echo the-command-said-this",
    ]);
    only_phase(&doc, "command");
    assert!(
        out.stderr.contains("the-command-said-this"),
        "{}",
        out.stderr
    );
}

//! The guest tests' small harness: rdma-trace run to its end (with or without a JSON report,
//! the demo run under it), an entry of a report's list found by a field (a probe by name), the
//! attached probes, rdma-trace's stderr read until it says it has started, the loopback
//! ping-pong used as load, children killed when a test fails, and what a test checks was left
//! behind (kprobes, demo processes). Shared by the guest suite (`tests/guest.rs`) and the smoke
//! suite of the other kernels (`tests/smoke.rs`).

use std::{
    io::{BufRead as _, BufReader},
    path::{Path, PathBuf},
    process::{Child, ChildStderr, Command, ExitStatus, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;

use super::RDMA_TRACE;

/// A JSON report's path in the temporary folder, unique to this process and `name`.
pub fn temp_json(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!(
        "rdma-trace-guest-{}-{name}.json",
        std::process::id()
    ))
}

/// The JSON document at `path`, which is then removed.
pub fn read_json(path: &PathBuf) -> Value {
    let v = serde_json::from_slice(&std::fs::read(path).expect("JSON report")).expect("valid JSON");
    let _ = std::fs::remove_file(path);
    v
}

const KPROBE_LIST: &str = "/sys/kernel/debug/kprobes/list";

/// Every registered kprobe, from debugfs (mounted here if it is not yet). Panics when the list
/// cannot be read: an unreadable list must not pass as an empty one.
pub fn kprobes_strict() -> String {
    if !Path::new(KPROBE_LIST).exists() {
        let _ = Command::new("mount")
            .args(["-t", "debugfs", "debugfs", "/sys/kernel/debug"])
            .status();
    }
    let list = std::fs::read_to_string(KPROBE_LIST)
        .unwrap_or_else(|e| panic!("cannot read {KPROBE_LIST} ({e}): the kprobe check cannot run"));
    // Kprobe events made through tracefs (the legacy attach path) are listed there as well.
    let events = std::fs::read_to_string("/sys/kernel/tracing/kprobe_events")
        .or_else(|_| std::fs::read_to_string("/sys/kernel/debug/tracing/kprobe_events"))
        .unwrap_or_else(|e| panic!("cannot read kprobe_events ({e})"));
    list + &events
}

/// (id, name) of every BPF program loaded in the kernel (BPF_PROG_GET_NEXT_ID through aya). A
/// program freed between its id and its fd (ENOENT: the kernel frees programs after an RCU grace
/// period, so a closed run's programs can vanish mid-listing) is gone and not listed. Panics on
/// any other error: an unreadable list must not pass as an empty one.
pub fn bpf_programs() -> Vec<(u32, String)> {
    aya::programs::loaded_programs()
        .filter_map(|p| match p {
            Ok(p) => Some((p.id(), p.name_as_str().unwrap_or("?").to_owned())),
            Err(aya::programs::ProgramError::SyscallError(e))
                if e.io_error.kind() == std::io::ErrorKind::NotFound =>
            {
                None
            }
            Err(e) => panic!("listing the loaded BPF programs: {e}"),
        })
        .collect()
}

/// Waits up to 10 s for `problem` to return None (the kernel releases detached programs and
/// kprobes asynchronously); panics with `what` and the last problem otherwise.
pub fn eventually(what: &str, mut problem: impl FnMut() -> Option<String>) {
    let start = Instant::now();
    loop {
        let Some(p) = problem() else { return };
        if start.elapsed() > Duration::from_secs(10) {
            panic!("{what}: {p}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The running processes named rdma-demo (or rdma-demo:PHASE, as its threads rename themselves).
pub fn demo_processes() -> Vec<String> {
    std::fs::read_dir("/proc")
        .expect("/proc")
        .filter_map(Result::ok)
        // A zombie (killed, not yet reaped by the guest's init) runs nothing: not counted.
        .filter(|e| {
            let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
            !stat
                .rsplit_once(") ")
                .is_some_and(|(_, rest)| rest.starts_with('Z'))
        })
        .filter_map(|e| std::fs::read_to_string(e.path().join("comm")).ok())
        // Demo threads rename themselves rdma-demo:data / rdma-demo:done (phase markers).
        .filter(|c| c.trim().starts_with("rdma-demo"))
        .collect()
}

/// What a finished command left: its status, its output, and its JSON report (`Null` when it
/// wrote none or was not asked to).
pub struct Outcome {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    pub report: Value,
}

impl Outcome {
    /// Fails the test, showing the status and both outputs, unless the command succeeded.
    pub fn assert_success(&self, what: &str) {
        assert!(
            self.status.success(),
            "{what} failed ({}):\n{}\n{}",
            self.status,
            self.stderr,
            self.stdout
        );
    }

    /// Runs `rdma-trace ARGS` (which hold `--json -`) to its end and fails the test unless it
    /// succeeded and its stdout is one JSON document; that document.
    pub fn json_on_stdout(args: &[&str]) -> (Self, Value) {
        let out = rdma_trace(args);
        out.assert_success(&format!("rdma-trace {}", args.join(" ")));
        let doc = serde_json::from_str(&out.stdout)
            .unwrap_or_else(|e| panic!("stdout is not one JSON document ({e}):\n{}", out.stdout));
        (out, doc)
    }

    /// Fails the test unless the command exited with `code` and said why in one line of
    /// stderr, a line that contains `says`.
    pub fn assert_fails_in_one_line(&self, code: i32, says: &str) {
        let stderr = &self.stderr;
        assert_eq!(self.status.code(), Some(code), "{stderr}");
        assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
        assert!(stderr.contains(says), "{stderr}");
    }
}

/// Runs `cmd` to its end (`Command::output`: stdout and stderr captured, stdin null unless
/// `cmd` says otherwise).
pub fn outcome_of(cmd: &mut Command) -> Outcome {
    outcome(cmd, || Value::Null)
}

fn outcome(cmd: &mut Command, report: impl FnOnce() -> Value) -> Outcome {
    let out = cmd.output().unwrap_or_else(|e| panic!("run {cmd:?}: {e}"));
    Outcome {
        status: out.status,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        report: report(),
    }
}

/// The guest kernel's release (`6.1.0-57-amd64`, `6.12.95+deb12-amd64`).
pub fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .expect("reading /proc/sys/kernel/osrelease")
        .trim()
        .to_owned()
}

/// `rdma-trace ARGS` run to its end, without a report.
pub fn rdma_trace(args: &[&str]) -> Outcome {
    outcome(Command::new(RDMA_TRACE).args(args), || Value::Null)
}

/// `rdma-trace run --no-tui --mode MODE -n ITERS EXTRA` (the demo, traced) run to its end, with
/// its report: [`run_json`] under `name`.
pub fn run_demo(mode: &str, iters: u64, extra: &[&str], name: &str) -> Outcome {
    let iters = iters.to_string();
    let run = ["run", "--no-tui", "--mode", mode, "-n", &iters];
    run_json(&[&run[..], extra].concat(), name)
}

/// `rdma-trace ARGS --json <temp_json(name)>` run to its end; the report read (and its file
/// removed) when it was written. When ARGS end with `-- CMD`, `--json` goes before the `--`.
pub fn run_json(args: &[&str], name: &str) -> Outcome {
    run_json_with(&mut Command::new(RDMA_TRACE), args, name)
}

/// [`run_json`] with a prepared `cmd`: another program in front of rdma-trace (`taskset`), an
/// environment, another stdin.
pub fn run_json_with(cmd: &mut Command, args: &[&str], name: &str) -> Outcome {
    let json = temp_json(name);
    let split = args.iter().position(|a| *a == "--").unwrap_or(args.len());
    cmd.args(&args[..split])
        .arg("--json")
        .arg(&json)
        .args(&args[split..]);
    outcome(cmd, || {
        if json.exists() {
            read_json(&json)
        } else {
            Value::Null
        }
    })
}

/// The first of `items` (a report's list: probes, programs, stages) whose `key` is `value`.
pub fn find_by<'a, V>(
    items: impl IntoIterator<Item = &'a Value>,
    key: &str,
    value: V,
) -> Option<&'a Value>
where
    Value: PartialEq<V>,
{
    items.into_iter().find(|item| item[key] == value)
}

/// The probe `name` of a report or of one of its phases (from its `probes`).
pub fn probe<'a>(report: &'a Value, name: &str) -> &'a Value {
    find_by(report["probes"].as_array().expect("probes"), "name", name)
        .unwrap_or_else(|| panic!("no probe {name} in {report}"))
}

/// The count of probe `name` of a phase, which must have attached.
pub fn count(phase: &Value, name: &str) -> u64 {
    let p = probe(phase, name);
    assert!(p["attach"].is_string(), "{name} not attached: {p}");
    p["count"].as_u64().expect("count")
}

/// The probes of a report or of one of its phases that attached (those with an `attach`).
pub fn attached(report: &Value) -> impl Iterator<Item = &Value> {
    report["probes"]
        .as_array()
        .expect("probes")
        .iter()
        .filter(|p| p["attach"].is_string())
}

/// The CQ events a demo took, both sides, from its JSON results (`reports[].cq_events`).
pub fn demo_cq_events(demo: &Value) -> u64 {
    demo["reports"]
        .as_array()
        .expect("demo reports")
        .iter()
        .map(|r| r["cq_events"].as_u64().expect("cq_events"))
        .sum()
}

/// The poll and event phases of a `run --mode both` report of `iters` iterations: completion
/// events only in event mode, and ib_uverbs_comp_handler ran once for each CQ event the demo
/// took on both sides (the demo's own count is the truth), give or take the few hits kprobes
/// miss when another kprobe handler runs on that CPU (nmissed).
pub fn assert_events_match_demo(poll: &Value, event: &Value, iters: u64) {
    assert_eq!(
        (poll["mode"].as_str(), event["mode"].as_str()),
        (Some("poll"), Some("event"))
    );
    assert_eq!(count(poll, "ib_uverbs_comp_handler"), 0);
    let comp = count(event, "ib_uverbs_comp_handler");
    let cq_events = demo_cq_events(&event["demo"]);
    assert!(
        cq_events >= iters,
        "{cq_events} CQ events for {iters} iterations"
    );
    assert!(
        comp + cq_events / 100 + 2 >= cq_events && comp <= cq_events + cq_events / 20 + 4,
        "ib_uverbs_comp_handler ran {comp} times for {cq_events} CQ events taken by the demo"
    );
}

/// Reads the piped stderr of a spawned rdma-trace until a line starts with `prefix` (it says
/// it has started); returns what it read, that line included, and the rest of the stream.
pub fn stderr_until(child: &mut Child, prefix: &str) -> (String, BufReader<ChildStderr>) {
    let mut err = BufReader::new(child.stderr.take().expect("piped stderr"));
    let mut head = String::new();
    loop {
        let mut line = String::new();
        let n = err.read_line(&mut line).expect("read rdma-trace's stderr");
        head.push_str(&line);
        assert!(n > 0, "rdma-trace ended before saying {prefix:?}: {head}");
        if line.starts_with(prefix) {
            return (head, err);
        }
    }
}

/// Waits until a spawned `rdma-trace run` (stderr piped) says it traces; returns the rest of
/// its stderr.
pub fn wait_tracing(tracer: &mut Child) -> BufReader<ChildStderr> {
    stderr_until(tracer, "rdma-trace: tracing ").1
}

/// Sends `signal` (`-TERM`, `-INT`) to `child` with kill(1); whether kill succeeded.
pub fn signal(child: &Child, signal: &str) -> bool {
    Command::new("kill")
        .args([signal, &child.id().to_string()])
        .status()
        .is_ok_and(|s| s.success())
}

/// The load of the `cq` tests: `rdma-demo pingpong --loopback --port 0 -d rxe1
/// --server-device rxe0 EXTRA`, stdout to /dev/null, run to its end.
pub fn loopback_pingpong(extra: &[&str]) -> ExitStatus {
    Command::new("rdma-demo")
        .args(rdma_demo::pingpong::loopback_args("rxe1", "rxe0"))
        .args(extra)
        .stdout(Stdio::null())
        .status()
        .expect("run rdma-demo")
}

/// Killed (and reaped) when dropped, also when a test fails, so that no probe or load outlives
/// the test.
pub use super::kill_on_drop::KillOnDrop;

//! Command-line errors of `rdma-trace run` with a workload: each is one line, exits non-zero,
//! and is caught before anything is attached (these tests need no root, and the attach table
//! never shows).

use std::process::{Command, Output};

fn rdma_trace(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rdma-trace"))
        .args(args)
        .output()
        .expect("run rdma-trace")
}

/// The status and the one line of stderr of a run that must fail before tracing.
fn fails_early(args: &[&str]) -> (i32, String) {
    let out = rdma_trace(args);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    let code = out.status.code().expect("exit code");
    assert_ne!(code, 0, "{args:?} succeeded: {err}");
    assert!(out.stdout.is_empty(), "{args:?} printed on stdout");
    assert!(!err.contains("probes:"), "{args:?} attached probes: {err}");
    (code, err)
}

/// `args` fails with `code` and one line that contains `says`.
fn fails_with(args: &[&str], code: i32, says: &str) {
    let (got, err) = fails_early(args);
    assert_eq!(got, code, "{args:?}: {err}");
    assert!(one_line(&err).contains(says), "{args:?}: {err}");
}

fn one_line(err: &str) -> &str {
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "not one line: {err}");
    assert!(lines[0].starts_with("rdma-trace: "), "{err}");
    lines[0]
}

#[test]
fn a_command_that_does_not_exist_is_named() {
    fails_with(
        &["run", "--no-tui", "--", "no-such-command-xyz", "-v"],
        1,
        "\"no-such-command-xyz\" not found on PATH",
    );
    fails_with(
        &["run", "--no-tui", "--", "/no/such/dir/prog"],
        1,
        "/no/such/dir/prog: no such file",
    );
    let plain = std::env::temp_dir().join(format!("rdma-trace-cli-{}.txt", std::process::id()));
    std::fs::write(&plain, "not a program\n").unwrap();
    let (code, err) = fails_early(&["run", "--no-tui", "--", plain.to_str().unwrap()]);
    let _ = std::fs::remove_file(&plain);
    assert_eq!(code, 1, "{err}");
    assert!(one_line(&err).contains("not an executable file"), "{err}");
}

#[test]
fn a_pid_that_does_not_exist_is_named() {
    // Above the kernel's pid_max (4194304 at most).
    fails_with(
        &["run", "--no-tui", "--pid", "99999999"],
        1,
        "--pid 99999999: no such process",
    );
    // One bad pid among good ones.
    let me = std::process::id().to_string();
    let some_bad = format!("{me},99999998");
    fails_with(
        &["run", "--no-tui", "--pid", &some_bad],
        1,
        "--pid 99999998",
    );
    let (code, _) = fails_early(&["run", "--pid", "0"]);
    assert_eq!(code, 2, "pid 0 is a usage error");
    let (code, _) = fails_early(&["run", "--pid", "abc"]);
    assert_eq!(code, 2);
}

#[test]
fn pid_with_a_command_and_demo_options_with_a_workload_are_usage_errors() {
    for args in [
        &["run", "--pid", "1", "--", "true"][..],
        &["run", "--pid", "1", "--all"],
        &["run", "--all", "--", "true"],
        &["run", "--mode", "poll", "--", "true"],
        &["run", "-n", "10", "--pid", "1"],
        &["run", "-d", "rxe0", "--all"],
        &["run", "-c", "true", "--pid", "1"],
        &["run", "-c", "true", "--", "true"],
        &["run", "-p", "1", "--all"],
        &["funclat", "f", "-c", "true", "--", "true"],
        &["run", "--timeline-sample", "5", "--", "true"],
    ] {
        let (code, err) = fails_early(args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.starts_with("error: "), "{args:?}: {err}");
        assert!(
            err.contains("cannot be used with") || err.contains("required arguments"),
            "{args:?}: {err}"
        );
    }
}

#[test]
fn an_unwritable_timeline_is_refused_before_tracing() {
    let dir = std::env::temp_dir();
    let (code, err) = fails_early(&[
        "run",
        "--no-tui",
        "--timeline",
        dir.to_str().unwrap(),
        "--",
        "true",
    ]);
    assert_eq!(code, 1);
    assert!(one_line(&err).contains("is a directory"), "{err}");
    fails_with(
        &["run", "--timeline", "/no/such/dir/trace.json", "--all"],
        1,
        "--timeline /no/such/dir/trace.json: cannot write there",
    );
}

/// The flags follow bpftrace/BCC (and perftest for the demo's); an old spelling ends the run
/// with one line that names the new flag, exit 2, before anything is attached.
#[test]
fn old_flag_spellings_are_refused_in_one_line() {
    for (args, says) in [
        (
            &["run", "-i", "100"][..],
            "-i is now -n (--iterations), as in perftest",
        ),
        (
            &["run", "--no-tui", "-S", "64"],
            "-S is now -s (--size), as in perftest",
        ),
        (
            &["verify", "-i", "5"],
            "-i is now -n (--iterations), as in perftest",
        ),
        (
            &["softirqs", "-d", "5"],
            "-d is now --duration (-d names a device)",
        ),
        (
            &["funclat", "-d", "5", "rxe_rcv"],
            "-d is now --duration (-d names a device)",
        ),
        (
            &["irq", "-p", "virtio*"],
            "-p is now -m (--match); -p names a PID",
        ),
        (&["cq", "--json"], "--json now takes a path"),
        (&["probes", "--json"], "--json now takes a path"),
        (
            &["run", "--demo", "/bin/true"],
            "--demo is now --demo-binary",
        ),
    ] {
        let (code, err) = fails_early(args);
        assert_eq!(code, 2, "{args:?}: {err}");
        let line = one_line(&err);
        assert!(
            line.starts_with(&format!("rdma-trace: {says}")),
            "{args:?}: {line}"
        );
    }
}

/// `-c "CMD ARGS"` is `-- CMD ARGS`: the same errors, one line each.
#[test]
fn a_command_line_given_with_c_is_split_into_words() {
    fails_with(
        &["run", "--no-tui", "-c", "no-such-command-xyz -v 'a b'"],
        1,
        "\"no-such-command-xyz\" not found on PATH",
    );
    let (code, err) = fails_early(&["run", "-c", "sh -c 'unclosed"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("an unclosed quote"), "{err}");
}

#[test]
fn help_holds_the_exit_codes_of_both_binaries() {
    let out = rdma_trace(&["--help"]);
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for line in [
        "Exit codes (one table for rdma-demo and rdma-trace",
        "  3    this machine lacks what is needed",
        "  10   rdma-trace verify: the demo's data phase used a socket",
        "  11   rdma-trace run/verify: the rdma-demo it ran failed",
        "passes its status",
    ] {
        assert!(help.contains(line), "{line:?} not in:\n{help}");
    }
}

#[test]
fn version_names_the_embedded_ebpf_object() {
    let out = rdma_trace(&["--version"]);
    assert!(out.status.success());
    let line = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let id = line
        .strip_prefix(concat!(
            "rdma-trace ",
            env!("CARGO_PKG_VERSION"),
            " (eBPF object "
        ))
        .and_then(|rest| rest.strip_suffix(')'))
        .unwrap_or_else(|| panic!("no eBPF build id: {line}"));
    assert_eq!(id.len(), 12, "{line}");
    assert!(id.bytes().all(|b| b.is_ascii_hexdigit()), "{line}");
}

/// `--sample-every N` takes a count from 1 (1: every event stamped): 0, a negative number
/// and a word are usage errors (clap's: a first line that names the flag, then the hint to
/// `--help`), before anything is attached.
#[test]
fn sample_every_takes_a_count_from_one() {
    for bad in ["0", "-3", "four"] {
        let arg = format!("--sample-every={bad}");
        let (code, err) = fails_early(&["run", "--no-tui", &arg]);
        assert_eq!(code, 2, "{bad}: {err}");
        let first = err.lines().next().unwrap_or_default();
        assert!(
            first.starts_with("error: ") && first.contains("--sample-every"),
            "{bad}: {err}"
        );
    }
}

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

fn one_line(err: &str) -> &str {
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "not one line: {err}");
    assert!(lines[0].starts_with("rdma-trace: "), "{err}");
    lines[0]
}

#[test]
fn a_command_that_does_not_exist_is_named() {
    let (code, err) = fails_early(&["run", "--no-tui", "--", "no-such-command-xyz", "-v"]);
    assert_eq!(code, 1);
    let line = one_line(&err);
    assert!(
        line.contains("\"no-such-command-xyz\" not found on PATH"),
        "{line}"
    );
    let (_, err) = fails_early(&["run", "--no-tui", "--", "/no/such/dir/prog"]);
    assert!(
        one_line(&err).contains("/no/such/dir/prog: no such file"),
        "{err}"
    );
    let plain = std::env::temp_dir().join(format!("rdma-trace-cli-{}.txt", std::process::id()));
    std::fs::write(&plain, "not a program\n").unwrap();
    let (_, err) = fails_early(&["run", "--no-tui", "--", plain.to_str().unwrap()]);
    let _ = std::fs::remove_file(&plain);
    assert!(one_line(&err).contains("not an executable file"), "{err}");
}

#[test]
fn a_pid_that_does_not_exist_is_named() {
    // Above the kernel's pid_max (4194304 at most).
    let (code, err) = fails_early(&["run", "--no-tui", "--pid", "99999999"]);
    assert_eq!(code, 1);
    assert!(
        one_line(&err).contains("--pid 99999999: no such process"),
        "{err}"
    );
    // One bad pid among good ones.
    let me = std::process::id().to_string();
    let (_, err) = fails_early(&["run", "--no-tui", "--pid", &format!("{me},99999998")]);
    assert!(one_line(&err).contains("--pid 99999998"), "{err}");
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
        &["run", "-i", "10", "--pid", "1"],
        &["run", "-d", "rxe0", "--all"],
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
    let (_, err) = fails_early(&["run", "--timeline", "/no/such/dir/trace.json", "--all"]);
    assert!(
        one_line(&err).contains("--timeline /no/such/dir/trace.json: cannot write there"),
        "{err}"
    );
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

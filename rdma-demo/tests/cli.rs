//! The `rdma-demo` binary on this host, whatever RDMA it has: the assertions branch on what
//! `/sys/class/infiniband` shows.

use std::path::Path;
use std::process::{Command, Output};

fn rdma_demo(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rdma-demo"))
        .args(args)
        .output()
        .expect("run rdma-demo")
}

fn stderr_lines(out: &Output) -> Vec<String> {
    String::from_utf8_lossy(&out.stderr)
        .lines()
        .map(str::to_string)
        .collect()
}

/// Asserts a run ended with exit code `code` and one stderr line; returns that line.
fn one_error_line(out: &Output, code: i32) -> String {
    let lines = stderr_lines(out);
    assert_eq!(out.status.code(), Some(code), "stderr: {lines:?}");
    assert_eq!(lines.len(), 1, "want one stderr line: {lines:?}");
    lines.into_iter().next().unwrap()
}

/// Asserts a run succeeded.
fn assert_success(out: &Output) {
    assert_eq!(
        out.status.code(),
        Some(0),
        "stderr: {:?}",
        stderr_lines(out)
    );
}

/// How the one error line of a host without RDMA devices starts.
const NO_DEVICES: &str = "rdma-demo: no RDMA devices: ";

/// RDMA device names in sysfs; empty if the class directory is missing or empty.
fn sysfs_devices() -> Vec<String> {
    let Ok(dir) = std::fs::read_dir(Path::new("/sys/class/infiniband")) else {
        return Vec::new();
    };
    let mut names: Vec<String> = dir
        .map(|e| {
            e.expect("read /sys/class/infiniband")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    names.sort();
    names
}

#[test]
fn devices_lists_or_explains_absence() {
    let out = rdma_demo(&["devices"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let devices = sysfs_devices();
    if devices.is_empty() {
        let line = one_error_line(&out, 3);
        assert!(line.starts_with(NO_DEVICES), "{line}");
        assert!(line.contains("/sys/class/infiniband"), "{line}");
        assert!(
            line.contains("rdma link add rxe0 type rxe netdev"),
            "{line}"
        );
        assert!(stdout.is_empty(), "{stdout}");
    } else {
        assert_success(&out);
        for dev in &devices {
            assert!(
                stdout.lines().any(|l| l == format!("device {dev}")),
                "{dev} missing:\n{stdout}"
            );
        }
    }
}

#[test]
fn devices_json_lists_or_explains_absence() {
    let out = rdma_demo(&["devices", "--json"]);
    let devices = sysfs_devices();
    if devices.is_empty() {
        let line = one_error_line(&out, 3);
        assert!(line.starts_with(NO_DEVICES), "{line}");
    } else {
        assert_success(&out);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
        let names: Vec<&str> = v["devices"]
            .as_array()
            .expect("devices array")
            .iter()
            .map(|d| d["name"].as_str().expect("name"))
            .collect();
        for dev in &devices {
            assert!(names.contains(&dev.as_str()), "{dev} not in {names:?}");
        }
    }
}

#[test]
fn unknown_device_exits_3_with_one_line() {
    let out = rdma_demo(&["devices", "-d", "nosuchdev"]);
    let line = one_error_line(&out, 3);
    assert!(out.stdout.is_empty());
    if sysfs_devices().is_empty() {
        assert!(line.starts_with(NO_DEVICES), "{line}");
    } else {
        assert!(
            line.starts_with("rdma-demo: no RDMA device named \"nosuchdev\" (available: "),
            "{line}"
        );
    }
}

#[test]
fn bad_flag_is_a_usage_error() {
    let out = rdma_demo(&["devices", "--no-such-flag"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--no-such-flag"));
    assert_eq!(rdma_demo(&["no-such-subcommand"]).status.code(), Some(2));
}

#[test]
fn help_lists_exit_codes() {
    let out = rdma_demo(&["--help"]);
    assert_eq!(out.status.code(), Some(0));
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(
        help.contains("Exit codes (one table for rdma-demo and rdma-trace"),
        "{help}"
    );
    assert!(
        help.contains("3    this machine lacks what is needed: no RDMA device"),
        "{help}"
    );
    assert!(help.contains("devices"), "{help}");
}

#[test]
fn demos_without_devices_or_with_bad_flags() {
    for demo in ["pingpong", "write-read", "atomic"] {
        // Usage errors first: no server address, out-of-range sizes.
        assert_eq!(rdma_demo(&[demo]).status.code(), Some(2));
        assert_eq!(
            rdma_demo(&[demo, "--server", "-n", "0"]).status.code(),
            Some(2)
        );
        let help = rdma_demo(&[demo, "--help"]);
        assert_eq!(help.status.code(), Some(0));
        let help = String::from_utf8_lossy(&help.stdout);
        assert!(
            help.contains("7    timed out waiting for a completion"),
            "{help}"
        );
        assert!(help.contains("[default: 0.0.0.0]"), "{help}");
        if sysfs_devices().is_empty() {
            let out = rdma_demo(&[demo, "-p", "1", "127.0.0.1"]);
            let line = one_error_line(&out, 3);
            assert!(line.starts_with(NO_DEVICES), "{line}");
        }
    }
}

#[test]
fn server_device_needs_loopback() {
    let out = rdma_demo(&["pingpong", "--server", "--server-device", "rxe1"]);
    assert_eq!(out.status.code(), Some(2));
    let lines = stderr_lines(&out);
    assert_eq!(
        lines,
        ["rdma-demo: --server-device needs --loopback (a server alone takes --device)"]
    );
}

#[test]
fn completions_name_every_subcommand() {
    for shell in ["bash", "zsh", "fish"] {
        let out = rdma_demo(&["completions", shell]);
        assert_eq!(out.status.code(), Some(0), "{shell}");
        let script = String::from_utf8_lossy(&out.stdout);
        for sub in ["devices", "pingpong", "write-read", "atomic", "completions"] {
            assert!(script.contains(sub), "{shell} script lacks {sub}");
        }
    }
    let out = rdma_demo(&["completions", "tcsh"]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn man_writes_a_page_per_subcommand() {
    let dir = std::env::temp_dir().join(format!("rdma-demo-man-{}", std::process::id()));
    let out = rdma_demo(&["man", "--out", dir.to_str().unwrap()]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut pages: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    pages.sort();
    assert_eq!(
        pages,
        [
            "rdma-demo-atomic.1",
            "rdma-demo-completions.1",
            "rdma-demo-devices.1",
            "rdma-demo-pingpong.1",
            "rdma-demo-write-pingpong.1",
            "rdma-demo-write-read.1",
            "rdma-demo.1"
        ]
    );
    let page = std::fs::read_to_string(dir.join("rdma-demo-pingpong.1")).unwrap();
    assert!(page.contains(".TH") && page.contains("Examples"), "{page}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn every_help_has_examples() {
    for args in [
        &["--help"][..],
        &["devices", "--help"],
        &["pingpong", "--help"],
        &["write-read", "--help"],
        &["atomic", "--help"],
        &["completions", "--help"],
    ] {
        let out = rdma_demo(args);
        let help = String::from_utf8_lossy(&out.stdout);
        assert!(help.contains("Examples:\n  rdma-demo"), "{args:?}:\n{help}");
    }
}

/// `-n 0` is refused as a usage error (exit 2) before anything starts, in every role: a run
/// of no iterations measures nothing, and the exchange refuses 0 iterations too.
#[test]
fn zero_iterations_is_a_usage_error() {
    for demo in ["pingpong", "write-read", "atomic"] {
        for role in ["--server", "127.0.0.1", "--loopback"] {
            for flag in [&["-n", "0"][..], &["--iterations=0"]] {
                let mut args = vec![demo, role];
                args.extend_from_slice(flag);
                let out = rdma_demo(&args);
                assert_eq!(out.status.code(), Some(2), "{args:?}");
                let stderr = String::from_utf8_lossy(&out.stderr);
                assert!(
                    stderr.starts_with(
                        "error: invalid value '0' for '--iterations <N>': 0 is not in 1..="
                    ),
                    "{args:?}: {stderr}"
                );
                assert!(out.stdout.is_empty(), "{args:?}");
            }
        }
    }
}

/// A server (or a loopback run) whose TCP port is taken says so in one line, exit 5, before it
/// opens any device: this runs on any host.
#[test]
fn a_port_in_use_is_one_line_and_exit_5() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    for demo in ["pingpong", "write-read", "atomic"] {
        for args in [
            vec![demo, "--server", "--bind", "127.0.0.1", "-p", &port],
            vec![demo, "--loopback", "-p", &port],
        ] {
            let out = rdma_demo(&args);
            assert_eq!(out.status.code(), Some(5), "{args:?}");
            let lines = stderr_lines(&out);
            assert_eq!(
                lines,
                [format!(
                    "rdma-demo: cannot listen on 127.0.0.1:{port}: Address already in use (os error 98) \
                     (another server on this port? pick another with -p)"
                )],
                "{args:?}"
            );
        }
    }
}

#[test]
fn write_pingpong_wants_a_size_of_whole_words() {
    for bad in ["12", "4", "2000000"] {
        let out = rdma_demo(&["write-pingpong", "--loopback", "-s", bad]);
        assert_eq!(out.status.code(), Some(2), "-s {bad}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("want a multiple of 8 from 8 to 1048576"),
            "-s {bad}: {err}"
        );
    }
}

/// write-pingpong polls memory: it has no event mode, and nothing for `--stamps` to stamp.
#[test]
fn write_pingpong_has_no_event_mode_nor_stamps() {
    for (flags, says) in [
        (&["-e"][..], "it has no event mode"),
        (&["--mode", "event"], "it has no event mode"),
        (
            &["--stamps", "10"],
            "--stamps is for pingpong, write-read and atomic",
        ),
    ] {
        let out = rdma_demo(&[&["write-pingpong", "--loopback"][..], flags].concat());
        assert_eq!(out.status.code(), Some(2), "{flags:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains(says), "{err}");
    }
}

/// The flags follow perftest now; an old spelling ends the run with one line that names the
/// new flag, exit 2, before anything starts.
#[test]
fn old_flag_spellings_are_refused_in_one_line() {
    for (args, line) in [
        (
            &["pingpong", "-s"][..],
            "rdma-demo: -s is now --size (as in perftest); run the server with --server",
        ),
        (
            &["pingpong", "-s", "-d", "rxe0"],
            "rdma-demo: -s is now --size (as in perftest); run the server with --server",
        ),
        (
            &["pingpong", "-g", "1", "10.9.0.1"],
            "rdma-demo: -g is now -x (--gid-index), as in perftest",
        ),
        (
            &["write-read", "--loopback", "-S", "64"],
            "rdma-demo: -S is now -s (--size), as in perftest",
        ),
        (
            &["pingpong", "--loopback", "-i", "1000"],
            "rdma-demo: -i is now -n (--iterations), as in perftest; -i is the IB port (--ib-port)",
        ),
    ] {
        let out = rdma_demo(args);
        assert_eq!(one_error_line(&out, 2), line, "{args:?}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
    // What follows is the new meaning: a size, an IB port (refused by clap when out of range).
    let out = rdma_demo(&["pingpong", "--server", "-s", "4"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("'--size <BYTES>'"),
        "{:?}",
        stderr_lines(&out)
    );
}

//! `cargo xtask run [--kernel K] [--debug] [-- ARGS]`: the main job. Builds everything (the
//! eBPF object, then the workspace; release profile unless `--debug`), then runs `rdma-trace run
//! --mode event ARGS` (`--mode event` only when ARGS give no mode and no workload of their own):
//! - natively where this machine has an RDMA device (the live view is on this terminal);
//! - otherwise in the Soft-RoCE guest (`cargo xtask vm`). On a terminal, the guest's serial
//!   console is connected to it (keys in, screen bytes out, the window's size and TERM passed
//!   along), so the live view works there too; when stdout is not a terminal, `rdma-trace`
//!   prints its text view: a block of histograms per interval, then the report.

use std::{path::Path, process::Command, time::Duration};

use anyhow::{Context as _, Result};

use crate::{
    build_ebpf,
    util::{root, run_cmd, say, target_dir},
    vm::{self, GuestRun},
};

#[derive(clap::Args)]
#[command(
    after_help = "Exit status: rdma-trace's (see `rdma-trace run --help`), or the \
                        guest's codes of `cargo xtask vm --help` (124 timeout, 125 no status, \
                        126 no boot).\n\nExamples:\n  cargo xtask run\n  \
                        cargo xtask run -- --mode both -n 2000\n  \
                        cargo xtask run --guest --kernel 6.12 -- --interval 0.5\n  \
                        cargo xtask run -- --all --duration 10\n  \
                        cargo xtask run -- -- rdma-demo pingpong --loopback -d rxe1 \
                        --server-device rxe0 -e"
)]
pub struct Args {
    /// Guest kernel, when it runs in the guest.
    #[arg(long, value_enum, default_value = "6.1")]
    kernel: vm::Kernel,
    /// Run in the guest even if this machine has RDMA.
    #[arg(long)]
    guest: bool,
    /// Build and run the debug profile (quicker to build; its loader costs far more CPU than
    /// the release build's, which is the default).
    #[arg(long)]
    debug: bool,
    /// Kill the guest after this many seconds.
    #[arg(long, default_value_t = 900, value_name = "SECS")]
    timeout: u64,
    /// Arguments for `rdma-trace run` (after `--`); `--mode event` unless they give a mode or
    /// a workload (`-p`/`--pid`, `--all`, `-c`/`--command`, `-- CMD`).
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "ARGS"
    )]
    args: Vec<String>,
}

pub fn run(args: &Args) -> Result<i32> {
    let release = !args.debug;
    build_ebpf::run(&build_ebpf::Args { release })?;
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut build = Command::new(cargo);
    build.arg("build").current_dir(root());
    if release {
        build.arg("--release");
    }
    run_cmd(&mut build)?;

    let profile = if release { "release" } else { "debug" };
    let mut cmd = vec!["rdma-trace".to_owned(), "run".to_owned()];
    if wants_default_mode(&args.args) {
        cmd.extend(["--mode".to_owned(), "event".to_owned()]);
    }
    cmd.extend(args.args.iter().cloned());

    let native = !args.guest && host_has_rdma(Path::new("/"));
    if native {
        say("this machine has RDMA: running rdma-trace here");
        let exe = target_dir().join(profile).join("rdma-trace");
        let status = Command::new(&exe)
            .args(&cmd[1..])
            .status()
            .with_context(|| format!("running {}", exe.display()))?;
        use std::os::unix::process::ExitStatusExt as _;
        return Ok(status
            .code()
            .unwrap_or_else(|| 128 + status.signal().unwrap_or(0)));
    }
    say(if args.guest {
        "running in the Soft-RoCE guest (--guest)"
    } else {
        "no RDMA device on this machine: running in the Soft-RoCE guest"
    });
    // On a terminal the guest's console becomes this terminal and shows the live view;
    // otherwise (a pipe, CI) rdma-trace prints its text view.
    let interactive = vm::on_terminal();
    // In front: what follows a `--` is the workload's command line.
    if !interactive
        && !cmd
            .iter()
            .take_while(|a| *a != "--")
            .any(|a| a == "--no-tui")
    {
        cmd.insert(2, "--no-tui".to_owned());
    }
    pass_terminal_size();
    vm::run_in_guest(&GuestRun {
        kernel: args.kernel,
        timeout: Duration::from_secs(args.timeout),
        cmd,
        profile: profile.into(),
        interactive,
        ..GuestRun::default()
    })
}

/// Whether `rdma-trace run ARGS` runs the demo with no mode given, so that `--mode event` goes
/// in front: not when ARGS give a mode, nor a workload, which takes no mode (`-p`/`--pid`,
/// `--all`, `-c`/`--command`, `-- CMD`).
fn wants_default_mode(args: &[String]) -> bool {
    let short = |a: &str, c: char| {
        a.strip_prefix('-')
            .is_some_and(|r| !r.starts_with('-') && r.starts_with(c))
    };
    let long = |a: &str, l: &str| a == l || a.strip_prefix(l).is_some_and(|r| r.starts_with('='));
    !args.iter().any(|a| {
        a == "--"
            || a == "--all"
            || long(a, "--mode")
            || long(a, "--pid")
            || long(a, "--command")
            || short(a, 'p')
            || short(a, 'c')
    })
}

/// An RDMA device to run the demos on. (rdma_rxe without a device is not enough: `rdma-trace
/// run` needs a device pair, which the guest has.)
fn host_has_rdma(root: &Path) -> bool {
    std::fs::read_dir(root.join("sys/class/infiniband"))
        .map(|d| d.count() > 0)
        .unwrap_or(false)
}

/// COLUMNS and LINES of the host terminal, for the guest (`vm` passes them through).
fn pass_terminal_size() {
    // SAFETY: TIOCGWINSZ writes a winsize into the struct we pass; fd 1 may not be a terminal,
    // in which case the call fails and we pass nothing.
    let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
    // SAFETY: see above; `ws` is valid and writable.
    let ok = unsafe { libc::ioctl(1, libc::TIOCGWINSZ, &mut ws) } == 0;
    if ok && ws.ws_col > 0 && ws.ws_row > 0 {
        // SAFETY: xtask is single-threaded here; nothing reads the environment concurrently.
        unsafe {
            std::env::set_var("COLUMNS", ws.ws_col.to_string());
            std::env::set_var("LINES", ws.ws_row.to_string());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_mode_only_for_the_demo_without_a_mode() {
        use clap::Parser as _;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            run: Args,
        }
        // What `cargo xtask run ARGS` hands to `rdma-trace run` after its own flags.
        let after = |line: &[&str]| {
            Cli::try_parse_from([&["xtask"][..], line].concat())
                .unwrap()
                .run
                .args
        };
        for (line, default) in [
            (&[][..], true),
            (&["--", "-n", "2000"], true),
            (&["--", "--interval", "0.5", "--no-tui"], true),
            (&["--", "--mode", "both"], false),
            (&["--", "--mode=poll"], false),
            (&["--", "--all"], false),
            (&["--", "--pid", "42"], false),
            (&["--", "-p", "42"], false),
            (&["--", "-p42"], false),
            (&["--", "-c", "ib_send_lat -e"], false),
            (&["--", "--command=sleep 1"], false),
            (&["--", "--", "sleep", "1"], false),
            (
                &[
                    "--kernel",
                    "6.12",
                    "--",
                    "--duration",
                    "5",
                    "--",
                    "sleep",
                    "1",
                ],
                false,
            ),
        ] {
            let args = after(line);
            assert_eq!(wants_default_mode(&args), default, "{line:?} → {args:?}");
        }
        assert_eq!(after(&["--", "--", "sleep", "1"]), ["--", "sleep", "1"]);
    }

    #[test]
    fn rdma_detection() {
        let dir = std::env::temp_dir().join(format!("xtask-run-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        assert!(!host_has_rdma(&dir), "no sysfs class");
        std::fs::create_dir_all(dir.join("sys/class/infiniband")).unwrap();
        assert!(!host_has_rdma(&dir), "empty class");
        std::fs::create_dir_all(dir.join("sys/class/infiniband/mlx5_0")).unwrap();
        assert!(host_has_rdma(&dir), "a device");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

//! rdma-trace: latency histograms of the Linux RDMA completion path, with eBPF.

// Layers, lowest first: the root modules (errors, signals, output files, start-up steps, verbosity),
// kernel, bpf, waterfall, model, load, views, run, cmd. An import runs downwards only: see
// `layers::tests` (a lint that reads the `use` lines).
mod bpf;
mod cmd;
mod error;
mod kernel;
mod layers;
mod load;
mod model;
mod output;
mod run;
mod signals;
mod startup;
mod stoppable;
mod verbosity;
mod views;
mod waterfall;

use std::process::ExitCode;
#[cfg(test)]
use std::time::Duration;

use clap::{Parser, Subcommand};

use rdma_demo::{
    error::EXIT_CODES_HELP,
    flags::{Renamed, When},
};

use crate::error::{Unsupported, exit};

/// Old spellings of `rdma-trace`'s flags, refused for one release with the new one (exit 2),
/// before clap parses the line. The flags follow bpftrace/BCC (`-p PID`, `-c CMD`, `-d DEVICE`,
/// `--duration` long only, `--json PATH|-`) and, for the demo's flags, perftest (`-n`, `-s`).
const RENAMED: &[Renamed] = &[
    Renamed {
        subcommands: &["run", "verify"],
        old: "-i",
        new: "--iterations",
        when: When::Always,
        message: "-i is now -n (--iterations), as in perftest",
    },
    Renamed {
        subcommands: &["run", "verify"],
        old: "-S",
        new: "--size",
        when: When::Always,
        message: "-S is now -s (--size), as in perftest",
    },
    Renamed {
        subcommands: &["softirqs", "funclat", "irq", "cq"],
        old: "-d",
        new: "--duration",
        when: When::Always,
        message: "-d is now --duration (-d names a device)",
    },
    Renamed {
        subcommands: &["irq"],
        old: "-p",
        new: "--match",
        when: When::Always,
        message: "-p is now -m (--match); -p names a PID",
    },
    Renamed {
        subcommands: &["cq", "probes"],
        old: "--json",
        new: "--json",
        when: When::NoValue,
        message: "--json now takes a path, as in the other subcommands: --json - writes JSON to \
                  stdout",
    },
    Renamed {
        subcommands: &["run"],
        old: "--demo",
        new: "--demo-binary",
        when: When::Always,
        message: "--demo is now --demo-binary, as in verify (where --demo names the demo)",
    },
];

/// The examples of the top-level `--help`, then the exit codes of both binaries.
fn top_help() -> String {
    format!(
        "Examples:\n  sudo rdma-trace run --mode both --json report.json\n  \
         sudo rdma-trace run -c 'ib_send_lat -e -d mlx5_0'\n  \
         sudo rdma-trace softirqs 1 5\n  \
         sudo rdma-trace verify --demo write-read --mode event\n  \
         sudo rdma-trace export --listen 0.0.0.0:9464\n  \
         rdma-trace completions bash > /etc/bash_completion.d/rdma-trace\n  \
         sudo rdma-trace funclat ib_uverbs_comp_handler -- ibv_rc_pingpong -e -d rxe0 -g 1 10.0.0.2\n\n\
         {EXIT_CODES_HELP}"
    )
}

#[derive(Parser)]
#[command(
    name = "rdma-trace",
    version = concat!(
        env!("CARGO_PKG_VERSION"),
        " (eBPF object ",
        env!("RDMA_TRACE_EBPF_BUILD_ID"),
        ")"
    ),
    about = "Latency histograms of the Linux RDMA completion path, with eBPF",
    after_help = top_help()
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
    /// Show the eBPF programs' rare-event messages (an end without its start, a busy entry
    /// slot, a full sample ring), rate-limited; RUST_LOG=warn does the same.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
}

#[derive(Subcommand)]
enum Cmd {
    /// Time every softirq vector (NET_RX, TASKLET, ...) with the irq:softirq_* tracepoints.
    #[command(after_help = "Examples:\n  sudo rdma-trace softirqs --duration 5\n  \
                            sudo rdma-trace softirqs 1 10     # every second, ten times\n  \
                            sudo rdma-trace softirqs --duration 10 --json softirqs.json")]
    Softirqs(cmd::softirqs::Args),
    /// Count and time calls of kernel functions (kprobe + kretprobe, or fentry + fexit).
    #[command(
        after_help = "Examples:\n  sudo rdma-trace funclat rxe_rcv rxe_cq_post --duration 5\n  \
                      sudo rdma-trace funclat ib_uverbs_comp_handler -- \
                      rdma-demo pingpong --loopback --mode event\n  \
                      sudo rdma-trace funclat ib_uverbs_comp_handler -c 'ib_send_lat -e -d mlx5_0'\n\n\
                      With a command (-c or --), rdma-trace exits with its status when it fails \
                      (128+N when signal N killed it)."
    )]
    Funclat(cmd::funclat::Args),
    /// Run the rdma-demo ping-pong (or any command, pids, the whole system) as load and report
    /// every probe of the completion path.
    #[command(after_help = "Examples:\n  sudo rdma-trace run\n  \
                            sudo rdma-trace run --mode both -n 10000 -s 64 --json report.json\n  \
                            sudo rdma-trace run -d mlx5_0 --mode poll\n  \
                            sudo rdma-trace run --timeline trace.json -- ib_send_lat -e -d mlx5_0\n  \
                            sudo rdma-trace run -c 'ib_send_lat -e -d mlx5_0 10.0.0.2'\n  \
                            sudo rdma-trace run -p 4242 --json out.json\n  \
                            sudo rdma-trace run --all --duration 10\n\n\
                            With -c CMD, -- CMD, -p or --all, the workload replaces the demo (--mode, \
                            -n, -s, -d, --server-device, --demo-binary do not apply). A command's \
                            status passes through: rdma-trace exits with it when it fails, 128+N \
                            when signal N killed it. A --pid run ends when its processes have all \
                            exited: status 0. Open a --timeline file in https://ui.perfetto.dev.")]
    Run(cmd::run::Args),
    /// Hard IRQ handlers of RDMA/NIC interrupts (count, duration, CPU spread) and NET_RX/TASKLET.
    #[command(after_help = "Examples:\n  sudo rdma-trace irq\n  \
                            sudo rdma-trace irq -m 'mlx5_comp*' --duration 10 --json irq.json\n  \
                            sudo rdma-trace irq --no-tui 1 5     # every second, five times")]
    Irq(cmd::irq::Args),
    /// Log every call of the CQ-path functions with its caller, like an ftrace function log.
    #[command(after_help = "Examples:\n  sudo rdma-trace cq\n  \
                            sudo rdma-trace cq -p 1234 --duration 5 --json -")]
    Cq(cmd::cq::Args),
    /// Prove the demo's data phase uses no socket: count its syscalls per phase with eBPF.
    Verify(cmd::verify::Args),
    /// Serve the probe histograms and counters to Prometheus over HTTP, until Ctrl-C.
    Export(cmd::export::Args),
    /// The probe table and this kernel's decision per row (method, or why not); --check attaches.
    #[command(after_help = "Examples:\n  rdma-trace probes\n  \
                            rdma-trace probes --driver mlx5 --json -\n  \
                            sudo rdma-trace probes --all-drivers --check")]
    Probes(cmd::probes::Args),
    /// Print a shell completion script (bash, zsh, fish, ...) to stdout.
    Completions(cmd::completions::Args),
    /// Write a man page per subcommand into a directory (used by `cargo xtask man`).
    #[command(hide = true)]
    Man(cmd::completions::ManArgs),
    /// Each attach mechanism's cost per hit, over rounds (used by `cargo xtask bench host-model`).
    #[command(hide = true)]
    Calibrate(cmd::calibrate::Args),
}

fn main() -> ExitCode {
    startup::begin();
    if let Some(code) = rdma_demo::flags::refuse_renamed("rdma-trace", RENAMED) {
        return code;
    }
    let cli = Cli::parse();
    verbosity::init(cli.verbose, std::env::var("RUST_LOG").ok().as_deref());
    // Generated from the CLI definition: no runtime, no privileges.
    let generated = match &cli.cmd {
        Cmd::Completions(a) => Some(cmd::completions::completions(
            <Cli as clap::CommandFactory>::command(),
            a.shell,
        )),
        Cmd::Man(a) => Some(
            cmd::completions::man_pages(<Cli as clap::CommandFactory>::command(), &a.out)
                .map(|_| ()),
        ),
        _ => None,
    };
    // Before anything is created: from here on SIGINT, SIGTERM and SIGHUP unwind (detaching
    // probes, ending children, removing the temporary device) instead of killing.
    if generated.is_none()
        && let Err(e) = signals::install()
    {
        eprintln!("rdma-trace: {e:#}");
        return ExitCode::from(exit::FAILURE);
    }
    if let Some(r) = generated {
        return match r {
            Ok(()) => ExitCode::from(exit::OK),
            Err(e) => {
                eprintln!("rdma-trace: {e:#}");
                ExitCode::from(exit::FAILURE)
            }
        };
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("rdma-trace: could not start the async runtime: {e}");
            return ExitCode::from(exit::FAILURE);
        }
    };
    let result = runtime.block_on(async {
        signals::listen()?;
        match &cli.cmd {
            Cmd::Softirqs(a) => cmd::softirqs::run(a).await.map(|()| None),
            Cmd::Funclat(a) => cmd::funclat::run(a).await,
            Cmd::Run(a) => cmd::run::run(a).await,
            Cmd::Irq(a) => cmd::irq::run(a).await.map(|()| None),
            Cmd::Cq(a) => cmd::cq::run(a).await.map(|()| None),
            Cmd::Verify(a) => cmd::verify::run(a).await,
            Cmd::Export(a) => cmd::export::run(a).await.map(|()| None),
            Cmd::Probes(a) => cmd::probes::run(a).await.map(|()| None),
            Cmd::Calibrate(a) => cmd::calibrate::run(a).map(|()| None),
            Cmd::Completions(_) | Cmd::Man(_) => Ok(None),
        }
    });
    match result {
        Ok(Some(status)) if status != 0 => {
            eprintln!("rdma-trace: the traced command exited with status {status}");
            ExitCode::from(u8::try_from(status).unwrap_or(exit::FAILURE))
        }
        Ok(_) => ExitCode::from(exit::OK),
        Err(e) => {
            eprintln!("rdma-trace: {e:#}");
            if let Some(signals::Stopped(s)) = e.downcast_ref::<signals::Stopped>() {
                ExitCode::from(s.exit_code())
            } else if e.downcast_ref::<error::DemoFailed>().is_some() {
                ExitCode::from(exit::DEMO_FAILED)
            } else if e.downcast_ref::<cmd::verify::SocketInDataPhase>().is_some() {
                ExitCode::from(exit::SOCKET_IN_DATA_PHASE)
            } else if e.downcast_ref::<error::Usage>().is_some() {
                ExitCode::from(exit::USAGE)
            } else if e.downcast_ref::<Unsupported>().is_some() {
                ExitCode::from(exit::UNSUPPORTED)
            } else {
                ExitCode::from(exit::FAILURE)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmd::parse_seconds;

    #[test]
    fn seconds_parser_rejects_nonsense() {
        assert_eq!(parse_seconds("2").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_seconds("0.25").unwrap(), Duration::from_millis(250));
        for bad in ["0", "-1", "abc", "inf", "NaN", ""] {
            assert!(parse_seconds(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn demo_flags_outside_the_demos_limits_are_refused_before_anything_runs() {
        use rdma_demo::limits::{MAX_ITERATIONS, MAX_SIZE, MIN_SIZE};
        let parses =
            |args: &[&str]| Cli::try_parse_from([&["rdma-trace"][..], args].concat()).is_ok();
        for sub in ["run", "verify"] {
            let (max_i, over_i) = (MAX_ITERATIONS.to_string(), (MAX_ITERATIONS + 1).to_string());
            let (min_s, under_s) = (MIN_SIZE.to_string(), (MIN_SIZE - 1).to_string());
            let (max_s, over_s) = (MAX_SIZE.to_string(), (MAX_SIZE + 1).to_string());
            assert!(parses(&[sub, "-n", &max_i]), "{sub} -n {max_i}");
            assert!(!parses(&[sub, "-n", &over_i]), "{sub} -n {over_i}");
            assert!(!parses(&[sub, "-n", "0"]), "{sub} -n 0");
            assert!(parses(&[sub, "-s", &min_s]), "{sub} -s {min_s}");
            assert!(!parses(&[sub, "-s", &under_s]), "{sub} -s {under_s}");
            assert!(!parses(&[sub, "-s", "1"]), "{sub} -s 1");
            assert!(parses(&[sub, "-s", &max_s]), "{sub} -s {max_s}");
            assert!(!parses(&[sub, "-s", &over_s]), "{sub} -s {over_s}");
        }
    }

    #[test]
    fn a_short_flag_means_one_long_flag_in_every_subcommand() {
        use clap::CommandFactory as _;
        // bpftrace/BCC's letters, and perftest's for the demo's flags.
        let letters = [
            ("run", 'p', "pid"),
            ("cq", 'p', "pid"),
            ("run", 'c', "command"),
            ("funclat", 'c', "command"),
            ("run", 'd', "device"),
            ("verify", 'd', "device"),
            ("run", 'n', "iterations"),
            ("verify", 'n', "iterations"),
            ("run", 's', "size"),
            ("verify", 's', "size"),
            ("irq", 'm', "match"),
        ];
        let cmd = rdma_demo::flags::check_short_flags(&Cli::command(), &letters);
        // --duration has no short anywhere; --json takes a path everywhere.
        for sub in cmd.get_subcommands() {
            for arg in sub.get_arguments() {
                match arg.get_long() {
                    Some("duration") => assert_eq!(arg.get_short(), None, "{}", sub.get_name()),
                    Some("json") => assert!(
                        arg.get_action().takes_values(),
                        "{} --json takes no path",
                        sub.get_name()
                    ),
                    _ => {}
                }
            }
        }
    }

    #[test]
    fn old_spellings_name_the_new_flag() {
        use clap::CommandFactory as _;
        let refused = [
            (
                "rdma-trace run -i 100",
                "-i is now -n (--iterations), as in perftest",
            ),
            (
                "rdma-trace verify -i 5",
                "-i is now -n (--iterations), as in perftest",
            ),
            (
                "rdma-trace run --no-tui -S 64",
                "-S is now -s (--size), as in perftest",
            ),
            (
                "rdma-trace softirqs -d 5",
                "-d is now --duration (-d names a device)",
            ),
            (
                "rdma-trace -v funclat -d 5 rxe_rcv",
                "-d is now --duration (-d names a device)",
            ),
            ("rdma-trace irq -d 5", "-d is now --duration"),
            ("rdma-trace cq -d 5", "-d is now --duration"),
            (
                "rdma-trace irq -p mlx5*",
                "-p is now -m (--match); -p names a PID",
            ),
            ("rdma-trace cq --json", "--json now takes a path"),
            (
                "rdma-trace probes --json --check",
                "--json - writes JSON to stdout",
            ),
            (
                "rdma-trace run --demo ./rdma-demo",
                "--demo is now --demo-binary",
            ),
        ];
        let accepted = [
            "rdma-trace run -n 100 -s 64 -d rxe1",
            "rdma-trace run -p 1 --duration 5",
            "rdma-trace run --no-tui -- ib_send_lat -s 64 -i 1 -d rxe0",
            "rdma-trace funclat rxe_rcv --duration 5 -- sleep 1",
            "rdma-trace irq -m virtio*",
            "rdma-trace cq -p 1 --json -",
            "rdma-trace probes --json out.json",
            "rdma-trace verify --demo atomic -- -i 5",
        ];
        rdma_demo::flags::check_renamed(&Cli::command(), RENAMED, &refused, &accepted);
    }

    #[test]
    fn a_command_line_is_split_as_a_shell_splits_words() {
        use crate::cmd::CommandLine;
        assert_eq!(
            CommandLine::parse("ib_send_lat -e -d 'mlx5 0' \"a b\" c\\ d $HOME")
                .unwrap()
                .0,
            ["ib_send_lat", "-e", "-d", "mlx5 0", "a b", "c d", "$HOME"]
        );
        assert!(CommandLine::parse("").is_err());
        assert!(CommandLine::parse("sh -c 'unclosed").is_err());
        let cli = Cli::try_parse_from(["rdma-trace", "run", "-c", "sleep 1"]).unwrap();
        let Cmd::Run(a) = cli.cmd else {
            panic!("not run")
        };
        assert!(matches!(
            a.config().load,
            crate::run::config::Load::Workload(crate::load::workload::Target::Command(c)) if c == ["sleep", "1"]
        ));
        for bad in [
            &["run", "-c", "sleep 1", "--", "sleep", "2"][..],
            &["run", "-c", "sleep 1", "-p", "1"],
            &["run", "-c", "sleep 1", "-n", "5"],
            &["funclat", "f", "-c", "sleep 1", "--", "sleep", "2"],
        ] {
            assert!(
                Cli::try_parse_from([&["rdma-trace"][..], bad].concat()).is_err(),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn interval_and_count_are_positional_in_the_periodic_views() {
        let parse = |args: &[&str]| Cli::try_parse_from([&["rdma-trace"][..], args].concat());
        let Cmd::Softirqs(a) = parse(&["softirqs", "1", "5"]).unwrap().cmd else {
            panic!("not softirqs")
        };
        assert_eq!(
            (a.interval, a.count),
            (Some(Duration::from_secs(1)), Some(5))
        );
        let Cmd::Irq(a) = parse(&["irq", "-m", "virtio*", "0.5", "4"]).unwrap().cmd else {
            panic!("not irq")
        };
        assert_eq!(
            (a.every, a.count, a.patterns.as_slice()),
            (
                Some(Duration::from_millis(500)),
                Some(4),
                &["virtio*".to_owned()][..]
            )
        );
        assert!(parse(&["softirqs", "0"]).is_err());
        assert!(parse(&["irq", "1", "--interval", "2"]).is_err());
        assert!(parse(&["irq", "1", "3", "--duration", "2"]).is_err());
    }

    #[test]
    fn help_lists_the_exit_codes_of_both_binaries() {
        use clap::CommandFactory as _;
        rdma_demo::flags::check_exit_codes_help(&Cli::command().render_long_help().to_string());
        let run = Cli::command()
            .find_subcommand_mut("run")
            .unwrap()
            .render_long_help()
            .to_string();
        assert!(run.contains("128+N"), "{run}");
    }

    #[test]
    fn cli_is_well_formed() {
        use clap::CommandFactory as _;
        Cli::command().debug_assert();
    }
}

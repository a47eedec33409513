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

use crate::error::{Unsupported, exit};

#[derive(Parser)]
#[command(
    name = "rdma-trace",
    version,
    about = "Latency histograms of the Linux RDMA completion path, with eBPF",
    after_help = "Exit codes: 0 ok (also a window ended by --duration, and Ctrl-C ending a collection \
                  that runs until stopped); 1 failure; 2 bad usage; 3 the kernel or privileges lack what \
                  a probe needs (no kprobes, no such function, not root); 4 `verify` saw a socket syscall \
                  in the data phase; 5 the bundled rdma-demo of `run` or `verify` failed (its own status \
                  is printed); 129, 130, 143 stopped by SIGHUP, SIGINT, SIGTERM (`run` and `verify` at any \
                  time, the others while they set up). With \
                  a COMMAND (`funclat -- COMMAND`), a command that fails makes rdma-trace exit with its \
                  status.\n\n\
                  Examples:\n  sudo rdma-trace run --mode both --json report.json\n  \
                  sudo rdma-trace softirqs --duration 5\n  \
                  sudo rdma-trace verify --demo write-read --mode event\n  \
                  sudo rdma-trace export --listen 0.0.0.0:9464\n  \
                  rdma-trace completions bash > /etc/bash_completion.d/rdma-trace\n  \
                  sudo rdma-trace funclat ib_uverbs_comp_handler -- ibv_rc_pingpong -e -d rxe0 -g 1 10.0.0.2"
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
                            sudo rdma-trace softirqs --duration 10 --json softirqs.json")]
    Softirqs(cmd::softirqs::Args),
    /// Count and time calls of kernel functions (kprobe + kretprobe, or fentry + fexit).
    #[command(
        after_help = "Examples:\n  sudo rdma-trace funclat rxe_rcv rxe_cq_post --duration 5\n  \
                      sudo rdma-trace funclat ib_uverbs_comp_handler -- \
                      rdma-demo pingpong --loopback --mode event"
    )]
    Funclat(cmd::funclat::Args),
    /// Run the rdma-demo ping-pong (or any command, pids, the whole system) as load and report
    /// every probe of the completion path.
    #[command(after_help = "Examples:\n  sudo rdma-trace run\n  \
                            sudo rdma-trace run --mode both -i 10000 -S 64 --json report.json\n  \
                            sudo rdma-trace run -d mlx5_0 --mode poll\n  \
                            sudo rdma-trace run --timeline trace.json -- ib_send_lat -e -d mlx5_0\n  \
                            sudo rdma-trace run --pid 4242 --json out.json\n  \
                            sudo rdma-trace run --all --duration 10\n\n\
                            With a CMD, --pid or --all, the workload replaces the demo (--mode, -i, -S, \
                            -d, --server-device, --demo do not apply). Open a --timeline file in \
                            https://ui.perfetto.dev.")]
    Run(cmd::run::Args),
    /// Hard IRQ handlers of RDMA/NIC interrupts (count, duration, CPU spread) and NET_RX/TASKLET.
    #[command(after_help = "Examples:\n  sudo rdma-trace irq\n  \
                            sudo rdma-trace irq --match 'mlx5_comp*' --duration 10 --json irq.json")]
    Irq(cmd::irq::Args),
    /// Log every call of the CQ-path functions with its caller, like an ftrace function log.
    #[command(after_help = "Examples:\n  sudo rdma-trace cq\n  \
                            sudo rdma-trace cq --pid 1234 --duration 5 --json")]
    Cq(cmd::cq::Args),
    /// Prove the demo's data phase uses no socket: count its syscalls per phase with eBPF.
    Verify(cmd::verify::Args),
    /// Serve the probe histograms and counters to Prometheus over HTTP, until Ctrl-C.
    Export(cmd::export::Args),
    /// The probe table and this kernel's decision per row (method, or why not); --check attaches.
    #[command(after_help = "Examples:\n  rdma-trace probes\n  \
                            rdma-trace probes --driver mlx5 --json\n  \
                            sudo rdma-trace probes --all-drivers --check")]
    Probes(cmd::probes::Args),
    /// Print a shell completion script (bash, zsh, fish, ...) to stdout.
    Completions(cmd::completions::Args),
    /// Write a man page per subcommand into a directory (used by `cargo xtask man`).
    #[command(hide = true)]
    Man(cmd::completions::ManArgs),
}

fn main() -> ExitCode {
    startup::begin();
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
            assert!(parses(&[sub, "-i", &max_i]), "{sub} -i {max_i}");
            assert!(!parses(&[sub, "-i", &over_i]), "{sub} -i {over_i}");
            assert!(!parses(&[sub, "-i", "0"]), "{sub} -i 0");
            assert!(parses(&[sub, "-S", &min_s]), "{sub} -S {min_s}");
            assert!(!parses(&[sub, "-S", &under_s]), "{sub} -S {under_s}");
            assert!(!parses(&[sub, "-S", "1"]), "{sub} -S 1");
            assert!(parses(&[sub, "-S", &max_s]), "{sub} -S {max_s}");
            assert!(!parses(&[sub, "-S", &over_s]), "{sub} -S {over_s}");
        }
    }

    #[test]
    fn cli_is_well_formed() {
        use clap::CommandFactory as _;
        Cli::command().debug_assert();
    }
}

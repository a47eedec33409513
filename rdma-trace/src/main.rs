//! rdma-trace: latency histograms of the Linux RDMA completion path, with eBPF.

mod bpf;
mod cmd;
mod elf;
mod error;
mod hist;
mod kernel;
mod overhead;
mod plan;
mod probes;
mod report;
mod session;
mod softroce;
mod timeline;
mod tui;
mod waterfall;
mod workload;

use std::{process::ExitCode, time::Duration};

use clap::{Parser, Subcommand};

use crate::error::{Unsupported, exit};

#[derive(Parser)]
#[command(
    name = "rdma-trace",
    version,
    about = "Latency histograms of the Linux RDMA completion path, with eBPF",
    after_help = "Exit codes: 0 ok; 1 failure; 2 bad usage; 3 the kernel or privileges lack what a probe \
                  needs (no kprobes, no such function, not root); 4 `verify` saw a socket syscall in the \
                  data phase. With a COMMAND, a command that fails \
                  makes rdma-trace exit with its status.\n\n\
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
    /// Print a shell completion script (bash, zsh, fish, ...) to stdout.
    Completions(cmd::completions::Args),
    /// Write a man page per subcommand into a directory (used by `cargo xtask man`).
    #[command(hide = true)]
    Man(cmd::completions::ManArgs),
}

/// Parse a positive number of seconds (`2`, `0.5`).
fn parse_seconds(s: &str) -> Result<Duration, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v < 1e9 => Ok(Duration::from_secs_f64(v)),
        _ => Err(format!("`{s}` is not a positive number of seconds")),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
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
        match &cli.cmd {
            Cmd::Softirqs(a) => cmd::softirqs::run(a).await.map(|()| None),
            Cmd::Funclat(a) => cmd::funclat::run(a).await,
            Cmd::Run(a) => cmd::run::run(a).await,
            Cmd::Irq(a) => cmd::irq::run(a).await.map(|()| None),
            Cmd::Cq(a) => cmd::cq::run(a).await.map(|()| None),
            Cmd::Verify(a) => cmd::verify::run(a).await,
            Cmd::Export(a) => cmd::export::run(a).await.map(|()| None),
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
            if e.downcast_ref::<cmd::verify::SocketInDataPhase>().is_some() {
                ExitCode::from(exit::SOCKET_IN_DATA_PHASE)
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

    #[test]
    fn seconds_parser_rejects_nonsense() {
        assert_eq!(parse_seconds("2").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_seconds("0.25").unwrap(), Duration::from_millis(250));
        for bad in ["0", "-1", "abc", "inf", "NaN", ""] {
            assert!(parse_seconds(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn cli_is_well_formed() {
        use clap::CommandFactory as _;
        Cli::command().debug_assert();
    }
}

//! `rdma-demo`: RDMA verbs demos. See `rdma-demo --help`.

#![forbid(unsafe_code)]

use std::io::{self, Write};
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use rdma_demo::devices::{self, DevicesError};

/// Runtime failure (a verbs call, output).
const EXIT_FAILURE: u8 = 1;
/// No RDMA device, or the named device does not exist. (2 is clap's usage error.)
const EXIT_NO_DEVICE: u8 = 3;

const EXIT_CODES_HELP: &str = "\
Exit codes:
  0  success
  1  runtime failure (a verbs call or writing the output failed)
  2  usage error
  3  no RDMA device, or the device named with --device does not exist";

#[derive(Debug, Parser)]
#[command(
    name = "rdma-demo",
    version,
    about = "RDMA verbs demos (Rust ports of the classic C examples)"
)]
#[command(after_help = EXIT_CODES_HELP, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// List RDMA devices, their ports and GID tables
    #[command(after_help = EXIT_CODES_HELP)]
    Devices(DevicesArgs),
}

#[derive(Debug, Args)]
struct DevicesArgs {
    /// Show only this device (e.g. rxe0, mlx5_0)
    #[arg(short = 'd', long = "device", value_name = "NAME")]
    device: Option<String>,
    /// Print JSON instead of text
    #[arg(long)]
    json: bool,
}

/// What ends the program early: the one line for stderr and the exit code.
#[derive(Debug)]
struct Failure {
    code: u8,
    message: String,
}

impl From<DevicesError> for Failure {
    fn from(e: DevicesError) -> Self {
        let code = match e {
            DevicesError::NoDevices(_) | DevicesError::UnknownDevice { .. } => EXIT_NO_DEVICE,
            DevicesError::Verbs(_) => EXIT_FAILURE,
        };
        Failure {
            code,
            message: e.to_string(),
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Devices(args) => run_devices(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            // Not eprintln!: it panics if stderr is gone.
            let _ = writeln!(io::stderr(), "rdma-demo: {}", f.message);
            ExitCode::from(f.code)
        }
    }
}

fn run_devices(args: &DevicesArgs) -> Result<(), Failure> {
    let inventory = devices::collect(args.device.as_deref())?;
    let text = if args.json {
        let mut json = serde_json::to_string_pretty(&inventory).map_err(|e| Failure {
            code: EXIT_FAILURE,
            message: format!("encoding JSON: {e}"),
        })?;
        json.push('\n');
        json
    } else {
        devices::render_text(&inventory)
    };
    print(&text)
}

/// Writes to stdout; a closed pipe (`rdma-demo devices | head`) ends quietly.
fn print(text: &str) -> Result<(), Failure> {
    let mut out = io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != io::ErrorKind::BrokenPipe => Err(Failure {
            code: EXIT_FAILURE,
            message: format!("writing output: {e}"),
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn help_documents_exit_codes() {
        let help = Cli::command().render_long_help().to_string();
        for line in [
            "0  success",
            "1  runtime failure",
            "2  usage error",
            "3  no RDMA device",
        ] {
            assert!(help.contains(line), "{help}");
        }
    }
}

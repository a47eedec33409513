//! Developer and CI tasks for rdma-trace. One file per subcommand.

mod build_ebpf;
mod setup;
mod test;
mod util;
mod vm;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "rdma-trace developer tasks", version)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Install what the project needs (apt packages, eBPF toolchain, bpf-linker). Idempotent.
    Setup(setup::Args),
    /// Build the eBPF object (rdma-trace-ebpf) that rdma-trace embeds.
    BuildEbpf(build_ebpf::Args),
    /// Boot a Debian kernel with two Soft-RoCE devices in QEMU and run a command in it.
    Vm(vm::Args),
    /// Run every test layer: fmt, clippy, unit, host eBPF (root), guest (6.1 and 6.12).
    Test(test::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.cmd {
        Cmd::Setup(a) => setup::run(&a).map(|()| 0),
        Cmd::BuildEbpf(a) => build_ebpf::run(&a).map(|_| 0),
        Cmd::Vm(a) => vm::run(&a),
        Cmd::Test(a) => test::run(&a).map(|()| 0),
    };
    match result {
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Err(e) => {
            eprintln!("xtask: error: {e:#}");
            ExitCode::from(1)
        }
    }
}

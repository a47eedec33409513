//! Developer and CI tasks for rdma-trace. One file per subcommand.

mod bench;
mod build_ebpf;
mod dist;
mod fixtures;
mod libclang;
mod man;
mod run;
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
    /// Kernel fixtures of the hardware RDMA drivers, read off the guest kernels' own modules
    /// (into rdma-trace/tests/fixtures/<driver>-<kernel>/).
    Fixtures(fixtures::Args),
    /// Release tarball (target/dist): rdma-trace with its eBPF object, rdma-demo, man pages,
    /// completions, README, docs/install.md, SHA256SUMS. Needs only the build toolchain.
    Dist(dist::Args),
    /// Generate the man pages of rdma-trace and rdma-demo (into target/man).
    Man(man::Args),
    /// The main job: build, then `rdma-trace run --mode event` here (RDMA device) or in the guest.
    Run(run::Args),
    /// Run every test layer: fmt, clippy, unit, host eBPF (root), guest (6.1 and 6.12).
    Test(test::Args),
    /// Benchmarks in the guest: `demo` (vs the C tools), `trace` (vs bpftrace), `model` (each
    /// preset on a real host); all three and docs/benchmarks.md without a subcommand.
    Bench(bench::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    libclang::configure();
    let result = match cli.cmd {
        Cmd::Setup(a) => setup::run(&a).map(|()| 0),
        Cmd::BuildEbpf(a) => build_ebpf::run(&a).map(|_| 0),
        Cmd::Vm(a) => vm::run(&a),
        Cmd::Run(a) => run::run(&a),
        Cmd::Test(a) => test::run(&a).map(|()| 0),
        Cmd::Bench(a) => bench::run(&a),
        Cmd::Dist(a) => dist::run(&a).map(|_| 0),
        Cmd::Man(a) => man::run(&a).map(|_| 0),
        Cmd::Fixtures(a) => fixtures::run(&a).map(|()| 0),
    };
    match result {
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Err(e) => {
            eprintln!("xtask: error: {e:#}");
            ExitCode::from(1)
        }
    }
}

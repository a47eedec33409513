//! `rdma-trace calibrate` (hidden; used by `cargo xtask bench host-model`): the start-up
//! calibration of each attach mechanism's cost per hit, repeated for a number of rounds, with
//! nothing else attached. Mechanisms the kernel refuses (no kprobes, fentry EPERM) are reported
//! as unavailable, with why.

use anyhow::Result;
use serde::Serialize;

use crate::bpf::{calibrate::Calibration, loader::load_object, stats::RunTimeStats};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Calibration rounds (each one times every mechanism, the best of a few loops).
    #[arg(long, default_value_t = 15, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub rounds: u32,
    /// Write the rounds as JSON (`{"stats": ..., "rounds": [calibration, ...]}`) to this file.
    #[arg(long, value_name = "PATH")]
    pub json: Option<std::path::PathBuf>,
}

#[derive(Serialize)]
struct Rounds<'a> {
    /// How the kernel's BPF run-time statistics were enabled (for the empty-body figures).
    stats: &'a str,
    rounds: &'a [Calibration],
}

pub fn run(args: &Args) -> Result<()> {
    crate::bpf::loader::check_privileges()?;
    if let Some(path) = &args.json {
        crate::output::check_writable(path)?;
    }
    let stats = RunTimeStats::enable();
    let mut ebpf = load_object("the eBPF object", |l| l)?;
    let mut rounds = Vec::new();
    for i in 0..args.rounds {
        let c = crate::bpf::calibrate::run(&mut ebpf, true);
        eprintln!("rdma-trace: round {}: {}", i + 1, c.render());
        rounds.push(c);
    }
    if let Some(path) = &args.json {
        crate::output::write_json(
            path,
            &Rounds {
                stats: &stats.how,
                rounds: &rounds,
            },
        )?;
    }
    Ok(())
}

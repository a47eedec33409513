//! `cargo xtask man [--out DIR]`: man pages for `rdma-trace` and `rdma-demo`, generated from
//! their clap definitions.
//!
//! The definitions live in the binaries, so the binaries write the pages themselves (hidden
//! `man --out DIR` subcommand, clap_mangen): this task builds them (with the eBPF object
//! `rdma-trace` embeds) and runs that subcommand. One page per visible subcommand,
//! `rdma-trace-verify.1` and so on, plus `rdma-trace.1` and `rdma-demo.1`.

use std::{path::PathBuf, process::Command};

use anyhow::{Context as _, Result, bail};

use crate::{
    build_ebpf,
    util::{root, run_cmd, say, target_dir},
};

#[derive(clap::Args)]
pub struct Args {
    /// Directory for the pages [default: target/man].
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
}

pub const BINARIES: [&str; 2] = ["rdma-trace", "rdma-demo"];

/// Returns the directory the pages were written to.
pub fn run(args: &Args) -> Result<PathBuf> {
    build_ebpf::run(&build_ebpf::Args { release: false })?;
    run_cmd(Command::new(env!("CARGO")).current_dir(root()).args([
        "build",
        "-p",
        "rdma-trace",
        "-p",
        "rdma-demo",
    ]))?;
    let out = args.out.clone().unwrap_or_else(|| target_dir().join("man"));
    for bin in BINARIES {
        let exe = target_dir().join("debug").join(bin);
        run_cmd(Command::new(&exe).arg("man").arg("--out").arg(&out))
            .with_context(|| format!("generating the man pages of {bin}"))?;
    }
    let mut pages: Vec<String> = std::fs::read_dir(&out)
        .with_context(|| format!("reading {}", out.display()))?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".1"))
        .collect();
    pages.sort();
    if pages.is_empty() {
        bail!("no man page was written to {}", out.display());
    }
    say(format!(
        "{} man pages in {}: {}",
        pages.len(),
        out.display(),
        pages.join(" ")
    ));
    Ok(out)
}

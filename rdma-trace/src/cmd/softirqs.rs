//! `rdma-trace softirqs`: how long each softirq vector runs (NET_RX, TASKLET, ...), from the
//! `irq:softirq_entry` / `irq:softirq_exit` tracepoints (attached raw: no tracefs needed).

use std::{path::PathBuf, time::Duration};

use anyhow::Result;
use rdma_trace_common::{NR_SOFTIRQS, SOFTIRQ_NAMES};
use serde::Serialize;

use crate::{
    bpf::session::Session,
    kernel::facts::Kernel,
    kernel::plan::Options,
    kernel::probes::ProbeDef,
    model::report::{ProbeReport, probe_reports, render},
    model::window::{Window, wait_window},
    output::write_json_if,
};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Collect for this many seconds (default: until Ctrl-C).
    #[arg(short, long, value_name = "SECS", value_parser = crate::cmd::parse_seconds)]
    pub duration: Option<Duration>,
    /// Also write the report as JSON to this file (`-`: stdout).
    #[arg(long, value_name = "PATH")]
    pub json: Option<PathBuf>,
}

#[derive(Serialize)]
struct Report {
    kernel: Option<String>,
    window: Window,
    vectors: Vec<ProbeReport>,
}

/// One probe per softirq vector.
fn vector_probes() -> Vec<ProbeDef> {
    (0..NR_SOFTIRQS)
        .map(|vector| {
            ProbeDef::softirq(
                SOFTIRQ_NAMES[vector as usize],
                vector,
                "softirq vector run, entry → exit",
            )
        })
        .collect()
}

pub async fn run(args: &Args) -> Result<()> {
    if let Some(path) = &args.json {
        crate::output::check_writable(path)?;
    }
    let kernel = Kernel::live();
    let mut session = Session::start(&kernel, &vector_probes(), Options::default())?;
    eprintln!(
        "rdma-trace: timing softirqs{}; Ctrl-C to stop",
        args.duration
            .map(|d| format!(" for {} s", d.as_secs_f64()))
            .unwrap_or_default()
    );
    let window = wait_window(args.duration, None).await?;
    let data = session.finish()?;
    let vectors = probe_reports(&session, &data, window.seconds);
    println!("softirq durations over {:.1} s", window.seconds);
    print!("{}", render(&vectors));
    write_json_if(args.json.as_deref(), || Report {
        kernel: kernel.release(),
        window,
        vectors,
    })?;
    Ok(())
}

//! `rdma-trace softirqs`: how long each softirq vector runs (NET_RX, TASKLET, ...), from the
//! `irq:softirq_entry` / `irq:softirq_exit` tracepoints (attached raw: no tracefs needed).

use std::{path::PathBuf, time::Duration};

use anyhow::Result;
use rdma_trace_common::{NR_SOFTIRQS, SLOTS, SOFTIRQ_NAMES};
use serde::Serialize;

use crate::{
    bpf::Bpf,
    cmd::{Window, collect_window, write_json},
    hist::{HistReport, Log2Hist, human_ns},
    kernel::Kernel,
};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Collect for this many seconds (default: until Ctrl-C).
    #[arg(short, long, value_name = "SECS", value_parser = crate::parse_seconds)]
    pub duration: Option<Duration>,
    /// Also write the report as JSON to this file.
    #[arg(long, value_name = "PATH")]
    pub json: Option<PathBuf>,
}

#[derive(Serialize)]
struct Report {
    kernel: Option<String>,
    window: Window,
    vectors: Vec<Vector>,
}

#[derive(Serialize)]
struct Vector {
    name: &'static str,
    #[serde(flatten)]
    hist: HistReport,
}

pub async fn run(args: &Args) -> Result<()> {
    let kernel = Kernel::live();
    let mut bpf = Bpf::load()?;
    bpf.attach_raw_tracepoint("softirq_entry", "softirq_entry")?;
    bpf.attach_raw_tracepoint("softirq_exit", "softirq_exit")?;
    eprintln!(
        "rdma-trace: timing softirqs{}; Ctrl-C to stop",
        args.duration
            .map(|d| format!(" for {} s", d.as_secs_f64()))
            .unwrap_or_default()
    );
    let window = collect_window(args.duration, &[]).await?;

    let sums = bpf.read_sums("SOFTIRQ_HIST", 0, NR_SOFTIRQS * SLOTS)?;
    let hists: Vec<Log2Hist> = sums
        .chunks_exact(SLOTS as usize)
        .map(|c| Log2Hist::from_buckets(c.try_into().expect("chunks of SLOTS")))
        .collect();
    drop(bpf); // detach before printing

    println!(
        "softirq durations over {:.1} s (log2 buckets)",
        window.seconds
    );
    println!(
        "{:<9} {:>10} {:>10} {:>10}",
        "vector", "count", "p50 <", "p99 <"
    );
    for (name, h) in SOFTIRQ_NAMES.iter().zip(&hists) {
        let q = |x| {
            h.quantile_upper_ns(x)
                .map(human_ns)
                .unwrap_or_else(|| "-".into())
        };
        println!("{name:<9} {:>10} {:>10} {:>10}", h.count(), q(0.5), q(0.99));
    }
    for (name, h) in SOFTIRQ_NAMES.iter().zip(&hists) {
        if h.count() > 0 {
            print!("\n{name}:\n{}", h.render(40));
        }
    }
    if let Some(path) = &args.json {
        let report = Report {
            kernel: kernel.release(),
            window,
            vectors: SOFTIRQ_NAMES
                .iter()
                .zip(&hists)
                .map(|(name, h)| Vector {
                    name,
                    hist: h.into(),
                })
                .collect(),
        };
        write_json(path, &report)?;
    }
    Ok(())
}

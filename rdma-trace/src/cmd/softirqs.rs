//! `rdma-trace softirqs`: how long each softirq vector runs (NET_RX, TASKLET, ...), from the
//! `irq:softirq_entry` / `irq:softirq_exit` tracepoints (attached raw: no tracefs needed).

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::Result;
use rdma_trace_common::{NR_SOFTIRQS, SOFTIRQ_NAMES};
use serde::Serialize;

use crate::{
    bpf::session::Session,
    kernel::facts::Kernel,
    kernel::plan::Options,
    kernel::probes::ProbeDef,
    model::baseline::delta,
    model::report::{ProbeReport, probe_reports, render},
    model::window::{Waiter, Window, wait_window},
    output::{print_text, write_json_if},
};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Print the durations of the last INTERVAL seconds every INTERVAL seconds, as BCC's
    /// softirqs does [default: one report at the end].
    #[arg(value_name = "INTERVAL", value_parser = crate::cmd::parse_seconds)]
    pub interval: Option<Duration>,
    /// Stop after this many intervals [default: until Ctrl-C or --duration].
    #[arg(value_name = "COUNT", requires = "interval", value_parser = clap::value_parser!(u32).range(1..))]
    pub count: Option<u32>,
    /// Collect for this many seconds (default: until Ctrl-C).
    #[arg(long, value_name = "SECS", value_parser = crate::cmd::parse_seconds)]
    pub duration: Option<Duration>,
    /// Also write the report of the whole window as JSON to this file (`-`: stdout).
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
        "rdma-trace: timing softirqs{}{}; Ctrl-C to stop",
        args.duration
            .map(|d| format!(" for {} s", d.as_secs_f64()))
            .unwrap_or_default(),
        args.interval
            .map(|i| format!(", each {} s apart", i.as_secs_f64()))
            .unwrap_or_default()
    );
    let window = match args.interval {
        Some(interval) => {
            intervals(
                &session,
                interval,
                args.count,
                args.duration,
                args.json.as_deref(),
            )
            .await?
        }
        None => wait_window(args.duration, None).await?,
    };
    let data = session.finish()?;
    let vectors = probe_reports(&session, &data, window.seconds);
    if args.interval.is_none() {
        print_text(
            args.json.as_deref(),
            &format!(
                "softirq durations over {:.1} s\n{}",
                window.seconds,
                render(&vectors)
            ),
        );
    }
    write_json_if(args.json.as_deref(), || Report {
        kernel: kernel.release(),
        window,
        vectors,
    })?;
    Ok(())
}

/// Every `interval`, the durations of that interval alone (BCC's `softirqs INTERVAL COUNT`),
/// until `count` intervals, the end of `duration` or a stop signal; the whole window.
async fn intervals(
    session: &Session,
    interval: Duration,
    count: Option<u32>,
    duration: Option<Duration>,
    json: Option<&Path>,
) -> Result<Window> {
    let mut waiter =
        Waiter::new(duration, None).every(interval, tokio::time::MissedTickBehavior::Delay);
    waiter.next_tick().await?; // the first tick comes at once
    let mut before = session.snapshot()?;
    let mut at = waiter.elapsed();
    let mut printed = 0;
    let end = loop {
        if let Some(end) = waiter.next_tick().await? {
            break end;
        }
        let after = session.snapshot()?;
        let seconds = (waiter.elapsed() - at).as_secs_f64();
        let vectors = probe_reports(session, &delta(&after, &before), seconds);
        print_text(
            json,
            &format!(
                "softirq durations over the last {seconds:.1} s\n{}",
                render(&vectors)
            ),
        );
        (before, at) = (after, waiter.elapsed());
        printed += 1;
        if count.is_some_and(|c| printed >= c) {
            break crate::model::window::End::Caller("count");
        }
    };
    Ok(waiter.window(end))
}

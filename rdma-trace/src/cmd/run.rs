//! `rdma-trace run`: the command line, read once into a [`RunConfig`]; the pipeline is
//! `crate::run`.

use std::{path::PathBuf, time::Duration};

use anyhow::Result;

use crate::{
    load::workload::Target,
    model::budget::{self, Preset},
    run::config::{DemoLoad, Load, Mode, RunConfig},
};

#[derive(clap::Args, Debug)]
#[command(group = clap::ArgGroup::new("workload").args(["command_line", "command", "pid", "all"]))]
pub struct Args {
    /// Completion mode of the demo.
    #[arg(long, value_enum, default_value = "event", conflicts_with = "workload")]
    pub mode: Mode,
    /// Ping-pong iterations per mode (perftest's -n).
    #[arg(short = 'n', long, value_name = "N", default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=i64::from(rdma_demo::limits::MAX_ITERATIONS)), conflicts_with = "workload")]
    pub iterations: u32,
    /// Message size in bytes (perftest's -s), rdma-demo's default too.
    #[arg(short = 's', long, value_name = "BYTES", default_value_t = rdma_demo::limits::DEFAULT_SIZE, value_parser = clap::value_parser!(u32).range(i64::from(rdma_demo::limits::MIN_SIZE)..=i64::from(rdma_demo::limits::MAX_SIZE)), conflicts_with = "workload")]
    pub size: u32,
    /// RDMA device of the client [default: rxe1 when rxe0 and rxe1 exist, else the first device].
    #[arg(short, long, value_name = "DEV", conflicts_with = "workload")]
    pub device: Option<String>,
    /// RDMA device of the server [default: rxe0 when rxe0 and rxe1 exist, else --device].
    #[arg(long, value_name = "DEV", conflicts_with = "workload")]
    pub server_device: Option<String>,
    /// Stop a mode's run after this many seconds even if the demo is not done (a success: the
    /// demo is stopped and the mode reported).
    #[arg(long, value_name = "SECS", value_parser = crate::cmd::parse_seconds)]
    pub duration: Option<Duration>,
    /// Write the report as JSON to this file (`-`: stdout).
    #[arg(long, value_name = "PATH")]
    pub json: Option<PathBuf>,
    /// No live screen: print text histograms each interval, then the report. Also the case
    /// when stdout is not a terminal.
    #[arg(long)]
    pub no_tui: bool,
    /// Also print every probe's row and histogram in the report (the default shows the kernel
    /// path's top rows by total time).
    #[arg(long)]
    pub hist: bool,
    /// Refresh interval of the live view [default: 0.25 s on the screen, 1 s as text].
    #[arg(long, value_name = "SECS", value_parser = crate::cmd::parse_seconds)]
    pub interval: Option<Duration>,
    /// Keep probes of driver paths without a device here.
    #[arg(long)]
    pub all_drivers: bool,
    /// Also attach the user-space probes (uprobe on ibv_get_cq_event: the demo's blocked time).
    /// Off by default: a uprobe traps on every call and slows event-mode round trips.
    #[arg(long)]
    pub uprobes: bool,
    /// The rdma-demo binary [default: next to rdma-trace, else on PATH].
    #[arg(long = "demo-binary", value_name = "PATH", conflicts_with = "workload")]
    pub demo: Option<PathBuf>,
    /// What tracing may add to a round trip, in % of it: over it, the report names the
    /// programs that cost the most (and --enforce drops them).
    #[arg(long, value_name = "PCT", default_value_t = 5.0, value_parser = budget::parse_percent)]
    pub overhead_budget: f64,
    /// Over the budget, detach the most expensive programs (once the first round trips have
    /// been measured) until the estimate is within it, and say which.
    #[arg(long)]
    pub enforce: bool,
    /// Which rows of the probe table to attach (`rdma-trace probes` lists each row's preset):
    /// minimal (the completion handler and each driver's hand-off), default (and one row per
    /// stage of each driver's path), full (every row: every driver function, the wake-up,
    /// softirqs, IRQs and NAPI polls, the uprobe, every driver's rows).
    #[arg(long, value_enum, default_value_t = Preset::Default)]
    pub probes: Preset,
    /// Completion waterfall: also keep this many per-event records (JSON `waterfall_samples`);
    /// the bundled demo then stamps as many of its event reads and posts (`rdma-demo --stamps`).
    #[arg(long, value_name = "N", default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=i64::from(rdma_demo::limits::MAX_STAMPS)))]
    pub sample: u32,
    /// Completion waterfall: stamp the full waterfall for 1 in N of each channel's completion
    /// events and count every one (cheaper on heavy paths; the stage tables are over the
    /// stamped events, and the report says so). --enforce raises it over the budget.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub sample_every: u32,
    /// Do not trace the completion waterfall (handler → wake-up → on CPU → read, per thread).
    #[arg(long)]
    pub no_waterfall: bool,
    /// A thread blocked in ibv_get_cq_event longer than this, on a channel that has delivered
    /// events, is a stall: the report, the JSON and the live view say which link of the
    /// completion chain broke (docs/stalls.md).
    #[arg(long, value_name = "SECS", default_value = "1", value_parser = crate::cmd::parse_seconds)]
    pub stall_after: Duration,
    /// Trace these running processes (and their children) instead of running the demo; ends
    /// when they have all exited, at --duration or Ctrl-C (each a success: status 0).
    #[arg(short, long, value_name = "PID[,PID...]", value_delimiter = ',',
          value_parser = clap::value_parser!(u32).range(1..))]
    pub pid: Vec<u32>,
    /// Trace the whole system instead of running the demo, until Ctrl-C or --duration.
    #[arg(long)]
    pub all: bool,
    /// Run this command line as the load instead of the demo, like `-- CMD ARGS` (split as a
    /// shell splits words, without expansions); rdma-trace exits with its status.
    #[arg(short = 'c', long = "command", value_name = "\"CMD ARGS\"", value_parser = crate::cmd::CommandLine::parse)]
    pub command_line: Option<crate::cmd::CommandLine>,
    /// Write a timeline of sampled completions (Chrome trace-event JSON): open it in
    /// https://ui.perfetto.dev.
    #[arg(long, value_name = "PATH")]
    pub timeline: Option<PathBuf>,
    /// Completions the timeline keeps: the first N, and the slowest N per stage.
    #[arg(long, value_name = "N", default_value_t = 20, requires = "timeline",
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub timeline_sample: u32,
    /// Upper bound on the number of events in the timeline file.
    #[arg(long, value_name = "N", default_value_t = 100_000, requires = "timeline",
          value_parser = clap::value_parser!(u32).range(10..=10_000_000))]
    pub timeline_max_events: u32,
    /// Run this command and its children as the load instead of the demo; rdma-trace exits
    /// with its status (128+N when signal N killed it).
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<String>,
}

impl Args {
    /// The typed configuration of this command line.
    pub fn config(&self) -> RunConfig {
        let load = if let Some(line) = &self.command_line {
            Load::Workload(Target::Command(line.0.clone()))
        } else if !self.command.is_empty() {
            Load::Workload(Target::Command(self.command.clone()))
        } else if !self.pid.is_empty() {
            Load::Workload(Target::Pids(self.pid.clone()))
        } else if self.all {
            Load::Workload(Target::All)
        } else {
            Load::Demo(DemoLoad {
                mode: self.mode,
                iterations: self.iterations,
                size: self.size,
                device: self.device.clone(),
                server_device: self.server_device.clone(),
                binary: self.demo.clone(),
            })
        };
        RunConfig {
            load,
            duration: self.duration,
            json: self.json.clone(),
            no_tui: self.no_tui,
            hist: self.hist,
            interval: self.interval,
            probes: self.probes,
            all_drivers: self.all_drivers,
            uprobes: self.uprobes,
            overhead_budget: self.overhead_budget,
            enforce: self.enforce,
            no_waterfall: self.no_waterfall,
            stall_after: self.stall_after,
            sample: self.sample,
            sample_every: self.sample_every,
            timeline: self.timeline.clone(),
            timeline_sample: self.timeline_sample,
            timeline_max_events: self.timeline_max_events,
        }
    }
}

/// A failing demo is an error (`DemoFailed`, exit 11), a stop signal too (`Stopped`).
pub async fn run(args: &Args) -> Result<Option<i32>> {
    crate::run::run(&args.config()).await
}

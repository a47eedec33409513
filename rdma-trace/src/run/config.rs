//! What `run` was asked, typed and without clap: `cmd/run.rs` reads the command line into a
//! [`RunConfig`] once, and every stage of the pipeline reads this.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use serde::Serialize;

use crate::{load::workload::Target, model::budget::Preset, views::tui::Live};

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Busy polling of the CQ.
    Poll,
    /// Completion channel: sleep until the kernel delivers a completion event.
    Event,
    /// Poll, then event, side by side.
    Both,
}

/// What generates the completions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Load {
    /// The bundled rdma-demo ping-pong.
    Demo(DemoLoad),
    /// A command, running processes, or the whole system.
    Workload(Target),
}

/// The bundled demo's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DemoLoad {
    pub mode: Mode,
    pub iterations: u32,
    pub size: u32,
    /// The client's device (and the server's, without `server_device`).
    pub device: Option<String>,
    pub server_device: Option<String>,
    /// The rdma-demo binary.
    pub binary: Option<PathBuf>,
}

/// What comes after the default report.
#[derive(Clone, Copy, Debug, Default)]
pub struct Detail {
    /// `--hist`: the whole probe table with every histogram.
    pub hist: bool,
    /// `-v`: every program's cost.
    pub costs: bool,
}

/// Everything `run` was asked, typed, without clap.
#[derive(Clone, Debug)]
pub struct RunConfig {
    pub load: Load,
    /// Stop the window (each phase's demo) after this long (a success).
    pub duration: Option<Duration>,
    /// The JSON report's path (`-`: stdout).
    pub json: Option<PathBuf>,
    /// No screen: text each interval.
    pub no_tui: bool,
    /// `--hist`: every probe's histogram in the report.
    pub hist: bool,
    pub interval: Option<Duration>,
    // The probes.
    pub probes: Preset,
    pub all_drivers: bool,
    pub uprobes: bool,
    // The overhead budget.
    pub overhead_budget: f64,
    pub enforce: bool,
    // The completion waterfall.
    pub no_waterfall: bool,
    /// A read blocked longer is a stall.
    pub stall_after: std::time::Duration,
    /// Per-event records kept.
    pub sample: u32,
    /// The handler stamps 1 in this many completion events (1: every one).
    pub sample_every: u32,
    // The timeline file.
    pub timeline: Option<PathBuf>,
    pub timeline_sample: u32,
    pub timeline_max_events: u32,
}

impl RunConfig {
    /// The live view (or, without a terminal or with `--no-tui`, the text view) of a run.
    pub fn live_view(&self) -> Live {
        Live::new(
            "rdma-trace run",
            !self.no_tui,
            self.interval,
            self.json_on_stdout(),
        )
    }

    /// What the text report shows after its default lines: `--hist`, and `-v`.
    pub fn detail(&self) -> Detail {
        Detail {
            hist: self.hist,
            costs: crate::verbosity::level() > 0,
        }
    }

    /// What the waterfall is asked for.
    pub fn waterfall_settings(&self) -> crate::waterfall::Settings {
        crate::waterfall::Settings {
            sample: self.sample as usize,
            timeline: self.timeline_waterfall_events(),
            stall_after: self.stall_after,
            sample_every: self.sample_every,
        }
    }

    /// How many completion events the waterfall keeps for the timeline (0 without `--timeline`).
    pub fn timeline_waterfall_events(&self) -> usize {
        if self.timeline.is_some() {
            self.timeline_sample as usize
        } else {
            0
        }
    }

    /// `--json -`: stdout carries the JSON document and nothing else.
    pub fn json_on_stdout(&self) -> bool {
        self.json.as_deref() == Some(Path::new("-"))
    }

    /// Prints text of the report: on stdout, or on stderr when stdout carries the JSON.
    pub fn print(&self, text: &str) {
        if self.json_on_stdout() {
            eprint!("{text}");
        } else {
            print!("{text}");
        }
    }
}

#[cfg(test)]
pub mod tests {
    use super::*;

    /// A demo run's configuration with the command line's defaults.
    pub fn config() -> RunConfig {
        RunConfig {
            load: Load::Demo(demo()),
            duration: None,
            json: None,
            no_tui: true,
            hist: false,
            interval: None,
            probes: Preset::Default,
            all_drivers: false,
            uprobes: false,
            overhead_budget: 5.0,
            enforce: false,
            no_waterfall: true,
            stall_after: std::time::Duration::from_secs(1),
            sample: 0,
            sample_every: 1,
            timeline: None,
            timeline_sample: 20,
            timeline_max_events: 100_000,
        }
    }

    /// The demo with the command line's defaults.
    pub fn demo() -> DemoLoad {
        DemoLoad {
            mode: Mode::Event,
            iterations: 10,
            size: 64,
            device: None,
            server_device: None,
            binary: None,
        }
    }
}

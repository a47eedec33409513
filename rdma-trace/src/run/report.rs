//! The one report of a run, whatever its load (the demo, `-- CMD`, `--pid`, `--all`): the model
//! the text report and the JSON document are made from. The JSON document's shape is
//! documented in `docs/json.md`; [`SCHEMA_VERSION`] changes when a key changes meaning or goes.
//!
//! A run is one or more phases, each with its own window: the demo in `--mode both` has two
//! (poll, then event), every other run one. Every count of a phase covers its window.

use std::{borrow::Cow, collections::BTreeMap};

use serde::Serialize;

use super::config::{DemoLoad, Mode, RunConfig};
use crate::{
    bpf::calibrate::Calibration,
    load::workload::Target,
    model::{
        budget::{Dropped, Preset},
        losses::Losses,
        overhead::Overhead,
        report::ProbeReport,
        window::Window,
    },
    views::timeline,
    waterfall::{SampleRecord, Snapshot, Waterfall, WaterfallReport, stall::Stall},
};

/// The version of the JSON document's shape.
pub const SCHEMA_VERSION: u32 = 1;

/// A whole run.
#[derive(Serialize)]
pub struct RunReport {
    pub schema_version: u32,
    /// `rdma-trace` and its version.
    pub tool: String,
    pub kernel: Option<String>,
    pub load: LoadInfo,
    /// `--probes`.
    pub preset: Preset,
    /// Per-hit cost of each attach mechanism, measured at start (`null` when not measured).
    pub calibration: Option<Calibration>,
    pub overhead_budget_percent: f64,
    pub phases: Vec<Phase>,
    /// Per-event waterfall records (`--sample N`), every phase; `null` without `--sample`.
    pub waterfall_samples: Option<Vec<SampleRecord>>,
    /// The `--timeline` file written; `null` without `--timeline`.
    pub timeline: Option<timeline::Summary>,
}

/// What generated the completions.
#[derive(Clone, Debug, Serialize)]
pub struct LoadInfo {
    /// `demo`, `command`, `pids` or `all`.
    pub kind: &'static str,
    /// In words: `rdma-demo pingpong, rxe0 ↔ rxe1`, the command line, `pid 42`.
    pub label: String,
    /// The command, pids or `all` (`null` for the demo).
    pub target: Option<Target>,
    /// The demo's parameters (`null` for other loads).
    pub demo: Option<DemoInfo>,
}

/// The bundled demo's parameters.
#[derive(Clone, Debug, Serialize)]
pub struct DemoInfo {
    pub server_device: String,
    pub client_device: String,
    pub iterations: u32,
    pub size: u32,
}

impl LoadInfo {
    /// The demo between `server` and `client`.
    pub fn demo(demo: &DemoLoad, server: &str, client: &str) -> Self {
        Self {
            kind: "demo",
            label: format!("rdma-demo pingpong, {server} ↔ {client}"),
            target: None,
            demo: Some(DemoInfo {
                server_device: server.to_owned(),
                client_device: client.to_owned(),
                iterations: demo.iterations,
                size: demo.size,
            }),
        }
    }

    /// A workload.
    pub fn workload(target: &Target) -> Self {
        let (kind, label) = match target {
            Target::Command(cmd) => ("command", cmd.join(" ")),
            Target::Pids(p) => (
                "pids",
                format!(
                    "pid {}",
                    p.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
                ),
            ),
            Target::All => ("all", "the whole system".to_owned()),
        };
        Self {
            kind,
            label,
            target: Some(target.clone()),
            demo: None,
        }
    }
}

impl RunReport {
    pub fn new(config: &RunConfig, kernel: Option<String>, load: LoadInfo) -> Self {
        Self {
            schema_version: SCHEMA_VERSION,
            tool: format!("rdma-trace {}", env!("CARGO_PKG_VERSION")),
            kernel,
            load,
            preset: config.probes,
            calibration: None,
            overhead_budget_percent: config.overhead_budget,
            phases: Vec::new(),
            waterfall_samples: None,
            timeline: None,
        }
    }
}

/// One window of a run.
#[derive(Serialize)]
pub struct Phase {
    /// The demo's completion mode in this phase (`null` for other loads).
    pub mode: Option<Mode>,
    pub window: Window,
    /// What the load used: `completion events` (a CQ with a completion channel got
    /// completions), `none`, or `unknown` (ib_uverbs_comp_handler not attached).
    pub completion_mode: &'static str,
    /// The demo's own `--json` results (`null` for other loads).
    pub demo: Option<serde_json::Value>,
    pub probes: Vec<ProbeReport>,
    /// The kernel consumers' CQs (NVMe-oF, NFS over RDMA, the MAD layer) the ib_cq API woke or
    /// polled in this phase, with their labels (the `ib_cq wakeup` row, full preset; empty
    /// otherwise, and in the demo's phases).
    pub cqs: Vec<crate::bpf::ibcq::CqReport>,
    /// The rdma_cm events of this phase, by type (the `rdma_cm connect` row's; `null` when
    /// none came, and in the demo's phases, which connect without rdma_cm).
    pub rdma_cm: Option<crate::bpf::cma::CmReport>,
    /// The NVMe over RDMA host requests of this phase, split into stages (the `nvme io` row,
    /// full preset; `null` when none completed, and in the demo's phases).
    pub nvme: Option<crate::bpf::nvme::NvmeReport>,
    /// The traced processes and their counts (the demo's phases: empty).
    pub processes: Vec<ProcessReport>,
    /// What tracing cost during this phase.
    pub overhead: Overhead,
    /// Programs `--enforce` detached during this phase.
    pub dropped: Vec<Dropped>,
    /// Per process and thread: stages of the completion events read in this phase (`null`
    /// with `--no-waterfall` or when it could not start).
    pub waterfall: Option<WaterfallReport>,
    /// What the programs could not record in this phase, the events whose stamps were clamped,
    /// and the program runs the kernel skipped (docs/json.md).
    pub losses: Losses,
    /// Threads blocked in `ibv_get_cq_event` longer than `--stall-after`, each with the link of
    /// the completion chain that broke (docs/stalls.md); `null` without the waterfall.
    pub stalls: Option<Vec<Stall>>,
}

/// One traced process of a workload.
#[derive(Serialize)]
pub struct ProcessReport {
    pub pid: u32,
    pub comm: String,
    /// Completion events it read (calls of ib_uverbs_comp_event_read in its context), when
    /// that function is traced.
    pub completion_events_read: Option<u64>,
    /// Probe events while one of its threads was current (its syscalls, and softirqs that ran on
    /// its time), by probe.
    pub probes: BTreeMap<Cow<'static, str>, u64>,
    /// Calls of traced kernel functions in its context, by function.
    pub calls: BTreeMap<Cow<'static, str>, u64>,
}

/// The waterfall's counts over a window (now since `before`, the snapshot at the window's
/// start) and the stalls seen in it. Taken when the window ends, next to the probe table's end
/// snapshot.
pub fn waterfall_window(
    wf: Option<(&Waterfall, &Snapshot)>,
) -> anyhow::Result<(Option<Snapshot>, Option<Vec<Stall>>)> {
    let stalls = wf.map(|(w, _)| w.take_stalls()).transpose()?;
    let delta = wf
        .map(|(w, before)| w.snapshot().map(|s| s.since(before)))
        .transpose()?;
    Ok((delta, stalls))
}

/// A phase's waterfall (`delta`, from [`waterfall_window`]) and its losses over the same
/// window: the waterfall's loss counters and the recursion misses of `overhead`'s programs.
pub fn waterfall_and_losses(
    delta: Option<&Snapshot>,
    overhead: &Overhead,
    release: Option<&str>,
) -> (Option<WaterfallReport>, Losses) {
    let merged = delta.and_then(Snapshot::merged_data);
    let losses = Losses::new(
        merged.as_ref().map(|t| &t.counts),
        overhead.programs.iter().map(|p| {
            (
                p.counts.name.as_str(),
                p.counts.recursion_misses,
                p.counts.kprobe_misses,
            )
        }),
        release,
    );
    (delta.map(WaterfallReport::from_snapshot), losses)
}

/// The completion mode a phase's probes show: from `ib_uverbs_comp_handler`'s count.
pub fn completion_mode(probes: &[ProbeReport]) -> (&'static str, Option<u64>) {
    let comp = probes
        .iter()
        .find(|p| p.name == "ib_uverbs_comp_handler" && p.skipped.is_none())
        .map(|p| p.count);
    let mode = match comp {
        Some(n) if n > 0 => "completion events",
        Some(_) => "none",
        None => "unknown",
    };
    (mode, comp)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::config::Load;

    /// The independent truth: the key lists below are what docs/json.md documents; a demo run
    /// and a workload run must serialize the same top-level and phase keys.
    #[test]
    fn a_demo_run_and_a_workload_run_have_the_same_keys() {
        let config = |load| RunConfig {
            load,
            ..crate::run::config::tests::config()
        };
        let demo_load = crate::run::config::tests::demo();
        let demo = RunReport::new(
            &config(Load::Demo(demo_load.clone())),
            Some("6.1".into()),
            LoadInfo::demo(&demo_load, "rxe0", "rxe1"),
        );
        let target = Target::Command(vec!["ib_send_lat".into(), "-e".into()]);
        let cmd = RunReport::new(
            &config(Load::Workload(target.clone())),
            None,
            LoadInfo::workload(&target),
        );
        let keys = |r: &RunReport| -> Vec<String> {
            let v = serde_json::to_value(r).unwrap();
            v.as_object().unwrap().keys().cloned().collect()
        };
        let documented = [
            "calibration",
            "kernel",
            "load",
            "overhead_budget_percent",
            "phases",
            "preset",
            "schema_version",
            "timeline",
            "tool",
            "waterfall_samples",
        ];
        let mut d = keys(&demo);
        d.sort();
        assert_eq!(d, documented);
        let mut c = keys(&cmd);
        c.sort();
        assert_eq!(c, documented);
        let load = serde_json::to_value(&cmd.load).unwrap();
        assert_eq!(load["kind"], "command");
        assert_eq!(load["target"]["command"][0], "ib_send_lat");
        assert_eq!(load["demo"], serde_json::Value::Null);
        let load = serde_json::to_value(&demo.load).unwrap();
        assert_eq!(load["demo"]["server_device"], "rxe0");
        assert_eq!(load["target"], serde_json::Value::Null);
    }
}

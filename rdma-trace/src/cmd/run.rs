//! `rdma-trace run`: spawn the bundled `rdma-demo` ping-pong as load, attach the probe table,
//! and report per probe — for polling mode, event mode, or both side by side. With a CMD,
//! `--pid` or `--all`, any workload instead of the demo (`run/workload.rs`).

mod workload;

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    process::Stdio,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, anyhow, bail};
use serde::Serialize;
use tokio::io::AsyncReadExt as _;

use crate::{
    bpf::ProbeData,
    cmd::{Window, write_json},
    error::Unsupported,
    kernel::{Kernel, RdmaDevice},
    overhead::{LoaderUsage, Overhead, ProgramStat},
    plan::Options,
    probes::PROBES,
    report::{ProbeReport, probe_reports, render},
    session::Session,
    softroce,
    tui::{Live, Progress, Sample, Source},
    waterfall::{self, Waterfall, WaterfallReport},
};

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

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Completion mode of the demo.
    #[arg(long, value_enum, default_value = "event", conflicts_with_all = ["command", "pid", "all"])]
    pub mode: Mode,
    /// Ping-pong iterations per mode.
    #[arg(short, long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=10_000_000), conflicts_with_all = ["command", "pid", "all"])]
    pub iterations: u32,
    /// Message size in bytes.
    #[arg(short = 'S', long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=1_048_576), conflicts_with_all = ["command", "pid", "all"])]
    pub size: u32,
    /// RDMA device of the client [default: rxe1 when rxe0 and rxe1 exist, else the first device].
    #[arg(short, long, value_name = "DEV", conflicts_with_all = ["command", "pid", "all"])]
    pub device: Option<String>,
    /// RDMA device of the server [default: rxe0 when rxe0 and rxe1 exist, else --device].
    #[arg(long, value_name = "DEV", conflicts_with_all = ["command", "pid", "all"])]
    pub server_device: Option<String>,
    /// Stop a mode's run after this many seconds even if the demo is not done.
    #[arg(long, value_name = "SECS", value_parser = crate::parse_seconds)]
    pub duration: Option<Duration>,
    /// Write the report as JSON to this file (`-`: stdout).
    #[arg(long, value_name = "PATH")]
    pub json: Option<PathBuf>,
    /// No live screen: print text histograms each interval, then the report. Also the case
    /// when stdout is not a terminal.
    #[arg(long)]
    pub no_tui: bool,
    /// Refresh interval of the live view [default: 0.25 s on the screen, 1 s as text].
    #[arg(long, value_name = "SECS", value_parser = crate::parse_seconds)]
    pub interval: Option<Duration>,
    /// Keep probes of driver paths without a device here.
    #[arg(long)]
    pub all_drivers: bool,
    /// Also attach the user-space probes (uprobe on ibv_get_cq_event: the demo's blocked time).
    /// Off by default: a uprobe traps on every call and slows event-mode round trips.
    #[arg(long)]
    pub uprobes: bool,
    /// The rdma-demo binary [default: next to rdma-trace, else on PATH].
    #[arg(long, value_name = "PATH", conflicts_with_all = ["command", "pid", "all"])]
    pub demo: Option<PathBuf>,
    /// Completion waterfall: also keep this many per-event records (JSON `waterfall_samples`).
    #[arg(long, value_name = "N", default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=1_000_000))]
    pub sample: u32,
    /// Do not trace the completion waterfall (handler → wake-up → on CPU → read, per thread).
    #[arg(long)]
    pub no_waterfall: bool,
    /// Trace these running processes (and their children) instead of running the demo; ends
    /// when they have all exited (status 1), at --duration or Ctrl-C.
    #[arg(long, value_name = "PID[,PID...]", value_delimiter = ',', conflicts_with_all = ["command", "all"],
          value_parser = clap::value_parser!(u32).range(1..))]
    pub pid: Vec<u32>,
    /// Trace the whole system instead of running the demo, until Ctrl-C or --duration.
    #[arg(long, conflicts_with = "command")]
    pub all: bool,
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
    /// with its status.
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<String>,
}

#[derive(Serialize)]
struct Report {
    kernel: Option<String>,
    server_device: String,
    client_device: String,
    iterations: u32,
    size: u32,
    phases: Vec<Phase>,
    /// Per-event waterfall records (`--sample N`), every phase.
    #[serde(skip_serializing_if = "Option::is_none")]
    waterfall_samples: Option<Vec<waterfall::SampleRecord>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    timeline: Option<crate::timeline::Summary>,
}

#[derive(Serialize)]
struct Phase {
    mode: Mode,
    window: Window,
    /// The demo's own `--json` results.
    demo: serde_json::Value,
    probes: Vec<ProbeReport>,
    /// What tracing cost during this phase.
    overhead: Overhead,
    /// Per process and thread: stages of the completion events read in this phase.
    waterfall: Option<WaterfallReport>,
}

/// Exit status: the demo's when it failed.
pub async fn run(args: &Args) -> Result<Option<i32>> {
    if let Some(target) = workload::target(args) {
        return workload::run(args, target).await;
    }
    let timeline_file = workload::timeline_file(args)?;
    check_privileges()?;
    let kernel = Kernel::live();
    // No RDMA device, but Soft-RoCE can be had: a temporary rxe device, removed on the way out.
    let _temp_rxe = if kernel.rdma_devices().is_empty() && softroce::available() {
        let t = softroce::TempRxe::create()?;
        eprintln!(
            "rdma-trace: no RDMA device: created the temporary Soft-RoCE device {} on {} (removed at exit)",
            t.name, t.netdev
        );
        Some(t)
    } else {
        None
    };
    let (server, client) = pick_devices(&kernel.rdma_devices(), args)?;
    let demo = demo_binary(args.demo.as_deref())?;
    let extra = workload::demo_extra(timeline_file.is_some());
    let mut session = Session::start_with(
        &kernel,
        PROBES,
        Options {
            all_drivers: args.all_drivers,
            uprobes: args.uprobes,
        },
        &extra,
    )?;
    let timeline = workload::start(&mut session, &extra, timeline_file, args)?;
    eprintln!(
        "rdma-trace: server {server}, client {client}; probes:\n{}",
        session.attach_table()
    );
    let mut wf = waterfall::start_or_explain(args.no_waterfall, args.sample as usize);

    let modes: &[Mode] = match args.mode {
        Mode::Both => &[Mode::Poll, Mode::Event],
        Mode::Poll => &[Mode::Poll],
        Mode::Event => &[Mode::Event],
    };
    let mut phases = Vec::new();
    let mut failure = None;
    let json_on_stdout = args.json.as_deref() == Some(Path::new("-"));
    let mut live = Live::new(
        "rdma-trace run",
        !args.no_tui,
        args.interval,
        json_on_stdout,
    );
    // On the screen the reports wait until it is closed.
    let mut deferred = String::new();
    let mut quit = false;
    for &mode in modes {
        let wf_before = wf.as_ref().map(Waterfall::snapshot).transpose()?;
        let mut src = RunSource::new(
            &session,
            format!("{mode:?} mode, {server} ↔ {client}"),
            args.iterations,
            wf.as_ref().zip(wf_before.clone()),
        )?;
        let (window, demo_json, demo_out) =
            run_demo(&demo, mode, &server, &client, args, &mut live, &mut src).await?;
        let after = session.snapshot()?;
        let data = delta(&after, &src.phase_before);
        let probes = probe_reports(&session, &data, window.seconds);
        let overhead = src.overhead()?;
        let wf_report = match (&wf, &wf_before) {
            (Some(w), Some(b)) => Some(WaterfallReport::from_snapshot(&w.snapshot()?.since(b))),
            _ => None,
        };
        let text = format!(
            "===== mode {mode:?}: {} iterations of {} B, {server} ↔ {client} =====\n{}\n{}{}\n--- rdma-demo ---\n{}\n",
            args.iterations,
            args.size,
            render(&probes),
            wf_report
                .as_ref()
                .map(|r| format!("{}\n", waterfall::model::render_report(r)))
                .unwrap_or_default(),
            overhead.render(),
            demo_out.stdout.trim_end()
        );
        if live.is_screen() {
            deferred.push_str(&text);
        } else {
            print!("{text}");
        }
        let status = window.command_status;
        phases.push(Phase {
            mode,
            window: window.clone(),
            demo: demo_json,
            probes,
            overhead,
            waterfall: wf_report,
        });
        if window.ended_by == "quit" {
            quit = true;
            break;
        }
        if window.interrupted() {
            eprintln!(
                "rdma-trace: {} before the demo finished; probes detached",
                window.ended_by
            );
            failure = Some(130);
            break;
        }
        if status != Some(0) {
            eprintln!(
                "rdma-trace: rdma-demo ({mode:?}) failed with status {}: {}",
                status.map_or("none".into(), |s| s.to_string()),
                demo_out.stderr.trim()
            );
            failure = status.or(Some(1));
            break;
        }
    }
    let interrupted = if failure.is_none() && !quit {
        live.linger("run finished").await?
    } else {
        false
    };
    live.close();
    print!("{deferred}");
    if interrupted {
        failure = Some(130);
    }
    let timeline = workload::finish_timeline(&mut session, timeline, args)?;
    drop(session); // detach every probe before the summary
    let waterfall_samples = wf.as_mut().map(|w| waterfall::records(w.samples()));
    drop(wf);
    if phases.len() == 2 {
        println!("\n{}", compare(&phases[0], &phases[1]));
    }
    if let Some(path) = &args.json {
        let report = Report {
            kernel: kernel.release(),
            server_device: server,
            client_device: client,
            iterations: args.iterations,
            size: args.size,
            phases,
            waterfall_samples: (args.sample > 0).then_some(waterfall_samples).flatten(),
            timeline,
        };
        write_json(path, &report)?;
    }
    Ok(failure)
}

/// Root, or the capabilities eBPF tracing needs (CAP_BPF + CAP_PERFMON, or CAP_SYS_ADMIN).
fn check_privileges() -> Result<()> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0);
    let has = |cap: u32| eff & (1u64 << cap) != 0;
    const CAP_SYS_ADMIN: u32 = 21;
    const CAP_PERFMON: u32 = 38;
    const CAP_BPF: u32 = 39;
    if has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON)) {
        Ok(())
    } else {
        Err(anyhow!(Unsupported(
            "rdma-trace run needs root (or CAP_BPF and CAP_PERFMON): run it with sudo".to_owned()
        )))
    }
}

/// (server, client) devices.
fn pick_devices(devices: &[RdmaDevice], args: &Args) -> Result<(String, String)> {
    if devices.is_empty() {
        let rxe = Path::new("/sys/module/rdma_rxe").exists();
        return Err(anyhow!(Unsupported(format!(
            "no RDMA device on this machine (/sys/class/infiniband is empty{}); create a Soft-RoCE \
             device (rdma link add rxe0 type rxe netdev <ifname>), or run everything in the guest: cargo xtask run",
            if rxe { "" } else { ", rdma_rxe is not loaded" }
        ))));
    }
    let names: Vec<&str> = devices.iter().map(|d| d.name.as_str()).collect();
    let check = |d: &str| -> Result<String> {
        if names.contains(&d) {
            Ok(d.to_owned())
        } else {
            Err(anyhow!(Unsupported(format!(
                "unknown RDMA device {d:?} (available: {})",
                names.join(", ")
            ))))
        }
    };
    let pair = names.contains(&"rxe0") && names.contains(&"rxe1");
    let client = match &args.device {
        Some(d) => check(d)?,
        None if pair => "rxe1".to_owned(),
        None => names[0].to_owned(),
    };
    let server = match &args.server_device {
        Some(d) => check(d)?,
        None if pair && args.device.is_none() => "rxe0".to_owned(),
        None => client.clone(),
    };
    Ok((server, client))
}

pub(crate) fn demo_binary(given: Option<&Path>) -> Result<PathBuf> {
    if let Some(p) = given {
        if p.is_file() {
            return Ok(p.to_path_buf());
        }
        bail!("--demo {}: no such file", p.display());
    }
    let beside = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(|d| d.join("rdma-demo")));
    if let Some(p) = beside.filter(|p| p.is_file()) {
        return Ok(p);
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|d| d.join("rdma-demo"))
        .find(|p| p.is_file())
        .context("rdma-demo not found next to rdma-trace nor on PATH: build it (cargo build) or pass --demo PATH")
}

struct DemoOutput {
    stdout: String,
    stderr: String,
}

async fn run_demo(
    demo: &Path,
    mode: Mode,
    server: &str,
    client: &str,
    args: &Args,
    live: &mut Live,
    src: &mut RunSource<'_>,
) -> Result<(Window, serde_json::Value, DemoOutput)> {
    let json = std::env::temp_dir().join(format!(
        "rdma-trace-demo-{}-{mode:?}.json",
        std::process::id()
    ));
    let mode_arg = if mode == Mode::Event { "event" } else { "poll" };
    let mut child = tokio::process::Command::new(demo)
        .args([
            "pingpong",
            "--loopback",
            "--port",
            "0",
            "-d",
            client,
            "--server-device",
            server,
        ])
        .args([
            "--mode",
            mode_arg,
            "-i",
            &args.iterations.to_string(),
            "-S",
            &args.size.to_string(),
        ])
        .arg("--json")
        .arg(&json)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("could not start {}", demo.display()))?;
    if let Some(pid) = child.id() {
        // The uprobes count the demo only.
        src.session.watch_pid(pid)?;
    }
    let mut stdout_pipe = child.stdout.take().context("demo stdout")?;
    let mut stderr_pipe = child.stderr.take().context("demo stderr")?;
    let read_out = tokio::spawn(async move {
        let mut s = String::new();
        let _ = stdout_pipe.read_to_string(&mut s).await;
        s
    });
    let read_err = tokio::spawn(async move {
        let mut s = String::new();
        let _ = stderr_pipe.read_to_string(&mut s).await;
        s
    });
    let window = live.watch(src, args.duration, Some(&mut child)).await?;
    let out = DemoOutput {
        stdout: read_out.await.unwrap_or_default(),
        stderr: read_err.await.unwrap_or_default(),
    };
    let value = std::fs::read(&json)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or(serde_json::Value::Null);
    let _ = std::fs::remove_file(&json);
    Ok((window, value, out))
}

/// Feeds the live view during one mode's run.
struct RunSource<'a> {
    session: &'a Session,
    label: String,
    iterations: u32,
    /// At the start of the phase (the report and the progress count from here).
    phase_before: HashMap<u32, ProbeData>,
    stats_before: Vec<ProgramStat>,
    usage_before: LoaderUsage,
    /// Where the live view counts from (moved by `r`).
    baseline: HashMap<u32, ProbeData>,
    baseline_at: Instant,
    view_stats: Vec<ProgramStat>,
    view_usage: LoaderUsage,
    /// The waterfall and the live view's baseline of it.
    wf: Option<(&'a Waterfall, waterfall::Snapshot)>,
}

impl<'a> RunSource<'a> {
    fn new(
        session: &'a Session,
        label: String,
        iterations: u32,
        wf: Option<(&'a Waterfall, waterfall::Snapshot)>,
    ) -> Result<Self> {
        let before = session.snapshot()?;
        let (mut stats, _) = session.program_stats();
        if let Some((w, _)) = &wf {
            stats.extend(w.program_stats());
        }
        let usage = LoaderUsage::now();
        Ok(Self {
            session,
            label,
            iterations,
            baseline: before.clone(),
            phase_before: before,
            view_stats: stats.clone(),
            stats_before: stats,
            usage_before: usage,
            view_usage: usage,
            baseline_at: Instant::now(),
            wf,
        })
    }

    /// Run-time statistics of every program: the probe table's and the waterfall's.
    fn stats(&self) -> (Vec<ProgramStat>, &str) {
        let (mut stats, how) = self.session.program_stats();
        if let Some((w, _)) = &self.wf {
            stats.extend(w.program_stats());
        }
        (stats, how)
    }

    /// The phase's overhead so far.
    fn overhead(&self) -> Result<Overhead> {
        let (now, how) = self.stats();
        Ok(Overhead::between(
            how,
            &self.stats_before,
            &now,
            self.usage_before,
            LoaderUsage::now(),
        ))
    }
}

/// rxe posts 4 completions per ping-pong iteration (send and receive, on both sides).
const CQES_PER_ITERATION: u64 = 4;

impl Source for RunSource<'_> {
    fn sample(&mut self, elapsed: Duration) -> Result<Sample> {
        let now = self.session.snapshot()?;
        let data = delta(&now, &self.baseline);
        let probes = probe_reports(
            self.session,
            &data,
            self.baseline_at.elapsed().as_secs_f64(),
        );
        let phase = delta(&now, &self.phase_before);
        let cq_posts = probes
            .iter()
            .position(|p| p.name == "rxe_cq_post" && p.skipped.is_none())
            .and_then(|i| phase.get(&self.session.plan.probes[i].id))
            .map(|d| d.counters[rdma_trace_common::C_EVENTS as usize]);
        let (stats, how) = self.stats();
        let overhead = Overhead::between(
            how,
            &self.view_stats,
            &stats,
            self.view_usage,
            LoaderUsage::now(),
        );
        Ok(Sample {
            probes,
            overhead: Some(overhead),
            progress: Progress {
                label: self.label.clone(),
                elapsed,
                done: cq_posts.map(|c| (c / CQES_PER_ITERATION).min(u64::from(self.iterations))),
                total: Some(u64::from(self.iterations)),
                done_from: cq_posts.map(|_| "rxe_cq_post / 4"),
            },
            waterfall: self.wf.as_ref().map(|(w, b)| w.view(b)).transpose()?,
        })
    }

    fn reset(&mut self) -> Result<()> {
        self.baseline = self.session.snapshot()?;
        self.baseline_at = Instant::now();
        self.view_stats = self.stats().0;
        self.view_usage = LoaderUsage::now();
        if let Some((w, base)) = &mut self.wf {
            *base = w.snapshot()?;
        }
        Ok(())
    }
}

/// Counters and histograms added between two snapshots.
pub(crate) fn delta(
    after: &HashMap<u32, ProbeData>,
    before: &HashMap<u32, ProbeData>,
) -> HashMap<u32, ProbeData> {
    after
        .iter()
        .map(|(id, a)| {
            let b = before.get(id).cloned().unwrap_or_default();
            let mut d = ProbeData {
                counters: a.counters,
                hist: a.hist.subtract(&b.hist),
            };
            for (x, y) in d.counters.iter_mut().zip(b.counters) {
                *x = x.saturating_sub(y);
            }
            (*id, d)
        })
        .collect()
}

/// Poll and event side by side, with what the difference means.
fn compare(poll: &Phase, event: &Phase) -> String {
    let mut out = format!(
        "{:<24} {:>10} {:>10} {:>10} {:>10}\n",
        "probe", "poll n", "event n", "poll p50", "event p50"
    );
    for (p, e) in poll.probes.iter().zip(&event.probes) {
        if p.skipped.is_some() {
            continue;
        }
        let f = |r: &ProbeReport| match r.unit {
            crate::probes::Unit::Nanoseconds => r
                .summary
                .p50
                .map(crate::hist::human_ns_f)
                .unwrap_or_else(|| "-".into()),
            crate::probes::Unit::Packets => r
                .summary
                .p50
                .map(|v| format!("{v:.0}"))
                .unwrap_or_else(|| "-".into()),
        };
        out.push_str(&format!(
            "{:<24} {:>10} {:>10} {:>10} {:>10}\n",
            p.name,
            p.count,
            e.count,
            f(p),
            f(e)
        ));
    }
    out.push_str(
        "\nIn polling mode the demo spins on its CQ in user space: the provider reads completions \
         from memory shared with the device (or rxe), so no kernel function runs per completion and \
         ib_uverbs_comp_handler stays at 0. In event mode the CQ is armed: each completion makes the \
         driver call ib_uverbs_comp_handler, which queues an event and wakes the thread sleeping in \
         ibv_get_cq_event; the wake-up (scheduler latency, softirq/tasklet delivery) is added to every \
         round trip, in exchange for an idle CPU while waiting.\n",
    );
    out.push_str(&waterfall::explain_phases(
        &poll.demo,
        &event.demo,
        event.waterfall.as_ref(),
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(device: Option<&str>, server: Option<&str>) -> Args {
        Args {
            mode: Mode::Event,
            iterations: 10,
            size: 64,
            device: device.map(str::to_owned),
            server_device: server.map(str::to_owned),
            duration: None,
            json: None,
            no_tui: true,
            interval: None,
            all_drivers: false,
            uprobes: false,
            demo: None,
            sample: 0,
            no_waterfall: true,
            pid: Vec::new(),
            all: false,
            timeline: None,
            timeline_sample: 20,
            timeline_max_events: 100_000,
            command: Vec::new(),
        }
    }

    fn dev(name: &str) -> RdmaDevice {
        RdmaDevice {
            name: name.to_owned(),
            driver: None,
            parent_netdev: Some("eth0".to_owned()),
        }
    }

    #[test]
    fn rxe_pair_defaults_to_rxe0_server_rxe1_client() {
        let devs = [dev("rxe0"), dev("rxe1")];
        assert_eq!(
            pick_devices(&devs, &args(None, None)).unwrap(),
            ("rxe0".into(), "rxe1".into())
        );
        assert_eq!(
            pick_devices(&devs, &args(Some("rxe0"), None)).unwrap(),
            ("rxe0".into(), "rxe0".into())
        );
        assert_eq!(
            pick_devices(&devs, &args(Some("rxe0"), Some("rxe1"))).unwrap(),
            ("rxe1".into(), "rxe0".into())
        );
    }

    #[test]
    fn unknown_and_missing_devices_are_unsupported_with_the_list() {
        let devs = [dev("mlx5_0")];
        let e = pick_devices(&devs, &args(Some("rxe9"), None)).unwrap_err();
        assert!(e.downcast_ref::<Unsupported>().is_some());
        assert!(e.to_string().contains("available: mlx5_0"), "{e}");
        let e = pick_devices(&[], &args(None, None)).unwrap_err();
        assert!(e.to_string().contains("cargo xtask run"), "{e}");
        assert_eq!(
            pick_devices(&devs, &args(None, None)).unwrap(),
            ("mlx5_0".into(), "mlx5_0".into())
        );
    }
}

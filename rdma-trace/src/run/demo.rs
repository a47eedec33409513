//! The bundled demo as the load of `run`: spawn the `rdma-demo` ping-pong, attach the probe
//! table, and report per probe, for polling mode, event mode, or both side by side.

use std::{
    collections::HashMap,
    path::Path,
    process::Stdio,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, anyhow};

use super::{
    attach::{Attached, attach},
    config::{DemoLoad, Mode, RunConfig},
    render,
    report::{LoadInfo, Phase, RunReport, completion_mode},
};
use crate::bpf::loader::check_privileges;
use crate::{
    bpf::loader::ProbeData,
    bpf::session::Session,
    bpf::stats::ProgramStat,
    error::{DemoFailed, Unsupported},
    kernel::facts::{Kernel, RdmaDevice},
    load::softroce,
    load::workload::{Extra, Target},
    model::baseline::{Baseline, delta},
    model::budget::{self, Budget, Dropped},
    model::overhead::Added,
    model::overhead::{LoaderUsage, Overhead},
    model::report::{ProbeReport, probe_reports},
    model::sample::{Progress, Sample, Source},
    model::window::Window,
    output::write_json,
    signals::{self, Stop, Stopped},
    views::tui::Live,
    waterfall::{self, Waterfall},
};

/// `$TMPDIR/rdma-trace-XXXXXX`: where the demo writes its JSON.
const DEMO_DIR_PREFIX: &str = "rdma-trace-";

/// A failing demo is an error (`DemoFailed`, exit 11), a stop signal too (`Stopped`).
pub async fn run(args: &RunConfig, spec: &DemoLoad) -> Result<Option<i32>> {
    let timeline_file = super::timeline::open(args)?;
    check_privileges()?;
    // The object loaders (the probes', and the waterfall's) parse the kernel's BTF while the
    // kernel's facts are gathered.
    crate::bpf::loader::prepare_loaders(if args.no_waterfall { 1 } else { 2 });
    // A bad path costs nothing: checked before anything is created or attached.
    if let Some(path) = &args.json {
        crate::output::check_writable(path)?;
    }
    // The private directories of runs that were SIGKILLed.
    for dir in crate::output::PrivateDir::reclaim(DEMO_DIR_PREFIX) {
        eprintln!(
            "rdma-trace: removed {}, left by a run that is gone",
            dir.display()
        );
    }
    let kernel = Kernel::live();
    // A leftover temporary device of a run that is gone is removed. With no RDMA device, but
    // Soft-RoCE available: a temporary rxe device, removed on the way out.
    let temp_rxe = softroce::prepare(&kernel.rdma_devices())?;
    let devices = softroce::usable(kernel.rdma_devices(), temp_rxe.as_ref());
    let (server, client) = pick_devices(&devices, spec)?;
    let demo = crate::load::demo::binary(spec.binary.as_deref())?;
    crate::startup::step("checks and devices");
    let extra = demo_extra(timeline_file.is_some());
    let Attached {
        mut session,
        calibration,
        timeline,
        waterfall: wf,
    } = attach(args, &kernel, &extra, timeline_file)?;
    let calibration = Some(calibration);
    eprintln!(
        "rdma-trace: server {server}, client {client}; probes:\n{}",
        session.attach_table()
    );
    let load = LoadInfo::demo(spec, &server, &client);
    let report_text = render::Text {
        load: &load,
        kernel: kernel.release(),
        config: args,
    };
    let budget = Budget {
        percent: args.overhead_budget,
        enforce: args.enforce,
        calibration: calibration.as_ref(),
    };

    let modes: &[Mode] = match spec.mode {
        Mode::Both => &[Mode::Poll, Mode::Event],
        Mode::Poll => &[Mode::Poll],
        Mode::Event => &[Mode::Event],
    };
    let mut phases = Vec::new();
    let mut failure: Option<anyhow::Error> = None;
    let mut stopped = None;
    let mut live = args.live_view();
    // On the screen the reports wait until it is closed.
    let mut deferred = String::new();
    let mut quit = false;
    for &mode in modes {
        let wf_before = wf.as_ref().map(Waterfall::snapshot).transpose()?;
        let mut src = RunSource::new(
            &mut session,
            format!("{mode:?} mode, {server} ↔ {client}"),
            spec.iterations,
            budget,
            wf.as_ref().zip(wf_before.clone()),
        )?;
        let (window, demo_json, demo_out) = run_demo(
            &demo,
            mode,
            (&server, &client),
            spec,
            args,
            &mut live,
            &mut src,
        )
        .await?;
        let after = src.session.snapshot()?;
        let (wf_window, stalls) =
            super::report::waterfall_window(wf.as_ref().zip(wf_before.as_ref()))?;
        let data = delta(&after, src.base.phase_data());
        let probes = probe_reports(src.session, &data, window.seconds);
        let mut overhead = src.base.overhead(src.session);
        // A demo that ran to its end did all its iterations; a stopped one as many as rxe
        // completed.
        let round_trips = if window.command_status == Some(0) {
            u64::from(spec.iterations)
        } else {
            src.round_trips(&data).unwrap_or(u64::from(spec.iterations))
        };
        let rtt_us = demo_round_trip_us(&demo_json)
            .unwrap_or(window.seconds * 1e6 / round_trips.max(1) as f64);
        overhead.tracing_adds = budget.added(&overhead, round_trips, rtt_us);
        overhead.hook_hits = overhead.hook_hits(round_trips, "round trip");
        let dropped = std::mem::take(&mut src.dropped);
        drop(src);
        let (wf_report, losses) = super::report::waterfall_and_losses(
            wf_window.as_ref(),
            &overhead,
            kernel.release().as_deref(),
        );
        let status = window.command_status;
        let phase = Phase {
            mode: Some(mode),
            window: window.clone(),
            completion_mode: completion_mode(&probes).0,
            demo: Some(demo_json),
            probes,
            cqs: Vec::new(),
            rdma_cm: None,
            nvme: None,
            processes: Vec::new(),
            overhead,
            dropped,
            waterfall: wf_report,
            losses,
            stalls,
        };
        let title = format!(
            "mode {mode:?}: {} iterations of {}, {server} ↔ {client}",
            spec.iterations,
            render::size_label(spec.size)
        );
        let load_text = format!(
            "--- rdma-demo ---\n{}\n",
            if window.ended_by == "duration" {
                format!(
                    "stopped after --duration ({:.1} s), before its {} iterations were done",
                    window.seconds, spec.iterations
                )
            } else {
                demo_out.stdout.trim_end().to_owned()
            }
        );
        let text = report_text.phase(phases.is_empty(), &title, &load_text, &budget, &phase);
        if live.is_screen() {
            deferred.push_str(&text);
        } else {
            args.print(&text);
        }
        phases.push(phase);
        if window.ended_by == "quit" {
            quit = true;
            break;
        }
        if window.interrupted() {
            eprintln!(
                "rdma-trace: {} before the demo finished; probes detached",
                window.ended_by
            );
            // Ctrl-C as a key of the live view counts as SIGINT.
            stopped = Some(crate::signals::received().unwrap_or(Stop(libc::SIGINT)));
            break;
        }
        // The window's end was asked for: the demo was stopped, the mode is reported.
        if window.ended_by == "duration" {
            continue;
        }
        if status != Some(0) {
            failure = Some(anyhow!(DemoFailed(format!(
                "rdma-demo ({mode:?}) failed with status {} ({}): {}",
                status.map_or("none".into(), |s| s.to_string()),
                crate::load::demo::status_meaning(status),
                demo_out.stderr.trim()
            ))));
            break;
        }
    }
    let interrupted = if failure.is_none() && stopped.is_none() && !quit {
        live.linger("run finished").await?
    } else {
        false
    };
    live.close();
    args.print(&deferred);
    if interrupted {
        stopped = Some(crate::signals::received().unwrap_or(Stop(libc::SIGINT)));
    }
    // With a timeline: every probe detached first, so the processes' names are final.
    let names = if timeline.is_some() {
        session.bpf_mut().detach_all();
        super::timeline::traced_names(&session)?
    } else {
        HashMap::new()
    };
    let timeline = super::timeline::finish(timeline, &names, wf.as_ref(), args)?;
    if let Some(s) = &timeline {
        args.print(&format!("{}\n", super::timeline::summary_line(s)));
    }
    drop(session); // detach every probe before the summary
    let waterfall_samples = wf.as_ref().map(|w| waterfall::records(&w.samples()));
    drop(wf);
    if phases.len() == 2 {
        args.print(&format!("\n{}\n", compare(&phases[0], &phases[1])));
    }
    args.print(&report_text.next(&phases));
    if let Some(path) = &args.json {
        let mut report = RunReport::new(args, kernel.release(), load.clone());
        report.calibration = calibration;
        report.phases = phases;
        report.waterfall_samples = (args.sample > 0).then_some(waterfall_samples).flatten();
        report.timeline = timeline;
        write_json(path, &report)?;
    }
    if let Some(e) = failure {
        return Err(e);
    }
    if let Some(s) = stopped {
        return Err(Stopped(s).into());
    }
    Ok(None)
}

/// Configuration of the demo runs: with `--timeline`, rdma-trace's children (the demo) are
/// followed so that the timeline names their threads.
fn demo_extra(timeline: bool) -> Extra {
    if !timeline {
        return Extra::default();
    }
    Extra::for_target(&Target::Command(Vec::new()), true).unwrap_or(Extra {
        timeline: true,
        ..Extra::default()
    })
}

/// (server, client) devices.
fn pick_devices(devices: &[RdmaDevice], spec: &DemoLoad) -> Result<(String, String)> {
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
    let client = match &spec.device {
        Some(d) => check(d)?,
        None if pair => "rxe1".to_owned(),
        None => names[0].to_owned(),
    };
    let server = match &spec.server_device {
        Some(d) => check(d)?,
        None if pair && spec.device.is_none() => "rxe0".to_owned(),
        None => client.clone(),
    };
    Ok((server, client))
}

struct DemoOutput {
    stdout: String,
    stderr: String,
}

async fn run_demo(
    demo: &Path,
    mode: Mode,
    (server, client): (&str, &str),
    spec: &DemoLoad,
    args: &RunConfig,
    live: &mut Live,
    src: &mut RunSource<'_>,
) -> Result<(Window, serde_json::Value, DemoOutput)> {
    // Not a predictable name in the shared temp directory: a private one (0700, random name).
    let dir = crate::output::PrivateDir::new(DEMO_DIR_PREFIX)?;
    let json = dir.path().join("demo.json");
    let mode_arg = if mode == Mode::Event { "event" } else { "poll" };
    let mut cmd = tokio::process::Command::new(demo);
    // A SIGKILL of rdma-trace ends the demo too.
    signals::die_with_parent(&mut cmd, libc::SIGKILL);
    let mut child = cmd
        .args(rdma_demo::pingpong::loopback_args(client, server))
        .args([
            "--mode",
            mode_arg,
            "--iterations",
            &spec.iterations.to_string(),
            "--size",
            &spec.size.to_string(),
        ])
        .args(demo_stamps(args.sample))
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
    let output = crate::load::demo::Output::capture(&mut child)?;
    let window = live.watch(src, args.duration, Some(&mut child)).await?;
    let (stdout, stderr) = output.finish().await;
    let out = DemoOutput { stdout, stderr };
    let value = std::fs::read(&json)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or(serde_json::Value::Null);
    drop(dir);
    Ok((window, value, out))
}

/// With `--sample N`, the demo stamps its first N event reads and posts per side (its
/// reports' `stamps`): user-space truth to hold the sampled events against.
fn demo_stamps(sample: u32) -> Vec<String> {
    if sample == 0 {
        return Vec::new();
    }
    vec!["--stamps".to_owned(), sample.to_string()]
}

/// The demo's mean round trip (µs), from its `--json` results.
fn demo_round_trip_us(demo: &serde_json::Value) -> Option<f64> {
    let client = demo
        .get("reports")?
        .as_array()?
        .iter()
        .find(|r| r.get("role").and_then(|v| v.as_str()) == Some("client"))?;
    client
        .get("totals")
        .and_then(|t| t.get("avg_latency_us"))
        .and_then(serde_json::Value::as_f64)
        .filter(|v| *v > 0.0)
}

/// Round trips needed before `--enforce` judges the estimate.
const ENFORCE_AFTER_ROUND_TRIPS: u64 = 20;

/// `--enforce` raises the waterfall's `--sample-every` by this factor a step, up to
/// [`ENFORCE_SAMPLE_EVERY_MAX`] (past it, one completion in so many says little more).
const ENFORCE_SAMPLE_STEP: u32 = 4;
const ENFORCE_SAMPLE_EVERY_MAX: u32 = 64;

/// One raise of the waterfall's sampling by `--enforce`.
#[derive(Clone, Copy, Debug, PartialEq)]
struct SamplingStep {
    from: u32,
    to: u32,
    /// What it is expected to save over the window: the waterfall programs' BPF run time
    /// times the share of events no longer stamped (an upper bound: unstamped events still
    /// run the programs' early parts; the next window measures it).
    saves_ns: f64,
}

/// Whether to stamp fewer events rather than drop a program: the next sampling step (from
/// 1 in `every`), when there is one and it saves at least what the dearest of the probe
/// table's `droppable` programs costs (`theirs`: the waterfall's programs in `o`).
fn sampling_step(
    every: u32,
    o: &Overhead,
    theirs: &[String],
    droppable: &[budget::ProgramCost],
) -> Option<SamplingStep> {
    if every >= ENFORCE_SAMPLE_EVERY_MAX {
        return None;
    }
    let to = (every.max(1) * ENFORCE_SAMPLE_STEP).min(ENFORCE_SAMPLE_EVERY_MAX);
    let body: f64 = o
        .programs
        .iter()
        .filter(|p| theirs.contains(&p.counts.name))
        .map(|p| p.counts.run_ns as f64)
        .sum();
    let saves_ns = body * (1.0 - f64::from(every.max(1)) / f64::from(to));
    let dearest = droppable.iter().map(|c| c.cost_ns).fold(0.0, f64::max);
    (saves_ns > 0.0 && saves_ns >= dearest).then_some(SamplingStep {
        from: every.max(1),
        to,
        saves_ns,
    })
}

/// Feeds the live view during one mode's run.
struct RunSource<'a> {
    session: &'a mut Session,
    budget: Budget<'a>,
    /// Programs dropped by --enforce in this phase.
    dropped: Vec<Dropped>,
    /// The previous estimate's moment, round trips and program statistics.
    last: Option<(Instant, u64, Vec<ProgramStat>)>,
    /// The programs' statistics as last read, and when: read at most every [`STATS_EVERY`].
    stats: Option<(Instant, Vec<ProgramStat>, String)>,
    /// The last estimate, made when the statistics were read.
    added: Option<Added>,
    label: String,
    iterations: u32,
    /// Where the report (the phase) and the live view count from; the waterfall.
    base: Baseline<'a>,
}

impl<'a> RunSource<'a> {
    fn new(
        session: &'a mut Session,
        label: String,
        iterations: u32,
        budget: Budget<'a>,
        wf: Option<(&'a Waterfall, waterfall::Snapshot)>,
    ) -> Result<Self> {
        let base = Baseline::new(session, wf)?;
        Ok(Self {
            session,
            budget,
            dropped: Vec::new(),
            last: None,
            stats: None,
            added: None,
            label,
            iterations,
            base,
        })
    }

    /// Round trips of the phase (rxe posts 4 completions per round trip), when rxe_cq_post
    /// is attached.
    fn round_trips(&self, phase: &HashMap<u32, ProbeData>) -> Option<u64> {
        let id = self.session.plan.progress()?.id;
        self.session.attached_ids().contains(&id).then_some(())?;
        let posts = phase.get(&id)?.counters[rdma_trace_common::C_EVENTS as usize];
        Some(posts / CQES_PER_ITERATION)
    }

    /// What tracing adds per round trip, over the time since the previous refresh when it
    /// holds enough round trips (the phase's start, with the demo's set-up, would skew the
    /// round-trip time), else over the phase so far. With --enforce, while that is over the
    /// budget, the most expensive programs are dropped.
    fn estimate(
        &mut self,
        phase: &HashMap<u32, ProbeData>,
        stats: &[ProgramStat],
        how: &str,
    ) -> Option<Added> {
        let round_trips = self.round_trips(phase)?;
        let now = Instant::now();
        let (since, rt0, before) = match self.last.take() {
            Some((t, rt, st)) if round_trips.saturating_sub(rt) >= ENFORCE_AFTER_ROUND_TRIPS => {
                (t, rt, st)
            }
            last => {
                let phase_start = (self.base.phase_at(), 0, self.base.phase_stats().to_vec());
                // Keep the older mark: the next window grows until it is long enough.
                self.last = last;
                phase_start
            }
        };
        if self.last.is_none() {
            self.last = Some((now, round_trips, stats.to_vec()));
        }
        let n = round_trips.saturating_sub(rt0);
        if n == 0 {
            return None;
        }
        let u = LoaderUsage::now();
        let o = Overhead::between(how, &before, stats, u, u);
        let rtt_us = now.saturating_duration_since(since).as_secs_f64() * 1e6 / n as f64;
        let costs = budget::costs(&o.programs, self.budget.calibration);
        let added = budget::added(&costs, n, rtt_us)?;
        if self.budget.enforce && n >= ENFORCE_AFTER_ROUND_TRIPS {
            // Only the probe table's programs are dropped; the waterfall's stay (it has its
            // own switch, --no-waterfall), but it can stamp fewer events.
            let theirs: Vec<String> = self
                .base
                .waterfall()
                .iter()
                .flat_map(|w| w.program_stats(self.session.bpf()))
                .map(|p| p.name)
                .collect();
            let droppable: Vec<_> = costs
                .iter()
                .filter(|c| !theirs.contains(&c.name))
                .cloned()
                .collect();
            if added.percent > self.budget.percent
                && let Some(w) = self.base.waterfall()
                && let Some(step) = sampling_step(w.sample_every(), &o, &theirs, &droppable)
            {
                match w.set_sample_every(step.to) {
                    Ok(()) => {
                        self.dropped.push(Dropped {
                            programs: Vec::new(),
                            target: "waterfall".to_owned(),
                            lost: format!(
                                "stamps 1 in {} completion events, from 1 in {} (every one still counted)",
                                step.to, step.from
                            ),
                            percent: budget::percent_of_round_trip(&added, step.saves_ns),
                        });
                        self.restart_window(round_trips);
                        return Some(added);
                    }
                    Err(e) => eprintln!("rdma-trace: --enforce: {e:#}"),
                }
            }
            let drops = budget::plan_drops(&droppable, &added, self.budget.percent);
            if !drops.is_empty() {
                let names: Vec<String> = drops
                    .iter()
                    .flat_map(|d| d.programs.iter().cloned())
                    .collect();
                self.session.drop_programs(&names);
                self.dropped.extend(drops);
                self.restart_window(round_trips);
            }
        }
        Some(added)
    }

    /// After an --enforce step (at `round_trips`), the next estimate's window starts now.
    fn restart_window(&mut self, round_trips: u64) {
        self.stats = None;
        self.last = Some((Instant::now(), round_trips, self.base.stats(self.session).0));
    }
}

/// How often the live view reads the programs' run-time statistics: one syscall per program,
/// so at every 4 Hz refresh they would be most of the loader's syscalls; the overhead they
/// feed is a rate over seconds.
const STATS_EVERY: Duration = Duration::from_secs(1);

impl RunSource<'_> {
    /// The programs' statistics, read again when the last read is [`STATS_EVERY`] old, and
    /// whether they were read now.
    fn program_stats(&mut self) -> (Vec<ProgramStat>, String, bool) {
        match &self.stats {
            Some((at, stats, how)) if at.elapsed() < STATS_EVERY => {
                (stats.clone(), how.clone(), false)
            }
            _ => {
                let (stats, how) = self.base.stats(self.session);
                let how = how.to_owned();
                self.stats = Some((Instant::now(), stats.clone(), how.clone()));
                (stats, how, true)
            }
        }
    }
}

/// rxe posts 4 completions per ping-pong iteration (send and receive, on both sides).
const CQES_PER_ITERATION: u64 = 4;

impl Source for RunSource<'_> {
    fn sample(&mut self, elapsed: Duration) -> Result<Sample> {
        self.sample_with(elapsed, false)
    }

    fn sample_quick(&mut self, elapsed: Duration) -> Result<Sample> {
        self.sample_with(elapsed, true)
    }

    fn reset(&mut self) -> Result<()> {
        self.stats = None;
        self.added = None;
        self.base.reset(self.session)
    }
}

impl RunSource<'_> {
    /// A sample; `quick`: as in [`Baseline::sample`].
    fn sample_with(&mut self, elapsed: Duration, quick: bool) -> Result<Sample> {
        let now = self.session.snapshot()?;
        let phase = delta(&now, self.base.phase_data());
        // One read of the program statistics a second at most, for the estimate and the footer.
        let (stats, how, fresh) = self.program_stats();
        let progress = Progress {
            label: self.label.clone(),
            elapsed,
            total: Some(u64::from(self.iterations)),
            ..Progress::default()
        };
        let mut sample = self
            .base
            .sample(self.session, &now, (&stats, &how), progress, quick)?;
        // The estimate pairs the statistics with the round trips counted when they were read.
        if fresh {
            self.added = self.estimate(&phase, &stats, &how);
        }
        if let Some(o) = sample.overhead.as_mut() {
            o.tracing_adds = self.added;
        }
        let cq_posts = self
            .session
            .plan
            .progress()
            .filter(|p| self.session.attached_ids().contains(&p.id))
            .and_then(|p| phase.get(&p.id))
            .map(|d| d.counters[rdma_trace_common::C_EVENTS as usize]);
        sample.progress.done =
            cq_posts.map(|c| (c / CQES_PER_ITERATION).min(u64::from(self.iterations)));
        sample.progress.done_from = cq_posts.map(|_| "rxe_cq_post / 4");
        Ok(sample)
    }
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
            crate::kernel::probes::Unit::Nanoseconds => r
                .summary
                .p50
                .map(crate::bpf::hist::human_ns_f)
                .unwrap_or_else(|| "-".into()),
            crate::kernel::probes::Unit::Packets => r
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
    let no_results = serde_json::Value::Null;
    out.push_str(&waterfall::explain_phases(
        poll.demo.as_ref().unwrap_or(&no_results),
        event.demo.as_ref().unwrap_or(&no_results),
        event.waterfall.as_ref(),
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(device: Option<&str>, server: Option<&str>) -> DemoLoad {
        DemoLoad {
            device: device.map(str::to_owned),
            server_device: server.map(str::to_owned),
            ..crate::run::config::tests::demo()
        }
    }

    fn dev(name: &str) -> RdmaDevice {
        RdmaDevice {
            name: name.to_owned(),
            driver: None,
            parent_netdev: Some("eth0".to_owned()),
        }
    }

    /// An overhead with the waterfall's read return costing `wf_ns` of BPF time and one
    /// probe-table program whose cost (with what its mechanism adds) is `table_ns`.
    fn sampling_case(
        wf_ns: u64,
        table_ns: f64,
    ) -> (Overhead, Vec<String>, Vec<budget::ProgramCost>) {
        let prog = |name: &str, run_ns| {
            crate::model::overhead::ProgramOverhead::new(crate::bpf::stats::ProgramStat {
                name: name.into(),
                target: "t".into(),
                runs: 100,
                run_ns,
                recursion_misses: None,
                kprobe_misses: None,
            })
        };
        let o = Overhead {
            stats: String::new(),
            programs: vec![prog("wf_read_return", wf_ns), prog("kentry_3", 1)],
            bpf_cpu_percent: 0.0,
            loader_cpu_percent: 0.0,
            loader_peak_rss_kib: 0,
            tracing_adds: None,
            hook_hits: None,
        };
        let table = vec![budget::ProgramCost {
            name: "kentry_3".into(),
            target: "t".into(),
            mechanism: "kprobe",
            runs: 100,
            cost_ns: table_ns,
        }];
        (o, vec!["wf_read_return".to_owned()], table)
    }

    /// The independent truth: the step is the waterfall's BPF time times the share of events
    /// that stop being stamped (3/4 from 1 in 1 to 1 in 4), worked out by hand.
    #[test]
    fn enforce_stamps_fewer_events_while_that_saves_more_than_a_drop() {
        let (o, theirs, table) = sampling_case(80_000, 50_000.0);
        let step = sampling_step(1, &o, &theirs, &table).unwrap();
        assert_eq!((step.from, step.to), (1, 4));
        assert!((step.saves_ns - 60_000.0).abs() < 1e-6, "{step:?}");
        // From 1 in 16 the last step stops at 64 and saves 3/4 again.
        let step = sampling_step(16, &o, &theirs, &table).unwrap();
        assert_eq!((step.from, step.to), (16, 64));
        // From 1 in 32 up to 64 saves half: less than dropping the table's program.
        assert_eq!(sampling_step(32, &o, &theirs, &table), None);
        // At the ceiling, only drops are left.
        assert_eq!(sampling_step(64, &o, &theirs, &table), None);
        // A table program dearer than the step's saving is dropped first.
        let (o, theirs, table) = sampling_case(80_000, 70_000.0);
        assert_eq!(sampling_step(1, &o, &theirs, &table), None);
        // Without a table program left, any saving is a step.
        assert!(sampling_step(1, &o, &theirs, &[]).is_some());
    }

    #[test]
    fn the_demo_stamps_as_many_events_as_the_run_samples() {
        assert!(demo_stamps(0).is_empty());
        assert_eq!(demo_stamps(250), ["--stamps", "250"]);
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

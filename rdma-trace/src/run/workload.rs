//! `rdma-trace run -- CMD`, `run --pid PID[,PID...]`, `run --all`: the probe table, live view,
//! report and JSON over any workload instead of the demo, plus per-process counts and the
//! optional `--timeline`.

use std::{
    borrow::Cow,
    collections::{BTreeMap, HashMap},
    time::Duration,
};

use anyhow::{Result, bail};
use serde::Serialize;

use super::config::RunConfig;
use crate::bpf::loader::check_privileges;
use crate::{
    bpf::session::Session,
    kernel::facts::Kernel,
    kernel::plan::Options,
    kernel::probes::PROBES,
    load::workload::{self, Extra, ProcessCounts, Target},
    model::baseline::{Baseline, delta},
    model::overhead::Overhead,
    model::report::{ProbeReport, probe_reports, render},
    model::sample::{Sample, Source},
    model::window::Window,
    output::write_json,
    views::timeline,
};

#[derive(Serialize)]
struct Report {
    kernel: Option<String>,
    target: Target,
    window: Window,
    /// What the workload used: `completion events` (a CQ with a completion channel got
    /// completions) or `none`.
    completion_mode: &'static str,
    probes: Vec<ProbeReport>,
    processes: Vec<ProcessReport>,
    overhead: Overhead,
    #[serde(skip_serializing_if = "Option::is_none")]
    timeline: Option<timeline::Summary>,
    /// Completion waterfall of every thread that read completion events meanwhile.
    waterfall: Option<crate::waterfall::WaterfallReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    waterfall_samples: Option<Vec<crate::waterfall::SampleRecord>>,
}

#[derive(Serialize)]
struct ProcessReport {
    pid: u32,
    comm: String,
    /// Completion events it read (calls of ib_uverbs_comp_event_read in its context), when
    /// that function is traced.
    completion_events_read: Option<u64>,
    /// Probe events while one of its threads was current (its syscalls, and softirqs that ran on
    /// its time), by probe.
    probes: BTreeMap<Cow<'static, str>, u64>,
    /// Calls of traced kernel functions in its context, by function.
    calls: BTreeMap<Cow<'static, str>, u64>,
}

/// `--timeline` while a run lasts: the file (opened before anything is attached) and the
/// thread that drains the records.
pub struct TimelineRun {
    file: std::fs::File,
    recorder: timeline::Recorder,
}

/// Open the `--timeline` file, if any: before anything is attached, so a bad path costs nothing.
pub fn timeline_file(args: &RunConfig) -> Result<Option<std::fs::File>> {
    args.timeline
        .as_deref()
        .map(timeline::create_file)
        .transpose()
}

/// Configuration of the demo runs: with `--timeline`, rdma-trace's children (the demo) are
/// followed so that the timeline names their threads.
pub fn demo_extra(timeline: bool) -> Extra {
    if !timeline {
        return Extra::default();
    }
    Extra::for_target(&Target::Command(Vec::new()), true).unwrap_or(Extra {
        timeline: true,
        ..Extra::default()
    })
}

/// Attach the workload programs `extra` asks for and start draining the timeline records.
pub fn start(
    session: &mut Session,
    extra: &Extra,
    file: Option<std::fs::File>,
    args: &RunConfig,
) -> Result<Option<TimelineRun>> {
    workload::attach(session.bpf_mut(), extra)?;
    let Some(file) = file else {
        return Ok(None);
    };
    let cfg = timeline::Config::new(
        &session.plan,
        args.timeline_sample,
        args.timeline_max_events,
    );
    Ok(Some(TimelineRun {
        file,
        recorder: timeline::Recorder::start(session.bpf_mut(), cfg)?,
    }))
}

/// Detach everything, then write the timeline with the names of the traced processes.
pub fn finish_timeline(
    session: &mut Session,
    run: Option<TimelineRun>,
    waterfall: Option<&crate::waterfall::Waterfall>,
    args: &RunConfig,
) -> Result<Option<timeline::Summary>> {
    let (Some(run), Some(path)) = (run, &args.timeline) else {
        return Ok(None);
    };
    session.bpf_mut().detach_all();
    let names = workload::read_processes(session.bpf().ebpf())?
        .into_values()
        .map(|p| (p.pid, p.comm))
        .collect();
    let mut tl = run.recorder.finish(&names)?;
    if let Some(w) = waterfall {
        tl.add_waterfall(&w.timeline_events());
    }
    let summary = tl.write(run.file, path)?;
    println!("{}", summary_line(&summary));
    Ok(Some(summary))
}

fn summary_line(s: &timeline::Summary) -> String {
    format!(
        "timeline: {} ({} completions, {} completion events with their waterfall stages, {} slices, {} events; {} records, {} lost in the kernel, {} left out by --timeline-max-events); open it in https://ui.perfetto.dev",
        s.path,
        s.completions,
        s.waterfall_events,
        s.slices,
        s.events,
        s.records,
        s.lost,
        s.left_out
    )
}

/// How many completion events the waterfall keeps for the timeline (0 without `--timeline`).
pub fn timeline_sample(args: &RunConfig) -> usize {
    if args.timeline.is_some() {
        args.timeline_sample as usize
    } else {
        0
    }
}

/// Processes listed by `--all` (the busiest).
const ALL_LISTED: usize = 20;

/// Check what can be checked before anything is attached: the command, the pids, the
/// timeline path.
fn preflight(args: &RunConfig, target: &Target) -> Result<Option<std::fs::File>> {
    match target {
        Target::Command(cmd) => {
            workload::resolve_command(&cmd[0])?;
        }
        Target::Pids(pids) => {
            for &p in pids {
                if !workload::alive(p) {
                    bail!("--pid {p}: no such process (it does not exist or has exited)");
                }
            }
        }
        Target::All => {}
    }
    timeline_file(args)
}

pub async fn run(args: &RunConfig, target: Target) -> Result<Option<i32>> {
    let timeline_file = preflight(args, &target)?;
    check_privileges()?;
    crate::bpf::loader::prepare_loaders(if args.no_waterfall { 1 } else { 2 });
    let kernel = Kernel::live();
    let extra = Extra::for_target(&target, timeline_file.is_some())?;
    let mut session = Session::start_with(
        &kernel,
        PROBES,
        Options {
            all_drivers: args.all_drivers,
            uprobes: args.uprobes,
        },
        &extra.object_config(),
    )?;
    let recorder = start(&mut session, &extra, timeline_file, args)?;
    let mut watched = Vec::new();
    if let Target::Pids(pids) = &target {
        for &p in pids {
            watched.extend(workload::watch_running(session.bpf_mut(), p)?);
        }
    }
    let label = match &target {
        Target::Command(cmd) => cmd.join(" "),
        Target::Pids(p) => format!(
            "pid {}",
            p.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
        ),
        Target::All => "the whole system".to_owned(),
    };
    let wf = crate::waterfall::start_or_explain(
        args.no_waterfall,
        args.sample as usize,
        timeline_sample(args),
    );
    crate::startup::step("waterfall");
    crate::startup::print_if_verbose();
    let wf_before = wf.as_ref().map(|w| w.snapshot()).transpose()?;
    // Everything is attached (the waterfall's start can take seconds): only now is the window
    // open, and "tracing" says so.
    let asked = match &target {
        Target::Pids(p) => p.len(),
        _ => 0,
    };
    eprintln!(
        "rdma-trace: tracing {label}{}; probes:\n{}",
        if watched.len() > asked {
            format!(" (with {} descendants)", watched.len() - asked)
        } else {
            String::new()
        },
        session.attach_table()
    );

    let mut live = args.live_view();
    let (mut child, held) = match &target {
        Target::Command(cmd) => {
            let program = workload::resolve_command(&cmd[0])?;
            let (c, held) = workload::spawn(&program, cmd, live.is_screen())?;
            (Some(c), held)
        }
        _ => (None, None),
    };
    let (window, probes, overhead) = {
        let mut src = WorkloadSource {
            session: &session,
            label: label.clone(),
            target: target.clone(),
            base: Baseline::new(&session, wf.as_ref().zip(wf_before.clone()))?,
        };
        let window = live.watch(&mut src, args.duration, child.as_mut()).await?;
        let overhead = src.base.overhead(&session);
        let before = src.base.phase_data().clone();
        drop(src);
        let after = session.finish()?;
        let data = delta(&after, &before);
        let probes = probe_reports(&session, &data, window.seconds);
        (window, probes, overhead)
    };
    let interrupted = if window.ended_by != "quit" && !window.interrupted() {
        live.linger("run finished").await?
    } else {
        false
    };
    live.close();
    if let Some(h) = held {
        let (out, err) = h.take().await;
        print!("{out}");
        eprint!("{err}");
    }
    let processes = process_reports(&session, &target)?;
    let timeline = match (recorder, &args.timeline) {
        (Some(r), Some(path)) => {
            let mut tl = r.recorder.finish(&processes_names(&processes))?;
            if let Some(w) = &wf {
                tl.add_waterfall(&w.timeline_events());
            }
            Some(tl.write(r.file, path)?)
        }
        _ => None,
    };
    drop(session);
    let waterfall = match (&wf, &wf_before) {
        (Some(w), Some(b)) => Some(crate::waterfall::WaterfallReport::from_snapshot(
            &w.snapshot()?.since(b),
        )),
        _ => None,
    };
    let waterfall_samples = wf
        .as_ref()
        .filter(|_| args.sample > 0)
        .map(|w| crate::waterfall::records(&w.samples()));
    drop(wf);

    let comp = probes
        .iter()
        .find(|p| p.name == "ib_uverbs_comp_handler" && p.skipped.is_none())
        .map(|p| p.count);
    let completion_mode = if comp.unwrap_or(0) > 0 {
        "completion events"
    } else {
        "none"
    };
    print!(
        "===== {label}: {:.1} s, ended by {}{} =====\n{}\n{}\ncompletion mode seen: {}\n{}",
        window.seconds,
        window.ended_by,
        window
            .command_status
            .map_or(String::new(), |s| format!(" (exit status {s})")),
        render(&probes),
        overhead.render(),
        match comp {
            Some(n) if n > 0 => format!("completion events ({n} ib_uverbs_comp_handler calls)"),
            Some(_) =>
                "none (no CQ with a completion channel got a completion: polling, or no RDMA)"
                    .to_owned(),
            None => "unknown (ib_uverbs_comp_handler is not attached)".to_owned(),
        },
        render_processes(&processes, &target),
    );
    if let Some(w) = &waterfall {
        print!("\n{}", crate::waterfall::model::render_report(w));
    }
    if let Some(s) = &timeline {
        println!("{}", summary_line(s));
    }
    if let Some(path) = &args.json {
        write_json(
            path,
            &Report {
                kernel: kernel.release(),
                target: target.clone(),
                window: window.clone(),
                completion_mode,
                probes,
                processes,
                overhead,
                timeline,
                waterfall,
                waterfall_samples,
            },
        )?;
    }
    // Ctrl-C is how `--all` and `--pid` are meant to end; a CMD it cuts short.
    if (interrupted || window.interrupted()) && matches!(target, Target::Command(_)) {
        return Ok(Some(130));
    }
    if window.ended_by == "exited" {
        eprintln!(
            "rdma-trace: every traced process exited ({label}) after {:.1} s: the report covers the time they ran",
            window.seconds
        );
    }
    Ok(window.command_status)
}

fn processes_names(p: &[ProcessReport]) -> HashMap<u32, String> {
    p.iter().map(|p| (p.pid, p.comm.clone())).collect()
}

fn process_reports(session: &Session, target: &Target) -> Result<Vec<ProcessReport>> {
    let procs = workload::read_processes(session.bpf().ebpf())?;
    let mut list: Vec<ProcessCounts> = procs.into_values().collect();
    if *target == Target::All {
        list.retain(|p| p.total() > 0);
        list.sort_by_key(|p| std::cmp::Reverse(p.total()));
        list.truncate(ALL_LISTED);
    }
    let probe_name = |id: u32| {
        session
            .plan
            .probes
            .iter()
            .find(|p| p.id == id)
            .map(|p| p.def.name.clone())
    };
    let function = |slot: u32| {
        session
            .plan
            .functions
            .get(slot as usize)
            .map(|f| f.function.clone())
    };
    let read_slot = session
        .plan
        .functions
        .iter()
        .position(|f| f.function == "ib_uverbs_comp_event_read");
    Ok(list
        .into_iter()
        .map(|p| ProcessReport {
            pid: p.pid,
            comm: if p.comm.is_empty() {
                workload::proc_comm(p.pid).unwrap_or_else(|| "?".to_owned())
            } else {
                p.comm.clone()
            },
            completion_events_read: read_slot
                .map(|s| p.calls.get(&(s as u32)).copied().unwrap_or(0)),
            probes: p
                .probes
                .iter()
                .filter_map(|(&id, &n)| Some((probe_name(id)?, n)))
                .collect(),
            calls: p
                .calls
                .iter()
                .filter_map(|(&s, &n)| Some((function(s)?, n)))
                .collect(),
        })
        .collect())
}

fn render_processes(list: &[ProcessReport], target: &Target) -> String {
    let mut out = format!(
        "processes{} (counts while one of their threads was on a CPU: own syscalls, and softirqs on their time):\n",
        if *target == Target::All {
            format!(", the {ALL_LISTED} busiest")
        } else {
            String::new()
        }
    );
    out.push_str(&format!(
        "  {:>7} {:<16} {:>11}  {}\n",
        "pid", "comm", "cq events", "probe events"
    ));
    if list.is_empty() {
        out.push_str("  (none)\n");
    }
    for p in list {
        let mut counts: Vec<(&str, u64)> = p.probes.iter().map(|(k, v)| (k.as_ref(), *v)).collect();
        counts.sort_by_key(|&(_, n)| std::cmp::Reverse(n));
        let counts: Vec<String> = counts.iter().map(|(k, n)| format!("{k} {n}")).collect();
        out.push_str(&format!(
            "  {:>7} {:<16} {:>11}  {}\n",
            p.pid,
            p.comm,
            p.completion_events_read
                .map_or("-".to_owned(), |n| n.to_string()),
            if counts.is_empty() {
                "-".to_owned()
            } else {
                counts.join(", ")
            }
        ));
    }
    out
}

/// Feeds the live view while the workload runs.
struct WorkloadSource<'a> {
    session: &'a Session,
    label: String,
    target: Target,
    /// Where the report and the live view count from; the waterfall.
    base: Baseline<'a>,
}

impl Source for WorkloadSource<'_> {
    fn sample(&mut self, elapsed: Duration) -> Result<Sample> {
        self.base
            .sample_now(self.session, self.label.clone(), elapsed)
    }

    fn reset(&mut self) -> Result<()> {
        self.base.reset(self.session)
    }

    fn finished(&mut self) -> Option<&'static str> {
        match &self.target {
            Target::Pids(pids) if !pids.iter().any(|&p| workload::alive(p)) => Some("exited"),
            _ => None,
        }
    }
}

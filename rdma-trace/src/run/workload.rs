//! `rdma-trace run -- CMD`, `run --pid PID[,PID...]`, `run --all`: the probe table, live view,
//! report and JSON over any workload instead of the demo, plus per-process counts and the
//! optional `--timeline`.

use std::{collections::BTreeMap, time::Duration};

use anyhow::{Result, anyhow, bail};

use super::{
    attach::{Attached, attach},
    config::RunConfig,
    render,
    report::{LoadInfo, Phase, ProcessReport, RunReport, completion_mode},
};
use crate::bpf::loader::check_privileges;
use crate::{
    bpf::{cma, ibcq, nvme, session::Session},
    error::Usage,
    kernel::facts::Kernel,
    load::workload::{self, Extra, ProcessCounts, Target},
    model::baseline::{Baseline, delta},
    model::budget::Budget,
    model::overhead::Added,
    model::report::probe_reports,
    model::sample::{Sample, Source},
    output::write_json,
};

/// Processes listed by `--all` (the busiest).
const ALL_LISTED: usize = 20;

/// Check what can be checked before anything is attached: the command, the pids, the
/// timeline path.
fn preflight(args: &RunConfig, target: &Target) -> Result<Option<std::fs::File>> {
    if args.enforce {
        return Err(anyhow!(Usage(
            "--enforce detaches programs by the demo's round trips; with -- CMD, --pid or --all \
             the budget is reported (per completion event) but not enforced: leave --enforce out"
                .to_owned()
        )));
    }
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
    super::timeline::open(args)
}

pub async fn run(args: &RunConfig, target: Target) -> Result<Option<i32>> {
    let timeline_file = preflight(args, &target)?;
    check_privileges()?;
    crate::bpf::loader::prepare_loaders(if args.no_waterfall { 1 } else { 2 });
    let kernel = Kernel::live();
    let extra = Extra::for_target(&target, timeline_file.is_some())?;
    let Attached {
        mut session,
        calibration,
        timeline: recorder,
        waterfall: wf,
    } = attach(args, &kernel, &extra, timeline_file)?;
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

    // The window opens before the command starts: the processes' counts and the probes'
    // baseline are taken first, so that the command's first completions are in the report.
    let procs_before = workload::read_processes(session.bpf().ebpf())?;
    let cqs_before = ibcq::read(session.bpf().ebpf())?;
    let cm_before = cma::read(session.bpf().ebpf())?;
    let nvme_before = nvme::read(session.bpf().ebpf())?;
    let base = Baseline::new(&session, wf.as_ref().zip(wf_before.clone()))?;
    let mut live = args.live_view();
    let (mut child, held) = match &target {
        Target::Command(cmd) => {
            let program = workload::resolve_command(&cmd[0])?;
            let (c, held) =
                workload::spawn(&program, cmd, live.is_screen(), args.json_on_stdout())?;
            (Some(c), held)
        }
        _ => (None, None),
    };
    let (window, probes, overhead, wf_window, stalls, procs_after, cqs, rdma_cm, nvme_io) = {
        let mut src = WorkloadSource {
            session: &session,
            label: label.clone(),
            target: target.clone(),
            base,
        };
        let window = live.watch(&mut src, args.duration, child.as_mut()).await?;
        let overhead = src.base.overhead(&session);
        let before = src.base.phase_data().clone();
        drop(src);
        let after = session.finish()?;
        // The waterfall and the processes end with the probe table, before the screen lingers:
        // every count of the report covers one window.
        let (wf_window, stalls) =
            super::report::waterfall_window(wf.as_ref().zip(wf_before.as_ref()))?;
        let procs_after = workload::read_processes(session.bpf().ebpf())?;
        let cqs_after = ibcq::read(session.bpf().ebpf())?;
        let callbacks = kernel.symbols_at(&ibcq::callbacks(&cqs_after));
        let cqs = ibcq::reports(&cqs_after, &cqs_before, &callbacks);
        let rdma_cm = cma::report(&cma::read(session.bpf().ebpf())?, &cm_before);
        let nvme_io = nvme::report(&nvme::read(session.bpf().ebpf())?, &nvme_before);
        let data = delta(&after, &before);
        let probes = probe_reports(&session, &data, window.seconds);
        (
            window,
            probes,
            overhead,
            wf_window,
            stalls,
            procs_after,
            cqs,
            rdma_cm,
            nvme_io,
        )
    };
    let interrupted = if window.ended_by != "quit" && !window.interrupted() {
        live.linger("run finished").await?
    } else {
        false
    };
    live.close();
    if let Some(h) = held {
        let (out, err) = h.take().await;
        // The command's own output; with `--json -`, stdout is the JSON document's.
        args.print(&out);
        eprint!("{err}");
    }
    let processes = process_reports(&session, &target, procs_after, &procs_before);
    let timeline = super::timeline::finish(
        recorder,
        &super::timeline::traced_names(&session)?,
        wf.as_ref(),
        args,
    )?;
    drop(session);
    let (waterfall, losses) = super::report::waterfall_and_losses(
        wf_window.as_ref(),
        &overhead,
        kernel.release().as_deref(),
    );
    let waterfall_samples = wf
        .as_ref()
        .filter(|_| args.sample > 0)
        .map(|w| crate::waterfall::records(&w.samples()));
    drop(wf);

    let (completion_mode, comp) = completion_mode(&probes);
    // The budget, per completion event: a workload's round trips are not known, its
    // completion events are (each woke a waiter, or found it awake).
    let budget = Budget {
        percent: args.overhead_budget,
        enforce: false,
        calibration: Some(&calibration),
    };
    let mut overhead = overhead;
    if let Some(n) = comp.filter(|&n| n > 0) {
        overhead.hook_hits = overhead.hook_hits(n, "completion event");
        overhead.tracing_adds = budget
            .added(&overhead, n, window.seconds * 1e6 / n as f64)
            .map(|a| Added {
                per: "completion event",
                ..a
            });
    }
    let phase = Phase {
        mode: None,
        window: window.clone(),
        completion_mode,
        demo: None,
        probes,
        cqs,
        rdma_cm,
        nvme: nvme_io,
        processes,
        overhead,
        dropped: Vec::new(),
        waterfall,
        losses,
        stalls,
    };
    let load = LoadInfo::workload(&target);
    let report_text = render::Text {
        load: &load,
        kernel: kernel.release(),
        config: args,
    };
    let title = format!(
        "{label}: {:.1} s, ended by {}{}",
        window.seconds,
        window.ended_by,
        window
            .command_status
            .map_or(String::new(), |s| format!(" (exit status {s})")),
    );
    let load_text = format!(
        "completion mode seen: {}\n{}",
        match comp {
            Some(n) if n > 0 => format!("completion events ({n} ib_uverbs_comp_handler calls)"),
            Some(_) =>
                "none (no CQ with a completion channel got a completion: polling, or no RDMA)"
                    .to_owned(),
            None => "unknown (ib_uverbs_comp_handler is not attached)".to_owned(),
        },
        render_processes(&phase.processes, &target),
    ) + &render_cqs(&phase.cqs)
        + &cma::render(phase.rdma_cm.as_ref())
        + &nvme::render(phase.nvme.as_ref());
    let mut text = report_text.phase(true, &title, &load_text, &budget, &phase);
    if let Some(s) = &timeline {
        text.push_str(&format!("{}\n", super::timeline::summary_line(s)));
    }
    text.push_str(&report_text.next(std::slice::from_ref(&phase)));
    args.print(&text);
    if let Some(path) = &args.json {
        let mut report = RunReport::new(args, kernel.release(), load.clone());
        report.calibration = Some(calibration);
        report.phases.push(phase);
        report.timeline = timeline;
        report.waterfall_samples = waterfall_samples;
        write_json(path, &report)?;
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

/// The traced processes' counts over the window: since `before`, read at its start.
fn process_reports(
    session: &Session,
    target: &Target,
    procs: BTreeMap<u32, ProcessCounts>,
    before: &BTreeMap<u32, ProcessCounts>,
) -> Vec<ProcessReport> {
    let mut list: Vec<ProcessCounts> = procs
        .into_values()
        .map(|p| {
            let b = before.get(&p.pid);
            p.since(b)
        })
        .collect();
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
    list.into_iter()
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
        .collect()
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

/// The kernel consumers' CQs, one line each; nothing when none was woken or polled.
fn render_cqs(list: &[ibcq::CqReport]) -> String {
    if list.is_empty() {
        return String::new();
    }
    let mut out = String::from(
        "kernel CQs (ib_cq API: NVMe-oF, NFS over RDMA, the MAD layer; consumer = the module of a polled completion's callback; wake-up = cq_schedule → cq_process):
",
    );
    out.push_str(&format!(
        "  {:<16} {:>5} {:<12} {:<12} {:<17} {:>6} {:>9} {:>9} {:>12} {:>9} {:>11}
",
        "device",
        "cq",
        "owner",
        "consumer",
        "poll ctx",
        "vector",
        "wake-ups",
        "unmatched",
        "mean wake-up",
        "polls",
        "completions"
    ));
    for c in list {
        out.push_str(&format!(
            "  {:<16} {:>5} {:<12} {:<12} {:<17} {:>6} {:>9} {:>9} {:>12} {:>9} {:>11}
",
            c.device.as_deref().unwrap_or("?"),
            c.id.map_or("?".to_owned(), |i| i.to_string()),
            c.owner.as_deref().unwrap_or("?"),
            c.consumer.as_deref().unwrap_or("?"),
            c.poll_ctx.unwrap_or("?"),
            c.comp_vector.map_or("?".to_owned(), |v| v.to_string()),
            c.wakeups,
            c.unmatched,
            c.mean_delay_ns
                .map_or("-".to_owned(), |ns| format!("{:.1}us", ns / 1000.0)),
            c.polls,
            c.completions,
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
            .sample_now(self.session, self.label.clone(), elapsed, false)
    }

    fn sample_quick(&mut self, elapsed: Duration) -> Result<Sample> {
        self.base
            .sample_now(self.session, self.label.clone(), elapsed, true)
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

//! `--timeline` in a run: the file opened before anything is attached, the recorder that drains
//! the records while the window lasts, and the file written at the end
//! (`views::timeline` builds its content).

use std::collections::HashMap;

use anyhow::Result;

use super::config::RunConfig;
use crate::{
    bpf::session::Session,
    load::workload::{self, Extra},
    views::timeline,
};

/// `--timeline` while a run lasts: the file (opened before anything is attached) and the
/// thread that drains the records.
pub struct TimelineRun {
    file: std::fs::File,
    recorder: timeline::Recorder,
}

/// Open the `--timeline` file, if any: before anything is attached, so a bad path costs nothing.
pub fn open(args: &RunConfig) -> Result<Option<std::fs::File>> {
    args.timeline
        .as_deref()
        .map(timeline::create_file)
        .transpose()
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

/// The names of the processes the session followed, by pid (read off its maps).
pub fn traced_names(session: &Session) -> Result<HashMap<u32, String>> {
    Ok(workload::read_processes(session.bpf().ebpf())?
        .into_values()
        .map(|p| (p.pid, p.comm))
        .collect())
}

/// Write the timeline, with the processes' `names` and the waterfall's completion events.
pub fn finish(
    run: Option<TimelineRun>,
    names: &HashMap<u32, String>,
    waterfall: Option<&crate::waterfall::Waterfall>,
    args: &RunConfig,
) -> Result<Option<timeline::Summary>> {
    let (Some(run), Some(path)) = (run, &args.timeline) else {
        return Ok(None);
    };
    let mut tl = run.recorder.finish(names)?;
    if let Some(w) = waterfall {
        tl.add_waterfall(&w.timeline_events());
    }
    Ok(Some(tl.write(run.file, path)?))
}

/// The report's line about the timeline file.
pub fn summary_line(s: &timeline::Summary) -> String {
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

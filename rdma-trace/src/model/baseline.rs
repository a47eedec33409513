//! Where the counts of a live run start: the probes' data, the programs' run-time statistics
//! and the loader's usage at the start of the run (the report counts from there) and at the
//! live view's last reset (`r`; the screen counts from there). `run` (demo and workload) and
//! `irq` feed their live views and reports from one of these.

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use anyhow::Result;

use crate::{
    bpf::loader::ProbeData,
    bpf::session::Session,
    bpf::stats::ProgramStat,
    model::overhead::{LoaderUsage, Overhead},
    model::report::{ProbeReport, probe_reports},
    model::sample::{Progress, Sample},
    waterfall::{self, Waterfall},
};

/// Everything counted up to one moment.
struct Mark {
    data: HashMap<u32, ProbeData>,
    stats: Vec<ProgramStat>,
    usage: LoaderUsage,
    at: Instant,
}

/// The start of a run and of the live view, for a session and, optionally, the waterfall.
pub struct Baseline<'a> {
    /// At the start of the run.
    phase: Mark,
    /// Where the live view counts from (moved by [`Baseline::reset`]).
    view: Mark,
    /// The waterfall and the live view's baseline of it.
    wf: Option<(&'a Waterfall, waterfall::Snapshot)>,
}

impl<'a> Baseline<'a> {
    /// Both marks now. `wf`: the waterfall with its snapshot at the same moment.
    pub fn new(
        session: &Session,
        wf: Option<(&'a Waterfall, waterfall::Snapshot)>,
    ) -> Result<Self> {
        let data = session.snapshot()?;
        let (mut stats, _) = session.program_stats();
        if let Some((w, _)) = &wf {
            stats.extend(w.program_stats(session.bpf()));
        }
        let usage = LoaderUsage::now();
        let at = Instant::now();
        Ok(Self {
            phase: Mark {
                data: data.clone(),
                stats: stats.clone(),
                usage,
                at,
            },
            view: Mark {
                data,
                stats,
                usage,
                at,
            },
            wf,
        })
    }

    /// The live view counts from now.
    pub fn reset(&mut self, session: &Session) -> Result<()> {
        self.view.data = session.snapshot()?;
        self.view.at = Instant::now();
        self.view.stats = self.stats(session).0;
        self.view.usage = LoaderUsage::now();
        if let Some((w, base)) = &mut self.wf {
            *base = w.snapshot()?;
        }
        Ok(())
    }

    pub fn waterfall(&self) -> Option<&'a Waterfall> {
        self.wf.as_ref().map(|(w, _)| *w)
    }

    /// The probes' data at the start of the run.
    pub fn phase_data(&self) -> &HashMap<u32, ProbeData> {
        &self.phase.data
    }

    /// The programs' statistics at the start of the run.
    pub fn phase_stats(&self) -> &[ProgramStat] {
        &self.phase.stats
    }

    /// When the run started.
    pub fn phase_at(&self) -> Instant {
        self.phase.at
    }

    /// Run-time statistics of every program now: the session's and the waterfall's.
    pub fn stats<'s>(&self, session: &'s Session) -> (Vec<ProgramStat>, &'s str) {
        let (mut stats, how) = session.program_stats();
        if let Some(w) = self.waterfall() {
            stats.extend(w.program_stats(session.bpf()));
        }
        (stats, how)
    }

    /// What tracing cost since the start of the run.
    pub fn overhead(&self, session: &Session) -> Overhead {
        let (now, how) = self.stats(session);
        Overhead::between(
            how,
            &self.phase.stats,
            &now,
            self.phase.usage,
            LoaderUsage::now(),
        )
    }

    /// The live view's sample since its mark, as it is now (`label`: what runs).
    pub fn sample_now(
        &self,
        session: &Session,
        label: String,
        elapsed: Duration,
    ) -> Result<Sample> {
        let now = session.snapshot()?;
        let (stats, how) = self.stats(session);
        let progress = Progress {
            label,
            elapsed,
            ..Progress::default()
        };
        self.sample(session, &now, (&stats, how), progress)
    }

    /// The live view's sample since its mark, from the probes' data `now` and the programs'
    /// statistics `stats` (read once per refresh by the caller, who may use them too).
    pub fn sample(
        &self,
        session: &Session,
        now: &HashMap<u32, ProbeData>,
        (stats, how): (&[ProgramStat], &str),
        progress: Progress,
    ) -> Result<Sample> {
        let probes: Vec<ProbeReport> = probe_reports(
            session,
            &delta(now, &self.view.data),
            self.view.at.elapsed().as_secs_f64(),
        );
        Ok(Sample {
            probes,
            overhead: Some(Overhead::between(
                how,
                &self.view.stats,
                stats,
                self.view.usage,
                LoaderUsage::now(),
            )),
            progress,
            waterfall: self.wf.as_ref().map(|(w, b)| w.view(b)).transpose()?,
        })
    }
}

/// Counters and histograms added between two snapshots.
pub fn delta(
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

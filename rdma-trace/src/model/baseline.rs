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
    waterfall::{self, Waterfall, WaterfallView},
};

/// How old the waterfall of a quick sample ([`Baseline::sample`] with `quick`) may be: read
/// again about once a second (every fourth refresh at 4 Hz). Reading it (its slots' per-CPU
/// counters and histograms, the stall check's maps) is most of a refresh's syscalls, and its
/// percentiles move slowly.
pub const WATERFALL_EVERY: Duration = Duration::from_millis(900);

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
    /// The waterfall's last view.
    wf_view: Kept<WaterfallView>,
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
            wf_view: Kept::default(),
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
        self.wf_view.clear();
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

    /// The live view's sample since its mark, as it is now (`label`: what runs; `quick`: as
    /// in [`Baseline::sample`]).
    pub fn sample_now(
        &mut self,
        session: &Session,
        label: String,
        elapsed: Duration,
        quick: bool,
    ) -> Result<Sample> {
        let now = session.snapshot()?;
        let (stats, how) = self.stats(session);
        let progress = Progress {
            label,
            elapsed,
            ..Progress::default()
        };
        self.sample(session, &now, (&stats, how), progress, quick)
    }

    /// The live view's sample since its mark, from the probes' data `now` and the programs'
    /// statistics `stats` (read once per refresh by the caller, who may use them too). `quick`:
    /// the waterfall may be the last one read, when that is less than [`WATERFALL_EVERY`] old.
    pub fn sample(
        &mut self,
        session: &Session,
        now: &HashMap<u32, ProbeData>,
        (stats, how): (&[ProgramStat], &str),
        progress: Progress,
        quick: bool,
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
            waterfall: self.waterfall_view(quick)?,
        })
    }

    /// The waterfall since the view's mark: read now, or (`quick`) the last view while it is
    /// less than [`WATERFALL_EVERY`] old.
    fn waterfall_view(&mut self, quick: bool) -> Result<Option<WaterfallView>> {
        let Some((w, base)) = &self.wf else {
            return Ok(None);
        };
        let max_age = if quick {
            WATERFALL_EVERY
        } else {
            Duration::ZERO
        };
        self.wf_view
            .get(Instant::now(), max_age, || w.view(base))
            .map(Some)
    }
}

/// A value read now and then: kept while it is younger than what its reader accepts.
struct Kept<T> {
    last: Option<(Instant, T)>,
}

impl<T> Default for Kept<T> {
    fn default() -> Self {
        Self { last: None }
    }
}

impl<T: Clone> Kept<T> {
    /// The kept value if it is less than `max_age` old at `now`, else `read()` (kept from now).
    fn get(
        &mut self,
        now: Instant,
        max_age: Duration,
        read: impl FnOnce() -> Result<T>,
    ) -> Result<T> {
        if let Some((at, v)) = &self.last
            && now.saturating_duration_since(*at) < max_age
        {
            return Ok(v.clone());
        }
        let v = read()?;
        self.last = Some((now, v.clone()));
        Ok(v)
    }

    /// The next `get` reads.
    fn clear(&mut self) {
        self.last = None;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kept_value_is_read_again_once_it_is_too_old_or_cleared() {
        let mut k = Kept::default();
        let mut reads = 0;
        let t0 = Instant::now();
        let mut get = |k: &mut Kept<u32>, ms: u64, max_age: Duration| {
            k.get(t0 + Duration::from_millis(ms), max_age, || {
                reads += 1;
                Ok(reads)
            })
            .unwrap()
        };
        // A 4 Hz screen: read at 0 ms, kept at 250, 500 and 750, read again at 1000.
        assert_eq!(get(&mut k, 0, WATERFALL_EVERY), 1);
        assert_eq!(get(&mut k, 250, WATERFALL_EVERY), 1);
        assert_eq!(get(&mut k, 750, WATERFALL_EVERY), 1);
        assert_eq!(get(&mut k, 1000, WATERFALL_EVERY), 2);
        // A reader that takes no old value (the text view, the last refresh) reads each time.
        assert_eq!(get(&mut k, 1001, Duration::ZERO), 3);
        // After a reset the next one reads.
        k.clear();
        assert_eq!(get(&mut k, 1002, WATERFALL_EVERY), 4);
        assert_eq!(get(&mut k, 1003, WATERFALL_EVERY), 4);
    }
}

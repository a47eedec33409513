//! The completion events that `--timeline` keeps: the first N, and for each stage the N in which
//! that stage took longest. Memory stays bounded whatever the run length.

use std::collections::{BTreeMap, HashSet};

use rdma_trace_common::waterfall::{
    H_AWAKE, H_DRIVER, H_READ, H_RUNQ, H_TOTAL, H_WAKE, SF_WOKEN, WfSample,
};

/// One stage of one event: (histogram number as in [`super::model::STAGES`], start, end).
pub type Stage = (u32, u64, u64);

/// The stages of event `s`, which partition its T1→T4 (after T0→T1 when the driver stamped it),
/// and the whole event as `H_TOTAL` first (from T0 when there is one).
pub fn stages(s: &WfSample) -> Vec<Stage> {
    let driver = s.t0 != 0 && s.t0 <= s.t1;
    let mut v = vec![(H_TOTAL, if driver { s.t0 } else { s.t1 }, s.t4)];
    if driver {
        v.push((H_DRIVER, s.t0, s.t1));
    }
    if s.flags & SF_WOKEN != 0 {
        v.push((H_WAKE, s.t1, s.t2));
        v.push((H_RUNQ, s.t2, s.t3));
        v.push((H_READ, s.t3, s.t4));
    } else {
        v.push((H_AWAKE, s.t1, s.t4));
    }
    v
}

/// First `n` events, and per stage the `n` slowest.
#[derive(Debug)]
pub struct Selection {
    n: usize,
    seq: u64,
    first: Vec<(u64, WfSample)>,
    /// Per stage: (its duration, sequence number, event), slowest first.
    slowest: BTreeMap<u32, Vec<(u64, u64, WfSample)>>,
}

impl Selection {
    pub fn new(n: usize) -> Self {
        Self {
            n,
            seq: 0,
            first: Vec::new(),
            slowest: BTreeMap::new(),
        }
    }

    pub fn push(&mut self, s: &WfSample) {
        self.seq += 1;
        if self.first.len() < self.n {
            self.first.push((self.seq, *s));
        }
        for (h, start, end) in stages(s).into_iter().skip(1) {
            let d = end.saturating_sub(start);
            let v = self.slowest.entry(h).or_default();
            if v.len() == self.n && v.last().is_some_and(|(min, _, _)| d <= *min) {
                continue;
            }
            let at = v.partition_point(|(x, _, _)| *x >= d);
            v.insert(at, (d, self.seq, *s));
            v.truncate(self.n);
        }
    }

    /// The events kept, each once, in the order they happened.
    pub fn events(&self) -> Vec<WfSample> {
        let mut seen = HashSet::new();
        let mut out: Vec<(u64, WfSample)> = self
            .first
            .iter()
            .copied()
            .chain(self.slowest.values().flatten().map(|&(_, seq, s)| (seq, s)))
            .filter(|(seq, _)| seen.insert(*seq))
            .collect();
        out.sort_by_key(|(seq, _)| *seq);
        out.into_iter().map(|(_, s)| s).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn woken(t1: u64, wake: u64, runq: u64, read: u64) -> WfSample {
        WfSample {
            t0: t1 - 1_000,
            t1,
            t2: t1 + wake,
            t3: t1 + wake + runq,
            t4: t1 + wake + runq + read,
            tid: 7,
            tgid: 7,
            cpu_handler: 0,
            cpu_target: 1,
            cpu_on: 1,
            cpu_read: 1,
            flags: SF_WOKEN,
            class: 0,
            awake_runnable: 0,
            awake_on_cpu: 0,
            awake_unkept: 0,
        }
    }

    #[test]
    fn stages_partition_the_event() {
        let s = woken(10_000, 100, 200, 300);
        let v = stages(&s);
        assert_eq!(v[0], (H_TOTAL, 9_000, 10_600));
        let parts: u64 = v[1..].iter().map(|(_, a, b)| b - a).sum();
        assert_eq!(parts, v[0].2 - v[0].1);
        let awake = WfSample {
            t0: 0,
            flags: 0,
            ..s
        };
        assert_eq!(
            stages(&awake),
            vec![(H_TOTAL, 10_000, 10_600), (H_AWAKE, 10_000, 10_600)]
        );
    }

    #[test]
    fn keeps_the_first_and_the_slowest_per_stage_and_stays_bounded() {
        let mut sel = Selection::new(2);
        for i in 0..1_000u64 {
            // Event 500 has the slowest run-queue wait, event 700 the slowest read.
            let runq = if i == 500 { 1_000_000 } else { 100 + i };
            let read = if i == 700 { 2_000_000 } else { 50 };
            sel.push(&woken(1_000_000 + i * 10_000_000, 10, runq, read));
        }
        let kept = sel.events();
        assert!(kept.len() <= 2 + 2 * 4, "{}", kept.len());
        let t1s: Vec<u64> = kept.iter().map(|s| s.t1).collect();
        let at = |i: u64| 1_000_000 + i * 10_000_000;
        for i in [0, 1, 500, 700] {
            assert!(t1s.contains(&at(i)), "event {i} not kept: {t1s:?}");
        }
        assert!(t1s.windows(2).all(|w| w[0] < w[1]), "time order: {t1s:?}");
    }
}

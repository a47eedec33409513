//! What a run lost: every counter of data the programs could not record (failed map writes, a
//! full sample ring, missed read returns, the queue mirror's overflow), the events whose stamps
//! had to be clamped, and the program runs the kernel skipped. The report's first line names
//! each non-zero one ([`Losses::line`]), the JSON carries them all (`phases[].losses`), and
//! `export` serves them.

use std::collections::BTreeMap;

use rdma_trace_common::waterfall::{
    L_CLAMPED, L_CQ_ROW_NOT_STORED, L_MIRROR_RESYNCED, L_NO_QUEUE, L_NO_SLOT, L_READ_NOT_STORED,
    L_RETURN_MISSED, L_SAMPLES, L_SLOT_NOT_STORED, L_SLOT_REFOUND, L_WAKE_NOT_STORED, W_DROPPED,
    W_UNMATCHED, WF_CQ_ROWS, WF_QUEUE_LEN, WF_THREADS,
};
use serde::Serialize;

use crate::waterfall::model::Counts;

/// Every loss over one window (a phase's, or since start for `export`).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Losses {
    /// Events dropped from a channel's queue mirror: more than its length waited unread.
    pub queue_overflow: u64,
    /// Reads that returned an event the queue mirror did not hold.
    pub unmatched_reads: u64,
    /// Events the queue mirror held that the kernel's queue no longer did, dropped when a
    /// read found the kernel's queue empty (with no handler call running and no other read
    /// open): the mirror was out of step and is back in it.
    pub mirror_resynced: u64,
    /// Handler calls not mirrored: the queue map (one entry per channel) was full.
    pub queue_map_full: u64,
    /// Threads that found every thread slot taken: their events are in pid 0.
    pub threads_without_slot: u64,
    /// Threads whose slot entry the LRU map evicted, found again. Nothing is lost: it is in
    /// the JSON as a health count, and not in the `lost:` line or `export`'s losses.
    pub slots_refound: u64,
    /// Wake-ups not stored: those events count as already awake.
    pub wake_ups_not_stored: u64,
    /// Read entries not stored: those reads are not seen.
    pub reads_not_stored: u64,
    /// Thread → slot entries not stored (found again at the thread's next event).
    pub slot_entries_not_stored: u64,
    /// Per-event samples the ring had no room for.
    pub samples_dropped: u64,
    /// Events left out of their CQ's row: the map of (process, CQ) rows was full.
    pub cq_rows_not_stored: u64,
    /// Reads whose return the kretprobe missed (seen when the thread's next read begins).
    pub read_returns_missed: u64,
    /// Events whose T2 or T3 was out of order and clamped into [T1, T4].
    pub clamped_events: u64,
    /// Program runs the kernel skipped because a BPF program was already running on the CPU,
    /// by program (only programs with misses); null where the kernel reports none.
    pub recursion_misses: Option<BTreeMap<String, u64>>,
    /// Misses of the kprobes and kretprobes that run a program, as the kernel counts them (a
    /// kretprobe without a free instance, `maxactive`), by program (only programs with misses);
    /// null where the kernel does not report them (before Linux 6.7).
    pub kprobe_misses: Option<BTreeMap<String, u64>>,
    /// What cannot be counted here, and why.
    pub not_counted: Vec<String>,
}

/// One program's misses, where the kernel reports them: (program, runs skipped by recursion
/// protection, misses of its kprobes).
pub type ProgramMisses<'a> = (&'a str, Option<u64>, Option<u64>);

/// Per program, its non-zero `count`s; `None` when no program has the count at all.
fn by_program(
    programs: &[ProgramMisses<'_>],
    count: impl Fn(&ProgramMisses<'_>) -> Option<u64>,
) -> Option<BTreeMap<String, u64>> {
    let mut reported = false;
    let mut out = BTreeMap::new();
    for p in programs {
        if let Some(n) = count(p) {
            reported = true;
            if n > 0 {
                *out.entry(p.0.to_owned()).or_default() += n;
            }
        }
    }
    reported.then_some(out)
}

impl Losses {
    /// From the waterfall's counters over the window (every thread merged; `None` without a
    /// waterfall), the programs' recursion misses over the same window, and the kernel release
    /// (what it can count).
    pub fn new<'a>(
        waterfall: Option<&Counts>,
        programs: impl IntoIterator<Item = ProgramMisses<'a>>,
        release: Option<&str>,
    ) -> Self {
        let mut l = Losses::default();
        if let Some(c) = waterfall {
            let lost = |i: u32| c.lost[i as usize];
            l.queue_overflow = c.get(W_DROPPED);
            l.unmatched_reads = c.get(W_UNMATCHED);
            l.mirror_resynced = lost(L_MIRROR_RESYNCED);
            l.queue_map_full = lost(L_NO_QUEUE);
            l.threads_without_slot = lost(L_NO_SLOT);
            l.slots_refound = lost(L_SLOT_REFOUND);
            l.wake_ups_not_stored = lost(L_WAKE_NOT_STORED);
            l.reads_not_stored = lost(L_READ_NOT_STORED);
            l.slot_entries_not_stored = lost(L_SLOT_NOT_STORED);
            l.samples_dropped = lost(L_SAMPLES);
            l.cq_rows_not_stored = lost(L_CQ_ROW_NOT_STORED);
            l.read_returns_missed = lost(L_RETURN_MISSED);
            l.clamped_events = lost(L_CLAMPED);
        }
        let programs: Vec<ProgramMisses<'a>> = programs.into_iter().collect();
        l.recursion_misses = by_program(&programs, |p| p.1);
        l.kprobe_misses = by_program(&programs, |p| p.2);
        if l.recursion_misses.is_none() {
            l.not_counted.push(
                "program runs skipped by the kernel's recursion protection: this kernel does not report them (bpf_prog_info.recursion_misses, Linux 5.12)".to_owned(),
            );
        } else if release.is_some_and(|r| before(r, (6, 7))) {
            l.not_counted.push(
                "skipped runs of kprobe and tracepoint programs: Linux counts them from 6.7 only"
                    .to_owned(),
            );
        }
        if l.kprobe_misses.is_none() {
            l.not_counted.push(
                "kprobe and kretprobe misses as the kernel counts them: Linux reports them for perf-event probes from 6.7 only (bpf_link_info; kprobe_profile lists tracefs probes only); a missed read return is counted here when the thread reads again".to_owned(),
            );
        }
        l
    }

    /// Every count, with its key and what it means for the numbers, in report order.
    pub fn items(&self) -> Vec<(&'static str, u64, String)> {
        let mut v = vec![
            (
                "queue_overflow",
                self.queue_overflow,
                format!(
                    "events queued on a channel while its {WF_QUEUE_LEN}-deep mirror was full: not kept (their reads count as unmatched)"
                ),
            ),
            (
                "unmatched_reads",
                self.unmatched_reads,
                "reads of an event the mirror did not hold (not in the waterfall)".to_owned(),
            ),
            (
                "mirror_resynced",
                self.mirror_resynced,
                "events the queue mirror held after the kernel's queue had emptied, dropped to put it back in step (reads before were paired with older events)".to_owned(),
            ),
            (
                "queue_map_full",
                self.queue_map_full,
                "handler calls on channels beyond the queue map's room (not in the waterfall)"
                    .to_owned(),
            ),
            (
                "threads_without_slot",
                self.threads_without_slot,
                format!(
                    "threads beyond the {} thread slots (their events are mixed in pid 0)",
                    WF_THREADS - 1
                ),
            ),
            (
                "read_returns_missed",
                self.read_returns_missed,
                "read returns the kretprobe missed (their events are not in the waterfall)".to_owned(),
            ),
            (
                "clamped_events",
                self.clamped_events,
                "events with out-of-order stamps clamped into T1→T4 (their stage split is approximate)".to_owned(),
            ),
            (
                "wake_ups_not_stored",
                self.wake_ups_not_stored,
                "wake-ups not stored (those events count as already awake)".to_owned(),
            ),
            (
                "reads_not_stored",
                self.reads_not_stored,
                "read entries not stored (those reads are not in the waterfall)".to_owned(),
            ),
            (
                "slot_entries_not_stored",
                self.slot_entries_not_stored,
                "thread → slot entries not stored (found again at the next event)".to_owned(),
            ),
            (
                "samples_dropped",
                self.samples_dropped,
                "samples the ring had no room for (missing from --sample and --timeline)"
                    .to_owned(),
            ),
            (
                "cq_rows_not_stored",
                self.cq_rows_not_stored,
                format!(
                    "events beyond the {WF_CQ_ROWS} (process, CQ) rows (in their thread's waterfall, not in a CQ's row)"
                ),
            ),
        ];
        for (key, counts, what) in [
            (
                "recursion_misses",
                &self.recursion_misses,
                "program runs the kernel skipped, a BPF program already running on the CPU",
            ),
            (
                "kprobe_misses",
                &self.kprobe_misses,
                "kprobe and kretprobe misses (a kretprobe without a free instance)",
            ),
        ] {
            let list: Vec<String> = counts
                .iter()
                .flatten()
                .map(|(p, n)| format!("{p} {n}"))
                .collect();
            v.push((
                key,
                counts.iter().flatten().map(|(_, n)| n).sum(),
                format!(
                    "{what} ({}: stamps or events may be missing)",
                    list.join(", ")
                ),
            ));
        }
        v
    }

    /// `lost: N what (meaning); ...` naming each non-zero count; `None` when nothing was lost.
    pub fn line(&self) -> Option<String> {
        let parts: Vec<String> = self
            .items()
            .into_iter()
            .filter(|(_, n, _)| *n > 0)
            .map(|(_, n, what)| format!("{n} {what}"))
            .collect();
        (!parts.is_empty()).then(|| format!("lost: {}\n", parts.join("; ")))
    }
}

/// Whether kernel release `r` (`6.1.0-28-amd64`) is before `version` (major, minor); `false`
/// when it does not parse.
fn before(r: &str, version: (u32, u32)) -> bool {
    crate::kernel::plan::release_version(r).is_some_and(|v| v < version)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use rdma_trace_common::waterfall::{W_EVENTS, WF_THREADS};

    use super::*;
    use crate::waterfall::model::{Snapshot, ThreadData};

    fn slot(tid: u32, events: u64, lost: &[(u32, u64)], counters: &[(u32, u64)]) -> ThreadData {
        let mut c = Counts::default();
        c.counters[W_EVENTS as usize] = events;
        for &(i, n) in lost {
            c.lost[i as usize] = n;
        }
        for &(i, n) in counters {
            c.counters[i as usize] = n;
        }
        ThreadData {
            tid,
            tgid: tid,
            comm: format!("t{tid}"),
            counts: c,
            hists: Vec::new(),
            cpus: Default::default(),
        }
    }

    /// Real-shaped: 34 reader threads of 17 loopback demos; 31 took slots, 3 fell into the
    /// shared last slot (pid 0), which also holds the global counters (queue overflow, missed
    /// read returns); two threads had clamped events. Counters are cumulative: the report
    /// counts the window, the difference of two snapshots.
    #[test]
    fn the_window_s_losses_are_named_with_what_they_mean() {
        let shared = WF_THREADS - 1;
        let mut before = Snapshot::default();
        let mut after = Snapshot::default();
        for s in 0..31 {
            before.threads.insert(s, slot(100 + s, 10, &[], &[]));
            let clamped = if s < 2 { 3 } else { 0 };
            after
                .threads
                .insert(s, slot(100 + s, 110, &[(L_CLAMPED, clamped)], &[]));
        }
        before.threads.insert(
            shared,
            slot(0, 5, &[(L_RETURN_MISSED, 4)], &[(W_DROPPED, 1)]),
        );
        after.threads.insert(
            shared,
            slot(
                0,
                300,
                &[(L_NO_SLOT, 3), (L_RETURN_MISSED, 9)],
                &[(W_DROPPED, 21), (W_UNMATCHED, 2)],
            ),
        );
        let window = after.since(&before).merged_data().expect("threads");
        let l = Losses::new(
            Some(&window.counts),
            [
                ("wf_read_return", Some(2), Some(40)),
                ("wf_read_entry", Some(0), Some(0)),
                ("wf_sched_switch", Some(0), None),
            ],
            Some("6.12.9-amd64"),
        );
        assert_eq!(l.threads_without_slot, 3);
        assert_eq!(l.read_returns_missed, 5, "9 - 4 before the window");
        assert_eq!(l.queue_overflow, 20);
        assert_eq!(l.unmatched_reads, 2);
        assert_eq!(l.clamped_events, 6);
        assert_eq!(
            l.recursion_misses,
            Some(BTreeMap::from([("wf_read_return".to_owned(), 2)]))
        );
        let line = l.line().expect("a loss line");
        assert!(
            line.starts_with(
                "lost: 20 events queued on a channel while its 16-deep mirror was full"
            ),
            "{line}"
        );
        let missing: Vec<&str> = [
            "3 threads beyond the 31 thread slots (their events are mixed in pid 0)",
            "5 read returns the kretprobe missed",
            "6 events with out-of-order stamps clamped",
            "2 reads of an event the mirror did not hold",
            "2 program runs the kernel skipped, a BPF program already running on the CPU (wf_read_return 2",
            "40 kprobe and kretprobe misses (a kretprobe without a free instance) (wf_read_return 40",
        ]
        .into_iter()
        .filter(|part| !line.contains(part))
        .collect();
        assert!(missing.is_empty(), "{missing:?} not in {line}");
        assert!(
            !line.contains("samples"),
            "zero counts are not named: {line}"
        );
        let json = serde_json::to_value(&l).unwrap();
        assert_eq!(json["threads_without_slot"], 3);
        assert_eq!(json["recursion_misses"]["wf_read_return"], 2);
        assert_eq!(json["kprobe_misses"]["wf_read_return"], 40);
        assert_eq!(
            l.not_counted,
            Vec::<String>::new(),
            "6.12 reports both kinds of misses"
        );
    }

    #[test]
    fn nothing_lost_prints_nothing_and_old_kernels_say_what_they_cannot_count() {
        let mut quiet = Snapshot::default();
        // A slot forgotten by the LRU map and found again: nothing lost.
        quiet
            .threads
            .insert(0, slot(7, 50, &[(L_SLOT_REFOUND, 2)], &[]));
        let w = quiet.merged_data().unwrap();
        let l = Losses::new(
            Some(&w.counts),
            [("wf_read_return", Some(0), None)],
            Some("6.1.0-28-amd64"),
        );
        assert_eq!(l.slots_refound, 2, "a health count in the JSON");
        assert!(l.items().iter().all(|(_, n, _)| *n == 0));
        assert_eq!(l.line(), None);
        assert_eq!(l.kprobe_misses, None);
        let says = |l: &Losses, what: &str| l.not_counted.iter().any(|n| n.contains(what));
        assert!(says(&l, "from 6.7"), "{:?}", l.not_counted);
        assert!(
            says(&l, "kprobe and kretprobe misses"),
            "{:?}",
            l.not_counted
        );
        let old = Losses::new(None, [("kentry_0", None, None)], Some("5.10.0"));
        assert_eq!(old.recursion_misses, None);
        assert!(says(&old, "does not report"), "{:?}", old.not_counted);
        assert!(old.line().is_none());
    }

    #[test]
    fn kernel_releases_compare_by_major_and_minor() {
        assert!(before("6.1.0-28-amd64", (6, 7)));
        assert!(!before("6.12.9", (6, 7)));
        assert!(!before("6.7", (6, 7)));
        assert!(before("5.15.0", (6, 7)));
        assert!(!before("weird", (6, 7)));
    }
}

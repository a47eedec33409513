//! Waterfall data as read from the maps, differences between snapshots, and the reports
//! built from them (text and JSON).

use std::collections::BTreeMap;

use rdma_trace_common::waterfall::{
    CPU_HANDLER, CPU_READ, CPU_WAITER, CQ_SUMS, H_AWAKE, H_CLASS, H_DRIVER, H_READ, H_RUNQ,
    H_TOTAL, H_WAKE, L_CLAMPED, NR_CLASSES, NR_CPU_KINDS, W_AWAKE, W_AWAKE_ON_CPU_SUM,
    W_AWAKE_RUNNABLE_SUM, W_AWAKE_SPLIT_SHORT, W_AWAKE_UNKEPT_SUM, W_DRIVER_WOKEN_SUM, W_DROPPED,
    W_EVENTS, W_NO_DRIVER, W_NO_SWITCH, W_SUM, W_UNMATCHED, W_UNSTAMPED, W_WOKEN, WF_NHIST,
    WfCounts, WfCqRow,
};
use serde::Serialize;

use super::topology::CLASS_NAMES;
use crate::bpf::hist::{Bucket, Histogram, human_ns_f};

/// Counters of one thread, summed over CPUs: the per-CPU records of the eBPF map, added up
/// (see [`WfCounts::add`]).
pub type Counts = WfCounts;

/// One thread slot.
#[derive(Clone, Debug, PartialEq)]
pub struct ThreadData {
    /// 0 for the shared last slot (threads that found no free one).
    pub tid: u32,
    pub tgid: u32,
    pub comm: String,
    pub counts: Counts,
    /// `WF_NHIST` histograms (see `rdma_trace_common::waterfall::H_*`).
    pub hists: Vec<Histogram>,
    /// Its events per CPU of each stage.
    pub cpus: CpuEvents,
}

/// One thread's events per CPU (only CPUs with events), per kind (`CPU_*`): the handler's
/// CPU, the waiter's, the read's. The eBPF side counts them in `WF_CPU_EVENTS`, sized for the
/// machine's possible CPUs at load.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CpuEvents(pub [BTreeMap<u32, u64>; NR_CPU_KINDS as usize]);

impl CpuEvents {
    /// From one slot's part of `WF_CPU_EVENTS`: `ncpus` counts per kind, kind by kind.
    pub fn from_flat(flat: &[u64], ncpus: u32) -> CpuEvents {
        let mut out = CpuEvents::default();
        if ncpus == 0 {
            return out;
        }
        for (kind, counts) in out.0.iter_mut().zip(flat.chunks(ncpus as usize)) {
            *kind = cpus(counts);
        }
        out
    }

    fn add(&mut self, o: &CpuEvents) {
        for (a, b) in self.0.iter_mut().zip(&o.0) {
            for (cpu, n) in b {
                *a.entry(*cpu).or_default() += n;
            }
        }
    }

    /// Takes `o`'s counts from these, down to 0 at the least; CPUs left at 0 go.
    fn subtract(&mut self, o: &CpuEvents) {
        for (a, b) in self.0.iter_mut().zip(&o.0) {
            for (cpu, n) in b {
                if let Some(v) = a.get_mut(cpu) {
                    *v = v.saturating_sub(*n);
                }
            }
            a.retain(|_, v| *v != 0);
        }
    }
}

impl ThreadData {
    fn merge(&mut self, o: &ThreadData) {
        self.counts.add(&o.counts);
        self.cpus.add(&o.cpus);
        for (a, b) in self.hists.iter_mut().zip(&o.hists) {
            *a = a.add(b);
        }
    }
}

/// The completion events one process read of one CQ, summed over CPUs (see
/// [`WfCqRow::add`]): its restrack id (`WfCqRow::id`) and device name as labels.
pub type CqData = WfCqRow;

/// The per-CPU values of one (process, CQ) row, summed; the labels from the CPU that made the
/// row.
pub fn cq_from_per_cpu(values: &[WfCqRow]) -> CqData {
    let mut d = CqData {
        res_id: rdma_trace_common::waterfall::NO_ID,
        ..CqData::default()
    };
    for v in values {
        d.add(v);
    }
    d
}

/// Every thread slot with data, by slot; and every (process, CQ) row, by (tgid, CQ address).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    pub threads: BTreeMap<u32, ThreadData>,
    pub cqs: BTreeMap<(u32, u64), CqData>,
}

impl Snapshot {
    /// What was added since `before` (threads without new events are left out).
    pub fn since(&self, before: &Snapshot) -> Snapshot {
        let mut out = Snapshot::default();
        for (slot, t) in &self.threads {
            let before = before.threads.get(slot);
            // Nothing new (an exited thread's banked data, an idle reader): no copy.
            if before.is_some_and(|b| b.counts == t.counts) {
                continue;
            }
            let mut d = t.clone();
            if let Some(b) = before {
                d.counts.subtract(&b.counts);
                d.cpus.subtract(&b.cpus);
                d.hists = t
                    .hists
                    .iter()
                    .zip(&b.hists)
                    .map(|(a, b)| a.subtract(b))
                    .collect();
            }
            if !d.counts.is_zero() {
                out.threads.insert(*slot, d);
            }
        }
        for (key, c) in &self.cqs {
            let mut d = *c;
            if let Some(b) = before.cqs.get(key) {
                d.subtract(b);
            }
            if d.events > 0 {
                out.cqs.insert(*key, d);
            }
        }
        out
    }
}

impl Snapshot {
    /// Every thread's counters and histograms summed (None without any).
    pub fn merged_data(&self) -> Option<ThreadData> {
        let mut it = self.threads.values();
        let mut sum = it.next()?.clone();
        for t in it {
            sum.merge(t);
        }
        Some(sum)
    }

    /// Every thread merged into one waterfall (None without any).
    pub fn merged(&self) -> Option<Waterfall> {
        self.merged_data().map(|t| Waterfall::from_data(&t))
    }
}

/// One stage of the waterfall.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Stage {
    /// `driver`, `wake`, `runq`, `read`, `awake`, `total`.
    pub key: &'static str,
    pub name: &'static str,
    /// Time stamps it spans (`T1→T2`).
    pub span: &'static str,
    /// Events that have this stage.
    pub count: u64,
    pub sum_ns: u64,
    /// Mean over the events that have this stage.
    pub mean_ns: Option<f64>,
    /// Sum divided by every event of the waterfall: what the stage adds to the mean T1→T4.
    pub per_event_ns: Option<f64>,
    /// Share of the summed T1→T4 (the driver stage lies before T1: its share is relative too).
    pub share: Option<f64>,
    pub p50_ns: Option<f64>,
    pub p90_ns: Option<f64>,
    pub p99_ns: Option<f64>,
    /// Power-of-two rows.
    pub log2: Vec<Bucket>,
}

/// Stage keys, names and spans, by histogram number (the T1→T4 partition is wake + runq +
/// read for woken events, awake for the others).
pub const STAGES: [(u32, &str, &str, &str); 6] = [
    (H_DRIVER, "driver", "driver → handler", "T0→T1"),
    (H_WAKE, "wake", "handler → wake-up", "T1→T2"),
    (H_RUNQ, "runq", "wake-up → on CPU (run queue)", "T2→T3"),
    (H_READ, "read", "on CPU → read returns", "T3→T4"),
    (H_AWAKE, "awake", "already awake: handler → read", "T1→T4"),
    (H_TOTAL, "total", "total, measured directly", "T1→T4"),
];

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Placement {
    pub class: &'static str,
    pub count: u64,
    pub share: Option<f64>,
    /// Wake-up → on CPU of the woken events of this class.
    pub runq_p50_ns: Option<f64>,
    pub runq_p99_ns: Option<f64>,
}

/// The waterfall of one thread or process.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Waterfall {
    /// Every event read and matched to its handler call.
    pub events: u64,
    /// Of them, those stamped (all but with `--sample-every N`): the stages, histograms,
    /// placement, CPUs and means are over these; `woken` + `awake` = `stamped`.
    pub stamped: u64,
    pub woken: u64,
    pub awake: u64,
    /// Woken while still on its CPU: no switch-in after the wake-up (T3 = T2).
    pub woken_on_cpu: u64,
    pub no_driver_stamp: u64,
    pub unmatched_reads: u64,
    pub dropped: u64,
    /// Events whose T2 or T3 was out of order and clamped into [T1, T4].
    pub clamped: u64,
    /// Sum of T0→T1 over the woken events (their driver stage).
    pub driver_woken_sum_ns: u64,
    /// Of the already-awake events' summed T1→T4, the time their readers were runnable but off
    /// a CPU (woken or preempted, not yet switched in): waiting for a CPU. With
    /// `awake_on_cpu_sum_ns`, the rest is the time they were asleep on something other than
    /// the channel.
    pub awake_runnable_sum_ns: u64,
    /// Of the already-awake events' summed T1→T4, the time their readers were on a CPU.
    pub awake_on_cpu_sum_ns: u64,
    /// Of the already-awake events' summed T1→T4, the part before their readers' periods were
    /// kept (from a reader's first arm, on rxe, or else its first read): not split.
    pub awake_unkept_sum_ns: u64,
    /// Already-awake events whose reader had more runnable or on-CPU periods in T1→T4 than the
    /// eBPF side keeps: their runnable and on-CPU parts are lower bounds.
    pub awake_split_short: u64,
    /// driver, wake, runq, read, awake, total.
    pub stages: Vec<Stage>,
    /// Sum of the partition stages' per-event means (wake + runq + read + awake).
    pub stages_per_event_ns: Option<f64>,
    pub total_mean_ns: Option<f64>,
    pub placement: Vec<Placement>,
    /// Events per CPU (only CPUs with events): the handler's, the waiter's (on-CPU), the read's.
    pub handler_cpus: BTreeMap<u32, u64>,
    pub waiter_cpus: BTreeMap<u32, u64>,
    pub read_cpus: BTreeMap<u32, u64>,
}

fn cpus(a: &[u64]) -> BTreeMap<u32, u64> {
    a.iter()
        .enumerate()
        .filter(|(_, c)| **c != 0)
        .map(|(i, c)| (i as u32, *c))
        .collect()
}

fn ratio(a: f64, b: u64) -> Option<f64> {
    (b != 0).then(|| a / b as f64)
}

impl Waterfall {
    pub fn from_data(t: &ThreadData) -> Waterfall {
        let c = &t.counts;
        // The means and shares are over the stamped events.
        let stamped = c.get(W_EVENTS);
        let total_sum = c.get(W_SUM + H_TOTAL);
        let stages: Vec<Stage> = STAGES
            .iter()
            .map(|&(h, key, name, span)| {
                let hist = &t.hists[h as usize];
                let sum = c.get(W_SUM + h);
                let count = hist.count();
                Stage {
                    key,
                    name,
                    span,
                    count,
                    sum_ns: sum,
                    mean_ns: ratio(sum as f64, count),
                    per_event_ns: ratio(sum as f64, stamped),
                    share: ratio(sum as f64, total_sum),
                    p50_ns: hist.quantile(0.5),
                    p90_ns: hist.quantile(0.9),
                    p99_ns: hist.quantile(0.99),
                    log2: hist.log2_rows(),
                }
            })
            .collect();
        let partition: u64 = [H_WAKE, H_RUNQ, H_READ, H_AWAKE]
            .iter()
            .map(|&h| c.get(W_SUM + h))
            .sum();
        let placed: u64 = c.classes.iter().sum();
        let placement = (0..NR_CLASSES)
            .map(|k| {
                let h = &t.hists[(H_CLASS + k) as usize];
                Placement {
                    class: CLASS_NAMES[k as usize],
                    count: c.classes[k as usize],
                    share: ratio(c.classes[k as usize] as f64, placed),
                    runq_p50_ns: h.quantile(0.5),
                    runq_p99_ns: h.quantile(0.99),
                }
            })
            .collect();
        Waterfall {
            events: stamped + c.get(W_UNSTAMPED),
            stamped,
            woken: c.get(W_WOKEN),
            awake: c.get(W_AWAKE),
            woken_on_cpu: c.get(W_NO_SWITCH),
            no_driver_stamp: c.get(W_NO_DRIVER),
            unmatched_reads: c.get(W_UNMATCHED),
            dropped: c.get(W_DROPPED),
            clamped: c.lost[L_CLAMPED as usize],
            driver_woken_sum_ns: c.get(W_DRIVER_WOKEN_SUM),
            awake_runnable_sum_ns: c.get(W_AWAKE_RUNNABLE_SUM),
            awake_split_short: c.get(W_AWAKE_SPLIT_SHORT),
            awake_on_cpu_sum_ns: c.get(W_AWAKE_ON_CPU_SUM),
            awake_unkept_sum_ns: c.get(W_AWAKE_UNKEPT_SUM),
            stages,
            stages_per_event_ns: ratio(partition as f64, stamped),
            total_mean_ns: ratio(total_sum as f64, stamped),
            placement,
            handler_cpus: t.cpus.0[CPU_HANDLER as usize].clone(),
            waiter_cpus: t.cpus.0[CPU_WAITER as usize].clone(),
            read_cpus: t.cpus.0[CPU_READ as usize].clone(),
        }
    }

    pub fn stage(&self, key: &str) -> Option<&Stage> {
        self.stages.iter().find(|s| s.key == key)
    }

    /// Every event over the stamped ones (1 without `--sample-every`): a sum over the stamped
    /// events times this estimates the sum over all of them.
    pub fn scale(&self) -> f64 {
        if self.stamped == 0 {
            1.0
        } else {
            self.events as f64 / self.stamped as f64
        }
    }

    /// " (250 of them stamped, --sample-every: …)" when not every event was stamped.
    fn stamped_note(&self) -> String {
        if self.stamped == self.events {
            String::new()
        } else {
            format!(
                " ({} of them stamped, --sample-every: the stages below are over those)",
                self.stamped
            )
        }
    }
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ThreadReport {
    pub tid: u32,
    pub comm: String,
    #[serde(flatten)]
    pub waterfall: Waterfall,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ProcessReport {
    /// 0: threads that found no free slot (all processes mixed).
    pub pid: u32,
    pub comm: String,
    #[serde(flatten)]
    pub waterfall: Waterfall,
    pub threads: Vec<ThreadReport>,
    /// The process's events split by the CQ they came from, by device and cqn.
    pub cqs: Vec<CqReport>,
}

/// The events a process read of one CQ, and their stages' means.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct CqReport {
    /// The CQ's device (`rdma res show cq`'s `dev`), null when not known.
    pub device: Option<String>,
    /// Its restrack id (`rdma res show cq`'s `cqn`), null when not known.
    pub cq: Option<u32>,
    pub events: u64,
    pub woken: u64,
    pub awake: u64,
    pub clamped: u64,
    /// T0→T1 over the events with a driver stamp.
    pub driver_mean_ns: Option<f64>,
    /// T1→T2, T2→T3, T3→T4 over the woken events.
    pub wake_mean_ns: Option<f64>,
    pub runq_mean_ns: Option<f64>,
    pub read_mean_ns: Option<f64>,
    /// T1→T4 over the events whose reader was already awake.
    pub awake_mean_ns: Option<f64>,
    /// T1→T4 over every event.
    pub total_mean_ns: Option<f64>,
}

impl CqReport {
    pub fn from_data(c: &CqData) -> CqReport {
        let device = crate::bpf::c_string(&c.device);
        let awake = c.events - c.woken.min(c.events);
        CqReport {
            device: (!device.is_empty()).then_some(device),
            cq: c.id(),
            events: c.events,
            woken: c.woken,
            awake,
            clamped: c.clamped,
            driver_mean_ns: ratio(c.sums[0] as f64, c.driver_events),
            wake_mean_ns: ratio(c.sums[1] as f64, c.woken),
            runq_mean_ns: ratio(c.sums[2] as f64, c.woken),
            read_mean_ns: ratio(c.sums[3] as f64, c.woken),
            awake_mean_ns: ratio(c.sums[4] as f64, awake),
            total_mean_ns: ratio(c.sums[CQ_SUMS - 1] as f64, c.events),
        }
    }
}

/// What the JSON carries per phase.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct WaterfallReport {
    pub processes: Vec<ProcessReport>,
}

impl WaterfallReport {
    pub fn from_snapshot(s: &Snapshot) -> WaterfallReport {
        let mut by_pid: BTreeMap<u32, (ThreadData, Vec<&ThreadData>)> = BTreeMap::new();
        // A thread's slot shows when anything was counted in it. The shared last slot (tid 0)
        // also holds the global counters (a full queue, unmatched reads: in the losses), so it
        // shows only when threads beyond the slots read events in it.
        for t in s.threads.values().filter(|t| {
            if t.tid == 0 {
                t.counts.get(W_EVENTS) + t.counts.get(W_UNSTAMPED) > 0
            } else {
                t.counts.counters.iter().any(|&c| c > 0)
            }
        }) {
            let e = by_pid.entry(t.tgid).or_insert_with(|| {
                // The process's sum, from nothing: only its ids come from its first thread.
                let z = ThreadData {
                    tid: t.tid,
                    tgid: t.tgid,
                    comm: t.comm.clone(),
                    counts: Counts::default(),
                    hists: vec![Histogram::default(); WF_NHIST as usize],
                    cpus: CpuEvents::default(),
                };
                (z, Vec::new())
            });
            e.0.merge(t);
            // The process is named after its main thread when it has events.
            if t.tid == t.tgid {
                e.0.comm = t.comm.clone();
            }
            e.1.push(t);
        }
        // Each process's CQ rows; those of a process whose threads found no slot of their own
        // go with the shared pid 0.
        let mut cqs_of: BTreeMap<u32, Vec<CqReport>> = BTreeMap::new();
        for (&(tgid, _), c) in &s.cqs {
            let pid = if by_pid.contains_key(&tgid) { tgid } else { 0 };
            cqs_of.entry(pid).or_default().push(CqReport::from_data(c));
        }
        for rows in cqs_of.values_mut() {
            rows.sort_by(|a, b| (&a.device, a.cq).cmp(&(&b.device, b.cq)));
        }
        WaterfallReport {
            processes: by_pid
                .into_iter()
                .map(|(pid, (sum, threads))| ProcessReport {
                    cqs: cqs_of.remove(&pid).unwrap_or_default(),
                    pid,
                    comm: if pid == 0 {
                        "(threads beyond the slots)".to_owned()
                    } else {
                        sum.comm.clone()
                    },
                    waterfall: Waterfall::from_data(&sum),
                    threads: threads
                        .iter()
                        .map(|t| ThreadReport {
                            tid: t.tid,
                            comm: t.comm.clone(),
                            waterfall: Waterfall::from_data(t),
                        })
                        .collect(),
                })
                .collect(),
        }
    }
}

fn us(v: Option<f64>) -> String {
    v.map(human_ns_f).unwrap_or_else(|| "-".to_owned())
}

fn pct(v: Option<f64>) -> String {
    v.map(|v| format!("{:.1}%", v * 100.0))
        .unwrap_or_else(|| "-".to_owned())
}

/// The waterfall table and the placement table of one process or thread.
pub fn render(title: &str, w: &Waterfall) -> String {
    let mut out = format!(
        "{title}: {} events{}, {} woken in their handler ({} of them still on a CPU), {} found their waiter awake\n",
        w.events,
        w.stamped_note(),
        w.woken,
        w.woken_on_cpu,
        w.awake
    );
    out.push_str(&format!(
        "  {:<32} {:<6} {:>8} {:>9} {:>9} {:>9} {:>9} {:>7}\n",
        "stage", "span", "n", "p50", "p90", "p99", "mean", "share"
    ));
    // The stage to look at first: the largest share of the time (the total row is 100 %).
    let largest = w
        .stages
        .iter()
        .filter(|s| s.key != "total")
        .filter_map(|s| Some((s.name, s.share?)))
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(name, _)| name);
    for s in &w.stages {
        out.push_str(&format!(
            "  {:<32} {:<6} {:>8} {:>9} {:>9} {:>9} {:>9} {:>7}{}\n",
            s.name,
            s.span,
            s.count,
            us(s.p50_ns),
            us(s.p90_ns),
            us(s.p99_ns),
            us(s.mean_ns),
            pct(s.share),
            if Some(s.name) == largest {
                "  ◀ largest"
            } else {
                ""
            }
        ));
    }
    if let Some(awake) = w.stage("awake").filter(|s| s.sum_ns > 0) {
        let share = |ns: u64| pct(Some(ns as f64 / awake.sum_ns as f64));
        let (runnable, on, unkept) = (
            w.awake_runnable_sum_ns,
            w.awake_on_cpu_sum_ns,
            w.awake_unkept_sum_ns,
        );
        let asleep = awake.sum_ns.saturating_sub(runnable + on + unkept);
        let unkept = if unkept > 0 {
            format!(
                ", before the reader's first arm or read (not split) {}",
                share(unkept)
            )
        } else {
            String::new()
        };
        out.push_str(&format!(
            "  already awake, of its {}: runnable but off a CPU (woken or preempted) {}, on a CPU {}{unkept}, asleep elsewhere {}{}\n",
            human_ns_f(awake.sum_ns as f64),
            share(runnable),
            share(on),
            share(asleep),
            if w.awake_split_short > 0 {
                format!(
                    " ({} events had more switches than are kept: their runnable and on-CPU parts are lower bounds)",
                    w.awake_split_short
                )
            } else {
                String::new()
            }
        ));
    }
    if w.unmatched_reads + w.no_driver_stamp + w.dropped > 0 {
        out.push_str(&format!(
            "  not covered: {} reads of an event the mirror did not hold ({} not kept: the channel's mirror was full), {} events without a driver stamp\n",
            w.unmatched_reads, w.dropped, w.no_driver_stamp
        ));
    }
    if w.clamped > 0 {
        out.push_str(&format!(
            "  clamped: {} events had T2 or T3 out of order, clamped into T1→T4: their stage split is approximate\n",
            w.clamped
        ));
    }
    out.push_str(&format!(
        "  {:<16} {:>8} {:>7} {:>14} {:>14}\n",
        "CPU placement", "events", "share", "wake→CPU p50", "wake→CPU p99"
    ));
    for p in w.placement.iter().filter(|p| p.count > 0) {
        out.push_str(&format!(
            "  {:<16} {:>8} {:>7} {:>14} {:>14}\n",
            p.class,
            p.count,
            pct(p.share),
            us(p.runq_p50_ns),
            us(p.runq_p99_ns)
        ));
    }
    let list = |m: &BTreeMap<u32, u64>| {
        m.iter()
            .map(|(c, n)| format!("cpu{c}: {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    out.push_str(&format!(
        "  handler on {}; waiter on {}\n",
        list(&w.handler_cpus),
        list(&w.waiter_cpus)
    ));
    out
}

/// Every process of a report, then its threads.
pub fn render_report(r: &WaterfallReport) -> String {
    if r.processes.is_empty() {
        return "waterfall: no completion event was read from a completion channel\n".to_owned();
    }
    let mut out = String::new();
    for p in &r.processes {
        out.push_str(&render(
            &format!("waterfall of pid {} ({})", p.pid, p.comm),
            &p.waterfall,
        ));
        if p.threads.len() > 1 {
            for t in &p.threads {
                out.push_str(&format!(
                    "    thread {} ({}): {} events, mean T1→T4 {}\n",
                    t.tid,
                    t.comm,
                    t.waterfall.events,
                    us(t.waterfall.total_mean_ns)
                ));
            }
        }
        out.push_str(&render_cqs(&p.cqs));
    }
    out
}

/// A process's events by CQ: one line per CQ with its stages' means.
fn render_cqs(cqs: &[CqReport]) -> String {
    if cqs.is_empty() {
        return String::new();
    }
    let mut out = format!(
        "    {:<16} {:>5} {:>8} {:>8} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}\n",
        "by CQ: device",
        "cqn",
        "events",
        "woken",
        "T1→T4",
        "driver",
        "wake-up",
        "run queue",
        "read",
        "awake"
    );
    for c in cqs {
        out.push_str(&format!(
            "    {:<16} {:>5} {:>8} {:>8} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}\n",
            c.device.as_deref().unwrap_or("?"),
            c.cq.map_or("?".to_owned(), |id| id.to_string()),
            c.events,
            c.woken,
            us(c.total_mean_ns),
            us(c.driver_mean_ns),
            us(c.wake_mean_ns),
            us(c.runq_mean_ns),
            us(c.read_mean_ns),
            us(c.awake_mean_ns),
        ));
    }
    out
}

/// Completion waits on a ping-pong round trip's path: each side sleeps once, for the peer's
/// message (its receive completion). Its send completions overlap the peer's work.
pub const WAITS_PER_ROUND_TRIP: f64 = 2.0;

/// How far the stages may miss the difference they explain before the breakdown is called
/// unreliable (a quarter of it).
const RELIABLE_RESIDUAL: f64 = 0.25;

/// "event mode adds X per round trip: ..." from the demo's mean round trips and the event
/// phase's waterfall. The waits on the round trip's path are the events a side slept on (its
/// receive completions): each woken event's stages, per woken event, times the round trip's
/// [`WAITS_PER_ROUND_TRIP`]. Events that found their reader awake (mostly send completions
/// that arrive while it works) overlap other work: shown apart, not counted as added. When the
/// stages miss the difference by more than a quarter of it, or event mode is not the slower,
/// the breakdown is called unreliable instead of printing a negative remainder.
pub fn explain(
    poll_rtt_ns: f64,
    event_rtt_ns: f64,
    iterations: u64,
    r: &WaterfallReport,
) -> String {
    if iterations == 0 {
        return String::new();
    }
    let diff = event_rtt_ns - poll_rtt_ns;
    let woken: u64 = r.processes.iter().map(|p| p.waterfall.woken).sum();
    let signed = |v: f64| {
        if v < 0.0 {
            format!("-{}", human_ns_f(-v))
        } else {
            human_ns_f(v)
        }
    };
    let mut s = format!(
        "event mode adds {} per round trip ({} event − {} poll)",
        signed(diff),
        human_ns_f(event_rtt_ns),
        human_ns_f(poll_rtt_ns)
    );
    if woken == 0 {
        s.push_str(": no event woke its reader, so no stage lies on the round trip's path\n");
        return s;
    }
    let per_wait = |sum_ns: f64| sum_ns / woken as f64 * WAITS_PER_ROUND_TRIP;
    let per = |key: &str| {
        per_wait(
            r.processes
                .iter()
                .filter_map(|p| p.waterfall.stage(key))
                .map(|s| s.sum_ns as f64)
                .sum::<f64>(),
        )
    };
    let driver = per_wait(
        r.processes
            .iter()
            .map(|p| p.waterfall.driver_woken_sum_ns as f64)
            .sum::<f64>(),
    );
    let parts = [
        ("driver → handler", driver),
        ("handler → wake-up", per("wake")),
        ("run-queue wait", per("runq")),
        ("on CPU → read", per("read")),
    ];
    let attributed: f64 = parts.iter().map(|p| p.1).sum();
    let residual = diff - attributed;
    let list: Vec<String> = parts
        .iter()
        .map(|(n, v)| format!("{n} {}", human_ns_f(*v)))
        .collect();
    if diff > 0.0 && residual.abs() <= RELIABLE_RESIDUAL * diff {
        s.push_str(&format!(
            ": {}, not attributed {}",
            list.join(", "),
            signed(residual)
        ));
    } else {
        s.push_str(&format!(
            "; the two waits' stages sum to {} ({}): the breakdown is unreliable here, they {} the difference by {}",
            human_ns_f(attributed),
            list.join(", "),
            if residual < 0.0 { "exceed" } else { "fall short of" },
            human_ns_f(residual.abs())
        ));
    }
    // Over every event: with --sample-every, the stamped events' sum scaled up.
    let awake: f64 = r
        .processes
        .iter()
        .filter_map(|p| Some(p.waterfall.stage("awake")?.sum_ns as f64 * p.waterfall.scale()))
        .sum::<f64>()
        / iterations as f64;
    s.push_str(&format!(
        "\n  ({woken} woken events over {iterations} round trips: each woken event's stages × the {WAITS_PER_ROUND_TRIP} waits of a round trip; events that found their reader awake add {} per round trip of handler → read that overlaps other work)\n",
        human_ns_f(awake)
    ));
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdma_trace_common::waterfall::WF_THREADS;

    fn hist(values: &[u64]) -> Histogram {
        Histogram::of_values(values)
    }

    /// A thread with woken events (wake, runq, read) and awake ones.
    fn thread(tid: u32, tgid: u32, woken: &[(u64, u64, u64)], awake: &[u64]) -> ThreadData {
        let mut c = Counts::default();
        let mut hs = vec![Histogram::default(); WF_NHIST as usize];
        let mut vals: Vec<Vec<u64>> = vec![Vec::new(); WF_NHIST as usize];
        let mut cpus = CpuEvents::default();
        let mut on = |cpu: u32| *cpus.0[CPU_WAITER as usize].entry(cpu).or_default() += 1;
        for &(a, b, d) in woken {
            vals[H_WAKE as usize].push(a);
            vals[H_RUNQ as usize].push(b);
            vals[H_READ as usize].push(d);
            vals[H_TOTAL as usize].push(a + b + d);
            vals[(H_CLASS + 4) as usize].push(b);
            c.classes[4] += 1;
            on(1);
        }
        for &v in awake {
            vals[H_AWAKE as usize].push(v);
            vals[H_TOTAL as usize].push(v);
            c.classes[0] += 1;
            on(0);
        }
        for (h, v) in vals.iter().enumerate() {
            hs[h] = hist(v);
            if h < H_CLASS as usize {
                c.counters[(W_SUM as usize) + h] = v.iter().sum();
            }
        }
        c.counters[W_EVENTS as usize] = (woken.len() + awake.len()) as u64;
        c.counters[W_WOKEN as usize] = woken.len() as u64;
        c.counters[W_AWAKE as usize] = awake.len() as u64;
        c.counters[W_NO_DRIVER as usize] = c.counters[W_EVENTS as usize];
        ThreadData {
            tid,
            tgid,
            comm: format!("t{tid}"),
            counts: c,
            hists: hs,
            cpus,
        }
    }

    /// The independent truth: events built by hand, 4 stamped of 12 read (`--sample-every
    /// 3`). Every event is counted, the means stay those of the stamped ones, the header says
    /// so, and the poll/event note scales the awake sum up to every event.
    #[test]
    fn unstamped_events_are_counted_but_in_no_stage() {
        let mut t = thread(
            1,
            1,
            &[(1_000, 2_000, 3_000), (1_000, 2_000, 3_000)],
            &[4_000, 8_000],
        );
        let stamped_only = Waterfall::from_data(&t);
        t.counts.counters[W_UNSTAMPED as usize] = 8;
        let w = Waterfall::from_data(&t);
        assert_eq!((w.events, w.stamped), (12, 4));
        assert_eq!(w.woken + w.awake, w.stamped);
        assert_eq!(w.total_mean_ns, stamped_only.total_mean_ns);
        assert_eq!(w.total_mean_ns, Some(6_000.0));
        assert_eq!(w.stage("wake").unwrap().per_event_ns, Some(500.0));
        assert!((w.scale() - 3.0).abs() < 1e-12);
        let text = render("waterfall", &w);
        assert!(
            text.starts_with("waterfall: 12 events (4 of them stamped, --sample-every"),
            "{text}"
        );
        assert!(!render("waterfall", &stamped_only).contains("stamped"));
        // Awake: 12 µs over 2 stamped events, 36 µs over every event, over 6 round trips.
        let r = WaterfallReport::from_snapshot(&Snapshot {
            threads: [(0, t)].into_iter().collect(),
            cqs: BTreeMap::new(),
        });
        assert_eq!(r.processes[0].waterfall.events, 12);
        let note = explain(10_000.0, 20_000.0, 6, &r);
        assert!(
            note.contains("add 6.0us per round trip of handler → read"),
            "{note}"
        );
    }

    /// A slot's `WF_CPU_EVENTS` entries on a 256-CPU machine, as the eBPF side indexes them
    /// (`cpu_event_index`), through a window's difference: CPUs past the old fixed 64 count.
    #[test]
    fn cpu_events_of_a_256_cpu_machine_keep_every_cpu_through_a_window() {
        use rdma_trace_common::waterfall::cpu_event_index;
        let n = 256;
        let slot = 5;
        let flat = |counts: &[(u32, u32, u64)]| {
            let mut map = vec![0u64; (WF_THREADS * NR_CPU_KINDS * n) as usize];
            for &(kind, cpu, c) in counts {
                map[cpu_event_index(slot, kind, cpu, n) as usize] = c;
            }
            let start = cpu_event_index(slot, 0, 0, n) as usize;
            CpuEvents::from_flat(&map[start..start + (NR_CPU_KINDS * n) as usize], n)
        };
        let before = flat(&[
            (CPU_HANDLER, 3, 2),
            (CPU_WAITER, 200, 2),
            (CPU_READ, 255, 2),
        ]);
        let after = flat(&[
            (CPU_HANDLER, 3, 2),
            (CPU_HANDLER, 130, 4),
            (CPU_WAITER, 200, 6),
            (CPU_READ, 255, 6),
        ]);
        let data = |cpus: CpuEvents, events: u64| {
            let mut t = thread(9, 9, &[], &[]);
            t.counts.counters[W_EVENTS as usize] = events;
            t.cpus = cpus;
            t
        };
        let mut a = Snapshot::default();
        a.threads.insert(slot, data(before, 2));
        let mut b = Snapshot::default();
        b.threads.insert(slot, data(after, 6));
        let w = Waterfall::from_data(&b.since(&a).threads[&slot]);
        assert_eq!(
            w.handler_cpus,
            BTreeMap::from([(130, 4)]),
            "CPU 3 had none new"
        );
        assert_eq!(w.waiter_cpus, BTreeMap::from([(200, 4)]));
        assert_eq!(w.read_cpus, BTreeMap::from([(255, 4)]));
    }

    #[test]
    fn stage_means_add_up_to_the_total_and_shares_to_one() {
        let t = thread(
            7,
            7,
            &[(1_000, 5_000, 2_000), (3_000, 1_000, 4_000)],
            &[10_000],
        );
        let w = Waterfall::from_data(&t);
        assert_eq!(w.events, 3);
        let total = w.total_mean_ns.unwrap();
        assert!((total - 26_000.0 / 3.0).abs() < 1e-6);
        assert!((w.stages_per_event_ns.unwrap() - total).abs() < 1e-6);
        let shares: f64 = ["wake", "runq", "read", "awake"]
            .iter()
            .map(|k| w.stage(k).unwrap().share.unwrap())
            .sum();
        assert!((shares - 1.0).abs() < 1e-9, "{shares}");
        assert_eq!(w.stage("runq").unwrap().mean_ns, Some(3_000.0));
        let classes: u64 = w.placement.iter().map(|p| p.count).sum();
        assert_eq!(classes, w.events);
        assert_eq!(w.waiter_cpus, BTreeMap::from([(0, 1), (1, 2)]));
        let text = render("x", &w);
        assert!(text.contains("other node"), "{text}");
        assert!(text.contains("wake-up → on CPU (run queue)"), "{text}");
    }

    #[test]
    fn the_awake_stage_is_split_into_its_runnable_part_and_the_rest() {
        let mut t = thread(7, 7, &[(1_000, 5_000, 2_000)], &[10_000, 30_000]);
        t.counts.counters[W_AWAKE_RUNNABLE_SUM as usize] = 10_000;
        t.counts.counters[W_AWAKE_ON_CPU_SUM as usize] = 20_000;
        // The split line of `t`'s waterfall, checked to hold `want`.
        let says = |t: &ThreadData, want: &str| {
            let text = render("x", &Waterfall::from_data(t));
            assert!(text.contains(want), "{text}");
        };
        assert_eq!(Waterfall::from_data(&t).awake_runnable_sum_ns, 10_000);
        says(
            &t,
            "already awake, of its 40.0us: runnable but off a CPU (woken or preempted) 25.0%, on a CPU 50.0%, asleep elsewhere 25.0%\n",
        );
        t.counts.counters[W_AWAKE_SPLIT_SHORT as usize] = 1;
        says(&t, "25.0% (1 events had more switches than are kept");
        // The part before the reader's periods were kept is named, and not asleep elsewhere.
        t.counts.counters[W_AWAKE_SPLIT_SHORT as usize] = 0;
        t.counts.counters[W_AWAKE_UNKEPT_SUM as usize] = 8_000;
        assert_eq!(Waterfall::from_data(&t).awake_unkept_sum_ns, 8_000);
        says(
            &t,
            "on a CPU 50.0%, before the reader's first arm or read (not split) 20.0%, asleep elsewhere 5.0%\n",
        );
        // No awake events, no split line.
        let text = render("x", &Waterfall::from_data(&thread(7, 7, &[(1, 2, 3)], &[])));
        assert!(!text.contains("already awake, of its"), "{text}");
    }

    #[test]
    fn processes_group_their_threads_and_deltas_drop_idle_threads() {
        let before = Snapshot {
            cqs: Default::default(),
            threads: BTreeMap::from([
                (0, thread(10, 10, &[(1, 2, 3)], &[])),
                (1, thread(11, 10, &[], &[5])),
            ]),
        };
        let after = Snapshot {
            cqs: Default::default(),
            threads: BTreeMap::from([
                (0, thread(10, 10, &[(1, 2, 3), (4, 5, 6)], &[])),
                (1, thread(11, 10, &[], &[5])),
                (2, thread(20, 20, &[], &[7, 8])),
            ]),
        };
        let d = after.since(&before);
        assert_eq!(d.threads.len(), 2, "thread 11 had nothing new");
        assert_eq!(d.threads[&0].counts.get(W_EVENTS), 1);
        let r = WaterfallReport::from_snapshot(&after);
        assert_eq!(r.processes.len(), 2);
        assert_eq!(r.processes[0].pid, 10);
        assert_eq!(r.processes[0].waterfall.events, 3);
        assert_eq!(r.processes[0].threads.len(), 2);
        assert_eq!(
            r.processes[0].waterfall.waiter_cpus,
            BTreeMap::from([(0, 1), (1, 2)]),
            "the process's CPUs are its threads', each thread counted once"
        );
        assert_eq!(r.processes[0].comm, "t10");
        assert_eq!(r.processes[1].waterfall.awake, 2);
        let text = render_report(&r);
        assert!(text.contains("waterfall of pid 20"), "{text}");
        assert!(text.contains("thread 11 (t11): 1 events"), "{text}");
    }

    /// A (process, CQ) row from `events` woken events of (wake, runq, read) each and `awake`
    /// already-awake events of T1→T4 `a` each.
    fn cq(res_id: u32, device: &str, woken: (u64, u64, u64, u64), awake: (u64, u64)) -> CqData {
        let (n, w, q, r) = woken;
        let (m, a) = awake;
        let mut d = CqData {
            res_id,
            labelled: 1,
            events: n + m,
            woken: n,
            sums: [0, n * w, n * q, n * r, m * a, n * (w + q + r) + m * a],
            ..CqData::default()
        };
        d.device[..device.len()].copy_from_slice(device.as_bytes());
        d
    }

    /// A process's events split by CQ, each with its own means; a window's rows are the
    /// differences, and a row without new events drops out.
    #[test]
    fn each_cq_of_a_process_has_its_row_over_the_window() {
        let before = Snapshot {
            threads: BTreeMap::from([(0, thread(10, 10, &[(1, 2, 3)], &[]))]),
            cqs: BTreeMap::from([
                ((10, 0xa0), cq(3, "rxe1", (1, 1_000, 2_000, 3_000), (0, 0))),
                ((10, 0xb0), cq(4, "rxe1", (0, 0, 0, 0), (2, 500))),
            ]),
        };
        let after = Snapshot {
            threads: BTreeMap::from([(0, thread(10, 10, &[(1, 2, 3); 4], &[]))]),
            cqs: BTreeMap::from([
                ((10, 0xa0), cq(3, "rxe1", (4, 1_000, 2_000, 3_000), (0, 0))),
                ((10, 0xb0), cq(4, "rxe1", (0, 0, 0, 0), (2, 500))),
            ]),
        };
        let d = after.since(&before);
        assert_eq!(d.cqs.len(), 1, "CQ 4 had nothing new: {:?}", d.cqs);
        let r = WaterfallReport::from_snapshot(&d);
        let rows = &r.processes[0].cqs;
        assert_eq!(rows.len(), 1);
        assert_eq!(
            (rows[0].device.as_deref(), rows[0].cq),
            (Some("rxe1"), Some(3))
        );
        assert_eq!((rows[0].events, rows[0].woken, rows[0].awake), (3, 3, 0));
        assert_eq!(rows[0].runq_mean_ns, Some(2_000.0));
        assert_eq!(rows[0].total_mean_ns, Some(6_000.0));
        let r = WaterfallReport::from_snapshot(&after);
        let rows = &r.processes[0].cqs;
        assert_eq!(
            rows.iter().map(|c| c.cq).collect::<Vec<_>>(),
            [Some(3), Some(4)]
        );
        assert_eq!(rows[1].awake_mean_ns, Some(500.0));
        assert_eq!(rows[1].wake_mean_ns, None);
        let text = render_report(&r);
        assert!(text.contains("by CQ: device"), "{text}");
        assert!(
            text.lines()
                .any(|l| l.contains("rxe1") && l.contains(" 4 ") && l.contains("500ns")),
            "{text}"
        );
    }

    /// The shared slot's global counters (a full queue, an unmatched read) are losses, not a
    /// "pid 0" process; its events are.
    #[test]
    fn the_shared_slot_shows_only_with_events() {
        let mut shared = thread(0, 0, &[], &[]);
        shared.counts.counters[W_DROPPED as usize] = 3;
        shared.counts.counters[W_UNMATCHED as usize] = 1;
        let mut s = Snapshot {
            cqs: Default::default(),
            threads: BTreeMap::from([
                (0, thread(10, 10, &[(1, 2, 3)], &[])),
                (WF_THREADS - 1, shared),
            ]),
        };
        let r = WaterfallReport::from_snapshot(&s);
        assert_eq!(r.processes.len(), 1, "{:?}", r.processes);
        assert_eq!(r.processes[0].pid, 10);
        let beyond = thread(0, 0, &[], &[9]);
        s.threads.get_mut(&(WF_THREADS - 1)).unwrap().merge(&beyond);
        let r = WaterfallReport::from_snapshot(&s);
        assert_eq!(r.processes.len(), 2);
        assert_eq!(r.processes[0].pid, 0);
        assert_eq!(r.processes[0].comm, "(threads beyond the slots)");
        assert_eq!(r.processes[0].waterfall.dropped, 3);
    }

    /// Real-shaped: 100 round trips; each side (client, server) sleeps once per round trip
    /// for its receive completion (woken: driver 3 us, wake 2 us, runq 20 us, read 5 us) and
    /// finds its send completion while awake (10 us). The truth: event mode adds the two waits,
    /// 2 × 30 us = 60 us.
    fn ping_pong(rounds: usize) -> WaterfallReport {
        let side = |tid| {
            let mut t = thread(
                tid,
                tid,
                &vec![(2_000, 20_000, 5_000); rounds],
                &vec![10_000; rounds],
            );
            t.counts.counters[W_DRIVER_WOKEN_SUM as usize] = 3_000 * rounds as u64;
            t
        };
        WaterfallReport::from_snapshot(&Snapshot {
            cqs: Default::default(),
            threads: BTreeMap::from([(0, side(1)), (1, side(2))]),
        })
    }

    #[test]
    fn explanation_counts_the_two_waits_of_a_round_trip() {
        let r = ping_pong(100);
        let s = explain(100_000.0, 160_000.0, 100, &r);
        assert!(
            s.starts_with("event mode adds 60.0us per round trip (160.0us event − 100.0us poll): driver → handler 6.0us, handler → wake-up 4.0us, run-queue wait 40.0us, on CPU → read 10.0us, not attributed 0ns"),
            "{s}"
        );
        // The send completions (awake) are shown apart: 2 × 10 us per round trip.
        assert!(s.contains("awake add 20.0us per round trip"), "{s}");
        assert!(!s.contains("unreliable"), "{s}");
    }

    #[test]
    fn a_breakdown_that_misses_the_difference_says_so_and_prints_no_negative_share() {
        let r = ping_pong(100);
        // Event mode measured faster than poll (emulation noise), and a difference the stages
        // exceed by far: neither prints a remainder.
        for (poll, event) in [(160_000.0, 100_000.0), (100_000.0, 110_000.0)] {
            let s = explain(poll, event, 100, &r);
            assert!(s.contains("the breakdown is unreliable here"), "{s}");
            assert!(!s.contains("not attributed"), "{s}");
            assert!(s.contains("exceed the difference"), "{s}");
        }
        // Stages that explain only half of it fall short.
        let s = explain(100_000.0, 220_000.0, 100, &r);
        assert!(s.contains("fall short of the difference by 60.0us"), "{s}");
    }
}

//! `--timeline PATH`: a bounded sample of completion-path activity as a Chrome trace-event JSON
//! file, which ui.perfetto.dev (and chrome://tracing) open.
//!
//! The eBPF side (`rdma-trace-ebpf/src/timeline.rs`) sends every entry and return of the probe
//! table's kernel functions, and the softirq, IRQ and NAPI events of its probes, through a ring
//! buffer. A thread here drains it and rebuilds, per CPU, the nested calls: each outermost call
//! (with everything that ran inside it on that CPU) is one *sampled completion* when it holds at
//! least one probe-table function. It keeps the first N of them and, per stage (function,
//! softirq, IRQ), the N where that stage took longest; memory stays bounded whatever the run
//! length. The file holds those, as nested slices on one track per CPU and one per thread, in
//! time order, with at most `--timeline-max-events` events.
//!
//! With the completion waterfall on, its events are chosen the same way (the first N, and the
//! N slowest per stage, see `waterfall/selection.rs`) and each is a "completion event" slice on
//! the track of the thread that read it, with its stages (driver → handler, handler → wake-up,
//! run queue, on CPU → read returns; or already awake) nested in it.

use std::{
    borrow::Cow,
    collections::{BTreeMap, HashMap, HashSet},
    fs::File,
    io::Write as _,
    os::fd::{AsFd as _, AsRawFd as _},
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
};

use anyhow::{Context as _, Result, anyhow};
use aya::maps::{MapData, PerCpuArray, RingBuf};
use rdma_trace_common::{
    SOFTIRQ_NAMES,
    waterfall::{H_AWAKE, H_DRIVER, H_RUNQ, H_TOTAL, H_WAKE, WfSample},
    workload::{
        TL_FUNC_ENTRY, TL_FUNC_RETURN, TL_IRQ_ENTRY, TL_IRQ_EXIT, TL_NAPI_POLL, TL_SOFTIRQ_ENTRY,
        TL_SOFTIRQ_EXIT, TimelineEvent,
    },
};
use serde::Serialize;
use serde_json::{Value, json};

use crate::{bpf::loader::Bpf, error::chain, kernel::plan::Plan, waterfall::model::STAGES};

/// Slices kept per sampled completion (deeper activity is cut, and counted).
const MAX_SLICES_PER_COMPLETION: usize = 128;
/// An entry still open after this long lost its return (a call that migrated or slept): it is
/// dropped so that it does not swallow what follows on its CPU.
const STALE_NS: u64 = 1_000_000_000;
/// Synthetic process ids of the per-CPU tracks and of the idle tasks (pid 0 on every CPU).
const CPU_PID: u64 = 1 << 30;
const IDLE_PID: u64 = CPU_PID + (1 << 24);
/// Completion numbers (`args.completion`) of the waterfall's events start here, apart from the
/// probe-table completions'.
const WATERFALL_SEQ: u64 = 1 << 40;

/// Open the timeline file now, so that a bad path fails before anything is attached.
pub fn create_file(path: &Path) -> Result<File> {
    if path.is_dir() {
        anyhow::bail!(
            "--timeline {}: is a directory; give a file name such as trace.json",
            path.display()
        );
    }
    File::create(path).with_context(|| {
        format!(
            "--timeline {}: cannot write there; choose a writable path",
            path.display()
        )
    })
}

/// What the recorder needs to name and bound things.
#[derive(Clone, Debug)]
pub struct Config {
    /// Function name of each kernel-function slot.
    pub functions: Vec<Cow<'static, str>>,
    /// Completions kept: the first `sample`, and the slowest `sample` per stage.
    pub sample: usize,
    /// Upper bound on the events of the file (a slice is 4: begin and end, on its CPU's track
    /// and its thread's).
    pub max_events: usize,
}

impl Config {
    pub fn new(plan: &Plan, sample: u32, max_events: u32) -> Self {
        Self {
            functions: plan.functions.iter().map(|f| f.function.clone()).collect(),
            sample: sample as usize,
            max_events: max_events as usize,
        }
    }
}

/// What the file holds, for the report and the JSON.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Summary {
    pub path: String,
    /// Sampled completions in the file.
    pub completions: usize,
    /// Completion events of the waterfall in the file: each a slice "completion event" with its
    /// stages nested in it, on the track of the thread that read it.
    pub waterfall_events: usize,
    pub slices: usize,
    /// Slices on tracks (B events): each slice is on its CPU's track and on its thread's, unless
    /// it would overlap another slice there without nesting.
    pub track_slices: usize,
    /// Trace events written (metadata excluded).
    pub events: usize,
    /// Records received from the kernel.
    pub records: u64,
    /// Records lost in the kernel (ring buffer full).
    pub lost: u64,
    /// Completions left out by `--timeline-max-events`.
    pub left_out: usize,
}

/// Drains the ring buffer on a thread until [`Recorder::finish`].
pub struct Recorder {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Result<Collector>>,
    drops: PerCpuArray<MapData, u64>,
}

impl Recorder {
    /// Take the timeline maps out of `bpf` and start draining.
    pub fn start(bpf: &mut Bpf, cfg: Config) -> Result<Self> {
        let ring = bpf
            .ebpf_mut()
            .take_map("TIMELINE_EVENTS")
            .context("map TIMELINE_EVENTS is not in the eBPF object")?;
        let mut ring = RingBuf::try_from(ring).context("TIMELINE_EVENTS is not a ring buffer")?;
        let drops = bpf
            .ebpf_mut()
            .take_map("TIMELINE_DROPS")
            .context("map TIMELINE_DROPS is not in the eBPF object")?;
        let drops =
            PerCpuArray::try_from(drops).context("TIMELINE_DROPS is not a per-CPU array")?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("timeline".into())
            .spawn(move || {
                let mut col = Collector::new(cfg);
                loop {
                    let last = flag.load(Ordering::Acquire);
                    while let Some(item) = ring.next() {
                        if item.len() >= std::mem::size_of::<TimelineEvent>() {
                            // SAFETY: the record is a TimelineEvent written by the eBPF program
                            // (repr(C), any bit pattern valid); read_unaligned copes with the
                            // ring's alignment.
                            let ev = unsafe {
                                std::ptr::read_unaligned(item.as_ptr().cast::<TimelineEvent>())
                            };
                            col.push(&ev);
                        }
                    }
                    if last {
                        return Ok(col);
                    }
                    wait_readable(ring.as_fd().as_raw_fd(), 100);
                }
            })
            .context("starting the timeline thread")?;
        Ok(Self {
            stop,
            thread,
            drops,
        })
    }

    /// Stop draining (after the probes are detached) and build the timeline.
    pub fn finish(self, names: &HashMap<u32, String>) -> Result<Timeline> {
        self.stop.store(true, Ordering::Release);
        let col = self
            .thread
            .join()
            .map_err(|_| anyhow!("the timeline thread panicked"))??;
        let lost = self
            .drops
            .get(&0, 0)
            .map(|v| v.iter().sum())
            .map_err(|e| anyhow!("reading TIMELINE_DROPS: {}", chain(&e)))?;
        Ok(col.build(names, lost))
    }
}

/// Wait until `fd` is readable or `ms` pass.
fn wait_readable(fd: i32, ms: i32) {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the duration of the call; the fd stays open (owned by the
    // ring buffer of the calling thread).
    let _ = unsafe { libc::poll(&mut p, 1, ms) };
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum What {
    Function(u32),
    Softirq(u32),
    Irq(u32),
    /// A completion-waterfall stage (its histogram number; `H_TOTAL` is the whole event), on
    /// the waiting thread's track only.
    Stage(u32),
}

#[derive(Clone, Debug)]
struct Open {
    what: What,
    start: u64,
    pid_tgid: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Slice {
    what: What,
    cpu: u32,
    pid_tgid: u64,
    start: u64,
    end: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Point {
    cpu: u32,
    pid_tgid: u64,
    ts: u64,
    packets: u32,
}

/// One outermost call on one CPU and everything inside it.
#[derive(Clone, Debug, Default)]
struct Completion {
    seq: u64,
    slices: Vec<Slice>,
    points: Vec<Point>,
    has_function: bool,
    cut: bool,
}

/// (longest duration of a stage, completion), slowest first.
type Ranked = Vec<(u64, Arc<Completion>)>;

#[derive(Default)]
struct Cpu {
    stack: Vec<Open>,
    current: Completion,
}

/// Rebuilds calls per CPU and keeps the sample.
pub struct Collector {
    cfg: Config,
    cpus: HashMap<u32, Cpu>,
    seq: u64,
    records: u64,
    first: Vec<Arc<Completion>>,
    /// Per stage: (its longest duration in the completion, completion), slowest first.
    slowest: HashMap<What, Ranked>,
}

impl Collector {
    fn new(cfg: Config) -> Self {
        Self {
            cfg,
            cpus: HashMap::new(),
            seq: 0,
            records: 0,
            first: Vec::new(),
            slowest: HashMap::new(),
        }
    }

    fn push(&mut self, ev: &TimelineEvent) {
        self.records += 1;
        let (what, open) = match ev.kind {
            TL_FUNC_ENTRY => (What::Function(ev.id), true),
            TL_FUNC_RETURN => (What::Function(ev.id), false),
            TL_SOFTIRQ_ENTRY => (What::Softirq(ev.id), true),
            TL_SOFTIRQ_EXIT => (What::Softirq(ev.id), false),
            TL_IRQ_ENTRY => (What::Irq(ev.id), true),
            TL_IRQ_EXIT => (What::Irq(ev.id), false),
            TL_NAPI_POLL => {
                let cpu = self.cpus.entry(ev.cpu).or_default();
                if !cpu.stack.is_empty() && cpu.current.points.len() < MAX_SLICES_PER_COMPLETION {
                    cpu.current.points.push(Point {
                        cpu: ev.cpu,
                        pid_tgid: ev.pid_tgid,
                        ts: ev.ts_ns,
                        packets: ev.arg,
                    });
                }
                return;
            }
            _ => return,
        };
        let cpu = self.cpus.entry(ev.cpu).or_default();
        if let Some(bottom) = cpu.stack.first()
            && ev.ts_ns.saturating_sub(bottom.start) > STALE_NS
        {
            // A return went missing: what was open is dropped, with its completion.
            cpu.stack.clear();
            cpu.current = Completion::default();
        }
        if open {
            if cpu.stack.is_empty() {
                self.seq += 1;
                cpu.current = Completion {
                    seq: self.seq,
                    ..Completion::default()
                };
            }
            cpu.stack.push(Open {
                what,
                start: ev.ts_ns,
                pid_tgid: ev.pid_tgid,
            });
            return;
        }
        let Some(i) = cpu.stack.iter().rposition(|o| o.what == what) else {
            return; // its entry was before the start, or dropped
        };
        // Entries above it never returned here (they migrated or slept): dropped.
        cpu.stack.truncate(i + 1);
        let o = cpu.stack.pop().expect("index found above");
        if cpu.current.slices.len() < MAX_SLICES_PER_COMPLETION {
            cpu.current.slices.push(Slice {
                what,
                cpu: ev.cpu,
                pid_tgid: o.pid_tgid,
                start: o.start,
                end: ev.ts_ns.max(o.start),
            });
            cpu.current.has_function |= matches!(what, What::Function(_));
        } else {
            cpu.current.cut = true;
        }
        if cpu.stack.is_empty() {
            let done = std::mem::take(&mut cpu.current);
            self.keep(done);
        }
    }

    fn keep(&mut self, c: Completion) {
        if !c.has_function {
            return;
        }
        let n = self.cfg.sample;
        let mut longest: HashMap<What, u64> = HashMap::new();
        for s in &c.slices {
            let d = longest.entry(s.what).or_default();
            *d = (*d).max(s.end - s.start);
        }
        let wanted_first = self.first.len() < n;
        let wanted_slow: Vec<(What, u64)> = longest
            .into_iter()
            .filter(|(w, d)| {
                self.slowest
                    .get(w)
                    .is_none_or(|v| v.len() < n || v.last().is_some_and(|(min, _)| d > min))
            })
            .collect();
        if !wanted_first && wanted_slow.is_empty() {
            return;
        }
        let c = Arc::new(c);
        if wanted_first {
            self.first.push(c.clone());
        }
        for (w, d) in wanted_slow {
            let v = self.slowest.entry(w).or_default();
            let at = v.partition_point(|(x, _)| *x >= d);
            v.insert(at, (d, c.clone()));
            v.truncate(n);
        }
    }

    fn name(&self, what: What) -> String {
        match what {
            What::Function(slot) => self
                .cfg
                .functions
                .get(slot as usize)
                .map_or_else(|| format!("function {slot}"), |f| f.to_string()),
            What::Softirq(v) => format!(
                "softirq {}",
                SOFTIRQ_NAMES.get(v as usize).copied().unwrap_or("?")
            ),
            What::Irq(n) => format!("irq {n}"),
            What::Stage(h) => stage_name(h),
        }
    }

    /// The completions to write: the first ones, then the slowest of each stage in turn,
    /// within the event budget.
    fn build(self, names: &HashMap<u32, String>, lost: u64) -> Timeline {
        let mut order: Vec<Arc<Completion>> = self.first.clone();
        let mut stages: Vec<(&What, &Ranked)> = self.slowest.iter().collect();
        stages.sort_by_key(|(w, _)| format!("{w:?}"));
        let depth = stages.iter().map(|(_, v)| v.len()).max().unwrap_or(0);
        for rank in 0..depth {
            for (_, v) in &stages {
                if let Some((_, c)) = v.get(rank) {
                    order.push(c.clone());
                }
            }
        }
        let mut seen = HashSet::new();
        let mut kept = Vec::new();
        let mut events = 0;
        let mut left_out = 0;
        for c in order {
            if !seen.insert(c.seq) {
                continue;
            }
            // A slice is a B and an E event on two tracks; a NAPI poll an instant on two.
            let cost = 4 * c.slices.len() + 2 * c.points.len();
            if events + cost > self.cfg.max_events {
                left_out += 1;
                continue;
            }
            events += cost;
            kept.push(c);
        }
        kept.sort_by_key(|c| c.seq);
        let mut slices = Vec::new();
        let mut points = Vec::new();
        for c in &kept {
            for s in &c.slices {
                slices.push((c.seq, self.name(s.what), category(s.what), s.clone()));
            }
            points.extend(c.points.iter().map(|p| (c.seq, p.clone())));
        }
        Timeline {
            completions: kept.len(),
            waterfall_events: 0,
            slices,
            points,
            names: names.clone(),
            records: self.records,
            lost,
            left_out,
            max_events: self.cfg.max_events,
        }
    }
}

fn category(what: What) -> &'static str {
    match what {
        What::Function(_) => "function",
        What::Softirq(_) => "softirq",
        What::Irq(_) => "irq",
        What::Stage(_) => "waterfall",
    }
}

fn stage_name(h: u32) -> String {
    if h == H_TOTAL {
        return "completion event".to_owned();
    }
    STAGES.iter().find(|(n, ..)| *n == h).map_or_else(
        || format!("stage {h}"),
        |(_, _, name, span)| format!("{name} ({span})"),
    )
}

/// The sampled completions, ready to write.
pub struct Timeline {
    completions: usize,
    /// Completion events of the waterfall in the file (their stages on the reader's track).
    waterfall_events: usize,
    /// (completion, name, category, slice).
    slices: Vec<(u64, String, &'static str, Slice)>,
    points: Vec<(u64, Point)>,
    names: HashMap<u32, String>,
    records: u64,
    lost: u64,
    left_out: usize,
    max_events: usize,
}

/// A track: (pid, tid) of the trace-event format.
type Track = (u64, u64);

fn cpu_track(cpu: u32) -> Track {
    (CPU_PID, CPU_PID + 1 + u64::from(cpu))
}

fn thread_track(pid_tgid: u64, cpu: u32) -> Track {
    let (tgid, tid) = (pid_tgid >> 32, pid_tgid & 0xFFFF_FFFF);
    if tid == 0 {
        // The idle task is pid 0 on every CPU: one track per CPU.
        (IDLE_PID, IDLE_PID + 1 + u64::from(cpu))
    } else {
        (tgid, tid)
    }
}

/// One begin or end on a track, before sorting.
struct Mark {
    ts: u64,
    /// Within a track: order of the marks as the nesting walk produced them.
    order: usize,
    track: Track,
    event: Value,
}

impl Timeline {
    /// Add the completion waterfall's events (from [`crate::waterfall::Waterfall::timeline_events`]):
    /// each becomes a "completion event" slice on the reading thread's track, with its stages
    /// nested in it, within `--timeline-max-events` (an event that does not fit is left out).
    pub fn add_waterfall(&mut self, events: &[WfSample]) {
        // A slice is a B and an E event; these are on one track.
        let mut used = 4 * self.slices.len() + 2 * self.points.len();
        for (i, e) in events.iter().enumerate() {
            let stages = crate::waterfall::selection::stages(e);
            let cost = 2 * stages.len();
            if used + cost > self.max_events {
                self.left_out += 1;
                continue;
            }
            used += cost;
            self.waterfall_events += 1;
            let seq = WATERFALL_SEQ + i as u64;
            for (h, start, end) in stages {
                let cpu = match h {
                    H_DRIVER | H_WAKE | H_AWAKE => e.cpu_handler,
                    H_RUNQ => e.cpu_on,
                    _ => e.cpu_read,
                };
                let what = What::Stage(h);
                self.slices.push((
                    seq,
                    stage_name(h),
                    category(what),
                    Slice {
                        what,
                        cpu,
                        pid_tgid: (u64::from(e.tgid) << 32) | u64::from(e.tid),
                        start,
                        end: end.max(start),
                    },
                ));
            }
        }
    }

    /// Write the Chrome trace-event JSON to `file` (opened by [`create_file`] as `path`).
    pub fn write(&self, mut file: File, path: &Path) -> Result<Summary> {
        let (events, slices) = self.events();
        let track_slices = events.iter().filter(|e| e["ph"] == "B").count();
        let n = events.iter().filter(|e| e["ph"] != "M").count();
        let doc = json!({
            "traceEvents": events,
            "displayTimeUnit": "ns",
            "otherData": {
                "tool": "rdma-trace",
                "version": env!("CARGO_PKG_VERSION"),
                "completions": self.completions,
                "waterfall_events": self.waterfall_events,
                "records": self.records,
                "lost": self.lost,
                "left_out": self.left_out,
            },
        });
        let text = serde_json::to_string(&doc).context("serializing the timeline")?;
        file.write_all(text.as_bytes())
            .and_then(|()| file.write_all(b"\n"))
            .with_context(|| format!("writing the timeline to {}", path.display()))?;
        Ok(Summary {
            path: path.display().to_string(),
            completions: self.completions,
            waterfall_events: self.waterfall_events,
            slices,
            track_slices,
            events: n,
            records: self.records,
            lost: self.lost,
            left_out: self.left_out,
        })
    }

    /// Metadata, then B/E slice events and NAPI instants in time order; per track the slices
    /// nest (a slice that would overlap its neighbour without nesting is left out). Returns the
    /// events and the number of slices written.
    fn events(&self) -> (Vec<Value>, usize) {
        let t0 = self
            .slices
            .iter()
            .map(|(_, _, _, s)| s.start)
            .chain(self.points.iter().map(|(_, p)| p.ts))
            .min()
            .unwrap_or(0);
        let us = |ns: u64| (ns - t0) as f64 / 1000.0;
        // Every slice goes on its CPU's track and on its thread's track.
        let mut per_track: BTreeMap<Track, Vec<usize>> = BTreeMap::new();
        for (i, (_, _, _, s)) in self.slices.iter().enumerate() {
            if !matches!(s.what, What::Stage(_)) {
                per_track.entry(cpu_track(s.cpu)).or_default().push(i);
            }
            per_track
                .entry(thread_track(s.pid_tgid, s.cpu))
                .or_default()
                .push(i);
        }
        let mut marks = Vec::new();
        let mut written = HashSet::new();
        for (&track, idx) in &per_track {
            let mut idx = idx.clone();
            // Parents first: by start, then the longer one.
            idx.sort_by_key(|&i| {
                let s = &self.slices[i].3;
                (s.start, std::cmp::Reverse(s.end), i)
            });
            let mut order = 0;
            let mut open: Vec<usize> = Vec::new();
            let close = |marks: &mut Vec<Mark>, i: usize, order: &mut usize| {
                let (_, _, _, s) = &self.slices[i];
                marks.push(Mark {
                    ts: s.end,
                    order: *order,
                    track,
                    event: json!({"ph": "E", "ts": us(s.end), "pid": track.0, "tid": track.1}),
                });
                *order += 1;
            };
            for i in idx {
                let (seq, name, cat, s) = &self.slices[i];
                // Close what ended before this one starts.
                while let Some(&top) = open.last() {
                    if self.slices[top].3.end <= s.start && self.slices[top].3.end != s.end {
                        open.pop();
                        close(&mut marks, top, &mut order);
                    } else {
                        break;
                    }
                }
                if let Some(&top) = open.last()
                    && s.end > self.slices[top].3.end
                {
                    continue; // overlaps its would-be parent without nesting: left out here
                }
                let (tgid, tid) = (s.pid_tgid >> 32, s.pid_tgid & 0xFFFF_FFFF);
                marks.push(Mark {
                    ts: s.start,
                    order,
                    track,
                    event: json!({
                        "ph": "B", "name": name, "cat": cat, "ts": us(s.start),
                        "pid": track.0, "tid": track.1,
                        "args": {
                            "completion": seq, "cpu": s.cpu, "pid": tgid, "tid": tid,
                            "duration_ns": s.end - s.start,
                        },
                    }),
                });
                order += 1;
                written.insert(i);
                open.push(i);
            }
            while let Some(top) = open.pop() {
                close(&mut marks, top, &mut order);
            }
        }
        for (seq, p) in &self.points {
            for track in [cpu_track(p.cpu), thread_track(p.pid_tgid, p.cpu)] {
                marks.push(Mark {
                    ts: p.ts,
                    order: usize::MAX,
                    track,
                    event: json!({
                        "ph": "i", "s": "t", "name": "napi_poll", "cat": "napi", "ts": us(p.ts),
                        "pid": track.0, "tid": track.1,
                        "args": {"completion": seq, "packets": p.packets, "cpu": p.cpu},
                    }),
                });
            }
        }
        // Time order; within a track and a timestamp, the nesting walk's order.
        marks.sort_by_key(|m| (m.ts, m.track, m.order));
        let mut events = self.metadata(&per_track);
        events.extend(marks.into_iter().map(|m| m.event));
        (events, written.len())
    }

    fn metadata(&self, tracks: &BTreeMap<Track, Vec<usize>>) -> Vec<Value> {
        let mut out = Vec::new();
        let mut processes = HashSet::new();
        for &(pid, tid) in tracks.keys() {
            let (pname, tname, sort) = if pid == CPU_PID {
                ("CPUs".to_owned(), format!("CPU {}", tid - CPU_PID - 1), 0)
            } else if pid == IDLE_PID {
                (
                    "idle (swapper)".to_owned(),
                    format!("swapper/{}", tid - IDLE_PID - 1),
                    2,
                )
            } else {
                let comm = u32::try_from(pid)
                    .ok()
                    .and_then(|p| self.names.get(&p).cloned())
                    .or_else(|| crate::load::workload::proc_comm(pid as u32))
                    .unwrap_or_else(|| "?".to_owned());
                (format!("{comm} {pid}"), format!("{comm} {tid}"), 1)
            };
            if processes.insert(pid) {
                out.push(json!({"ph": "M", "name": "process_name", "pid": pid, "tid": tid, "args": {"name": pname}}));
                out.push(json!({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": sort}}));
            }
            out.push(json!({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": tname}}));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(ts: u64, cpu: u32, tid: u64, kind: u32, id: u32) -> TimelineEvent {
        TimelineEvent {
            ts_ns: ts,
            pid_tgid: (tid << 32) | tid,
            cpu,
            kind,
            id,
            arg: 0,
        }
    }

    /// `ev(ts, cpu, tid, kind, id)` of each tuple, in order.
    fn feed(c: &mut Collector, events: &[(u64, u32, u64, u32, u32)]) {
        for &(ts, cpu, tid, kind, id) in events {
            c.push(&ev(ts, cpu, tid, kind, id));
        }
    }

    fn collector(sample: usize, max_events: usize) -> Collector {
        Collector::new(Config {
            functions: ["rxe_rcv", "ib_uverbs_comp_handler", "rxe_cq_post"]
                .map(Cow::Borrowed)
                .to_vec(),
            sample,
            max_events,
        })
    }

    /// softirq NET_RX ⊃ rxe_rcv ⊃ rxe_cq_post ⊃ ib_uverbs_comp_handler, starting at `t`.
    fn completion(c: &mut Collector, t: u64, cpu: u32, handler_ns: u64) {
        feed(
            c,
            &[
                (t, cpu, 7, TL_SOFTIRQ_ENTRY, 3),
                (t + 10, cpu, 7, TL_FUNC_ENTRY, 0),
                (t + 20, cpu, 7, TL_FUNC_ENTRY, 2),
                (t + 30, cpu, 7, TL_FUNC_ENTRY, 1),
                (t + 30 + handler_ns, cpu, 7, TL_FUNC_RETURN, 1),
                (t + 40 + handler_ns, cpu, 7, TL_FUNC_RETURN, 2),
            ],
        );
        c.push(&TimelineEvent {
            kind: TL_NAPI_POLL,
            arg: 2,
            ..ev(t + 45 + handler_ns, cpu, 7, 0, 0)
        });
        c.push(&ev(t + 50 + handler_ns, cpu, 7, TL_FUNC_RETURN, 0));
        c.push(&ev(t + 60 + handler_ns, cpu, 7, TL_SOFTIRQ_EXIT, 3));
    }

    /// Independent of the writer: per track, B/E balance and match, time never goes back.
    fn check(events: &[Value]) -> usize {
        let mut stacks: HashMap<(u64, u64), Vec<String>> = HashMap::new();
        let mut last = f64::MIN;
        let mut slices = 0;
        for e in events {
            let ph = e["ph"].as_str().unwrap();
            if ph == "M" {
                continue;
            }
            let ts = e["ts"].as_f64().unwrap();
            assert!(ts >= last, "time goes back at {e}");
            last = ts;
            let track = (e["pid"].as_u64().unwrap(), e["tid"].as_u64().unwrap());
            match ph {
                "B" => {
                    slices += 1;
                    stacks
                        .entry(track)
                        .or_default()
                        .push(e["name"].as_str().unwrap().to_owned());
                }
                "E" => {
                    assert!(
                        stacks.get_mut(&track).and_then(Vec::pop).is_some(),
                        "E without B: {e}"
                    );
                }
                "i" => {}
                other => panic!("unexpected phase {other}"),
            }
        }
        assert!(stacks.values().all(Vec::is_empty), "unclosed: {stacks:?}");
        slices
    }

    #[test]
    fn nested_calls_become_nested_slices_on_cpu_and_thread_tracks() {
        let mut c = collector(10, 10_000);
        completion(&mut c, 1_000, 0, 100);
        completion(&mut c, 5_000, 1, 300);
        let tl = c.build(&HashMap::from([(7, "pingpong".to_owned())]), 0);
        assert_eq!(tl.completions, 2);
        let (events, slices) = tl.events();
        assert_eq!(slices, 8);
        // Each slice on two tracks.
        assert_eq!(check(&events), 16);
        let names: Vec<&str> = events
            .iter()
            .filter(|e| e["ph"] == "B")
            .map(|e| e["name"].as_str().unwrap())
            .collect();
        assert_eq!(&names[..2], ["softirq NET_RX", "softirq NET_RX"]);
        assert!(
            events
                .iter()
                .any(|e| e["ph"] == "M" && e["args"]["name"] == "pingpong 7")
        );
        assert_eq!(events.iter().filter(|e| e["ph"] == "i").count(), 4);
    }

    fn wf_event(t1: u64, woken: bool) -> WfSample {
        WfSample {
            t0: t1 - 500,
            t1,
            t2: t1 + 100,
            t3: t1 + 300,
            t4: t1 + 600,
            tid: 9,
            tgid: 7,
            cpu_handler: 0,
            cpu_target: 1,
            cpu_on: 1,
            cpu_read: 1,
            flags: if woken {
                rdma_trace_common::waterfall::SF_WOKEN
            } else {
                0
            },
            class: 0,
            awake_runnable: 0,
            awake_on_cpu: 0,
            awake_unkept: 0,
        }
    }

    #[test]
    fn waterfall_events_are_nested_stages_on_the_readers_track() {
        let mut c = collector(10, 10_000);
        completion(&mut c, 1_000, 0, 100);
        let mut tl = c.build(&HashMap::from([(7, "pingpong".to_owned())]), 0);
        tl.add_waterfall(&[wf_event(2_000, true), wf_event(10_000, false)]);
        assert_eq!(tl.waterfall_events, 2);
        let (events, _) = tl.events();
        check(&events);
        // On the reader's track (pid 7, tid 9) only: the event, then its stages inside it.
        let on_reader: Vec<&str> = events
            .iter()
            .filter(|e| e["ph"] == "B" && e["cat"] == "waterfall")
            .map(|e| {
                assert_eq!((e["pid"].as_u64(), e["tid"].as_u64()), (Some(7), Some(9)));
                e["name"].as_str().unwrap()
            })
            .collect();
        assert_eq!(
            on_reader,
            [
                "completion event",
                "driver → handler (T0→T1)",
                "handler → wake-up (T1→T2)",
                "wake-up → on CPU (run queue) (T2→T3)",
                "on CPU → read returns (T3→T4)",
                "completion event",
                "driver → handler (T0→T1)",
                "already awake: handler → read (T1→T4)",
            ]
        );
        // The event spans T0→T4; its B comes before its stages' and its E after theirs.
        let first = events
            .iter()
            .find(|e| e["name"] == "completion event")
            .unwrap();
        assert_eq!(first["args"]["duration_ns"], 1_100);
    }

    #[test]
    fn waterfall_events_stay_within_the_event_budget() {
        let c = collector(10, 30);
        let mut tl = c.build(&HashMap::new(), 0);
        // 5 slices (10 events) per woken event: 3 fit in 30.
        tl.add_waterfall(
            &(0..5)
                .map(|i| wf_event(10_000 * (i + 1), true))
                .collect::<Vec<_>>(),
        );
        assert_eq!((tl.waterfall_events, tl.left_out), (3, 2));
        let (events, _) = tl.events();
        assert_eq!(events.iter().filter(|e| e["ph"] != "M").count(), 30);
    }

    #[test]
    fn keeps_the_first_and_the_slowest_per_stage_within_the_budget() {
        let mut c = collector(2, 10_000);
        for (i, d) in [10u64, 20, 30, 900, 40, 800, 50].into_iter().enumerate() {
            completion(&mut c, 10_000 * i as u64, 0, d);
        }
        let tl = c.build(&HashMap::new(), 3);
        // First two (10, 20) and the two slowest handlers (900, 800).
        assert_eq!(tl.completions, 4);
        let handler: Vec<u64> = tl
            .slices
            .iter()
            .filter(|(_, n, _, _)| n == "ib_uverbs_comp_handler")
            .map(|(_, _, _, s)| s.end - s.start)
            .collect();
        assert_eq!(handler, [10, 20, 900, 800]);
        assert_eq!(tl.lost, 3);
        // A budget of one completion (4 slices: 16 events, 1 instant: 2) keeps the first only.
        let mut c = collector(2, 18);
        for i in 0..5 {
            completion(&mut c, 10_000 * i, 0, 10 * (i + 1));
        }
        let tl = c.build(&HashMap::new(), 0);
        assert_eq!(tl.completions, 1);
        assert!(tl.left_out >= 2);
        let (events, _) = tl.events();
        assert_eq!(events.iter().filter(|e| e["ph"] != "M").count(), 18);
        check(&events);
    }

    #[test]
    fn lost_returns_and_softirq_only_activity_are_dropped() {
        let mut c = collector(10, 10_000);
        // A softirq without any traced function: not a completion.
        c.push(&ev(0, 0, 1, TL_SOFTIRQ_ENTRY, 3));
        c.push(&ev(10, 0, 1, TL_SOFTIRQ_EXIT, 3));
        // An entry whose return went elsewhere, then much later a full completion.
        c.push(&ev(100, 0, 1, TL_FUNC_ENTRY, 1));
        completion(&mut c, 100 + 2 * STALE_NS, 0, 10);
        // A return without entry.
        c.push(&ev(5 * STALE_NS, 1, 1, TL_FUNC_RETURN, 0));
        // An inner entry that never returns inside an outer call that does.
        feed(
            &mut c,
            &[
                (6 * STALE_NS, 1, 1, TL_FUNC_ENTRY, 0),
                (6 * STALE_NS + 5, 1, 1, TL_FUNC_ENTRY, 1),
                (6 * STALE_NS + 9, 1, 1, TL_FUNC_RETURN, 0),
            ],
        );
        let tl = c.build(&HashMap::new(), 0);
        assert_eq!(tl.completions, 2);
        assert_eq!(tl.slices.len(), 5);
        check(&tl.events().0);
    }

    #[test]
    fn partial_overlaps_on_a_thread_track_are_left_out() {
        // Two CPUs, one thread: slices [0, 100] on CPU 0 and [50, 150] on CPU 1 overlap on the
        // thread's track without nesting.
        let mut c = collector(10, 10_000);
        feed(
            &mut c,
            &[
                (0, 0, 9, TL_FUNC_ENTRY, 0),
                (50, 1, 9, TL_FUNC_ENTRY, 1),
                (100, 0, 9, TL_FUNC_RETURN, 0),
                (150, 1, 9, TL_FUNC_RETURN, 1),
            ],
        );
        let (events, slices) = c.build(&HashMap::new(), 0).events();
        assert_eq!(slices, 2);
        assert_eq!(check(&events), 3);
    }

    #[test]
    fn bad_paths_fail_before_tracing() {
        let dir = std::env::temp_dir();
        let e = create_file(&dir).unwrap_err();
        assert!(e.to_string().contains("is a directory"), "{e}");
        let e = create_file(Path::new("/nonexistent-dir/trace.json")).unwrap_err();
        assert!(format!("{e:#}").contains("cannot write there"), "{e:#}");
    }
}

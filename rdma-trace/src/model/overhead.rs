//! What tracing costs: per eBPF program its run count and ns per run (the kernel's BPF run-time
//! statistics, enabled while rdma-trace runs), and the loader's own CPU time and peak RSS.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use serde::Serialize;

use crate::bpf::stats::ProgramStat;

/// The loader's CPU time at one moment.
#[derive(Clone, Copy, Debug)]
pub struct LoaderUsage {
    at: Instant,
    cpu: Duration,
    peak_rss_kib: u64,
}

impl LoaderUsage {
    pub fn now() -> Self {
        // SAFETY: an all-zero rusage is a valid value for getrusage to overwrite.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: `ru` is a valid, writable rusage; RUSAGE_SELF needs nothing else.
        let ok = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } == 0;
        let tv = |t: libc::timeval| {
            Duration::from_secs(t.tv_sec.max(0) as u64)
                + Duration::from_micros(t.tv_usec.max(0) as u64)
        };
        Self {
            at: Instant::now(),
            cpu: if ok {
                tv(ru.ru_utime) + tv(ru.ru_stime)
            } else {
                Duration::ZERO
            },
            // Linux reports ru_maxrss in KiB.
            peak_rss_kib: if ok { ru.ru_maxrss.max(0) as u64 } else { 0 },
        }
    }
}

/// One program's cost over a window: its counts over the window (flattened into the JSON
/// object: `name`, `target`, `runs`, `run_ns`, `recursion_misses`, `kprobe_misses`; a miss count
/// is null where the kernel does not report it: recursion misses before 5.12, kprobe misses
/// before 6.7 or for another kind of program) and their average.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ProgramOverhead {
    #[serde(flatten)]
    pub counts: ProgramStat,
    /// Average ns per run (null without runs).
    pub ns_per_run: Option<f64>,
    /// Its attach mechanism (`kprobe`, `kretprobe`, `tracepoint`, `raw_tp`, `fentry`,
    /// `uprobe`), as the budget prices it.
    pub mechanism: &'static str,
}

impl ProgramOverhead {
    pub fn new(counts: ProgramStat) -> Self {
        let ns_per_run = (counts.runs > 0).then(|| counts.run_ns as f64 / counts.runs as f64);
        let mechanism = mechanism_of(&counts.name);
        Self {
            counts,
            ns_per_run,
            mechanism,
        }
    }
}

/// The cost of tracing over a window.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Overhead {
    /// How the kernel's BPF run-time statistics were enabled, or why not.
    pub stats: String,
    pub programs: Vec<ProgramOverhead>,
    /// Time in all our programs, in % of one CPU over the window.
    pub bpf_cpu_percent: f64,
    /// The loader's own CPU time (user + system), in % of one CPU over the window.
    pub loader_cpu_percent: f64,
    /// The loader's peak resident set size.
    pub loader_peak_rss_kib: u64,
    /// What tracing adds to one round trip (`rdma-trace run` sets it; null when unknown).
    pub tracing_adds: Option<Added>,
    /// How often the programs ran per round trip (`run` sets it; null when unknown).
    pub hook_hits: Option<HookHits>,
}

impl Overhead {
    /// Program runs per round trip (or per completion event: `per`), by group.
    pub fn hook_hits(&self, round_trips: u64, per: &'static str) -> Option<HookHits> {
        if round_trips == 0 || self.stats_off() {
            return None;
        }
        let n = round_trips as f64;
        let mut by_group: BTreeMap<&'static str, f64> = BTreeMap::new();
        for p in &self.programs {
            *by_group.entry(program_group(&p.counts.name)).or_default() += p.counts.runs as f64 / n;
        }
        Some(HookHits {
            per,
            round_trips,
            per_round_trip: by_group.values().sum(),
            by_group,
        })
    }

    /// The kernel's BPF run-time statistics could not be turned on: run counts and times
    /// read 0.
    pub fn stats_off(&self) -> bool {
        self.stats.starts_with("unavailable")
    }

    /// One line: the programs' and the loader's CPU, and the loader's memory.
    pub fn summary_line(&self) -> String {
        format!(
            "eBPF {:.2} % of a CPU, loader {:.2} % CPU, peak RSS {} KiB (BPF statistics: {})",
            self.bpf_cpu_percent, self.loader_cpu_percent, self.loader_peak_rss_kib, self.stats
        )
    }

    /// Every program with what it is attached to, the most expensive (total run time) first.
    pub fn cost_table(&self) -> String {
        let mut programs: Vec<&ProgramOverhead> = self.programs.iter().collect();
        programs.sort_by_key(|p| std::cmp::Reverse(p.counts.run_ns));
        let mut out = format!(
            "  {:<28} {:<18} {:>10} {:>10} {:>12}\n",
            "attached to", "program", "runs", "ns/run", "total"
        );
        for p in programs {
            out.push_str(&format!(
                "  {:<28} {:<18} {:>10} {:>10} {:>12}\n",
                p.counts.target,
                p.counts.name,
                p.counts.runs,
                p.ns_per_run.map_or("-".to_owned(), |v| format!("{v:.0}")),
                crate::bpf::hist::human_ns(p.counts.run_ns)
            ));
        }
        out
    }

    /// The cost between two snapshots of the program statistics and loader usage.
    pub fn between(
        stats: &str,
        before: &[ProgramStat],
        after: &[ProgramStat],
        u0: LoaderUsage,
        u1: LoaderUsage,
    ) -> Self {
        let wall = u1.at.saturating_duration_since(u0.at).as_secs_f64();
        let programs: Vec<ProgramOverhead> = after
            .iter()
            .map(|a| ProgramOverhead::new(a.since(before.iter().find(|b| b.name == a.name))))
            .collect();
        let pct = |ns: f64| {
            if wall > 0.0 {
                ns / (wall * 1e9) * 100.0
            } else {
                0.0
            }
        };
        let bpf_ns: u64 = programs.iter().map(|p| p.counts.run_ns).sum();
        Self {
            stats: stats.to_owned(),
            bpf_cpu_percent: pct(bpf_ns as f64),
            loader_cpu_percent: pct(u1.cpu.saturating_sub(u0.cpu).as_nanos() as f64),
            loader_peak_rss_kib: u1.peak_rss_kib,
            tracing_adds: None,
            hook_hits: None,
            programs,
        }
    }

    /// The text block of reports.
    pub fn render(&self) -> String {
        let mut out = format!(
            "overhead: eBPF {:.2} % of a CPU, loader {:.2} % CPU, peak RSS {} KiB (BPF stats: {})\n",
            self.bpf_cpu_percent, self.loader_cpu_percent, self.loader_peak_rss_kib, self.stats
        );
        if let Some(a) = &self.tracing_adds {
            out.push_str(&format!("  {}\n", a.render()));
        }
        out.push_str(&self.cost_table());
        out
    }
}

/// How often our programs ran per round trip: on a real CPU each hit costs tens to hundreds of
/// nanoseconds, whatever the emulation makes of it here.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct HookHits {
    /// `round trip` (the demo's) or `completion event` (a workload's).
    pub per: &'static str,
    pub round_trips: u64,
    pub per_round_trip: f64,
    /// `probes` (the probe table), `waterfall`, `workload` (following processes), `other`.
    pub by_group: BTreeMap<&'static str, f64>,
}

impl HookHits {
    pub fn render(&self) -> String {
        let groups: Vec<String> = self
            .by_group
            .iter()
            .filter(|(_, v)| **v > 0.0)
            .map(|(g, v)| format!("{g} {}", sig(*v, 2)))
            .collect();
        format!(
            "hook hits: {} per {} ({})",
            sig(self.per_round_trip, 3),
            self.per,
            groups.join(", ")
        )
    }
}

/// The attach mechanism of one of our programs, from its name in the eBPF object: `kprobe`,
/// `kretprobe`, `fentry` (fexit too), `uprobe` (uretprobe too), `tracepoint` (the perf-event
/// form) or `raw_tp`. The waterfall's programs are priced by what each really is: kprobes,
/// kretprobes, tracepoints and one raw tracepoint (`rdma-trace-ebpf/src/waterfall.rs`); a test
/// checks every program of the object against its ELF section.
pub fn mechanism_of(program: &str) -> &'static str {
    const KRETPROBES: &[&str] = &["wf_handler_return", "wf_read_return"];
    const TRACEPOINTS: &[&str] = &[
        "wf_sched_switch",
        "wf_sched_waking",
        "wf_thread_exit",
        "task_newtask",
    ];
    const RAW_TPS: &[&str] = &["wf_mlx5_irq"];
    // The NVMe I/O row's kprobes (its tracepoints are raw_tp).
    const KPROBES: &[&str] = &["nvme_post_send", "nvme_callback"];
    // The calibration's empty programs are named after their mechanism.
    if let Some(m) = program.strip_prefix("cal_") {
        return match m {
            "kprobe" => "kprobe",
            "kretprobe" => "kretprobe",
            "tracepoint" => "tracepoint",
            "fentry" => "fentry",
            _ => "raw_tp",
        };
    }
    if program.starts_with("kentry_") || program.starts_with("cq_") || KPROBES.contains(&program) {
        "kprobe"
    } else if program.starts_with("kreturn_") || KRETPROBES.contains(&program) {
        "kretprobe"
    } else if program.starts_with("fentry_") || program.starts_with("fexit_") {
        "fentry"
    } else if program.starts_with("uentry") || program.starts_with("ureturn") {
        "uprobe"
    } else if TRACEPOINTS.contains(&program) {
        "tracepoint"
    } else if program.starts_with("wf_") && !RAW_TPS.contains(&program) {
        // The waterfall's other programs are kprobes on the completion path.
        "kprobe"
    } else {
        "raw_tp"
    }
}

/// The group of one of the object's programs, by its name.
pub fn program_group(name: &str) -> &'static str {
    const PROBES: &[&str] = &[
        "kentry_",
        "kreturn_",
        "fentry_",
        "fexit_",
        "softirq_",
        "irq_",
        "napi_poll",
        "uentry",
        "ureturn",
        "cq_event",
    ];
    if name.starts_with("wf_") {
        "waterfall"
    } else if ["proc_exec", "proc_exit", "task_newtask"].contains(&name) {
        "workload"
    } else if PROBES.iter().any(|p| name.starts_with(p)) {
        "probes"
    } else {
        "other"
    }
}

/// What tracing adds to one round trip.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Added {
    /// What the estimate is per: `round trip` (the demo's), or `completion event` (a
    /// workload's, counted by ib_uverbs_comp_handler).
    pub per: &'static str,
    pub us_per_round_trip: f64,
    /// In % of the measured (traced) round trip.
    pub percent: f64,
    pub round_trip_us: f64,
    pub round_trips: u64,
}

impl Added {
    /// An estimate, so two significant digits (and the measured round trip with three).
    pub fn render(&self) -> String {
        format!(
            "tracing adds ≈ {} per {} ({} % of {})",
            sig_us(self.us_per_round_trip, 2),
            self.per,
            sig(self.percent, 2),
            sig_us(self.round_trip_us, 3)
        )
    }
}

/// `v` rounded to `digits` significant digits, without trailing zeros after a point.
fn sig(v: f64, digits: i32) -> String {
    if v == 0.0 || !v.is_finite() {
        return format!("{v}");
    }
    let magnitude = v.abs().log10().floor() as i32;
    let decimals = (digits - 1 - magnitude).max(0) as usize;
    let scale = 10f64.powi(digits - 1 - magnitude);
    format!("{:.*}", decimals, (v * scale).round() / scale)
}

/// Microseconds in `us` (the unit style of every table), nanoseconds under 1 us.
fn sig_us(us: f64, digits: i32) -> String {
    if us < 1.0 {
        format!("{} ns", sig(us * 1e3, digits))
    } else {
        format!("{} us", sig(us, digits))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The truth: programs with known run counts over 10 round trips.
    #[test]
    fn hook_hits_are_runs_per_round_trip_by_group() {
        let prog = |name: &str, runs: u64| {
            ProgramOverhead::new(ProgramStat {
                target: "t".to_owned(),
                ..stat(name, runs, runs * 100)
            })
        };
        let o = Overhead {
            stats: String::new(),
            programs: vec![
                prog("kentry_0", 40),
                prog("kreturn_0", 40),
                prog("softirq_entry", 20),
                prog("wf_sched_switch", 250),
                prog("wf_handler_entry", 30),
                prog("proc_exec", 1),
                prog("cal_kprobe", 0),
            ],
            bpf_cpu_percent: 0.0,
            loader_cpu_percent: 0.0,
            loader_peak_rss_kib: 0,
            tracing_adds: None,
            hook_hits: None,
        };
        let h = o.hook_hits(10, "round trip").unwrap();
        assert_eq!(h.per_round_trip, 38.1);
        assert_eq!(h.by_group["probes"], 10.0);
        assert_eq!(h.by_group["waterfall"], 28.0);
        assert_eq!(h.by_group["workload"], 0.1);
        assert_eq!(h.by_group["other"], 0.0);
        assert_eq!(
            h.render(),
            "hook hits: 38.1 per round trip (probes 10, waterfall 28, workload 0.10)"
        );
        assert!(o.hook_hits(0, "round trip").is_none());
    }

    fn stat(name: &str, runs: u64, run_ns: u64) -> ProgramStat {
        ProgramStat {
            name: name.to_owned(),
            target: format!("{name}_target"),
            runs,
            run_ns,
            recursion_misses: None,
            kprobe_misses: None,
        }
    }

    #[test]
    fn deltas_and_ns_per_run() {
        let u0 = LoaderUsage::now();
        // Burn CPU until the process has used 30 ms more of it (RUSAGE_SELF counts every
        // thread of the test binary), so the loader's share is measurable however loaded the
        // machine is; a wall-clock bound alone gives a share that depends on the load.
        let mut x = 0u64;
        while LoaderUsage::now().cpu < u0.cpu + Duration::from_millis(30)
            && u0.at.elapsed() < Duration::from_secs(20)
        {
            for _ in 0..10_000 {
                x = x.wrapping_mul(31).wrapping_add(7);
            }
        }
        std::hint::black_box(x);
        let u1 = LoaderUsage::now();
        let before = [stat("a", 10, 1_000), stat("b", 0, 0)];
        let after = [stat("a", 110, 21_000), stat("b", 0, 0), stat("c", 4, 400)];
        let o = Overhead::between("test", &before, &after, u0, u1);
        assert_eq!(o.programs.len(), 3);
        assert_eq!(o.programs[0].counts.runs, 100);
        assert_eq!(o.programs[0].ns_per_run, Some(200.0));
        assert_eq!(o.programs[1].ns_per_run, None, "no runs, no average");
        assert_eq!(
            o.programs[2].ns_per_run,
            Some(100.0),
            "new program counts from 0"
        );
        assert!(o.loader_cpu_percent > 0.0, "{}", o.loader_cpu_percent);
        assert!(
            u1.cpu >= u0.cpu + Duration::from_millis(30),
            "the burn used CPU"
        );
        assert!(o.loader_peak_rss_kib > 0);
        assert!(o.bpf_cpu_percent > 0.0);
        let text = o.render();
        assert!(text.contains("a_target") && text.contains("200"), "{text}");
    }
}

//! The render stage of `run`: the text report, which leads with the answer.
//!
//! A run opens with one header line (what ran, the kernel, the preset, the probes attached) and
//! one line for every skipped row. Each phase then gives, in this order: the load's own
//! latency, what tracing cost and whether that is within the budget, the completion waterfall
//! (its largest stage marked), and the kernel path's top rows by total time. "next:" lines
//! say what to try. Every probe's histogram (`--hist`) and every program's cost (`-v`) come
//! after, when asked for.

use crate::{
    bpf::{
        hist::{human_ns_f, plain},
        loader::skipped_line,
    },
    kernel::probes::Unit,
    model::{
        budget::Budget,
        report::{ProbeReport, render as render_probes},
    },
    waterfall::{WaterfallReport, model::render_report as render_waterfall},
};

use super::{
    config::{Detail, RunConfig},
    report::{LoadInfo, Phase},
};

/// Kernel-path rows the default report shows.
pub const TOP_ROWS: usize = 8;

/// The text report of one run: what every phase's block needs to know once.
pub struct Text<'a> {
    pub load: &'a LoadInfo,
    pub kernel: Option<String>,
    pub config: &'a RunConfig,
}

impl Text<'_> {
    /// One phase's block (`title`, the load's own results, then the rest, see [`phase`]);
    /// before the run's first phase, its [`header`].
    pub fn phase(
        &self,
        first: bool,
        title: &str,
        load_text: &str,
        budget: &Budget,
        p: &Phase,
    ) -> String {
        let mut out = if first {
            header(
                self.load,
                self.kernel.as_deref(),
                self.config.probes.name(),
                &p.probes,
            )
        } else {
            String::new()
        };
        out.push_str(&phase(title, load_text, budget, p, self.config.detail()));
        out
    }

    /// The run's "next:" lines.
    pub fn next(&self, phases: &[Phase]) -> String {
        next_hints(phases, self.config.overhead_budget, self.config.detail())
    }
}

/// The run's first lines: what ran, where, with what; and one line for all skipped rows.
pub fn header(
    load: &LoadInfo,
    kernel: Option<&str>,
    preset: &str,
    probes: &[ProbeReport],
) -> String {
    let attached = probes.iter().filter(|p| p.skipped.is_none()).count();
    let mut out = format!(
        "rdma-trace run: {} · kernel {} · probes {preset}: {attached} attached\n",
        load.label,
        kernel.unwrap_or("?"),
    );
    let skipped: Vec<(&'static str, &'static str)> = probes
        .iter()
        .filter_map(|p| Some((p.skip_kind?, p.driver.name())))
        .collect();
    if let Some(line) = skipped_line(&skipped) {
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// The kernel path: the attached duration probes that ran, by total time, the top `rows`.
pub fn kernel_path(probes: &[ProbeReport], rows: usize) -> String {
    let mut timed: Vec<&ProbeReport> = probes
        .iter()
        .filter(|p| p.skipped.is_none() && p.unit == Unit::Nanoseconds && p.count > 0)
        .collect();
    timed.sort_by(|a, b| b.total.total_cmp(&a.total));
    let silent = probes
        .iter()
        .filter(|p| p.skipped.is_none() && p.count == 0)
        .count();
    let mut out = format!(
        "kernel path, machine-wide, by total time (top {} of {} that ran{}):\n",
        rows.min(timed.len()),
        timed.len(),
        if silent > 0 {
            format!("; {silent} attached saw nothing")
        } else {
            String::new()
        }
    );
    out.push_str(&format!(
        "  {:<26} {:<7} {:>9} {:>9} {:>9} {:>9} {:>10}\n",
        "probe", "via", "count", "rate/s", "p50", "p99", "total"
    ));
    for p in timed.iter().take(rows) {
        out.push_str(&format!(
            "  {:<26} {:<7} {:>9} {:>9.1} {:>9} {:>9} {:>10}\n",
            p.name,
            p.attach.unwrap_or("-"),
            p.count,
            p.rate,
            p.summary.p50.map_or("-".to_owned(), human_ns_f),
            p.summary.p99.map_or("-".to_owned(), human_ns_f),
            human_ns_f(p.total)
        ));
    }
    out
}

/// One phase: `title`, the load's own results (`load_text`), what tracing cost against the
/// `budget`, the waterfall, the kernel path, then what `detail` asks for.
pub fn phase(
    title: &str,
    load_text: &str,
    budget: &Budget,
    phase: &Phase,
    detail: Detail,
) -> String {
    let mut out = format!("===== {title} =====\n");
    out.extend(phase.losses.line());
    if let Some(stalls) = &phase.stalls {
        out.push_str(&crate::waterfall::stall::render(stalls));
    }
    if !load_text.trim().is_empty() {
        out.push_str(load_text.trim_end());
        out.push('\n');
    }
    out.push_str(&format!("tracing: {}\n", phase.overhead.summary_line()));
    if let Some(h) = &phase.overhead.hook_hits {
        out.push_str(&format!("  {}\n", h.render()));
    }
    if let Some(a) = &phase.overhead.tracing_adds {
        out.push_str(&format!("  {}\n", a.render()));
    }
    out.push_str(&budget.verdict(&phase.overhead, &phase.dropped));
    if let Some(w) = &phase.waterfall {
        out.push_str(&render_waterfall(w));
    }
    out.push_str(&kernel_path(&phase.probes, TOP_ROWS));
    if detail.hist {
        out.push_str("\nevery probe (--hist):\n");
        out.push_str(&render_probes(&phase.probes));
    }
    if detail.costs {
        out.push_str("\nevery program's cost (-v), the most expensive first:\n");
        out.push_str(&phase.overhead.cost_table());
    }
    out
}

/// "next:" lines: what to try, from what the run saw.
pub fn next_hints(phases: &[Phase], budget_percent: f64, detail: Detail) -> String {
    let mut hints = Vec::new();
    let last = phases.last();
    if let Some(stage) = last
        .and_then(|p| p.waterfall.as_ref())
        .and_then(largest_stage)
    {
        let hint = match stage {
            "runq" => Some(
                "the run-queue wait is the largest stage: pin the reader (taskset) away from the \
                 completion IRQ and softirq CPU, or give it a CPU of its own",
            ),
            "driver" => Some(
                "driver → handler is the largest stage: completion delivery (IRQ, softirq or \
                 tasklet); `rdma-trace irq` and `rdma-trace softirqs` show where it waits, \
                 --probes full times every driver function, softirq and NAPI poll",
            ),
            "read" => Some(
                "on CPU → read is the largest stage: the reader does other work between waking \
                 and reading the event (--timeline shows it)",
            ),
            "awake" => Some(
                "most time is in events that found their reader busy: the reader is the \
                 bottleneck, not the wake-up",
            ),
            _ => None,
        };
        hints.extend(hint.map(str::to_owned));
    }
    if let Some(p) = last.filter(|p| {
        p.overhead
            .tracing_adds
            .as_ref()
            .is_some_and(|a| a.percent > budget_percent)
    }) {
        hints.push(over_budget_hint(p, budget_percent));
    }
    if !detail.hist {
        hints.push(
            "--hist shows every probe's histogram, -v every program's cost, --json all of it"
                .to_owned(),
        );
    }
    hints.iter().map(|h| format!("next: {h}\n")).collect()
}

/// What to drop when a phase is over the budget: only what this run attached. `--probes
/// minimal` where rows beyond it were attached (on rxe the default has none: the hardware
/// drivers' rows need their devices), `--no-waterfall` where the waterfall ran.
fn over_budget_hint(phase: &Phase, budget_percent: f64) -> String {
    use crate::kernel::probes::{PROBES, Preset, Role};
    let beyond_minimal = phase
        .probes
        .iter()
        .filter(|r| r.attach.is_some())
        .filter(|r| {
            PROBES
                .iter()
                .any(|d| d.name == r.name && d.preset > Preset::Minimal && d.role != Role::Reads)
        })
        .count();
    let mut cuts = Vec::new();
    if beyond_minimal > 0 {
        cuts.push(format!(
            "--probes minimal detaches {beyond_minimal} of its rows (it keeps the completion \
             handler and each driver's hand-off)"
        ));
    }
    if phase.waterfall.is_some() {
        cuts.push("--no-waterfall drops the waterfall".to_owned());
    }
    if cuts.is_empty() {
        format!(
            "tracing is over the {budget_percent} % budget with the minimal rows alone and no \
             waterfall: the hooks' own cost under this CPU (or emulation) is the floor"
        )
    } else {
        format!(
            "tracing is over the {budget_percent} % budget: {}",
            cuts.join(", ")
        )
    }
}

/// The key of the largest stage (by share) of the process with the most events.
fn largest_stage(w: &WaterfallReport) -> Option<&'static str> {
    let p = w.processes.iter().max_by_key(|p| p.waterfall.events)?;
    p.waterfall
        .stages
        .iter()
        .filter(|s| s.key != "total")
        .filter_map(|s| Some((s.key, s.share?)))
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(k, _)| k)
}

/// A count with its unit, for the title lines.
pub fn size_label(bytes: u32) -> String {
    format!("{} B", plain(u64::from(bytes)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{load::workload::Target, model::losses::Losses, views::tui::app::tests::report};

    /// The truth: three probes with known totals (count × 2 µs in the fixture) and two skipped
    /// rows; the kernel path must order them by total and leave the skipped rows to one line.
    #[test]
    fn the_kernel_path_is_ordered_by_total_and_skipped_rows_take_one_line() {
        let probes = vec![
            report("small", 10, false),
            report("big", 1000, false),
            report("middle", 100, false),
            report("gone_a", 0, true),
            report("gone_b", 0, true),
        ];
        let path = kernel_path(&probes, 2);
        let names: Vec<&str> = path
            .lines()
            .skip(2)
            .filter_map(|l| l.split_whitespace().next())
            .collect();
        assert_eq!(names, ["big", "middle"], "{path}");
        assert!(
            path.starts_with("kernel path, machine-wide, by total time (top 2 of 3"),
            "{path}"
        );
        let load = LoadInfo::workload(&Target::Command(vec!["true".into()]));
        let head = header(&load, Some("6.1.0"), "default", &probes);
        assert_eq!(head.lines().count(), 2, "{head}");
        assert!(head.contains("3 attached"), "{head}");
        assert!(
            head.lines()
                .nth(1)
                .unwrap()
                .starts_with("skipped 2 rows: no_device ×2"),
            "{head}"
        );
    }

    /// A one-second phase of a command with `probes` and `losses`.
    fn phase_of(probes: Vec<crate::model::report::ProbeReport>, losses: Losses) -> Phase {
        use crate::model::{
            overhead::{LoaderUsage, Overhead},
            window::Window,
        };
        let u = LoaderUsage::now();
        Phase {
            mode: None,
            window: Window {
                seconds: 1.0,
                ended_by: "command",
                command_status: Some(0),
            },
            completion_mode: "completion events",
            demo: None,
            probes,
            cqs: Vec::new(),
            rdma_cm: None,
            nvme: None,
            processes: Vec::new(),
            overhead: Overhead::between("bpf_enable_stats", &[], &[], u, u),
            dropped: Vec::new(),
            waterfall: None,
            losses,
            stalls: None,
        }
    }

    /// The hint names only what the run attached: on rxe the default preset has no row beyond
    /// minimal, so `--probes minimal` would change nothing there.
    #[test]
    fn the_over_budget_hint_offers_only_what_would_detach_something() {
        let rxe_default = || {
            vec![
                report("ib_uverbs_comp_handler", 100, false),
                report("rxe_cq_post", 100, false),
                report("mlx5_eq_comp_int", 0, true),
                // A workload run's per-process reads: kept by every preset.
                report("wakeup", 100, false),
            ]
        };
        let mut p = phase_of(rxe_default(), Losses::default());
        let bare = over_budget_hint(&p, 5.0);
        assert!(bare.contains("with the minimal rows alone"), "{bare}");
        p.waterfall = Some(crate::waterfall::model::WaterfallReport::default());
        let hint = over_budget_hint(&p, 5.0);
        assert_eq!(
            hint,
            "tracing is over the 5 % budget: --no-waterfall drops the waterfall"
        );
        p.probes.push(report("rxe_rcv", 100, false));
        let hint = over_budget_hint(&p, 5.0);
        assert!(
            hint.contains("--probes minimal detaches 1 of its rows")
                && hint.ends_with("--no-waterfall drops the waterfall"),
            "{hint}"
        );
    }

    /// A phase that lost data says so on the line after its title, naming the counters; one
    /// that lost nothing has no such line.
    #[test]
    fn a_phase_that_lost_data_says_so_first_and_one_that_did_not_says_nothing() {
        let phase = |losses: Losses| phase_of(vec![report("big", 1000, false)], losses);
        let budget = Budget {
            percent: 5.0,
            enforce: false,
            calibration: None,
        };
        let lossy = Losses {
            threads_without_slot: 3,
            read_returns_missed: 12,
            ..Losses::default()
        };
        let text = super::phase("t", "", &budget, &phase(lossy), Detail::default());
        let second = text.lines().nth(1).expect("a second line");
        assert!(second.starts_with("lost: "), "{text}");
        assert!(
            second.contains("3 threads beyond the 31 thread slots"),
            "{second}"
        );
        assert!(
            second.contains("12 read returns the kretprobe missed"),
            "{second}"
        );
        let quiet = super::phase(
            "t",
            "",
            &budget,
            &phase(Losses::default()),
            Detail::default(),
        );
        assert!(!quiet.contains("lost"), "{quiet}");
    }
}

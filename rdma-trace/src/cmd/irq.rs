//! `rdma-trace irq`: hard IRQ handlers of the RDMA and NIC interrupts — per IRQ its count,
//! handler duration histogram and spread over the CPUs — and the NET_RX and TASKLET softirq
//! vectors (what runs after the hard IRQ). Raw tracepoints `irq_handler_entry/exit` and
//! `softirq_entry/exit`: works without tracefs and without kprobes.

use std::{borrow::Cow, path::PathBuf, time::Duration};

use anyhow::Result;
use serde::Serialize;

use crate::{
    bpf::session::Session,
    error::Unsupported,
    kernel::facts::Kernel,
    kernel::plan::Options,
    kernel::probes::{Driver, Method, PROBES, Patterns, ProbeDef, Shape, glob_match},
    model::baseline::{Baseline, delta},
    model::overhead::Overhead,
    model::report::{ProbeReport, probe_reports, render},
    model::sample::{Sample, Source},
    model::window::Window,
    output::write_json_if,
    views::tui::Live,
};

/// IRQs traced without `--match` besides those of the table's IRQ rows: irdma's AEQ vector
/// and virtio NIC send queues.
const MORE_PATTERNS: &[&str] = &["irdma-*-AEQ", "virtio*-output*"];

/// IRQs traced without `--match`: the patterns of the table's IRQ rows (the completion vectors
/// of mlx5, irdma, bnxt_re and MANA; mlx5 async vectors, virtio NIC queues, the usual NIC
/// names), then [`MORE_PATTERNS`].
pub fn default_patterns() -> Vec<String> {
    PROBES
        .iter()
        .filter_map(|p| match &p.shape {
            Shape::Irq { patterns } => Some(patterns.iter()),
            _ => None,
        })
        .flatten()
        .chain(MORE_PATTERNS.iter().copied())
        .map(str::to_owned)
        .collect()
}

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Refresh every INTERVAL seconds (BCC's positional interval): the same as --interval.
    #[arg(value_name = "INTERVAL", conflicts_with = "interval", value_parser = crate::cmd::parse_seconds)]
    pub every: Option<Duration>,
    /// Stop after COUNT intervals: the same as --duration INTERVAL×COUNT.
    #[arg(value_name = "COUNT", requires = "every", conflicts_with = "duration", value_parser = clap::value_parser!(u32).range(1..))]
    pub count: Option<u32>,
    /// Collect for this many seconds (default: until q or Ctrl-C).
    #[arg(long, value_name = "SECS", value_parser = crate::cmd::parse_seconds)]
    pub duration: Option<Duration>,
    /// IRQ names to trace, as in /proc/interrupts; `*` matches any text; repeat or separate
    /// with commas [default: the completion vectors of mlx5, irdma, bnxt_re and MANA, mlx5_async*,
    /// virtio*-input*, virtio*-output*, eth*, ens*, enp*].
    #[arg(
        short = 'm',
        long = "match",
        value_name = "PATTERN",
        value_delimiter = ','
    )]
    pub patterns: Vec<String>,
    /// Also write the report as JSON to this file (`-`: stdout).
    #[arg(long, value_name = "PATH")]
    pub json: Option<PathBuf>,
    /// No live screen: print text histograms each interval (also when stdout is not a terminal).
    #[arg(long)]
    pub no_tui: bool,
    /// Refresh interval of the live view [default: 0.25 s on the screen, 1 s as text].
    #[arg(long, value_name = "SECS", value_parser = crate::cmd::parse_seconds)]
    pub interval: Option<Duration>,
}

impl Args {
    /// `--duration`, or INTERVAL × COUNT.
    fn duration(&self) -> Option<Duration> {
        self.duration.or_else(|| Some(self.every? * self.count?))
    }
}

#[derive(Serialize)]
struct Report {
    kernel: Option<String>,
    window: Window,
    patterns: Vec<String>,
    irqs: Vec<IrqReport>,
    softirqs: Vec<ProbeReport>,
    overhead: Overhead,
}

#[derive(Serialize)]
struct IrqReport {
    /// IRQ numbers sharing this name (usually one).
    numbers: Vec<u32>,
    /// Handler events per CPU (index = CPU).
    cpus: Vec<u64>,
    /// The IRQ's name in /proc/interrupts.
    #[serde(skip)]
    irq: String,
    #[serde(flatten)]
    probe: ProbeReport,
}

/// An IRQ row's /proc/interrupts name and IRQ numbers.
type IrqOf = (String, Vec<u32>);

/// One probe per IRQ name matching `patterns` (IRQs sharing a name share a probe), then the
/// table's softirq rows (NET_RX and TASKLET), named by their vector.
fn irq_probes(irqs: &[(u32, String)], patterns: &[String]) -> Vec<ProbeDef> {
    let mut names: Vec<&str> = Vec::new();
    for (_, name) in irqs {
        if patterns.iter().any(|p| glob_match(p, name)) && !names.contains(&name.as_str()) {
            names.push(name);
        }
    }
    let mut defs: Vec<ProbeDef> = names
        .into_iter()
        .take(rdma_trace_common::MAX_IRQS as usize)
        .map(|name| {
            // This command's own rows: `run`'s presets never see them.
            ProbeDef::stage(
                Cow::Owned(format!("irq {name}")),
                "hard IRQ handler, entry → exit",
                Driver::Network,
                Shape::Irq {
                    patterns: Patterns::Owned(vec![name.to_owned()]),
                },
                &[Method::RawTracepoint],
            )
        })
        .collect();
    defs.extend(PROBES.iter().filter_map(|p| match p.shape {
        Shape::Softirq { vector } => Some(ProbeDef {
            name: Cow::Borrowed(rdma_trace_common::SOFTIRQ_NAMES[vector as usize]),
            ..p.clone()
        }),
        _ => None,
    }));
    defs
}

struct IrqSource<'a> {
    session: &'a Session,
    /// Where the report and the live view count from.
    base: Baseline<'a>,
}

impl Source for IrqSource<'_> {
    fn sample(&mut self, elapsed: Duration) -> Result<Sample> {
        self.base
            .sample_now(self.session, "IRQs and softirqs".to_owned(), elapsed, false)
    }

    fn reset(&mut self) -> Result<()> {
        self.base.reset(self.session)
    }
}

/// Ctrl-C, SIGTERM and `q` end the window like `--duration` does: the report follows, exit 0.
pub async fn run(args: &Args) -> Result<()> {
    let kernel = Kernel::live();
    let patterns: Vec<String> = if args.patterns.is_empty() {
        default_patterns()
    } else {
        args.patterns.clone()
    };
    let irqs = kernel.interrupts();
    let defs = irq_probes(&irqs, &patterns);
    if !defs.iter().any(|d| matches!(d.shape, Shape::Irq { .. })) {
        return Err(anyhow::anyhow!(Unsupported(format!(
            "no IRQ in /proc/interrupts matches {}: pass --match with a name from /proc/interrupts",
            patterns.join(", ")
        ))));
    }
    if let Some(path) = &args.json {
        crate::output::check_writable(path)?;
    }
    let session = Session::start(&kernel, &defs, Options::default())?;
    eprintln!(
        "rdma-trace: timing IRQ handlers{}; probes:\n{}",
        args.duration()
            .map(|d| format!(" for {} s", d.as_secs_f64()))
            .unwrap_or_default(),
        session.attach_table()
    );
    let json_on_stdout = args.json.as_deref() == Some(std::path::Path::new("-"));
    let mut live = Live::new(
        "rdma-trace irq",
        !args.no_tui,
        args.every.or(args.interval),
        json_on_stdout,
    );
    let mut src = IrqSource {
        session: &session,
        base: Baseline::new(&session, None)?,
    };
    let window = live.watch(&mut src, args.duration(), None).await?;
    live.close();
    let after = session.snapshot()?;
    let per_cpu = session.events_per_cpu()?;
    let overhead = src.base.overhead(&session);
    let reports = probe_reports(
        &session,
        &delta(&after, src.base.phase_data()),
        window.seconds,
    );
    // Per probe: its id, and for an IRQ row its IRQ's name and numbers.
    let irqs: Vec<(u32, Option<IrqOf>)> = session
        .plan
        .probes
        .iter()
        .map(|p| {
            let irq = match &p.def.shape {
                Shape::Irq { patterns } => Some((
                    patterns.iter().collect::<Vec<_>>().join(","),
                    p.irqs.clone(),
                )),
                _ => None,
            };
            (p.id, irq)
        })
        .collect();
    let mut text = format!("IRQ handlers and softirqs over {:.1} s\n", window.seconds);
    text.push_str(&render(&reports));
    drop(session); // detach before printing

    let mut irq_reports = Vec::new();
    let mut softirqs = Vec::new();
    for ((id, irq), probe) in irqs.into_iter().zip(reports) {
        match irq {
            Some((irq, numbers)) => irq_reports.push(IrqReport {
                numbers,
                // The maps start at 0 when created: these are the counts since attach.
                cpus: per_cpu.get(&id).cloned().unwrap_or_default(),
                irq,
                probe,
            }),
            None => softirqs.push(probe),
        }
    }
    text.push_str(&cpu_table(&irq_reports));
    text.push_str(&overhead.render());
    if json_on_stdout {
        eprint!("{text}");
    } else {
        print!("{text}");
    }
    write_json_if(args.json.as_deref(), || Report {
        kernel: kernel.release(),
        window,
        patterns,
        irqs: irq_reports,
        softirqs,
        overhead,
    })?;
    Ok(())
}

/// `irq  name  cpu0 cpu1 ...`: where each IRQ's handlers ran.
fn cpu_table(irqs: &[IrqReport]) -> String {
    let ncpu = irqs.iter().map(|r| r.cpus.len()).max().unwrap_or(0);
    if ncpu == 0 {
        return String::new();
    }
    let mut out = format!(
        "\nCPU spread (handler runs per CPU since attach):\n  {:<28}",
        "irq"
    );
    for c in 0..ncpu {
        out.push_str(&format!(" {:>9}", format!("CPU{c}")));
    }
    out.push('\n');
    for r in irqs {
        let nums: Vec<String> = r.numbers.iter().map(u32::to_string).collect();
        out.push_str(&format!(
            "  {:<28}",
            format!("{} ({})", r.irq, nums.join(","))
        ));
        for c in 0..ncpu {
            out.push_str(&format!(" {:>9}", r.cpus.get(c).copied().unwrap_or(0)));
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_probe_per_matching_irq_name_then_softirqs() {
        let irqs = vec![
            (28, "virtio0-config".to_owned()),
            (38, "virtio2-input.0".to_owned()),
            (39, "virtio2-output.0".to_owned()),
            (50, "mlx5_comp0@pci:0000:3b:00.0".to_owned()),
            (51, "mlx5_comp0@pci:0000:3b:00.0".to_owned()),
        ];
        let defs = irq_probes(&irqs, &default_patterns());
        let names: Vec<&str> = defs.iter().map(|d| d.name.as_ref()).collect();
        assert_eq!(
            names,
            [
                "irq virtio2-input.0",
                "irq virtio2-output.0",
                "irq mlx5_comp0@pci:0000:3b:00.0",
                "NET_RX",
                "TASKLET"
            ]
        );
        let only = irq_probes(&irqs, &["virtio0-*".to_owned()]);
        assert_eq!(only.len(), 3);
        assert!(
            matches!(&only[0].shape, Shape::Irq { patterns } if patterns.iter().eq(["virtio0-config"]))
        );
        assert!(matches!(only[1].shape, Shape::Softirq { vector: 3 }));
    }

    #[test]
    fn default_patterns_cover_the_hardware_drivers_completion_vectors() {
        let irqs: Vec<(u32, String)> = [
            "irdma-0000:3b:00.0-CEQ-1",
            "irdma-0000:3b:00.0-AEQCEQ-0",
            "irdma-0000:3b:00.0-AEQ",
            "CEQ",
            "bnxt_re-nq-0@pci:0000:3b:00.0",
            "mana_q0@pci:7870:00:00.0",
            "mlx5_sf_comp0@pci:0000:3b:00.0",
            "timer",
        ]
        .iter()
        .enumerate()
        .map(|(i, n)| (i as u32 + 100, n.to_string()))
        .collect();
        let defs = irq_probes(&irqs, &default_patterns());
        assert_eq!(defs.len(), 7 + 2, "seven driver IRQs and NET_RX/TASKLET");
        assert!(defs.iter().all(|d| d.name != "irq timer"));
    }

    #[test]
    fn cpu_table_lists_every_cpu() {
        let r = IrqReport {
            numbers: vec![38],
            cpus: vec![0, 42],
            irq: "virtio2-input.0".to_owned(),
            probe: crate::views::tui::app::tests::report("irq virtio2-input.0", 42, false),
        };
        let t = cpu_table(&[r]);
        assert!(t.contains("CPU0") && t.contains("CPU1"), "{t}");
        assert!(
            t.contains("virtio2-input.0 (38)") && t.contains("42"),
            "{t}"
        );
    }
}

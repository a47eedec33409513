//! `rdma-trace probes`: the probe table with this kernel's decision per row (attach method, or
//! why not), without attaching. `--check` attaches the planned rows for real, one driver path at
//! a time (the eBPF object has 16 kernel-function slots), and reports what the kernel accepted.

use std::{borrow::Cow, collections::HashMap};

use anyhow::{Result, bail};
use serde::Serialize;

use crate::{
    bpf::loader::{Bpf, Outcome},
    kernel::facts::Kernel,
    kernel::plan::{self, Decision, Facts, Options, PlannedProbe},
    kernel::probes::{Driver, PROBES, ProbeDef, Shape},
};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Only the rows of this driver path: generic, mlx5, irdma, bnxt_re, mana, rxe, network.
    #[arg(long, value_parser = parse_driver)]
    pub driver: Option<Driver>,
    /// Keep the rows of drivers without a device here (their functions must still exist).
    #[arg(long)]
    pub all_drivers: bool,
    /// Also write the listing as JSON (one object: kernel, devices, rows) to this file (`-`:
    /// to stdout, instead of the table).
    #[arg(long, value_name = "PATH")]
    pub json: Option<std::path::PathBuf>,
    /// Attach every planned row for real (root; one driver path at a time) and report the
    /// outcome. Exits 1 when a planned row fails to attach.
    #[arg(long)]
    pub check: bool,
}

fn parse_driver(s: &str) -> Result<Driver, String> {
    Driver::from_name(s).ok_or_else(|| {
        let names: Vec<&str> = Driver::ALL.iter().map(|d| d.name()).collect();
        format!("unknown driver `{s}`; use one of {}", names.join(", "))
    })
}

/// One row of the listing.
#[derive(Debug, Serialize)]
pub struct Row {
    pub name: Cow<'static, str>,
    pub driver: &'static str,
    /// The smallest `run --probes` preset that attaches the row (`minimal` ⊂ `default` ⊂
    /// `full`).
    pub preset: &'static str,
    pub what: &'static str,
    /// Kernel functions the row attaches to.
    pub functions: Vec<Cow<'static, str>>,
    /// The module that holds them (null: vmlinux, or not a function).
    pub module: Option<&'static str>,
    /// `/proc/interrupts` names (IRQ rows).
    pub irq_patterns: Vec<String>,
    /// Planned methods, in order of preference (empty when skipped).
    pub methods: Vec<&'static str>,
    /// Why not, when skipped: a stable `kind` and the line users read.
    pub skipped: Option<Skipped>,
    pub zero_note: Option<&'static str>,
    /// With `--check`: the method that attached, or the kernel's refusal.
    pub check: Option<Check>,
}

#[derive(Debug, Serialize)]
pub struct Skipped {
    pub kind: &'static str,
    /// A fact of this kernel's build: inlined, notrace, blacklisted, not in this version.
    pub kernel_fact: bool,
    pub reason: String,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Check {
    Attached(&'static str),
    Failed(String),
}

#[derive(Debug, Serialize)]
pub struct Listing {
    pub kernel: Option<String>,
    pub kprobes: bool,
    pub btf: bool,
    /// RDMA devices and the driver path each one selects.
    pub devices: Vec<(String, Option<&'static str>)>,
    pub rows: Vec<Row>,
}

pub async fn run(args: &Args) -> Result<()> {
    let kernel = Kernel::live();
    let defs: Vec<ProbeDef> = PROBES
        .iter()
        .filter(|p| args.driver.is_none_or(|d| p.driver == d))
        .cloned()
        .collect();
    let opts = Options {
        all_drivers: args.all_drivers || args.driver.is_some(),
        uprobes: false,
    };
    if let Some(path) = &args.json {
        crate::output::check_writable(path)?;
    }
    let facts = Facts::gather(&kernel, &defs);
    let mut listing = list(&defs, &facts, opts);
    if args.check {
        check(&defs, &facts, opts, &mut listing.rows)?;
    }
    // `--json -`: the JSON alone on stdout.
    if args.json.as_deref() != Some(std::path::Path::new("-")) {
        print!("{}", text(&listing));
    }
    if let Some(path) = &args.json {
        crate::output::write_json(path, &listing)?;
    }
    let failed: Vec<String> = listing
        .rows
        .iter()
        .filter_map(|r| match &r.check {
            Some(Check::Failed(why)) => Some(format!("{}: {why}", r.name)),
            _ => None,
        })
        .collect();
    if !failed.is_empty() {
        bail!(
            "{} planned probe(s) did not attach: {}",
            failed.len(),
            failed.join("; ")
        );
    }
    Ok(())
}

/// The rows of `defs` planned one driver path at a time, in table order: the eBPF object's
/// per-run limits (kernel-function slots) apply to one run, not to the whole table.
fn plan_by_driver(defs: &[ProbeDef], facts: &Facts, opts: Options) -> Vec<PlannedProbe> {
    let mut rows: Vec<PlannedProbe> = Driver::ALL
        .into_iter()
        .flat_map(|d| {
            let group: Vec<ProbeDef> = defs.iter().filter(|p| p.driver == d).cloned().collect();
            plan::plan(&group, facts, opts).probes
        })
        .collect();
    let index = |p: &PlannedProbe| defs.iter().position(|d| d.name == p.def.name);
    rows.sort_by_key(index);
    rows
}

/// The listing of `defs` on a kernel described by `facts`: nothing is attached.
pub fn list(defs: &[ProbeDef], facts: &Facts, opts: Options) -> Listing {
    Listing {
        kernel: facts.release.clone(),
        kprobes: facts.kprobes,
        btf: facts.btf,
        devices: facts
            .devices
            .iter()
            .map(|d| {
                let path = if d.is_rxe() {
                    Some(Driver::Rxe.name())
                } else {
                    d.hardware().map(Driver::name)
                };
                (d.name.clone(), path)
            })
            .collect(),
        rows: plan_by_driver(defs, facts, opts).iter().map(row).collect(),
    }
}

fn row(p: &PlannedProbe) -> Row {
    let (methods, skipped) = match &p.decision {
        Decision::Try(m) => (m.iter().map(|m| m.label()).collect(), None),
        Decision::Skip(why) => (
            Vec::new(),
            Some(Skipped {
                kind: why.kind(),
                kernel_fact: why.is_kernel_fact(),
                reason: why.to_string(),
            }),
        ),
    };
    Row {
        name: p.def.name.clone(),
        driver: p.def.driver.name(),
        preset: p.def.preset.name(),
        what: p.def.what,
        functions: plan::functions_of(&p.def.shape),
        module: p.def.module,
        irq_patterns: match &p.def.shape {
            Shape::Irq { patterns } => patterns.iter().map(str::to_owned).collect(),
            _ => Vec::new(),
        },
        methods,
        skipped,
        zero_note: p.def.zero_note,
        check: None,
    }
}

/// Attach the planned rows of each driver path in turn and record the outcome per row.
fn check(defs: &[ProbeDef], facts: &Facts, opts: Options, rows: &mut [Row]) -> Result<()> {
    let mut outcomes: HashMap<Cow<'static, str>, Outcome> = HashMap::new();
    for driver in Driver::ALL {
        let group: Vec<ProbeDef> = defs
            .iter()
            .filter(|p| p.driver == driver)
            .cloned()
            .collect();
        let plan = plan::plan(&group, facts, opts);
        if !plan
            .probes
            .iter()
            .any(|p| matches!(p.decision, Decision::Try(_)))
        {
            continue;
        }
        let mut bpf = Bpf::load(&plan)?;
        let got = bpf.attach(&plan)?;
        for (p, o) in plan.probes.iter().zip(got) {
            if matches!(p.decision, Decision::Try(_)) {
                outcomes.insert(p.def.name.clone(), o);
            }
        }
        // Dropping `bpf` detaches this group before the next one loads.
    }
    for r in rows.iter_mut() {
        r.check = outcomes.remove(r.name.as_ref()).map(|o| match o {
            Outcome::Attached(m) => Check::Attached(m.label()),
            Outcome::Skipped(why) => Check::Failed(why.to_string()),
        });
    }
    Ok(())
}

fn text(l: &Listing) -> String {
    let yes = |b: bool| if b { "yes" } else { "no" };
    let devices = if l.devices.is_empty() {
        "none".to_owned()
    } else {
        l.devices
            .iter()
            .map(|(name, path)| format!("{name} ({})", path.unwrap_or("unknown driver")))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut out = format!(
        "kernel {}: kprobes {}, BTF {}; RDMA devices: {devices}\n",
        l.kernel.as_deref().unwrap_or("unknown"),
        yes(l.kprobes),
        yes(l.btf)
    );
    out.push_str(&format!(
        "{:<26} {:<8} {:<8} DECISION\n",
        "PROBE", "DRIVER", "PRESET"
    ));
    for r in &l.rows {
        let decision = match (&r.skipped, &r.check) {
            (Some(s), _) => format!("skip ({}): {}", s.kind, s.reason),
            (None, Some(Check::Attached(m))) => format!("attached by {m}"),
            (None, Some(Check::Failed(why))) => format!("FAILED to attach: {why}"),
            (None, None) => r.methods.join(" or "),
        };
        out.push_str(&format!(
            "{:<26} {:<8} {:<8} {decision}\n",
            r.name, r.driver, r.preset
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::plan::fixture_facts as facts;

    #[test]
    fn listing_shows_methods_and_typed_reasons() {
        let l = list(PROBES, &facts("guest-6.1-rxe"), Options::default());
        let r = |n: &str| l.rows.iter().find(|r| r.name == n).unwrap();
        assert_eq!(r("rxe_cq_post").methods, ["kprobe"]);
        assert_eq!(r("rxe_cq_post").module, Some("rdma_rxe"));
        let s = r("mlx5_ib_cq_comp").skipped.as_ref().unwrap();
        assert_eq!((s.kind, s.kernel_fact), ("no_device", false));
        assert_eq!(l.devices[0], ("rxe0".to_owned(), Some("rxe")));
        // Each row names its smallest preset, in the text as a column.
        for def in PROBES {
            assert_eq!(r(&def.name).preset, def.preset.name(), "{}", def.name);
        }
        assert_eq!(r("rxe_cq_post").preset, "minimal");
        assert_eq!(r("rxe_rcv").preset, "full");
        let t = text(&l);
        assert!(
            t.contains("rxe_cq_post") && t.contains("skip (no_device)"),
            "{t}"
        );
        let line = |n: &str| t.lines().find(|l| l.starts_with(n)).unwrap().to_owned();
        assert!(t.lines().nth(1).unwrap().contains(" PRESET "), "{t}");
        assert!(line("rxe_cq_post ").contains(" minimal "), "{t}");
        assert!(line("softirq NET_RX ").contains(" full "), "{t}");
        let json = serde_json::to_value(&l).unwrap();
        assert_eq!(json["rows"][0]["name"], "ib_uverbs_comp_handler");
        assert!(json["rows"][0]["check"].is_null());
    }

    #[test]
    fn all_drivers_plans_each_driver_path_on_its_own_slots() {
        let opts = Options {
            all_drivers: true,
            uprobes: false,
        };
        // A 6.12 kernel with every driver loaded (as in the guest test): one plan of the whole
        // table would run out of the 16 kernel-function slots.
        let mut f = facts("mana-6.12");
        for other in ["mlx5-6.12", "irdma-6.12", "bnxt_re-6.12"] {
            let o = facts(other);
            f.symbols.extend(o.symbols);
            f.modules.as_mut().unwrap().extend(o.modules.unwrap());
        }
        let whole = plan::plan(PROBES, &f, opts);
        assert!(
            whole
                .probes
                .iter()
                .any(|p| matches!(&p.decision, Decision::Skip(w) if w.kind() == "limit"))
        );
        let l = list(PROBES, &f, opts);
        assert_eq!(l.rows.len(), PROBES.len());
        for (r, def) in l.rows.iter().zip(PROBES) {
            assert_eq!(r.name, def.name, "table order");
            assert!(
                r.skipped.as_ref().is_none_or(|s| s.kind != "limit"),
                "{}",
                r.name
            );
        }
        let r = |n: &str| l.rows.iter().find(|r| r.name == n).unwrap();
        assert_eq!(r("mana_ib_cq_handler").methods, ["kprobe"]);
        assert_eq!(
            r("mana_ib_poll_cq").skipped.as_ref().unwrap().kind,
            "not_in_version"
        );
        assert_eq!(r("mlx5_ib_cq_comp").methods, ["kprobe"]);
        assert_eq!(
            r("irdma_iwarp_ce_handler").skipped.as_ref().unwrap().kind,
            "inlined"
        );
    }

    #[test]
    fn driver_names_parse_and_unknown_ones_list_the_choices() {
        assert_eq!(parse_driver("bnxt_re"), Ok(Driver::BnxtRe));
        let e = parse_driver("mlx4").unwrap_err();
        assert!(e.contains("mlx5") && e.contains("mana"), "{e}");
    }
}

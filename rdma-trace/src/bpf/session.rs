//! A tracing session: facts → plan → load → attach, then snapshots until it is dropped.
//!
//! Dropping the session drops the eBPF object, which detaches every program: no probe outlives
//! the process, whatever path it exits by.

use std::collections::HashMap;

use anyhow::{Result, anyhow};

use crate::{
    bpf::loader::{Bpf, ObjectConfig, Outcome, ProbeData, SharedHook},
    error::Unsupported,
    kernel::facts::Kernel,
    kernel::plan::{self, Options, Plan},
    kernel::probes::ProbeDef,
};

pub struct Session {
    pub plan: Plan,
    pub outcomes: Vec<Outcome>,
    bpf: Bpf,
}

impl Session {
    /// Attach every probe of `defs` that this kernel allows. Fails when none attaches.
    pub fn start(kernel: &Kernel, defs: &[ProbeDef], opts: Options) -> Result<Self> {
        Self::start_with(kernel, defs, opts, &ObjectConfig::default())
    }

    /// [`Session::start`] with the object configuration of the features above (`config`).
    pub fn start_with(
        kernel: &Kernel,
        defs: &[ProbeDef],
        opts: Options,
        config: &ObjectConfig,
    ) -> Result<Self> {
        let plan = plan::plan_to_attach(kernel, defs, opts);
        crate::startup::step("kernel facts and plan");
        if plan.fentry_first() {
            crate::bpf::loader::prefetch_kernel_btf();
        }
        let mut bpf = Bpf::load_with(&plan, config)?;
        crate::startup::step("object and maps");
        let outcomes = bpf.attach(&plan)?;
        crate::startup::step("attach");
        if !outcomes.iter().any(|o| matches!(o, Outcome::Attached(_))) {
            let reasons: Vec<String> = plan
                .probes
                .iter()
                .zip(&outcomes)
                .map(|(p, o)| match o {
                    Outcome::Skipped(why) => format!("{}: {why}", p.def.name),
                    Outcome::Attached(_) => unreachable!(),
                })
                .collect();
            return Err(anyhow!(Unsupported(format!(
                "no probe could be attached ({})",
                reasons.join("; ")
            ))));
        }
        let session = Self {
            plan,
            outcomes,
            bpf,
        };
        // A stop signal while attaching (it can take seconds): detach again before going on.
        crate::signals::check()?;
        Ok(session)
    }

    /// Ids of the attached probes.
    pub fn attached_ids(&self) -> Vec<u32> {
        self.plan
            .probes
            .iter()
            .zip(&self.outcomes)
            .filter(|(_, o)| matches!(o, Outcome::Attached(_)))
            .map(|(p, _)| p.id)
            .collect()
    }

    /// The loaded object (workload maps, timeline ring buffer, extra programs).
    pub fn bpf(&self) -> &Bpf {
        &self.bpf
    }

    pub fn bpf_mut(&mut self) -> &mut Bpf {
        &mut self.bpf
    }

    /// Let the user-space probes count process `pid` (e.g. the demo, once spawned).
    pub fn watch_pid(&self, pid: u32) -> Result<()> {
        self.bpf.watch_pid(pid)
    }

    /// Current counters and histograms of every attached probe.
    pub fn snapshot(&self) -> Result<HashMap<u32, ProbeData>> {
        self.bpf.read(&self.attached_ids())
    }

    /// Detach every probe and return the final counters and histograms, read consistently.
    pub fn finish(&mut self) -> Result<HashMap<u32, ProbeData>> {
        self.bpf.detach_all();
        self.snapshot()
    }

    /// Run count and time of every attached eBPF program, and how run-time stats were enabled.
    pub fn program_stats(&self) -> (Vec<crate::bpf::stats::ProgramStat>, &str) {
        (self.bpf.program_stats(), self.bpf.stats_how())
    }

    /// What each attach mechanism costs per hit, measured with the object's empty programs.
    pub fn calibrate(&mut self) -> crate::bpf::calibrate::Calibration {
        let fentry = self
            .outcomes
            .contains(&Outcome::Attached(crate::kernel::probes::Method::Fentry));
        crate::bpf::calibrate::run(self.bpf.ebpf_mut(), fentry)
    }

    /// Detach the programs named, keeping the rest (`--overhead-budget ... --enforce`).
    pub fn drop_programs(&mut self, names: &[String]) {
        self.bpf.drop_programs(names);
    }

    /// Events of every attached probe, per CPU.
    pub fn events_per_cpu(&self) -> Result<HashMap<u32, Vec<u64>>> {
        self.bpf.events_per_cpu(&self.attached_ids())
    }

    /// The hooks of probe `p`'s functions that a feature's programs serve for it.
    pub fn shared_hooks_of(&self, p: &crate::kernel::plan::PlannedProbe) -> Vec<SharedHook> {
        let functions = p.def.shape.functions();
        self.bpf
            .shared_hooks()
            .into_iter()
            .filter(|h| functions.contains(&h.function))
            .collect()
    }

    /// Once a feature's programs have attached (`served`: whether they run on a function),
    /// the shared hooks they do not serve get the table's own programs; a row for which that
    /// fails is skipped, with why.
    pub fn settle_shared(&mut self, served: impl Fn(&str) -> bool) {
        for (function, why) in self.bpf.attach_unshared(served) {
            for (p, o) in self.plan.probes.iter().zip(self.outcomes.iter_mut()) {
                if p.def.shape.functions().contains(&function) {
                    *o = Outcome::Skipped(crate::bpf::loader::NotAttached::Refused(why.clone()));
                }
            }
        }
    }

    /// The attach table: probe, how, or why not.
    /// The attached rows, one a line, and one line for every skipped row (grouped by reason).
    pub fn attach_table(&self) -> String {
        let mut out = String::new();
        let mut skipped = Vec::new();
        for (p, o) in self.plan.probes.iter().zip(&self.outcomes) {
            match o {
                Outcome::Attached(m) => out.push_str(&format!(
                    "  {:<24} {:<8} {}{}\n",
                    p.def.name,
                    m.label(),
                    p.def.what,
                    if self.shared_hooks_of(p).is_empty() {
                        ""
                    } else {
                        " (timed by the waterfall's programs on the same hooks)"
                    }
                )),
                Outcome::Skipped(why) => skipped.push((why.kind(), p.def.driver.name())),
            }
        }
        if let Some(line) = crate::bpf::loader::skipped_line(&skipped) {
            out.push_str(&format!("  {line}\n"));
        }
        out
    }
}

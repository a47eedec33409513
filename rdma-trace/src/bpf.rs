//! Loading the embedded eBPF object for a [`Plan`], attaching with fallback, reading the maps.
//!
//! Probes stay attached while the [`Bpf`] value lives: dropping it detaches everything.

use std::collections::HashMap;

use anyhow::{Context as _, Result, anyhow};
use aya::{
    Btf, Ebpf, EbpfLoader,
    maps::{HashMap as BpfHashMap, MapData, PerCpuArray},
    programs::{FEntry, FExit, KProbe, RawTracePoint},
};
use rdma_trace_common::{HIST_SLOTS, MAX_PROBES, NO_PROBE, NR_COUNTERS, counter_index, hist_index};

use crate::{
    error::Unsupported,
    hist::Histogram,
    plan::{Decision, Plan},
    probes::{Method, Shape},
};

/// The eBPF object built by `cargo xtask build-ebpf` (see build.rs).
static OBJECT: &[u8] = aya::include_bytes_aligned!(env!("RDMA_TRACE_EBPF_OBJECT"));

pub struct Bpf {
    ebpf: Ebpf,
}

/// How one probe ended up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Attached(Method),
    Skipped(String),
}

/// Counters and histogram of one probe at one moment.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProbeData {
    /// C_EVENTS, C_RECORDED, C_UNMATCHED.
    pub counters: [u64; NR_COUNTERS as usize],
    pub hist: Histogram,
}

impl Bpf {
    /// Load the object with the plan's configuration (creates the maps; programs are loaded
    /// when attached).
    pub fn load(plan: &Plan) -> Result<Self> {
        raise_memlock();
        let kslots = plan.kslots();
        let ebpf = EbpfLoader::new()
            .override_global("KSLOTS", &kslots, true)
            .override_global("SOFTIRQ_PROBE", &plan.softirq_probe, true)
            .override_global("NAPI_PROBE", &plan.napi_probe, true)
            .override_global("INTERVAL_PROBE", &plan.interval_probe, true)
            .load(OBJECT)
            .map_err(|e| {
                let text = chain(&e);
                if text.contains("Operation not permitted") {
                    anyhow!(Unsupported(format!(
                        "the kernel refused to create eBPF maps ({text}): run as root (CAP_BPF and CAP_PERFMON)"
                    )))
                } else {
                    anyhow!("loading the eBPF object: {text}")
                }
            })?;
        Ok(Self { ebpf })
    }

    /// Attach what the plan asks for, each kernel function by its first method that works.
    /// Returns the outcome of every planned probe, by probe id.
    pub fn attach(&mut self, plan: &Plan) -> Result<Vec<Outcome>> {
        let mut btf: Option<Btf> = None;
        let mut slot_outcome = Vec::new();
        for (slot, f) in plan.functions.iter().enumerate() {
            let mut errors = Vec::new();
            let mut done = None;
            for &method in &f.methods {
                let r = match method {
                    Method::Kprobe => self.attach_kprobe_pair(slot, f.function),
                    Method::Fentry => self.attach_fentry_pair(slot, f.function, &mut btf),
                    Method::RawTracepoint => Err(anyhow!("not a tracepoint")),
                };
                match r {
                    Ok(()) => {
                        done = Some(method);
                        break;
                    }
                    Err(e) => errors.push(format!("{}: {e:#}", method.label())),
                }
            }
            slot_outcome.push(match done {
                Some(m) => Outcome::Attached(m),
                None => Outcome::Skipped(errors.join("; ")),
            });
        }
        let softirq = plan.wants(|s| matches!(s, Shape::Softirq { .. })).then(|| {
            self.attach_raw_tracepoints(&[
                ("softirq_entry", "softirq_entry"),
                ("softirq_exit", "softirq_exit"),
            ])
        });
        let napi = (plan.napi_probe != NO_PROBE)
            .then(|| self.attach_raw_tracepoints(&[("napi_poll", "napi_poll")]));
        let irq_map = plan.irq_map();
        let irq = (!irq_map.is_empty()).then(|| match self.fill_irq_map(&irq_map) {
            Ok(()) => self.attach_raw_tracepoints(&[
                ("irq_handler_entry", "irq_handler_entry"),
                ("irq_handler_exit", "irq_handler_exit"),
            ]),
            Err(e) => Outcome::Skipped(format!("{e:#}")),
        });

        let slot_of = |function: &str| plan.functions.iter().position(|f| f.function == function);
        Ok(plan
            .probes
            .iter()
            .map(|p| {
                if let Decision::Skip(why) = &p.decision {
                    return Outcome::Skipped(why.clone());
                }
                let from_slot = |f: &str| slot_of(f).map(|i| slot_outcome[i].clone());
                let o = match p.def.shape {
                    Shape::Duration { function } => from_slot(function),
                    Shape::Interval { from, to } => match (from_slot(from), from_slot(to)) {
                        (Some(Outcome::Attached(m)), Some(Outcome::Attached(_))) => {
                            Some(Outcome::Attached(m))
                        }
                        (Some(Outcome::Skipped(w)), _) | (_, Some(Outcome::Skipped(w))) => {
                            Some(Outcome::Skipped(w))
                        }
                        _ => None,
                    },
                    Shape::Softirq { .. } => softirq.clone(),
                    Shape::NapiPoll => napi.clone(),
                    Shape::Irq { .. } => irq.clone(),
                };
                o.unwrap_or_else(|| Outcome::Skipped("not planned".to_owned()))
            })
            .collect())
    }

    fn attach_kprobe_pair(&mut self, slot: usize, function: &str) -> Result<()> {
        let entry = self.kprobe(&format!("kentry_{slot}"), function)?;
        if let Err(e) = self.kprobe(&format!("kreturn_{slot}"), function) {
            let p: &mut KProbe = self.program(&format!("kentry_{slot}"))?;
            let _ = p.detach(entry);
            return Err(e);
        }
        Ok(())
    }

    fn kprobe(
        &mut self,
        prog: &str,
        function: &str,
    ) -> Result<aya::programs::kprobe::KProbeLinkId> {
        let p: &mut KProbe = self.program(prog)?;
        p.load()
            .map_err(|e| anyhow!("loading {prog}: {}", chain(&e)))?;
        p.attach(function, 0)
            .map_err(|e| anyhow!("attaching {prog} to {function}: {}", chain(&e)))
    }

    fn attach_fentry_pair(
        &mut self,
        slot: usize,
        function: &str,
        btf: &mut Option<Btf>,
    ) -> Result<()> {
        if btf.is_none() {
            *btf =
                Some(Btf::from_sys_fs().map_err(|e| anyhow!("reading kernel BTF: {}", chain(&e)))?);
        }
        let btf = btf.as_ref().expect("set above");
        let entry = format!("fentry_{slot}");
        let p: &mut FEntry = self.program(&entry)?;
        p.load(function, btf)
            .map_err(|e| anyhow!("loading {entry} for {function}: {}", chain(&e)))?;
        let link = p
            .attach()
            .map_err(|e| anyhow!("attaching {entry}: {}", chain(&e)))?;
        let exit = format!("fexit_{slot}");
        let r = (|| -> Result<()> {
            let p: &mut FExit = self.program(&exit)?;
            p.load(function, btf)
                .map_err(|e| anyhow!("loading {exit} for {function}: {}", chain(&e)))?;
            p.attach()
                .map_err(|e| anyhow!("attaching {exit}: {}", chain(&e)))?;
            Ok(())
        })();
        if r.is_err() {
            let p: &mut FEntry = self.program(&entry)?;
            let _ = p.detach(link);
        }
        r
    }

    /// Attach programs to raw tracepoints, all or nothing as far as the outcome goes.
    fn attach_raw_tracepoints(&mut self, progs: &[(&str, &str)]) -> Outcome {
        for (prog, tp) in progs {
            if let Err(e) = self.attach_raw_tracepoint(prog, tp) {
                return Outcome::Skipped(format!("{e:#}"));
            }
        }
        Outcome::Attached(Method::RawTracepoint)
    }

    fn attach_raw_tracepoint(&mut self, prog: &str, name: &str) -> Result<()> {
        let p: &mut RawTracePoint = self.program(prog)?;
        p.load()
            .map_err(|e| anyhow!("loading {prog}: {}", chain(&e)))?;
        p.attach(name)
            .map_err(|e| anyhow!("attaching {prog} to raw tracepoint {name}: {}", chain(&e)))?;
        Ok(())
    }

    fn program<'a, T>(&'a mut self, name: &str) -> Result<&'a mut T>
    where
        &'a mut T: TryFrom<&'a mut aya::programs::Program, Error = aya::programs::ProgramError>,
    {
        let p = self
            .ebpf
            .program_mut(name)
            .with_context(|| format!("program {name} is not in the eBPF object"))?;
        p.try_into()
            .map_err(|e| anyhow!("program {name}: {}", chain(&e)))
    }

    fn fill_irq_map(&mut self, irqs: &[(u32, u32)]) -> Result<()> {
        let mut map: BpfHashMap<&mut MapData, u32, u32> = BpfHashMap::try_from(
            self.ebpf
                .map_mut("IRQ_PROBE")
                .context("map IRQ_PROBE is not in the eBPF object")?,
        )?;
        for &(irq, probe) in irqs {
            map.insert(irq, probe, 0)
                .map_err(|e| anyhow!("configuring IRQ {irq}: {}", chain(&e)))?;
        }
        Ok(())
    }

    /// Detach and unload every program, keeping the maps: a read after this is a consistent
    /// final snapshot (no event lands between reading the counters and the histograms).
    pub fn detach_all(&mut self) {
        use aya::programs::Program;
        for (_, p) in self.ebpf.programs_mut() {
            let _ = match p {
                Program::KProbe(p) => p.unload(),
                Program::UProbe(p) => p.unload(),
                Program::RawTracePoint(p) => p.unload(),
                Program::TracePoint(p) => p.unload(),
                Program::FEntry(p) => p.unload(),
                Program::FExit(p) => p.unload(),
                _ => Ok(()),
            };
        }
    }

    /// Counters and histograms of probes `ids`, summed over CPUs.
    pub fn read(&self, ids: &[u32]) -> Result<HashMap<u32, ProbeData>> {
        let counts = self.per_cpu("COUNTS")?;
        let hist = self.per_cpu("HIST")?;
        let sum = |map: &PerCpuArray<&MapData, u64>, i: u32| -> Result<u64> {
            Ok(map
                .get(&i, 0)
                .map_err(|e| anyhow!("reading map index {i}: {}", chain(&e)))?
                .iter()
                .sum())
        };
        let mut out = HashMap::new();
        for &id in ids.iter().filter(|&&id| id < MAX_PROBES) {
            let mut data = ProbeData::default();
            for (c, v) in data.counters.iter_mut().enumerate() {
                *v = sum(&counts, counter_index(id, c as u32))?;
            }
            // A probe that recorded nothing has an empty histogram: skip its slots.
            if data.counters[rdma_trace_common::C_RECORDED as usize] > 0 {
                let slots = (0..HIST_SLOTS)
                    .map(|s| sum(&hist, hist_index(id, s)))
                    .collect::<Result<Vec<_>>>()?;
                data.hist = Histogram::from_slots(slots);
            }
            out.insert(id, data);
        }
        Ok(out)
    }

    fn per_cpu(&self, name: &str) -> Result<PerCpuArray<&MapData, u64>> {
        let m = self
            .ebpf
            .map(name)
            .with_context(|| format!("map {name} is not in the eBPF object"))?;
        PerCpuArray::try_from(m).with_context(|| format!("map {name} is not a per-CPU array"))
    }
}

/// Kernels before 5.11 charge BPF memory to RLIMIT_MEMLOCK; later ones use memcg and ignore it.
fn raise_memlock() {
    let rlim = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: setrlimit reads the struct we pass and has no other preconditions; failure
    // (e.g. EPERM without CAP_SYS_RESOURCE) is harmless on memcg-accounted kernels.
    let _ = unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &rlim) };
}

/// An error and its sources on one line (aya nests io errors and verifier logs).
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let t = c.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        cur = c.source();
    }
    s
}

//! Loading the embedded eBPF object for a [`Plan`], attaching with fallback, reading the maps.
//!
//! Probes stay attached while the [`Bpf`] value lives: dropping it detaches everything.

use std::{
    cell::RefCell,
    collections::HashMap,
    fmt,
    sync::{Mutex, OnceLock},
    thread::JoinHandle,
};

use anyhow::{Context as _, Result, anyhow};
use aya::{
    Btf, Ebpf, EbpfLoader,
    maps::{HashMap as BpfHashMap, MapData, PerCpuArray},
    programs::{
        FEntry, FExit, KProbe, RawTracePoint, UProbe,
        uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeScope},
    },
};
use rdma_trace_common::{
    C_EVENTS, C_RECORDED, HIST_SLOTS, MAX_PROBES, NO_PROBE, NR_COUNTERS, ProbeRow,
};

use crate::{
    bpf::hist::Histogram,
    bpf::stats::{ProgramStat, RunTimeStats},
    error::{Unsupported, chain},
    kernel::plan::{Decision, FunctionSlot, Plan, SkipReason},
    kernel::probes::{Method, Shape},
};

/// The eBPF object built by `cargo xtask build-ebpf` (see build.rs).
pub(crate) static OBJECT: &[u8] = aya::include_bytes_aligned!(env!("RDMA_TRACE_EBPF_OBJECT"));

pub struct Bpf {
    ebpf: Ebpf,
    /// (program, what it is attached to), in attach order.
    attached: Vec<(String, String)>,
    /// BPF run-time statistics stay on while the object lives.
    stats: RunTimeStats,
    /// `uentry`/`ureturn` are loaded (once; then attached once per user-space probe).
    uprobes_loaded: bool,
    /// Processes the user-space probes count (taken out of the object so that `&self` can
    /// add the demo's pid while snapshots borrow the session).
    tgids: RefCell<BpfHashMap<MapData, u32, u8>>,
    /// Reads the programs' rare-event messages (with -v or RUST_LOG).
    _log: Option<crate::bpf::log::Reader>,
    /// The kernel-function slots whose hooks a feature's programs share ([`SharedHook`]), with
    /// the hook: the table attaches only the parts those programs do not do.
    shared: Vec<(usize, SharedHook)>,
}

/// How one probe ended up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Attached(Method),
    Skipped(NotAttached),
}

/// Why a probe is not attached; users read the `Display` line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NotAttached {
    /// The plan skipped it.
    Planned(SkipReason),
    /// The kernel or the loader refused every method tried: what they said.
    Refused(String),
    /// The plan holds nothing that attaches it.
    NotPlanned,
}

impl NotAttached {
    /// A stable name of the reason (`no_device`, `inlined`, ...; `rdma-trace probes` lists them).
    pub fn kind(&self) -> &'static str {
        match self {
            NotAttached::Planned(why) => why.kind(),
            NotAttached::Refused(_) => "refused",
            NotAttached::NotPlanned => "not_planned",
        }
    }
}

/// One line for every skipped row: `(reason kind, driver)` per row, grouped by reason, the
/// drivers of the `no_device` rows named. `None` when nothing was skipped.
pub fn skipped_line(rows: &[(&'static str, &'static str)]) -> Option<String> {
    if rows.is_empty() {
        return None;
    }
    let mut kinds: Vec<(&str, usize, Vec<&str>)> = Vec::new();
    for &(kind, driver) in rows {
        match kinds.iter_mut().find(|(k, _, _)| *k == kind) {
            Some((_, n, drivers)) => {
                *n += 1;
                if !drivers.contains(&driver) {
                    drivers.push(driver);
                }
            }
            None => kinds.push((kind, 1, vec![driver])),
        }
    }
    let groups: Vec<String> = kinds
        .iter()
        .map(|(kind, n, drivers)| {
            if *kind == "no_device" {
                format!("{kind} ×{n} ({})", drivers.join(", "))
            } else {
                format!("{kind} ×{n}")
            }
        })
        .collect();
    Some(format!(
        "skipped {} rows: {} (`rdma-trace probes` gives each row's reason)",
        rows.len(),
        groups.join(", ")
    ))
}

impl fmt::Display for NotAttached {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotAttached::Planned(why) => why.fmt(f),
            NotAttached::Refused(what) => f.write_str(what),
            NotAttached::NotPlanned => f.write_str("not planned"),
        }
    }
}

/// Counters and histogram of one probe at one moment.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProbeData {
    /// C_EVENTS, C_RECORDED, C_UNMATCHED.
    pub counters: [u64; NR_COUNTERS as usize],
    pub hist: Histogram,
}

/// Root, or the capabilities eBPF tracing needs (CAP_BPF + CAP_PERFMON, or CAP_SYS_ADMIN).
pub fn check_privileges() -> Result<()> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let effective = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0);
    // Root-only where no mount point can be read and one refused us: a tracefs made readable
    // at /sys/kernel/tracing serves even though /sys/kernel/debug (0700) refuses.
    let tries: Vec<std::io::Result<()>> = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"]
        .iter()
        .map(|root| std::fs::read_dir(root).map(drop))
        .collect();
    let tracefs_denied = !tries.iter().any(Result::is_ok)
        && tries.iter().any(|t| {
            t.as_ref()
                .is_err_and(|e| e.kind() == std::io::ErrorKind::PermissionDenied)
        });
    let paranoid = std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
        .ok()
        .and_then(|v| v.trim().parse().ok());
    match missing_privilege(effective, tracefs_denied, paranoid) {
        None => Ok(()),
        Some(why) => Err(anyhow!(Unsupported(format!(
            "run {why}: run it with sudo, or give it the capabilities of docs/install.md"
        )))),
    }
}

/// Linux capability numbers (`linux/capability.h`).
const CAPABILITIES: [(u32, &str); 5] = [
    (2, "CAP_DAC_READ_SEARCH"),
    (21, "CAP_SYS_ADMIN"),
    (34, "CAP_SYSLOG"),
    (38, "CAP_PERFMON"),
    (39, "CAP_BPF"),
];

/// What keeps a process with `effective` capabilities (the `CapEff` mask) from tracing, in
/// words; `None` when nothing does. Root (`CAP_SYS_ADMIN`) may do everything; otherwise
/// `CAP_BPF` and `CAP_PERFMON` are needed, `CAP_DAC_READ_SEARCH` when tracefs is root-only
/// here (`tracefs_denied`: the tracepoints' formats and ids are read there), and
/// `kernel.perf_event_paranoid` at 2 or below: Debian's and Ubuntu's kernels refuse every
/// `perf_event_open` (kprobes, tracepoints) without `CAP_SYS_ADMIN` above 2, whatever else the
/// process holds.
fn missing_privilege(
    effective: u64,
    tracefs_denied: bool,
    paranoid: Option<i32>,
) -> Option<String> {
    let cap = |name: &str| {
        CAPABILITIES
            .iter()
            .find(|(_, n)| *n == name)
            .map_or(0, |(bit, _)| 1u64 << bit)
    };
    if effective & cap("CAP_SYS_ADMIN") != 0 {
        return None;
    }
    let mut needed = vec!["CAP_BPF", "CAP_PERFMON"];
    if tracefs_denied {
        needed.push("CAP_DAC_READ_SEARCH");
    }
    let missing: Vec<&str> = needed
        .into_iter()
        .filter(|n| effective & cap(n) == 0)
        .collect();
    if missing.is_empty() {
        return paranoid.filter(|&p| p > 2).map(|p| {
            format!(
                "needs CAP_SYS_ADMIN while kernel.perf_event_paranoid is {p} (above 2 this kernel \
                 opens no perf event, kprobes included, for CAP_PERFMON alone); set it to 2 \
                 (sysctl kernel.perf_event_paranoid=2)"
            )
        });
    }
    let held: Vec<&str> = CAPABILITIES
        .iter()
        .filter(|(bit, _)| effective & (1u64 << bit) != 0)
        .map(|(_, n)| *n)
        .collect();
    let tracefs = if missing.contains(&"CAP_DAC_READ_SEARCH") {
        " (tracefs is root-only here)"
    } else {
        ""
    };
    Some(format!(
        "needs {}{tracefs}; it holds {}",
        missing.join(" and "),
        if held.is_empty() {
            "none of them".to_owned()
        } else {
            held.join(", ")
        }
    ))
}

/// What a feature above the loader sets in the object before it is loaded: globals and map
/// sizes, by name (the workload filter and the timeline ring, `load::workload`). The loader
/// knows none of the features; the object's own values stand for whatever is not named.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ObjectConfig {
    pub globals: Vec<(&'static str, u32)>,
    /// Globals of other plain types, as their bytes ([`ObjectConfig::set_global`]).
    pub blobs: Vec<(&'static str, Vec<u8>)>,
    pub map_sizes: Vec<(&'static str, u32)>,
    /// Hooks a feature's programs share with the probe table.
    pub shared: Vec<SharedHook>,
}

impl ObjectConfig {
    /// Set global `name` of the object to `value` (a plain type of the same layout as the
    /// eBPF side's).
    pub fn set_global<T: aya::Pod>(&mut self, name: &'static str, value: &T) {
        // SAFETY: `aya::Pod` types are plain data with no padding bytes: every byte of `value`
        // is initialised, and the slice lives only for the copy.
        let bytes =
            unsafe { std::slice::from_raw_parts((value as *const T).cast::<u8>(), size_of::<T>()) };
        self.blobs.push((name, bytes.to_vec()));
    }
}

/// A kernel function that a feature's programs hook anyway, and that do the probe table's work
/// for the function's row as well: one program runs per hit where two would. The loader puts
/// the function's slot in the object's global `global` before load, attaches only the parts
/// (entry, return) that the feature's programs leave out, and attaches the rest itself when
/// the feature's programs do not attach after all ([`Bpf::attach_unshared`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct SharedHook {
    pub function: &'static str,
    /// The global that holds the slot (`u32`; out of range: not shared).
    #[serde(skip)]
    pub global: &'static str,
    /// Whether the feature's programs do the entry's work (a kprobe on the function).
    pub entry: bool,
    /// Whether they do the return's (a kretprobe).
    #[serde(rename = "return")]
    pub ret: bool,
}

/// The slots of `functions` whose hooks `hooks` share: a hooked function's slot where it is
/// attached with kprobes first, the only mechanism the sharing programs have.
fn shared_slots(functions: &[FunctionSlot], hooks: &[SharedHook]) -> Vec<(usize, SharedHook)> {
    hooks
        .iter()
        .filter_map(|h| {
            let slot = functions.iter().position(|f| {
                f.function == h.function && f.methods.first() == Some(&Method::Kprobe)
            })?;
            Some((slot, *h))
        })
        .collect()
}

impl Bpf {
    /// Load the object with the plan's configuration (creates the maps; programs are loaded
    /// when attached).
    pub fn load(plan: &Plan) -> Result<Self> {
        Self::load_with(plan, &ObjectConfig::default())
    }

    /// [`Bpf::load`], with the globals and map sizes that the features above set (`config`).
    pub fn load_with(plan: &Plan, config: &ObjectConfig) -> Result<Self> {
        let stats = RunTimeStats::enable();
        let kslots = plan.kslots();
        let log_level = crate::verbosity::level();
        let shared = shared_slots(&plan.functions, &config.shared);
        let shared_slots: Vec<(&str, u32)> = shared
            .iter()
            .map(|(slot, h)| (h.global, *slot as u32))
            .collect();
        let mut ebpf = load_object("the eBPF object", |l| {
            for (name, value) in config.globals.iter().chain(&shared_slots) {
                l.override_global(name, value, true);
            }
            for (name, bytes) in &config.blobs {
                l.override_global(name, bytes.as_slice(), true);
            }
            for (name, size) in &config.map_sizes {
                l.map_max_entries(name, *size);
            }
            l.override_global("KSLOTS", &kslots, true)
                .override_global("SOFTIRQ_PROBE", &plan.softirq_probe, true)
                .override_global("NAPI_PROBE", &plan.napi_probe, true)
                .override_global("CQ_WAKEUP_PROBE", &plan.cq_wakeup_probe, true)
                .override_global("CM_CONNECT_PROBE", &plan.cm_connect_probe, true)
                .override_global("NVME_IO_PROBE", &plan.nvme_io_probe, true)
                .override_global("NVMET_IO_PROBE", &plan.nvmet_io_probe, true)
                .override_global("INTERVAL_PROBE", &plan.interval_probe, true)
                .override_global(crate::bpf::log::LEVEL_GLOBAL, &log_level, false)
        })?;
        let tgids = ebpf
            .take_map("TGIDS")
            .context("map TGIDS is not in the eBPF object")?;
        let tgids =
            RefCell::new(BpfHashMap::try_from(tgids).context("map TGIDS is not a hash map")?);
        let names = crate::bpf::log::Names {
            slots: plan
                .functions
                .iter()
                .map(|f| f.function.to_string())
                .collect(),
            intervals: plan
                .interval_probe
                .iter()
                .map(|&id| {
                    plan.probes
                        .get(id as usize)
                        .map_or("", |p| &p.def.name)
                        .to_owned()
                })
                .collect(),
        };
        let log = crate::bpf::log::Reader::start(&mut ebpf, names)?;
        Ok(Self {
            ebpf,
            attached: Vec::new(),
            stats,
            uprobes_loaded: false,
            tgids,
            _log: log,
            shared,
        })
    }

    /// How the BPF run-time statistics were enabled, or why not.
    pub fn stats_how(&self) -> &str {
        &self.stats.how
    }

    /// Run count and run time of every attached program (cumulative since load).
    pub fn program_stats(&self) -> Vec<ProgramStat> {
        let misses = crate::bpf::stats::kprobe_misses();
        self.attached
            .iter()
            .filter_map(|(name, target)| {
                ProgramStat::of(name, target, self.ebpf.program(name)?, misses.as_ref())
            })
            .collect()
    }

    /// Attach kprobe program `prog` to kernel function `function` (for `rdma-trace cq`).
    pub fn attach_kprobe(&mut self, prog: &str, function: &str) -> Result<()> {
        self.kprobe(prog, function).map(|_| ())
    }

    /// The loaded object, for commands with maps of their own (ring buffers, stacks).
    pub fn ebpf(&self) -> &Ebpf {
        &self.ebpf
    }

    pub fn ebpf_mut(&mut self) -> &mut Ebpf {
        &mut self.ebpf
    }

    fn attached_to(&mut self, prog: &str, target: &str) {
        self.attached.push((prog.to_owned(), target.to_owned()));
    }

    fn detached(&mut self, prog: &str) {
        self.attached.retain(|(p, _)| p != prog);
    }

    /// Attach what the plan asks for, each kernel function by its first method that works.
    /// Returns the outcome of every planned probe, by probe id.
    pub fn attach(&mut self, plan: &Plan) -> Result<Vec<Outcome>> {
        let mut slot_outcome = Vec::new();
        for (slot, f) in plan.functions.iter().enumerate() {
            let mut errors = Vec::new();
            let mut done = None;
            for &method in &f.methods {
                let shared = self
                    .shared
                    .iter()
                    .find(|(s, _)| *s == slot)
                    .map(|(_, h)| *h);
                let r = match (method, shared) {
                    (Method::Kprobe, Some(h)) => {
                        self.attach_kprobe_parts(slot, &f.function, !h.entry, !h.ret)
                    }
                    (Method::Kprobe, None) => self.attach_kprobe_pair(slot, &f.function),
                    // The sharing programs are kprobes: fentry programs beside them would
                    // count every call twice.
                    (Method::Fentry, Some(_)) => {
                        Err(anyhow!("its hooks are shared with the waterfall's kprobes"))
                    }
                    (Method::Fentry, None) => self.attach_fentry_pair(slot, &f.function),
                    (Method::RawTracepoint | Method::Uprobe, _) => {
                        Err(anyhow!("not a kernel-function method"))
                    }
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
                None => Outcome::Skipped(NotAttached::Refused(errors.join("; "))),
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
        let ib_cq = plan.cq_wakeup_probe != NO_PROBE || plan.nvme_io_probe != NO_PROBE;
        let cq_wakeup = ib_cq.then(|| {
            self.attach_raw_tracepoints(&[
                ("ibcq_schedule", "cq_schedule"),
                ("ibcq_reschedule", "cq_reschedule"),
                ("ibcq_process", "cq_process"),
                ("ibcq_poll", "cq_poll"),
                ("ibcq_free", "cq_free"),
            ])
        });
        let cm_connect = (plan.cm_connect_probe != NO_PROBE).then(|| {
            self.attach_raw_tracepoints(&[
                ("cm_send_req", "cm_send_req"),
                ("cm_event_handler", "cm_event_handler"),
                ("cm_event_done", "cm_event_done"),
                ("cm_id_destroy", "cm_id_destroy"),
            ])
        });
        let nvme_io = (plan.nvme_io_probe != NO_PROBE).then(|| match &cq_wakeup {
            Some(o @ Outcome::Skipped(_)) => o.clone(),
            _ => self.attach_nvme_io(),
        });
        let nvmet_io = (plan.nvmet_io_probe != NO_PROBE).then(|| {
            self.attach_raw_tracepoints(&[
                ("nvmet_req_init", "nvmet_req_init"),
                ("nvmet_req_complete", "nvmet_req_complete"),
            ])
        });
        let irq_map = plan.irq_map();
        let irq = (!irq_map.is_empty()).then(|| match self.fill_irq_map(&irq_map) {
            Ok(()) => self.attach_raw_tracepoints(&[
                ("irq_handler_entry", "irq_handler_entry"),
                ("irq_handler_exit", "irq_handler_exit"),
            ]),
            Err(e) => Outcome::Skipped(NotAttached::Refused(format!("{e:#}"))),
        });

        let mut user = HashMap::new();
        for p in &plan.probes {
            if let (Decision::Try(_), &Shape::UserFunction { symbol, .. }, Some(lib)) =
                (&p.decision, &p.def.shape, &p.library)
            {
                let o = match self.attach_uprobe_pair(p.id, lib, symbol) {
                    Ok(()) => Outcome::Attached(Method::Uprobe),
                    Err(e) => Outcome::Skipped(NotAttached::Refused(format!("{e:#}"))),
                };
                user.insert(p.id, o);
            }
        }

        let slot_of = |function: &str| plan.functions.iter().position(|f| f.function == function);
        Ok(plan
            .probes
            .iter()
            .map(|p| {
                if let Decision::Skip(why) = &p.decision {
                    return Outcome::Skipped(NotAttached::Planned(why.clone()));
                }
                let from_slot = |f: &str| slot_of(f).map(|i| slot_outcome[i].clone());
                let o = match &p.def.shape {
                    Shape::Duration { function } => from_slot(function),
                    &Shape::Interval { from, to } => match (from_slot(from), from_slot(to)) {
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
                    Shape::CqWakeup => cq_wakeup.clone(),
                    Shape::NvmeIo => nvme_io.clone(),
                    Shape::NvmetIo => nvmet_io.clone(),
                    Shape::CmConnect => cm_connect.clone(),
                    Shape::Irq { .. } => irq.clone(),
                    Shape::UserFunction { .. } => user.get(&p.id).cloned(),
                };
                o.unwrap_or(Outcome::Skipped(NotAttached::NotPlanned))
            })
            .collect())
    }

    /// uprobe + uretprobe on the default version of `symbol` in `library`, cookie = probe id.
    fn attach_uprobe_pair(
        &mut self,
        probe: u32,
        library: &std::path::Path,
        symbol: &str,
    ) -> Result<()> {
        let offset = crate::kernel::elf::function_offset(library, symbol)?;
        if !self.uprobes_loaded {
            for prog in ["uentry", "ureturn"] {
                let p: &mut UProbe = self.program(prog)?;
                p.load()
                    .map_err(|e| anyhow!("loading {prog}: {}", chain(&e)))?;
            }
            self.uprobes_loaded = true;
        }
        let mut links = Vec::new();
        for prog in ["uentry", "ureturn"] {
            let p: &mut UProbe = self.program(prog)?;
            let point = UProbeAttachPoint {
                location: UProbeAttachLocation::AbsoluteOffset(offset),
                cookie: Some(u64::from(probe)),
            };
            match p.attach(point, library, UProbeScope::AllProcesses) {
                Ok(link) => links.push((prog, link)),
                Err(e) => {
                    for (prog, link) in links {
                        let p: &mut UProbe = self.program(prog)?;
                        let _ = p.detach(link);
                    }
                    return Err(anyhow!(
                        "attaching {prog} to {symbol} in {}: {}",
                        library.display(),
                        chain(&e)
                    ));
                }
            }
        }
        // One program pair serves every user-space probe: list it once for the stats.
        for prog in ["uentry", "ureturn"] {
            if !self.attached.iter().any(|(p, _)| p == prog) {
                self.attached_to(prog, &format!("uprobe {symbol}"));
            }
        }
        Ok(())
    }

    /// Count the user-space probes in process `pid` (they ignore every other process).
    pub fn watch_pid(&self, pid: u32) -> Result<()> {
        self.tgids
            .borrow_mut()
            .insert(pid, 1, 0)
            .map_err(|e| anyhow!("watching pid {pid}: {}", chain(&e)))
    }

    /// The parts of slot `slot`'s kprobe pair that a shared hook leaves to the table: its
    /// entry program and/or its return program.
    fn attach_kprobe_parts(
        &mut self,
        slot: usize,
        function: &str,
        entry: bool,
        ret: bool,
    ) -> Result<()> {
        match (entry, ret) {
            (true, true) => self.attach_kprobe_pair(slot, function),
            (true, false) => self.kprobe(&format!("kentry_{slot}"), function).map(|_| ()),
            (false, true) => self
                .kprobe(&format!("kreturn_{slot}"), function)
                .map(|_| ()),
            (false, false) => Ok(()),
        }
    }

    /// The hooks the table shares with a feature's programs (as planned, and once the feature
    /// has attached, those its programs serve).
    pub fn shared_hooks(&self) -> Vec<SharedHook> {
        self.shared.iter().map(|(_, h)| *h).collect()
    }

    /// After the feature has attached: every shared hook whose function `served` says the
    /// feature's programs do not run on gets the table's own programs for the parts they were
    /// to do. Returns the functions where that failed, with why.
    pub fn attach_unshared(
        &mut self,
        served: impl Fn(&str) -> bool,
    ) -> Vec<(&'static str, String)> {
        let mut failed = Vec::new();
        for (slot, h) in std::mem::take(&mut self.shared) {
            if served(h.function) {
                self.shared.push((slot, h));
                continue;
            }
            if let Err(e) = self.attach_kprobe_parts(slot, h.function, h.entry, h.ret) {
                failed.push((h.function, format!("{e:#}")));
            }
        }
        failed
    }

    fn attach_kprobe_pair(&mut self, slot: usize, function: &str) -> Result<()> {
        let entry = self.kprobe(&format!("kentry_{slot}"), function)?;
        if let Err(e) = self.kprobe(&format!("kreturn_{slot}"), function) {
            let name = format!("kentry_{slot}");
            let p: &mut KProbe = self.program(&name)?;
            let _ = p.detach(entry);
            self.detached(&name);
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
        let link = p
            .attach(function, 0)
            .map_err(|e| anyhow!("attaching {prog} to {function}: {}", chain(&e)))?;
        self.attached_to(prog, function);
        Ok(link)
    }

    fn attach_fentry_pair(&mut self, slot: usize, function: &str) -> Result<()> {
        let btf = kernel_btf()?;
        let entry = format!("fentry_{slot}");
        let p: &mut FEntry = self.program(&entry)?;
        p.load(function, btf)
            .map_err(|e| anyhow!("loading {entry} for {function}: {}", chain(&e)))?;
        let link = p
            .attach()
            .map_err(|e| anyhow!("attaching {entry}: {}", chain(&e)))?;
        self.attached_to(&entry, function);
        let exit = format!("fexit_{slot}");
        let r = (|| -> Result<()> {
            let p: &mut FExit = self.program(&exit)?;
            p.load(function, btf)
                .map_err(|e| anyhow!("loading {exit} for {function}: {}", chain(&e)))?;
            p.attach()
                .map_err(|e| anyhow!("attaching {exit}: {}", chain(&e)))?;
            self.attached_to(&exit, function);
            Ok(())
        })();
        if r.is_err() {
            let p: &mut FEntry = self.program(&entry)?;
            let _ = p.detach(link);
            self.detached(&entry);
        }
        r
    }

    /// The NVMe I/O row's own programs (the ib_cq API's are attached already): its tracepoints
    /// and the kprobes on nvme-rdma's post and the block layer's remote completion.
    fn attach_nvme_io(&mut self) -> Outcome {
        let tps = self.attach_raw_tracepoints(&[
            ("nvme_setup_cmd", "nvme_setup_cmd"),
            ("nvme_complete_rq", "nvme_complete_rq"),
        ]);
        if let Outcome::Skipped(_) = tps {
            return tps;
        }
        for (prog, function) in [
            ("nvme_post_send", "nvme_rdma_post_send"),
            ("nvme_callback", "blk_mq_complete_request_remote"),
        ] {
            if let Err(e) = self.attach_kprobe(prog, function) {
                return Outcome::Skipped(NotAttached::Refused(format!("{e:#}")));
            }
        }
        tps
    }

    /// Attach programs to raw tracepoints, all or nothing as far as the outcome goes.
    fn attach_raw_tracepoints(&mut self, progs: &[(&str, &str)]) -> Outcome {
        for (prog, tp) in progs {
            if let Err(e) = self.attach_raw_tracepoint(prog, tp) {
                return Outcome::Skipped(NotAttached::Refused(format!("{e:#}")));
            }
        }
        Outcome::Attached(Method::RawTracepoint)
    }

    /// Attach tracepoint program `prog` to `category:name` (needs tracefs).
    pub fn attach_tracepoint(&mut self, prog: &str, category: &str, name: &str) -> Result<()> {
        let p: &mut aya::programs::TracePoint = self.program(prog)?;
        p.load()
            .map_err(|e| anyhow!("loading {prog}: {}", chain(&e)))?;
        p.attach(category, name).map_err(|e| {
            anyhow!(
                "attaching {prog} to tracepoint {category}:{name}: {}",
                chain(&e)
            )
        })?;
        self.attached_to(prog, &format!("tracepoint {category}:{name}"));
        Ok(())
    }

    pub(crate) fn attach_raw_tracepoint(&mut self, prog: &str, name: &str) -> Result<()> {
        let p: &mut RawTracePoint = self.program(prog)?;
        p.load()
            .map_err(|e| anyhow!("loading {prog}: {}", chain(&e)))?;
        p.attach(name)
            .map_err(|e| anyhow!("attaching {prog} to raw tracepoint {name}: {}", chain(&e)))?;
        self.attached_to(prog, &format!("raw_tp {name}"));
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
        // Entry programs first: an end seen without its start only counts as unmatched, while
        // a start whose end program is already gone would look like a call still running.
        let is_end = |name: &str| ["return", "exit", "fexit"].iter().any(|e| name.contains(e));
        for ends in [false, true] {
            for (name, p) in self.ebpf.programs_mut() {
                if is_end(name) != ends {
                    continue;
                }
                unload(p);
            }
        }
    }

    /// Detach and unload the programs named (the overhead budget's `--enforce`); the maps and
    /// the other programs stay.
    pub fn drop_programs(&mut self, names: &[String]) {
        for name in names {
            if let Some(p) = self.ebpf.program_mut(name) {
                unload(p);
            }
            self.detached(name);
        }
    }

    /// Counters and histograms of probes `ids`, summed over CPUs: the whole map in one batched
    /// lookup (one syscall per refresh, whatever the probe count; `crate::bpf::batch`), else one
    /// lookup per probe on kernels without batched lookups (before 5.6).
    pub fn read(&self, ids: &[u32]) -> Result<HashMap<u32, ProbeData>> {
        if let Some(out) = self.read_batched(ids) {
            return Ok(out);
        }
        let rows = self.rows()?;
        let mut out = HashMap::new();
        for &id in ids.iter().filter(|&&id| id < MAX_PROBES) {
            let per_cpu = rows
                .get(&id, 0)
                .map_err(|e| anyhow!("reading probe {id}: {}", chain(&e)))?;
            out.insert(id, sum_cpus(per_cpu.iter()));
        }
        Ok(out)
    }

    /// `read` with BPF_MAP_LOOKUP_BATCH; `None` when the kernel refuses it.
    fn read_batched(&self, ids: &[u32]) -> Option<HashMap<u32, ProbeData>> {
        use std::os::fd::{AsFd as _, AsRawFd as _};
        let aya::maps::Map::PerCpuArray(data) = self.ebpf.map("ROWS")? else {
            return None;
        };
        let cpus = crate::bpf::batch::possible_cpus()?;
        // The rows up to the highest probe id asked for: the rest of the array is unused.
        let entries = ids
            .iter()
            .max()
            .map_or(0, |&m| m.saturating_add(1))
            .min(MAX_PROBES);
        if entries == 0 {
            return Some(HashMap::new());
        }
        let rows = crate::bpf::batch::lookup_rows(data.fd().as_fd().as_raw_fd(), entries, cpus)?;
        Some(
            ids.iter()
                .filter(|&&id| id < MAX_PROBES)
                .map(|&id| {
                    let per_cpu = &rows[id as usize * cpus..(id as usize + 1) * cpus];
                    (id, sum_cpus(per_cpu.iter()))
                })
                .collect(),
        )
    }

    /// Events (C_EVENTS) of probes `ids`, per CPU (index = CPU number).
    pub fn events_per_cpu(&self, ids: &[u32]) -> Result<HashMap<u32, Vec<u64>>> {
        let rows = self.rows()?;
        ids.iter()
            .filter(|&&id| id < MAX_PROBES)
            .map(|&id| {
                let v = rows
                    .get(&id, 0)
                    .map_err(|e| anyhow!("reading probe {id}: {}", chain(&e)))?;
                Ok((
                    id,
                    v.iter().map(|r| r.counters[C_EVENTS as usize]).collect(),
                ))
            })
            .collect()
    }

    fn rows(&self) -> Result<PerCpuArray<&MapData, ProbeRow>> {
        let m = self
            .ebpf
            .map("ROWS")
            .context("map ROWS is not in the eBPF object")?;
        PerCpuArray::try_from(m).context("map ROWS is not a per-CPU array of probe rows")
    }
}

/// One probe's row summed over CPUs.
/// Detach and unload program `p`, whatever its kind (an error is one it no longer has).
pub(crate) fn unload(p: &mut aya::programs::Program) {
    use aya::programs::Program;
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

fn sum_cpus<'a>(per_cpu: impl Iterator<Item = &'a ProbeRow>) -> ProbeData {
    let mut data = ProbeData::default();
    let mut slots = vec![0u64; HIST_SLOTS as usize];
    for row in per_cpu {
        for (sum, v) in data.counters.iter_mut().zip(row.counters) {
            *sum += v;
        }
        for (sum, v) in slots.iter_mut().zip(row.slots) {
            *sum += v;
        }
    }
    // The programs do not count what they record: every recorded value is one slot's count.
    data.counters[C_RECORDED as usize] = slots.iter().sum();
    data.hist = Histogram::from_slots(slots);
    data
}

/// Load the embedded eBPF object (creating its maps; programs load when attached), with the
/// globals and map sizes `configure` sets. The one place the object is loaded: the memlock
/// limit is raised first, and a refusal for lack of privileges is [`Unsupported`] with what to
/// do. `what` names the load in other errors (`loading {what}: ...`).
pub fn load_object<'a>(
    what: &str,
    configure: impl for<'l> FnOnce(&'l mut EbpfLoader<'a>) -> &'l mut EbpfLoader<'a>,
) -> Result<Ebpf> {
    raise_memlock();
    let mut loader = prepared_loader().unwrap_or_default();
    crate::startup::step("object loader (kernel BTF)");
    configure(&mut loader);
    let loaded = loader.load(OBJECT);
    crate::startup::step("object and maps");
    loaded.map_err(|e| {
        let text = chain(&e);
        if has_errno(&e, libc::EPERM) {
            anyhow!(Unsupported(format!(
                "the kernel refused to create eBPF maps ({text}): run as root (CAP_BPF and CAP_PERFMON)"
            )))
        } else {
            anyhow!("loading {what}: {text}")
        }
    })
}

/// Loaders made ahead of time by [`prepare_loaders`], taken by [`load_object`].
static PREPARED: Mutex<Vec<JoinHandle<EbpfLoader<'static>>>> = Mutex::new(Vec::new());

/// The kernel's BTF, parsed once for every fentry/fexit program (the probes' and the
/// calibration's): an error is the message, as a later caller reports it.
static KERNEL_BTF: OnceLock<Result<Btf, String>> = OnceLock::new();

/// Make `n` object loaders on threads of their own, for the next calls of [`load_object`]:
/// making one parses the kernel's BTF (megabytes), which the caller's gathering of kernel facts
/// can overlap.
pub fn prepare_loaders(n: usize) {
    if let Ok(mut prepared) = PREPARED.lock() {
        prepared.extend((0..n).map(|_| std::thread::spawn(EbpfLoader::new)));
    }
}

/// Parse the kernel's BTF for fentry programs on a thread of its own (see [`kernel_btf`]).
pub fn prefetch_kernel_btf() {
    if KERNEL_BTF.get().is_none() {
        std::thread::spawn(|| {
            let _ = kernel_btf();
        });
    }
}

fn prepared_loader() -> Option<EbpfLoader<'static>> {
    let handle = PREPARED.lock().ok()?.pop()?;
    handle.join().ok()
}

/// The running kernel's BTF (`/sys/kernel/btf/vmlinux`), parsed on first use.
pub fn kernel_btf() -> Result<&'static Btf> {
    KERNEL_BTF
        .get_or_init(|| Btf::from_sys_fs().map_err(|e| chain(&e)))
        .as_ref()
        .map_err(|e| anyhow!("reading kernel BTF: {e}"))
}

/// Whether the kernel refused `e` for want of privileges: EPERM or EACCES among its sources.
pub(crate) fn is_permission_error(e: &(dyn std::error::Error + 'static)) -> bool {
    has_errno(e, libc::EPERM) || has_errno(e, libc::EACCES)
}

/// Whether an OS error `errno` is among the sources of `e` (aya nests the syscall's
/// [`std::io::Error`] in its map and program errors).
fn has_errno(e: &(dyn std::error::Error + 'static), errno: i32) -> bool {
    std::iter::successors(Some(e), |e| e.source()).any(|e| {
        e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.raw_os_error() == Some(errno))
    })
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

#[cfg(test)]
mod tests {
    use aya::{EbpfError, maps::MapError};

    use super::*;

    /// The truth: the plan's own methods. A hook is shared only where its function's slot is
    /// attached with kprobes first; fentry slots, and functions not planned, keep the table's
    /// own programs.
    #[test]
    fn hooks_are_shared_only_on_kprobe_slots() {
        let slot = |function: &'static str, methods: Vec<Method>| FunctionSlot {
            function: function.into(),
            methods,
            config: rdma_trace_common::KSlot::UNUSED,
        };
        let hook = |function: &'static str| SharedHook {
            function,
            global: "G",
            entry: true,
            ret: false,
        };
        let functions = [
            slot("a", vec![Method::Fentry, Method::Kprobe]),
            slot("b", vec![Method::Kprobe, Method::Fentry]),
            slot("c", vec![Method::Kprobe]),
        ];
        let shared = shared_slots(&functions, &[hook("a"), hook("c"), hook("z")]);
        assert_eq!(shared, vec![(2, hook("c"))]);
        assert!(shared_slots(&functions, &[]).is_empty());
    }

    /// The truth: the capability masks of `/proc/PID/status` (bits from `linux/capability.h`).
    #[test]
    fn a_missing_capability_is_named_with_those_held() {
        let bits = |caps: &[u32]| caps.iter().fold(0u64, |m, c| m | 1 << c);
        let (dac, admin, syslog, perfmon, bpf) = (2, 21, 34, 38, 39);
        assert_eq!(
            missing_privilege(bits(&[admin]), true, Some(3)),
            None,
            "root"
        );
        assert_eq!(
            missing_privilege(bits(&[bpf, perfmon]), false, Some(2)),
            None
        );
        assert_eq!(
            missing_privilege(bits(&[bpf, perfmon, dac]), true, None),
            None
        );
        // Debian's perf_event_paranoid 3: the capabilities are not enough.
        let debian = missing_privilege(bits(&[bpf, perfmon, dac]), true, Some(3)).unwrap();
        assert!(
            debian.starts_with("needs CAP_SYS_ADMIN while kernel.perf_event_paranoid is 3")
                && debian.ends_with("(sysctl kernel.perf_event_paranoid=2)"),
            "{debian}"
        );
        assert_eq!(
            missing_privilege(bits(&[bpf, dac, syslog]), true, Some(3)).unwrap(),
            "needs CAP_PERFMON; it holds CAP_DAC_READ_SEARCH, CAP_SYSLOG, CAP_BPF"
        );
        assert_eq!(
            missing_privilege(bits(&[bpf, perfmon]), true, Some(2)).unwrap(),
            "needs CAP_DAC_READ_SEARCH (tracefs is root-only here); it holds CAP_PERFMON, CAP_BPF"
        );
        assert_eq!(
            missing_privilege(0, false, Some(2)).unwrap(),
            "needs CAP_BPF and CAP_PERFMON; it holds none of them"
        );
    }

    fn create_error(errno: i32) -> EbpfError {
        EbpfError::MapError(MapError::CreateError {
            name: "TGIDS".to_owned(),
            io_error: std::io::Error::from_raw_os_error(errno),
        })
    }

    #[test]
    fn permission_is_recognised_by_errno_in_the_chain() {
        assert!(has_errno(&create_error(libc::EPERM), libc::EPERM));
        assert!(!has_errno(&create_error(libc::EINVAL), libc::EPERM));
        assert!(is_permission_error(&create_error(libc::EACCES)));
        assert!(!is_permission_error(&create_error(libc::ENOENT)));
        let text = chain(&create_error(libc::EPERM));
        assert!(text.contains("TGIDS"), "{text}");
    }
}

//! Deciding, per probe of the table, how it can be attached on this kernel — or why not.
//!
//! Pure: [`Facts`] are read from a [`Kernel`] (live or fixture), [`plan`] turns the table and the
//! facts into probe ids, kernel-function slots and the eBPF configuration. The attach step then
//! tries each planned method in order and records what worked.

use std::{
    borrow::Cow,
    collections::{HashMap, HashSet},
    fmt,
    path::PathBuf,
};

use rdma_trace_common::{
    KSlot, MAX_INTERVALS, MAX_KSLOTS, MAX_PROBES, NO_PROBE, NR_SOFTIRQS, SOFTIRQ_NAMES,
};

use crate::{
    kernel::facts::{Kernel, RdmaDevice, Symbol},
    kernel::probes::{Driver, Method, Patterns, Preset, ProbeDef, Role, Shape},
};

/// What the kernel offers, as far as probe selection is concerned.
#[derive(Clone, Debug, Default)]
pub struct Facts {
    pub release: Option<String>,
    pub kprobes: bool,
    pub btf: bool,
    /// `CONFIG_KPROBES` from the kernel's config file, when readable.
    pub config_kprobes: Option<String>,
    pub symbols: HashMap<String, Symbol>,
    /// Loaded modules (`/proc/modules`), when readable.
    pub modules: Option<HashSet<String>>,
    /// The table's functions that are on the kprobe blacklist, when debugfs is mounted.
    pub kprobe_blacklist: Option<HashSet<String>>,
    /// The table's functions ftrace can trace (fentry needs that), when tracefs is mounted.
    pub traceable: Option<HashSet<String>>,
    /// Tracepoints (`irq:softirq_entry`), when tracefs is mounted.
    pub events: Option<HashSet<String>>,
    pub devices: Vec<RdmaDevice>,
    pub irqs: Vec<(u32, String)>,
    /// Shared libraries the user-space probes need, where found.
    pub libraries: HashMap<String, PathBuf>,
}

impl Facts {
    /// Read what `probes` need to know from `kernel`.
    pub fn gather(kernel: &Kernel, probes: &[ProbeDef]) -> Self {
        Self::gather_with(kernel, probes, true)
    }

    /// [`Facts::gather`], with `traceable` (`available_filter_functions`) only when
    /// `ftrace_list`.
    fn gather_with(kernel: &Kernel, probes: &[ProbeDef], ftrace_list: bool) -> Self {
        let functions = table_functions(probes);
        let names: Vec<&str> = functions.iter().map(|f| f.as_ref()).collect();
        let names = &names;
        // The kernel formats kallsyms and the ftrace lists anew for every read, which makes
        // them the slow part of start-up: read side by side.
        let (symbols, traceable, events, kprobe_blacklist) = std::thread::scope(|s| {
            let symbols = s.spawn(|| kernel.functions(names));
            let traceable = s.spawn(|| ftrace_list.then(|| kernel.traceable(names)).flatten());
            let events = s.spawn(|| kernel.available_events());
            let blacklist = kernel.kprobe_blacklisted(names);
            (
                symbols.join().unwrap_or_default(),
                traceable.join().unwrap_or_default(),
                events.join().unwrap_or_default(),
                blacklist,
            )
        });
        Facts {
            release: kernel.release(),
            kprobes: kernel.has_kprobes(),
            btf: kernel.has_btf(),
            config_kprobes: kernel.config("CONFIG_KPROBES"),
            symbols,
            modules: kernel.loaded_modules(),
            kprobe_blacklist,
            traceable,
            events,
            devices: kernel.rdma_devices(),
            irqs: kernel.interrupts(),
            libraries: probes
                .iter()
                .filter_map(|p| match p.shape {
                    Shape::UserFunction { library, .. } => kernel
                        .find_library(library)
                        .map(|path| (library.to_owned(), path)),
                    _ => None,
                })
                .collect(),
        }
    }

    fn has_driver(&self, driver: Driver) -> bool {
        match driver {
            Driver::Network => true,
            Driver::Generic => !self.devices.is_empty(),
            Driver::Rxe => self.devices.iter().any(RdmaDevice::is_rxe),
            hw => self.devices.iter().any(|d| d.hardware() == Some(hw)),
        }
    }

    /// (major, minor) of the kernel release (`6.12.95+deb12-amd64` → (6, 12)).
    pub fn version(&self) -> Option<(u32, u32)> {
        release_version(self.release.as_deref()?)
    }

    /// Why `function` (of a row in `module`, present since `since`) has no kallsyms entry.
    fn why_missing(
        &self,
        function: Cow<'static, str>,
        module: Option<&'static str>,
        since: Option<(u32, u32)>,
    ) -> SkipReason {
        if let (Some(since), Some(v)) = (since, self.version())
            && v < since
        {
            return SkipReason::NotInVersion {
                function,
                since,
                release: self.release.clone().unwrap_or_default(),
            };
        }
        match (module, &self.modules) {
            (Some(module), Some(loaded)) if !loaded.contains(module) => {
                SkipReason::ModuleNotLoaded { function, module }
            }
            (Some(module), Some(_)) => SkipReason::Inlined { function, module },
            _ => SkipReason::NotInKallsyms { function },
        }
    }

    fn why_no_kprobes(&self) -> String {
        match self.config_kprobes.as_deref() {
            None if self.release.is_some() => "no kprobes on this kernel (no kprobe PMU in /sys/bus/event_source/devices)".to_owned(),
            Some("y") => "kprobes are built in but the kprobe PMU is missing (/sys/bus/event_source/devices/kprobe)".to_owned(),
            _ => "no kprobes on this kernel (CONFIG_KPROBES is not set)".to_owned(),
        }
    }
}

/// Kernel functions a shape attaches to.
pub fn functions_of(shape: &Shape) -> Vec<Cow<'static, str>> {
    match shape {
        Shape::Duration { function } => vec![function.clone()],
        Shape::Interval { from, to } => vec![Cow::Borrowed(*from), Cow::Borrowed(*to)],
        _ => Vec::new(),
    }
}

/// Choices that are the user's.
#[derive(Clone, Copy, Debug, Default)]
pub struct Options {
    /// Keep probes of drivers without a device here (their functions must still exist).
    pub all_drivers: bool,
    /// Attach the user-space probes (uprobes cost a trap per call).
    pub uprobes: bool,
}

impl Options {
    /// The user's options, with what `preset` adds: `full` keeps every driver's rows and opts
    /// in to the user-space probes.
    pub fn with_preset(self, preset: Preset) -> Options {
        match preset {
            Preset::Full => Options {
                all_drivers: true,
                uprobes: true,
            },
            _ => self,
        }
    }
}

/// The static decision for one probe.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Try these methods in order.
    Try(Vec<Method>),
    /// Not attachable here, and why.
    Skip(SkipReason),
}

/// Why a probe is skipped. Typed so that callers and tests tell the kernel facts (inlined,
/// notrace, blacklisted, missing in this version, module not loaded) from the rest; users read
/// the `Display` line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SkipReason {
    /// No RDMA device at all (generic rows).
    NoRdmaDevice,
    /// No device of this driver path (use --all-drivers to keep its rows).
    NoDevice(Driver),
    /// The module that holds the function is not loaded.
    ModuleNotLoaded {
        function: Cow<'static, str>,
        module: &'static str,
    },
    /// The function appeared in a later kernel than this one.
    NotInVersion {
        function: Cow<'static, str>,
        since: (u32, u32),
        release: String,
    },
    /// Its module is loaded and the sources of this version have it, but it has no symbol:
    /// the compiler inlined it into its caller, so there is no probe point.
    Inlined {
        function: Cow<'static, str>,
        module: &'static str,
    },
    /// Not in kallsyms, and it is unknown which module should hold it.
    NotInKallsyms { function: Cow<'static, str> },
    /// On the kprobe blacklist (and no other method reaches it).
    KprobeBlacklisted { function: Cow<'static, str> },
    /// `notrace` (not in available_filter_functions): fentry, the only method left, refuses it.
    Notrace { function: Cow<'static, str> },
    /// No attach method this kernel offers (no kprobe PMU, no BTF).
    NoMethod(String),
    /// A tracepoint the probe needs is missing.
    NoTracepoint(String),
    /// No IRQ matches the probe's names (no such device, or not up).
    NoIrq(Patterns),
    /// Opt-in probe not asked for.
    UprobesOptIn,
    /// The shared library of a user-space probe is not installed.
    NoLibrary(&'static str),
    /// A limit of the eBPF object (probes, slots, intervals per run).
    Limit(String),
}

impl SkipReason {
    /// A stable name for JSON and tests.
    pub fn kind(&self) -> &'static str {
        match self {
            SkipReason::NoRdmaDevice => "no_rdma_device",
            SkipReason::NoDevice(_) => "no_device",
            SkipReason::ModuleNotLoaded { .. } => "module_not_loaded",
            SkipReason::NotInVersion { .. } => "not_in_version",
            SkipReason::Inlined { .. } => "inlined",
            SkipReason::NotInKallsyms { .. } => "not_in_kallsyms",
            SkipReason::KprobeBlacklisted { .. } => "kprobe_blacklisted",
            SkipReason::Notrace { .. } => "notrace",
            SkipReason::NoMethod(_) => "no_method",
            SkipReason::NoTracepoint(_) => "no_tracepoint",
            SkipReason::NoIrq(_) => "no_irq",
            SkipReason::UprobesOptIn => "opt_in",
            SkipReason::NoLibrary(_) => "no_library",
            SkipReason::Limit(_) => "limit",
        }
    }

    /// The reason is a fact of the kernel's build (not of devices or options): the function
    /// was inlined, is notrace or blacklisted, or does not exist in this version.
    pub fn is_kernel_fact(&self) -> bool {
        matches!(
            self,
            SkipReason::NotInVersion { .. }
                | SkipReason::Inlined { .. }
                | SkipReason::KprobeBlacklisted { .. }
                | SkipReason::Notrace { .. }
        )
    }
}

impl fmt::Display for SkipReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SkipReason::NoRdmaDevice => write!(f, "no RDMA device on this machine"),
            SkipReason::NoDevice(Driver::Rxe) => {
                write!(f, "no Soft-RoCE (rxe) device (driver path not in use)")
            }
            SkipReason::NoDevice(d) => write!(f, "no {} device (driver path not in use)", d.name()),
            SkipReason::ModuleNotLoaded { function, module } => write!(
                f,
                "{function} is not in /proc/kallsyms: module {module} is not loaded"
            ),
            SkipReason::NotInVersion {
                function,
                since: (major, minor),
                release,
            } => write!(
                f,
                "{function} does not exist in this kernel ({release}): it came in {major}.{minor}"
            ),
            SkipReason::Inlined { function, module } => write!(
                f,
                "{function} is inlined: {module} is loaded but has no symbol {function} in /proc/kallsyms (no probe point)"
            ),
            SkipReason::NotInKallsyms { function } => write!(
                f,
                "{function} is not in /proc/kallsyms (module not loaded, or inlined)"
            ),
            SkipReason::KprobeBlacklisted { function } => write!(
                f,
                "{function} is on the kprobe blacklist (/sys/kernel/debug/kprobes/blacklist)"
            ),
            SkipReason::Notrace { function } => write!(
                f,
                "{function} is notrace (not in available_filter_functions): fentry cannot attach, and there are no kprobes"
            ),
            SkipReason::NoMethod(why) | SkipReason::NoTracepoint(why) | SkipReason::Limit(why) => {
                f.write_str(why)
            }
            SkipReason::NoIrq(patterns) => write!(
                f,
                "no IRQ named {} in /proc/interrupts",
                patterns.iter().collect::<Vec<_>>().join(", ")
            ),
            SkipReason::UprobesOptIn => write!(
                f,
                "opt-in (--uprobes): a uprobe traps on every call, which slows event-mode round trips"
            ),
            SkipReason::NoLibrary(lib) => {
                write!(f, "{lib} not found in the library directories")
            }
        }
    }
}

#[derive(Clone, Debug)]
pub struct PlannedProbe {
    pub def: ProbeDef,
    /// Row in the eBPF maps (meaningful only when not skipped).
    pub id: u32,
    pub decision: Decision,
    /// IRQ numbers (for IRQ probes).
    pub irqs: Vec<u32>,
    /// The shared library (for user-space probes).
    pub library: Option<PathBuf>,
}

/// One kernel function with its program pair.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FunctionSlot {
    pub function: Cow<'static, str>,
    pub methods: Vec<Method>,
    pub config: KSlot,
}

#[derive(Clone, Debug)]
pub struct Plan {
    pub probes: Vec<PlannedProbe>,
    /// Slot N is attached with programs `kentry_N`/`kreturn_N` (or `fentry_N`/`fexit_N`).
    pub functions: Vec<FunctionSlot>,
    pub softirq_probe: [u32; NR_SOFTIRQS as usize],
    pub napi_probe: u32,
    /// The ib_cq wake-up row (`CQ_WAKEUP_PROBE`), or NO_PROBE.
    pub cq_wakeup_probe: u32,
    /// The rdma_cm connection set-up row (`CM_CONNECT_PROBE`), or NO_PROBE.
    pub cm_connect_probe: u32,
    /// The NVMe over RDMA I/O row (`NVME_IO_PROBE`), or NO_PROBE.
    pub nvme_io_probe: u32,
    /// The NVMe over RDMA target row (`NVMET_IO_PROBE`), or NO_PROBE.
    pub nvmet_io_probe: u32,
    pub interval_probe: [u32; MAX_INTERVALS as usize],
}

impl Plan {
    /// Slot configuration for the `KSLOTS` global (unused slots stay unused).
    pub fn kslots(&self) -> [KSlot; MAX_KSLOTS as usize] {
        let mut k = [KSlot::UNUSED; MAX_KSLOTS as usize];
        for (i, f) in self.functions.iter().enumerate() {
            k[i] = f.config;
        }
        k
    }

    pub fn irq_map(&self) -> Vec<(u32, u32)> {
        self.probes
            .iter()
            .filter(|p| matches!(p.decision, Decision::Try(_)))
            .flat_map(|p| p.irqs.iter().map(move |&irq| (irq, p.id)))
            .collect()
    }

    /// The row whose count is the demo's progress ([`Role::Progress`]), when planned.
    pub fn progress(&self) -> Option<&PlannedProbe> {
        self.probes.iter().find(|p| p.def.role == Role::Progress)
    }

    pub fn wants(&self, pred: impl Fn(&Shape) -> bool) -> bool {
        self.probes
            .iter()
            .any(|p| matches!(p.decision, Decision::Try(_)) && pred(&p.def.shape))
    }
}

impl Plan {
    /// Some function is to be traced with fentry first.
    pub fn fentry_first(&self) -> bool {
        self.functions
            .iter()
            .any(|f| f.methods.first() == Some(&Method::Fentry))
    }
}

/// Decide every probe of `defs` against `facts`.
pub fn plan(defs: &[ProbeDef], facts: &Facts, opts: Options) -> Plan {
    let mut plan = Plan {
        probes: Vec::new(),
        functions: Vec::new(),
        softirq_probe: [NO_PROBE; NR_SOFTIRQS as usize],
        napi_probe: NO_PROBE,
        cq_wakeup_probe: NO_PROBE,
        cm_connect_probe: NO_PROBE,
        nvme_io_probe: NO_PROBE,
        nvmet_io_probe: NO_PROBE,
        interval_probe: [NO_PROBE; MAX_INTERVALS as usize],
    };
    let mut intervals = 0u32;
    for def in defs {
        let id = plan.probes.len() as u32;
        let mut irqs = Vec::new();
        let mut decision = static_decision(def, facts, opts, &mut irqs);
        if id >= MAX_PROBES {
            decision = Decision::Skip(SkipReason::Limit(format!(
                "more than {MAX_PROBES} probes in one run"
            )));
        }
        if let Decision::Try(methods) = &decision {
            let methods = methods.clone();
            match &def.shape {
                Shape::Duration { function } => {
                    match slot_for(&mut plan.functions, function.clone(), &methods) {
                        Some(slot) => plan.functions[slot].config.duration = id,
                        None => decision = Decision::Skip(SkipReason::Limit(out_of_slots())),
                    }
                }
                Shape::Interval { from, to } if intervals < MAX_INTERVALS => {
                    let (a, b) = (
                        slot_for(&mut plan.functions, Cow::Borrowed(from), &methods),
                        slot_for(&mut plan.functions, Cow::Borrowed(to), &methods),
                    );
                    match (a, b) {
                        (Some(a), Some(b)) => {
                            plan.functions[a].config.starts = intervals;
                            plan.functions[b].config.ends = intervals;
                            plan.interval_probe[intervals as usize] = id;
                            intervals += 1;
                        }
                        _ => decision = Decision::Skip(SkipReason::Limit(out_of_slots())),
                    }
                }
                Shape::Interval { .. } => {
                    decision = Decision::Skip(SkipReason::Limit(format!(
                        "more than {MAX_INTERVALS} intervals in one run"
                    )))
                }
                &Shape::Softirq { vector } => plan.softirq_probe[vector as usize] = id,
                Shape::NapiPoll => plan.napi_probe = id,
                Shape::CqWakeup => plan.cq_wakeup_probe = id,
                Shape::CmConnect => plan.cm_connect_probe = id,
                Shape::NvmeIo => plan.nvme_io_probe = id,
                Shape::NvmetIo => plan.nvmet_io_probe = id,
                Shape::Irq { .. } | Shape::UserFunction { .. } => {}
            }
        }
        let library = match def.shape {
            Shape::UserFunction { library, .. } => facts.libraries.get(library).cloned(),
            _ => None,
        };
        plan.probes.push(PlannedProbe {
            def: def.clone(),
            id,
            decision,
            irqs,
            library,
        });
    }
    plan
}

fn out_of_slots() -> String {
    format!("more than {MAX_KSLOTS} kernel functions in one run")
}

/// The slot of `function`, added when new; `None` when the slots are used up.
fn slot_for(
    slots: &mut Vec<FunctionSlot>,
    function: Cow<'static, str>,
    methods: &[Method],
) -> Option<usize> {
    if let Some(i) = slots.iter().position(|s| s.function == function) {
        return Some(i);
    }
    if slots.len() >= MAX_KSLOTS as usize {
        return None;
    }
    slots.push(FunctionSlot {
        function,
        methods: methods.to_vec(),
        config: KSlot::UNUSED,
    });
    Some(slots.len() - 1)
}

fn static_decision(def: &ProbeDef, facts: &Facts, opts: Options, irqs: &mut Vec<u32>) -> Decision {
    if !opts.all_drivers && !facts.has_driver(def.driver) {
        return Decision::Skip(match def.driver {
            Driver::Generic => SkipReason::NoRdmaDevice,
            Driver::Network => unreachable!("the network path is always present"),
            d => SkipReason::NoDevice(d),
        });
    }
    match &def.shape {
        Shape::Duration { .. } | Shape::Interval { .. } => {
            let mut methods: Vec<Method> = def.methods.to_vec();
            let mut fact = None;
            for f in functions_of(&def.shape) {
                let Some(sym) = facts.symbols.get(f.as_ref()) else {
                    return Decision::Skip(facts.why_missing(f, def.module, def.since));
                };
                let blacklisted = facts
                    .kprobe_blacklist
                    .as_ref()
                    .is_some_and(|b| b.contains(f.as_ref()));
                let notrace = facts
                    .traceable
                    .as_ref()
                    .is_some_and(|t| !t.contains(f.as_ref()));
                methods.retain(|m| match m {
                    Method::Kprobe => facts.kprobes && !blacklisted,
                    // fentry here needs vmlinux BTF; aya 0.14 cannot target module BTF.
                    Method::Fentry => facts.btf && sym.module.is_none() && !notrace,
                    Method::RawTracepoint | Method::Uprobe => false,
                });
                if blacklisted && facts.kprobes {
                    fact = Some(SkipReason::KprobeBlacklisted {
                        function: f.clone(),
                    });
                } else if notrace && facts.btf && def.methods.contains(&Method::Fentry) {
                    fact.get_or_insert(SkipReason::Notrace {
                        function: f.clone(),
                    });
                }
            }
            if methods.is_empty() {
                if let Some(fact) = fact {
                    return Decision::Skip(fact);
                }
                let mut why = facts.why_no_kprobes();
                if def.methods.contains(&Method::Fentry) && !facts.btf {
                    why.push_str(", and no BTF for fentry (/sys/kernel/btf/vmlinux)");
                } else if !def.methods.contains(&Method::Fentry)
                    || functions_of(&def.shape)
                        .iter()
                        .any(|f| facts.symbols[f.as_ref()].module.is_some())
                {
                    why.push_str("; fentry cannot reach module functions");
                }
                return Decision::Skip(SkipReason::NoMethod(why));
            }
            Decision::Try(methods)
        }
        &Shape::Softirq { vector } => {
            tracepoint(facts, def, &["irq:softirq_entry", "irq:softirq_exit"]).unwrap_or_else(
                || {
                    debug_assert!(SOFTIRQ_NAMES.get(vector as usize).is_some());
                    Decision::Try(vec![Method::RawTracepoint])
                },
            )
        }
        Shape::NapiPoll => tracepoint(facts, def, &["napi:napi_poll"])
            .unwrap_or(Decision::Try(vec![Method::RawTracepoint])),
        Shape::CqWakeup => tracepoint(facts, def, CQ_WAKEUP_EVENTS)
            .unwrap_or(Decision::Try(vec![Method::RawTracepoint])),
        Shape::CmConnect => tracepoint(facts, def, CM_CONNECT_EVENTS)
            .unwrap_or(Decision::Try(vec![Method::RawTracepoint])),
        Shape::NvmeIo => tracepoint(facts, def, NVME_IO_EVENTS)
            .unwrap_or(Decision::Try(vec![Method::RawTracepoint])),
        Shape::NvmetIo => tracepoint(facts, def, NVMET_IO_EVENTS)
            .unwrap_or(Decision::Try(vec![Method::RawTracepoint])),
        Shape::UserFunction { library, .. } => {
            if !opts.uprobes {
                Decision::Skip(SkipReason::UprobesOptIn)
            } else if !facts.libraries.contains_key(*library) {
                Decision::Skip(SkipReason::NoLibrary(library))
            } else {
                Decision::Try(vec![Method::Uprobe])
            }
        }
        Shape::Irq { patterns } => {
            if let Some(skip) = tracepoint(
                facts,
                def,
                &["irq:irq_handler_entry", "irq:irq_handler_exit"],
            ) {
                return skip;
            }
            irqs.extend(
                facts
                    .irqs
                    .iter()
                    .filter(|(_, name)| patterns.matches(name))
                    .map(|&(n, _)| n)
                    .take(rdma_trace_common::MAX_IRQS as usize),
            );
            if irqs.is_empty() {
                return Decision::Skip(SkipReason::NoIrq(patterns.clone()));
            }
            Decision::Try(vec![Method::RawTracepoint])
        }
    }
}

/// The tracepoints of the ib_cq wake-up row ([`Shape::CqWakeup`]), in ib_core: listed in
/// available_events once ib_core is loaded.
pub const CQ_WAKEUP_EVENTS: &[&str] = &[
    "rdma_core:cq_schedule",
    "rdma_core:cq_reschedule",
    "rdma_core:cq_process",
    "rdma_core:cq_poll",
    "rdma_core:cq_free",
];

/// The tracepoints of the rdma_cm connection row ([`Shape::CmConnect`]), in rdma_cm: listed
/// in available_events once rdma_cm is loaded (rdma_ucm, nvme-rdma and rpcrdma load it).
pub const CM_CONNECT_EVENTS: &[&str] = &[
    "rdma_cma:cm_send_req",
    "rdma_cma:cm_event_handler",
    "rdma_cma:cm_event_done",
    "rdma_cma:cm_id_destroy",
];

/// The tracepoints of the NVMe I/O row ([`Shape::NvmeIo`]): nvme_core's, and the ib_cq API's
/// for the poll rounds.
pub const NVME_IO_EVENTS: &[&str] = &[
    "nvme:nvme_setup_cmd",
    "nvme:nvme_complete_rq",
    "rdma_core:cq_schedule",
    "rdma_core:cq_process",
    "rdma_core:cq_poll",
];

/// The tracepoints of the NVMe target row ([`Shape::NvmetIo`]), in nvmet.
pub const NVMET_IO_EVENTS: &[&str] = &["nvmet:nvmet_req_init", "nvmet:nvmet_req_complete"];

/// `Some(Skip)` when tracefs lists events and one of `events` is missing.
fn tracepoint(facts: &Facts, _def: &ProbeDef, events: &[&str]) -> Option<Decision> {
    let known = facts.events.as_ref()?;
    events.iter().find(|e| !known.contains(**e)).map(|e| {
        Decision::Skip(SkipReason::NoTracepoint(format!(
            "tracepoint {e} is not in available_events"
        )))
    })
}

/// The kernel functions of the table's rows.
fn table_functions(probes: &[ProbeDef]) -> Vec<Cow<'static, str>> {
    probes.iter().flat_map(|p| functions_of(&p.shape)).collect()
}

/// The plan to attach `defs` on `kernel`. `available_filter_functions`, the slowest of the
/// kernel's files to read (the kernel formats some 40 000 lines), tells only whether fentry can
/// trace a function (notrace ones are missing): it is read only when fentry is some function's
/// first choice (no kprobes, or a kprobe-blacklisted function). Where fentry is a kprobe's
/// fallback, its refusal of a notrace function comes from the kernel at attach instead.
pub fn plan_to_attach(kernel: &Kernel, defs: &[ProbeDef], opts: Options) -> Plan {
    let mut facts = Facts::gather_with(kernel, defs, false);
    let first_plan = plan(defs, &facts, opts);
    if !first_plan.fentry_first() {
        return first_plan;
    }
    let functions = table_functions(defs);
    let names: Vec<&str> = functions.iter().map(|f| f.as_ref()).collect();
    facts.traceable = kernel.traceable(&names);
    plan(defs, &facts, opts)
}

/// The facts of fixture kernel `fixture` (`rdma-trace/tests/fixtures/<fixture>`) for the probe
/// table, for unit tests.
/// (major, minor) of kernel release `r` (`6.12.95+deb12-amd64` → (6, 12)).
pub fn release_version(r: &str) -> Option<(u32, u32)> {
    let mut it = r.split(|c: char| !c.is_ascii_digit());
    Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
}

#[cfg(test)]
pub(crate) fn fixture_facts(fixture: &str) -> Facts {
    let k = Kernel::at(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(fixture),
    );
    Facts::gather(&k, crate::kernel::probes::PROBES)
}

#[cfg(test)]
mod tests {
    use super::{fixture_facts as facts, *};
    use crate::kernel::probes::PROBES;

    fn decision<'a>(p: &'a Plan, name: &str) -> &'a Decision {
        &p.probes
            .iter()
            .find(|q| q.def.name == name)
            .unwrap_or_else(|| panic!("{name}"))
            .decision
    }

    fn attaches(p: &Plan, name: &str) -> bool {
        matches!(decision(p, name), Decision::Try(_))
    }

    /// The methods probe `name` is to be attached with, in order (it must not be skipped).
    fn methods<'a>(p: &'a Plan, name: &str) -> &'a [Method] {
        match decision(p, name) {
            Decision::Try(methods) => methods,
            d => panic!("{name} is skipped: {d:?}"),
        }
    }

    /// Every probe of `names` is to be attached.
    fn assert_attach(p: &Plan, names: &[&str]) {
        for name in names {
            assert!(attaches(p, name), "{name}: {:?}", decision(p, name));
        }
    }

    /// Probe `name` is skipped for a reason that says every one of `words`.
    fn assert_skipped(p: &Plan, name: &str, words: &[&str]) {
        let d = decision(p, name);
        let Decision::Skip(why) = d else {
            panic!("{name} is not skipped: {d:?}")
        };
        let why = why.to_string();
        assert!(words.iter().all(|w| why.contains(w)), "{name}: {why}");
    }

    /// A copy of fixture `name` in a temporary directory, to add or remove files.
    fn fixture_copy(name: &str, tag: &str) -> std::path::PathBuf {
        fn copy(from: &std::path::Path, to: &std::path::Path) {
            std::fs::create_dir_all(to).unwrap();
            for e in std::fs::read_dir(from).unwrap() {
                let e = e.unwrap();
                let dest = to.join(e.file_name());
                if e.file_type().unwrap().is_dir() {
                    copy(&e.path(), &dest);
                } else {
                    std::fs::copy(e.path(), dest).unwrap();
                }
            }
        }
        let root =
            std::env::temp_dir().join(format!("rdma-trace-plan-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        copy(
            &std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/fixtures")
                .join(name),
            &root,
        );
        root
    }

    #[test]
    fn the_ib_cq_wakeup_row_needs_the_rdma_core_tracepoints() {
        // The fixture's tracefs lists no rdma_core event: the row says which one it lacks.
        let p = plan(PROBES, &facts("guest-6.1-rxe"), Options::default());
        assert_skipped(&p, "ib_cq wakeup", &["rdma_core:cq_schedule"]);
        assert_eq!(p.cq_wakeup_probe, NO_PROBE);
        // With ib_core's events listed (as the 6.1 and 6.12 guests list them), it is a raw
        // tracepoint row and the eBPF global names its probe.
        let root = fixture_copy("guest-6.1-rxe", "rdma-core");
        let events = root.join("sys/kernel/tracing/available_events");
        let mut text = std::fs::read_to_string(&events).unwrap();
        for e in CQ_WAKEUP_EVENTS {
            text.push_str(&format!("{e}\n"));
        }
        std::fs::write(&events, text).unwrap();
        let k = Kernel::at(&root);
        let p = plan(PROBES, &Facts::gather(&k, PROBES), Options::default());
        assert_eq!(methods(&p, "ib_cq wakeup"), [Method::RawTracepoint]);
        let id = p
            .probes
            .iter()
            .find(|q| q.def.name == "ib_cq wakeup")
            .unwrap()
            .id;
        assert_eq!(p.cq_wakeup_probe, id);
        // One event short is still a skip.
        let text = std::fs::read_to_string(&events).unwrap();
        std::fs::write(&events, text.replace("rdma_core:cq_free\n", "")).unwrap();
        let p = plan(PROBES, &Facts::gather(&k, PROBES), Options::default());
        assert_skipped(&p, "ib_cq wakeup", &["rdma_core:cq_free"]);
    }

    #[test]
    fn the_ftrace_list_is_read_only_where_fentry_comes_first() {
        let root = fixture_copy("guest-6.1-rxe", "ftrace");
        // ftrace cannot trace __napi_poll on this made-up kernel (as if it were notrace).
        std::fs::write(
            root.join("sys/kernel/tracing/available_filter_functions"),
            "rxe_rcv [rdma_rxe]\nnapi_complete_done\n",
        )
        .unwrap();
        let k = Kernel::at(&root);
        let full = plan(PROBES, &Facts::gather(&k, PROBES), Options::default());
        let to_attach = plan_to_attach(&k, PROBES, Options::default());
        // With kprobes, fentry is only the fallback: the list is not read for attaching (the
        // kernel refuses a notrace fentry at attach), while `probes` reads it.
        assert_eq!(methods(&full, "__napi_poll"), [Method::Kprobe]);
        assert_eq!(
            methods(&to_attach, "__napi_poll"),
            [Method::Kprobe, Method::Fentry]
        );
        // Without kprobes fentry comes first: the list is read, and says why not.
        std::fs::remove_file(root.join("sys/bus/event_source/devices/kprobe/type")).unwrap();
        let to_attach = plan_to_attach(&Kernel::at(&root), PROBES, Options::default());
        std::fs::remove_dir_all(&root).unwrap();
        assert!(
            matches!(
                decision(&to_attach, "__napi_poll"),
                Decision::Skip(SkipReason::Notrace { .. })
            ),
            "{:?}",
            decision(&to_attach, "__napi_poll")
        );
    }

    #[test]
    fn rxe_guest_attaches_generic_rxe_and_network_probes_with_kprobes() {
        let p = plan(PROBES, &facts("guest-6.1-rxe"), Options::default());
        assert_attach(
            &p,
            &[
                "ib_uverbs_comp_handler",
                "wakeup",
                "rxe_cq_post",
                "rxe_rcv",
                "rxe_udp_encap_recv",
                "rxe_requester",
                "rxe_responder",
                "rxe_completer",
                "rxe_poll_cq",
                "__napi_poll",
                "softirq NET_RX",
                "softirq TASKLET",
                "napi_poll packets",
            ],
        );
        assert_eq!(methods(&p, "ib_uverbs_comp_handler"), [Method::Kprobe]);
        assert_eq!(methods(&p, "__napi_poll"), [Method::Kprobe, Method::Fentry]);
        for name in ["mlx5_ib_poll_cq", "mlx5_eq_comp_int", "irq mlx5_comp"] {
            assert_skipped(&p, name, &["no mlx5 device"]);
        }
        // No NIC in the guest: the IRQ probe says which names it looked for.
        assert_skipped(&p, "irq nic", &["virtio*-input*"]);
    }

    #[test]
    fn on_the_rxe_guest_the_default_attaches_the_handler_and_the_cq_post_and_full_the_rest() {
        let f = facts("guest-6.1-rxe");
        let planned = |preset: Preset| -> Vec<String> {
            let opts = Options::default().with_preset(preset);
            plan(&preset.select(PROBES, false), &f, opts)
                .probes
                .iter()
                .filter(|p| matches!(p.decision, Decision::Try(_)))
                .map(|p| p.def.name.to_string())
                .collect()
        };
        let (minimal, default, full) = (
            planned(Preset::Minimal),
            planned(Preset::Default),
            planned(Preset::Full),
        );
        assert_eq!(minimal, ["ib_uverbs_comp_handler", "rxe_cq_post"]);
        // The hardware paths' stage rows have no device here; the uprobe is opt-in.
        assert_eq!(default, minimal);
        for name in ["wakeup", "rxe_rcv", "softirq NET_RX", "__napi_poll"] {
            assert!(full.contains(&name.to_owned()), "{name}: {full:?}");
        }
        assert!(default.iter().all(|n| full.contains(n)));
        // `full` opts in to the uprobe and keeps every driver's rows; the others keep the
        // user's choice.
        let o = Options::default().with_preset(Preset::Full);
        assert!(o.uprobes && o.all_drivers);
        for preset in [Preset::Minimal, Preset::Default] {
            let o = Options::default().with_preset(preset);
            assert!(!o.uprobes && !o.all_drivers, "{preset:?}");
            let mine = Options {
                all_drivers: true,
                uprobes: true,
            };
            let o = mine.with_preset(preset);
            assert!(o.uprobes && o.all_drivers, "{preset:?}");
        }
    }

    #[test]
    fn comp_handler_slot_feeds_its_duration_and_starts_the_wakeup_interval() {
        let p = plan(PROBES, &facts("guest-6.1-rxe"), Options::default());
        let id = |name: &str| p.probes.iter().find(|q| q.def.name == name).unwrap().id;
        let slot = |f: &str| p.functions.iter().find(|s| s.function == f).unwrap().config;
        let comp = slot("ib_uverbs_comp_handler");
        assert_eq!(comp.duration, id("ib_uverbs_comp_handler"));
        assert_eq!(comp.starts, 0);
        assert_eq!(comp.ends, NO_PROBE);
        let read = slot("ib_uverbs_comp_event_read");
        assert_eq!(
            (read.duration, read.starts, read.ends),
            (NO_PROBE, NO_PROBE, 0)
        );
        assert_eq!(p.interval_probe[0], id("wakeup"));
        assert_eq!(p.softirq_probe[3], id("softirq NET_RX"));
        assert_eq!(p.softirq_probe[6], id("softirq TASKLET"));
        assert_eq!(p.softirq_probe[0], NO_PROBE);
        assert_eq!(p.napi_probe, id("napi_poll packets"));
        // Every function appears once.
        let names: HashSet<_> = p.functions.iter().map(|f| &f.function).collect();
        assert_eq!(names.len(), p.functions.len());
    }

    #[test]
    fn mlx5_host_attaches_mlx5_probes_and_its_completion_irqs() {
        let p = plan(PROBES, &facts("mlx5-6.1"), Options::default());
        assert_attach(
            &p,
            &[
                "ib_uverbs_comp_handler",
                "mlx5_ib_poll_cq",
                "mlx5_ib_cq_comp",
                "mlx5_eq_comp_int",
                "irq mlx5_comp",
            ],
        );
        let irq = p
            .probes
            .iter()
            .find(|q| q.def.name == "irq mlx5_comp")
            .unwrap();
        assert_eq!(
            irq.irqs,
            [121, 122],
            "mlx5_comp0 and mlx5_comp1, not mlx5_async0"
        );
        assert_skipped(&p, "rxe_cq_post", &["rxe"]);
        assert!(p.irq_map().contains(&(121, irq.id)));
    }

    #[test]
    fn host_without_rdma_keeps_only_tracepoints_and_says_why() {
        let p = plan(PROBES, &facts("host-6.18-no-rdma"), Options::default());
        assert_skipped(&p, "ib_uverbs_comp_handler", &["no RDMA device"]);
        assert!(attaches(&p, "softirq NET_RX"));
        // __napi_poll is in vmlinux: without kprobes, fentry is the one method left.
        assert_eq!(methods(&p, "__napi_poll"), [Method::Fentry]);
        assert!(
            attaches(&p, "irq nic"),
            "virtio input IRQs: {:?}",
            decision(&p, "irq nic")
        );
    }

    #[test]
    fn uprobes_are_opt_in_and_need_the_library() {
        let mut f = facts("guest-6.1-rxe");
        let p = plan(PROBES, &f, Options::default());
        assert_skipped(&p, "ibv_get_cq_event", &["--uprobes"]);
        let opts = Options {
            uprobes: true,
            ..Options::default()
        };
        let p = plan(PROBES, &f, opts);
        assert_skipped(&p, "ibv_get_cq_event", &["libibverbs.so.1 not found"]);
        f.libraries.insert(
            "libibverbs.so.1".into(),
            "/usr/lib/x86_64-linux-gnu/libibverbs.so.1".into(),
        );
        let p = plan(PROBES, &f, opts);
        assert_eq!(methods(&p, "ibv_get_cq_event"), [Method::Uprobe]);
    }

    #[test]
    fn all_drivers_still_needs_the_symbols_and_kprobes() {
        let p = plan(
            PROBES,
            &facts("host-6.18-no-rdma"),
            Options {
                all_drivers: true,
                ..Options::default()
            },
        );
        assert_skipped(&p, "ib_uverbs_comp_handler", &["kallsyms"]);
        let mut f = facts("guest-6.1-rxe");
        f.kprobes = false;
        let p = plan(PROBES, &f, Options::default());
        assert_skipped(&p, "rxe_cq_post", &["kprobe PMU", "module"]);
    }
}

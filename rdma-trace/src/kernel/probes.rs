//! The probe table: every probe rdma-trace knows, in one place, as data.
//!
//! A row says what users read (name, what it measures), which driver path it belongs to, its
//! shape, and how it can be attached, in order of preference. `plan.rs` decides per row against
//! what the running kernel offers and says why a row is skipped. Adding a probe = adding a row
//! (and an eBPF mechanism only for a new shape).

use std::borrow::Cow;

use serde::Serialize;

/// Which completion path a probe belongs to; rows of absent drivers are skipped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Driver {
    /// Every RDMA driver (ib_core, ib_uverbs).
    Generic,
    /// Mellanox/NVIDIA ConnectX (mlx5_core, mlx5_ib).
    Mlx5,
    /// Intel E810/X722 (irdma, on ice or i40e).
    Irdma,
    /// Broadcom NetXtreme-E (bnxt_re, on bnxt_en).
    #[serde(rename = "bnxt_re")]
    BnxtRe,
    /// Microsoft Azure Network Adapter (mana_ib, on mana).
    Mana,
    /// Soft-RoCE (rdma_rxe).
    Rxe,
    /// The network stack and interrupts under it.
    Network,
}

impl Driver {
    /// Every driver, in table order.
    pub const ALL: [Driver; 7] = [
        Driver::Generic,
        Driver::Mlx5,
        Driver::Irdma,
        Driver::BnxtRe,
        Driver::Mana,
        Driver::Rxe,
        Driver::Network,
    ];

    /// The name users type (`--driver mlx5`) and read.
    pub fn name(self) -> &'static str {
        match self {
            Driver::Generic => "generic",
            Driver::Mlx5 => "mlx5",
            Driver::Irdma => "irdma",
            Driver::BnxtRe => "bnxt_re",
            Driver::Mana => "mana",
            Driver::Rxe => "rxe",
            Driver::Network => "network",
        }
    }

    pub fn from_name(name: &str) -> Option<Driver> {
        Driver::ALL.into_iter().find(|d| d.name() == name)
    }
}

/// What a probe measures. The table's rows hold borrowed names; rows built at run time
/// (`funclat`'s functions, `irq`'s IRQ names) own theirs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Shape {
    /// Entry → return of a kernel function (ns), per call.
    Duration { function: Cow<'static, str> },
    /// From the entry of `from` to the return of `to` (ns), e.g. wake-up latency.
    Interval {
        from: &'static str,
        to: &'static str,
    },
    /// One softirq vector, entry → exit (ns).
    Softirq { vector: u32 },
    /// Hard IRQ handlers whose /proc/interrupts name matches one of `patterns` (`*` = any
    /// text), entry → exit (ns).
    Irq { patterns: Patterns },
    /// NAPI polls: count, and packets handled per poll.
    NapiPoll,
    /// The ib_cq API's wake-up of kernel consumers' CQs: scheduled (`rdma_core:cq_schedule`,
    /// `cq_reschedule`) → the poll starts (`cq_process`), matched per CQ (ns).
    CqWakeup,
    /// rdma_cm connection set-up, per connection: the active side's REQ sent
    /// (`rdma_cma:cm_send_req`) or the passive side's CONNECT_REQUEST event → its ESTABLISHED
    /// event (`rdma_cma:cm_event_handler`) (ns); every CM event counted by type.
    CmConnect,
    /// NVMe over RDMA host requests, issue (`nvme:nvme_setup_cmd`) → completed
    /// (`nvme:nvme_complete_rq`) (ns), split into stages with `nvme_rdma_post_send`, the
    /// ib_cq poll round and `blk_mq_complete_request_remote` (kprobes).
    NvmeIo,
    /// NVMe over RDMA target commands of the I/O queues, started (`nvmet:nvmet_req_init`) →
    /// completed (`nvmet:nvmet_req_complete`) (ns).
    NvmetIo,
    /// Entry → return of a function in a shared library, in the watched processes (ns).
    UserFunction {
        library: &'static str,
        symbol: &'static str,
    },
}

impl Shape {
    /// The kernel functions the row hooks (kprobes or fentry): none for tracepoint rows.
    pub fn functions(&self) -> Vec<&str> {
        match self {
            Shape::Duration { function } => vec![function],
            Shape::Interval { from, to } => vec![from, to],
            _ => Vec::new(),
        }
    }
}

/// The /proc/interrupts name patterns of an IRQ row: the table's, or names found at run time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Patterns {
    Table(&'static [&'static str]),
    Owned(Vec<String>),
}

impl Patterns {
    pub fn iter(&self) -> impl Iterator<Item = &str> {
        let (table, owned) = match self {
            Patterns::Table(t) => (*t, &[][..]),
            Patterns::Owned(o) => (&[][..], o.as_slice()),
        };
        table
            .iter()
            .copied()
            .chain(owned.iter().map(String::as_str))
    }

    /// Whether IRQ name `name` matches one of the patterns.
    pub fn matches(&self, name: &str) -> bool {
        self.iter().any(|p| glob_match(p, name))
    }
}

/// What a row is for, besides its own histogram.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// A stage of the completion path (or of the network and interrupts under it).
    Stage,
    /// A stage whose count is also the demo's progress: rxe posts a fixed number of
    /// completions per round trip.
    Progress,
    /// A row whose function's calls, counted per process, are each process's completion-event
    /// reads: a run that reports per process (a workload) attaches it whatever its preset.
    Reads,
}

/// `--probes`: which rows of the table a run attaches. Each preset holds the rows of the ones
/// before it: minimal ⊂ default ⊂ full.
#[derive(
    clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Preset {
    /// The completion handler and each driver's hand-off of the completion to it (rxe_cq_post
    /// also drives the progress count): the cheapest view.
    Minimal,
    /// Where a completion's time goes, with the fewest hooks: the minimal rows and one row per
    /// stage of each driver's path (interrupt, deferred work); the waterfall does the rest.
    #[default]
    Default,
    /// Everything: every driver function, the kernel-consumer poll rows, the wake-up interval,
    /// softirq, IRQ and NAPI rows on every CPU, the user-space probe, every driver's rows.
    Full,
}

impl Preset {
    /// Its name on the command line, in listings and in the JSON.
    pub fn name(self) -> &'static str {
        match self {
            Preset::Minimal => "minimal",
            Preset::Default => "default",
            Preset::Full => "full",
        }
    }

    /// Whether this preset attaches `def` (a row belongs to its own preset and every larger
    /// one).
    pub fn holds(self, def: &ProbeDef) -> bool {
        def.preset <= self
    }

    /// The rows of `defs` this preset attaches, in their order; with the [`Role::Reads`] rows
    /// too when the run reports per process (`per_process`: `run -- CMD`, `--pid`, `--all`),
    /// whose completion-event reads they count.
    pub fn select(self, defs: &[ProbeDef], per_process: bool) -> Vec<ProbeDef> {
        defs.iter()
            .filter(|d| self.holds(d) || (per_process && d.role == Role::Reads))
            .cloned()
            .collect()
    }
}

/// How a probe point can be attached.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Method {
    /// kprobe + kretprobe (needs the kprobe PMU; module functions too).
    Kprobe,
    /// fentry/fexit on a vmlinux function (BTF trampolines).
    Fentry,
    /// Raw tracepoint (no tracefs needed).
    RawTracepoint,
    /// uprobe + uretprobe on a user-space function (a trap per call: opt-in).
    Uprobe,
}

impl Method {
    pub fn label(self) -> &'static str {
        match self {
            Method::Kprobe => "kprobe",
            Method::Fentry => "fentry",
            Method::RawTracepoint => "raw_tp",
            Method::Uprobe => "uprobe",
        }
    }
}

/// Unit of the values a probe's histogram holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Unit {
    Nanoseconds,
    Packets,
}

/// One row of the table.
#[derive(Clone, Debug)]
pub struct ProbeDef {
    /// The name users read in reports.
    pub name: Cow<'static, str>,
    /// What it measures, one line.
    pub what: &'static str,
    pub driver: Driver,
    pub shape: Shape,
    /// Attach methods in order of preference.
    pub methods: &'static [Method],
    /// Shown with the probe when it counts nothing although attached, where that is expected.
    pub zero_note: Option<&'static str>,
    /// The kernel module that holds the row's functions (`None`: vmlinux, or not a function).
    /// A function missing from kallsyms while its module is loaded was inlined.
    pub module: Option<&'static str>,
    /// The first kernel release (major, minor) whose sources have the row's functions, where
    /// older kernels the tool supports lack them.
    pub since: Option<(u32, u32)>,
    pub role: Role,
    /// The smallest `--probes` preset that attaches the row.
    pub preset: Preset,
}

impl ProbeDef {
    pub fn unit(&self) -> Unit {
        match self.shape {
            Shape::NapiPoll => Unit::Packets,
            _ => Unit::Nanoseconds,
        }
    }
}

const FUNC: &[Method] = &[Method::Kprobe, Method::Fentry];
const MODULE_FUNC: &[Method] = &[Method::Kprobe];
const TRACEPOINT: &[Method] = &[Method::RawTracepoint];

impl ProbeDef {
    /// A stage row of the full preset, with no note, module or version limit: what the
    /// constructors below and the commands' own rows (`funclat`, `irq`) start from.
    pub const fn stage(
        name: Cow<'static, str>,
        what: &'static str,
        driver: Driver,
        shape: Shape,
        methods: &'static [Method],
    ) -> ProbeDef {
        ProbeDef {
            name,
            what,
            driver,
            shape,
            methods,
            zero_note: None,
            module: None,
            since: None,
            role: Role::Stage,
            preset: Preset::Full,
        }
    }

    /// The common row: one function of kernel module `module`, entry → return (kprobe and
    /// kretprobe), reported under the function's own name.
    const fn module_function(
        driver: Driver,
        module: &'static str,
        function: &'static str,
        what: &'static str,
    ) -> ProbeDef {
        let mut row = ProbeDef::stage(
            Cow::Borrowed(function),
            what,
            driver,
            Shape::Duration {
                function: Cow::Borrowed(function),
            },
            MODULE_FUNC,
        );
        row.module = Some(module);
        row
    }

    /// A row of the hard IRQ handlers whose /proc/interrupts names match `patterns` (raw
    /// tracepoints).
    const fn irq(
        driver: Driver,
        name: &'static str,
        patterns: &'static [&'static str],
        what: &'static str,
    ) -> ProbeDef {
        ProbeDef::stage(
            Cow::Borrowed(name),
            what,
            driver,
            Shape::Irq {
                patterns: Patterns::Table(patterns),
            },
            TRACEPOINT,
        )
    }

    /// A row timing softirq vector `vector`, entry → exit (raw tracepoints).
    pub const fn softirq(name: &'static str, vector: u32, what: &'static str) -> ProbeDef {
        ProbeDef::stage(
            Cow::Borrowed(name),
            what,
            Driver::Network,
            Shape::Softirq { vector },
            TRACEPOINT,
        )
    }

    /// The row, with a note shown when it counts nothing although attached.
    const fn zero_note(mut self, note: &'static str) -> ProbeDef {
        self.zero_note = Some(note);
        self
    }

    /// The row, whose functions exist from kernel release `major`.`minor` on.
    const fn since(mut self, major: u32, minor: u32) -> ProbeDef {
        self.since = Some((major, minor));
        self
    }

    /// The row, in `preset` and the larger ones (rows are in `full` alone unless they say).
    const fn preset(mut self, preset: Preset) -> ProbeDef {
        self.preset = preset;
        self
    }

    /// The row, whose count is also the demo's progress.
    const fn progress(mut self) -> ProbeDef {
        self.role = Role::Progress;
        self
    }
}

/// Every probe, grouped by driver path.
pub const PROBES: &[ProbeDef] = &[
    // ---- generic: ib_uverbs delivers completion events to user space
    ProbeDef::module_function(
        Driver::Generic,
        "ib_uverbs",
        "ib_uverbs_comp_handler",
        "a CQ with a completion channel got a completion: queue the event, wake the waiter (event mode)",
    )
    .zero_note("polling mode takes no completion events: expected 0")
    .preset(Preset::Minimal),
    ProbeDef {
        name: Cow::Borrowed("ibv_get_cq_event"),
        what: "the demo blocked in ibv_get_cq_event until a completion event arrived (uprobe, opt-in)",
        driver: Driver::Generic,
        shape: Shape::UserFunction {
            library: "libibverbs.so.1",
            symbol: "ibv_get_cq_event",
        },
        methods: &[Method::Uprobe],
        zero_note: Some("polling mode never waits on the completion channel"),
        module: None,
        since: None,
        role: Role::Stage,
        // In every preset, so that `--uprobes` opts in whatever the preset (`full` opts in by
        // itself); without `--uprobes` the plan skips it.
        preset: Preset::Minimal,
    },
    ProbeDef {
        name: Cow::Borrowed("wakeup"),
        what: "completion event queued (ib_uverbs_comp_handler) → the waiting thread's read of it returns",
        driver: Driver::Generic,
        shape: Shape::Interval {
            from: "ib_uverbs_comp_handler",
            to: "ib_uverbs_comp_event_read",
        },
        methods: MODULE_FUNC,
        zero_note: Some("nobody blocked on a completion channel (polling mode)"),
        module: Some("ib_uverbs"),
        since: None,
        // Its end function counts each process's reads in workload runs.
        role: Role::Reads,
        preset: Preset::Full,
    },
    // ---- generic: the ib_cq API of the kernel's own consumers (NVMe-oF, NFS/RDMA, iSER, the
    // MAD layer): the CQ's completion handler schedules its poll, which runs in softirq
    // (irq_poll) or in an ib-comp-wq kworker.
    ProbeDef {
        name: Cow::Borrowed("ib_cq wakeup"),
        what: "a kernel consumer's CQ scheduled (rdma_core:cq_schedule, or cq_reschedule after a full budget) → its poll starts (cq_process) in softirq or an ib-comp-wq kworker",
        driver: Driver::Generic,
        shape: Shape::CqWakeup,
        methods: TRACEPOINT,
        zero_note: Some("no kernel consumer (NVMe-oF, NFS over RDMA, ...) took completions through the ib_cq API; user-space verbs never do"),
        module: Some("ib_core"),
        since: None,
        role: Role::Stage,
        preset: Preset::Full,
    },
    // ---- generic: NVMe over RDMA, per host request (nvme-rdma): issue, the command's post, the
    // poll round that found the response, the done callback, the completion.
    ProbeDef {
        name: Cow::Borrowed("nvme io"),
        what: "an NVMe over RDMA host request, issued (nvme:nvme_setup_cmd) → completed (nvme:nvme_complete_rq), split at the command's post (nvme_rdma_post_send), its CQ's schedule and poll start (rdma_core) and its done callback (blk_mq_complete_request_remote); admin commands left out",
        driver: Driver::Generic,
        shape: Shape::NvmeIo,
        methods: TRACEPOINT,
        zero_note: Some("no NVMe over RDMA I/O completed in the window (nvme-rdma connected?)"),
        module: Some("nvme_rdma"),
        since: None,
        role: Role::Stage,
        preset: Preset::Full,
    },
    // ---- generic: NVMe over RDMA, per target command (nvmet-rdma): the target's own time.
    ProbeDef {
        name: Cow::Borrowed("nvmet io"),
        what: "an NVMe over RDMA target command of an I/O queue, started (nvmet:nvmet_req_init, once nvmet-rdma has the command) → completed (nvmet:nvmet_req_complete: the backend done, before the response is posted); the admin queue left out",
        driver: Driver::Generic,
        shape: Shape::NvmetIo,
        methods: TRACEPOINT,
        zero_note: Some("no NVMe over RDMA target command completed in the window (an nvmet-rdma port with a connected host?)"),
        module: Some("nvmet"),
        since: None,
        role: Role::Stage,
        preset: Preset::Full,
    },
    // ---- generic: rdma_cm connection set-up (librdmacm programs through ucma, and the kernel's
    // consumers: nvme-rdma, rpcrdma, iSER). A few hits per connection, none per completion.
    ProbeDef {
        name: Cow::Borrowed("rdma_cm connect"),
        what: "rdma_cm connection set-up: REQ sent (rdma_cma:cm_send_req, active side) or CONNECT_REQUEST delivered (passive side) → ESTABLISHED delivered (cm_event_handler; CONNECT_RESPONSE on an active side whose QP user space owns), per connection end",
        driver: Driver::Generic,
        shape: Shape::CmConnect,
        methods: TRACEPOINT,
        zero_note: Some("no rdma_cm connection was established in the window (verbs programs that exchange QP numbers themselves never use rdma_cm)"),
        module: Some("rdma_cm"),
        since: None,
        role: Role::Stage,
        preset: Preset::Default,
    },
    // ---- mlx5 (mlx5_core + mlx5_ib, 6.1 and 6.12): IRQ mlx5_comp<N> → irq_int_handler →
    // mlx5_eq_comp_int (EQ) → user CQs: mlx5_add_cq_to_tasklet, then the tasklet
    // mlx5_cq_tasklet_cb → mlx5_ib_cq_comp → comp_handler (kernel CQs: mlx5_ib_cq_comp directly).
    ProbeDef::irq(
        Driver::Mlx5,
        "irq mlx5_comp",
        &["mlx5_comp*", "mlx5_sf_comp*", "mlx5_combined*"],
        "hard IRQ handlers of mlx5 completion vectors (mlx5_comp<N>@pci:<bdf>; SFs: mlx5_sf_comp<N>; one-vector devices: mlx5_combined0)",
    ),
    ProbeDef::module_function(
        Driver::Mlx5,
        "mlx5_core",
        "mlx5_eq_comp_int",
        "mlx5 completion EQ handler (hard IRQ): walks the EQ, hands each CQ to its callback",
    )
    .preset(Preset::Default),
    ProbeDef::module_function(
        Driver::Mlx5,
        "mlx5_core",
        "mlx5_cq_tasklet_cb",
        "mlx5 completion tasklet: runs the completion callbacks of user CQs the EQ queued",
    )
    .zero_note("only armed user CQs (event mode) go through the tasklet")
    .preset(Preset::Default),
    ProbeDef::module_function(
        Driver::Mlx5,
        "mlx5_ib",
        "mlx5_ib_cq_comp",
        "mlx5_ib calls the CQ's comp_handler (ib_uverbs_comp_handler for user CQs)",
    )
    .zero_note("only armed CQs (event mode) get completion callbacks")
    .preset(Preset::Minimal),
    ProbeDef::module_function(
        Driver::Mlx5,
        "mlx5_ib",
        "mlx5_ib_poll_cq",
        "kernel-side CQ polling (kernel consumers such as __ib_process_cq)",
    )
    .zero_note("serves kernel consumers only: user space polls mlx5 CQs in rdma-core's provider, without the kernel: expected 0 for the demos"),
    // ---- irdma (6.1 and 6.12): IRQ (6.1 "CEQ"/"AEQCEQ", 6.12 irdma-<bdf>-CEQ-<n>) →
    // irdma_ceq_handler → tasklet irdma_ceq_dpc → irdma_process_ceq → irdma_iwarp_ce_handler →
    // comp_handler. Vector 0 may be shared with the AEQ: irdma_irq_handler → irdma_dpc.
    ProbeDef::irq(
        Driver::Irdma,
        "irq irdma_ceq",
        &["irdma-*-CEQ-*", "irdma-*-AEQCEQ-*", "CEQ", "AEQCEQ"],
        "hard IRQ handlers of irdma completion event queues (CEQ vectors)",
    ),
    ProbeDef::module_function(
        Driver::Irdma,
        "irdma",
        "irdma_ceq_handler",
        "irdma CEQ interrupt handler (hard IRQ): schedules the CEQ tasklet",
    )
    .zero_note("CEQ 0 shares its vector with the AEQ where MSI-X is short (irdma_irq_handler)")
    .preset(Preset::Default),
    ProbeDef::module_function(
        Driver::Irdma,
        "irdma",
        "irdma_ceq_dpc",
        "irdma CEQ tasklet: processes one completion event queue",
    )
    .preset(Preset::Default),
    ProbeDef::module_function(
        Driver::Irdma,
        "irdma",
        "irdma_process_ceq",
        "irdma walks a CEQ: one CQ per event, whose comp_handler it calls",
    )
    // irdma_iwarp_ce_handler is inlined here on the Debian kernels: this is the hand-off.
    .preset(Preset::Minimal),
    ProbeDef::module_function(
        Driver::Irdma,
        "irdma",
        "irdma_iwarp_ce_handler",
        "irdma calls the CQ's comp_handler (ib_uverbs_comp_handler for user CQs)",
    )
    .zero_note("only armed CQs (event mode) get completion callbacks"),
    ProbeDef::module_function(
        Driver::Irdma,
        "irdma",
        "irdma_poll_cq",
        "kernel-side polling of an irdma CQ (kernel consumers only)",
    )
    .zero_note("serves kernel consumers only: user space polls irdma CQs in rdma-core's provider: expected 0 for the demos"),
    // ---- bnxt_re (6.12; Debian's 6.1 does not build it): IRQ bnxt_re-nq-<n>@pci:<bdf> →
    // bnxt_qplib_nq_irq → tasklet bnxt_qplib_service_nq → bnxt_re_cqn_handler → comp_handler.
    ProbeDef::irq(
        Driver::BnxtRe,
        "irq bnxt_re_nq",
        &["bnxt_re-nq-*"],
        "hard IRQ handlers of bnxt_re notification queues (bnxt_re-nq-<n>@pci:<bdf>)",
    ),
    ProbeDef::module_function(
        Driver::BnxtRe,
        "bnxt_re",
        "bnxt_qplib_nq_irq",
        "bnxt_re notification queue interrupt handler (hard IRQ): schedules the NQ tasklet",
    )
    .preset(Preset::Default),
    ProbeDef::module_function(
        Driver::BnxtRe,
        "bnxt_re",
        "bnxt_qplib_service_nq",
        "bnxt_re NQ tasklet: walks the notification queue, one CQ per CQ notification",
    )
    .preset(Preset::Default),
    ProbeDef::module_function(
        Driver::BnxtRe,
        "bnxt_re",
        "bnxt_re_cqn_handler",
        "bnxt_re calls the CQ's comp_handler (ib_uverbs_comp_handler for user CQs)",
    )
    .zero_note("only armed CQs (event mode) get completion callbacks")
    .preset(Preset::Minimal),
    ProbeDef::module_function(
        Driver::BnxtRe,
        "bnxt_re",
        "bnxt_re_poll_cq",
        "kernel-side polling of a bnxt_re CQ (kernel consumers only)",
    )
    .zero_note("serves kernel consumers only: user space polls bnxt_re CQs in rdma-core's provider: expected 0 for the demos"),
    // ---- mana_ib (6.12): IRQ mana_q<n>@pci:<bdf> (shared with the Ethernet queues) →
    // mana_gd_intr → mana_gd_process_eq_events (EQ) → mana_ib_cq_handler → comp_handler.
    ProbeDef::irq(
        Driver::Mana,
        "irq mana_q",
        &["mana_q*"],
        "hard IRQ handlers of MANA queue vectors (mana_q<n>@pci:<bdf>; shared with Ethernet)",
    ),
    ProbeDef::module_function(
        Driver::Mana,
        "mana",
        "mana_gd_intr",
        "MANA interrupt handler (hard IRQ): runs the handler of every EQ on the vector",
    )
    .preset(Preset::Default),
    ProbeDef::module_function(
        Driver::Mana,
        "mana",
        "mana_gd_process_eq_events",
        "MANA EQ handler: walks the EQ, calls each completed CQ's callback",
    ),
    ProbeDef::module_function(
        Driver::Mana,
        "mana_ib",
        "mana_ib_cq_handler",
        "mana_ib calls the CQ's comp_handler (ib_uverbs_comp_handler for user CQs)",
    )
    .zero_note("only armed CQs (event mode) get completion callbacks")
    .preset(Preset::Minimal),
    ProbeDef::module_function(
        Driver::Mana,
        "mana_ib",
        "mana_ib_poll_cq",
        "kernel-side polling of a mana_ib CQ (kernel consumers only)",
    )
    .zero_note("serves kernel consumers only: user space polls MANA CQs in rdma-core's provider: expected 0 for the demos")
    .since(6, 15),
    // ---- rxe: packets arrive through the network stack; responder/completer post CQEs
    ProbeDef::module_function(
        Driver::Rxe,
        "rdma_rxe",
        "rxe_udp_encap_recv",
        "a RoCE v2 UDP packet reaches rxe from the IP stack",
    )
    .zero_note("traffic inside one rxe device loops back without the IP stack"),
    ProbeDef::module_function(
        Driver::Rxe,
        "rdma_rxe",
        "rxe_rcv",
        "rxe validates a received packet and hands it to the responder or completer",
    ),
    ProbeDef::module_function(
        Driver::Rxe,
        "rdma_rxe",
        "rxe_requester",
        "rxe requester task: turns send WQEs into packets",
    ),
    ProbeDef::module_function(
        Driver::Rxe,
        "rdma_rxe",
        "rxe_responder",
        "rxe responder task: executes incoming requests (RECV, WRITE, READ, atomics)",
    ),
    ProbeDef::module_function(
        Driver::Rxe,
        "rdma_rxe",
        "rxe_completer",
        "rxe completer task: retires acknowledged send WQEs",
    ),
    ProbeDef::module_function(
        Driver::Rxe,
        "rdma_rxe",
        "rxe_cq_post",
        "rxe writes a completion into a CQ (and notifies, when armed)",
    )
    .progress()
    .preset(Preset::Minimal),
    ProbeDef::module_function(
        Driver::Rxe,
        "rdma_rxe",
        "rxe_poll_cq",
        "kernel-side polling of an rxe CQ (kernel consumers only)",
    )
    .zero_note("the rxe provider polls the CQ mapped into user space, without the kernel: expected 0, not a bug"),
    // ---- network and interrupts
    ProbeDef::stage(
        Cow::Borrowed("__napi_poll"),
        "one NAPI poll of a device or the backlog",
        Driver::Network,
        Shape::Duration {
            function: Cow::Borrowed("__napi_poll"),
        },
        FUNC,
    ),
    ProbeDef::stage(
        Cow::Borrowed("napi_poll packets"),
        "packets handled per NAPI poll (napi:napi_poll work; budget is usually 64)",
        Driver::Network,
        Shape::NapiPoll,
        TRACEPOINT,
    ),
    ProbeDef::softirq("softirq NET_RX", 3, "NET_RX softirq runs (receive processing, NAPI polls)"),
    ProbeDef::softirq("softirq TASKLET", 6, "TASKLET softirq runs (mlx5 completion tasklets, rxe on 6.1)"),
    ProbeDef::irq(
        Driver::Network,
        "irq nic",
        &["virtio*-input*", "mlx5_async*", "eth*", "ens*", "enp*"],
        "hard IRQ handlers of NIC queues (virtio input, mlx5 async/ctrl)",
    ),
];

/// `*` matches any text (also none); everything else matches itself.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == text,
        Some((head, rest)) => {
            let Some(tail) = text.strip_prefix(head) else {
                return false;
            };
            (0..=tail.len()).any(|i| tail.is_char_boundary(i) && glob_match(rest, &tail[i..]))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glob() {
        assert!(glob_match("mlx5_comp*", "mlx5_comp0@pci:0000:3b:00.0"));
        assert!(!glob_match("mlx5_comp*", "mlx5_async0@pci:0000:3b:00.0"));
        assert!(glob_match("virtio*-input*", "virtio4-input.0"));
        assert!(!glob_match("virtio*-input*", "virtio0-requests"));
        assert!(glob_match("timer", "timer") && !glob_match("timer", "timers"));
        assert!(glob_match("*", ""));
    }

    #[test]
    fn driver_function_rows_name_a_module_of_their_driver_path() {
        for p in PROBES {
            if matches!(p.shape, Shape::Duration { .. } | Shape::Interval { .. })
                && p.driver != Driver::Network
            {
                let m = p.module.unwrap_or_else(|| panic!("{}: no module", p.name));
                let modules: &[&str] = match p.driver {
                    Driver::Generic => &["ib_core", "ib_uverbs"],
                    Driver::Mlx5 => &["mlx5_core", "mlx5_ib"],
                    Driver::Irdma => &["irdma"],
                    Driver::BnxtRe => &["bnxt_re"],
                    Driver::Mana => &["mana", "mana_ib"],
                    Driver::Rxe => &["rdma_rxe"],
                    Driver::Network => &[],
                };
                assert!(modules.contains(&m), "{}: {m}", p.name);
            }
        }
        for d in Driver::ALL {
            assert_eq!(Driver::from_name(d.name()), Some(d));
        }
        assert_eq!(Driver::from_name("mlx4"), None);
    }

    /// The names of the rows with `role`, in table order.
    fn with_role(role: Role) -> Vec<&'static str> {
        PROBES
            .iter()
            .filter(|p| p.role == role)
            .map(|p| p.name.as_ref())
            .collect()
    }

    #[test]
    fn one_row_counts_progress() {
        assert_eq!(with_role(Role::Progress), ["rxe_cq_post"]);
    }

    /// The names of the rows `preset` attaches, in table order.
    fn names(preset: Preset) -> Vec<&'static str> {
        PROBES
            .iter()
            .filter(|p| preset.holds(p))
            .map(|p| match &p.name {
                Cow::Borrowed(n) => *n,
                Cow::Owned(n) => panic!("{n}: table rows borrow their names"),
            })
            .collect()
    }

    /// Every preset, smallest first.
    const PRESETS: [Preset; 3] = [Preset::Minimal, Preset::Default, Preset::Full];

    #[test]
    fn presets_nest_and_full_is_the_whole_table() {
        for pair in PRESETS.windows(2) {
            let (small, large) = (names(pair[0]), names(pair[1]));
            assert!(
                small.iter().all(|n| large.contains(n)),
                "{:?} ⊄ {:?}",
                pair[0],
                pair[1]
            );
            assert!(small.len() < large.len(), "{:?} adds nothing", pair[1]);
        }
        assert_eq!(Preset::Full.select(PROBES, false).len(), PROBES.len());
        for preset in PRESETS {
            let rows = preset.select(PROBES, false);
            assert_eq!(rows.len(), names(preset).len(), "{preset:?}");
            assert!(rows.iter().all(|r| preset.holds(r)));
        }
    }

    #[test]
    fn a_per_process_run_adds_the_row_that_counts_reads_to_any_preset() {
        assert_eq!(with_role(Role::Reads), ["wakeup"]);
        let Shape::Interval { to, .. } = &PROBES.iter().find(|p| p.name == "wakeup").unwrap().shape
        else {
            panic!("wakeup is an interval")
        };
        assert_eq!(*to, "ib_uverbs_comp_event_read");
        for preset in PRESETS {
            let demo: Vec<String> = preset
                .select(PROBES, false)
                .iter()
                .map(|p| p.name.to_string())
                .collect();
            let workload: Vec<String> = preset
                .select(PROBES, true)
                .iter()
                .map(|p| p.name.to_string())
                .collect();
            assert_eq!(demo, names(preset), "{preset:?}");
            assert!(workload.contains(&"wakeup".to_owned()), "{preset:?}");
            let added: Vec<&String> = workload.iter().filter(|n| !demo.contains(n)).collect();
            assert!(added.len() <= 1, "{preset:?}: {added:?}");
        }
    }

    #[test]
    fn minimal_is_the_handler_and_each_drivers_hand_off() {
        assert_eq!(
            names(Preset::Minimal),
            [
                "ib_uverbs_comp_handler",
                // opt-in (--uprobes) in every preset
                "ibv_get_cq_event",
                "mlx5_ib_cq_comp",
                "irdma_process_ceq",
                "bnxt_re_cqn_handler",
                "mana_ib_cq_handler",
                "rxe_cq_post",
            ]
        );
        // One row per RDMA driver path, the progress row among them.
        for d in Driver::ALL {
            let n = PROBES
                .iter()
                .filter(|p| p.driver == d && p.preset == Preset::Minimal)
                .filter(|p| !p.methods.contains(&Method::Uprobe))
                .count();
            let want = usize::from(d != Driver::Network);
            assert_eq!(n, want, "{d:?}");
        }
        let progress = PROBES.iter().find(|p| p.role == Role::Progress).unwrap();
        assert_eq!(progress.preset, Preset::Minimal);
    }

    #[test]
    fn the_default_adds_one_row_per_stage_of_each_hardware_path_and_nothing_machine_wide() {
        let added: Vec<&str> = names(Preset::Default)
            .into_iter()
            .filter(|n| !names(Preset::Minimal).contains(n))
            .collect();
        assert_eq!(
            added,
            [
                // rdma_cm: a few hits per connection, none per completion
                "rdma_cm connect",
                // mlx5: hard IRQ (EQ handler), completion tasklet
                "mlx5_eq_comp_int",
                "mlx5_cq_tasklet_cb",
                // irdma: hard IRQ (CEQ handler), CEQ tasklet (around irdma_process_ceq)
                "irdma_ceq_handler",
                "irdma_ceq_dpc",
                // bnxt_re: hard IRQ (NQ handler), NQ tasklet
                "bnxt_qplib_nq_irq",
                "bnxt_qplib_service_nq",
                // mana: hard IRQ, which walks the EQ in place
                "mana_gd_intr",
            ]
        );
        for p in PROBES.iter().filter(|p| Preset::Default.holds(p)) {
            // Softirq, IRQ and NAPI rows run on every softirq, IRQ or poll of the machine; the
            // wake-up interval is the waterfall's to measure; kernel consumers' polls are not
            // the demo's path. rdma_cm's set-up runs per connection.
            assert!(
                matches!(
                    p.shape,
                    Shape::Duration { .. } | Shape::UserFunction { .. } | Shape::CmConnect
                ),
                "{} is in the default",
                p.name
            );
            assert_ne!(p.driver, Driver::Network, "{}", p.name);
            assert!(!p.name.ends_with("_poll_cq"), "{}", p.name);
        }
        // Every rxe function but the CQ post is in `full` alone.
        let rxe: Vec<&str> = names(Preset::Default)
            .into_iter()
            .filter(|n| n.starts_with("rxe_"))
            .collect();
        assert_eq!(rxe, ["rxe_cq_post"]);
    }

    #[test]
    fn names_are_unique_and_rows_complete() {
        for (i, p) in PROBES.iter().enumerate() {
            assert!(!p.what.is_empty() && !p.methods.is_empty(), "{}", p.name);
            assert!(
                PROBES[i + 1..].iter().all(|q| q.name != p.name),
                "duplicate {}",
                p.name
            );
        }
    }

    #[test]
    fn every_driver_path_has_probes_and_the_issue_points_are_there() {
        for d in Driver::ALL {
            assert!(PROBES.iter().any(|p| p.driver == d), "{d:?}");
        }
        for name in [
            "ib_uverbs_comp_handler",
            "mlx5_ib_poll_cq",
            "mlx5_ib_cq_comp",
            "mlx5_eq_comp_int",
            "irdma_process_ceq",
            "bnxt_re_cqn_handler",
            "mana_ib_cq_handler",
            "rxe_cq_post",
            "rxe_rcv",
            "rxe_udp_encap_recv",
            "rxe_completer",
            "rxe_responder",
            "rxe_requester",
            "__napi_poll",
            "softirq NET_RX",
            "softirq TASKLET",
        ] {
            assert!(PROBES.iter().any(|p| p.name == name), "{name} missing");
        }
    }
}

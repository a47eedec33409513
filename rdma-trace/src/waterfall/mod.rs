//! The completion waterfall (loader side): attach the programs of
//! `rdma-trace-ebpf/src/waterfall.rs`, read their per-thread rows, and turn them into stage
//! tables, CPU placement and the poll/event explanation.
//!
//! It lives in the probe table's object: [`Prepared`] sets its globals before the object is
//! loaded, and [`Waterfall::start`] attaches its programs there and takes its maps. Where it
//! hooks a function the table times too (the completion handler, rxe's CQE post), its programs
//! do the table's work as well ([`SHARED_HOOKS`]): one program runs per hit instead of two.

pub mod btf;
pub mod model;
pub mod selection;
pub mod stall;
pub mod topology;

use std::{
    cell::{Cell, RefCell},
    collections::BTreeMap,
    path::Path,
    time::Duration,
};

use anyhow::{Context as _, Result, anyhow, bail};
use aya::{
    Ebpf,
    maps::{Array, HashMap as BpfHashMap, MapData, PerCpuArray, RingBuf},
    programs::{KProbe, Program, ProgramError, RawTracePoint, TracePoint},
};
use rdma_trace_common::waterfall::{
    NR_CPU_KINDS, WF_NHIST, WF_THREADS, WfConfig, WfCounts, WfCpuTopo, WfCq, WfCqKey, WfCqRow,
    WfHist, WfQueue, WfReading, WfSample, WfThread, WfWake, cpu_event_index,
};

pub use self::model::{Snapshot, WaterfallReport};
use self::{btf::Btf, topology::Topology};
use crate::{
    bpf::hist::Histogram,
    bpf::loader::{Bpf, ObjectConfig, SharedHook},
    bpf::session::Session,
    error::Unsupported,
    error::chain,
    kernel::facts::{Kernel, format_offset},
};

/// Offset of `field` in tracepoint `event`'s records (`sched/sched_switch`), from tracefs.
fn need_offset(kernel: &Kernel, event: &str, field: &str) -> Result<u32> {
    let format = kernel.event_format(event).ok_or_else(|| {
        anyhow!(Unsupported(format!(
            "no tracefs format file for {event} (is tracefs mounted at /sys/kernel/tracing?)"
        )))
    })?;
    format_offset(&format, field)
        .with_context(|| format!("tracepoint {event} has no field {field}"))
}

/// The offsets the programs read kernel structures at, from BTF.
struct Offsets {
    /// `struct file`'s `private_data`.
    private: u32,
    /// The completion channel's `ev_queue`.
    ev_queue: u32,
    /// `struct ib_cq`'s restrack id (`res.id`), 0 when not found.
    cq_res_id: u32,
    /// `struct task_struct`'s state, 0 when not found.
    task_state: u32,
    /// `struct ib_cq`'s `device` and `struct ib_device`'s `name` (the CQ rows' device
    /// labels), zeros when not found.
    cq_device: [u32; 2],
    /// `struct ib_uverbs_event_queue`'s `event_list` (the mirror's check), 0 when not found.
    event_list: u32,
    /// rxe (its module's BTF, when loaded): `rxe_cq.queue`, `rxe_queue.buf`, and the shared
    /// buffer's `index_mask`, `producer_index`, `consumer_index`; zeros when not found.
    rxe: [u32; 5],
}

/// [`Offsets`] from the kernel's BTF, ib_uverbs' module BTF and rdma_rxe's.
fn btf_offsets(root: &Path) -> Result<Offsets> {
    let dir = root.join("sys/kernel/btf");
    let vmlinux = std::fs::read(dir.join("vmlinux")).map_err(|e| {
        anyhow!(Unsupported(format!(
            "the waterfall needs kernel BTF ({}: {e})",
            dir.join("vmlinux").display()
        )))
    })?;
    let base = Btf::parse(&vmlinux, None).context("parsing vmlinux BTF")?;
    let private = base
        .member_offset("file", "private_data")
        .context("vmlinux BTF")?;
    // Optional: without it, a reader whose wake-up raced with its switch-out counts as asleep
    // until that wake-up lands it on a CPU.
    let task_state = base
        .member_offset("task_struct", "__state")
        .or_else(|_| base.member_offset("task_struct", "state"))
        .unwrap_or(0);
    let module = std::fs::read(dir.join("ib_uverbs"))
        .map_err(|e| anyhow!(Unsupported(missing_module_btf(root, &dir, &e))))?;
    let split = Btf::parse(&module, Some(base.clone())).context("parsing ib_uverbs BTF")?;
    let ev_queue = split
        .member_offset("ib_uverbs_completion_event_file", "ev_queue")
        .context("ib_uverbs BTF")?;
    // The stall doctor's extras are optional: without them it says less.
    let cq_res_id = split
        .member_offset("ib_cq", "res")
        .and_then(|r| Ok(r + split.member_offset("rdma_restrack_entry", "id")?))
        .unwrap_or(0);
    let cq_device = split
        .member_offset("ib_cq", "device")
        .and_then(|d| Ok([d, split.member_offset("ib_device", "name")?]))
        .unwrap_or([0; 2]);
    let event_list = split
        .member_offset("ib_uverbs_event_queue", "event_list")
        .unwrap_or(0);
    let rxe = std::fs::read(dir.join("rdma_rxe"))
        .ok()
        .and_then(|m| Btf::parse(&m, Some(base)).ok())
        .and_then(|b| {
            Some([
                b.member_offset("rxe_cq", "queue").ok()?,
                b.member_offset("rxe_queue", "buf").ok()?,
                b.member_offset("rxe_queue_buf", "index_mask").ok()?,
                b.member_offset("rxe_queue_buf", "producer_index").ok()?,
                b.member_offset("rxe_queue_buf", "consumer_index").ok()?,
            ])
        })
        .unwrap_or([0; 5]);
    Ok(Offsets {
        private,
        ev_queue,
        cq_res_id,
        task_state,
        cq_device,
        event_list,
        rxe,
    })
}

/// The globals of the `ib_cq wakeup` row's per-CQ labels (`IBCQ_OFF_*`): where `struct ib_cq`'s
/// `res.id`, `poll_ctx`, `comp_vector`, `device`, `res.kern_name` and poll buffer `wc` are,
/// `struct ib_device`'s `name`, `struct ib_wc`'s `wr_cqe` and `struct ib_cqe`'s `done` (the
/// consumer's callback), from ib_core's BTF. An error says what is missing: the eBPF programs
/// then count the CQs unlabelled.
pub fn ib_cq_label_globals(root: &Path) -> Result<Vec<(&'static str, u32)>> {
    let b = module_btf(root, "ib_core")?;
    let offsets = [
        1,
        b.member_offset("ib_cq", "res")? + b.member_offset("rdma_restrack_entry", "id")?,
        b.member_offset("ib_cq", "poll_ctx")?,
        b.member_offset("ib_cq", "comp_vector")?,
        b.member_offset("ib_cq", "device")?,
        b.member_offset("ib_device", "name")?,
        b.member_offset("ib_cq", "res")? + b.member_offset("rdma_restrack_entry", "kern_name")?,
        b.member_offset("ib_cq", "wc")?,
        b.member_offset("ib_wc", "wr_cqe")?,
        b.member_offset("ib_cqe", "done")?,
    ];
    Ok([
        "IBCQ_LABELS",
        "IBCQ_OFF_RES_ID",
        "IBCQ_OFF_POLL_CTX",
        "IBCQ_OFF_COMP_VECTOR",
        "IBCQ_OFF_DEVICE",
        "IBCQ_OFF_DEV_NAME",
        "IBCQ_OFF_KERN_NAME",
        "IBCQ_OFF_WC",
        "IBCQ_OFF_WR_CQE",
        "IBCQ_OFF_CQE_DONE",
    ]
    .into_iter()
    .zip(offsets)
    .collect())
}

/// The BTF of kernel module `module` (`/sys/kernel/btf/<module>`), split on vmlinux's.
fn module_btf(root: &Path, module: &str) -> Result<Btf> {
    let dir = root.join("sys/kernel/btf");
    let read = |name: &str| {
        std::fs::read(dir.join(name))
            .with_context(|| format!("reading {}", dir.join(name).display()))
    };
    let base = Btf::parse(&read("vmlinux")?, None).context("parsing vmlinux BTF")?;
    Btf::parse(&read(module)?, Some(base)).with_context(|| format!("parsing {module} BTF"))
}

/// The NVMe I/O row's global: where `cmd_flags` is in `struct request` (vmlinux BTF), to leave
/// the admin queue's passthrough commands out.
pub fn nvme_io_globals(root: &Path) -> Result<Vec<(&'static str, u32)>> {
    let path = root.join("sys/kernel/btf/vmlinux");
    let raw = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
    let base = Btf::parse(&raw, None).context("parsing vmlinux BTF")?;
    Ok(vec![(
        "NVME_OFF_CMD_FLAGS",
        base.member_offset("request", "cmd_flags")?,
    )])
}

/// The NVMe target row's globals: where `sq` is in `struct nvmet_req` and `qid` in
/// `struct nvmet_sq` (nvmet's module BTF), to leave the admin queue's commands out.
pub fn nvmet_io_globals(root: &Path) -> Result<Vec<(&'static str, u32)>> {
    let b = module_btf(root, "nvmet")?;
    Ok(vec![
        ("NVMET_OFF_SQ", b.member_offset("nvmet_req", "sq")?),
        ("NVMET_OFF_QID", b.member_offset("nvmet_sq", "qid")?),
    ])
}

/// Why ib_uverbs' BTF (`dir/ib_uverbs`) could not be read (`e`): the module is not loaded, or the
/// kernel has no module BTF at all (CONFIG_DEBUG_INFO_BTF_MODULES came in Linux 5.11: 5.10 has
/// only vmlinux's), or something else.
fn missing_module_btf(root: &Path, dir: &Path, e: &std::io::Error) -> String {
    let path = dir.join("ib_uverbs");
    if !root.join("sys/module/ib_uverbs").exists() {
        return format!(
            "the waterfall needs ib_uverbs' BTF ({}: {e}): ib_uverbs is not loaded",
            path.display()
        );
    }
    let any_module_btf = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|d| d.ok())
                .any(|d| d.file_name() != "vmlinux")
        })
        .unwrap_or(false);
    if !any_module_btf {
        return format!(
            "the waterfall needs ib_uverbs' BTF, and this kernel has no module BTF (only {}; \
             CONFIG_DEBUG_INFO_BTF_MODULES, Linux 5.11 on)",
            dir.join("vmlinux").display()
        );
    }
    format!(
        "the waterfall needs ib_uverbs' BTF ({}: {e}): ib_uverbs is loaded but has none (built without BTF?)",
        path.display()
    )
}

/// What the loader attached (for the attach table).
#[derive(Clone, Debug, serde::Serialize)]
pub struct AttachNote {
    pub program: &'static str,
    pub target: String,
    /// None: attached; else why not.
    pub skipped: Option<String>,
}

pub struct Waterfall {
    /// Its maps, taken out of the object ([`READ_MAPS`]).
    maps: std::collections::HashMap<&'static str, aya::maps::Map>,
    pub notes: Vec<AttachNote>,
    samples: RefCell<Option<RingBuf<MapData>>>,
    /// Samples read so far (bounded by `sample_max`).
    taken: RefCell<Vec<WfSample>>,
    sample_max: usize,
    /// With `--timeline`: the events it keeps, chosen among all of them as they are read.
    selection: Option<RefCell<selection::Selection>>,
    /// A read blocked longer than this is a stall (`--stall-after`).
    stall_after: Duration,
    /// Every stall seen, by (thread, start of its read), as last diagnosed.
    stalls: RefCell<BTreeMap<(u32, u64), stall::Stall>>,
    /// Threads that exited, banked when their slots were freed.
    retired: RefCell<Retired>,
    /// The possible CPUs the per-CPU maps were sized for.
    ncpus: u32,
    /// `--sample-every`: the handler stamps 1 in this many of each channel's events
    /// (`WF_SAMPLE_EVERY`, which `--enforce` raises at run time).
    sample_every: Cell<u32>,
}

/// At most this many exited threads are kept one by one (about 20 KiB each, copied into
/// every snapshot); past it, exited threads keep their slots, and once all are taken new
/// threads share the last one (`losses.threads_without_slot`).
const RETIRED_MAX: usize = 256;

/// The exited threads' data, and each slot's generation: a snapshot keys a slot's data by
/// `slot + WF_THREADS × generation`, so that a freed slot's next thread never subtracts from
/// its former owner's data, and the former owner's key keeps its final data.
#[derive(Default)]
struct Retired {
    threads: BTreeMap<u32, model::ThreadData>,
    generation: [u32; WF_THREADS as usize],
}

impl Retired {
    /// The snapshot key of `slot`'s current owner.
    fn key(&self, slot: u32) -> u32 {
        slot + WF_THREADS * self.generation[slot as usize]
    }

    /// Whether `slot` (with owner `info`) is to be banked and freed now.
    fn takes(&self, slot: u32, info: &WfThread) -> bool {
        info.exited != 0 && slot < WF_THREADS - 1 && self.threads.len() < RETIRED_MAX
    }

    /// Banks `slot`'s data, `data`, under its owner's key; the slot's next owner gets a new one.
    fn bank(&mut self, slot: u32, data: model::ThreadData) {
        self.threads.insert(self.key(slot), data);
        self.generation[slot as usize] += 1;
    }
}

/// Size of one sample in the ring (record + 8-byte header, 8-aligned).
const SAMPLE_BYTES: usize = std::mem::size_of::<WfSample>() + 8;
/// The sample ring with `--timeline`, which gets every event and is drained at each refresh of
/// the views: 4 MiB hold about 47 000 events.
const TIMELINE_RING_BYTES: usize = 4 << 20;

impl Waterfall {
    /// Attach the waterfall's programs in the object `bpf` (loaded with [`Prepared::configure`])
    /// and take its maps out of it. The programs stay in the object: they are detached with the
    /// probe table's (the session's `finish`, or its drop). On an error, every program of the
    /// waterfall attached so far is detached again.
    pub fn start(p: Prepared, bpf: &mut Bpf) -> Result<Waterfall> {
        let mut notes = Vec::new();
        let r = attach_all(bpf.ebpf_mut(), p.cfg.ncpus, p.sample_every, &mut notes);
        if let Err(e) = r {
            let attached: Vec<String> = notes
                .iter()
                .filter(|n| n.skipped.is_none())
                .map(|n| n.program.to_owned())
                .collect();
            bpf.drop_programs(&attached);
            return Err(e);
        }
        let ebpf = bpf.ebpf_mut();
        let samples = if p.sample > 0 || p.timeline > 0 {
            let m = ebpf
                .take_map("WF_SAMPLES")
                .context("map WF_SAMPLES is not in the eBPF object")?;
            Some(RingBuf::try_from(m).context("WF_SAMPLES is not a ring buffer")?)
        } else {
            None
        };
        let mut maps = std::collections::HashMap::new();
        for name in READ_MAPS {
            let m = ebpf
                .take_map(name)
                .with_context(|| format!("map {name} is not in the eBPF object"))?;
            maps.insert(name, m);
        }
        Ok(Waterfall {
            maps,
            notes,
            samples: RefCell::new(samples),
            taken: RefCell::new(Vec::new()),
            sample_max: p.sample,
            selection: (p.timeline > 0)
                .then(|| RefCell::new(selection::Selection::new(p.timeline))),
            stall_after: p.stall_after,
            stalls: RefCell::new(BTreeMap::new()),
            retired: RefCell::new(Retired::default()),
            ncpus: p.cfg.ncpus,
            sample_every: Cell::new(p.sample_every),
        })
    }

    /// The handler stamps 1 in this many of each channel's events (1: every one).
    pub fn sample_every(&self) -> u32 {
        self.sample_every.get()
    }

    /// Stamp 1 in `n` of each channel's events from now on (`--enforce`); every event is
    /// still counted.
    pub fn set_sample_every(&self, n: u32) -> Result<()> {
        set_every(&mut self.map_copy("WF_SAMPLE_EVERY")?, n)?;
        self.sample_every.set(n.max(1));
        Ok(())
    }

    /// Map `name`, one of [`READ_MAPS`].
    fn map(&self, name: &str) -> Result<&aya::maps::Map> {
        self.maps
            .get(name)
            .with_context(|| format!("map {name} is not in the eBPF object"))
    }

    /// Whether the waterfall's programs run on kernel function `function` (for the hooks it
    /// shares with the probe table).
    pub fn serves(&self, function: &str) -> bool {
        self.notes
            .iter()
            .any(|n| n.skipped.is_none() && n.target == function)
    }

    /// Run count and time of every attached waterfall program (for the self-cost table), in
    /// the object `bpf` it was started in.
    pub fn program_stats(&self, bpf: &Bpf) -> Vec<crate::bpf::stats::ProgramStat> {
        let misses = crate::bpf::stats::kprobe_misses();
        self.notes
            .iter()
            .filter(|n| n.skipped.is_none())
            .filter_map(|n| {
                crate::bpf::stats::ProgramStat::of(
                    n.program,
                    &n.target,
                    bpf.ebpf().program(n.program)?,
                    misses.as_ref(),
                )
            })
            .collect()
    }

    /// One line per program: attached, or why not.
    /// `9 programs attached; 2 skipped (mlx5: not in use here)`: the start-up line without -v.
    pub fn attach_summary(&self) -> String {
        let attached = self.notes.iter().filter(|n| n.skipped.is_none()).count();
        let skipped: Vec<&str> = self
            .notes
            .iter()
            .filter(|n| n.skipped.is_some())
            .map(|n| n.program)
            .collect();
        if skipped.is_empty() {
            format!("{attached} programs attached")
        } else {
            format!(
                "{attached} programs attached; skipped {} ({}; -v says why)",
                skipped.len(),
                skipped.join(", ")
            )
        }
    }

    pub fn attach_table(&self) -> String {
        let mut out = String::new();
        for n in &self.notes {
            match &n.skipped {
                None => out.push_str(&format!("  waterfall {:<18} {}\n", n.program, n.target)),
                Some(why) => out.push_str(&format!(
                    "  waterfall {:<18} skipped ({}): {why}\n",
                    n.program, n.target
                )),
            }
        }
        out
    }

    /// The counters and histograms of every thread slot, summed over CPUs: one batched lookup
    /// of all slots' counters, then two per slot in use (its histograms, its owner), whatever
    /// the probe count; key by key on kernels without batched lookups (before 5.6).
    pub fn snapshot(&self) -> Result<Snapshot> {
        let raw = match self.read_batched() {
            Some(raw) => raw,
            None => self.read_by_key()?,
        };
        let mut snap = Snapshot::default();
        let mut retired = self.retired.borrow_mut();
        for (slot, info, per_cpu, hists, cpu_events) in raw {
            let mut sum = model::Counts::default();
            for c in &per_cpu {
                sum.add(c);
            }
            let hs = hists
                .iter()
                .map(|per_cpu| {
                    let mut slots = vec![0u64; rdma_trace_common::HIST_SLOTS as usize];
                    for row in per_cpu {
                        for (s, v) in slots.iter_mut().zip(row.slots) {
                            *s += v;
                        }
                    }
                    Histogram::from_slots(slots)
                })
                .collect();
            let data = model::ThreadData {
                tid: info.tid,
                tgid: info.tgid,
                comm: crate::bpf::c_string(&info.comm),
                counts: sum,
                hists: hs,
                cpus: model::CpuEvents::from_flat(&cpu_events, self.ncpus),
            };
            if retired.takes(slot, &info) {
                // The thread has exited: nothing counts in its slot any more. Its data is
                // banked first, then the slot is cleared and freed, in that order, so the
                // next thread starts from zero.
                retired.bank(slot, data);
                self.free_slot(slot, per_cpu.len())
                    .with_context(|| format!("freeing waterfall thread slot {slot}"))?;
            } else {
                snap.threads.insert(retired.key(slot), data);
            }
        }
        for (k, t) in &retired.threads {
            snap.threads.insert(*k, t.clone());
        }
        snap.cqs = self.cq_rows()?;
        Ok(snap)
    }

    /// Every (process, CQ) row, summed over CPUs.
    fn cq_rows(&self) -> Result<BTreeMap<(u32, u64), model::CqData>> {
        let rows: aya::maps::PerCpuHashMap<&MapData, WfCqKey, WfCqRow> =
            aya::maps::PerCpuHashMap::try_from(self.map("WF_CQ_ROWS_MAP")?)?;
        let mut out = BTreeMap::new();
        for entry in rows.iter() {
            let (key, values) =
                entry.map_err(|e| anyhow!("reading WF_CQ_ROWS_MAP: {}", chain(&e)))?;
            let values: Vec<WfCqRow> = values.iter().copied().collect();
            out.insert((key.tgid, key.cq), model::cq_from_per_cpu(&values));
        }
        Ok(out)
    }

    /// Clears thread slot `slot` (its counters and histograms on each of `cpus` CPUs, its
    /// owner's ids) and frees it for the next thread.
    fn free_slot(&self, slot: u32, cpus: usize) -> Result<()> {
        let mut counts: PerCpuArray<MapData, WfCounts> =
            PerCpuArray::try_from(self.map_copy("WF_COUNTS")?)?;
        let zero = aya::maps::PerCpuValues::try_from(vec![WfCounts::ZERO; cpus])?;
        counts.set(slot, zero, 0)?;
        let mut hists: PerCpuArray<MapData, WfHist> =
            PerCpuArray::try_from(self.map_copy("WF_HIST")?)?;
        let empty = WfHist {
            slots: [0; rdma_trace_common::HIST_SLOTS as usize],
        };
        for h in 0..WF_NHIST {
            let zero = aya::maps::PerCpuValues::try_from(vec![empty; cpus])?;
            hists.set(slot * WF_NHIST + h, zero, 0)?;
        }
        let mut events: Array<MapData, u64> = Array::try_from(self.map_copy("WF_CPU_EVENTS")?)?;
        for i in self.cpu_events_range(slot) {
            events.set(i, 0, 0)?;
        }
        let mut threads: Array<MapData, WfThread> = Array::try_from(self.map_copy("WF_THREAD")?)?;
        threads.set(slot, WfThread::NONE, 0)?;
        let mut owners: BpfHashMap<MapData, u32, u32> =
            BpfHashMap::try_from(self.map_copy("WF_SLOT_OWNER")?)?;
        owners.remove(&slot)?;
        Ok(())
    }

    /// `WF_CPU_EVENTS`' entries of thread slot `slot`, laid out as the eBPF side indexes them.
    fn cpu_events_range(&self, slot: u32) -> std::ops::Range<u32> {
        cpu_event_index(slot, 0, 0, self.ncpus)..cpu_event_index(slot + 1, 0, 0, self.ncpus)
    }

    /// A map of the object through a file descriptor of its own, to write to it from `&self`.
    fn map_copy(&self, name: &str) -> Result<aya::maps::Map> {
        use aya::maps::Map;
        use std::os::fd::AsFd as _;
        let copy = |m: &MapData| -> Result<MapData> {
            Ok(MapData::from_fd(m.fd().as_fd().try_clone_to_owned()?)?)
        };
        Ok(match self.map(name).ok() {
            Some(Map::Array(m)) => Map::Array(copy(m)?),
            Some(Map::PerCpuArray(m)) => Map::PerCpuArray(copy(m)?),
            Some(Map::HashMap(m)) => Map::HashMap(copy(m)?),
            _ => bail!("map {name} is not in the eBPF object as an array or hash map"),
        })
    }

    /// Slots in use: (slot, owner, per-CPU counters, per-CPU values of each histogram).
    fn read_batched(&self) -> Option<Vec<RawSlot>> {
        use std::os::fd::{AsFd as _, AsRawFd as _};
        let fd = |name: &str| -> Option<i32> {
            match self.map(name).ok()? {
                aya::maps::Map::Array(m) | aya::maps::Map::PerCpuArray(m) => {
                    Some(m.fd().as_fd().as_raw_fd())
                }
                _ => None,
            }
        };
        let (threads, counts, hists) = (fd("WF_THREAD")?, fd("WF_COUNTS")?, fd("WF_HIST")?);
        let cpu_events = fd("WF_CPU_EVENTS")?;
        let cpus = crate::bpf::batch::possible_cpus()?;
        // The owners first (a few hundred bytes): a slot's owner is written before anything is
        // counted in it, so only owned slots (and the shared last one) are read further. The
        // counters of all slots would be 1.7 KiB per slot and CPU at every refresh.
        let owners: Vec<WfThread> = crate::bpf::batch::lookup_range(threads, 0, WF_THREADS, 1)?;
        let mut out = Vec::new();
        for (slot, info) in (0..WF_THREADS).zip(owners) {
            if !owned(slot, &info) {
                continue;
            }
            let per_cpu: Vec<WfCounts> = crate::bpf::batch::lookup_range(counts, slot, 1, cpus)?;
            if unused(&per_cpu) {
                continue;
            }
            let hs: Vec<WfHist> =
                crate::bpf::batch::lookup_range(hists, slot * WF_NHIST, WF_NHIST, cpus)?;
            let range = self.cpu_events_range(slot);
            let events: Vec<u64> =
                crate::bpf::batch::lookup_range(cpu_events, range.start, range.len() as u32, 1)?;
            out.push((
                slot,
                info,
                per_cpu,
                hs.chunks_exact(cpus).map(<[WfHist]>::to_vec).collect(),
                events,
            ));
        }
        Some(out)
    }

    /// [`Self::read_batched`], one lookup per key.
    fn read_by_key(&self) -> Result<Vec<RawSlot>> {
        let threads: Array<&MapData, WfThread> = Array::try_from(self.map("WF_THREAD")?)?;
        let counts: PerCpuArray<&MapData, WfCounts> =
            PerCpuArray::try_from(self.map("WF_COUNTS")?)?;
        let hists: PerCpuArray<&MapData, WfHist> = PerCpuArray::try_from(self.map("WF_HIST")?)?;
        let cpu_events: Array<&MapData, u64> = Array::try_from(self.map("WF_CPU_EVENTS")?)?;
        let mut out = Vec::new();
        for slot in 0..WF_THREADS {
            let per_cpu: Vec<WfCounts> = counts
                .get(&slot, 0)
                .map_err(|e| anyhow!("reading WF_COUNTS: {}", chain(&e)))?
                .iter()
                .copied()
                .collect();
            if unused(&per_cpu) {
                continue;
            }
            let info = threads
                .get(&slot, 0)
                .map_err(|e| anyhow!("reading WF_THREAD: {}", chain(&e)))?;
            let mut hs = Vec::with_capacity(WF_NHIST as usize);
            for h in 0..WF_NHIST {
                let per_cpu = hists
                    .get(&(slot * WF_NHIST + h), 0)
                    .map_err(|e| anyhow!("reading WF_HIST: {}", chain(&e)))?;
                hs.push(per_cpu.iter().copied().collect());
            }
            let events = self
                .cpu_events_range(slot)
                .map(|i| cpu_events.get(&i, 0))
                .collect::<Result<Vec<u64>, _>>()
                .map_err(|e| anyhow!("reading WF_CPU_EVENTS: {}", chain(&e)))?;
            out.push((slot, info, per_cpu, hs, events));
        }
        Ok(out)
    }

    /// The threads stalled now (see [`stall`]): each read in progress longer than
    /// `--stall-after` on a channel that has delivered events, diagnosed from the stamps. Each
    /// one is also kept for [`Self::stalls_seen`].
    pub fn check_stalls(&self) -> Result<Vec<stall::Stall>> {
        let map = |name: &str| self.map(name);
        let readings: BpfHashMap<&MapData, u32, WfReading> =
            BpfHashMap::try_from(map("WF_READING")?)?;
        let queues: BpfHashMap<&MapData, u64, WfQueue> = BpfHashMap::try_from(map("WF_QUEUES")?)?;
        let cqs: BpfHashMap<&MapData, u64, WfCq> = BpfHashMap::try_from(map("WF_CQ")?)?;
        let wakes: BpfHashMap<&MapData, u32, WfWake> = BpfHashMap::try_from(map("WF_WAKE")?)?;
        let now = monotonic_ns();
        let after = u64::try_from(self.stall_after.as_nanos()).unwrap_or(u64::MAX);
        let mut out = Vec::new();
        // Entries may come and go while the map is walked: what fails to read is skipped.
        for (tid, reading) in readings.iter().filter_map(Result::ok) {
            let queue = queues.get(&reading.queue, 0).ok();
            let e = stall::Evidence {
                now,
                tid,
                reading,
                queue,
                cq: queue
                    .map(|q| q.cq)
                    .filter(|&c| c != 0)
                    .and_then(|c| cqs.get(&c, 0).ok()),
                wake: wakes.get(&tid, 0).ok(),
            };
            if !stall::is_stall(&e, after) {
                continue;
            }
            // A thread that is gone is no stall (its read's return was missed).
            let Ok(comm) =
                std::fs::read_to_string(format!("/proc/{}/task/{tid}/comm", reading.tgid))
            else {
                continue;
            };
            let comm = comm.trim_end().to_owned();
            let s = stall::diagnose(&e, reading.tgid, comm);
            self.stalls
                .borrow_mut()
                .insert((tid, reading.since), s.clone());
            out.push(s);
        }
        Ok(out)
    }

    /// Every stall seen since the last call (a phase), as last diagnosed, those still blocked
    /// now included, in the order of their threads.
    pub fn take_stalls(&self) -> Result<Vec<stall::Stall>> {
        self.check_stalls()?;
        Ok(std::mem::take(&mut *self.stalls.borrow_mut())
            .into_values()
            .collect())
    }

    /// The live view's waterfall pane: every thread since `base`.
    pub fn view(&self, base: &Snapshot) -> Result<WaterfallView> {
        // Each refresh empties the sample ring, so that a timeline's ring never fills.
        self.drain();
        let stalls = self.check_stalls()?;
        let now = self.snapshot()?.since(base);
        Ok(match now.merged() {
            Some(w) => WaterfallView {
                events: w.events,
                woken: w.woken,
                awake: w.awake,
                stages: ["wake", "runq", "read"]
                    .iter()
                    .filter_map(|k| w.stage(k))
                    .map(|s| {
                        let name = match s.key {
                            "wake" => "handler → wake-up",
                            "runq" => "run queue",
                            _ => "on CPU → read",
                        };
                        (name, s.p50_ns.unwrap_or(0.0), s.p99_ns.unwrap_or(0.0))
                    })
                    .collect(),
                total_mean_ns: w.total_mean_ns,
                stalls,
            },
            None => WaterfallView {
                stalls,
                ..WaterfallView::default()
            },
        })
    }

    /// Read the samples the ring holds: the first `--sample N` are kept, and the timeline's
    /// selection sees every one.
    fn drain(&self) {
        let mut ring = self.samples.borrow_mut();
        let Some(rb) = ring.as_mut() else {
            return;
        };
        let mut taken = self.taken.borrow_mut();
        let mut selection = self.selection.as_ref().map(RefCell::borrow_mut);
        while let Some(item) = rb.next() {
            if item.len() < size_of::<WfSample>() {
                continue;
            }
            // SAFETY: the eBPF side writes whole WfSample records (repr(C), plain integers);
            // read_unaligned copes with the ring's 8-byte alignment.
            let s = unsafe { std::ptr::read_unaligned(item.as_ptr() as *const WfSample) };
            if taken.len() < self.sample_max {
                taken.push(s);
            }
            if let Some(sel) = selection.as_mut() {
                sel.push(&s);
            }
        }
    }

    /// Per-event samples taken so far (at most `--sample N`, in the order they were read).
    pub fn samples(&self) -> Vec<WfSample> {
        self.drain();
        self.taken.borrow().clone()
    }

    /// The events `--timeline` keeps (none without a timeline), in time order.
    pub fn timeline_events(&self) -> Vec<WfSample> {
        self.drain();
        self.selection
            .as_ref()
            .map_or_else(Vec::new, |s| s.borrow().events())
    }
}

/// The maps the waterfall reads (or, `WF_SAMPLE_EVERY`, writes) once attached, taken out of the object.
const READ_MAPS: [&str; 11] = [
    "WF_COUNTS",
    "WF_CPU_EVENTS",
    "WF_HIST",
    "WF_THREAD",
    "WF_SLOT_OWNER",
    "WF_CQ_ROWS_MAP",
    "WF_READING",
    "WF_QUEUES",
    "WF_CQ",
    "WF_WAKE",
    "WF_SAMPLE_EVERY",
];

/// The hooks whose probe-table rows the waterfall's programs time as well (see
/// [`SharedHook`]): the completion handler's entry and return, and rxe's CQE post's entry.
pub const SHARED_HOOKS: [SharedHook; 2] = [
    SharedHook {
        function: "ib_uverbs_comp_handler",
        global: "WF_KSLOT_HANDLER",
        entry: true,
        ret: true,
    },
    SharedHook {
        function: "rxe_cq_post",
        global: "WF_KSLOT_CQ_POST",
        entry: true,
        ret: false,
    },
];

/// The waterfall's part of the object, worked out before it is loaded: its `WF_CONFIG` (the
/// kernel structures' offsets, from BTF and tracefs), the sample ring's size, and what
/// [`Waterfall::start`] needs then.
pub struct Prepared {
    cfg: WfConfig,
    ring: u32,
    sample: usize,
    timeline: usize,
    stall_after: Duration,
    sample_every: u32,
}

/// What the command line asks of the waterfall.
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    /// Keep up to this many per-event records (`--sample`).
    pub sample: usize,
    /// With a `--timeline`, how many events it keeps (the first N, the N slowest per stage),
    /// chosen among every event; 0 without one.
    pub timeline: usize,
    /// A read blocked longer is a stall (`--stall-after`).
    pub stall_after: Duration,
    /// Stamp 1 in this many of each channel's events (`--sample-every`; 1: every one).
    pub sample_every: u32,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            sample: 0,
            timeline: 0,
            stall_after: Duration::from_secs(1),
            sample_every: 1,
        }
    }
}

impl Prepared {
    /// The waterfall's configuration for this kernel and `settings`.
    pub fn new(settings: Settings) -> Result<Prepared> {
        let Settings {
            sample,
            timeline,
            stall_after,
            sample_every,
        } = settings;
        let root = Path::new("/");
        let off = btf_offsets(root)?;
        let kernel = Kernel::at(root);
        let [
            rxe_cq_queue,
            rxe_queue_buf,
            buf_mask,
            buf_producer,
            buf_consumer,
        ] = off.rxe;
        let cfg = WfConfig {
            file_private_data: off.private,
            ev_queue: off.ev_queue,
            waking_pid: need_offset(&kernel, "sched/sched_waking", "pid")?,
            waking_target_cpu: need_offset(&kernel, "sched/sched_waking", "target_cpu")?,
            switch_next_pid: need_offset(&kernel, "sched/sched_switch", "next_pid")?,
            switch_prev_pid: need_offset(&kernel, "sched/sched_switch", "prev_pid")?,
            switch_prev_state: need_offset(&kernel, "sched/sched_switch", "prev_state")?,
            cq_res_id: off.cq_res_id,
            // With a timeline every event goes through the ring (drained at each refresh).
            sample_max: if timeline > 0 {
                u64::MAX
            } else {
                sample as u64
            },
            rxe_cq_queue,
            rxe_queue_buf,
            buf_mask,
            buf_producer,
            buf_consumer,
            task_state: off.task_state,
            cq_device: off.cq_device[0],
            dev_name: off.cq_device[1],
            ncpus: topology::possible_cpus(root).map_err(|e| anyhow!("counting CPUs: {e}"))?,
            event_list: off.event_list,
            fault_phantoms: fault_phantoms()?,
            _pad: 0,
        };
        let ncpus = cfg.ncpus;
        let ring = (sample.max(1) * SAMPLE_BYTES * ncpus as usize)
            .max(if timeline > 0 { TIMELINE_RING_BYTES } else { 0 })
            .next_power_of_two()
            .clamp(4096, 1 << 28) as u32;
        Ok(Prepared {
            cfg,
            ring,
            sample,
            timeline,
            stall_after,
            sample_every: sample_every.max(1),
        })
    }

    /// The waterfall's globals, map sizes and shared hooks, into the object's `config`.
    pub fn configure(&self, config: &mut ObjectConfig) {
        config.set_global("WF_CONFIG", &self.cfg);
        config.map_sizes.push(("WF_SAMPLES", self.ring));
        config.map_sizes.extend(cpu_map_sizes(self.cfg.ncpus));
        config.shared.extend(SHARED_HOOKS);
    }
}

/// The test hook `RDMA_TRACE_FAULT_MIRROR_PHANTOMS=N`: each channel's mirror counts N events
/// the kernel never queued (`WfConfig::fault_phantoms`), for the guest test of the mirror's
/// check against the kernel's queue.
fn fault_phantoms() -> Result<u32> {
    const VAR: &str = "RDMA_TRACE_FAULT_MIRROR_PHANTOMS";
    match std::env::var(VAR) {
        Err(_) => Ok(0),
        Ok(v) => v.parse().map_err(|_| {
            anyhow!("{VAR}={v:?} is not a count: set it to a whole number of events, or unset it")
        }),
    }
}

/// The sizes of the maps with an entry per possible CPU, for `ncpus` of them: the topology
/// (`WF_CPU_TOPO`) and each thread slot's events per kind and CPU (`WF_CPU_EVENTS`).
fn cpu_map_sizes(ncpus: u32) -> [(&'static str, u32); 2] {
    [
        ("WF_CPU_TOPO", ncpus.max(1)),
        ("WF_CPU_EVENTS", (WF_THREADS * NR_CPU_KINDS * ncpus).max(1)),
    ]
}

/// `WF_SAMPLE_EVERY` (`m`) set to `n`.
fn set_every(m: &mut aya::maps::Map, n: u32) -> Result<()> {
    let mut a: Array<&mut MapData, u32> = Array::try_from(m)?;
    a.set(0, n.max(1), 0)
        .map_err(|e| anyhow!("setting WF_SAMPLE_EVERY: {}", chain(&e)))
}

/// Fill the CPU topology table (`ncpus` CPUs) and the sampling rate (1 in `every`), and attach
/// every program of the waterfall in `ebpf`, noting each in `notes`: an error when a required
/// one fails.
fn attach_all(ebpf: &mut Ebpf, ncpus: u32, every: u32, notes: &mut Vec<AttachNote>) -> Result<()> {
    set_every(
        ebpf.map_mut("WF_SAMPLE_EVERY")
            .context("map WF_SAMPLE_EVERY is not in the eBPF object")?,
        every,
    )?;
    {
        let mut table: Array<&mut MapData, WfCpuTopo> = Array::try_from(
            ebpf.map_mut("WF_CPU_TOPO")
                .context("map WF_CPU_TOPO is not in the eBPF object")?,
        )?;
        for (cpu, ids) in (0..).zip(Topology::read(Path::new("/")).table(ncpus)) {
            table
                .set(cpu, ids, 0)
                .map_err(|e| anyhow!("filling WF_CPU_TOPO: {}", chain(&e)))?;
        }
    }
    // Consumers before producers: a read seen without its handler only counts unmatched.
    let required: [(&'static str, &str, bool); 7] = [
        ("wf_read_entry", "ib_uverbs_comp_event_read", false),
        ("wf_read_return", "ib_uverbs_comp_event_read", false),
        ("wf_thread_exit", "sched/sched_process_exit", true),
        ("wf_sched_switch", "sched/sched_switch", true),
        ("wf_sched_waking", "sched/sched_waking", true),
        ("wf_handler_return", "ib_uverbs_comp_handler", false),
        ("wf_handler_entry", "ib_uverbs_comp_handler", false),
    ];
    for (prog, target, tp) in required {
        let r = if tp {
            tracepoint(ebpf, prog, target)
        } else {
            kprobe(ebpf, prog, target)
        };
        r.map_err(|e| {
            anyhow!(Unsupported(format!(
                "the waterfall could not attach {prog} to {target}: {e:#}"
            )))
        })?;
        notes.push(AttachNote {
            program: prog,
            target: target.to_owned(),
            skipped: None,
        });
    }
    // Optional: driver time stamps (T0) and the reset of a channel's queue when a new one is
    // made (a freed channel's address can come back).
    for (prog, target) in [
        ("wf_rxe_arm", "rxe_req_notify_cq"),
        ("wf_rxe_cq_post", "rxe_cq_post"),
        ("wf_mlx5_cq_comp", "mlx5_ib_cq_comp"),
        ("wf_queue_init", "ib_uverbs_init_event_queue"),
    ] {
        let skipped = kprobe(ebpf, prog, target).err().map(|e| format!("{e:#}"));
        notes.push(AttachNote {
            program: prog,
            target: target.to_owned(),
            skipped,
        });
    }
    // mlx5: the completion IRQ that runs before the callback on the same CPU is an earlier T0.
    // The program is always loaded (so the verifier checks it everywhere), and attached where
    // such IRQs exist.
    let irqs = mlx5_completion_irqs(&crate::kernel::facts::Kernel::live().interrupts());
    let skipped = mlx5_irq(ebpf, &irqs).err().map(|e| format!("{e:#}"));
    notes.push(AttachNote {
        program: "wf_mlx5_irq",
        target: "raw_tp irq_handler_entry (mlx5 completion IRQs)".to_owned(),
        skipped,
    });
    Ok(())
}

/// Program `prog` of the object, as its kind `P`.
fn program<'a, P>(ebpf: &'a mut Ebpf, prog: &str) -> Result<&'a mut P>
where
    &'a mut P: TryFrom<&'a mut Program, Error = ProgramError>,
{
    Ok(ebpf
        .program_mut(prog)
        .with_context(|| format!("program {prog} is not in the eBPF object"))?
        .try_into()?)
}

/// Load `wf_mlx5_irq`; with completion IRQs `irqs`, list them and attach it.
fn mlx5_irq(ebpf: &mut Ebpf, irqs: &[u32]) -> Result<()> {
    let p: &mut RawTracePoint = program(ebpf, "wf_mlx5_irq")?;
    p.load().map_err(|e| anyhow!("loading: {}", chain(&e)))?;
    if irqs.is_empty() {
        bail!("no mlx5 completion IRQ (mlx5_comp*) in /proc/interrupts");
    }
    let mut map: BpfHashMap<&mut MapData, u32, u8> = BpfHashMap::try_from(
        ebpf.map_mut("WF_T0_IRQS")
            .context("map WF_T0_IRQS is not in the eBPF object")?,
    )?;
    for &irq in irqs {
        map.insert(irq, 1, 0)
            .map_err(|e| anyhow!("filling WF_T0_IRQS: {}", chain(&e)))?;
    }
    let p: &mut RawTracePoint = program(ebpf, "wf_mlx5_irq")?;
    p.attach("irq_handler_entry")
        .map_err(|e| anyhow!("attaching: {}", chain(&e)))?;
    Ok(())
}

fn kprobe(ebpf: &mut Ebpf, prog: &str, function: &str) -> Result<()> {
    let p: &mut KProbe = program(ebpf, prog)?;
    p.load().map_err(|e| anyhow!("loading: {}", chain(&e)))?;
    p.attach(function, 0)
        .map_err(|e| anyhow!("attaching: {}", chain(&e)))?;
    Ok(())
}

fn tracepoint(ebpf: &mut Ebpf, prog: &str, event: &str) -> Result<()> {
    let (cat, name) = event.split_once('/').expect("category/name");
    let p: &mut TracePoint = program(ebpf, prog)?;
    p.load().map_err(|e| anyhow!("loading: {}", chain(&e)))?;
    p.attach(cat, name)
        .map_err(|e| anyhow!("attaching: {}", chain(&e)))?;
    Ok(())
}

/// Whether thread slot `slot` has an owner: a thread took it (its first event writes its ids
/// and name before counting), or it is the last slot, which threads share once the others
/// are taken.
fn owned(slot: u32, info: &WfThread) -> bool {
    info.tid != 0 || info.comm[0] != 0 || slot == WF_THREADS - 1
}

/// A thread slot no event has counted in, on any CPU.
fn unused(per_cpu: &[WfCounts]) -> bool {
    per_cpu.iter().all(WfCounts::is_zero)
}

/// One thread slot as read from the maps: (slot, owner, per-CPU counters, per-CPU values of
/// each histogram, its `WF_CPU_EVENTS` entries).
type RawSlot = (u32, WfThread, Vec<WfCounts>, Vec<Vec<WfHist>>, Vec<u64>);

/// IRQ numbers of mlx5's completion vectors: the IRQs the probe table's mlx5 IRQ rows match.
pub fn mlx5_completion_irqs(interrupts: &[(u32, String)]) -> Vec<u32> {
    use crate::kernel::probes::{Driver, PROBES, Shape};
    let patterns: Vec<_> = PROBES
        .iter()
        .filter(|p| p.driver == Driver::Mlx5)
        .filter_map(|p| match &p.shape {
            Shape::Irq { patterns } => Some(patterns),
            _ => None,
        })
        .collect();
    interrupts
        .iter()
        .filter(|(_, name)| patterns.iter().any(|p| p.matches(name)))
        .map(|&(n, _)| n)
        .collect()
}

/// The waterfall's part of the object (its globals and map sizes into `config`), before the
/// object is loaded; `None` with a line saying why not (or when it is `off`).
pub fn prepare_or_explain(
    off: bool,
    settings: Settings,
    config: &mut ObjectConfig,
) -> Option<Prepared> {
    if off {
        return None;
    }
    match Prepared::new(settings) {
        Ok(p) => {
            p.configure(config);
            Some(p)
        }
        Err(e) => {
            eprintln!("rdma-trace: completion waterfall off: {e:#}");
            None
        }
    }
}

/// Start the waterfall prepared for `session`'s object (none: it is off), or say why not; then
/// the probe table attaches its own programs on the shared hooks the waterfall does not serve.
pub fn start_or_explain(prepared: Option<Prepared>, session: &mut Session) -> Option<Waterfall> {
    let wf = prepared.and_then(|p| match Waterfall::start(p, session.bpf_mut()) {
        Ok(w) => {
            // Its programs one a line with -v; one line otherwise.
            if crate::verbosity::level() > 0 {
                eprint!("rdma-trace: completion waterfall:\n{}", w.attach_table());
            } else {
                eprintln!("rdma-trace: completion waterfall: {}", w.attach_summary());
            }
            Some(w)
        }
        Err(e) => {
            eprintln!("rdma-trace: completion waterfall off: {e:#}");
            None
        }
    });
    session.settle_shared(|f| wf.as_ref().is_some_and(|w| w.serves(f)));
    wf
}

/// One sampled completion event, as the JSON carries it.
#[derive(Clone, Debug, serde::Serialize, PartialEq, Eq)]
pub struct SampleRecord {
    pub tid: u32,
    pub pid: u32,
    pub woken: bool,
    /// Woken while still on its CPU (T3 = T2).
    pub no_switch: bool,
    /// CLOCK_MONOTONIC ns; t0 null without a driver stamp, t2/t3 null when the reader was awake.
    pub t0: Option<u64>,
    pub t1: u64,
    pub t2: Option<u64>,
    pub t3: Option<u64>,
    pub t4: u64,
    pub cpu_handler: u32,
    pub cpu_target: Option<u32>,
    pub cpu_on: u32,
    pub cpu_read: u32,
    pub class: &'static str,
    /// An already-awake event's T1→T4 split from its reader's kept periods: runnable off a
    /// CPU, and on a CPU (with `awake_unkept_ns`, the rest: asleep elsewhere); null for woken
    /// events.
    pub awake_runnable_ns: Option<u64>,
    pub awake_on_cpu_ns: Option<u64>,
    /// Of it, the part before the reader's periods were kept (not split).
    pub awake_unkept_ns: Option<u64>,
}

pub fn records(samples: &[WfSample]) -> Vec<SampleRecord> {
    use rdma_trace_common::waterfall::{SF_NO_SWITCH, SF_WOKEN};
    samples
        .iter()
        .map(|s| {
            let woken = s.flags & SF_WOKEN != 0;
            SampleRecord {
                tid: s.tid,
                pid: s.tgid,
                woken,
                no_switch: s.flags & SF_NO_SWITCH != 0,
                t0: (s.t0 != 0).then_some(s.t0),
                t1: s.t1,
                t2: woken.then_some(s.t2),
                t3: woken.then_some(s.t3),
                t4: s.t4,
                cpu_handler: s.cpu_handler,
                cpu_target: (s.cpu_target != u32::MAX).then_some(s.cpu_target),
                cpu_on: s.cpu_on,
                cpu_read: s.cpu_read,
                class: topology::CLASS_NAMES
                    .get(s.class as usize)
                    .copied()
                    .unwrap_or("unknown"),
                awake_runnable_ns: (!woken).then_some(s.awake_runnable),
                awake_on_cpu_ns: (!woken).then_some(s.awake_on_cpu),
                awake_unkept_ns: (!woken).then_some(s.awake_unkept),
            }
        })
        .collect()
}

/// `--mode both`: the event − poll difference per round trip, by stage, from the demo's own
/// mean round trips (`reports[0]` is the client) and the event phase's waterfall.
pub fn explain_phases(
    poll_demo: &serde_json::Value,
    event_demo: &serde_json::Value,
    event: Option<&WaterfallReport>,
) -> String {
    let rtt = |d: &serde_json::Value| {
        d.pointer("/reports/0/round_trip_us/t_avg")
            .and_then(|v| v.as_f64())
            .map(|us| us * 1e3)
    };
    let iterations = event_demo
        .pointer("/reports/0/iterations")
        .and_then(|v| v.as_u64());
    match (rtt(poll_demo), rtt(event_demo), iterations, event) {
        (Some(p), Some(e), Some(n), Some(r)) => format!("\n{}", model::explain(p, e, n, r)),
        (_, _, _, None) => String::new(),
        _ => "\n(no per-stage explanation: the demo's round-trip times are missing)\n".to_owned(),
    }
}

/// What the waterfall pane shows: the stages of woken events, stacked, at p50 and p99.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WaterfallView {
    pub events: u64,
    pub woken: u64,
    pub awake: u64,
    /// (stage, p50 ns, p99 ns), in time order.
    pub stages: Vec<(&'static str, f64, f64)>,
    /// Mean T1→T4 over every event.
    pub total_mean_ns: Option<f64>,
    /// The threads stalled now.
    pub stalls: Vec<stall::Stall>,
}

/// CLOCK_MONOTONIC in ns: the clock of `bpf_ktime_get_ns`.
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_module_btf_names_the_reason() {
        let root = std::env::temp_dir().join(format!("wf-btf-{}", std::process::id()));
        let dir = root.join("sys/kernel/btf");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("vmlinux"), b"").unwrap();
        let e = std::io::Error::from(std::io::ErrorKind::NotFound);
        assert!(missing_module_btf(&root, &dir, &e).contains("ib_uverbs is not loaded"));
        std::fs::create_dir_all(root.join("sys/module/ib_uverbs")).unwrap();
        let why = missing_module_btf(&root, &dir, &e);
        assert!(
            why.contains("no module BTF") && why.contains("5.11"),
            "{why}"
        );
        std::fs::write(dir.join("ib_core"), b"").unwrap();
        assert!(missing_module_btf(&root, &dir, &e).contains("loaded but has none"));
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn mlx5_completion_irqs_are_the_comp_vectors_not_the_async_one() {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/mlx5-6.12/proc/interrupts"
        ))
        .expect("fixture");
        let irqs = crate::kernel::facts::parse_interrupts(&text);
        assert_eq!(mlx5_completion_irqs(&irqs), [121, 122]);
        let rxe_guest = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/irdma-6.12/proc/interrupts"
        ))
        .expect("fixture");
        assert!(
            mlx5_completion_irqs(&crate::kernel::facts::parse_interrupts(&rxe_guest)).is_empty()
        );
    }

    /// A freed slot's next thread against its former owner, through the window's arithmetic
    /// (`Snapshot::since`): the truth is what each thread counted in its own part of the run.
    #[test]
    fn a_freed_slot_s_next_thread_and_its_former_owner_each_keep_their_own_counts() {
        use rdma_trace_common::waterfall::W_EVENTS;
        let data = |tid: u32, events: u64| {
            let mut counts = WfCounts::ZERO;
            counts.counters[W_EVENTS as usize] = events;
            model::ThreadData {
                tid,
                tgid: tid,
                comm: format!("t{tid}"),
                counts,
                hists: vec![Histogram::default(); WF_NHIST as usize],
                cpus: Default::default(),
            }
        };
        let exited = |tid: u32| WfThread {
            tid,
            tgid: tid,
            comm: [b'x'; 16],
            exited: 1,
        };
        let mut r = Retired::default();
        // The window opens with thread 100 in slot 3, 5 events read.
        let mut before = Snapshot::default();
        before.threads.insert(r.key(3), data(100, 5));
        // It reads 2 more and exits; the loader banks it and frees the slot; thread 200 takes
        // the slot and reads 7.
        assert!(r.takes(3, &exited(100)));
        r.bank(3, data(100, 7));
        let mut after = Snapshot::default();
        after.threads.insert(r.key(3), data(200, 7));
        for (k, t) in &r.threads {
            after.threads.insert(*k, t.clone());
        }
        let d = after.since(&before);
        let events = |tid: u32| {
            d.threads
                .values()
                .filter(|t| t.tid == tid)
                .map(|t| t.counts.get(W_EVENTS))
                .sum::<u64>()
        };
        assert_eq!(events(100), 2, "the former owner's window: 7 − 5");
        assert_eq!(events(200), 7, "the next owner from zero");
        // The shared last slot is never freed, nor is a slot once the bank is full.
        assert!(!r.takes(WF_THREADS - 1, &exited(0)));
        assert!(!r.takes(
            4,
            &WfThread {
                exited: 0,
                ..exited(300)
            }
        ));
        for k in 0..RETIRED_MAX as u32 {
            r.threads.insert(1000 + k, data(k, 1));
        }
        assert!(!r.takes(4, &exited(300)), "the bank is full");
    }

    #[test]
    fn a_slot_is_read_when_a_thread_took_it_or_it_is_the_shared_last_one() {
        let none = WfThread::NONE;
        assert!(!owned(3, &none), "never taken");
        assert!(
            owned(WF_THREADS - 1, &none),
            "the shared slot is always read"
        );
        assert!(owned(3, &WfThread { tid: 42, ..none }));
        let mut named = none;
        named.comm[0] = b'x';
        assert!(owned(3, &named), "a name without a tid");
    }
}

//! The attach stage of `run`, the same for every load: the plan's probes (`--probes`), the
//! calibration of each mechanism's cost, the load's own programs and the timeline recorder,
//! then the completion waterfall. Once it returns, everything is attached.

use std::fs::File;

use anyhow::Result;

use super::{config::RunConfig, timeline::TimelineRun};
use crate::{
    bpf::{calibrate::Calibration, session::Session},
    kernel::{
        facts::Kernel,
        plan::Options,
        probes::{PROBES, Shape},
    },
    load::workload::Extra,
    waterfall::{self, Waterfall},
};

/// What the window then samples.
pub struct Attached {
    pub session: Session,
    /// Per-hit cost of each attach mechanism, measured after the probes attached.
    pub calibration: Calibration,
    pub timeline: Option<TimelineRun>,
    pub waterfall: Option<Waterfall>,
}

/// Attach everything `args` asks for on `kernel`, with the load's object configuration
/// (`extra`) and the timeline file opened before (`timeline_file`).
pub fn attach(
    args: &RunConfig,
    kernel: &Kernel,
    extra: &Extra,
    timeline_file: Option<File>,
) -> Result<Attached> {
    // A workload's report counts each process's completion-event reads.
    let defs = args.probes.select(
        PROBES,
        extra.workload != rdma_trace_common::workload::WL_OFF,
    );
    // The ib_cq wakeup row labels each kernel CQ from ib_core's BTF.
    let mut config = extra.object_config();
    if defs.iter().any(|d| d.shape == Shape::CqWakeup) {
        match waterfall::ib_cq_label_globals(kernel.root()) {
            Ok(globals) => config.globals.extend(globals),
            Err(e) => eprintln!("rdma-trace: kernel CQs are counted without labels: {e:#}"),
        }
    }
    // The NVMe I/O row tells block I/O from admin commands by `struct request`'s cmd_flags.
    if defs.iter().any(|d| d.shape == Shape::NvmeIo) {
        match waterfall::nvme_io_globals(kernel.root()) {
            Ok(globals) => config.globals.extend(globals),
            Err(e) => eprintln!("rdma-trace: NVMe admin commands are split with the I/O: {e:#}"),
        }
    }
    // The waterfall lives in the same object: its globals go in before the object is loaded.
    let prepared =
        waterfall::prepare_or_explain(args.no_waterfall, args.waterfall_settings(), &mut config);
    // The NVMe target row leaves the admin queue out by `struct nvmet_req`'s queue.
    if defs.iter().any(|d| d.shape == Shape::NvmetIo)
        && kernel.root().join("sys/module/nvmet").exists()
    {
        match waterfall::nvmet_io_globals(kernel.root()) {
            Ok(globals) => config.globals.extend(globals),
            Err(e) => {
                eprintln!("rdma-trace: NVMe target admin commands are timed with the I/O: {e:#}")
            }
        }
    }
    let mut session = Session::start_with(
        kernel,
        &defs,
        Options {
            all_drivers: args.all_drivers,
            uprobes: args.uprobes,
        }
        .with_preset(args.probes),
        &config,
    )?;
    // The session's probes are on the RDMA path, softirqs and IRQs: the umask calls of the
    // calibration hit none of them.
    let calibration = session.calibrate();
    crate::startup::step("calibration");
    eprintln!("rdma-trace: {}", calibration.render());
    let timeline = super::timeline::start(&mut session, extra, timeline_file, args)?;
    // The completion waterfall attaches before the probe table is printed: that line means
    // everything is attached (the bench times start-up and the loader's CPU from it).
    let waterfall = waterfall::start_or_explain(prepared, &mut session);
    crate::startup::step("waterfall");
    crate::startup::print_if_verbose();
    Ok(Attached {
        session,
        calibration,
        timeline,
        waterfall,
    })
}

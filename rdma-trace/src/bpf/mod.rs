//! The eBPF layer: the embedded object, loaded and attached for a plan, and its maps read back.
//!
//! * [`loader`]: load the object for a [`crate::kernel::plan::Plan`], attach with fallback,
//!   read the probe rows. Features (the workload filter, the timeline) hand it their globals
//!   and map sizes as data ([`loader::ObjectConfig`]); it imports none of them.
//! * [`session`]: facts → plan → load → attach, then snapshots until dropped.
//! * [`batch`]: batched map reads (one syscall per refresh for all rows).
//! * [`hist`]: the histograms as the eBPF side builds them, and what is read off them.
//! * [`cma`]: rdma_cm's events by type, for the `rdma_cm connect` row.
//! * [`ibcq`]: the kernel CQs the ib_cq API woke and polled, per CQ.
//! * [`stats`]: the kernel's BPF run-time statistics per program.
//! * [`calibrate`]: what each attach mechanism costs per hit, measured at start.
//! * [`log`]: the programs' rare-event messages (aya-log).
//! * [`programs`]: a test that the object and the loader agree on the programs.
//!
//! Imports the kernel layer and the root modules only.

pub mod batch;
pub mod calibrate;
pub mod cma;
pub mod hist;
pub mod ibcq;
pub mod loader;
pub mod log;
pub mod programs;
pub mod session;
pub mod stats;

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
//! * [`nvme`]: NVMe over RDMA host requests split into stages, for the `nvme io` row.
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
pub mod nvme;
pub mod programs;
pub mod session;
pub mod stats;

/// The text of a NUL-padded buffer the programs filled (a task's comm, a device or module
/// name): up to its first NUL, or all of it; invalid UTF-8 is replaced, not an error.
pub fn c_string(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

#[cfg(test)]
mod tests {
    #[test]
    fn c_string_stops_at_the_first_nul_or_takes_the_whole_buffer() {
        assert_eq!(super::c_string(b"ksoftirqd/1\0\0\0\0\0"), "ksoftirqd/1");
        assert_eq!(super::c_string(b"rxe0\0junk"), "rxe0");
        assert_eq!(super::c_string(&[b'x'; 16]), "x".repeat(16));
        assert_eq!(super::c_string(&[0; 16]), "");
    }
}

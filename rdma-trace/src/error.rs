//! Error kinds that decide the exit code.

/// The kernel or the privileges lack something a probe needs, or no RDMA device (exit code 3).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Unsupported(pub String);

/// The command line asks for something that cannot act in this mode (exit code 2, as clap's
/// own usage errors).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Usage(pub String);

/// The bundled rdma-demo that `run` or `verify` spawned failed (exit code 11); the message
/// carries the demo's own status and what it said.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct DemoFailed(pub String);

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

/// Exit codes, documented in `--help`: rdma-demo's table (`rdma_demo::error::exit`), which
/// holds both binaries' codes so that no code means two things.
pub mod exit {
    pub use rdma_demo::error::exit::{DEMO_FAILED, FAILURE, OK, SOCKET_IN_DATA_PHASE, USAGE};
    /// The kernel or the privileges lack what a probe needs, or there is no RDMA device: the
    /// code rdma-demo gives for a missing device ("this machine lacks what is needed").
    pub const UNSUPPORTED: u8 = rdma_demo::error::exit::NO_DEVICE;
}

//! Error kinds that decide the exit code.

/// The kernel or the privileges lack something a probe needs (exit code 3).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Unsupported(pub String);

/// The command line asks for something that cannot act in this mode (exit code 2, as clap's
/// own usage errors).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Usage(pub String);

/// The bundled rdma-demo that `run` or `verify` spawned failed (exit code 5); the message
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

/// Exit codes, documented in `--help`.
pub mod exit {
    pub const OK: u8 = 0;
    pub const FAILURE: u8 = 1;
    pub const USAGE: u8 = 2;
    pub const UNSUPPORTED: u8 = 3;
    /// `verify`: the data phase touched a socket.
    pub const SOCKET_IN_DATA_PHASE: u8 = 4;
    /// `run`, `verify`: the bundled rdma-demo failed (its own status is in the message).
    pub const DEMO_FAILED: u8 = 5;
}

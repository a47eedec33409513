//! Error kinds that decide the exit code.

/// The kernel or the privileges lack something a probe needs (exit code 3).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Unsupported(pub String);

/// Exit codes, documented in `--help`.
pub mod exit {
    pub const OK: u8 = 0;
    pub const FAILURE: u8 = 1;
    pub const UNSUPPORTED: u8 = 3;
    /// `verify`: the data phase touched a socket.
    pub const SOCKET_IN_DATA_PHASE: u8 = 4;
}

//! What ends a demo early, and the exit code for each kind of failure.

use crate::completion::CompletionError;
use crate::devices::DevicesError;
use crate::exchange::ExchangeError;
use crate::verbs::VerbsError;

/// Exit codes of `rdma-demo`; [`EXIT_CODES_HELP`] documents them.
pub mod exit {
    pub const FAILURE: u8 = 1;
    pub const USAGE: u8 = 2;
    pub const NO_DEVICE: u8 = 3;
    pub const PORT: u8 = 4;
    pub const CONNECT: u8 = 5;
    pub const EXCHANGE: u8 = 6;
    pub const TIMEOUT: u8 = 7;
    pub const WC_STATUS: u8 = 8;
    pub const VERIFY: u8 = 9;
}

pub const EXIT_CODES_HELP: &str = "\
Exit codes:
  0  success
  1  runtime failure (a verbs call failed, e.g. a QP transition, or writing the output)
  2  usage error
  3  no RDMA device, or the device named with --device does not exist
  4  port or GID problem (port not ACTIVE, GID index out of range or empty, MTU too big)
  5  no TCP connection (refused, timed out, nothing accepted within --timeout)
  6  bad exchange (peer closed, malformed/truncated/oversized/wrong-version message, MTU or
     demo mismatch)
  7  timed out waiting for a completion (the peer died or stalled)
  8  a work completion with an error status (e.g. remote access error)
  9  verification failed (wrong data, atomic counter, or lock overlap)";

#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    #[error(transparent)]
    Devices(#[from] DevicesError),
    #[error("{0}")]
    Port(String),
    #[error(transparent)]
    Exchange(#[from] ExchangeError),
    #[error(transparent)]
    Verbs(#[from] VerbsError),
    #[error(transparent)]
    Completion(#[from] CompletionError),
    #[error("verification failed: {0}")]
    Verify(String),
    #[error("{0}")]
    Usage(String),
    /// Which side failed, in a run with both (`--loopback`).
    #[error("{side}: {source}")]
    Side {
        side: String,
        source: Box<DemoError>,
    },
    #[error("{0}")]
    Other(String),
}

impl DemoError {
    pub fn exit_code(&self) -> u8 {
        match self {
            DemoError::Devices(DevicesError::Verbs(_)) => exit::FAILURE,
            DemoError::Devices(_) => exit::NO_DEVICE,
            DemoError::Port(_) => exit::PORT,
            DemoError::Exchange(e) if e.is_connection() => exit::CONNECT,
            DemoError::Exchange(_) => exit::EXCHANGE,
            DemoError::Verbs(_) | DemoError::Other(_) => exit::FAILURE,
            DemoError::Completion(CompletionError::Timeout { .. }) => exit::TIMEOUT,
            DemoError::Completion(CompletionError::Verbs(_)) => exit::FAILURE,
            DemoError::Completion(_) => exit::WC_STATUS,
            DemoError::Verify(_) => exit::VERIFY,
            DemoError::Usage(_) => exit::USAGE,
            DemoError::Side { source, .. } => source.exit_code(),
        }
    }

    pub fn on(self, side: &str) -> DemoError {
        DemoError::Side {
            side: side.to_string(),
            source: Box::new(self),
        }
    }
}

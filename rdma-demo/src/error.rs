//! What ends a demo early, and the exit code for each kind of failure.

use crate::completion::CompletionError;
use crate::devices::DevicesError;
use crate::exchange::ExchangeError;
use crate::verbs::VerbsError;

/// Exit codes of `rdma-demo` and `rdma-trace`: one table, so that no code means two things
/// across the two binaries (`rdma-trace run` and `verify` report the status of the rdma-demo
/// they ran). [`EXIT_CODES_HELP`] documents them, in both binaries' `--help`, and so does
/// docs/exit-codes.md.
pub mod exit {
    pub const OK: u8 = 0;
    pub const FAILURE: u8 = 1;
    /// Bad flags, a deprecated spelling among them.
    pub const USAGE: u8 = 2;
    /// This machine lacks what is needed: an RDMA device (or the one named), root, or the
    /// kernel support a probe needs.
    pub const NO_DEVICE: u8 = 3;
    pub const PORT: u8 = 4;
    pub const CONNECT: u8 = 5;
    pub const EXCHANGE: u8 = 6;
    pub const TIMEOUT: u8 = 7;
    pub const WC_STATUS: u8 = 8;
    pub const VERIFY: u8 = 9;
    /// `rdma-trace verify`: the demo's data phase used a socket.
    pub const SOCKET_IN_DATA_PHASE: u8 = 10;
    /// `rdma-trace run`, `verify`: the rdma-demo it ran failed (its own status is printed).
    pub const DEMO_FAILED: u8 = 11;
    /// Stopped by signal N: 128 + N (the shell's convention).
    pub const SIGNAL_BASE: u8 = 128;

    /// Every code above with its name, for the tests that keep the table and its text in step.
    pub const ALL: [(u8, &str); 12] = [
        (OK, "OK"),
        (FAILURE, "FAILURE"),
        (USAGE, "USAGE"),
        (NO_DEVICE, "NO_DEVICE"),
        (PORT, "PORT"),
        (CONNECT, "CONNECT"),
        (EXCHANGE, "EXCHANGE"),
        (TIMEOUT, "TIMEOUT"),
        (WC_STATUS, "WC_STATUS"),
        (VERIFY, "VERIFY"),
        (SOCKET_IN_DATA_PHASE, "SOCKET_IN_DATA_PHASE"),
        (DEMO_FAILED, "DEMO_FAILED"),
    ];
}

pub const EXIT_CODES_HELP: &str = "\
Exit codes (one table for rdma-demo and rdma-trace; no code means two things):
  0    success; for rdma-trace also a window ended by --duration or q, Ctrl-C ending a
       collection that runs until stopped (--pid, --all, the periodic views), and a --pid
       run whose processes all exited
  1    runtime failure (a verbs call failed, e.g. a QP transition, or writing the output)
  2    usage error (bad flags; an old spelling names its new flag)
  3    this machine lacks what is needed: no RDMA device or none named --device, not root,
       or the kernel lacks what a probe needs (kprobes, a function, a matching IRQ)
  4    port or GID problem (port not ACTIVE, GID index out of range or empty, MTU too big)
  5    no TCP connection (refused, timed out, nothing accepted within --timeout)
  6    bad exchange (peer closed, malformed/truncated/oversized/wrong-version message, MTU or
       demo mismatch)
  7    timed out waiting for a completion (the peer died or stalled)
  8    a work completion with an error status (e.g. remote access error)
  9    verification failed (wrong data, atomic counter, or lock overlap)
  10   rdma-trace verify: the demo's data phase used a socket (the calls are named)
  11   rdma-trace run/verify: the rdma-demo it ran failed (its own status and message are
       printed)
  128+N  stopped by signal N: 129 SIGHUP, 130 SIGINT, 143 SIGTERM
A command that rdma-trace runs (run -c CMD, run -- CMD, funclat -- CMD) passes its status
through: when it fails, rdma-trace exits with its exit code, or 128+N when signal N killed it.";

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

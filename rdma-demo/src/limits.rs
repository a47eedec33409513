//! Bounds and defaults of the demos' `-n` and `-s` flags. `rdma-trace` checks its own flags against the same
//! constants, before it attaches anything, so a value the demo would refuse never gets that far.

/// Most iterations (round trips, rounds) per run.
pub const MAX_ITERATIONS: u32 = 1_000_000;
/// Smallest message or buffer: the ping-pong carries an 8-byte sequence number.
pub const MIN_SIZE: u32 = 8;
/// Largest message or buffer (1 MiB).
pub const MAX_SIZE: u32 = 1_048_576;
/// The message or buffer size when `-s` is not given, in rdma-demo and in `rdma-trace run`:
/// small, so that a run stays quick under emulation (perftest's ib_send_lat uses 2 bytes;
/// the ping-pong's sequence number needs 8).
pub const DEFAULT_SIZE: u32 = 64;
/// Most user-space stamps of each kind per side (`--stamps`; 16 bytes each, reserved at the
/// start): also the most per-event samples `rdma-trace run --sample` keeps, which asks the
/// demo for as many stamps.
pub const MAX_STAMPS: u32 = 1_000_000;

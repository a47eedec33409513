//! Bounds of the demos' `-i` and `-S` flags. `rdma-trace` checks its own flags against the same
//! constants, before it attaches anything, so a value the demo would refuse never gets that far.

/// Most iterations (round trips, rounds) per run.
pub const MAX_ITERATIONS: u32 = 1_000_000;
/// Smallest message or buffer: the ping-pong carries an 8-byte sequence number.
pub const MIN_SIZE: u32 = 8;
/// Largest message or buffer (1 MiB).
pub const MAX_SIZE: u32 = 1_048_576;

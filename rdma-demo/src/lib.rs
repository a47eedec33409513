//! Rust ports of classic RDMA verbs demos on `rdma-sys`.
//!
//! * [`verbs`]: safe RAII wrappers over libibverbs; the only module with `unsafe` code.
//! * [`sysfs`]: what `/sys/class/infiniband` shows (device presence, drivers, GID attributes).
//! * [`devices`]: the `devices` subcommand (inventory, text and JSON output).
//! * [`flags`], [`error::exit`], [`limits`]: what `rdma-demo` and `rdma-trace` share on the
//!   command line (deprecated spellings, one meaning per flag, one table of exit codes, bounds).

#![deny(unsafe_code)]

pub mod atomic;
pub mod completion;
pub mod devices;
pub mod endpoint;
pub mod error;
pub mod exchange;
pub mod flags;
pub mod limits;
pub mod phase;
pub mod pingpong;
pub mod report;
pub mod role;
pub mod stamps;
pub mod stats;
pub mod sysfs;
#[cfg(test)]
mod test_util;
#[allow(unsafe_code)]
pub mod verbs;
pub mod write_pingpong;
pub mod write_read;

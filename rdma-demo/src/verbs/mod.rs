//! Safe RAII wrappers over the libibverbs API of `rdma-sys`.
//!
//! This module holds **all** `unsafe` code of the crate (the crate root denies `unsafe_code`
//! everywhere else). Every raw pointer lives in a wrapper that releases it in `Drop`; everything
//! handed out is plain Rust data.
//!
//! Ownership follows libibverbs:
//!
//! * [`DeviceList`] owns the array from `ibv_get_device_list`; a [`Device`] borrows from it.
//! * [`Context`] (from [`Device::open`]) owns an open device and outlives the list, as libibverbs
//!   allows: an opened device stays valid after `ibv_free_device_list`.
//!
//! * Later objects hold an [`Rc`](std::rc::Rc) to what they were created from, so each is
//!   released before its parent whatever the order the caller drops them in: a
//!   [`QueuePair`] before its CQs and PD, a [`CompletionQueue`] before its
//!   [`CompletionChannel`], a [`MemoryRegion`] before its [`ProtectionDomain`], all before the
//!   [`Context`]. The one order the types cannot enforce is QP before the MRs it used: owners
//!   declare the QP field first.

#![deny(clippy::undocumented_unsafe_blocks)]

mod attr;
mod clock;
mod cq;
mod device;
mod ffi;
mod gid;
mod interrupt;
mod pd;
mod qp;

use std::io;

pub use attr::{AtomicCap, DeviceAttr, LinkLayer, Mtu, PortAttr, PortState, Transport};
pub use clock::{monotonic_ns, thread_id};
pub use cq::{
    CompletionChannel, CompletionQueue, Event, POLL_BATCH, WcOpcode, WorkCompletion, status_str,
    wait_readable,
};
pub use device::{Context, Device, DeviceList};
pub use gid::{Gid, GidEntry, GidType, ParseGidError};
pub use pd::{Access, MemoryRegion, ProtectionDomain};
pub use qp::{PathParams, QpCaps, QueuePair, RemoteAddr, RemoteQp, SendOp};

/// A failed verbs call: which call, on what, and the OS error it reported.
#[derive(Debug, thiserror::Error)]
#[error("{call}{}: {source}", describe_target(target))]
pub struct VerbsError {
    /// The libibverbs function that failed, e.g. `ibv_open_device`.
    pub call: &'static str,
    /// What it was called on, e.g. `rxe0 port 1`; empty when there is nothing to name.
    pub target: String,
    /// The errno it reported.
    #[source]
    pub source: io::Error,
}

fn describe_target(target: &str) -> String {
    if target.is_empty() {
        String::new()
    } else {
        format!("({target})")
    }
}

impl VerbsError {
    fn new(call: &'static str, target: impl Into<String>, source: io::Error) -> Self {
        VerbsError {
            call,
            target: target.into(),
            source,
        }
    }

    /// The raw errno, if the error carries one.
    pub fn errno(&self) -> Option<i32> {
        self.source.raw_os_error()
    }
}

/// The error `errno` describes right now; for calls that returned NULL or -1.
fn last_os_error() -> io::Error {
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(0) | None => io::Error::other("failed without setting errno"),
        Some(_) => e,
    }
}

/// Checks the return value of a verbs call that returns 0 on success and otherwise either an
/// errno value (most calls) or -1 with `errno` set (a few older ones).
fn check_rc(
    rc: libc::c_int,
    call: &'static str,
    target: impl FnOnce() -> String,
) -> Result<(), VerbsError> {
    match rc {
        0 => Ok(()),
        rc if rc > 0 => Err(VerbsError::new(
            call,
            target(),
            io::Error::from_raw_os_error(rc),
        )),
        _ => Err(VerbsError::new(call, target(), last_os_error())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The error of `call` on `target` failing with `errno`.
    fn failed(call: &'static str, target: &str, errno: i32) -> VerbsError {
        VerbsError::new(call, target, io::Error::from_raw_os_error(errno))
    }

    #[test]
    fn error_names_call_target_and_errno() {
        let e = failed("ibv_query_port", "rxe0 port 1", libc::EINVAL);
        let s = e.to_string();
        assert!(s.starts_with("ibv_query_port(rxe0 port 1): "), "{s}");
        assert!(s.contains("Invalid argument"), "{s}");
        assert_eq!(e.errno(), Some(libc::EINVAL));
    }

    #[test]
    fn error_without_target_has_no_parentheses() {
        let e = failed("ibv_get_device_list", "", libc::ENOSYS);
        assert!(e.to_string().starts_with("ibv_get_device_list: "), "{e}");
    }

    #[test]
    fn check_rc_maps_return_values() {
        assert!(check_rc(0, "x", String::new).is_ok());
        let e = check_rc(libc::ENODATA, "x", || "t".into()).unwrap_err();
        assert_eq!(e.errno(), Some(libc::ENODATA));
        assert_eq!(e.target, "t");
    }
}

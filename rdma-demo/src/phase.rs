//! Phase markers: each demo thread renames itself when its data phase starts and ends, so a
//! tracer (`rdma-trace verify`) can tell connection setup, the data phase and teardown apart
//! from the thread name (comm) alone. The rename is a write to `/proc/thread-self/comm`: plain
//! file I/O, never a socket, and visible in `ps -L` / `top -H` too.
//!
//! Names (15 bytes at most, the kernel's limit): setup keeps the thread's own name,
//! [`DATA_NAME`] during the data phase, [`TEARDOWN_NAME`] after it.

use std::io::Write as _;
use std::net::{TcpListener, TcpStream};

use crate::endpoint::Fault;
use crate::error::DemoError;

/// Thread name during the data phase (`rdma_trace_common::syscalls::DATA_COMM`).
pub const DATA_NAME: &str = "rdma-demo:data";
/// Thread name once the data phase is over (`rdma_trace_common::syscalls::TEARDOWN_COMM`).
pub const TEARDOWN_NAME: &str = "rdma-demo:done";

/// The calling thread's data phase; dropping it starts teardown.
#[must_use = "the data phase ends when this is dropped"]
pub struct DataPhase(());

/// Marks the start of the calling thread's data phase. With the `tcp-in-data` fault, the
/// thread then sends a few bytes over a loopback TCP connection, on purpose.
pub fn data(fault: Option<Fault>) -> Result<DataPhase, DemoError> {
    rename(DATA_NAME);
    if fault == Some(Fault::TcpInData) {
        tcp_in_data().map_err(|e| {
            DemoError::Other(format!("injecting TCP traffic in the data phase: {e}"))
        })?;
    }
    Ok(DataPhase(()))
}

impl Drop for DataPhase {
    fn drop(&mut self) {
        rename(TEARDOWN_NAME);
    }
}

fn rename(name: &str) {
    // Best effort: without /proc the demo runs the same, only unmarked.
    let _ = std::fs::write("/proc/thread-self/comm", name);
}

/// Connects to a listener of our own on 127.0.0.1 and writes to it (the kernel completes the
/// handshake and buffers the bytes; nobody needs to accept).
fn tcp_in_data() -> std::io::Result<()> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let mut stream = TcpStream::connect(listener.local_addr()?)?;
    stream.write_all(b"data that should have gone over RDMA")?;
    Ok(())
}

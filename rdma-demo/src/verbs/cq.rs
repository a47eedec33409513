//! Completion channels, completion queues and work completions.

use std::ffi::{CStr, c_void};
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd};
use std::ptr::{self, NonNull};
use std::rc::Rc;
use std::time::Duration;

use rdma_sys::{
    ibv_ack_cq_events, ibv_comp_channel, ibv_cq, ibv_create_comp_channel, ibv_create_cq,
    ibv_destroy_comp_channel, ibv_destroy_cq, ibv_get_cq_event, ibv_poll_cq, ibv_req_notify_cq,
    ibv_wc, ibv_wc_opcode, ibv_wc_status, ibv_wc_status_str,
};

use super::device::Context;
use super::interrupt::Deadline;
use super::{VerbsError, check_rc, last_os_error};

/// A completion channel (`ibv_create_comp_channel`): a file descriptor that becomes readable
/// when an armed CQ gets a completion.
#[derive(Debug)]
pub struct CompletionChannel {
    raw: NonNull<ibv_comp_channel>,
    _ctx: Rc<Context>,
}

impl CompletionChannel {
    pub fn new(ctx: &Rc<Context>) -> Result<Rc<Self>, VerbsError> {
        // SAFETY: the context is open; the result is NULL or a channel we destroy in Drop.
        let raw = unsafe { ibv_create_comp_channel(ctx.as_ptr()) };
        let raw = NonNull::new(raw).ok_or_else(|| {
            VerbsError::new("ibv_create_comp_channel", ctx.name(), last_os_error())
        })?;
        Ok(Rc::new(CompletionChannel {
            raw,
            _ctx: Rc::clone(ctx),
        }))
    }
}

impl AsFd for CompletionChannel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the channel's fd stays open until ibv_destroy_comp_channel in Drop, which
        // cannot run while `self` is borrowed.
        unsafe { BorrowedFd::borrow_raw(self.raw.as_ref().fd) }
    }
}

impl Drop for CompletionChannel {
    fn drop(&mut self) {
        // SAFETY: created by ibv_create_comp_channel, destroyed once; CQs using it hold an `Rc`
        // to it, so they are gone.
        let _ = unsafe { ibv_destroy_comp_channel(self.raw.as_ptr()) };
    }
}

/// Waits until `fd` is readable or `timeout` passes; `Ok(false)` on timeout. EINTR restarts.
pub fn wait_readable(fd: BorrowedFd<'_>, timeout: Duration) -> io::Result<bool> {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        // Round up so a sub-millisecond remainder still waits.
        let ms = i32::try_from(left.as_micros().div_ceil(1000)).unwrap_or(i32::MAX);
        let mut pfd = libc::pollfd {
            fd: std::os::fd::AsRawFd::as_raw_fd(&fd),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd; the fd is borrowed, hence open.
        let r = unsafe { libc::poll(&mut pfd, 1, ms) };
        match r {
            0 if left.is_zero() => return Ok(false),
            0 => {}
            r if r > 0 => return Ok(true),
            _ => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
}

/// One work completion, copied out of `ibv_wc`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkCompletion {
    pub wr_id: u64,
    /// `ibv_wc_status`; 0 is success.
    pub status: u32,
    pub opcode: WcOpcode,
    pub vendor_err: u32,
    pub byte_len: u32,
    pub qp_num: u32,
}

impl WorkCompletion {
    pub fn is_success(&self) -> bool {
        self.status == ibv_wc_status::IBV_WC_SUCCESS
    }

    /// `ibv_wc_status_str`, e.g. `remote access error`.
    pub fn status_str(&self) -> String {
        status_str(self.status)
    }

    /// The status is `IBV_WC_REM_ACCESS_ERR`.
    pub fn is_remote_access_error(&self) -> bool {
        self.status == ibv_wc_status::IBV_WC_REM_ACCESS_ERR
    }
}

/// `ibv_wc_status_str(status)`.
pub fn status_str(status: u32) -> String {
    // SAFETY: ibv_wc_status_str returns a static string for any value ("unknown" for others).
    let p = unsafe { ibv_wc_status_str(status) };
    if p.is_null() {
        return format!("status {status}");
    }
    // SAFETY: non-NULL, NUL-terminated, static.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// What a completed work request was (`ibv_wc.opcode`); only meaningful on success.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WcOpcode {
    Send,
    RdmaWrite,
    RdmaRead,
    CompSwap,
    FetchAdd,
    Recv,
    Other(u32),
}

impl WcOpcode {
    fn from_raw(raw: u32) -> Self {
        match raw {
            ibv_wc_opcode::IBV_WC_SEND => WcOpcode::Send,
            ibv_wc_opcode::IBV_WC_RDMA_WRITE => WcOpcode::RdmaWrite,
            ibv_wc_opcode::IBV_WC_RDMA_READ => WcOpcode::RdmaRead,
            ibv_wc_opcode::IBV_WC_COMP_SWAP => WcOpcode::CompSwap,
            ibv_wc_opcode::IBV_WC_FETCH_ADD => WcOpcode::FetchAdd,
            ibv_wc_opcode::IBV_WC_RECV => WcOpcode::Recv,
            other => WcOpcode::Other(other),
        }
    }
}

/// A completion queue (`ibv_create_cq`), optionally tied to a completion channel.
#[derive(Debug)]
pub struct CompletionQueue {
    raw: NonNull<ibv_cq>,
    channel: Option<Rc<CompletionChannel>>,
    ctx: Rc<Context>,
}

/// Completions fetched per `ibv_poll_cq` call.
pub const POLL_BATCH: usize = 16;

impl CompletionQueue {
    pub fn new(
        ctx: &Rc<Context>,
        depth: u32,
        channel: Option<&Rc<CompletionChannel>>,
    ) -> Result<Rc<Self>, VerbsError> {
        let ch = channel.map_or(ptr::null_mut(), |c| c.raw.as_ptr());
        let cqe = i32::try_from(depth).unwrap_or(i32::MAX);
        // SAFETY: the context (and the channel, if any) are live; the result is NULL or a CQ
        // we destroy in Drop.
        let raw = unsafe { ibv_create_cq(ctx.as_ptr(), cqe, ptr::null_mut(), ch, 0) };
        let raw = NonNull::new(raw).ok_or_else(|| {
            VerbsError::new(
                "ibv_create_cq",
                format!("{} depth {depth}", ctx.name()),
                last_os_error(),
            )
        })?;
        Ok(Rc::new(CompletionQueue {
            raw,
            channel: channel.cloned(),
            ctx: Rc::clone(ctx),
        }))
    }

    pub(super) fn as_ptr(&self) -> *mut ibv_cq {
        self.raw.as_ptr()
    }

    pub fn channel(&self) -> Option<&Rc<CompletionChannel>> {
        self.channel.as_ref()
    }

    /// `ibv_poll_cq`: appends up to [`POLL_BATCH`] completions to `out`; returns how many.
    pub fn poll(&self, out: &mut Vec<WorkCompletion>) -> Result<usize, VerbsError> {
        let mut wcs = [const { MaybeUninit::<ibv_wc>::uninit() }; POLL_BATCH];
        // SAFETY: the CQ is live; `wcs` has room for POLL_BATCH entries.
        let n = unsafe {
            ibv_poll_cq(
                self.raw.as_ptr(),
                POLL_BATCH as i32,
                wcs.as_mut_ptr().cast::<ibv_wc>(),
            )
        };
        if n < 0 {
            return Err(VerbsError::new(
                "ibv_poll_cq",
                self.ctx.name(),
                io::Error::from_raw_os_error(-n),
            ));
        }
        let n = n as usize;
        for wc in &wcs[..n] {
            // SAFETY: ibv_poll_cq filled the first n entries.
            let wc = unsafe { wc.assume_init_ref() };
            out.push(WorkCompletion {
                wr_id: wc.wr_id,
                status: wc.status,
                opcode: WcOpcode::from_raw(wc.opcode),
                vendor_err: wc.vendor_err,
                byte_len: wc.byte_len,
                qp_num: wc.qp_num,
            });
        }
        Ok(n)
    }

    /// `ibv_req_notify_cq`: the next completion makes the channel readable.
    pub fn arm(&self) -> Result<(), VerbsError> {
        // SAFETY: the CQ is live.
        let rc = unsafe { ibv_req_notify_cq(self.raw.as_ptr(), 0) };
        check_rc(rc, "ibv_req_notify_cq", || self.ctx.name().to_string())
    }

    /// Waits up to `timeout` for an event on this CQ's channel, blocked in `ibv_get_cq_event`
    /// (as the C tools are: see `interrupt` for how the timeout ends it), and acknowledges it
    /// with `ibv_ack_cq_events`. `Ok(None)`: timeout. With `stamp`, the event carries the
    /// CLOCK_MONOTONIC time read right after `ibv_get_cq_event` returned it.
    /// The CQ must have been armed, or no event will come.
    pub fn wait_event(&self, timeout: Duration, stamp: bool) -> Result<Option<Event>, VerbsError> {
        let Some(channel) = &self.channel else {
            return Err(VerbsError::new(
                "ibv_get_cq_event",
                format!("{}: CQ has no completion channel", self.ctx.name()),
                io::Error::from_raw_os_error(libc::EINVAL),
            ));
        };
        // A blocking read, as the C tools do; the deadline interrupts it (see `interrupt`).
        let deadline = Deadline::arm(timeout)
            .map_err(|e| VerbsError::new("sigaction", "the wait's watchdog", e))?;
        let mut cq: *mut ibv_cq = ptr::null_mut();
        let mut cq_ctx: *mut c_void = ptr::null_mut();
        let read_at = loop {
            // SAFETY: the channel is live (borrowed through `self`); out-pointers valid. It
            // blocks until an event comes or a signal interrupts it.
            let rc = unsafe { ibv_get_cq_event(channel.raw.as_ptr(), &mut cq, &mut cq_ctx) };
            if rc == 0 {
                break stamp.then(super::monotonic_ns);
            }
            let e = last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(VerbsError::new("ibv_get_cq_event", self.ctx.name(), e));
            }
            if deadline.passed() {
                return Ok(None);
            }
        };
        drop(deadline);
        // Only this CQ uses the channel, so the event is ours. Acknowledge at once, so that
        // ibv_destroy_cq never waits for unacknowledged events.
        // SAFETY: `cq` is the live CQ the event was for.
        unsafe { ibv_ack_cq_events(cq, 1) };
        if cq != self.raw.as_ptr() {
            return Err(VerbsError::new(
                "ibv_get_cq_event",
                format!("{}: event for a foreign CQ", self.ctx.name()),
                io::Error::from_raw_os_error(libc::EINVAL),
            ));
        }
        Ok(Some(Event { read_at }))
    }
}

/// A completion event taken from a CQ's channel ([`CompletionQueue::wait_event`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    /// CLOCK_MONOTONIC ns right after `ibv_get_cq_event` returned, when asked for.
    pub read_at: Option<u64>,
}

impl Drop for CompletionQueue {
    fn drop(&mut self) {
        // SAFETY: created by ibv_create_cq, destroyed once; QPs using it hold an `Rc` to it and
        // are gone; every event was acknowledged in `wait_event`.
        let _ = unsafe { ibv_destroy_cq(self.raw.as_ptr()) };
    }
}

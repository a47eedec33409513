//! Timeouts for blocking waits, without a syscall on the woken thread's path.
//!
//! The C tools wait for a completion event in a blocking `read` of the channel
//! (`ibv_get_cq_event`): a woken thread returns from that one syscall. Waiting with `poll` and
//! then reading costs the woken thread a second syscall; the completion waterfall measured it
//! (stage "on CPU → read returns", p50 65 µs for rdma-demo against 37 µs for `ib_send_lat -e`
//! in the 6.1 guest under TCG). So the demo blocks in `read` too, and keeps its timeout this
//! way: before the read the thread stores its deadline ([`Deadline::arm`]); a watchdog thread
//! that looks every [`TICK`] sends it [`SIGNAL`] while that deadline has passed; the handler does
//! nothing and is installed without `SA_RESTART`, so the read returns `EINTR`, and the caller
//! sees that its deadline passed.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How often the watchdog looks at the deadlines (a timeout fires up to this much late).
const TICK: Duration = Duration::from_millis(50);
/// The signal that interrupts a wait (nothing else in the demo uses it).
const SIGNAL: libc::c_int = libc::SIGUSR2;

/// A thread that may be interrupted: its id, and its deadline in ns since [`epoch`] (0: not
/// waiting).
struct Waiter {
    thread: libc::pthread_t,
    deadline: AtomicU64,
}

/// Every thread that has waited, until it exits.
static WAITERS: Mutex<Vec<Arc<Waiter>>> = Mutex::new(Vec::new());

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn now_ns() -> u64 {
    u64::try_from(epoch().elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// This thread's entry in [`WAITERS`], removed when the thread exits (so the watchdog never
/// signals a thread that is gone: it holds the lock while it signals).
struct Registered(Arc<Waiter>);

impl Drop for Registered {
    fn drop(&mut self) {
        if let Ok(mut w) = WAITERS.lock() {
            w.retain(|x| !Arc::ptr_eq(x, &self.0));
        }
    }
}

thread_local! {
    static ME: Registered = {
        let me = Arc::new(Waiter {
            // SAFETY: pthread_self has no preconditions.
            thread: unsafe { libc::pthread_self() },
            deadline: AtomicU64::new(0),
        });
        if let Ok(mut w) = WAITERS.lock() {
            w.push(Arc::clone(&me));
        }
        Registered(me)
    };
}

/// The handler: its delivery is what interrupts the read.
extern "C" fn on_signal(_: libc::c_int) {}

/// Installs the handler and starts the watchdog, once per process (its errno if that failed).
fn start() -> io::Result<()> {
    static STARTED: OnceLock<Option<i32>> = OnceLock::new();
    let failed = STARTED.get_or_init(|| {
        // SAFETY: an all-zero sigaction is valid (empty mask, no flags) before we fill it in.
        let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
        sa.sa_sigaction = on_signal as *const () as libc::sighandler_t;
        sa.sa_flags = 0; // no SA_RESTART: the blocked read returns EINTR
        // SAFETY: a valid sigaction for a catchable signal; the handler is async-signal-safe
        // (it does nothing).
        if unsafe { libc::sigaction(SIGNAL, &sa, std::ptr::null_mut()) } != 0 {
            return Some(io::Error::last_os_error().raw_os_error().unwrap_or(0));
        }
        std::thread::Builder::new()
            .name("wait-watchdog".into())
            .spawn(watchdog)
            .err()
            .map(|e| e.raw_os_error().unwrap_or(0))
    });
    match failed {
        Some(errno) => Err(io::Error::from_raw_os_error(*errno)),
        None => Ok(()),
    }
}

/// Every [`TICK`], signals each registered thread whose deadline has passed.
fn watchdog() {
    loop {
        std::thread::sleep(TICK);
        let now = now_ns();
        let Ok(waiters) = WAITERS.lock() else { return };
        for w in waiters.iter() {
            let d = w.deadline.load(Ordering::Acquire);
            if d != 0 && now >= d {
                // SAFETY: the thread is registered, so alive (it unregisters under this lock
                // before it exits). Sent again each tick while the deadline has passed, so a
                // signal that lands just before the read is not the last one.
                unsafe { libc::pthread_kill(w.thread, SIGNAL) };
            }
        }
    }
}

/// This thread's deadline while it blocks; cleared when dropped.
pub struct Deadline {
    at: u64,
}

impl Deadline {
    /// From now on, this thread's blocking calls are interrupted (`EINTR`) once `timeout` has
    /// passed, until the returned guard drops.
    pub fn arm(timeout: Duration) -> io::Result<Self> {
        start()?;
        let at = now_ns()
            .saturating_add(u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX))
            .max(1);
        ME.with(|me| me.0.deadline.store(at, Ordering::Release));
        Ok(Self { at })
    }

    /// Whether the deadline has passed (an `EINTR` then means the timeout).
    pub fn passed(&self) -> bool {
        now_ns() >= self.at
    }
}

impl Drop for Deadline {
    fn drop(&mut self) {
        ME.with(|me| me.0.deadline.store(0, Ordering::Release));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd as _;

    /// A blocking read of a pipe nobody writes returns `EINTR` after the deadline, and one
    /// with data in time returns it.
    #[test]
    fn a_blocking_read_is_interrupted_after_its_deadline_only() {
        let (r, w) = std::io::pipe().unwrap();
        let mut buf = [0u8; 1];
        let t = Instant::now();
        let d = Deadline::arm(Duration::from_millis(200)).unwrap();
        // SAFETY: a valid fd and a 1-byte buffer.
        let n = unsafe { libc::read(r.as_raw_fd(), buf.as_mut_ptr().cast(), 1) };
        let e = io::Error::last_os_error();
        assert_eq!(n, -1);
        assert_eq!(e.kind(), io::ErrorKind::Interrupted);
        assert!(d.passed());
        assert!(
            t.elapsed() >= Duration::from_millis(200),
            "{:?}",
            t.elapsed()
        );
        drop(d);
        // In time: the data, no signal.
        let d = Deadline::arm(Duration::from_secs(5)).unwrap();
        std::io::Write::write_all(&mut &w, b"x").unwrap();
        // SAFETY: as above.
        let n = unsafe { libc::read(r.as_raw_fd(), buf.as_mut_ptr().cast(), 1) };
        assert_eq!((n, buf[0]), (1, b'x'));
        assert!(!d.passed());
    }
}

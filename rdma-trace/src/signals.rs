//! One signal stream for the whole process, installed before anything is created.
//!
//! [`install`] runs first thing in `main`, before any device, probe or child exists. From then on
//! SIGINT, SIGTERM and SIGHUP no longer kill the process: the first one is recorded (a flag set
//! by an async-signal-safe handler) and every loop learns about it, through [`stopped`] (async,
//! awaited by the one sampling loop, `crate::model::window::Waiter`) or [`check`] (between blocking
//! steps such as attaching probes). A signal that arrives while no loop waits is kept, never
//! lost: the state is sticky, unlike a `ctrl_c()` future created anew on each pass of a loop.
//! Unwinding then drops the probes, the children and the temporary device.
//!
//! A SIGKILL cannot be caught: for it, children get a parent-death signal
//! ([`die_with_parent`]) and the temporary device a lock file (`softroce`).

use std::sync::{
    LazyLock,
    atomic::{AtomicI32, Ordering},
};

use anyhow::{Context as _, Result};
use tokio::{
    signal::unix::{SignalKind, signal},
    sync::watch,
};

/// The first stop signal received (0: none yet).
static RECEIVED: AtomicI32 = AtomicI32::new(0);

/// Wakes the async waiters; carries the same number as [`RECEIVED`].
static WAKE: LazyLock<watch::Sender<i32>> = LazyLock::new(|| watch::channel(0).0);

/// The signals that stop rdma-trace.
pub const STOP_SIGNALS: [i32; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

/// A stop signal that was received.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stop(pub i32);

impl Stop {
    /// How a tracing window that it ended is labelled (`Window::ended_by`).
    pub fn ended_by(self) -> &'static str {
        match self.0 {
            libc::SIGINT => "interrupted",
            libc::SIGTERM => "terminated",
            libc::SIGHUP => "hangup",
            _ => "signal",
        }
    }

    pub fn name(self) -> &'static str {
        match self.0 {
            libc::SIGINT => "SIGINT",
            libc::SIGTERM => "SIGTERM",
            libc::SIGHUP => "SIGHUP",
            _ => "a signal",
        }
    }

    /// The shell's convention: 128 + the signal number.
    pub fn exit_code(self) -> u8 {
        u8::try_from(signal_status(self.0)).unwrap_or(1)
    }
}

/// The status a shell gives a process ended by signal `sig`: 128 + `sig`. Both rdma-trace's own
/// exit status after a stop signal and a traced command's status count this way.
pub const fn signal_status(sig: i32) -> i32 {
    SIGNAL_STATUS_BASE + sig
}

/// Statuses above this one stand for a signal ([`signal_status`]).
pub const SIGNAL_STATUS_BASE: i32 = 128;

/// A child's exit status as a number: its exit code, or [`signal_status`] when a signal ended it.
pub fn exit_status_code(s: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt as _;
    s.code()
        .unwrap_or_else(|| signal_status(s.signal().unwrap_or(0)))
}

/// The process was stopped by a signal: unwind, cleaning up, and exit with 128 + signal.
#[derive(Debug, thiserror::Error)]
#[error("stopped by {}; probes detached, nothing left behind", .0.name())]
pub struct Stopped(pub Stop);

fn record(sig: i32) {
    let _ = RECEIVED.compare_exchange(0, sig, Ordering::SeqCst, Ordering::SeqCst);
}

/// Catch SIGINT, SIGTERM and SIGHUP from now on (they only set a flag). Call before creating
/// anything that must be cleaned up; needs no runtime.
pub fn install() -> Result<()> {
    for sig in STOP_SIGNALS {
        // SAFETY: the action only does an atomic compare-exchange on a static, which is
        // async-signal-safe (no allocation, no lock).
        unsafe { signal_hook_registry::register(sig, move || record(sig)) }
            .with_context(|| format!("installing a handler for signal {sig}"))?;
    }
    Ok(())
}

/// Within the tokio runtime: one task owns the process's signal streams and wakes every waiter
/// of [`stopped`]. Call once, at the start of the runtime.
pub fn listen() -> Result<()> {
    let mut streams = Vec::new();
    for sig in STOP_SIGNALS {
        let s = signal(SignalKind::from_raw(sig))
            .with_context(|| format!("listening for signal {sig}"))?;
        streams.push((sig, s));
    }
    // A signal caught before the streams existed (e.g. during start-up) is already recorded.
    wake();
    tokio::spawn(async move {
        loop {
            let sig = first_of(&mut streams).await;
            record(sig);
            wake();
        }
    });
    Ok(())
}

/// The first of the streams to deliver, as its signal number.
async fn first_of(streams: &mut [(i32, tokio::signal::unix::Signal)]) -> i32 {
    std::future::poll_fn(|cx| {
        for (sig, s) in streams.iter_mut() {
            if s.poll_recv(cx).is_ready() {
                return std::task::Poll::Ready(*sig);
            }
        }
        std::task::Poll::Pending
    })
    .await
}

fn wake() {
    let sig = RECEIVED.load(Ordering::SeqCst);
    if sig != 0 {
        WAKE.send_replace(sig);
    }
}

/// The stop signal received so far, if any.
pub fn received() -> Option<Stop> {
    match RECEIVED.load(Ordering::SeqCst) {
        0 => None,
        s => Some(Stop(s)),
    }
}

/// Between blocking steps: an error ([`Stopped`]) once a stop signal has arrived.
pub fn check() -> Result<()> {
    match received() {
        Some(s) => Err(Stopped(s).into()),
        None => Ok(()),
    }
}

/// Resolves once a stop signal has arrived (at once if one already has). Cancel-safe: it can be
/// created anew on each pass of a `select!` loop without losing a signal.
pub async fn stopped() -> Stop {
    let mut rx = WAKE.subscribe();
    if let Some(s) = received() {
        return s;
    }
    match rx.wait_for(|&s| s != 0).await {
        Ok(s) => Stop(*s),
        // The sender is a static: it never closes.
        Err(_) => std::future::pending().await,
    }
}

/// Make `cmd`'s process receive `sig` when rdma-trace dies, SIGKILL included, so a killed
/// rdma-trace leaves no demo running. (The kernel sends it when the thread that spawned the
/// child ends: children are spawned from the runtime's only thread, the main thread.)
pub fn die_with_parent(cmd: &mut tokio::process::Command, sig: i32) {
    // SAFETY: getpid has no preconditions.
    let parent = unsafe { libc::getpid() };
    let hook = move || {
        // SAFETY: runs in the forked child before exec; prctl and getppid are
        // async-signal-safe and touch no memory of ours.
        let (set, ppid) = unsafe {
            (
                libc::prctl(
                    libc::PR_SET_PDEATHSIG,
                    libc::c_ulong::try_from(sig).unwrap_or(9),
                ),
                libc::getppid(),
            )
        };
        if set != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // The parent died before prctl took effect: nobody will signal us.
        if ppid != parent {
            return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
        }
        Ok(())
    };
    // SAFETY: the hook only makes async-signal-safe calls and allocates nothing.
    unsafe {
        cmd.pre_exec(hook);
    }
}

#[cfg(test)]
mod tests {
    use std::{
        io::{BufRead as _, BufReader},
        process::{Command, Stdio},
        time::{Duration, Instant},
    };

    use super::*;

    #[test]
    fn stop_names_and_exit_codes() {
        assert_eq!(Stop(libc::SIGINT).exit_code(), 130);
        assert_eq!(Stop(libc::SIGTERM).exit_code(), 143);
        assert_eq!(Stop(libc::SIGHUP).exit_code(), 129);
        assert_eq!(Stop(libc::SIGHUP).ended_by(), "hangup");
    }

    // Signal state is per process: each case runs as an ignored test of this binary, in a child
    // process of its own.
    fn child(test: &str) -> Command {
        let mut c = Command::new(std::env::current_exe().expect("the test binary"));
        c.args([
            &format!("signals::tests::{test}"),
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ]);
        c
    }

    fn run_child(test: &str) {
        let out = child(test).output().expect("running the test binary");
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{test}: {:?}\n{text}", out.status);
        assert!(text.contains("1 passed"), "{test} did not run:\n{text}");
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    struct Idle;
    impl crate::model::sample::Source for Idle {
        fn sample(&mut self, _: Duration) -> Result<crate::model::sample::Sample> {
            Ok(crate::views::tui::app::tests::sample(&[]))
        }
        fn reset(&mut self) -> Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_signal_before_anything_waits_is_kept_for_every_loop() {
        run_child("child_signal_before_any_wait");
    }

    #[test]
    #[ignore = "runs in its own process, from a_signal_before_anything_waits_is_kept_for_every_loop"]
    fn child_signal_before_any_wait() {
        install().unwrap();
        // Without the handler, this kills the process (the parent test sees a signal death).
        // SAFETY: raise only sends a signal to this thread.
        assert_eq!(unsafe { libc::raise(libc::SIGTERM) }, 0);
        assert_eq!(received(), Some(Stop(libc::SIGTERM)));
        let e = check().unwrap_err();
        assert!(e.downcast_ref::<Stopped>().is_some(), "{e}");
        // SAFETY: as above; the first signal stays the one on record.
        assert_eq!(unsafe { libc::raise(libc::SIGINT) }, 0);
        runtime().block_on(async {
            listen().unwrap();
            let limit = Duration::from_secs(5);
            // The live view's loop, then another one: both see the signal that came before them.
            let mut live = crate::views::tui::Live::quiet("t");
            let w = tokio::time::timeout(limit, live.watch(&mut Idle, None, None))
                .await
                .expect("the live view missed the signal")
                .unwrap();
            assert_eq!(w.ended_by, "terminated");
            let w = tokio::time::timeout(limit, crate::model::window::wait_window(None, None))
                .await
                .expect("the second loop missed the signal")
                .unwrap();
            assert_eq!(w.ended_by, "terminated");
            assert!(w.interrupted());
        });
    }

    #[test]
    fn a_signal_while_a_loop_waits_ends_it() {
        run_child("child_signal_while_waiting");
    }

    #[test]
    #[ignore = "runs in its own process, from a_signal_while_a_loop_waits_ends_it"]
    fn child_signal_while_waiting() {
        install().unwrap();
        runtime().block_on(async {
            listen().unwrap();
            std::thread::spawn(|| {
                std::thread::sleep(Duration::from_millis(200));
                // SAFETY: kill sends SIGHUP to this process, which catches it.
                unsafe { libc::kill(libc::getpid(), libc::SIGHUP) };
            });
            let w = tokio::time::timeout(
                Duration::from_secs(5),
                crate::model::window::wait_window(Some(Duration::from_secs(60)), None),
            )
            .await
            .expect("the loop missed the signal")
            .unwrap();
            assert_eq!(w.ended_by, "hangup");
            assert!(w.seconds < 5.0);
        });
    }

    fn state(pid: u32) -> Option<char> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        stat.rsplit_once(") ")?.1.chars().next()
    }

    #[test]
    fn a_sigkilled_parent_takes_its_children_along() {
        let mut parent = child("child_spawns_a_sleeper")
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(parent.stdout.take().unwrap()).lines();
        let pid: u32 = lines
            // libtest's "test ... " may precede it on the same line.
            .find_map(|l| l.ok()?.split_once("SLEEPER ")?.1.trim().parse().ok())
            .expect("the child never reported its sleeper");
        assert_eq!(
            state(pid).map(|s| s != 'Z'),
            Some(true),
            "sleeper not running"
        );
        parent.kill().unwrap(); // SIGKILL
        parent.wait().unwrap();
        let start = Instant::now();
        while state(pid).is_some_and(|s| s != 'Z') {
            if start.elapsed() > Duration::from_secs(5) {
                // SAFETY: kill with a pid we started; cleaning up the orphan.
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
                panic!("the child outlived its SIGKILLed parent");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    #[ignore = "runs in its own process, from a_sigkilled_parent_takes_its_children_along"]
    fn child_spawns_a_sleeper() {
        runtime().block_on(async {
            let mut cmd = tokio::process::Command::new("sleep");
            cmd.arg("600");
            die_with_parent(&mut cmd, libc::SIGKILL);
            let c = cmd.spawn().unwrap();
            println!("SLEEPER {}", c.id().unwrap());
            std::mem::forget(c);
            std::thread::sleep(Duration::from_secs(600));
        });
    }
}

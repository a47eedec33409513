//! The one sampling loop: a tracing window waits for the first of the next refresh tick, a stop
//! signal (`crate::signals`: SIGINT, SIGTERM, SIGHUP), the end of `--duration`, the exit of a
//! spawned command, or an event of the caller's own (the live view's keys). [`Waiter::next`]
//! says which one came; the caller does its own work per tick (sample maps, draw, drain a ring)
//! and decides when the window ends. [`Waiter::window`] then labels it ([`Window`]).

use std::{future::Future, pin::Pin, process::ExitStatus, time::Duration};

use anyhow::{Context as _, Result};
use serde::Serialize;
use tokio::{
    process::Child,
    time::{Instant, Interval, MissedTickBehavior, Sleep},
};

use crate::signals::Stop;

/// How a tracing window ended.
#[derive(Clone, Debug, Serialize)]
pub struct Window {
    pub seconds: f64,
    /// Why collection stopped: `duration`, `command`, `quit` (the live view's `q`), `interrupted`
    /// (Ctrl-C, SIGINT), `terminated` (SIGTERM), `hangup` (SIGHUP).
    pub ended_by: &'static str,
    /// Exit code of the traced command (a signal gives 128 + signal).
    pub command_status: Option<i32>,
}

impl Window {
    pub fn interrupted(&self) -> bool {
        matches!(self.ended_by, "interrupted" | "terminated" | "hangup")
    }
}

/// What ended a window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    /// `--duration` passed.
    Duration,
    /// A stop signal arrived.
    Signal(Stop),
    /// The spawned command exited.
    Command(ExitStatus),
    /// The caller's own reason, as [`Window::ended_by`] labels it (`quit`, `exited`, ...).
    Caller(&'static str),
}

impl End {
    /// The label of [`Window::ended_by`].
    pub fn ended_by(self) -> &'static str {
        match self {
            Self::Duration => "duration",
            Self::Signal(s) => s.ended_by(),
            Self::Command(_) => "command",
            Self::Caller(why) => why,
        }
    }

    /// The command's exit status, when its exit ended the window.
    pub fn command_status(self) -> Option<i32> {
        match self {
            Self::Command(s) => Some(crate::signals::exit_status_code(s)),
            _ => None,
        }
    }
}

/// What woke a [`Waiter`].
#[derive(Debug)]
pub enum Wake<T> {
    /// The refresh interval came round (at once the first time).
    Tick,
    /// The caller's own event.
    Event(T),
    /// Something that ends the window.
    End(End),
}

/// Waits, again and again, for the first of: the refresh tick, a stop signal, the deadline, the
/// command's exit, the caller's event. Every wait is cancel-safe: a signal that comes between
/// two waits is seen by the next one.
pub struct Waiter<'c> {
    start: Instant,
    deadline: Option<Pin<Box<Sleep>>>,
    tick: Option<Interval>,
    child: Option<&'c mut Child>,
}

impl<'c> Waiter<'c> {
    /// A window from now: ending after `duration` (if any) or when `child` (if any) exits; no
    /// ticks until [`Self::every`].
    pub fn new(duration: Option<Duration>, child: Option<&'c mut Child>) -> Self {
        let start = Instant::now();
        Self {
            start,
            deadline: duration.map(|d| Box::pin(tokio::time::sleep_until(start + d))),
            tick: None,
            child,
        }
    }

    /// Tick every `interval`, the first tick at once; `missed` says what a late tick does.
    pub fn every(mut self, interval: Duration, missed: MissedTickBehavior) -> Self {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(missed);
        self.tick = Some(tick);
        self
    }

    /// Time since the window began.
    pub fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    /// Wait for the first of the tick, a stop signal, the deadline, the command's exit and
    /// `event` (pass `std::future::pending()` for none).
    pub async fn next<F: Future>(&mut self, event: F) -> Result<Wake<F::Output>> {
        let Self {
            deadline,
            tick,
            child,
            ..
        } = self;
        let deadline = async {
            match deadline.as_mut() {
                Some(s) => s.as_mut().await,
                None => std::future::pending().await,
            }
        };
        let tick = async {
            match tick.as_mut() {
                Some(t) => {
                    t.tick().await;
                }
                None => std::future::pending().await,
            }
        };
        // `Child::wait` is cancel-safe: the status is kept once reaped.
        let child_exit = async {
            match child.as_deref_mut() {
                Some(c) => c.wait().await,
                None => std::future::pending().await,
            }
        };
        Ok(tokio::select! {
            () = deadline => Wake::End(End::Duration),
            r = child_exit => Wake::End(End::Command(r.context("waiting for the command")?)),
            s = crate::signals::stopped() => Wake::End(End::Signal(s)),
            () = tick => Wake::Tick,
            e = event => Wake::Event(e),
        })
    }

    /// Wait for the next tick without an event of the caller's: `None` at the tick, or what
    /// ended the window first.
    pub async fn next_tick(&mut self) -> Result<Option<End>> {
        match self
            .next(std::future::pending::<std::convert::Infallible>())
            .await?
        {
            Wake::Tick => Ok(None),
            Wake::End(end) => Ok(Some(end)),
            Wake::Event(never) => match never {},
        }
    }

    /// Wait until something ends the window, ignoring ticks (there are none without
    /// [`Self::every`]).
    pub async fn until_end(&mut self) -> Result<End> {
        loop {
            if let Some(end) = self.next_tick().await? {
                return Ok(end);
            }
        }
    }

    /// A command still running when the window ended otherwise than by its exit is killed and
    /// reaped.
    pub async fn stop_child(&mut self, end: End) {
        if matches!(end, End::Command(_)) {
            return;
        }
        if let Some(c) = self.child.as_deref_mut() {
            let _ = c.start_kill();
            let _ = c.wait().await;
        }
    }

    /// The window, ended by `end`, as reports show it.
    pub fn window(&self, end: End) -> Window {
        Window {
            seconds: self.elapsed().as_secs_f64(),
            ended_by: end.ended_by(),
            command_status: end.command_status(),
        }
    }
}

/// Wait until `duration` passes, `child` exits, or a stop signal (SIGINT, SIGTERM, SIGHUP) —
/// whichever comes first.
/// A child still running at the end is killed (and reaped). Without a child or a duration,
/// only a signal ends the window.
pub async fn wait_window(duration: Option<Duration>, child: Option<&mut Child>) -> Result<Window> {
    let mut w = Waiter::new(duration, child);
    let end = w.until_end().await?;
    w.stop_child(end).await;
    Ok(w.window(end))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_duration_ends_a_window_after_its_ticks() {
        let mut w = Waiter::new(Some(Duration::from_millis(200)), None)
            .every(Duration::from_millis(20), MissedTickBehavior::Skip);
        let mut ticks = 0;
        let end = loop {
            match w.next(std::future::pending::<()>()).await.unwrap() {
                Wake::Tick => ticks += 1,
                Wake::Event(()) => unreachable!("no event was given"),
                Wake::End(e) => break e,
            }
        };
        assert_eq!(end, End::Duration);
        assert!(ticks >= 3, "{ticks} ticks");
        let win = w.window(end);
        assert_eq!(win.ended_by, "duration");
        assert_eq!(win.command_status, None);
        assert!(win.seconds >= 0.2, "{}", win.seconds);
    }

    #[tokio::test]
    async fn the_callers_event_wakes_the_waiter() {
        let mut w = Waiter::new(Some(Duration::from_secs(60)), None);
        match w.next(async { 7 }).await.unwrap() {
            Wake::Event(n) => assert_eq!(n, 7),
            other => panic!("{other:?}"),
        }
        assert_eq!(w.window(End::Caller("quit")).ended_by, "quit");
    }

    /// The window of a child running `sh -c script`, and the child after it.
    async fn window_of(script: &str, duration: Option<Duration>) -> (Window, Child) {
        let mut child = tokio::process::Command::new("sh")
            .args(["-c", script])
            .spawn()
            .unwrap();
        let w = wait_window(duration, Some(&mut child)).await.unwrap();
        (w, child)
    }

    #[tokio::test]
    async fn the_commands_exit_ends_the_window_with_its_status() {
        let (w, _) = window_of("exit 3", Some(Duration::from_secs(60))).await;
        assert_eq!(w.ended_by, "command");
        assert_eq!(w.command_status, Some(3));
        assert!(!w.interrupted());
    }

    #[tokio::test]
    async fn a_command_killed_by_a_signal_has_128_plus_the_signal() {
        let (w, _) = window_of("kill -TERM $$", None).await;
        assert_eq!(w.ended_by, "command");
        assert_eq!(w.command_status, Some(128 + libc::SIGTERM));
    }

    #[tokio::test]
    async fn a_command_still_running_at_the_deadline_is_killed_and_reaped() {
        let (w, mut child) = window_of("exec sleep 600", Some(Duration::from_millis(100))).await;
        assert_eq!(w.ended_by, "duration");
        assert_eq!(w.command_status, None);
        assert!(
            child.try_wait().unwrap().is_some(),
            "the command still runs"
        );
    }
}

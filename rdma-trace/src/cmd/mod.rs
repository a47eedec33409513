//! One module per subcommand; shared plumbing here.

pub mod completions;
pub mod cq;
pub mod export;
pub mod funclat;
pub mod irq;
pub mod probes;
pub mod run;
pub mod softirqs;
pub mod verify;

use std::{path::Path, time::Duration};

use anyhow::{Context as _, Result};
use serde::Serialize;
use tokio::{
    process::Child,
    signal::unix::{SignalKind, signal},
};

/// How a tracing window ended.
#[derive(Clone, Debug, Serialize)]
pub struct Window {
    pub seconds: f64,
    /// Why collection stopped: `duration`, `command`, `interrupted` (Ctrl-C), `terminated` (SIGTERM).
    pub ended_by: &'static str,
    /// Exit code of the traced command (a signal gives 128 + signal).
    pub command_status: Option<i32>,
}

impl Window {
    pub fn interrupted(&self) -> bool {
        matches!(self.ended_by, "interrupted" | "terminated")
    }
}

/// Wait until `duration` passes, `child` exits, Ctrl-C or SIGTERM — whichever comes first.
/// A child still running at the end is killed (and reaped). Without a child or a duration,
/// only a signal ends the window.
pub async fn wait_window(
    duration: Option<Duration>,
    mut child: Option<&mut Child>,
) -> Result<Window> {
    let start = tokio::time::Instant::now();
    let mut term = signal(SignalKind::terminate()).context("listening for SIGTERM")?;
    let sleep = async {
        match duration {
            Some(d) => tokio::time::sleep(d).await,
            None => std::future::pending().await,
        }
    };
    let child_exit = async {
        match child.as_deref_mut() {
            Some(c) => c.wait().await,
            None => std::future::pending().await,
        }
    };
    let (ended_by, status) = tokio::select! {
        () = sleep => ("duration", None),
        r = child_exit => ("command", Some(r.context("waiting for the command")?)),
        r = tokio::signal::ctrl_c() => { r.context("listening for Ctrl-C")?; ("interrupted", None) }
        _ = term.recv() => ("terminated", None),
    };
    if status.is_none()
        && let Some(c) = child
    {
        let _ = c.start_kill();
        let _ = c.wait().await;
    }
    let command_status = status.map(|s| {
        use std::os::unix::process::ExitStatusExt as _;
        s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(0))
    });
    Ok(Window {
        seconds: start.elapsed().as_secs_f64(),
        ended_by,
        command_status,
    })
}

/// Write `report` as pretty JSON to `path` (`-` = stdout).
pub fn write_json(path: &Path, report: &impl Serialize) -> Result<()> {
    let text = serde_json::to_string_pretty(report).context("serializing the report")?;
    if path == Path::new("-") {
        println!("{text}");
        return Ok(());
    }
    std::fs::write(path, text + "\n")
        .with_context(|| format!("writing the JSON report to {}", path.display()))
}

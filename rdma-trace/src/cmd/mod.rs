//! One module per subcommand; shared plumbing here.

pub mod funclat;
pub mod softirqs;

use std::{path::Path, time::Duration};

use anyhow::{Context as _, Result};
use serde::Serialize;
use tokio::process::Command;

/// How a tracing window ended.
#[derive(Debug, Serialize)]
pub struct Window {
    pub seconds: f64,
    /// Why collection stopped: `duration`, `command`, `interrupted`.
    pub ended_by: &'static str,
    /// Exit code of the traced command (a signal gives 128 + signal).
    pub command_status: Option<i32>,
}

/// Collect until `duration` passes, the command exits, or Ctrl-C — whichever comes first.
/// Without a command or a duration, only Ctrl-C ends the window.
pub async fn collect_window(duration: Option<Duration>, command: &[String]) -> Result<Window> {
    let start = tokio::time::Instant::now();
    let mut child = match command.split_first() {
        Some((prog, args)) => Some(
            Command::new(prog)
                .args(args)
                .kill_on_drop(true)
                .spawn()
                .with_context(|| format!("could not start the command `{prog}`"))?,
        ),
        None => None,
    };
    let sleep = async {
        match duration {
            Some(d) => tokio::time::sleep(d).await,
            None => std::future::pending().await,
        }
    };
    let child_exit = async {
        match child.as_mut() {
            Some(c) => c.wait().await,
            None => std::future::pending().await,
        }
    };
    let (ended_by, status) = tokio::select! {
        () = sleep => ("duration", None),
        r = child_exit => ("command", Some(r.context("waiting for the command")?)),
        r = tokio::signal::ctrl_c() => { r.context("listening for Ctrl-C")?; ("interrupted", None) }
    };
    if status.is_none()
        && let Some(c) = child.as_mut()
    {
        // Stop the command when the window ends before it does; report how it ended.
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

/// Write `report` as pretty JSON to `path`.
pub fn write_json(path: &Path, report: &impl Serialize) -> Result<()> {
    let text = serde_json::to_string_pretty(report).context("serializing the report")?;
    std::fs::write(path, text + "\n")
        .with_context(|| format!("writing the JSON report to {}", path.display()))
}

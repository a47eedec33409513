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
use tokio::process::Child;

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

/// Wait until `duration` passes, `child` exits, or a stop signal (SIGINT, SIGTERM, SIGHUP) —
/// whichever comes first.
/// A child still running at the end is killed (and reaped). Without a child or a duration,
/// only a signal ends the window.
pub async fn wait_window(
    duration: Option<Duration>,
    mut child: Option<&mut Child>,
) -> Result<Window> {
    let start = tokio::time::Instant::now();
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
        s = crate::signals::stopped() => (s.ended_by(), None),
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

/// What an rdma-demo exit status means (rdma-demo's `--help` lists them).
pub fn demo_status_meaning(status: Option<i32>) -> &'static str {
    use rdma_demo::error::exit as e;
    let Some(s) = status else {
        return "it did not exit";
    };
    [
        (e::FAILURE, "failure"),
        (e::USAGE, "bad usage"),
        (e::NO_DEVICE, "no or unknown RDMA device"),
        (e::PORT, "port or GID"),
        (e::CONNECT, "no TCP connection"),
        (e::EXCHANGE, "bad exchange"),
        (e::TIMEOUT, "completion timeout"),
        (e::WC_STATUS, "completion error"),
        (e::VERIFY, "verification failed"),
    ]
    .iter()
    .find(|(code, _)| i32::from(*code) == s)
    .map_or(
        if s > 128 {
            "killed by a signal"
        } else {
            "unknown"
        },
        |(_, m)| m,
    )
}

/// Write `report` as pretty JSON to `path` (`-` = stdout), atomically (see `output`).
pub fn write_json(path: &Path, report: &impl Serialize) -> Result<()> {
    let text = serde_json::to_string_pretty(report).context("serializing the report")?;
    crate::output::write_atomic(path, (text + "\n").as_bytes()).context("writing the JSON report")
}

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

use std::path::Path;

use anyhow::{Context as _, Result};
use serde::Serialize;

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
        if s > crate::signals::SIGNAL_STATUS_BASE {
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

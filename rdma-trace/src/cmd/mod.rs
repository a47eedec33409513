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

use std::time::Duration;

/// Parse a positive number of seconds (`2`, `0.5`).
pub fn parse_seconds(s: &str) -> Result<Duration, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v < 1e9 => Ok(Duration::from_secs_f64(v)),
        _ => Err(format!("`{s}` is not a positive number of seconds")),
    }
}

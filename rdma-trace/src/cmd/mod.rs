//! One module per subcommand; shared plumbing here.

pub mod calibrate;
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

/// The words of `-c "CMD ARGS"`: the line split as a shell would split it (quotes and
/// backslashes), with no expansion (`$VAR`, `*`, `~` stay as they are; run `sh -c '...'` for
/// those). The same as `-- CMD ARGS`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommandLine(pub Vec<String>);

impl CommandLine {
    pub fn parse(s: &str) -> Result<Self, String> {
        match shlex::split(s) {
            Some(words) if !words.is_empty() => Ok(Self(words)),
            Some(_) => Err("an empty command".to_owned()),
            None => Err(format!(
                "cannot split `{s}` into words: an unclosed quote or a trailing backslash"
            )),
        }
    }
}

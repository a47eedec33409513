//! What every demo's report shares: who ran where and how, the results block, and the notes
//! printed before it all.

use std::fmt::Write as _;

use serde::Serialize;

use crate::completion::Mode;
use crate::endpoint::Endpoint;
use crate::stamps::Stamps;
use crate::stats::{self, RoundTrips, Summary, Totals};

/// The part of a report every demo has; a report flattens it into its JSON object.
#[derive(Debug, Clone, Serialize)]
pub struct Run {
    pub role: &'static str,
    pub device: String,
    pub mode: Mode,
    pub iterations: u32,
    pub totals: Totals,
    /// `--stamps N`: this side's event reads and posts, when asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stamps: Option<Stamps>,
    /// Printed first; not in the JSON.
    #[serde(skip)]
    pub notes: Vec<String>,
}

impl Run {
    /// A run of `role` on `ep`, with the endpoint's notes.
    pub fn new(role: &'static str, ep: &Endpoint, iterations: u32, totals: Totals) -> Self {
        Run {
            role,
            device: ep.device.clone(),
            mode: ep.mode,
            iterations,
            totals,
            stamps: None,
            notes: ep.notes.clone(),
        }
    }

    /// With the stamps of the side's completions ([`crate::completion::Completions::stamps`]).
    pub fn with_stamps(mut self, stamps: Option<Stamps>) -> Self {
        self.stamps = stamps;
        self
    }

    /// The title line of a demo of `size`-byte messages or buffers:
    /// `role device{what}, {size} B x {iterations} iterations, {how}`, where `how` is
    /// `{mode} mode` unless the demo names it.
    pub fn sized_title(&self, what: &str, size: u32, how: Option<&str>) -> String {
        let mode = format!("{} mode", self.mode.name());
        format!(
            "{} {}{what}, {size} B x {} iterations, {}",
            self.role,
            self.device,
            self.iterations,
            how.unwrap_or(&mode)
        )
    }

    /// [`Run::render`] of a ping-pong of `size`-byte messages: no details, a latency per
    /// round trip, then the round trips and their halves as perftest's `tool` prints them.
    pub fn render_round_trips(
        &self,
        title: &str,
        size: u32,
        latency: &RoundTrips,
        tool: &str,
    ) -> String {
        let mut out = self.render(title, "", "round trip per iteration");
        out.push_str(&latency.render(size.into(), tool));
        out
    }

    /// [`Run::render`], then a [`stats::table`] of `bytes` for each named summary that is
    /// there, titled `table_title(name)`: the one-sided demos' latencies, post to completion.
    pub fn render_with_tables(
        &self,
        title: &str,
        details: &str,
        latency_note: &str,
        summaries: &[(&str, &Option<Summary>)],
        bytes: u64,
        table_title: impl Fn(&str) -> String,
    ) -> String {
        let mut out = self.render(title, details, latency_note);
        for (name, s) in summaries {
            if let Some(s) = s {
                out.push_str(&stats::table(&table_title(name), bytes, s));
            }
        }
        out
    }

    /// The notes, the `title` line, `details` (whole lines) and the results block, whose
    /// latency is `latency_note`.
    pub fn render(&self, title: &str, details: &str, latency_note: &str) -> String {
        let mut out = String::new();
        for n in &self.notes {
            let _ = writeln!(out, "{n}");
        }
        let _ = writeln!(out, "{title}");
        out.push_str(details);
        out.push_str(&self.totals.render(latency_note));
        out
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_sized_title_reads_as_the_demos_printed_it() {
        let run = Run {
            role: "client",
            device: "rxe0".into(),
            mode: Mode::Event,
            iterations: 10,
            totals: Totals::ping_pong(Duration::from_millis(1), 10, Duration::ZERO),
            stamps: None,
            notes: Vec::new(),
        };
        assert_eq!(
            run.sized_title(": RDMA WRITE/READ", 64, None),
            "client rxe0: RDMA WRITE/READ, 64 B x 10 iterations, event mode"
        );
        assert_eq!(
            run.sized_title(": RDMA WRITE ping-pong", 8, Some("memory polling")),
            "client rxe0: RDMA WRITE ping-pong, 8 B x 10 iterations, memory polling"
        );
    }
}

//! What every demo's report shares: who ran where and how, the results block, and the notes
//! printed before it all.

use std::fmt::Write as _;

use serde::Serialize;

use crate::completion::Mode;
use crate::endpoint::Endpoint;
use crate::stats::{RoundTrips, Totals};

/// The part of a report every demo has; a report flattens it into its JSON object.
#[derive(Debug, Clone, Serialize)]
pub struct Run {
    pub role: &'static str,
    pub device: String,
    pub mode: Mode,
    pub iterations: u32,
    pub totals: Totals,
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
            notes: ep.notes.clone(),
        }
    }

    /// A title line: `role device`, then `rest` (`: what ran, how`).
    pub fn title(&self, rest: std::fmt::Arguments<'_>) -> String {
        format!("{} {}{rest}", self.role, self.device)
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

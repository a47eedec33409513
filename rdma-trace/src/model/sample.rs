//! What one refresh of a live run hands its view: the probes since the last reset, the cost,
//! the load's progress and the waterfall ([`Sample`]), from a [`Source`] the run provides.

use std::time::Duration;

use anyhow::Result;

use crate::{
    model::{overhead::Overhead, report::ProbeReport},
    waterfall::WaterfallView,
};

/// Where the load generator is.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Progress {
    /// What runs (`event mode, rxe0 ↔ rxe1`).
    pub label: String,
    pub elapsed: Duration,
    /// Work done so far (e.g. ping-pong iterations), when it can be told.
    pub done: Option<u64>,
    pub total: Option<u64>,
    /// How `done` is known (`rxe_cq_post / 4`).
    pub done_from: Option<&'static str>,
}

impl Progress {
    /// Fraction done in 0..=1, when known.
    pub fn ratio(&self) -> Option<f64> {
        match (self.done, self.total) {
            (Some(d), Some(t)) if t > 0 => Some((d as f64 / t as f64).clamp(0.0, 1.0)),
            _ => None,
        }
    }
}

/// One refresh worth of data.
pub struct Sample {
    pub probes: Vec<ProbeReport>,
    pub overhead: Option<Overhead>,
    pub progress: Progress,
    /// The completion waterfall since the view's baseline, when it is traced.
    pub waterfall: Option<WaterfallView>,
}

/// What feeds the view.
pub trait Source {
    /// Data since the last reset, `elapsed` into the window.
    fn sample(&mut self, elapsed: Duration) -> Result<Sample>;
    /// [`Source::sample`] for a refresh of the screen: what is dear to read and moves slowly
    /// (the waterfall) may be the last one read, up to about a second old.
    fn sample_quick(&mut self, elapsed: Duration) -> Result<Sample> {
        self.sample(elapsed)
    }
    /// Start counting from now (key `r`).
    fn reset(&mut self) -> Result<()>;
    /// Checked after each refresh: `Some(why)` ends the window (e.g. every traced process
    /// exited), `why` becoming [`crate::model::window::Window::ended_by`].
    fn finished(&mut self) -> Option<&'static str> {
        None
    }
}

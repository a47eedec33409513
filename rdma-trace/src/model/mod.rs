//! The model layer: what a run measured, as data, independent of how it is shown.
//!
//! * [`window`]: the one sampling loop and the window every count of a report covers.
//! * [`baseline`]: where a run's counts start, and the deltas from there.
//! * [`sample`]: what one refresh hands a view ([`sample::Sample`], [`sample::Source`]).
//! * [`report`]: per-probe results.
//! * [`overhead`]: what tracing cost (BPF run time, the loader's CPU and memory).
//! * [`budget`]: what tracing adds per round trip, against `--overhead-budget`.
//! * [`losses`]: what the programs could not record, and the runs the kernel skipped.
//!
//! Imports the waterfall, bpf and kernel layers, never a view or a load.

pub mod baseline;
pub mod budget;
pub mod losses;
pub mod overhead;
pub mod report;
pub mod sample;
pub mod window;

//! The `run` pipeline, from a typed [`config::RunConfig`] (read once from the command line by
//! `cmd/run.rs`) to the report:
//!
//! 1. **plan**: the kernel's facts and the config give the plan (`kernel::plan`, inside
//!    [`crate::bpf::session::Session::start_with`]);
//! 2. **attach**: the plan gives a session (`bpf::session`), the waterfall starts
//!    (`waterfall`), the timeline recorder too (`views::timeline`);
//! 3. **drive**: the load runs while the window ticks (`model::window`, the live view);
//! 4. **collect**: the session's deltas over the window give the report model
//!    (`model::report`, `model::overhead`, the waterfall's report);
//! 5. **render**: text, JSON, the timeline file.
//!
//! The load is one [`config::Load`]: the bundled demo ([`demo`]) or a workload, a command, pids or
//! the whole system ([`workload`]).

pub mod attach;
pub mod config;
pub mod demo;
pub mod render;
pub mod report;
pub mod timeline;
pub mod workload;

use anyhow::Result;

use self::config::{Load, RunConfig};

/// Runs the pipeline for `config`'s load. `Some(status)`: exit with the command's status.
pub async fn run(config: &RunConfig) -> Result<Option<i32>> {
    match &config.load {
        Load::Demo(demo) => demo::run(config, demo).await,
        Load::Workload(target) => workload::run(config, target.clone()).await,
    }
}

//! The load layer: what generates the completions a run traces.
//!
//! * [`workload`]: the traced process set (`-- CMD` and its children, `--pid`, `--all`), its
//!   eBPF configuration and per-process counts. **A new kind of load goes here.**
//! * [`demo`]: the bundled rdma-demo: its binary, its exit statuses.
//! * [`softroce`]: a temporary Soft-RoCE device when the host has none.
//!
//! Imports the model, waterfall, bpf and kernel layers, never a view.

pub mod demo;
pub mod softroce;
pub mod workload;

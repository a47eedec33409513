//! The kernel layer: what the running kernel offers, and what to attach on it.
//!
//! * [`facts`]: kprobes, BTF, symbols, tracepoints, RDMA devices and IRQs, read below a root
//!   directory (live, or a fixture tree in `tests/fixtures/`).
//! * [`probes`]: the probe table, one row per probe. **A new probe is a new row here.**
//! * [`plan`]: per row, how it can be attached on this kernel, or why not (pure).
//! * [`elf`]: a function's offset in a user binary, for uprobes.
//!
//! Imports only the root modules (errors, signals, start-up steps): nothing above it.

pub mod elf;
pub mod facts;
pub mod plan;
pub mod probes;

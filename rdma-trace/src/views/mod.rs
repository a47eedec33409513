//! The view layer: how a run is shown. **A new view goes here.**
//!
//! * [`tui`]: the live view (ratatui screen, or text each interval).
//! * [`timeline`]: the Perfetto timeline file (`--timeline`).
//! * [`prometheus`]: the Prometheus text format and its HTTP server (`export`).
//!
//! Views read the model; nothing below imports a view.

pub mod prometheus;
pub mod timeline;
pub mod tui;

//! How verbose this run is: `-v` (counted) and `RUST_LOG`, read once at start-up. The eBPF
//! programs' messages (`bpf::log`) and the start-up step line (`startup`) follow it.

use std::sync::atomic::{AtomicU8, Ordering};

/// 0: off; else the most verbose level shown (1 error … 5 trace, as aya-log and `log` number
/// them).
static LEVEL: AtomicU8 = AtomicU8::new(0);

/// Sets the level from `-v` (count) and `RUST_LOG`; call once at start-up.
pub fn init(verbose: u8, rust_log: Option<&str>) {
    LEVEL.store(level_from(verbose, rust_log), Ordering::Relaxed);
}

/// The level for the object's `AYA_LOG_LEVEL` global.
pub fn level() -> u8 {
    LEVEL.load(Ordering::Relaxed)
}

/// `-v` shows warnings (the rare events), `-vv` info, `-vvv` debug. `RUST_LOG` names a level
/// (`warn`, `rdma_trace=debug`, `off`); the more verbose of the two wins, `off` only when
/// there is no `-v`.
fn level_from(verbose: u8, rust_log: Option<&str>) -> u8 {
    let from_v = match verbose {
        0 => 0,
        v => (v + 1).min(5),
    };
    let from_env = rust_log.map_or(0, |text| {
        text.split(',')
            .map(|d| {
                d.rsplit('=')
                    .next()
                    .unwrap_or("")
                    .trim()
                    .to_ascii_lowercase()
            })
            .filter_map(|l| match l.as_str() {
                "off" => Some(0),
                "error" => Some(1),
                "warn" => Some(2),
                "info" => Some(3),
                "debug" => Some(4),
                "trace" => Some(5),
                _ => None,
            })
            .max()
            // A RUST_LOG without a level (a bare target) means "error" in env_logger; show
            // the rare events anyway, which are warnings.
            .unwrap_or(2)
    });
    from_v.max(from_env)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_from_v_and_rust_log() {
        assert_eq!(level_from(0, None), 0);
        assert_eq!(
            level_from(1, None),
            2,
            "-v shows the rare events (warnings)"
        );
        assert_eq!(level_from(3, None), 4);
        assert_eq!(level_from(9, None), 5);
        assert_eq!(level_from(0, Some("debug")), 4);
        assert_eq!(level_from(0, Some("tokio=info,rdma_trace=warn")), 3);
        assert_eq!(level_from(0, Some("off")), 0);
        assert_eq!(level_from(1, Some("off")), 2);
        assert_eq!(level_from(0, Some("rdma_trace")), 2);
    }
}

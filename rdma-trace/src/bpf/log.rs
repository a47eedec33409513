//! The eBPF programs' rare-event messages (aya-log): an end without its start, a busy entry
//! slot, a full sample ring. Off unless `-v` or `RUST_LOG` asks for them: the level is patched
//! into the object at load (`AYA_LOG_LEVEL`; 0 silences every statement in the kernel). A thread
//! reads the log ring while the object lives and prints to stderr, at most [`BURST`] messages per
//! second; the rest are counted and summed up once a second, so a storm cannot flood the
//! terminal.

use std::{
    io::Write as _,
    os::fd::AsRawFd as _,
    sync::{Arc, Mutex, atomic::Ordering},
    time::{Duration, Instant},
};

use anyhow::{Result, anyhow};
use aya::Ebpf;

use crate::stoppable::StoppableThread;

/// The object's level global (aya-log-ebpf).
pub const LEVEL_GLOBAL: &str = "AYA_LOG_LEVEL";
/// Messages printed per second at most.
pub const BURST: u32 = 5;

/// The sample rings of the object, by the number the programs report (`rare::ring_full`).
const RINGS: &[&str] = &["CQ_EVENTS (rdma-trace cq)"];

/// Prints records with at most [`BURST`] per second; `kslot N:` becomes the function's name,
/// `interval N:` the interval probe's, `sample ring N` the ring's.
struct RateLimited {
    names: Names,
    state: Mutex<Window>,
}

/// What the numbers in the programs' messages stand for in this run.
#[derive(Clone, Debug, Default)]
pub struct Names {
    /// Kernel-function slot N → its function.
    pub slots: Vec<String>,
    /// Interval N → its probe.
    pub intervals: Vec<String>,
}

struct Window {
    start: Instant,
    printed: u32,
    suppressed: u64,
}

impl RateLimited {
    fn new(names: Names) -> Self {
        RateLimited {
            names,
            state: Mutex::new(Window {
                start: Instant::now(),
                printed: 0,
                suppressed: 0,
            }),
        }
    }

    /// The message with a leading `kslot N:` replaced by the slot's function, `interval N:`
    /// by the interval probe's name, and `sample ring N` by the ring's name.
    fn text(&self, message: &str) -> String {
        for (prefix, names) in [
            ("kslot ", &self.names.slots),
            ("interval ", &self.names.intervals),
        ] {
            if let Some(rest) = message.strip_prefix(prefix)
                && let Some((n, tail)) = rest.split_once(':')
                && let Some(name) = n.parse::<usize>().ok().and_then(|n| names.get(n))
                && !name.is_empty()
            {
                return format!("{name}:{tail}");
            }
        }
        if let Some(rest) = message.strip_prefix("sample ring ")
            && let Some((n, tail)) = rest.split_once(' ')
            && let Some(ring) = n.parse::<usize>().ok().and_then(|n| RINGS.get(n))
        {
            return format!("sample ring {ring} {tail}");
        }
        message.to_owned()
    }

    /// Decides about one message at `now`: the lines to print (a summary of the previous
    /// window's suppressed messages first, when there were any).
    fn admit(&self, now: Instant, message: &str) -> Vec<String> {
        let mut w = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = Vec::new();
        if now.duration_since(w.start) >= Duration::from_secs(1) {
            if w.suppressed > 0 {
                out.push(format!(
                    "{} more eBPF messages in the last second were not shown (rate limit {BURST}/s)",
                    w.suppressed
                ));
            }
            *w = Window {
                start: now,
                printed: 0,
                suppressed: 0,
            };
        }
        if w.printed < BURST {
            w.printed += 1;
            out.push(self.text(message));
        } else {
            w.suppressed += 1;
        }
        out
    }

    /// The summary of a window that ended with suppressed messages (at shutdown).
    fn finish(&self) -> Option<String> {
        let w = self.state.lock().unwrap_or_else(|e| e.into_inner());
        (w.suppressed > 0).then(|| {
            format!(
                "{} more eBPF messages were not shown (rate limit {BURST}/s)",
                w.suppressed
            )
        })
    }
}

impl log::Log for RateLimited {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.level() as u8 <= crate::verbosity::level()
    }

    fn log(&self, record: &log::Record<'_>) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let lines = self.admit(Instant::now(), &record.args().to_string());
        let mut err = std::io::stderr().lock();
        for line in lines {
            let _ = writeln!(err, "rdma-trace: [ebpf {}] {line}", record.level());
        }
    }

    fn flush(&self) {}
}

/// Reads the log ring on a thread until dropped (then reads what is left).
pub struct Reader {
    _thread: StoppableThread,
}

impl Reader {
    /// Starts reading the object's log ring, when logging is on.
    pub fn start(ebpf: &mut Ebpf, names: Names) -> Result<Option<Reader>> {
        if crate::verbosity::level() == 0 {
            return Ok(None);
        }
        let logger = Arc::new(RateLimited::new(names));
        let mut ring = aya_log::EbpfLogger::init_with_logger(ebpf, Shared(logger.clone()))
            .map_err(|e| anyhow!("reading the eBPF log ring: {}", crate::error::chain(&e)))?;
        let thread = StoppableThread::spawn("ebpf-log", move |stop| {
            let fd = ring.as_raw_fd();
            while !stop.load(Ordering::Relaxed) {
                let mut pfd = libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one valid pollfd for the duration of the call; the ring's fd
                // stays open while `ring` lives (this thread owns it).
                unsafe { libc::poll(&mut pfd, 1, 100) };
                ring.flush();
            }
            ring.flush();
            if let Some(line) = logger.finish() {
                eprintln!("rdma-trace: [ebpf] {line}");
            }
        })
        .map_err(|e| anyhow!("starting the eBPF log thread: {e}"))?;
        Ok(Some(Reader { _thread: thread }))
    }
}

/// The logger shared between the reader thread and its end-of-run summary.
struct Shared(Arc<RateLimited>);

impl log::Log for Shared {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        self.0.enabled(metadata)
    }

    fn log(&self, record: &log::Record<'_>) {
        self.0.log(record)
    }

    fn flush(&self) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_limit_prints_a_burst_then_sums_up_the_rest() {
        let l = RateLimited::new(Names {
            slots: vec!["irdma_process_ceq".into()],
            intervals: vec!["wakeup".into()],
        });
        let t0 = Instant::now();
        let mut printed = Vec::new();
        for _ in 0..1000 {
            printed.extend(l.admit(t0, "kslot 0: a return without its entry"));
        }
        assert_eq!(printed.len(), BURST as usize);
        assert_eq!(printed[0], "irdma_process_ceq: a return without its entry");
        let next = l.admit(t0 + Duration::from_millis(1500), "interval 0: an end");
        assert_eq!(next.len(), 2, "{next:?}");
        assert!(
            next[0].starts_with(&format!("{} more", 1000 - BURST)),
            "{next:?}"
        );
        assert_eq!(next[1], "wakeup: an end");
        assert_eq!(l.finish(), None);
        assert_eq!(
            l.text("kslot 7: x"),
            "kslot 7: x",
            "unknown slots stay numbered"
        );
    }
}

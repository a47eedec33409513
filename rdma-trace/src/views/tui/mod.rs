//! The live view: a ratatui screen when stdout is a terminal, text histograms each interval
//! otherwise (or with `--no-tui`). [`Live::watch`] drives it from the one sampling loop
//! (`crate::model::window::Waiter`): a refresh tick, keys, the traced command's exit, the duration, and
//! the process's one signal stream (`crate::signals`: SIGINT, SIGTERM, SIGHUP).
//!
//! The terminal is restored when [`Live`] drops (every return path, SIGTERM included), and by
//! ratatui's panic hook after a panic. In raw mode Ctrl-C arrives as a key and ends the run as
//! SIGINT would.

pub mod app;
pub mod draw;

use std::{
    io::{IsTerminal as _, Write as _},
    sync::{
        Arc,
        atomic::{AtomicU32, Ordering},
    },
    time::Duration,
};

use anyhow::{Context as _, Result};
use tokio::{process::Child, sync::mpsc, time::MissedTickBehavior};

pub use self::app::{App, Key};

use crate::model::{
    sample::Source,
    window::{End, Waiter, Wake, Window},
};
use crate::stoppable::StoppableThread;

/// Default refresh of the screen (4 Hz) and of the text view.
pub const TUI_INTERVAL: Duration = Duration::from_millis(250);
pub const TEXT_INTERVAL: Duration = Duration::from_secs(1);

/// Where the view goes.
pub enum Output {
    Screen(Screen),
    /// Text blocks each interval, to stdout or (when stdout carries JSON) stderr.
    Text {
        stderr: bool,
    },
    /// Nothing until the end.
    Quiet,
}

pub struct Live {
    pub app: App,
    out: Output,
    interval: Duration,
}

impl Live {
    /// `screen`: try the ratatui screen (falls back to text if the terminal cannot be set up).
    pub fn new(
        title: &str,
        screen: bool,
        interval: Option<Duration>,
        text_to_stderr: bool,
    ) -> Self {
        let out = if screen && std::io::stdout().is_terminal() {
            match Screen::enter() {
                Ok(s) => Output::Screen(s),
                Err(e) => {
                    eprintln!("rdma-trace: no live view ({e:#}); printing text instead");
                    Output::Text {
                        stderr: text_to_stderr,
                    }
                }
            }
        } else {
            Output::Text {
                stderr: text_to_stderr,
            }
        };
        let interval = interval.unwrap_or(match out {
            Output::Screen(_) => TUI_INTERVAL,
            _ => TEXT_INTERVAL,
        });
        Self {
            app: App::new(title),
            out,
            interval,
        }
    }

    /// No per-interval output at all (tests).
    #[cfg(test)]
    pub fn quiet(title: &str) -> Self {
        Self {
            app: App::new(title),
            out: Output::Quiet,
            interval: TEXT_INTERVAL,
        }
    }

    pub fn is_screen(&self) -> bool {
        matches!(self.out, Output::Screen(_))
    }

    /// Refresh until `duration` passes, `child` exits, the user quits (`q`, window ended by
    /// `quit`), or a stop signal (SIGINT, SIGTERM, SIGHUP). A child still running at the end is killed and reaped.
    pub async fn watch(
        &mut self,
        src: &mut dyn Source,
        duration: Option<Duration>,
        child: Option<&mut Child>,
    ) -> Result<Window> {
        let mut waiter =
            Waiter::new(duration, child).every(self.interval, MissedTickBehavior::Skip);
        let end = loop {
            // A closed keyboard (stdin gone, no /dev/tty) sends no key: the rest still ends the
            // window.
            let key = async {
                match &mut self.out {
                    Output::Screen(s) => match s.keys.recv().await {
                        Some(k) => k,
                        None => std::future::pending().await,
                    },
                    _ => std::future::pending().await,
                }
            };
            match waiter.next(key).await? {
                Wake::End(end) => break end,
                Wake::Tick => {
                    // The screen refreshes 4 times a second: its waterfall, about once.
                    let s = if self.is_screen() {
                        src.sample_quick(waiter.elapsed())?
                    } else {
                        src.sample(waiter.elapsed())?
                    };
                    self.app.update(s);
                    self.render()?;
                    // As BCC's tools do, each text block counts its own interval: the next one
                    // starts from here (the report's counts start at the window's start).
                    if matches!(self.out, Output::Text { .. }) {
                        src.reset()?;
                    }
                    if let Some(why) = src.finished() {
                        break End::Caller(why);
                    }
                }
                Wake::Event(k) => {
                    self.app.key(k);
                    match self.app.quit() {
                        Some(Key::Quit) => break End::Caller("quit"),
                        Some(_) => break End::Caller("interrupted"),
                        None => {}
                    }
                    if self.app.take_reset() {
                        src.reset()?;
                        let s = src.sample(waiter.elapsed())?;
                        self.app.update(s);
                    }
                    self.render()?;
                }
            }
        };
        waiter.stop_child(end).await;
        // A last refresh so the screen shows the final counts.
        if let Ok(s) = src.sample(waiter.elapsed()) {
            self.app.update(s);
        }
        Ok(waiter.window(end))
    }

    /// After the last window, on the screen: show `status` and wait for `q` (or a stop
    /// signal). Returns whether the user interrupted. Without a screen, returns at once.
    pub async fn linger(&mut self, status: &str) -> Result<bool> {
        if !self.is_screen() || self.app.quit().is_some() {
            return Ok(false);
        }
        self.app.status = Some(format!("{status} — q to quit"));
        self.render()?;
        // Neither a duration nor a command: only a key or a stop signal ends this wait.
        let mut waiter = Waiter::new(None, None);
        loop {
            let Output::Screen(s) = &mut self.out else {
                return Ok(false);
            };
            match waiter.next(s.keys.recv()).await? {
                // No keyboard (stdin closed, no /dev/tty): nothing to wait for.
                Wake::Event(None) => return Ok(false),
                Wake::Event(Some(k)) => {
                    self.app.key(k);
                    match self.app.quit() {
                        Some(Key::Quit) => return Ok(false),
                        Some(_) => return Ok(true),
                        None => {}
                    }
                    self.render()?;
                }
                Wake::End(_) => return Ok(true),
                Wake::Tick => {}
            }
        }
    }

    fn render(&mut self) -> Result<()> {
        match &mut self.out {
            Output::Screen(s) => {
                let size = s.resized.swap(0, Ordering::Relaxed);
                if size != 0 {
                    let area = ratatui::layout::Rect::new(0, 0, (size >> 16) as u16, size as u16);
                    s.terminal.resize(area).context("resizing the live view")?;
                }
                s.terminal
                    .draw(|f| draw::draw(f, &self.app))
                    .context("drawing the live view")?;
            }
            Output::Text { stderr } => {
                let text = text_block(&self.app, self.interval);
                if *stderr {
                    eprint!("{text}");
                } else {
                    let mut out = std::io::stdout().lock();
                    let _ = out.write_all(text.as_bytes());
                    let _ = out.flush();
                }
            }
            Output::Quiet => {}
        }
        Ok(())
    }

    /// Leave the screen (also done on drop), so reports print on the normal terminal.
    pub fn close(&mut self) {
        if matches!(self.out, Output::Screen(_)) {
            self.out = Output::Quiet;
        }
    }
}

/// The text view of one refresh: progress, then one line per attached probe that counted in
/// the last `interval`, with a sparkline of its log2 histogram.
pub fn text_block(app: &App, interval: Duration) -> String {
    let p = &app.progress;
    let mut out = format!(
        "[{} {:.1} s, the last {:.1} s",
        p.label,
        p.elapsed.as_secs_f64(),
        interval.as_secs_f64()
    );
    if let (Some(d), Some(t)) = (p.done, p.total) {
        out.push_str(&format!(", ~{d}/{t} iterations"));
    }
    out.push_str("]\n");
    if let Some(b) = app.stall_banner() {
        out.push_str(&format!("  {b}\n"));
    }
    for r in app
        .probes
        .iter()
        .filter(|r| r.skipped.is_none() && r.count > 0)
    {
        out.push_str(&format!(
            "  {:<24} {:>9} {:>9.1}/s p50 {:>8} p99 {:>8}  {}\n",
            r.name,
            r.count,
            r.rate,
            draw::value(r.unit, r.summary.p50),
            draw::value(r.unit, r.summary.p99),
            sparkline(r),
        ));
    }
    if let Some(w) = app.waterfall.as_ref().filter(|w| w.events > 0) {
        let stages: Vec<String> = w
            .stages
            .iter()
            .map(|(n, p50, p99)| {
                format!(
                    "{n} {}/{}",
                    crate::bpf::hist::human_ns_f(*p50),
                    crate::bpf::hist::human_ns_f(*p99)
                )
            })
            .collect();
        out.push_str(&format!(
            "  waterfall: {} events ({} woken), p50/p99 {}\n",
            w.events,
            w.woken,
            stages.join(", ")
        ));
    }
    if let Some(o) = &app.overhead {
        out.push_str(&format!(
            "  overhead: eBPF {:.2} % CPU, loader {:.1} % CPU, RSS {} KiB\n",
            o.bpf_cpu_percent, o.loader_cpu_percent, o.loader_peak_rss_kib
        ));
        if let Some(a) = &o.tracing_adds {
            out.push_str(&format!("  {}\n", a.render()));
        }
    }
    out
}

/// `▁▃█▂` over the log2 rows, with the first row's lower bound.
fn sparkline(r: &crate::model::report::ProbeReport) -> String {
    const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    let max = r.log2.iter().map(|b| b.count).max().unwrap_or(0);
    if max == 0 {
        return String::new();
    }
    let bars: String = r
        .log2
        .iter()
        .map(|b| {
            if b.count == 0 {
                ' '
            } else {
                BARS[((b.count * 7).div_ceil(max)) as usize]
            }
        })
        .collect();
    let lo = r.log2.first().map_or(0, |b| b.lo);
    let lo = match r.unit {
        crate::kernel::probes::Unit::Nanoseconds => crate::bpf::hist::human_ns(lo),
        crate::kernel::probes::Unit::Packets => lo.to_string(),
    };
    format!("{lo} {bars}")
}

/// How long the key reader waits for a key before it looks at its stop flag: the longest a
/// closing screen waits for it, and 5 wake-ups a second of an idle reader.
const KEY_POLL: Duration = Duration::from_millis(200);

/// The ratatui terminal in raw mode on the alternate screen, and a thread reading keys.
///
/// The viewport is fixed at the terminal's size and follows the terminal's resize events: a
/// full-screen viewport asks the terminal for its size at every frame, which crossterm does by
/// opening and closing `/dev/tty`.
pub struct Screen {
    terminal: ratatui::DefaultTerminal,
    keys: mpsc::UnboundedReceiver<Key>,
    /// The terminal's size from its last resize event (width << 16 | height), 0 for none.
    resized: Arc<AtomicU32>,
    /// Stopped before the terminal is restored.
    reader: Option<StoppableThread>,
}

impl Screen {
    fn enter() -> Result<Self> {
        let (w, h) = crossterm::terminal::size().context("reading the terminal's size")?;
        // try_init_with_options: raw mode, alternate screen, and a panic hook that restores the
        // terminal.
        let mut terminal = ratatui::try_init_with_options(ratatui::TerminalOptions {
            viewport: ratatui::Viewport::Fixed(ratatui::layout::Rect::new(0, 0, w, h)),
        })
        .context("setting up the terminal")?;
        // What was printed since the screen was entered goes: the first frame draws only the
        // cells it changes.
        terminal.clear().context("clearing the terminal")?;
        let (tx, keys) = mpsc::unbounded_channel();
        let resized = Arc::new(AtomicU32::new(0));
        let size = resized.clone();
        let reader = StoppableThread::spawn("keys", move |stop| {
            use crossterm::event::{Event, poll, read};
            while !stop.load(Ordering::Relaxed) {
                match poll(KEY_POLL) {
                    Ok(true) => match read() {
                        Ok(Event::Key(k)) => {
                            if let Some(k) = Key::from_event(&k)
                                && tx.send(k).is_err()
                            {
                                break;
                            }
                        }
                        Ok(Event::Resize(w, h)) => {
                            size.store(u32::from(w) << 16 | u32::from(h), Ordering::Relaxed);
                            // Wakes the view, which redraws at the new size.
                            if tx.send(Key::Resize).is_err() {
                                break;
                            }
                        }
                        Ok(_) => {}
                        Err(_) => break,
                    },
                    Ok(false) => {}
                    Err(_) => break, // no keyboard: the sender drops, recv() says None
                }
            }
        })
        .context("starting the key reader")?;
        Ok(Self {
            terminal,
            keys,
            resized,
            reader: Some(reader),
        })
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        drop(self.reader.take());
        let _ = self.terminal.show_cursor();
        ratatui::restore();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::sample::Sample;
    use crate::views::tui::app::tests::sample;

    #[test]
    fn text_view_lists_counting_probes_with_sparklines() {
        let mut app = App::new("t");
        app.update(sample(&[
            ("rxe_rcv", 400, false),
            ("idle", 0, false),
            ("gone", 0, true),
        ]));
        let t = text_block(&app, Duration::from_secs(1));
        assert!(
            t.starts_with("[event mode 2.0 s, the last 1.0 s, ~250/1000 iterations]"),
            "{t}"
        );
        assert!(t.contains("rxe_rcv") && t.contains("400"), "{t}");
        assert!(!t.contains("idle") && !t.contains("gone"), "{t}");
        assert!(t.contains("1us █▄"), "{t}");
        assert!(
            t.contains("waterfall: 400 events (200 woken), p50/p99 handler → wake-up 2.0us/8.0us"),
            "{t}"
        );
    }

    #[test]
    fn text_view_says_a_stall_under_its_header() {
        let mut app = App::new("t");
        app.update(crate::views::tui::app::tests::stalled_sample());
        let t = text_block(&app, Duration::from_secs(1));
        let second = t.lines().nth(1).unwrap_or_default();
        assert_eq!(
            second,
            "  STALL pid 42 (demo) tid 43 blocked 2.5 s: the CQ was not armed again"
        );
        app.update(sample(&[("rxe_rcv", 4, false)]));
        assert!(!text_block(&app, Duration::from_secs(1)).contains("STALL"));
    }

    struct Counter(u64, u64);
    impl Source for Counter {
        fn sample(&mut self, elapsed: Duration) -> Result<Sample> {
            self.0 += 1;
            let mut s = sample(&[("n", self.0, false)]);
            s.progress.elapsed = elapsed;
            Ok(s)
        }
        fn sample_quick(&mut self, _: Duration) -> Result<Sample> {
            panic!("only a screen's refreshes may keep the waterfall of an earlier one");
        }
        fn reset(&mut self) -> Result<()> {
            self.1 += 1;
            Ok(())
        }
    }

    #[tokio::test]
    async fn watch_refreshes_until_the_duration() {
        let mut live = Live::quiet("t");
        live.interval = Duration::from_millis(20);
        let mut src = Counter(0, 0);
        let w = live
            .watch(&mut src, Some(Duration::from_millis(300)), None)
            .await
            .unwrap();
        assert_eq!(w.ended_by, "duration");
        assert!(w.seconds >= 0.3, "{}", w.seconds);
        // Ticks at 0, 20, 40, ... ms (some may be skipped on a busy machine), and a final one.
        assert!(src.0 >= 3, "{} refreshes", src.0);
        assert_eq!(
            live.app.probes[0].count, src.0,
            "the app shows the last sample"
        );
        assert_eq!(src.1, 0, "no reset without the key");
    }
}

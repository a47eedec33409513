//! State of the live view, free of any terminal: what is shown, which probe is selected,
//! paused or not. Keys come in as [`Key`]s; the drawing code (`draw.rs`) only reads this.

use std::{
    borrow::Cow,
    collections::{HashMap, VecDeque},
    time::Duration,
};

use crate::{
    model::{
        overhead::Overhead,
        report::ProbeReport,
        sample::{Progress, Sample},
    },
    waterfall::WaterfallView,
};

/// What a key press asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Key {
    Quit,
    /// Ctrl-C in raw mode: like SIGINT.
    Interrupt,
    Next,
    Prev,
    Pause,
    Reset,
    /// The terminal changed size (not a key: it only makes the view redraw).
    Resize,
}

impl Key {
    /// The keys of the live view: q/Esc, Ctrl-C, Tab/↓/→/j, Shift-Tab/↑/←/k, p/Space, r.
    pub fn from_event(ev: &crossterm::event::KeyEvent) -> Option<Key> {
        use crossterm::event::{KeyCode, KeyEventKind, KeyModifiers};
        if ev.kind == KeyEventKind::Release {
            return None;
        }
        if ev.modifiers.contains(KeyModifiers::CONTROL) {
            return matches!(ev.code, KeyCode::Char('c')).then_some(Key::Interrupt);
        }
        Some(match ev.code {
            KeyCode::Char('q') | KeyCode::Esc => Key::Quit,
            KeyCode::Tab | KeyCode::Down | KeyCode::Right | KeyCode::Char('j') => Key::Next,
            KeyCode::BackTab | KeyCode::Up | KeyCode::Left | KeyCode::Char('k') => Key::Prev,
            KeyCode::Char('p') | KeyCode::Char(' ') => Key::Pause,
            KeyCode::Char('r') => Key::Reset,
            _ => return None,
        })
    }
}

/// Columns of history the heat map keeps.
pub const HEAT_COLUMNS: usize = 120;
/// The time one heat map column covers: the refreshes within it add to the newest column, so
/// the map scrolls once a second whatever the refresh rate (every scroll redraws all its cells).
pub const HEAT_COLUMN: Duration = Duration::from_secs(1);

/// Per probe: the last cumulative counts per power of two, and per second what was added.
#[derive(Clone, Debug)]
pub struct Heat {
    last: [u64; 65],
    /// Oldest first; each column: counts per power-of-two row (row k = [2^(k-1), 2^k), row 0
    /// = [0, 1)).
    pub columns: VecDeque<[u64; 65]>,
    /// When (the window's elapsed time) the newest column started.
    column_at: Option<Duration>,
}

impl Default for Heat {
    fn default() -> Self {
        Heat {
            last: [0; 65],
            columns: VecDeque::new(),
            column_at: None,
        }
    }
}

impl Heat {
    /// Row of a bucket's lower bound `lo` (a power of two, or 0).
    pub fn row(lo: u64) -> usize {
        if lo == 0 {
            0
        } else {
            (64 - lo.leading_zeros()) as usize
        }
    }

    /// Lower bound of row `k`.
    pub fn row_lo(k: usize) -> u64 {
        if k == 0 { 0 } else { 1u64 << (k - 1) }
    }

    /// What `r` added since the last refresh, `at` into the window: into the newest column, or
    /// a new one when that is [`HEAT_COLUMN`] old (or the window started over).
    fn push(&mut self, r: &ProbeReport, at: Duration) {
        let mut now = [0u64; 65];
        for b in &r.log2 {
            now[Self::row(b.lo).min(64)] += b.count;
        }
        let mut col = [0u64; 65];
        // After a reset the counts restart: what is there now is new.
        let restarted = now.iter().sum::<u64>() < self.last.iter().sum::<u64>();
        for k in 0..65 {
            col[k] = if restarted {
                now[k]
            } else {
                now[k].saturating_sub(self.last[k])
            };
        }
        self.last = now;
        let newest = match (self.column_at, self.columns.back_mut()) {
            (Some(t0), Some(last)) if at >= t0 && at - t0 < HEAT_COLUMN => Some(last),
            _ => None,
        };
        match newest {
            Some(last) => last.iter_mut().zip(col).for_each(|(l, c)| *l += c),
            None => {
                self.columns.push_back(col);
                self.column_at = Some(at);
            }
        }
        while self.columns.len() > HEAT_COLUMNS {
            self.columns.pop_front();
        }
    }
}

pub struct App {
    pub title: String,
    pub probes: Vec<ProbeReport>,
    pub overhead: Option<Overhead>,
    pub progress: Progress,
    pub waterfall: Option<WaterfallView>,
    /// Latency over time per probe (by name), for the heat map.
    pub heat: HashMap<Cow<'static, str>, Heat>,
    pub paused: bool,
    /// A line for the status bar (`demo finished — q to quit`).
    pub status: Option<String>,
    /// Name of the selected probe (kept across refreshes).
    selected: Option<Cow<'static, str>>,
    quit: Option<Key>,
    reset: bool,
}

impl App {
    pub fn new(title: impl Into<String>) -> Self {
        Self {
            title: title.into(),
            probes: Vec::new(),
            overhead: None,
            progress: Progress::default(),
            waterfall: None,
            heat: HashMap::new(),
            paused: false,
            status: None,
            selected: None,
            quit: None,
            reset: false,
        }
    }

    /// The stall doctor's banner: the first thread stalled now, and its broken link.
    pub fn stall_banner(&self) -> Option<String> {
        crate::waterfall::stall::banner(&self.waterfall.as_ref()?.stalls)
    }

    /// New data. While paused the probes and the overhead stay frozen; progress moves on.
    pub fn update(&mut self, s: Sample) {
        self.progress = s.progress;
        if self.paused {
            return;
        }
        for r in s.probes.iter().filter(|r| r.skipped.is_none()) {
            self.heat
                .entry(r.name.clone())
                .or_default()
                .push(r, self.progress.elapsed);
        }
        self.probes = s.probes;
        self.overhead = s.overhead;
        self.waterfall = s.waterfall;
        if self.selected_index().is_none() {
            self.selected = self
                .selectable()
                .first()
                .map(|&i| self.probes[i].name.clone());
        }
    }

    pub fn key(&mut self, k: Key) {
        match k {
            Key::Quit | Key::Interrupt => self.quit = Some(k),
            Key::Next => self.step(1),
            Key::Prev => self.step(-1),
            Key::Pause => self.paused = !self.paused,
            Key::Reset => self.reset = true,
            Key::Resize => {}
        }
    }

    /// `Some(Quit)` or `Some(Interrupt)` once the user asked to leave.
    pub fn quit(&self) -> Option<Key> {
        self.quit
    }

    /// Whether a reset was asked for since the last call (the caller takes a new baseline).
    pub fn take_reset(&mut self) -> bool {
        std::mem::take(&mut self.reset)
    }

    /// Indexes of the probes that can be selected: the attached ones.
    pub fn selectable(&self) -> Vec<usize> {
        (0..self.probes.len())
            .filter(|&i| self.probes[i].skipped.is_none())
            .collect()
    }

    pub fn selected_index(&self) -> Option<usize> {
        let name = self.selected.as_ref()?;
        self.probes
            .iter()
            .position(|p| p.name == *name && p.skipped.is_none())
    }

    pub fn selected_probe(&self) -> Option<&ProbeReport> {
        self.selected_index().map(|i| &self.probes[i])
    }

    /// The selected probe's heat map history.
    pub fn selected_heat(&self) -> Option<&Heat> {
        self.heat.get(&self.selected_probe()?.name)
    }

    fn step(&mut self, by: isize) {
        let sel = self.selectable();
        if sel.is_empty() {
            return;
        }
        let pos = self
            .selected_index()
            .and_then(|i| sel.iter().position(|&j| j == i))
            .unwrap_or(0) as isize;
        let n = sel.len() as isize;
        let next = sel[((pos + by).rem_euclid(n)) as usize];
        self.selected = Some(self.probes[next].name.clone());
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::{
        bpf::hist::{Bucket, Summary},
        kernel::probes::{Driver, Unit},
    };

    pub fn report(name: &'static str, count: u64, skipped: bool) -> ProbeReport {
        ProbeReport {
            name: name.into(),
            what: "test probe",
            driver: Driver::Network,
            unit: Unit::Nanoseconds,
            attach: (!skipped).then_some("raw_tp"),
            skipped: skipped.then(|| "not here".to_owned()),
            skip_kind: skipped.then_some("no_device"),
            count,
            rate: count as f64 / 2.0,
            unmatched: 0,
            summary: Summary {
                count,
                p50: (count > 0).then_some(1_500.0),
                p90: (count > 0).then_some(3_000.0),
                p99: (count > 0).then_some(9_000.0),
                max: (count > 0).then_some(16_384),
            },
            total: count as f64 * 2_000.0,
            log2: if count > 0 {
                vec![
                    Bucket {
                        lo: 1024,
                        hi: 2048,
                        count: count - count / 4,
                    },
                    Bucket {
                        lo: 2048,
                        hi: 4096,
                        count: count / 4,
                    },
                ]
            } else {
                Vec::new()
            },
            note: None,
            shared_hooks: Vec::new(),
        }
    }

    pub fn sample(counts: &[(&'static str, u64, bool)]) -> Sample {
        Sample {
            probes: counts.iter().map(|&(n, c, s)| report(n, c, s)).collect(),
            overhead: None,
            progress: Progress {
                label: "event mode".into(),
                elapsed: Duration::from_secs(2),
                done: Some(250),
                total: Some(1000),
                done_from: Some("rxe_cq_post / 4"),
            },
            waterfall: Some(WaterfallView {
                events: 400,
                woken: 200,
                awake: 200,
                stages: vec![
                    ("handler → wake-up", 2_000.0, 8_000.0),
                    ("run queue", 30_000.0, 200_000.0),
                    ("on CPU → read", 10_000.0, 40_000.0),
                ],
                total_mean_ns: Some(45_000.0),
                stalls: Vec::new(),
            }),
        }
    }

    /// `sample` with one thread stalled: the program did not re-arm its CQ.
    pub fn stalled_sample() -> Sample {
        let mut s = sample(&[("rxe_rcv", 4, false)]);
        let stall = crate::waterfall::stall::Stall {
            pid: 42,
            tid: 43,
            comm: "demo".into(),
            channel: "0xe0".into(),
            cq: Some("0xc0".into()),
            cq_id: Some(3),
            blocked_s: 2.5,
            links: Vec::new(),
            posts_since_arm: Some(2),
            queued_unread: Some(0),
            unpolled_at_wait: Some(0),
            broken: "armed",
            diagnosis: "the CQ was not armed again".into(),
        };
        if let Some(w) = s.waterfall.as_mut() {
            w.stalls = vec![stall];
        }
        s
    }

    /// `sample` taken `ms` into the window.
    fn sample_at(counts: &[(&'static str, u64, bool)], ms: u64) -> Sample {
        let mut s = sample(counts);
        s.progress.elapsed = Duration::from_millis(ms);
        s
    }

    #[test]
    fn heat_map_columns_hold_what_each_second_added() {
        let mut app = App::new("t");
        app.update(sample_at(&[("a", 100, false)], 0));
        app.update(sample_at(&[("a", 180, false)], 1000));
        let h = app.heat.get("a").unwrap();
        assert_eq!(h.columns.len(), 2);
        // report(): 3/4 of the count in [1024, 2048), 1/4 in [2048, 4096).
        assert_eq!(h.columns[0][Heat::row(1024)], 75);
        assert_eq!(h.columns[1][Heat::row(1024)], 135 - 75);
        assert_eq!(h.columns[1][Heat::row(2048)], 45 - 25);
        assert_eq!(Heat::row_lo(Heat::row(2048)), 2048);
        // Refreshes within the second add to its column.
        app.update(sample_at(&[("a", 260, false)], 1250));
        app.update(sample_at(&[("a", 340, false)], 1999));
        let h = &app.heat["a"];
        assert_eq!(h.columns.len(), 2);
        assert_eq!(h.columns[1][Heat::row(1024)], 255 - 75);
        // A reset (counts drop) starts over instead of going negative.
        app.update(sample_at(&[("a", 4, false)], 2000));
        assert_eq!(app.heat["a"].columns[2][Heat::row(1024)], 3);
        // A new window (its time starts again) starts a column.
        app.update(sample_at(&[("a", 8, false)], 100));
        assert_eq!(app.heat["a"].columns.len(), 4);
        for i in 0..HEAT_COLUMNS as u64 + 5 {
            app.update(sample_at(&[("a", 4, false)], 3000 + 1000 * i));
        }
        assert_eq!(app.heat["a"].columns.len(), HEAT_COLUMNS);
        assert!(app.selected_heat().is_some());
    }

    #[test]
    fn selection_skips_skipped_probes_and_wraps() {
        let mut app = App::new("t");
        app.update(sample(&[("a", 1, false), ("b", 0, true), ("c", 5, false)]));
        assert_eq!(app.selected_probe().unwrap().name, "a");
        app.key(Key::Next);
        assert_eq!(app.selected_probe().unwrap().name, "c", "b is skipped");
        app.key(Key::Next);
        assert_eq!(app.selected_probe().unwrap().name, "a", "wraps");
        app.key(Key::Prev);
        assert_eq!(app.selected_probe().unwrap().name, "c");
        // The selection follows the name when the data refreshes.
        app.update(sample(&[("c", 9, false), ("a", 1, false)]));
        assert_eq!(app.selected_probe().unwrap().count, 9);
    }

    #[test]
    fn pause_freezes_probes_but_not_progress() {
        let mut app = App::new("t");
        app.update(sample(&[("a", 1, false)]));
        app.key(Key::Pause);
        assert!(app.paused);
        let mut s = sample(&[("a", 100, false)]);
        s.progress.elapsed = Duration::from_secs(7);
        app.update(s);
        assert_eq!(app.probes[0].count, 1, "frozen while paused");
        assert_eq!(app.progress.elapsed, Duration::from_secs(7));
        app.key(Key::Pause);
        app.update(sample(&[("a", 100, false)]));
        assert_eq!(app.probes[0].count, 100);
    }

    #[test]
    fn reset_and_quit_are_requests() {
        let mut app = App::new("t");
        assert!(!app.take_reset());
        app.key(Key::Reset);
        assert!(app.take_reset());
        assert!(!app.take_reset(), "taken once");
        assert_eq!(app.quit(), None);
        app.key(Key::Quit);
        assert_eq!(app.quit(), Some(Key::Quit));
    }

    #[test]
    fn keys_map_from_crossterm() {
        use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
        let k = |c, m| Key::from_event(&KeyEvent::new(c, m));
        assert_eq!(k(KeyCode::Char('q'), KeyModifiers::NONE), Some(Key::Quit));
        assert_eq!(
            k(KeyCode::Char('c'), KeyModifiers::CONTROL),
            Some(Key::Interrupt)
        );
        assert_eq!(k(KeyCode::Tab, KeyModifiers::NONE), Some(Key::Next));
        assert_eq!(k(KeyCode::BackTab, KeyModifiers::SHIFT), Some(Key::Prev));
        assert_eq!(k(KeyCode::Up, KeyModifiers::NONE), Some(Key::Prev));
        assert_eq!(k(KeyCode::Char('p'), KeyModifiers::NONE), Some(Key::Pause));
        assert_eq!(k(KeyCode::Char('r'), KeyModifiers::NONE), Some(Key::Reset));
        assert_eq!(k(KeyCode::Char('x'), KeyModifiers::NONE), None);
    }

    #[test]
    fn progress_ratio() {
        let p = sample(&[]).progress;
        assert_eq!(p.ratio(), Some(0.25));
        assert_eq!(Progress::default().ratio(), None);
    }
}

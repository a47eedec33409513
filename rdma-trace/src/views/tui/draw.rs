//! Drawing the live view from an [`App`]: a header with the load's progress, the probe table
//! (count, rate, p50, p99; the selected probe highlighted) with the selected probe's latency
//! heat map under it, the selected probe's pane with its histogram, the completion waterfall
//! (stages stacked at p50 and p99), and the self-overhead line. Pure: tested with ratatui's
//! `TestBackend`.

use ratatui::{
    Frame,
    layout::{Constraint, Layout, Rect},
    style::{Color, Modifier, Style},
    text::{Line, Span},
    widgets::{Block, Gauge, Paragraph, Row, Table, TableState},
};

use super::app::{App, Heat};
use crate::waterfall::WaterfallView;
use crate::{
    bpf::hist::{human_ns_f, plain, pow2_label},
    kernel::probes::Unit,
    model::report::ProbeReport,
};

/// A value in the probe's unit (`-` when absent).
pub fn value(unit: Unit, v: Option<f64>) -> String {
    match (unit, v) {
        (_, None) => "-".to_owned(),
        (Unit::Nanoseconds, Some(v)) => human_ns_f(v),
        (Unit::Packets, Some(v)) => format!("{v:.0}"),
    }
}

pub fn draw(f: &mut Frame, app: &App) {
    let banner = app.stall_banner();
    let [header, stall, body, footer] = Layout::vertical([
        Constraint::Length(3),
        Constraint::Length(u16::from(banner.is_some())),
        Constraint::Min(6),
        Constraint::Length(2),
    ])
    .areas(f.area());
    draw_header(f, header, app);
    if let Some(b) = banner {
        f.render_widget(
            Paragraph::new(b).style(
                Style::default()
                    .fg(Color::White)
                    .bg(Color::Red)
                    .add_modifier(Modifier::BOLD),
            ),
            stall,
        );
    }
    let [left, right] =
        Layout::horizontal([Constraint::Percentage(50), Constraint::Percentage(50)]).areas(body);
    // The table takes what its rows need (the attached probes, and one line for the skipped
    // ones); the heat map the space under it, at least HEAT_MIN rows (the table scrolls then).
    let attached = app.selectable().len();
    let skipped_line = u16::from(attached < app.probes.len());
    let [list, heat] = Layout::vertical([
        Constraint::Max(attached as u16 + skipped_line + 3),
        Constraint::Min(HEAT_MIN),
    ])
    .areas(left);
    draw_table(f, list, app);
    if heat.height >= 4 {
        draw_heat(f, heat, app);
    }
    match &app.waterfall {
        Some(w) => {
            let [pane, wf] =
                Layout::vertical([Constraint::Min(6), Constraint::Length(8)]).areas(right);
            draw_pane(f, pane, app);
            draw_waterfall(f, wf, w);
        }
        None => draw_pane(f, right, app),
    }
    draw_footer(f, footer, app);
}

fn draw_header(f: &mut Frame, area: Rect, app: &App) {
    let p = &app.progress;
    let mut title = format!(
        " {} — {} — {:.1} s ",
        app.title,
        p.label,
        p.elapsed.as_secs_f64()
    );
    if app.paused {
        title.push_str("[PAUSED] ");
    }
    let block = Block::bordered().title(title);
    let label = match (p.done, p.total) {
        (Some(d), Some(t)) => format!(
            "{d} / {t} iterations{}",
            p.done_from.map(|w| format!(" (≈ {w})")).unwrap_or_default()
        ),
        (None, Some(t)) => format!("{t} iterations requested"),
        _ => format!("{:.1} s", p.elapsed.as_secs_f64()),
    };
    let gauge = Gauge::default()
        .block(block)
        .gauge_style(Style::default().fg(Color::Green))
        .ratio(p.ratio().unwrap_or(0.0))
        .label(label);
    f.render_widget(gauge, area);
}

/// Rows the heat map keeps under the probe table when the screen is short.
const HEAT_MIN: u16 = 8;

fn draw_table(f: &mut Frame, area: Rect, app: &App) {
    let header = Row::new(["probe", "count", "rate/s", "p50", "p99"])
        .style(Style::default().add_modifier(Modifier::BOLD));
    // Attached probes, then one line for those skipped here (the start-up table and the report
    // say why for each): on a machine with one RDMA driver, the other drivers' rows would fill
    // the table.
    let attached = app.selectable();
    let skipped = app.probes.len() - attached.len();
    let mut rows: Vec<Row> = attached
        .iter()
        .map(|&i| {
            let r = &app.probes[i];
            Row::new([
                r.name.to_string(),
                r.count.to_string(),
                format!("{:.0}", r.rate),
                value(r.unit, r.summary.p50),
                value(r.unit, r.summary.p99),
            ])
        })
        .collect();
    if skipped > 0 {
        rows.push(
            Row::new([format!("+ {skipped} skipped (see report)")])
                .style(Style::default().fg(Color::DarkGray)),
        );
    }
    let table = Table::new(
        rows,
        [
            Constraint::Min(16),
            Constraint::Length(9),
            Constraint::Length(8),
            Constraint::Length(8),
            Constraint::Length(8),
        ],
    )
    .header(header)
    .block(Block::bordered().title(" probes (Tab/↑↓) "))
    .row_highlight_style(Style::default().add_modifier(Modifier::REVERSED));
    // The selected probe's row among the attached ones.
    let selected = app
        .selected_index()
        .and_then(|i| attached.iter().position(|&a| a == i));
    let mut state = TableState::default().with_selected(selected);
    f.render_stateful_widget(table, area, &mut state);
}

/// Histogram rows as text lines with bars scaled to `width`.
pub fn histogram_lines(r: &ProbeReport, width: usize) -> Vec<Line<'static>> {
    let fmt: fn(u64) -> String = match r.unit {
        Unit::Nanoseconds => pow2_label,
        Unit::Packets => plain,
    };
    let max = r.log2.iter().map(|b| b.count).max().unwrap_or(0);
    r.log2
        .iter()
        .map(|b| {
            let bar = if max == 0 {
                0
            } else {
                (b.count as u128 * width as u128).div_ceil(max as u128) as usize
            };
            Line::from(vec![
                Span::raw(format!(
                    "{:<18} {:>8} ",
                    format!("[{}, {})", fmt(b.lo), fmt(b.hi)),
                    b.count
                )),
                Span::styled("█".repeat(bar), Style::default().fg(Color::Cyan)),
            ])
        })
        .collect()
}

fn draw_pane(f: &mut Frame, area: Rect, app: &App) {
    let Some(r) = app.selected_probe() else {
        f.render_widget(
            Paragraph::new("no probe attached").block(Block::bordered()),
            area,
        );
        return;
    };
    let mut lines = vec![
        Line::from(r.what),
        Line::from(format!(
            "via {}  count {}  rate {:.1}/s  unmatched {}",
            r.attach.unwrap_or("-"),
            r.count,
            r.rate,
            r.unmatched
        )),
        Line::from(format!(
            "p50 {}  p90 {}  p99 {}  max {}",
            value(r.unit, r.summary.p50),
            value(r.unit, r.summary.p90),
            value(r.unit, r.summary.p99),
            value(r.unit, r.summary.max.map(|m| m as f64)),
        )),
        Line::from(""),
    ];
    if let Some(note) = r.note {
        lines.push(Line::styled(note, Style::default().fg(Color::Yellow)));
    }
    let bar_width = (area.width as usize).saturating_sub(2 + 28).max(1);
    lines.extend(histogram_lines(r, bar_width));
    f.render_widget(
        Paragraph::new(lines).block(Block::bordered().title(format!(" {} ", r.name))),
        area,
    );
}

/// Shades of a heat map cell, from a few to the most events of the visible window.
const SHADES: [(&str, Color); 4] = [
    ("░", Color::Blue),
    ("▒", Color::Cyan),
    ("▓", Color::Yellow),
    ("█", Color::Red),
];

/// Width of a heat map row's label (its bucket's lower bound) and the space after it.
const HEAT_LABEL: usize = 8;

/// One row of the heat map: its bucket's label, and per column (oldest first) 0 for no event
/// or 1..=4, the shade (`SHADES[n - 1]`).
pub struct HeatRow {
    pub label: String,
    pub shades: Vec<u8>,
}

/// Heat map rows: one per power-of-two row (slowest on top), one column per refresh (newest
/// on the right), the shade by count; `None` before the first event.
pub fn heat_rows(heat: &Heat, unit: Unit, width: usize, height: usize) -> Option<Vec<HeatRow>> {
    let cols = width.saturating_sub(HEAT_LABEL + 1).max(1);
    let skip = heat.columns.len().saturating_sub(cols);
    let shown = || heat.columns.iter().skip(skip);
    let used = |k: usize| shown().any(|c| c[k] != 0);
    let hi = (0..65).rev().find(|&k| used(k))?;
    let lo = (0..=hi).find(|&k| used(k))?;
    let lo = lo.max(hi.saturating_sub(height.saturating_sub(1)));
    let max = shown()
        .flat_map(|c| c[lo..=hi].iter())
        .copied()
        .max()
        .unwrap_or(0)
        .max(1);
    let fmt: fn(u64) -> String = match unit {
        Unit::Nanoseconds => pow2_label,
        Unit::Packets => plain,
    };
    Some(
        (lo..=hi)
            .rev()
            .map(|k| HeatRow {
                label: format!("{:>w$} ", fmt(Heat::row_lo(k)), w = HEAT_LABEL),
                shades: shown()
                    .map(|c| match c[k] {
                        0 => 0,
                        n => ((n * SHADES.len() as u64).div_ceil(max)).clamp(1, 4) as u8,
                    })
                    .collect(),
            })
            .collect(),
    )
}

/// The heat map of the selected probe, written cell by cell into the frame's buffer (a
/// Paragraph of one styled span per cell cost most of a refresh).
fn draw_heat(f: &mut Frame, area: Rect, app: &App) {
    let (Some(r), Some(heat)) = (app.selected_probe(), app.selected_heat()) else {
        return;
    };
    let block = Block::bordered().title(format!(
        " {} over time (rows: ≥ bucket; ░▒▓█ few → many; a column a second) ",
        r.name
    ));
    let inner = block.inner(area);
    f.render_widget(block, area);
    let buf = f.buffer_mut();
    let Some(rows) = heat_rows(heat, r.unit, inner.width as usize, inner.height as usize) else {
        buf.set_stringn(
            inner.x,
            inner.y,
            "no events yet",
            inner.width as usize,
            Style::default(),
        );
        return;
    };
    for (row, y) in rows.iter().zip(inner.y..inner.bottom()) {
        let (x, _) = buf.set_stringn(
            inner.x,
            y,
            &row.label,
            inner.width as usize,
            Style::default(),
        );
        for (&shade, x) in row.shades.iter().zip(x..inner.right()) {
            if shade > 0 {
                let (ch, color) = SHADES[usize::from(shade) - 1];
                buf[(x, y)].set_symbol(ch).set_fg(color);
            }
        }
    }
}

/// Glyph and colour of each stage (distinct glyphs, so the bars read without colour too).
const STAGE_STYLE: [(&str, Color); 4] = [
    ("█", Color::Green),
    ("▓", Color::Yellow),
    ("▒", Color::Magenta),
    ("░", Color::Cyan),
];

/// Waterfall pane lines: a bar per percentile, stage segments stacked left to right and
/// scaled to the p99 total, then a legend.
pub fn waterfall_lines(w: &WaterfallView, width: usize) -> Vec<Line<'static>> {
    let mut lines = vec![Line::from(format!(
        "{} events ({} woken, {} awake), mean T1→T4 {}",
        w.events,
        w.woken,
        w.awake,
        w.total_mean_ns
            .map(human_ns_f)
            .unwrap_or_else(|| "-".to_owned())
    ))];
    let scale: f64 = w.stages.iter().map(|s| s.2).sum::<f64>().max(1.0);
    let bar = width.saturating_sub(14).max(1);
    for (label, pick) in [("p50", 0usize), ("p99", 1)] {
        let mut spans = vec![Span::raw(format!("{label} "))];
        let mut total = 0.0;
        for (i, s) in w.stages.iter().enumerate() {
            let v = if pick == 0 { s.1 } else { s.2 };
            total += v;
            let n = ((v / scale) * bar as f64).round() as usize;
            let n = if v > 0.0 { n.max(1) } else { 0 };
            let (glyph, color) = STAGE_STYLE[i % STAGE_STYLE.len()];
            spans.push(Span::styled(glyph.repeat(n), Style::default().fg(color)));
        }
        spans.push(Span::raw(format!(" {}", human_ns_f(total))));
        lines.push(Line::from(spans));
    }
    for (i, s) in w.stages.iter().enumerate() {
        let (glyph, color) = STAGE_STYLE[i % STAGE_STYLE.len()];
        lines.push(Line::from(vec![
            Span::styled(format!("{glyph} "), Style::default().fg(color)),
            Span::raw(format!(
                "{:<18} p50 {:>8}  p99 {:>8}",
                s.0,
                human_ns_f(s.1),
                human_ns_f(s.2)
            )),
        ]));
    }
    lines
}

fn draw_waterfall(f: &mut Frame, area: Rect, w: &WaterfallView) {
    let lines = waterfall_lines(w, area.width.saturating_sub(2) as usize);
    f.render_widget(
        Paragraph::new(lines)
            .wrap(ratatui::widgets::Wrap { trim: true })
            .block(Block::bordered().title(" completion waterfall (woken events, p50/p99) ")),
        area,
    );
}

fn draw_footer(f: &mut Frame, area: Rect, app: &App) {
    let overhead = match &app.overhead {
        Some(o) => {
            let worst = o
                .programs
                .iter()
                .filter_map(|p| p.ns_per_run.map(|n| (n, p)))
                .max_by(|a, b| a.0.total_cmp(&b.0));
            format!(
                "overhead: eBPF {:.2} % CPU, {} programs{}; loader {:.1} % CPU, RSS {} KiB",
                o.bpf_cpu_percent,
                o.programs.len(),
                worst
                    .map(|(n, p)| format!(" (max {n:.0} ns/run: {})", p.counts.target))
                    .unwrap_or_default(),
                o.loader_cpu_percent,
                o.loader_peak_rss_kib
            ) + &o
                .tracing_adds
                .map(|a| format!("; {}", a.render()))
                .unwrap_or_default()
        }
        None => "overhead: -".to_owned(),
    };
    let keys = app
        .status
        .clone()
        .unwrap_or_else(|| "q quit  Tab/↑↓ select  p pause  r reset".to_owned());
    f.render_widget(
        Paragraph::new(vec![
            Line::from(overhead),
            Line::styled(keys, Style::default().add_modifier(Modifier::BOLD)),
        ]),
        area,
    );
}

#[cfg(test)]
mod tests {
    use ratatui::{Terminal, backend::TestBackend};

    use super::*;
    use crate::model::sample::Sample;
    use crate::views::tui::app::{Key, tests::sample};

    fn screen(app: &App, w: u16, h: u16) -> String {
        let mut t = Terminal::new(TestBackend::new(w, h)).unwrap();
        t.draw(|f| draw(f, app)).unwrap();
        let buf = t.backend().buffer().clone();
        (0..h)
            .map(|y| {
                (0..w)
                    .map(|x| buf[(x, y)].symbol().to_owned())
                    .collect::<String>()
                    + "\n"
            })
            .collect()
    }

    #[test]
    fn a_stall_is_a_banner_under_the_header() {
        let mut app = App::new("rdma-trace run");
        app.update(crate::views::tui::app::tests::stalled_sample());
        let s = screen(&app, 100, 30);
        let line = s.lines().nth(3).unwrap_or_default();
        assert!(
            line.starts_with("STALL pid 42 (demo) tid 43 blocked 2.5 s: the CQ was not armed"),
            "{s}"
        );
        app.update(sample(&[("rxe_rcv", 4, false)]));
        assert!(!screen(&app, 100, 30).contains("STALL"));
    }

    #[test]
    fn many_skipped_probes_leave_room_for_the_heat_map() {
        let mut app = App::new("rdma-trace run");
        let names: Vec<String> = (0..40).map(|i| format!("driver_fn_{i}")).collect();
        let leaked: Vec<&'static str> = names
            .into_iter()
            .map(|n| &*Box::leak(n.into_boxed_str()))
            .collect();
        let rows = |n: u64| -> Vec<(&'static str, u64, bool)> {
            let mut v = vec![("rxe_rcv", n, false), ("rxe_cq_post", n, false)];
            v.extend(leaked.iter().map(|&name| (name, 0, true)));
            v
        };
        app.update(sample(&rows(1200)));
        app.update(sample(&rows(2400)));
        let s = screen(&app, 130, 45);
        assert!(s.contains("+ 40 skipped"), "{s}");
        assert!(
            s.contains("rxe_rcv over time"),
            "the heat map is shown: {s}"
        );
    }

    /// Fails, naming it, unless every one of `parts` is on screen `s`.
    fn assert_shows(s: &str, parts: &[&str]) {
        for part in parts {
            assert!(s.contains(part), "{part:?} is not on the screen:\n{s}");
        }
    }

    /// An attached probe with `rxe_rcv` events, a skipped one, another with `net_rx` events.
    fn rxe_and_net_rx(rxe_rcv: u64, net_rx: u64) -> Sample {
        sample(&[
            ("rxe_rcv", rxe_rcv, false),
            ("mlx5_eq_comp_int", 0, true),
            ("softirq NET_RX", net_rx, false),
        ])
    }

    #[test]
    fn draws_table_pane_histogram_and_progress() {
        let mut app = App::new("rdma-trace run");
        app.update(rxe_and_net_rx(1200, 800));
        let s = screen(&app, 120, 24);
        assert_shows(
            &s,
            &[
                "event mode",
                "250 / 1000 iterations",
                "rxe_rcv",
                "1200",
                // Skipped probes are one line under the attached ones.
                "+ 1 skipped",
                // The selected probe's pane: title, percentiles and histogram bars.
                " rxe_rcv ",
                "p99 9.0us",
                "[1us, 2us)",
                "█",
                "q quit",
                // The waterfall pane: stacked bars and the legend.
                "completion waterfall",
                "p50 █▓▓▓▓▓▒▒ 42.0us",
                "p99 █▓▓▓▓",
                "▓ run queue          p50   30.0us  p99  200.0us",
            ],
        );
        assert!(!s.contains("mlx5_eq_comp_int"), "{s}");
        // The heat map under the table, for the selected probe.
        app.update(rxe_and_net_rx(2400, 900));
        let s = screen(&app, 120, 30);
        assert_shows(&s, &["rxe_rcv over time", "     1us █", "     2us "]);

        app.key(Key::Next);
        app.key(Key::Pause);
        let s = screen(&app, 120, 24);
        assert!(s.contains(" softirq NET_RX "), "selection moved: {s}");
        assert!(s.contains("[PAUSED]"), "{s}");
    }

    #[test]
    fn heat_rows_show_the_newest_columns_slowest_row_on_top() {
        let mut heat = Heat::default();
        assert!(heat_rows(&heat, Unit::Nanoseconds, 40, 10).is_none());
        // Three refreshes: 8 events in [1us, 2us), then 2 in [2us, 4us) and 1 in [1us, 2us),
        // then nothing.
        let (r1, r2) = (Heat::row(1024), Heat::row(2048));
        let mut col = [0u64; 65];
        col[r1] = 8;
        heat.columns.push_back(col);
        let mut col = [0u64; 65];
        col[r1] = 1;
        col[r2] = 2;
        heat.columns.push_back(col);
        heat.columns.push_back([0; 65]);
        let rows = heat_rows(&heat, Unit::Nanoseconds, 40, 10).unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].label, "     2us ");
        assert_eq!(
            rows[0].shades,
            [0, 1, 0],
            "2 of at most 8: the lightest shade"
        );
        assert_eq!(rows[1].label, "     1us ");
        assert_eq!(rows[1].shades, [4, 1, 0]);
        // Room for two columns (8 + 1 + 2): the two newest, shaded against their own most (2).
        let rows = heat_rows(&heat, Unit::Nanoseconds, 11, 10).unwrap();
        assert_eq!(rows[0].shades, [4, 0]);
        assert_eq!(rows[1].shades, [2, 0]);
        // One row of room: the slowest row stays.
        let rows = heat_rows(&heat, Unit::Nanoseconds, 40, 1).unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].label, "     2us ");
    }

    #[test]
    fn tiny_terminals_do_not_panic() {
        let mut app = App::new("t");
        app.update(sample(&[("a", 3, false)]));
        for (w, h) in [(1, 1), (10, 5), (40, 8)] {
            let _ = screen(&app, w, h);
        }
        let _ = screen(&App::new("empty"), 80, 20);
    }
}

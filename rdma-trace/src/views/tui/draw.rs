//! Drawing the live view from an [`App`]: a header with the load's progress, the probe table
//! (count, rate, p50, p99; the selected probe highlighted) with the selected probe's latency
//! heat map under it, the selected probe's pane with its histogram, the completion waterfall
//! (stages stacked at p50 and p99), and the self-overhead line. Pure: tested with ratatui's
//! `TestBackend`.
//!
//! Text goes straight into the frame's buffer, each line cut at its pane's edge as a
//! `Paragraph` without wrapping would cut it, and the table's cells where a `Table` would put
//! them (the tests check that cell for cell against those widgets): the widgets segment every
//! string into styled graphemes and restyle every cell of their blocks, which cost more than
//! the terminal's own work per frame.

use ratatui::{
    Frame,
    buffer::Buffer,
    layout::{Constraint, Flex, Layout, Rect},
    style::{Color, Modifier, Style},
    text::{Line, Span},
    widgets::{Block, Gauge, Paragraph, Widget as _},
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
    let buf = f.buffer_mut();
    if let Some(b) = banner {
        buf.set_style(
            stall,
            Style::default()
                .fg(Color::White)
                .bg(Color::Red)
                .add_modifier(Modifier::BOLD),
        );
        Rows::new(stall).line(buf, &Line::from(b));
    }
    let [list, heat, pane, wf] = body_areas(body, app);
    draw_table(buf, list, app);
    if heat.height >= 4 {
        draw_heat(buf, heat, app);
    }
    draw_pane(buf, pane, app);
    if let Some(w) = &app.waterfall {
        draw_waterfall(buf, wf, w);
    }
    draw_footer(buf, footer, app);
}

/// The body's areas: the probe table, the heat map under it, the selected probe's pane, and
/// under that the waterfall's (empty without a waterfall).
fn body_areas(body: Rect, app: &App) -> [Rect; 4] {
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
    let [pane, wf] = match app.waterfall {
        Some(_) => Layout::vertical([Constraint::Min(6), Constraint::Length(8)]).areas(right),
        None => [right, Rect::default()],
    };
    [list, heat, pane, wf]
}

/// The heat map's title for probe `name`.
fn heat_title(name: &str) -> String {
    format!(" {name} over time (rows: ≥ bucket; ░▒▓█ few → many; a column a second) ")
}

/// "no events yet" at the top left of `inner`.
fn no_events_yet(buf: &mut Buffer, inner: Rect) {
    buf.set_stringn(
        inner.x,
        inner.y,
        "no events yet",
        inner.width as usize,
        Style::default(),
    );
}

/// Lines written top to bottom into an area, each cut at the area's right edge (a `Paragraph`
/// without wrapping); those that do not fit under it are dropped.
struct Rows {
    area: Rect,
    row: u16,
}

impl Rows {
    fn new(area: Rect) -> Self {
        Self { area, row: 0 }
    }

    /// The next line's y, `None` once the area is full.
    fn next(&mut self) -> Option<u16> {
        (self.row < self.area.height).then(|| {
            self.row += 1;
            self.area.y + self.row - 1
        })
    }

    /// `line` on the next row, as `Buffer::set_line` writes it.
    fn line(&mut self, buf: &mut Buffer, line: &Line) {
        let Some(y) = self.next() else {
            return;
        };
        let (mut x, right) = (self.area.x, self.area.right());
        for span in line {
            if x >= right {
                break;
            }
            let width = usize::from(right - x);
            x = put(
                buf,
                x,
                y,
                &span.content,
                width,
                line.style.patch(span.style),
            );
        }
    }
}

/// `Buffer::set_stringn(x, y, s, max_width, style)`, returning the x after `s`, without its
/// grapheme segmentation and width look-ups when `s` is ASCII (a cell a byte) or one character
/// repeated (a bar: the first cell as ratatui writes it, the others the same when it is one
/// cell wide).
fn put(buf: &mut Buffer, x: u16, y: u16, s: &str, max_width: usize, style: Style) -> u16 {
    let max = u16::try_from(max_width).unwrap_or(u16::MAX);
    let right = buf.area.right().min(x.saturating_add(max));
    if s.is_ascii() {
        let mut x = x;
        for (i, b) in s.bytes().enumerate() {
            if x >= right {
                break;
            }
            // set_stringn drops control characters.
            if !b.is_ascii_control() {
                buf[(x, y)].set_symbol(&s[i..=i]).set_style(style);
                x += 1;
            }
        }
        return x;
    }
    let mut chars = s.chars();
    let first = chars.next().map(char::len_utf8).unwrap_or(0);
    let glyph = &s[..first];
    if chars.all(|c| c.len_utf8() == first)
        && s.as_bytes().chunks(first).all(|c| c == glyph.as_bytes())
    {
        let after = buf.set_stringn(x, y, glyph, max_width, style).0;
        if after == x + 1 {
            let end =
                right.min(x.saturating_add(u16::try_from(s.len() / first).unwrap_or(u16::MAX)));
            for cx in after..end {
                buf[(cx, y)].set_symbol(glyph).set_style(style);
            }
            return end.max(after);
        }
    }
    buf.set_stringn(x, y, s, max_width, style).0
}

/// A bordered block (with `title`) drawn over `area`, as `Block::bordered()` draws it; returns
/// the area inside it. The block would first restyle every cell of `area` with the default
/// style (which changes nothing): only its edges are written here.
fn bordered(buf: &mut Buffer, area: Rect, title: Option<String>) -> Rect {
    let area = area.intersection(buf.area);
    if area.width < 2 || area.height < 2 {
        let block = match title {
            Some(t) => Block::bordered().title(t),
            None => Block::bordered(),
        };
        let inner = block.inner(area);
        block.render(area, buf);
        return inner;
    }
    let (left, right, top, bottom) = (area.left(), area.right() - 1, area.top(), area.bottom() - 1);
    for x in left + 1..right {
        buf[(x, top)].set_symbol("─");
        buf[(x, bottom)].set_symbol("─");
    }
    for y in top + 1..bottom {
        buf[(left, y)].set_symbol("│");
        buf[(right, y)].set_symbol("│");
    }
    buf[(left, top)].set_symbol("┌");
    buf[(right, top)].set_symbol("┐");
    buf[(left, bottom)].set_symbol("└");
    buf[(right, bottom)].set_symbol("┘");
    if let Some(t) = title {
        put(
            buf,
            left + 1,
            top,
            &t,
            usize::from(area.width - 2),
            Style::default(),
        );
    }
    Rect::new(left + 1, top + 1, area.width - 2, area.height - 2)
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

/// The probe table's columns (probe, count, rate/s, p50, p99), a cell apart.
const TABLE_COLUMNS: [Constraint; 5] = [
    Constraint::Min(16),
    Constraint::Length(9),
    Constraint::Length(8),
    Constraint::Length(8),
    Constraint::Length(8),
];

/// The probe table as a ratatui `Table` of [`TABLE_COLUMNS`] lays it out (a bold header, the
/// selected row reversed, scrolled just enough to show it), written cell by cell.
fn draw_table(buf: &mut Buffer, area: Rect, app: &App) {
    let inner = bordered(buf, area, Some(" probes (Tab/↑↓) ".to_owned()));
    if inner.is_empty() {
        return;
    }
    let cols = Layout::horizontal(TABLE_COLUMNS)
        .flex(Flex::Start)
        .spacing(1)
        .split(Rect::new(0, 0, inner.width, 1));
    let cell = |buf: &mut Buffer, y: u16, c: usize, s: &str| {
        let r = cols[c];
        put(
            buf,
            inner.x + r.x,
            y,
            s,
            usize::from(r.width),
            Style::default(),
        );
    };
    buf.set_style(
        Rect { height: 1, ..inner },
        Style::default().add_modifier(Modifier::BOLD),
    );
    for (c, h) in ["probe", "count", "rate/s", "p50", "p99"]
        .iter()
        .enumerate()
    {
        cell(buf, inner.y, c, h);
    }
    // Attached probes, then one line for those skipped here (the start-up table and the report
    // say why for each): on a machine with one RDMA driver, the other drivers' rows would fill
    // the table.
    let attached = app.selectable();
    let skipped = app.probes.len() - attached.len();
    let rows = attached.len() + usize::from(skipped > 0);
    let height = usize::from(inner.height - 1);
    // The selected probe's row among the attached ones, and the first row shown.
    let selected = app
        .selected_index()
        .and_then(|i| attached.iter().position(|&a| a == i));
    let first = match selected {
        Some(s) if s >= height => s + 1 - height,
        _ => 0,
    };
    for (i, y) in (first..rows.min(first + height)).zip(inner.y + 1..) {
        let row = Rect {
            y,
            height: 1,
            ..inner
        };
        match attached.get(i) {
            Some(&p) => {
                let r = &app.probes[p];
                cell(buf, y, 0, &r.name);
                cell(buf, y, 1, &r.count.to_string());
                cell(buf, y, 2, &format!("{:.0}", r.rate));
                cell(buf, y, 3, &value(r.unit, r.summary.p50));
                cell(buf, y, 4, &value(r.unit, r.summary.p99));
            }
            None => {
                buf.set_style(row, Style::default().fg(Color::DarkGray));
                cell(buf, y, 0, &format!("+ {skipped} skipped (see report)"));
            }
        }
        if selected == Some(i) {
            buf.set_style(row, Style::default().add_modifier(Modifier::REVERSED));
        }
    }
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

fn draw_pane(buf: &mut Buffer, area: Rect, app: &App) {
    let Some(r) = app.selected_probe() else {
        let inner = bordered(buf, area, None);
        Rows::new(inner).line(buf, &Line::from("no probe attached"));
        return;
    };
    let inner = bordered(buf, area, Some(format!(" {} ", r.name)));
    let mut rows = Rows::new(inner);
    rows.line(buf, &Line::from(r.what));
    rows.line(
        buf,
        &Line::from(format!(
            "via {}  count {}  rate {:.1}/s  unmatched {}",
            r.attach.unwrap_or("-"),
            r.count,
            r.rate,
            r.unmatched
        )),
    );
    rows.line(
        buf,
        &Line::from(format!(
            "p50 {}  p90 {}  p99 {}  max {}",
            value(r.unit, r.summary.p50),
            value(r.unit, r.summary.p90),
            value(r.unit, r.summary.p99),
            value(r.unit, r.summary.max.map(|m| m as f64)),
        )),
    );
    rows.next();
    if let Some(note) = r.note {
        rows.line(buf, &Line::styled(note, Style::default().fg(Color::Yellow)));
    }
    let bar_width = (area.width as usize).saturating_sub(2 + 28).max(1);
    for line in histogram_lines(r, bar_width) {
        rows.line(buf, &line);
    }
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
fn draw_heat(buf: &mut Buffer, area: Rect, app: &App) {
    let (Some(r), Some(heat)) = (app.selected_probe(), app.selected_heat()) else {
        return;
    };
    let inner = bordered(buf, area, Some(heat_title(&r.name)));
    let Some(rows) = heat_rows(heat, r.unit, inner.width as usize, inner.height as usize) else {
        no_events_yet(buf, inner);
        return;
    };
    for (row, y) in rows.iter().zip(inner.y..inner.bottom()) {
        let x = put(
            buf,
            inner.x,
            y,
            &row.label,
            inner.width as usize,
            Style::default(),
        );
        shade_cells(buf, row, x..inner.right(), y);
    }
}

/// Heat map row `row`'s shades into the cells `xs` of line `y` (after its label).
fn shade_cells(buf: &mut Buffer, row: &HeatRow, xs: std::ops::Range<u16>, y: u16) {
    for (&shade, x) in row.shades.iter().zip(xs) {
        if shade > 0 {
            let (ch, color) = SHADES[usize::from(shade) - 1];
            buf[(x, y)].set_symbol(ch).set_fg(color);
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

fn draw_waterfall(buf: &mut Buffer, area: Rect, w: &WaterfallView) {
    let title = " completion waterfall (woken events, p50/p99) ";
    let lines = waterfall_lines(w, area.width.saturating_sub(2) as usize);
    let inner = Block::bordered().inner(area);
    if lines.iter().any(|l| l.width() > usize::from(inner.width)) {
        // A screen too narrow for a line: wrapped at its words, as before.
        Paragraph::new(lines)
            .wrap(ratatui::widgets::Wrap { trim: true })
            .block(Block::bordered().title(title))
            .render(area, buf);
        return;
    }
    let mut rows = Rows::new(bordered(buf, area, Some(title.to_owned())));
    for line in &lines {
        rows.line(buf, line);
    }
}

fn draw_footer(buf: &mut Buffer, area: Rect, app: &App) {
    let (overhead, keys) = footer_text(app);
    let mut rows = Rows::new(area);
    rows.line(buf, &Line::from(overhead));
    rows.line(
        buf,
        &Line::styled(keys, Style::default().add_modifier(Modifier::BOLD)),
    );
}

/// The footer's two lines: what tracing costs, and the keys (or the status).
fn footer_text(app: &App) -> (String, String) {
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
    (overhead, keys)
}

/// The drawing as it was through ratatui's `Table` and `Paragraph`: what the direct drawing must
/// match cell for cell.
#[cfg(test)]
mod widgets {
    use ratatui::{
        Frame,
        layout::{Constraint, Layout, Rect},
        style::{Color, Modifier, Style},
        text::Line,
        widgets::{Block, Paragraph, Row, Table, TableState},
    };

    use super::{heat_rows, histogram_lines, value, waterfall_lines};
    use crate::views::tui::app::App;
    use crate::waterfall::WaterfallView;

    pub(super) fn draw(f: &mut Frame, app: &App) {
        let banner = app.stall_banner();
        let [header, stall, body, footer] = Layout::vertical([
            Constraint::Length(3),
            Constraint::Length(u16::from(banner.is_some())),
            Constraint::Min(6),
            Constraint::Length(2),
        ])
        .areas(f.area());
        super::draw_header(f, header, app);
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
        let [list, heat, pane, wf] = super::body_areas(body, app);
        draw_table(f, list, app);
        if heat.height >= 4 {
            draw_heat(f, heat, app);
        }
        draw_pane(f, pane, app);
        if let Some(w) = &app.waterfall {
            draw_waterfall(f, wf, w);
        }
        draw_footer(f, footer, app);
    }

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

    fn draw_heat(f: &mut Frame, area: Rect, app: &App) {
        let (Some(r), Some(heat)) = (app.selected_probe(), app.selected_heat()) else {
            return;
        };
        let block = Block::bordered().title(super::heat_title(&r.name));
        let inner = block.inner(area);
        f.render_widget(block, area);
        let buf = f.buffer_mut();
        let Some(rows) = heat_rows(heat, r.unit, inner.width as usize, inner.height as usize)
        else {
            super::no_events_yet(buf, inner);
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
            super::shade_cells(buf, row, x..inner.right(), y);
        }
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
        let (overhead, keys) = super::footer_text(app);
        f.render_widget(
            Paragraph::new(vec![
                Line::from(overhead),
                Line::styled(keys, Style::default().add_modifier(Modifier::BOLD)),
            ]),
            area,
        );
    }
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

    /// What `draw` and the widget drawing it replaced put in each cell (symbol and style).
    fn both(app: &App, w: u16, h: u16) -> (ratatui::buffer::Buffer, ratatui::buffer::Buffer) {
        let render = |d: fn(&mut ratatui::Frame, &App)| {
            let mut t = Terminal::new(TestBackend::new(w, h)).unwrap();
            t.draw(|f| d(f, app)).unwrap();
            t.backend().buffer().clone()
        };
        (render(draw), render(super::widgets::draw))
    }

    #[test]
    fn direct_drawing_matches_the_widgets_cell_for_cell() {
        /// A fixture's name, its view, and the screen sizes it is drawn at.
        type Case = (&'static str, App, Vec<(u16, u16)>);
        let mut cases: Vec<Case> = Vec::new();
        let sizes = vec![
            (160, 48),
            (120, 24),
            (100, 30),
            (60, 16),
            (50, 20),
            (40, 8),
            (1, 1),
        ];

        let mut app = App::new("rdma-trace run");
        app.update(rxe_and_net_rx(1200, 800));
        app.update(rxe_and_net_rx(2400, 900));
        cases.push(("two probes, one skipped", app, sizes.clone()));

        let mut app = App::new("rdma-trace run");
        app.update(rxe_and_net_rx(1200, 800));
        app.key(Key::Next);
        app.key(Key::Pause);
        app.status = Some("demo finished — q to quit".into());
        cases.push(("paused, second probe, status", app, sizes.clone()));

        let mut app = App::new("rdma-trace run");
        app.update(crate::views::tui::app::tests::stalled_sample());
        cases.push(("a stall", app, sizes.clone()));

        // Twelve attached probes and thirty skipped, two hundred refreshes of heat map; the
        // last probe selected, so that a short screen scrolls the table to it.
        let mut app = App::new("rdma-trace run");
        for n in 1..=200 {
            app.update(super::cost::busy_sample(n * 100));
        }
        cases.push(("busy", app, sizes.clone()));
        let mut app = App::new("rdma-trace run");
        app.update(super::cost::busy_sample(100));
        app.key(Key::Prev);
        cases.push(("busy, last selected", app, sizes.clone()));

        // No waterfall, a probe with a note and packets.
        let mut app = App::new("irq");
        let mut s = sample(&[("rxe_rcv", 0, false), ("napi", 900, false)]);
        s.waterfall = None;
        s.probes[0].note = Some("no events: is the device up?");
        s.probes[1].unit = Unit::Packets;
        app.update(s);
        cases.push(("note, no waterfall", app, sizes.clone()));
        let mut app = App::new("irq");
        app.update(s_packets_selected());
        cases.push(("packets selected", app, sizes.clone()));

        cases.push(("empty", App::new("empty"), sizes));

        for (name, app, sizes) in &cases {
            for &(w, h) in sizes {
                let (direct, widgets) = both(app, w, h);
                assert_eq!(direct, widgets, "{name} at {w}x{h}");
            }
        }
    }

    /// A packets probe, selected, with no waterfall.
    fn s_packets_selected() -> Sample {
        let mut s = sample(&[("napi", 900, false)]);
        s.waterfall = None;
        s.probes[0].unit = Unit::Packets;
        s
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

/// Not a test: what a refresh of the live view costs on this machine, to compare changes to
/// the drawing (`cargo test -p rdma-trace --release --lib frame_cost -- --ignored --nocapture`).
/// Speed targets are measured by the trace bench in the guest, not here.
#[cfg(test)]
mod cost {
    use std::time::Instant;

    use ratatui::{Terminal, backend::TestBackend};

    use super::*;
    use crate::views::tui::app::tests::sample;

    /// A screen like the bench's: 12 attached probes, 30 skipped, a full heat map, the waterfall.
    pub(crate) fn busy_sample(n: u64) -> crate::model::sample::Sample {
        const ATTACHED: [&str; 12] = [
            "rxe_rcv",
            "rxe_cq_post",
            "rxe_comp",
            "rxe_resp",
            "rxe_req",
            "ib_uverbs_comp_handler",
            "softirq NET_RX",
            "rxe_xmit",
            "rxe_send",
            "rxe_poll_cq",
            "ib_poll_cq",
            "rxe_post_send",
        ];
        let skipped: Vec<&'static str> = (0..30)
            .map(|i| &*Box::leak(format!("mlx5_fn_{i}").into_boxed_str()))
            .collect();
        let mut rows: Vec<(&'static str, u64, bool)> = ATTACHED
            .iter()
            .enumerate()
            .map(|(i, &name)| (name, n * (i as u64 + 1), false))
            .collect();
        rows.extend(skipped.iter().map(|&s| (s, 0, true)));
        let mut s = sample(&rows);
        s.progress.elapsed = std::time::Duration::from_millis(250 * n);
        s
    }

    /// µs per refresh of `App::update` and of drawing with `d`, 160×48.
    fn per_refresh(d: fn(&mut ratatui::Frame, &App)) -> (f64, f64) {
        let mut app = App::new("rdma-trace run");
        for n in 1..=200 {
            app.update(busy_sample(n * 100));
        }
        let mut t = Terminal::new(TestBackend::new(160, 48)).unwrap();
        const N: u64 = 2000;
        let (mut update, mut draw_t) = (0u128, 0u128);
        for n in 0..N {
            let s = busy_sample(20_000 + n * 100);
            let t0 = Instant::now();
            app.update(s);
            let t1 = Instant::now();
            t.draw(|f| d(f, &app)).unwrap();
            update += (t1 - t0).as_nanos();
            draw_t += t1.elapsed().as_nanos();
        }
        let us = |ns: u128| ns as f64 / N as f64 / 1e3;
        (us(update), us(draw_t))
    }

    #[test]
    #[ignore = "a measurement, not a test"]
    fn frame_cost() {
        // "nothing": the terminal's own work per frame (clearing its buffer, the diff).
        for (name, d) in [
            ("nothing", (|_, _| {}) as fn(&mut ratatui::Frame, &App)),
            ("widgets", super::widgets::draw),
            ("direct", draw),
        ] {
            let (update, frame) = per_refresh(d);
            eprintln!("160x48 {name}: update {update:.1} us, draw {frame:.1} us per refresh");
        }
    }
}

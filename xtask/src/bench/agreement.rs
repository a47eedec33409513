//! Do this run's verdicts agree with the previous run's? Every verdict cell of the new page
//! (`met …`, `**MISSED** …`, `undecided …`, `no data`) is matched with the cell at the same place
//! of the page it replaces: same heading, same table, same row (its first cell and how many rows
//! above it have the same first cell), same column.

use std::{collections::BTreeMap, fmt::Write as _};

/// The heading of the section this module writes.
const TITLE: &str = "Verdicts against the previous run";

/// A verdict's place on a page: heading, table header, row label (with its repeat index), column.
type Place = (String, String, String, String);

/// What one verdict cell says, reduced to its word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Word {
    Met,
    Missed,
    Undecided,
    NoData,
}

impl Word {
    fn of(cell: &str) -> Option<Self> {
        let c = cell.trim().trim_start_matches("**");
        if c.starts_with("met") {
            Some(Self::Met)
        } else if c.starts_with("MISSED") {
            Some(Self::Missed)
        } else if c.starts_with("undecided") {
            Some(Self::Undecided)
        } else if c == "no data" {
            Some(Self::NoData)
        } else {
            None
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Met => "met",
            Self::Missed => "MISSED",
            Self::Undecided => "undecided",
            Self::NoData => "no data",
        }
    }
}

fn cells(line: &str) -> Vec<String> {
    let inner = line.trim().trim_start_matches('|').trim_end_matches('|');
    inner.split('|').map(|c| c.trim().to_owned()).collect()
}

/// Every verdict cell of a generated page, by place, in page order.
pub fn verdicts(page: &str) -> Vec<(Place, Word)> {
    let mut out = Vec::new();
    let mut heading = String::new();
    let mut header: Option<Vec<String>> = None;
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut lines = page.lines().peekable();
    while let Some(line) = lines.next() {
        if line.starts_with('#') {
            heading = line.trim_start_matches('#').trim().to_owned();
            if heading == TITLE {
                break; // the previous comparison's own table holds no verdicts
            }
            continue;
        }
        if !line.trim_start().starts_with('|') {
            header = None;
            continue;
        }
        let Some(head) = &header else {
            // A table starts: this is its header, the next line its `|---|` rule.
            header = Some(cells(line));
            seen.clear();
            lines.next_if(|l| l.contains("---"));
            continue;
        };
        let row = cells(line);
        let Some(label) = row.first() else { continue };
        let repeat = seen.entry(label.clone()).or_default();
        let label_at = format!("{label} #{repeat}");
        *repeat += 1;
        for (i, cell) in row.iter().enumerate().skip(1) {
            if let Some(word) = Word::of(cell) {
                let column = head
                    .get(i)
                    .cloned()
                    .unwrap_or_else(|| format!("column {i}"));
                out.push((
                    (heading.clone(), head.join("|"), label_at.clone(), column),
                    word,
                ));
            }
        }
    }
    out
}

/// The page's `- date:` line, if it has one.
fn date(page: &str) -> Option<&str> {
    page.lines().find_map(|l| l.strip_prefix("- date: "))
}

/// The section that compares `new`'s verdicts with `old`'s, or None when `old` has none (no
/// previous page, or one from before the verdicts).
pub fn section(old: &str, new: &str) -> Option<String> {
    let before: BTreeMap<Place, Word> = verdicts(old).into_iter().collect();
    if before.is_empty() {
        return None;
    }
    let now = verdicts(new);
    let mut agree = 0;
    let mut changed = Vec::new();
    let mut unmatched = 0;
    for (place, word) in &now {
        match before.get(place) {
            Some(w) if w == word => agree += 1,
            Some(w) => changed.push((place, *w, *word)),
            None => unmatched += 1,
        }
    }
    let mut out = format!("\n## {TITLE}\n\n");
    let _ = write!(
        out,
        "This run's verdicts against those of the page it replaced (run of {}): {agree} of {} \
         agree",
        date(old).unwrap_or("unknown date"),
        now.len() - unmatched,
    );
    if unmatched > 0 {
        let _ = write!(out, "; {unmatched} have no counterpart there (new rows)");
    }
    out.push_str(".\n");
    if changed.is_empty() {
        out.push_str("\nNo verdict changed.\n");
        return Some(out);
    }
    out.push_str("\n| where | row | column | before | now |\n|---|---|---|---|---|\n");
    for ((heading, _, label, column), was, is) in changed {
        let label = label.rsplit_once(" #").map_or(label.as_str(), |(l, _)| l);
        let _ = writeln!(
            out,
            "| {heading} | {label} | {column} | {} | {} |",
            was.name(),
            is.name()
        );
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const OLD: &str = "# Benchmarks\n\n- date: 2026-12-01 10:00 UTC\n\n## A\n\n\
        | mode | run | ratio | goal |\n|---|---|---|---|\n\
        | poll | A | 1 |  |\n\
        | poll | B | 1.6 [1.3–2.1] | undecided (CI spans the goal ≤ 1.7) |\n\
        | event | B | 1.6 [1.3–2.1] | **MISSED** (goal ≤ 1.1) |\n\n\
        text\n\n## B\n\n| figure | x | goal |\n|---|---|---|\n| cpu | 1.1 | met (≤ 2) |\n";

    #[test]
    fn verdicts_are_found_by_place_with_repeated_labels_apart() {
        let v = verdicts(OLD);
        let words: Vec<Word> = v.iter().map(|(_, w)| *w).collect();
        assert_eq!(words, [Word::Undecided, Word::Missed, Word::Met]);
        assert_eq!(v[0].0.2, "poll #1", "the second `poll` row");
        assert_eq!(v[1].0.2, "event #0");
        assert_eq!(v[2].0.0, "B");
        assert_eq!(v[2].0.3, "goal");
    }

    #[test]
    fn a_changed_verdict_is_listed_and_the_rest_counted() {
        let new = OLD
            .replace("2026-12-01 10:00", "2026-12-02 10:00")
            .replace(
                "**MISSED** (goal ≤ 1.1)",
                "undecided (CI spans the goal ≤ 1.1)",
            )
            .replace("1.1 | met", "1.3 | met");
        let s = section(OLD, &new).unwrap();
        assert!(
            s.contains("(run of 2026-12-01 10:00 UTC): 2 of 3 agree."),
            "{s}"
        );
        assert!(
            s.contains("| A | event | goal | MISSED | undecided |"),
            "{s}"
        );
        let same = section(OLD, OLD).unwrap();
        assert!(
            same.contains("3 of 3 agree.\n\nNo verdict changed."),
            "{same}"
        );
        // A row the old page did not have is counted apart.
        let more = OLD.replace("| cpu |", "| rss | 20 | met (≤ 30) |\n| cpu |");
        let s = section(OLD, &more).unwrap();
        assert!(s.contains("3 of 3 agree; 1 have no counterpart"), "{s}");
        assert_eq!(section("# no tables\n", OLD), None);
        // The comparison's own table is not read as verdicts.
        let with_section = format!("{new}{s}");
        assert_eq!(verdicts(&with_section).len(), 3);
    }
}

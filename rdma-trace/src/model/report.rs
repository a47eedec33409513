//! Per-probe results: what the text report and the JSON carry.

use std::{borrow::Cow, collections::HashMap};

use serde::Serialize;

use crate::{
    bpf::hist::{Bucket, Summary, human_ns_f, plain},
    bpf::loader::{Outcome, ProbeData, SharedHook},
    bpf::session::Session,
    kernel::probes::{Driver, Unit},
};

#[derive(Debug, Serialize)]
pub struct ProbeReport {
    pub name: Cow<'static, str>,
    pub what: &'static str,
    pub driver: Driver,
    pub unit: Unit,
    /// `kprobe`, `fentry`, `raw_tp`, or null when skipped.
    pub attach: Option<&'static str>,
    pub skipped: Option<String>,
    /// The reason's stable name (`no_device`, `inlined`, ...), when skipped.
    pub skip_kind: Option<&'static str>,
    /// Events seen (calls, softirq runs, polls, interval starts).
    pub count: u64,
    /// Events per second over the window.
    pub rate: f64,
    /// Ends without a start (attached mid-call, lost entries).
    pub unmatched: u64,
    /// Values recorded (durations, packets per poll) and their percentiles.
    pub summary: Summary,
    /// The recorded values summed (estimated from the histogram's slots): for durations, the
    /// time spent in the probe over the window.
    pub total: f64,
    /// Non-empty power-of-two rows.
    pub log2: Vec<Bucket>,
    /// Shown when the count is 0 and that is expected.
    pub note: Option<&'static str>,
    /// The hooks of the row's functions where the completion waterfall's programs do the
    /// row's work (no program of the row's own runs there): the function, and whether its
    /// entry and its return are theirs.
    pub shared_hooks: Vec<SharedHook>,
}

/// Reports for every probe of `session` from `data` collected over `seconds`.
pub fn probe_reports(
    session: &Session,
    data: &HashMap<u32, ProbeData>,
    seconds: f64,
) -> Vec<ProbeReport> {
    session
        .plan
        .probes
        .iter()
        .zip(&session.outcomes)
        .map(|(p, o)| {
            let d = data.get(&p.id).cloned().unwrap_or_default();
            let count = d.counters[rdma_trace_common::C_EVENTS as usize];
            ProbeReport {
                name: p.def.name.clone(),
                what: p.def.what,
                driver: p.def.driver,
                unit: p.def.unit(),
                attach: match o {
                    Outcome::Attached(m) => Some(m.label()),
                    Outcome::Skipped(_) => None,
                },
                skipped: match o {
                    Outcome::Skipped(why) => Some(why.to_string()),
                    Outcome::Attached(_) => None,
                },
                skip_kind: match o {
                    Outcome::Skipped(why) => Some(why.kind()),
                    Outcome::Attached(_) => None,
                },
                count,
                rate: if seconds > 0.0 {
                    count as f64 / seconds
                } else {
                    0.0
                },
                unmatched: d.counters[rdma_trace_common::C_UNMATCHED as usize],
                summary: d.hist.summary(),
                total: d.hist.sum_estimate(),
                log2: d.hist.log2_rows(),
                note: if count == 0 { p.def.zero_note } else { None },
                shared_hooks: session.shared_hooks_of(p),
            }
        })
        .collect()
}

fn fmt_value(unit: Unit, v: Option<f64>) -> String {
    match (unit, v) {
        (_, None) => "-".to_owned(),
        (Unit::Nanoseconds, Some(v)) => human_ns_f(v),
        (Unit::Packets, Some(v)) => format!("{v:.0}"),
    }
}

/// The table and the histograms, as text.
pub fn render(reports: &[ProbeReport]) -> String {
    let mut out = format!(
        "{:<24} {:<7} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}\n",
        "probe", "via", "count", "rate/s", "p50", "p90", "p99", "max"
    );
    for r in reports {
        match (&r.skipped, r.attach) {
            (Some(why), _) => out.push_str(&format!("{:<24} skipped: {why}\n", r.name)),
            (None, via) => {
                let max = r.summary.max.map(|m| m as f64);
                out.push_str(&format!(
                    "{:<24} {:<7} {:>9} {:>9.1} {:>9} {:>9} {:>9} {:>9}{}\n",
                    r.name,
                    via.unwrap_or("-"),
                    r.count,
                    r.rate,
                    fmt_value(r.unit, r.summary.p50),
                    fmt_value(r.unit, r.summary.p90),
                    fmt_value(r.unit, r.summary.p99),
                    fmt_value(r.unit, max),
                    r.note.map(|n| format!("  ({n})")).unwrap_or_default(),
                ));
            }
        }
    }
    for r in reports.iter().filter(|r| !r.log2.is_empty()) {
        let fmt: fn(u64) -> String = match r.unit {
            Unit::Nanoseconds => crate::bpf::hist::pow2_label,
            Unit::Packets => plain,
        };
        let hist = crate::bpf::hist::render_rows(&r.log2, 40, fmt);
        out.push_str(&format!("\n@{} ({}):\n{hist}", r.name, r.what));
    }
    out
}

//! The `rdma_cm connect` row's event counts: the `CM_EVENTS` array (every event the rdma_cm
//! module handed to a consumer, by type), read and turned into the report's `rdma_cm` section.
//! The row's own histogram (set-up time per connection) is a probe row like any other.

use std::collections::BTreeMap;

use anyhow::{Context as _, Result, anyhow};
use aya::{
    Ebpf,
    maps::{Array, MapData},
};
use rdma_trace_common::cma::{
    CM_COUNTERS, CM_EVENT_KINDS, CM_EVENT_NAMES, CM_NONZERO_STATUS, CM_START_LOST, cm_event_fails,
};
use serde::Serialize;

use crate::error::chain;

/// The `CM_EVENTS` array's counters.
pub fn read(ebpf: &Ebpf) -> Result<Vec<u64>> {
    let map: Array<&MapData, u64> = Array::try_from(
        ebpf.map("CM_EVENTS")
            .context("map CM_EVENTS is not in the eBPF object")?,
    )?;
    (0..CM_COUNTERS)
        .map(|i| {
            map.get(&i, 0)
                .map_err(|e| anyhow!("reading CM_EVENTS: {}", chain(&e)))
        })
        .collect()
}

/// rdma_cm over a window.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct CmReport {
    /// Events delivered, by type (`ESTABLISHED`, `CONNECT_REQUEST`, ...; `RDMA_CM_EVENT_`
    /// left out; `OTHER` for numbers this build does not know); only types seen.
    pub events: BTreeMap<&'static str, u64>,
    /// Events that end an attempt without a connection: ADDR_ERROR, ROUTE_ERROR,
    /// CONNECT_ERROR, UNREACHABLE, REJECTED, DEVICE_REMOVAL.
    pub failures: u64,
    /// Events with a non-zero status.
    pub nonzero_status: u64,
    /// Connection starts the start map had no room for (their set-up is not timed: their
    /// end counts as unmatched in the row).
    pub starts_lost: u64,
}

/// What happened between the counters `before` and `after`; `None` when nothing did.
pub fn report(after: &[u64], before: &[u64]) -> Option<CmReport> {
    let d = |i: u32| {
        let i = i as usize;
        after
            .get(i)
            .copied()
            .unwrap_or(0)
            .saturating_sub(before.get(i).copied().unwrap_or(0))
    };
    let mut r = CmReport::default();
    for kind in 0..CM_EVENT_KINDS {
        let n = d(kind);
        if n == 0 {
            continue;
        }
        let name = CM_EVENT_NAMES
            .get(kind as usize)
            .copied()
            .unwrap_or("OTHER");
        r.events.insert(name, n);
        if cm_event_fails(kind) {
            r.failures += n;
        }
    }
    r.nonzero_status = d(CM_NONZERO_STATUS);
    r.starts_lost = d(CM_START_LOST);
    (r != CmReport::default()).then_some(r)
}

/// The report's rdma_cm lines; nothing when no event came.
pub fn render(r: Option<&CmReport>) -> String {
    let Some(r) = r else {
        return String::new();
    };
    // In the order of the CM's state machine (the event types' numbers), not by name.
    let events: Vec<String> = CM_EVENT_NAMES
        .iter()
        .chain(&["OTHER"])
        .filter_map(|k| r.events.get(k).map(|n| format!("{k} {n}")))
        .collect();
    let mut out = format!(
        "rdma_cm events (set-up time per connection: the `rdma_cm connect` row): {}\n",
        events.join(", ")
    );
    if r.failures > 0 || r.nonzero_status > 0 {
        out.push_str(&format!(
            "  {} failed attempts, {} events with a non-zero status\n",
            r.failures, r.nonzero_status
        ));
    }
    if r.starts_lost > 0 {
        out.push_str(&format!(
            "  lost: {} connection starts (the start map was full; not timed)\n",
            r.starts_lost
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counters(set: &[(u32, u64)]) -> Vec<u64> {
        let mut v = vec![0; CM_COUNTERS as usize];
        for &(i, n) in set {
            v[i as usize] = n;
        }
        v
    }

    #[test]
    fn a_window_counts_the_events_since_its_start_by_name() {
        // An rping pair: the client resolves, sends its REQ, gets the REP (CONNECT_RESPONSE:
        // librdmacm owns its QP); the server's new id gets the request and ESTABLISHED; both
        // then DISCONNECTED. One earlier connection is before the window.
        let before = counters(&[(5, 1), (9, 1), (10, 2)]);
        let after = counters(&[(0, 1), (2, 1), (4, 1), (5, 2), (9, 2), (10, 4)]);
        let r = report(&after, &before).unwrap();
        assert_eq!(
            r.events.clone().into_iter().collect::<Vec<_>>(),
            [
                ("ADDR_RESOLVED", 1),
                ("CONNECT_REQUEST", 1),
                ("CONNECT_RESPONSE", 1),
                ("DISCONNECTED", 2),
                ("ESTABLISHED", 1),
                ("ROUTE_RESOLVED", 1),
            ]
        );
        assert_eq!((r.failures, r.nonzero_status, r.starts_lost), (0, 0, 0));
        assert!(
            render(Some(&r)).ends_with(
                ": ADDR_RESOLVED 1, ROUTE_RESOLVED 1, CONNECT_REQUEST 1, CONNECT_RESPONSE 1, \
                 ESTABLISHED 1, DISCONNECTED 2\n"
            ),
            "{}",
            render(Some(&r))
        );
        assert_eq!(
            report(&before, &before),
            None,
            "an idle window has no section"
        );
    }

    #[test]
    fn failures_unknown_kinds_and_lost_starts_are_counted_and_shown() {
        // A REJECTED and an UNREACHABLE (both with a status), an event number past the table.
        let after = counters(&[
            (8, 1),
            (7, 1),
            (CM_EVENT_KINDS - 1, 3),
            (CM_NONZERO_STATUS, 2),
            (CM_START_LOST, 5),
        ]);
        let r = report(&after, &counters(&[])).unwrap();
        assert_eq!(r.events["REJECTED"], 1);
        assert_eq!(r.events["OTHER"], 3);
        assert_eq!((r.failures, r.nonzero_status, r.starts_lost), (2, 2, 5));
        let text = render(Some(&r));
        assert!(
            text.contains("2 failed attempts, 2 events with a non-zero status"),
            "{text}"
        );
        assert!(text.contains("lost: 5 connection starts"), "{text}");
        assert_eq!(render(None), "");
    }
}

//! The `ib_cq wakeup` row's per-CQ counts: the `IBCQ` map (one entry per kernel CQ the ib_cq
//! API woke or polled, keyed by its `struct ib_cq *`), read and turned into report rows.

use std::collections::{BTreeMap, HashMap};

use anyhow::{Context as _, Result, anyhow};
use aya::{
    Ebpf,
    maps::{HashMap as BpfHashMap, MapData},
};
use rdma_trace_common::ibcq::{
    IBCQ_COMPLETIONS, IBCQ_COUNTERS, IBCQ_DELAY_NS, IBCQ_POLLS, IBCQ_UNMATCHED, IBCQ_WAKEUPS,
    IbCqStat,
};
use serde::Serialize;

use crate::{bpf::c_string, error::chain, kernel::facts::TextSymbol};

/// Every entry of the `IBCQ` map, by CQ address.
pub fn read(ebpf: &Ebpf) -> Result<BTreeMap<u64, IbCqStat>> {
    let map: BpfHashMap<&MapData, u64, IbCqStat> = BpfHashMap::try_from(
        ebpf.map("IBCQ")
            .context("map IBCQ is not in the eBPF object")?,
    )?;
    map.iter()
        .map(|item| item.map_err(|e| anyhow!("reading IBCQ: {}", chain(&e))))
        .collect()
}

/// One kernel CQ over a window.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CqReport {
    /// The device's name (`rxe0`, `mlx5_0`; at most 16 bytes), null when unlabelled.
    pub device: Option<String>,
    /// The module that allocated the CQ, as `rdma res show cq` names it (`rpcrdma`; `ib_core`
    /// for the shared CQ pools that nvme-rdma and nvmet-rdma take theirs from); null when
    /// unlabelled.
    pub owner: Option<String>,
    /// The CQ's restrack id on its device (`rdma res show cq`'s `cqn`), null when unlabelled.
    pub id: Option<u32>,
    /// `softirq`, `workqueue`, `unbound_workqueue` or `direct` (null when unlabelled).
    pub poll_ctx: Option<&'static str>,
    pub comp_vector: Option<u32>,
    /// cq_process: the poll rounds that started.
    pub wakeups: u64,
    /// Wake-ups without a schedule before them (a work item re-queued, direct polling).
    pub unmatched: u64,
    /// Mean delay of the matched wake-ups, schedule → poll start (ns); null without any.
    pub mean_delay_ns: Option<f64>,
    /// cq_poll: polls, and the completions they returned.
    pub polls: u64,
    pub completions: u64,
    /// The consumer's callback of a completion polled from the CQ (`nvme_rdma_recv_done`),
    /// null when none was read (direct polling, no BTF) or the address is in no function.
    pub callback: Option<String>,
    /// Who consumes the CQ's completions: the module of that callback (`nvme_rdma`,
    /// `nvmet_rdma`, `rpcrdma`, `ib_core` for the MAD layer), `kernel` when built in. It
    /// names the consumer of a CQ of ib_core's shared pools, whose `owner` is `ib_core`.
    pub consumer: Option<String>,
}

/// `enum ib_poll_context`'s IB_POLL_DIRECT.
const IB_POLL_DIRECT: u32 = 3;

/// `enum ib_poll_context`'s name (include/rdma/ib_verbs.h, 5.x on).
pub fn poll_ctx_name(v: u32) -> Option<&'static str> {
    ["softirq", "workqueue", "unbound_workqueue", "direct"]
        .get(v as usize)
        .copied()
}

/// The `done` callbacks the CQs of `stats` recorded (kernel text addresses), for
/// [`reports`]' `callbacks`.
pub fn callbacks(stats: &BTreeMap<u64, IbCqStat>) -> Vec<u64> {
    let mut v: Vec<u64> = stats.values().map(|s| s.done).filter(|&d| d != 0).collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// The CQs of `after` that had events since `before` (a CQ `before` lacks started at 0), by
/// device and id; each CQ's callback named from `callbacks` (kallsyms, by address).
pub fn reports(
    after: &BTreeMap<u64, IbCqStat>,
    before: &BTreeMap<u64, IbCqStat>,
    callbacks: &HashMap<u64, TextSymbol>,
) -> Vec<CqReport> {
    let mut list: Vec<CqReport> = after
        .iter()
        .filter_map(|(cq, a)| {
            let zero = [0; IBCQ_COUNTERS];
            // An entry of another CQ at the same address (freed, then reused) is not a base.
            let b = before
                .get(cq)
                .filter(|b| (b.labelled, b.id, b.device) == (a.labelled, a.id, a.device))
                .map_or(&zero, |b| &b.counters);
            let d: Vec<u64> = (0..IBCQ_COUNTERS)
                .map(|i| a.counters[i].saturating_sub(b[i]))
                .collect();
            if d[IBCQ_WAKEUPS] == 0 && d[IBCQ_POLLS] == 0 {
                return None;
            }
            let labelled = a.labelled == 1;
            let owner = c_string(&a.owner);
            let matched = d[IBCQ_WAKEUPS].saturating_sub(d[IBCQ_UNMATCHED]);
            let callback = callbacks.get(&a.done);
            Some(CqReport {
                device: labelled.then(|| c_string(&a.device)),
                owner: (labelled && !owner.is_empty()).then(|| owner.clone()),
                id: labelled.then_some(a.id),
                poll_ctx: if labelled {
                    poll_ctx_name(a.poll_ctx)
                } else {
                    None
                },
                comp_vector: labelled.then_some(a.comp_vector),
                wakeups: d[IBCQ_WAKEUPS],
                unmatched: d[IBCQ_UNMATCHED],
                mean_delay_ns: (matched > 0).then(|| d[IBCQ_DELAY_NS] as f64 / matched as f64),
                polls: d[IBCQ_POLLS],
                completions: d[IBCQ_COMPLETIONS],
                callback: callback.map(|c| c.name.clone()),
                consumer: match callback {
                    Some(c) => Some(c.module.clone().unwrap_or_else(|| "kernel".to_owned())),
                    // ib_core's pools hand out no directly polled CQ: its owner consumes it.
                    None if labelled && a.poll_ctx == IB_POLL_DIRECT && !owner.is_empty() => {
                        Some(owner)
                    }
                    None => None,
                },
            })
        })
        .collect();
    list.sort_by(|a, b| (&a.device, a.id).cmp(&(&b.device, b.id)));
    list
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stat(id: u32, dev: &str, counters: [u64; IBCQ_COUNTERS]) -> IbCqStat {
        let mut device = [0; 16];
        device[..dev.len()].copy_from_slice(dev.as_bytes());
        let mut owner = [0; 16];
        owner[..7].copy_from_slice(b"rpcrdma");
        IbCqStat {
            id,
            poll_ctx: 1,
            comp_vector: 0,
            labelled: 1,
            device,
            owner,
            counters,
            done: 0,
        }
    }

    #[test]
    fn deltas_per_cq_with_labels_and_the_idle_left_out() {
        let before = BTreeMap::from([
            (0x10, stat(1, "rxe0", [5, 1, 400, 5, 5])),
            (0x20, stat(2, "rxe0", [3, 0, 300, 3, 3])),
            // Freed and reused by CQ 7 of rxe1 since: not its base.
            (0x30, stat(4, "rxe0", [9, 0, 900, 9, 9])),
        ]);
        let after = BTreeMap::from([
            (0x10, stat(1, "rxe0", [15, 2, 1300, 16, 17])),
            (0x20, stat(2, "rxe0", [3, 0, 300, 3, 3])),
            (0x30, stat(7, "rxe1", [2, 2, 0, 2, 0])),
        ]);
        let mut after = after;
        after.get_mut(&0x10).unwrap().done = 0xffff_0010;
        after.get_mut(&0x30).unwrap().done = 0xffff_0030;
        assert_eq!(callbacks(&after), vec![0xffff_0010, 0xffff_0030]);
        let names = HashMap::from([(
            0xffff_0010,
            TextSymbol {
                name: "rpcrdma_wc_receive".into(),
                module: Some("rpcrdma".into()),
            },
        )]);
        let r = reports(&after, &before, &names);
        assert_eq!(r.len(), 2, "the idle CQ 2 is left out: {r:?}");
        assert_eq!(r[0].callback.as_deref(), Some("rpcrdma_wc_receive"));
        assert_eq!(r[0].consumer.as_deref(), Some("rpcrdma"));
        assert_eq!(
            (r[1].callback.as_deref(), r[1].consumer.as_deref()),
            (None, None),
            "an address kallsyms does not name"
        );
        assert_eq!(r[0].device.as_deref(), Some("rxe0"));
        assert_eq!(r[0].id, Some(1));
        assert_eq!(r[0].poll_ctx, Some("workqueue"));
        assert_eq!(r[0].owner.as_deref(), Some("rpcrdma"));
        assert_eq!((r[0].wakeups, r[0].unmatched), (10, 1));
        // 900 ns over the 9 matched wake-ups.
        assert_eq!(r[0].mean_delay_ns, Some(100.0));
        assert_eq!((r[0].polls, r[0].completions), (11, 12));
        assert_eq!((r[1].device.as_deref(), r[1].id), (Some("rxe1"), Some(7)));
        assert_eq!((r[1].wakeups, r[1].unmatched), (2, 2));
        assert_eq!(r[1].mean_delay_ns, None, "no matched wake-up");
    }

    #[test]
    fn unlabelled_cqs_have_null_labels_and_poll_contexts_are_named() {
        let mut s = stat(3, "rxe0", [1, 0, 10, 1, 1]);
        s.owner = [0; 16];
        let r = reports(
            &BTreeMap::from([(0x40, s)]),
            &BTreeMap::new(),
            &HashMap::new(),
        );
        assert_eq!(r[0].owner, None, "no kern_name: no owner");
        s.labelled = 0;
        let r = reports(
            &BTreeMap::from([(0x40, s)]),
            &BTreeMap::new(),
            &HashMap::new(),
        );
        assert_eq!(
            (r[0].device.clone(), r[0].id, r[0].poll_ctx),
            (None, None, None)
        );
        // A directly polled CQ (never pooled) is consumed by its owner.
        let mut d = stat(5, "rxe1", [1, 1, 0, 9, 1]);
        d.poll_ctx = IB_POLL_DIRECT;
        let r = reports(
            &BTreeMap::from([(0x50, d)]),
            &BTreeMap::new(),
            &HashMap::new(),
        );
        assert_eq!(r[0].consumer.as_deref(), Some("rpcrdma"));
        assert_eq!(r[0].callback, None);
        assert_eq!(poll_ctx_name(0), Some("softirq"));
        assert_eq!(poll_ctx_name(3), Some("direct"));
        assert_eq!(poll_ctx_name(4), None);
    }
}

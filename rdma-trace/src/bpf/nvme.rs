//! The `nvme io` row's stage split: the `NVME_STATS` per-CPU array (every NVMe over RDMA host
//! request completed, split at its command's post, its CQ's poll round and its done callback;
//! see `rdma_trace_common::nvme`), read and turned into the report's `nvme` section.

use anyhow::{Context as _, Result, anyhow};
use aya::{
    Ebpf,
    maps::{MapData, PerCpuArray},
};
use rdma_trace_common::nvme::{
    NV_COUNTERS, NV_ISSUED_BEFORE, NV_LOST, NV_NO_CALLBACK, NV_OTHER_OPS, NV_READS, NV_STAGE_NAMES,
    NV_STAGES, NV_UNSENT, NV_WRITES, NvmeStats,
};
use serde::Serialize;

use crate::{
    bpf::hist::{Histogram, human_ns, human_ns_f},
    error::chain,
};

/// The split summed over the CPUs: counters, then per stage (count, sum, slots).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    pub counters: [u64; NV_COUNTERS],
    pub stages: Vec<(u64, u64, Histogram)>,
}

/// `NVME_STATS`, summed over the CPUs.
pub fn read(ebpf: &Ebpf) -> Result<Totals> {
    let map: PerCpuArray<&MapData, NvmeStats> = PerCpuArray::try_from(
        ebpf.map("NVME_STATS")
            .context("map NVME_STATS is not in the eBPF object")?,
    )?;
    let per_cpu = map
        .get(&0, 0)
        .map_err(|e| anyhow!("reading NVME_STATS: {}", chain(&e)))?;
    let mut t = Totals {
        counters: [0; NV_COUNTERS],
        stages: vec![(0, 0, Histogram::default()); NV_STAGES],
    };
    for cpu in per_cpu.iter() {
        for (a, b) in t.counters.iter_mut().zip(cpu.counters) {
            *a += b;
        }
        for (acc, s) in t.stages.iter_mut().zip(cpu.stages.iter()) {
            acc.0 += s.count;
            acc.1 += s.sum_ns;
            acc.2 = acc.2.add(&Histogram::from_slots(s.slots.to_vec()));
        }
    }
    Ok(t)
}

/// One stage over a window (ns).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StageReport {
    pub stage: &'static str,
    /// Requests that had the stage.
    pub count: u64,
    pub sum_ns: u64,
    pub mean_ns: Option<f64>,
    pub p50_ns: Option<f64>,
    pub p99_ns: Option<f64>,
    /// Upper bound of the highest non-empty histogram slot.
    pub max_ns: Option<u64>,
}

/// The NVMe over RDMA host requests of a window.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct NvmeReport {
    pub reads: u64,
    pub writes: u64,
    /// Flushes, discards, write zeroes (and every command when `struct request`'s layout is
    /// unknown).
    pub other_ops: u64,
    /// Completions of requests issued before the window (not split).
    pub issued_before: u64,
    /// Requests whose command's post (nvme_rdma_post_send) was not seen.
    pub unsent: u64,
    /// Requests whose done callback (blk_mq_complete_request_remote) was not seen.
    pub no_callback: u64,
    /// Requests not stamped: the in-flight map was full.
    pub lost: u64,
    /// Issue → sent → CQ scheduled → poll started → callback → completed, the alternative
    /// "sent → callback" for requests without a poll round of their own, and issue →
    /// completed.
    pub stages: Vec<StageReport>,
}

/// The requests completed between `before` and `after`; `None` when none were.
pub fn report(after: &Totals, before: &Totals) -> Option<NvmeReport> {
    let c = |i: usize| after.counters[i].saturating_sub(before.counters[i]);
    let stages: Vec<StageReport> = (0..NV_STAGES)
        .map(|i| {
            let (n, sum, h) = &after.stages[i];
            let (n0, sum0, h0) =
                before
                    .stages
                    .get(i)
                    .cloned()
                    .unwrap_or((0, 0, Histogram::default()));
            let count = n.saturating_sub(n0);
            let sum_ns = sum.saturating_sub(sum0);
            let h = h.subtract(&h0);
            StageReport {
                stage: NV_STAGE_NAMES[i],
                count,
                sum_ns,
                mean_ns: (count > 0).then(|| sum_ns as f64 / count as f64),
                p50_ns: h.quantile(0.5),
                p99_ns: h.quantile(0.99),
                max_ns: h.max(),
            }
        })
        .collect();
    let done = c(NV_READS) + c(NV_WRITES) + c(NV_OTHER_OPS);
    (done + c(NV_ISSUED_BEFORE) + c(NV_LOST) > 0).then(|| NvmeReport {
        reads: c(NV_READS),
        writes: c(NV_WRITES),
        other_ops: c(NV_OTHER_OPS),
        issued_before: c(NV_ISSUED_BEFORE),
        unsent: c(NV_UNSENT),
        no_callback: c(NV_NO_CALLBACK),
        lost: c(NV_LOST),
        stages,
    })
}

/// The report's section: one line per stage, with what was not split counted.
pub fn render(r: Option<&NvmeReport>) -> String {
    let Some(r) = r else {
        return String::new();
    };
    let mut out = format!(
        "NVMe over RDMA I/O (host; nvme_setup_cmd → nvme_complete_rq): {} reads, {} writes, {} other; not split: {} issued before the window, {} without their post, {} without their callback, {} lost (map full)\n  {:<44} {:>8} {:>10} {:>10} {:>10} {:>10}\n",
        r.reads,
        r.writes,
        r.other_ops,
        r.issued_before,
        r.unsent,
        r.no_callback,
        r.lost,
        "stage",
        "n",
        "mean",
        "p50",
        "p99",
        "max"
    );
    let f = |v: Option<f64>| v.map_or("-".to_owned(), human_ns_f);
    for s in &r.stages {
        out.push_str(&format!(
            "  {:<44} {:>8} {:>10} {:>10} {:>10} {:>10}\n",
            s.stage,
            s.count,
            f(s.mean_ns),
            f(s.p50_ns),
            f(s.p99_ns),
            s.max_ns.map_or("-".to_owned(), human_ns),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdma_trace_common::nvme::{NV_SENT_CALLBACK, NV_SENT_SCHEDULED, NV_TOTAL};

    fn totals(counters: [u64; NV_COUNTERS], stages: &[(usize, &[u64])]) -> Totals {
        let mut t = Totals {
            counters,
            stages: vec![(0, 0, Histogram::default()); NV_STAGES],
        };
        for &(i, values) in stages {
            t.stages[i] = (
                values.len() as u64,
                values.iter().sum(),
                Histogram::of_values(values),
            );
        }
        t
    }

    #[test]
    fn a_window_splits_the_requests_completed_since_its_start() {
        let before = totals([2, 0, 0, 1, 0, 0, 0, 0], &[(NV_TOTAL, &[100_000, 100_000])]);
        let after = totals(
            [5, 1, 0, 1, 1, 0, 0, 0],
            &[
                (
                    NV_TOTAL,
                    &[100_000, 100_000, 200_000, 200_000, 200_000, 200_000],
                ),
                (NV_SENT_SCHEDULED, &[150_000, 150_000, 150_000]),
                (NV_SENT_CALLBACK, &[170_000]),
            ],
        );
        let r = report(&after, &before).expect("requests completed");
        assert_eq!((r.reads, r.writes, r.issued_before, r.unsent), (3, 1, 0, 1));
        let total = &r.stages[NV_TOTAL];
        assert_eq!((total.count, total.sum_ns), (4, 800_000));
        assert_eq!(total.mean_ns, Some(200_000.0));
        assert_eq!(r.stages[NV_SENT_SCHEDULED].count, 3);
        assert_eq!(r.stages[NV_SENT_CALLBACK].mean_ns, Some(170_000.0));
        let text = render(Some(&r));
        assert!(text.contains("3 reads, 1 writes"), "{text}");
        assert!(text.contains("sent → CQ scheduled"), "{text}");
        assert_eq!(report(&after, &after), None, "nothing since: no section");
        assert_eq!(render(None), "");
    }
}

//! The completion waterfall's per-event samples held against user-space truth: the demo's own
//! CLOCK_MONOTONIC stamps (`rdma-demo --stamps`, which `rdma-trace run --sample N` asks for),
//! taken right after each `ibv_get_cq_event` returned and right before each `ibv_post_send`.
//! `bpf_ktime_get_ns` reads the same clock.
//!
//! A sample pairs a handler call (T1) with the read that took its event (T4) through the
//! per-channel queue mirror; the k-th sample of a thread is held against its k-th read stamp:
//! - T4 lies between the thread's previous read stamp and this one (so the sample is this
//!   read's), with the stamp at most [`READ_TO_STAMP_MAX_NS`] after T4, and the median of
//!   those gaps at most a [`READ_TO_STAMP_MEDIAN_SHARE`] of the thread's median time between
//!   reads;
//! - T1 lies after that thread's previous read stamp: the demo re-arms its CQ only after a
//!   read, and an unarmed CQ calls no handler, so the event read k-th was raised after read
//!   k − 1 returned;
//! - T1 lies after the post of the completion that raised the event. That completion came
//!   after the CQ was armed again, so after those the thread had polled by its previous read
//!   (the read stamps carry those counts): it is the next receive, which follows the peer's
//!   next post, or the next completion of the thread's own sends, which follows its own next
//!   post; T1 lies after the earlier of the two posts.
//!
//! Shown to fail for a wrong product, by hand in the 6.1 and 6.12 guests (not committed):
//! with the mirror one event behind after a channel's first read (each read took the previous
//! handler call's stamps, as after a missed kretprobe return), the test failed on both at the
//! client's second event, whose T1 came 27-28 ms before its previous read's stamp. Taking the
//! newest queued event instead of the oldest passed: in this load a channel never holds two
//! events (one CQ per channel, re-armed only after a read), so newest and oldest are the same
//! event, and no load here tells them apart (see docs/testing.md).

use serde_json::Value;

use super::harness::run_demo;

/// How long after T4 (`ib_uverbs_comp_event_read` returns, in the kretprobe) the demo's stamp
/// of the same read may come: the most for one event, and the median over a thread's events as
/// a share of its median time from one read stamp to the next.
/// Measured in the 6.1 and 6.12 guests under TCG on a loaded 2-core host (200 round trips,
/// both threads, six runs on each kernel): the median 9-23 µs, the 99th percentile
/// up to 2.2 ms, the most 49 ms (a vCPU not run between the kretprobe and the clock read). The
/// bound for one event is twice the worst seen. The median's was a fixed 100 µs until a full
/// `cargo xtask test` on 6.12 measured 120 µs: the gap is TCG's time to run the return to user
/// space, and it grows with the host's load, as does the time between reads. A T4 taken
/// anywhere but at the read's return (its entry, before the reader blocks) would lag by a wait,
/// a large share of the time between reads; the return lags by a small one.
const READ_TO_STAMP_MEDIAN_SHARE: f64 = 0.25;
const READ_TO_STAMP_MAX_NS: u64 = 100_000_000;

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"))
}

/// A read stamp: when, and the completions the thread had polled by then, of its own
/// requests and of the messages it received.
pub(super) struct Read {
    t: u64,
    sends: usize,
    recvs: usize,
}

/// The stamps of a demo report: its reads and its posts, in order.
pub(super) fn stamps(report: &Value) -> (Vec<Read>, Vec<u64>) {
    let all = report["stamps"]["samples"]
        .as_array()
        .unwrap_or_else(|| panic!("no stamps in {}", report["role"]));
    let of = |kind: &'static str| all.iter().filter(move |s| s["kind"] == kind);
    let reads = of("read")
        .map(|s| Read {
            t: u(&s["t_ns"]),
            sends: u(&s["polled"]["sends"]) as usize,
            recvs: u(&s["polled"]["recvs"]) as usize,
        })
        .collect();
    (reads, of("post").map(|s| u(&s["t_ns"])).collect())
}

/// The p50, p99 and max of `v` (sorted here).
fn quantiles(mut v: Vec<u64>) -> [u64; 3] {
    v.sort_unstable();
    let at = |q: usize| v[(v.len() - 1) * q / 100];
    [at(50), at(99), at(100)]
}

#[test]
fn sampled_events_agree_with_the_demos_own_stamps() {
    let iters = 200u64;
    // More than the events of both threads (at most two a round trip each): every one sampled.
    let n = (4 * iters + 100).to_string();
    let run = run_demo("event", iters, &["--sample", &n], "stamps");
    run.assert_success("rdma-trace run --sample");
    let report = &run.report;
    let samples = report["waterfall_samples"]
        .as_array()
        .expect("waterfall_samples");
    let reports = report["phases"][0]["demo"]["reports"]
        .as_array()
        .expect("demo reports");
    assert_eq!(reports.len(), 2, "client and server: {reports:?}");
    let mut checked = 0;
    for (me, peer) in [(&reports[0], &reports[1]), (&reports[1], &reports[0])] {
        let role = me["role"].as_str().expect("role");
        let tid = u(&me["stamps"]["tid"]);
        let (reads, own_posts) = stamps(me);
        let (_, peer_posts) = stamps(peer);
        assert_eq!(
            reads.len() as u64,
            u(&me["cq_events"]),
            "{role}: a stamp per event read"
        );
        assert_eq!(own_posts.len() as u64, iters, "{role}: a stamp per post");
        let mine: Vec<&Value> = samples.iter().filter(|s| u(&s["tid"]) == tid).collect();
        assert_eq!(
            mine.len(),
            reads.len(),
            "{role} (tid {tid}): {} sampled events, {} event reads stamped",
            mine.len(),
            reads.len()
        );
        let (mut gaps, mut after_read, mut after_post) = (Vec::new(), Vec::new(), Vec::new());
        for (k, (s, read)) in mine.iter().zip(&reads).enumerate() {
            let (t1, t4) = (u(&s["t1"]), u(&s["t4"]));
            let at = format!("{role} event {k}: {s}, read stamp {}", read.t);
            // T4 belongs to this read: after the previous one's stamp, before its own.
            let prev = k.checked_sub(1).map(|j| &reads[j]);
            assert!(t4 <= read.t, "T4 after the read's stamp: {at}");
            let gap = read.t - t4;
            assert!(
                gap <= READ_TO_STAMP_MAX_NS,
                "T4 {gap} ns before the read's stamp: {at}"
            );
            gaps.push(gap);
            // T1: after the CQ was armed again, i.e. after the previous read.
            if let Some(prev) = prev {
                assert!(
                    t4 > prev.t,
                    "T4 before the previous read's stamp {}: {at}",
                    prev.t
                );
                assert!(
                    t1 > prev.t,
                    "T1 before the previous read's stamp {}: {at}",
                    prev.t
                );
                after_read.push(t1 - prev.t);
            }
            // T1: after the post of the completion that raised the event, which is a later
            // completion than those polled before the CQ was armed again: the next of its
            // own sends, or of the peer's (a received message), whichever came first.
            let (sends, recvs) = prev.map_or((0, 0), |p| (p.sends, p.recvs));
            let cause = [own_posts.get(sends), peer_posts.get(recvs)]
                .into_iter()
                .flatten()
                .min()
                .unwrap_or_else(|| panic!("no post left to cause it: {at}"));
            assert!(
                t1 > *cause,
                "T1 before the post that raised it ({cause}): {at}"
            );
            after_post.push(t1 - cause);
            checked += 1;
        }
        let [g50, g99, gmax] = quantiles(gaps);
        let [i50, ..] = quantiles(reads.windows(2).map(|w| w[1].t - w[0].t).collect());
        let ([r50, ..], [p50, ..]) = (quantiles(after_read.clone()), quantiles(after_post.clone()));
        let (rmin, pmin) = (after_read.iter().min(), after_post.iter().min());
        eprintln!(
            "stamps {role}: {} events; read stamp - T4 p50 {g50} p99 {g99} max {gmax} ns; \
             between reads p50 {i50} ns; \
             T1 - previous read p50 {r50} min {rmin:?} ns; T1 - causing post p50 {p50} min {pmin:?} ns",
            mine.len()
        );
        assert!(
            g50 as f64 <= READ_TO_STAMP_MEDIAN_SHARE * i50 as f64,
            "{role}: the median read stamp comes {g50} ns after T4, more than \
             {READ_TO_STAMP_MEDIAN_SHARE} of the median {i50} ns between reads"
        );
    }
    assert!(checked as u64 >= iters, "{checked} events checked");
}

//! `rdma-trace export` in the guest, where completions flow: its per-CQ series against the
//! load's own counts.

use std::time::Duration;

use super::{
    RDMA_TRACE,
    exposition::{http_get, parse_exposition, sample, start_exporter},
    harness::{loopback_pingpong, read_json, temp_json},
    kill_on_drop::KillOnDrop,
};

/// The exporter's completion events per CQ (`rdma_trace_cq_events_total{device,cq}`, every
/// process's summed) while the loopback demo runs its two sides, the client's CQ on rxe1 and
/// the server's on rxe0. The independent truth: each side's own count of the completion
/// events it took (`cq_events` of the demo's JSON); nothing else in the guest reads any.
#[test]
fn export_counts_each_cqs_completion_events() {
    let (child, addr) = start_exporter(RDMA_TRACE, "guest");
    let _exporter = KillOnDrop::adopt(child);
    let demo_json = temp_json("export-demo");
    let status = loopback_pingpong(&[
        "--mode",
        "event",
        "-n",
        "300",
        "--json",
        demo_json.to_str().unwrap(),
    ]);
    assert!(status.success(), "the loopback demo: {status}");
    // The exporter refreshes every 0.2 s: the demo's last events are in the page after that.
    std::thread::sleep(Duration::from_secs(1));
    let (status, body) = http_get(&addr, "/metrics");
    assert!(status.contains("200"), "{status}");
    let samples = parse_exposition(&body);
    let demo = read_json(&demo_json);
    let mut read = 0;
    for r in demo["reports"].as_array().expect("demo reports") {
        let device = r["device"].as_str().expect("device");
        let taken = r["cq_events"].as_u64().expect("cq_events");
        let prefix = format!("rdma_trace_cq_events_total{{device=\"{device}\",");
        let series: Vec<&(String, f64)> = samples
            .iter()
            .filter(|(s, _)| s.starts_with(&prefix))
            .collect();
        assert_eq!(series.len(), 1, "one CQ on {device}: {series:?}");
        assert_eq!(
            series[0].1, taken as f64,
            "the {} side's CQ on {device}: {:?}, the demo took {taken} events",
            r["role"], series[0]
        );
        assert!(
            !series[0].0.contains("cq=\"other\""),
            "a CQ of its own: {series:?}"
        );
        read += taken;
    }
    // The waterfall's own total, woken and awake, is the same events.
    let events = sample(&samples, "rdma_trace_waterfall_events_total{kind=\"woken\"")
        + sample(&samples, "rdma_trace_waterfall_events_total{kind=\"awake\"");
    assert_eq!(events, read as f64, "{body}");
}

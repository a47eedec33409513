//! `rdma-trace export`: the probe table's histograms and counters in the Prometheus text
//! format, over HTTP, for as long as it runs. It spawns nothing: it traces whatever runs.
//!
//! The eBPF maps only ever grow, so every series is a counter or a cumulative histogram, as
//! Prometheus wants them. Buckets are the powers of two (1 ns … 2^36 ns ≈ 69 s, in seconds): the
//! eBPF slots split each power of two in four, so those bounds are exact cumulative counts.
//! `_sum` is estimated from the slot midpoints (each within 12.5 % of its values).
//!
//! The HTTP side is a minimal HTTP/1.x responder on a tokio `TcpListener`: `GET /metrics`
//! (or `/`) answers the text rendered at the last refresh, anything else 404/405; one request
//! per connection.

use std::{
    collections::BTreeSet,
    fmt::Write as _,
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::{Context as _, Result};
use rdma_trace_common::{C_EVENTS, C_UNMATCHED, slot_bounds};
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::{TcpListener, TcpStream},
    signal::unix::{SignalKind, signal},
};

use crate::{
    bpf::{Outcome, ProbeData},
    hist::Histogram,
    kernel::{Kernel, RdmaDevice},
    plan::Options,
    probes::{Driver, PROBES, ProbeDef, Unit},
    session::Session,
};

#[derive(clap::Args, Debug)]
#[command(
    after_help = "Exit codes: 0 stopped by Ctrl-C or SIGTERM; 1 failure (e.g. the address \
                        is in use); 2 bad usage; 3 no probe can be attached (not root, no eBPF).\n\n\
                        Examples:\n  sudo rdma-trace export --listen 0.0.0.0:9464\n  \
                        sudo rdma-trace export --listen 127.0.0.1:9464 --interval 5\n  \
                        curl -s http://127.0.0.1:9464/metrics | grep NET_RX"
)]
pub struct Args {
    /// Address to serve on (`0.0.0.0:9464`, `[::]:9464`, `127.0.0.1:0` for any free port).
    #[arg(long, value_name = "ADDR")]
    pub listen: SocketAddr,
    /// Seconds between two reads of the eBPF maps.
    #[arg(long, value_name = "SECS", default_value = "5", value_parser = crate::parse_seconds)]
    pub interval: Duration,
    /// Value of the `host` label [default: the kernel's hostname].
    #[arg(long, value_name = "NAME")]
    pub host: Option<String>,
    /// Keep probes of driver paths without a device here.
    #[arg(long)]
    pub all_drivers: bool,
}

/// Largest power of two used as a bucket bound, for nanosecond histograms (2^36 ns ≈ 68.7 s).
const NS_MAX_POW: u32 = 36;
/// Largest power of two used as a bucket bound, for packet counts.
const PACKETS_MAX_POW: u32 = 10;
/// Requests larger than this are refused.
const MAX_REQUEST: usize = 8192;

pub async fn run(args: &Args) -> Result<()> {
    let kernel = Kernel::live();
    let session = Session::start(
        &kernel,
        PROBES,
        Options {
            all_drivers: args.all_drivers,
            // uprobes trap on every call of every process: not for an always-on exporter.
            ..Options::default()
        },
    )?;
    let host = args.host.clone().unwrap_or_else(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_owned())
            .unwrap_or_else(|_| "unknown".to_owned())
    });
    let labels = ProbeLabels::new(&kernel.rdma_devices(), &host);
    let wf = crate::waterfall::start_or_explain(false, 0);
    let listener = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("listening on {}", args.listen))?;
    let addr = listener.local_addr().context("the listening address")?;
    eprintln!(
        "rdma-trace: probes:\n{}rdma-trace: serving http://{addr}/metrics (refresh every {:?})",
        session.attach_table(),
        args.interval
    );

    let page = Arc::new(Mutex::new(String::new()));
    let refresh = |page: &Mutex<String>| -> Result<()> {
        let mut text = render(&session, &session.snapshot()?, &labels);
        if let Some(w) = &wf {
            render_waterfall(&mut text, &w.snapshot()?, &labels.host);
        }
        *page.lock().unwrap_or_else(|p| p.into_inner()) = text;
        Ok(())
    };
    refresh(&page)?;
    let mut tick = tokio::time::interval(args.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut term = signal(SignalKind::terminate()).context("listening for SIGTERM")?;
    loop {
        tokio::select! {
            _ = tick.tick() => refresh(&page)?,
            conn = listener.accept() => match conn {
                Ok((stream, _)) => {
                    let page = Arc::clone(&page);
                    tokio::spawn(async move {
                        let _ = tokio::time::timeout(Duration::from_secs(10), serve(stream, &page)).await;
                    });
                }
                // Out of descriptors and the like: keep serving the others.
                Err(e) => eprintln!("rdma-trace: accepting a connection: {e}"),
            },
            r = tokio::signal::ctrl_c() => { r.context("listening for Ctrl-C")?; break; }
            _ = term.recv() => break,
        }
    }
    eprintln!("rdma-trace: stopped; probes detached");
    Ok(())
}

/// One request, one response, then close.
async fn serve(mut stream: TcpStream, page: &Mutex<String>) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
        if buf.len() > MAX_REQUEST {
            return respond(
                &mut stream,
                "431 Request Header Fields Too Large",
                "text/plain",
                "request too large\n",
            )
            .await;
        }
    }
    let head = String::from_utf8_lossy(&buf);
    let mut parts = head.lines().next().unwrap_or_default().split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = path.split('?').next().unwrap_or("");
    match (method, path) {
        ("GET" | "HEAD", "/metrics" | "/") => {
            let body = page.lock().unwrap_or_else(|p| p.into_inner()).clone();
            let body = if method == "HEAD" {
                String::new()
            } else {
                body
            };
            respond(
                &mut stream,
                "200 OK",
                "text/plain; version=0.0.4; charset=utf-8",
                &body,
            )
            .await
        }
        ("GET" | "HEAD", _) => {
            respond(&mut stream, "404 Not Found", "text/plain", "try /metrics\n").await
        }
        _ => {
            respond(
                &mut stream,
                "405 Method Not Allowed",
                "text/plain",
                "GET /metrics\n",
            )
            .await
        }
    }
}

async fn respond(
    stream: &mut TcpStream,
    status: &str,
    kind: &str,
    body: &str,
) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.shutdown().await
}

/// The `driver`, `device` and `host` labels of each driver path.
struct ProbeLabels {
    host: String,
    all: String,
    rxe: String,
    mlx5: String,
}

impl ProbeLabels {
    fn new(devices: &[RdmaDevice], host: &str) -> Self {
        let join = |f: fn(&RdmaDevice) -> bool| {
            devices
                .iter()
                .filter(|d| f(d))
                .map(|d| d.name.as_str())
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect::<Vec<_>>()
                .join(",")
        };
        Self {
            host: host.to_owned(),
            all: join(|_| true),
            rxe: join(RdmaDevice::is_rxe),
            mlx5: join(RdmaDevice::is_mlx5),
        }
    }

    /// `probe="..",driver="..",device="..",host=".."`: device lists the RDMA devices the probe's
    /// driver path serves (kernel functions are shared by all devices of a driver).
    fn of(&self, def: &ProbeDef) -> String {
        let (driver, device) = match def.driver {
            Driver::Generic => ("generic", self.all.as_str()),
            Driver::Mlx5 => ("mlx5", self.mlx5.as_str()),
            Driver::Rxe => ("rxe", self.rxe.as_str()),
            Driver::Network => ("network", ""),
        };
        format!(
            "probe=\"{}\",driver=\"{driver}\",device=\"{}\",host=\"{}\"",
            escape(def.name),
            escape(device),
            escape(&self.host)
        )
    }
}

/// Label value escaping of the text format: `\`, `"` and newlines.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The whole exposition for every probe of `session`.
fn render(
    session: &Session,
    data: &std::collections::HashMap<u32, ProbeData>,
    labels: &ProbeLabels,
) -> String {
    let probes: Vec<(&ProbeDef, bool, ProbeData)> = session
        .plan
        .probes
        .iter()
        .zip(&session.outcomes)
        .map(|(p, o)| {
            (
                &p.def,
                matches!(o, Outcome::Attached(_)),
                data.get(&p.id).cloned().unwrap_or_default(),
            )
        })
        .collect();
    let mut out = String::new();
    family(
        &mut out,
        "rdma_trace_probe_attached",
        "gauge",
        "1 when the probe is attached on this host, 0 when it was skipped.",
    );
    for (def, attached, _) in &probes {
        let _ = writeln!(
            out,
            "rdma_trace_probe_attached{{{}}} {}",
            labels.of(def),
            u8::from(*attached)
        );
    }
    let attached: Vec<_> = probes.iter().filter(|(_, a, _)| *a).collect();
    family(
        &mut out,
        "rdma_trace_probe_events_total",
        "counter",
        "Events the probe saw: calls, softirq runs, NAPI polls, interval starts.",
    );
    for (def, _, d) in &attached {
        let _ = writeln!(
            out,
            "rdma_trace_probe_events_total{{{}}} {}",
            labels.of(def),
            d.counters[C_EVENTS as usize]
        );
    }
    family(
        &mut out,
        "rdma_trace_probe_unmatched_total",
        "counter",
        "Ends seen without their start (attached mid-call, lost entries).",
    );
    for (def, _, d) in &attached {
        let _ = writeln!(
            out,
            "rdma_trace_probe_unmatched_total{{{}}} {}",
            labels.of(def),
            d.counters[C_UNMATCHED as usize]
        );
    }
    for (unit, name, help) in [
        (
            Unit::Nanoseconds,
            "rdma_trace_probe_duration_seconds",
            "Durations the probe measured (function entry to return, softirq and IRQ handlers, wake-up intervals).",
        ),
        (
            Unit::Packets,
            "rdma_trace_probe_packets",
            "Packets handled per NAPI poll.",
        ),
    ] {
        let rows: Vec<_> = attached
            .iter()
            .filter(|(def, _, _)| def.unit() == unit)
            .collect();
        if rows.is_empty() {
            continue;
        }
        family(&mut out, name, "histogram", help);
        for (def, _, d) in rows {
            histogram(&mut out, name, &labels.of(def), &d.hist, unit);
        }
    }
    out
}

/// The completion waterfall of every thread that read completion events: a histogram per
/// stage (`stage` label: driver, wake, runq, read, awake, total), events per kind and CPU
/// placement class.
fn render_waterfall(out: &mut String, snap: &crate::waterfall::Snapshot, host: &str) {
    use rdma_trace_common::waterfall::{W_AWAKE, W_WOKEN};

    use crate::waterfall::{model::STAGES, topology::CLASS_NAMES};
    let Some(t) = snap.merged_data() else {
        return;
    };
    let host = escape(host);
    family(
        out,
        "rdma_trace_waterfall_events_total",
        "counter",
        "Completion events read from completion channels, by whether the handler woke the reader.",
    );
    for (kind, c) in [("woken", W_WOKEN), ("awake", W_AWAKE)] {
        let _ = writeln!(
            out,
            "rdma_trace_waterfall_events_total{{kind=\"{kind}\",host=\"{host}\"}} {}",
            t.counts.get(c)
        );
    }
    family(
        out,
        "rdma_trace_waterfall_placement_total",
        "counter",
        "Completion events by CPU placement of the handler against the reader.",
    );
    for (k, name) in CLASS_NAMES.iter().enumerate() {
        let _ = writeln!(
            out,
            "rdma_trace_waterfall_placement_total{{class=\"{name}\",host=\"{host}\"}} {}",
            t.counts.classes[k]
        );
    }
    let name = "rdma_trace_waterfall_stage_seconds";
    family(
        out,
        name,
        "histogram",
        "Stages of completion events: driver (T0→T1), wake (handler → wake-up), runq (wake-up → on CPU), read (on CPU → read returns), awake (T1→T4 of readers already awake), total (T1→T4).",
    );
    for (h, key, _, _) in STAGES {
        histogram(
            out,
            name,
            &format!("stage=\"{key}\",host=\"{host}\""),
            &t.hists[h as usize],
            Unit::Nanoseconds,
        );
    }
}

fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// `_bucket` lines at the powers of two, `+Inf`, `_sum` (slot midpoints) and `_count`.
fn histogram(out: &mut String, name: &str, labels: &str, h: &Histogram, unit: Unit) {
    let (scale, max_pow) = match unit {
        Unit::Nanoseconds => (1e-9, NS_MAX_POW),
        Unit::Packets => (1.0, PACKETS_MAX_POW),
    };
    let slots = h.slots();
    let total: u64 = slots.iter().sum();
    let mut cumulative = 0u64;
    let mut next = 0usize;
    for k in 0..=max_pow {
        let bound = 1u64 << k;
        // Slots never straddle a power of two, so this count is exact.
        while next < slots.len() && slot_bounds(next as u32).1 <= bound {
            cumulative += slots[next];
            next += 1;
        }
        let le = bound as f64 * scale;
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{le:e}\"}} {cumulative}");
    }
    let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {total}");
    let sum: f64 = slots
        .iter()
        .enumerate()
        .filter(|(_, c)| **c != 0)
        .map(|(i, &c)| {
            let (lo, hi) = slot_bounds(i as u32);
            let mid = if hi == u64::MAX {
                lo as f64
            } else {
                (lo as f64 + hi as f64) / 2.0
            };
            mid * c as f64
        })
        .sum();
    let _ = writeln!(out, "{name}_sum{{{labels}}} {}", sum * scale);
    let _ = writeln!(out, "{name}_count{{{labels}}} {total}");
}

#[cfg(test)]
mod tests {
    use rdma_trace_common::{HIST_SLOTS, hist_slot};

    use super::*;

    fn hist(values: &[u64]) -> Histogram {
        let mut slots = vec![0; HIST_SLOTS as usize];
        for &v in values {
            slots[hist_slot(v) as usize] += 1;
        }
        Histogram::from_slots(slots)
    }

    fn value(text: &str, prefix: &str) -> f64 {
        text.lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix} in\n{text}"))
            .rsplit(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap()
    }

    #[test]
    fn buckets_are_cumulative_exact_and_in_seconds() {
        let mut out = String::new();
        // 3 values in [1024, 2048) ns, 1 in [4096, 8192) ns, 1 huge (beyond the last bound).
        histogram(
            &mut out,
            "m",
            "probe=\"p\"",
            &hist(&[1500, 1100, 2000, 5000, 1 << 40]),
            Unit::Nanoseconds,
        );
        assert_eq!(value(&out, "m_bucket{probe=\"p\",le=\"1.024e-6\"}"), 0.0);
        assert_eq!(value(&out, "m_bucket{probe=\"p\",le=\"2.048e-6\"}"), 3.0);
        assert_eq!(value(&out, "m_bucket{probe=\"p\",le=\"4.096e-6\"}"), 3.0);
        assert_eq!(value(&out, "m_bucket{probe=\"p\",le=\"8.192e-6\"}"), 4.0);
        assert_eq!(value(&out, "m_bucket{probe=\"p\",le=\"+Inf\"}"), 5.0);
        assert_eq!(value(&out, "m_count{probe=\"p\"}"), 5.0);
        let sum = value(&out, "m_sum{probe=\"p\"}");
        let truth = (1500 + 1100 + 2000 + 5000 + (1u64 << 40)) as f64 * 1e-9;
        assert!((sum - truth).abs() / truth < 0.125, "{sum} vs {truth}");
        // Cumulative: never decreasing.
        let counts: Vec<f64> = out
            .lines()
            .filter(|l| l.starts_with("m_bucket"))
            .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
            .collect();
        assert_eq!(counts.len(), NS_MAX_POW as usize + 2);
        assert!(counts.windows(2).all(|w| w[0] <= w[1]), "{counts:?}");
    }

    #[test]
    fn waterfall_stage_histograms_carry_a_stage_label() {
        use rdma_trace_common::waterfall::{H_RUNQ, W_WOKEN, WF_NHIST};

        use crate::waterfall::{
            Snapshot,
            model::{Counts, ThreadData},
        };
        let mut counts = Counts::default();
        counts.counters[W_WOKEN as usize] = 3;
        counts.classes[1] = 3;
        let mut hists = vec![Histogram::default(); WF_NHIST as usize];
        hists[H_RUNQ as usize] = hist(&[1500, 1100, 5000]);
        let snap = Snapshot {
            threads: [(
                0,
                ThreadData {
                    tid: 7,
                    tgid: 7,
                    comm: "demo".into(),
                    counts,
                    hists,
                },
            )]
            .into(),
        };
        let mut out = String::new();
        render_waterfall(&mut out, &snap, "h");
        let runq = "rdma_trace_waterfall_stage_seconds_bucket{stage=\"runq\",host=\"h\",le=";
        assert_eq!(value(&out, &format!("{runq}\"2.048e-6\"}}")), 2.0);
        assert_eq!(value(&out, &format!("{runq}\"+Inf\"}}")), 3.0);
        assert_eq!(
            value(
                &out,
                "rdma_trace_waterfall_stage_seconds_count{stage=\"wake\",host=\"h\"}"
            ),
            0.0
        );
        assert_eq!(
            value(
                &out,
                "rdma_trace_waterfall_events_total{kind=\"woken\",host=\"h\"}"
            ),
            3.0
        );
        assert_eq!(
            value(
                &out,
                "rdma_trace_waterfall_placement_total{class=\"SMT sibling\",host=\"h\"}"
            ),
            3.0
        );
        assert_eq!(
            out.matches("# TYPE rdma_trace_waterfall_stage_seconds histogram")
                .count(),
            1
        );
        // Nothing without events.
        let mut empty = String::new();
        render_waterfall(&mut empty, &Snapshot::default(), "h");
        assert!(empty.is_empty());
    }

    #[test]
    fn packet_histograms_stay_unitless() {
        let mut out = String::new();
        histogram(
            &mut out,
            "p",
            "a=\"b\"",
            &hist(&[1, 1, 64, 64, 64]),
            Unit::Packets,
        );
        assert_eq!(value(&out, "p_bucket{a=\"b\",le=\"2e0\"}"), 2.0);
        assert_eq!(
            value(&out, "p_bucket{a=\"b\",le=\"6.4e1\"}"),
            2.0,
            "64 is in [64, 128)"
        );
        assert_eq!(value(&out, "p_bucket{a=\"b\",le=\"1.28e2\"}"), 5.0);
    }

    #[test]
    fn labels_name_driver_devices_and_host() {
        let dev = |name: &str, driver: Option<&str>| RdmaDevice {
            name: name.into(),
            driver: driver.map(str::to_owned),
            parent_netdev: None,
        };
        let l = ProbeLabels::new(
            &[
                dev("rxe1", None),
                dev("rxe0", None),
                dev("mlx5_0", Some("mlx5_core")),
            ],
            "node\"1",
        );
        let find = |n: &str| PROBES.iter().find(|p| p.name == n).unwrap();
        let rxe = l.of(find("rxe_rcv"));
        assert!(rxe.contains("driver=\"rxe\""), "{rxe}");
        assert!(rxe.contains("host=\"node\\\"1\""), "{rxe}");
        let mlx = l.of(find("mlx5_ib_cq_comp"));
        assert!(mlx.contains("device=\"mlx5_0\""), "{mlx}");
        let generic = l.of(find("ib_uverbs_comp_handler"));
        assert!(generic.contains("device=\"mlx5_0,rxe0,rxe1\""), "{generic}");
    }
}

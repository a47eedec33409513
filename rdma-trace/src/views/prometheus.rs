//! The Prometheus view (`rdma-trace export`, `cmd/export.rs`): the probe table's histograms and
//! counters, and the waterfall's, in the Prometheus text format, served over HTTP.
//!
//! The eBPF maps only ever grow, so every series is a counter or a cumulative histogram, as
//! Prometheus wants them. A bucket counts the values less than or equal to its `le`. The eBPF
//! side records whole numbers (nanoseconds, packets) in slots that split each power of two in
//! four, so the bounds are put where slots end: at 2^k − 1 for k = 0 … 36 (nanoseconds, written
//! in seconds: `le="0.000001023"` holds every value up to 1023 ns) and k = 0 … 10 (packets:
//! `le="63"` holds polls of up to 63 packets, a poll of 64 is in `le="127"`). Every bucket count
//! is exact. `_sum` is estimated from the slot midpoints (each within 12.5 % of its values).
//!
//! The HTTP side is hyper's HTTP/1 server, given each connection by our own accept loop on a
//! tokio `TcpListener`: `GET` or `HEAD` `/metrics` (or `/`) answers the text rendered at the
//! last refresh, other paths 404, other methods 405. hyper parses the requests and refuses
//! request heads over [`MAX_REQUEST_HEAD`] with 431. Keep-alive is off: one request per
//! connection, answered with `Connection: close`. The accept loop takes a slot before it
//! accepts, so at most [`MAX_CONNECTIONS`] are served at once (the others wait in the listen
//! backlog). Each connection has [`REQUEST_TIMEOUT`] for its whole request and response,
//! however slowly its bytes come, because hyper's connection future runs under one deadline. A
//! failed accept (out of descriptors) pauses accepting, doubling the pause up to one second,
//! instead of retrying at once.

use std::{
    collections::BTreeSet,
    convert::Infallible,
    fmt::Write as _,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use http_body_util::Full;
use hyper::{
    Method, Request, Response, StatusCode,
    body::Bytes,
    header::{self, HeaderValue},
    server::conn::http1,
    service::service_fn,
};
use hyper_util::rt::TokioIo;
use rdma_trace_common::{C_EVENTS, C_UNMATCHED, slot_bounds};
use tokio::{net::TcpListener, sync::Semaphore};

use crate::{
    bpf::hist::Histogram,
    bpf::loader::{Outcome, ProbeData},
    bpf::session::Session,
    kernel::facts::RdmaDevice,
    kernel::probes::{Driver, ProbeDef, Unit},
};

/// Largest power of two used as a bucket bound, for nanosecond histograms (2^36 ns ≈ 68.7 s).
const NS_MAX_POW: u32 = 36;
/// Largest power of two used as a bucket bound, for packet counts.
const PACKETS_MAX_POW: u32 = 10;
/// Request heads (request line and headers) larger than this are refused with 431.
const MAX_REQUEST_HEAD: usize = 8192;
/// Connections served at once; further ones wait in the listen backlog until one ends.
const MAX_CONNECTIONS: usize = 32;
/// Time a connection has for its whole request and our response.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// What the HTTP side allows (tests use smaller values).
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    connections: usize,
    request_timeout: Duration,
    /// First pause after a failed accept; each further failure in a row doubles it, up to
    /// `backoff_max`.
    backoff_min: Duration,
    backoff_max: Duration,
}

impl Limits {
    pub const DEFAULT: Limits = Limits {
        connections: MAX_CONNECTIONS,
        request_timeout: REQUEST_TIMEOUT,
        backoff_min: Duration::from_millis(10),
        backoff_max: Duration::from_secs(1),
    };
}

/// Aborts a task (the server, and so closes its listener) when dropped.
pub struct AbortOnDrop(pub tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Accepts connections for as long as it runs and has hyper serve each: at most
/// `limits.connections` at once, each within `limits.request_timeout` as a whole. A failed
/// accept (EMFILE, ENFILE, ENOBUFS...) is counted in `accept_errors` and pauses accepting: the
/// pending connection keeps the listener readable, so retrying at once would spin.
pub async fn serve_http(
    listener: TcpListener,
    page: Arc<Mutex<Bytes>>,
    limits: Limits,
    accept_errors: Arc<AtomicU64>,
) {
    // No timer: hyper's own header read timeout stays off, the deadline on each connection
    // below covers its whole exchange.
    let mut http = http1::Builder::new();
    http.keep_alive(false).max_header_size(MAX_REQUEST_HEAD);
    let slots = Arc::new(Semaphore::new(limits.connections));
    let mut pause = Duration::ZERO;
    loop {
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
            return;
        };
        match listener.accept().await {
            Ok((stream, _)) => {
                pause = Duration::ZERO;
                let page = Arc::clone(&page);
                let service = service_fn(move |req| {
                    std::future::ready(Ok::<_, Infallible>(respond(&req, &page)))
                });
                let conn = http.serve_connection(TokioIo::new(stream), service);
                tokio::spawn(async move {
                    // Past the deadline the connection is dropped, and so closed, mid-request
                    // or mid-response.
                    let _ = tokio::time::timeout(limits.request_timeout, conn).await;
                    drop(slot);
                });
            }
            Err(e) => {
                drop(slot);
                accept_errors.fetch_add(1, Ordering::Relaxed);
                pause = (pause * 2).clamp(limits.backoff_min, limits.backoff_max);
                eprintln!(
                    "rdma-trace: accepting a connection: {e} (next try in {} ms)",
                    pause.as_millis()
                );
                tokio::time::sleep(pause).await;
            }
        }
    }
}

/// The response to one request: the page at the last refresh for `GET` or `HEAD` `/metrics`
/// (or `/`; hyper leaves the body out for `HEAD` but keeps its length), 404 for other paths,
/// 405 for other methods.
fn respond<B>(req: &Request<B>, page: &Mutex<Bytes>) -> Response<Full<Bytes>> {
    let readable = matches!(*req.method(), Method::GET | Method::HEAD);
    let (status, kind, body) = match req.uri().path() {
        "/metrics" | "/" if readable => (
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            page.lock().unwrap_or_else(|p| p.into_inner()).clone(),
        ),
        _ if readable => (
            StatusCode::NOT_FOUND,
            "text/plain",
            Bytes::from_static(b"try /metrics\n"),
        ),
        _ => (
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            Bytes::from_static(b"GET /metrics\n"),
        ),
    };
    let mut response = Response::new(Full::new(body));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(kind));
    if status == StatusCode::METHOD_NOT_ALLOWED {
        headers.insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
    }
    response
}

/// The `driver`, `device` and `host` labels of each driver path.
pub struct ProbeLabels {
    pub host: String,
    all: String,
    rxe: String,
    /// Devices of each hardware driver path.
    hardware: Vec<(Driver, String)>,
}

impl ProbeLabels {
    pub fn new(devices: &[RdmaDevice], host: &str) -> Self {
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
            hardware: [Driver::Mlx5, Driver::Irdma, Driver::BnxtRe, Driver::Mana]
                .into_iter()
                .map(|hw| {
                    let mut names: Vec<&str> = devices
                        .iter()
                        .filter(|d| d.hardware() == Some(hw))
                        .map(|d| d.name.as_str())
                        .collect();
                    names.sort_unstable();
                    (hw, names.join(","))
                })
                .collect(),
        }
    }

    /// `probe="..",driver="..",device="..",host=".."`: device lists the RDMA devices the probe's
    /// driver path serves (kernel functions are shared by all devices of a driver).
    fn of(&self, def: &ProbeDef) -> String {
        let (driver, device) = match def.driver {
            Driver::Generic => ("generic", self.all.as_str()),
            Driver::Rxe => ("rxe", self.rxe.as_str()),
            Driver::Network => ("network", ""),
            hw => (
                hw.name(),
                self.hardware
                    .iter()
                    .find(|(d, _)| *d == hw)
                    .map_or("", |(_, names)| names.as_str()),
            ),
        };
        format!(
            "probe=\"{}\",driver=\"{driver}\",device=\"{}\",host=\"{}\"",
            escape(&def.name),
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
pub fn render(
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
    samples(
        &mut out,
        "rdma_trace_probe_attached",
        "gauge",
        "1 when the probe is attached on this host, 0 when it was skipped.",
        probes
            .iter()
            .map(|(def, attached, _)| (labels.of(def), u64::from(*attached))),
    );
    let attached: Vec<_> = probes.iter().filter(|(_, a, _)| *a).collect();
    for (name, help, counter) in [
        (
            "rdma_trace_probe_events_total",
            "Events the probe saw: calls, softirq runs, NAPI polls, interval starts.",
            C_EVENTS,
        ),
        (
            "rdma_trace_probe_unmatched_total",
            "Ends seen without their start (attached mid-call, lost entries).",
            C_UNMATCHED,
        ),
    ] {
        samples(
            &mut out,
            name,
            "counter",
            help,
            attached
                .iter()
                .map(|(def, _, d)| (labels.of(def), d.counters[counter as usize])),
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

/// An `le` bound for whole value `v`: packets as they are, nanoseconds as exact decimal seconds
/// (`1023` → `0.000001023`), never rounded through a float.
fn le_value(v: u64, unit: Unit) -> String {
    match unit {
        Unit::Packets => v.to_string(),
        Unit::Nanoseconds => {
            let (s, ns) = (v / 1_000_000_000, v % 1_000_000_000);
            if ns == 0 {
                s.to_string()
            } else {
                format!("{s}.{ns:09}").trim_end_matches('0').to_owned()
            }
        }
    }
}

/// The completion waterfall of every thread that read completion events: a histogram per
/// stage (`stage` label: driver, wake, runq, read, awake, total), events per kind and CPU
/// placement class.
pub fn render_waterfall(
    out: &mut String,
    snap: &crate::waterfall::Snapshot,
    host: &str,
    series: &mut CqSeries,
) {
    use rdma_trace_common::waterfall::{W_AWAKE, W_AWAKE_RUNNABLE_SUM, W_WOKEN};

    use crate::waterfall::{model::STAGES, topology::CLASS_NAMES};
    let Some(t) = snap.merged_data() else {
        return;
    };
    let host = escape(host);
    samples(
        out,
        "rdma_trace_waterfall_events_total",
        "counter",
        "Completion events read from completion channels, by whether the handler woke the reader.",
        [("woken", W_WOKEN), ("awake", W_AWAKE)]
            .map(|(kind, c)| (format!("kind=\"{kind}\",host=\"{host}\""), t.counts.get(c))),
    );
    samples(
        out,
        "rdma_trace_waterfall_placement_total",
        "counter",
        "Completion events by CPU placement of the handler against the reader.",
        CLASS_NAMES
            .iter()
            .zip(t.counts.classes)
            .map(|(name, n)| (format!("class=\"{name}\",host=\"{host}\""), n)),
    );
    let name = "rdma_trace_waterfall_awake_runnable_seconds_total";
    family(
        out,
        name,
        "counter",
        "Of the awake stage (events whose reader was already awake), the time the readers were runnable but off a CPU (woken or preempted, not yet switched in).",
    );
    let _ = writeln!(
        out,
        "{name}{{host=\"{host}\"}} {}",
        le_value(t.counts.get(W_AWAKE_RUNNABLE_SUM), Unit::Nanoseconds)
    );
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
    render_cqs(out, snap, &host, series);
}

/// Series of the per-CQ families at most, `cq="other"` included: the label's cardinality
/// stays bounded whatever the machine runs.
pub const CQ_SERIES: usize = 32;

/// The CQs that have a series of their own, for as long as `export` runs: the first
/// [`CQ_SERIES`] − 1 seen (the busiest first among those seen at once). A CQ never moves
/// between its own series and `cq="other"`, so every series is a counter that only grows.
#[derive(Debug, Default)]
pub struct CqSeries(std::collections::BTreeSet<(String, String)>);

/// The waterfall's events per CQ (`device` and `cq` labels: `rdma res show cq`'s `dev` and
/// `cqn`), every process's summed, and their summed T1→T4.
fn render_cqs(
    out: &mut String,
    snap: &crate::waterfall::Snapshot,
    host: &str,
    series: &mut CqSeries,
) {
    let mut by_cq: std::collections::BTreeMap<(String, String), (u64, u64)> =
        std::collections::BTreeMap::new();
    for c in snap.cqs.values() {
        let device = crate::bpf::c_string(&c.device);
        let key = (
            if device.is_empty() {
                "?".to_owned()
            } else {
                escape(&device)
            },
            c.id().map_or("?".to_owned(), |id| id.to_string()),
        );
        let e = by_cq.entry(key).or_default();
        e.0 += c.events;
        e.1 += c.sums[rdma_trace_common::waterfall::CQ_SUMS - 1];
    }
    if by_cq.is_empty() {
        return;
    }
    let mut seen: Vec<((String, String), (u64, u64))> = by_cq.into_iter().collect();
    seen.sort_by(|a, b| b.1.0.cmp(&a.1.0).then_with(|| a.0.cmp(&b.0)));
    for (k, _) in &seen {
        if series.0.len() < CQ_SERIES - 1 {
            series.0.insert(k.clone());
        }
    }
    let (mut rows, rest): (Vec<_>, Vec<_>) =
        seen.into_iter().partition(|(k, _)| series.0.contains(k));
    rows.sort();
    if !rest.is_empty() {
        let other = rest
            .iter()
            .fold((0, 0), |(e, t), (_, (e2, t2))| (e + e2, t + t2));
        rows.push((("other".to_owned(), "other".to_owned()), other));
    }
    let label = |(device, cq): &(String, String)| {
        format!("device=\"{device}\",cq=\"{cq}\",host=\"{host}\"")
    };
    samples(
        out,
        "rdma_trace_cq_events_total",
        "counter",
        "Completion events read from completion channels, by CQ (device, cqn as rdma res show cq prints them; CQs beyond the first 31 seen summed as cq=\"other\").",
        rows.iter().map(|(k, (events, _))| (label(k), *events)),
    );
    let name = "rdma_trace_cq_event_seconds_total";
    family(
        out,
        name,
        "counter",
        "Summed handler → read time (T1→T4) of those events, by CQ.",
    );
    for (k, (_, total)) in &rows {
        let _ = writeln!(
            out,
            "{name}{{{}}} {}",
            label(k),
            le_value(*total, Unit::Nanoseconds)
        );
    }
}

/// Every loss counter (`what` label: the key of the JSON's `losses`), and each program's
/// skipped runs where the kernel reports them.
pub fn render_losses(out: &mut String, losses: &crate::model::losses::Losses, host: &str) {
    let host = escape(host);
    samples(
        out,
        "rdma_trace_lost_total",
        "counter",
        "Data the tracing programs could not record, by what (see docs/json.md, losses); recursion_misses sums the program runs the kernel skipped.",
        losses
            .items()
            .into_iter()
            .map(|(what, n, _)| (format!("what=\"{what}\",host=\"{host}\""), n)),
    );
    for (name, help, counts) in [
        (
            "rdma_trace_program_recursion_misses_total",
            "Runs of a program the kernel skipped because a BPF program was already running on the CPU (programs with misses only).",
            &losses.recursion_misses,
        ),
        (
            "rdma_trace_program_kprobe_misses_total",
            "Misses of the kprobes and kretprobes that run a program, as the kernel counts them (Linux 6.7; programs with misses only).",
            &losses.kprobe_misses,
        ),
    ] {
        if let Some(by_program) = counts {
            samples(
                out,
                name,
                "counter",
                help,
                by_program
                    .iter()
                    .map(|(p, n)| (format!("program=\"{}\",host=\"{host}\"", escape(p)), *n)),
            );
        }
    }
}

fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// A family of plain samples: its header, then `name{labels} value` for each row.
fn samples(
    out: &mut String,
    name: &str,
    kind: &str,
    help: &str,
    rows: impl IntoIterator<Item = (String, u64)>,
) {
    family(out, name, kind, help);
    for (labels, value) in rows {
        let _ = writeln!(out, "{name}{{{labels}}} {value}");
    }
}

/// `_bucket` lines at 2^k − 1 (the last whole value below each power of two, where the slots
/// end), `+Inf`, `_sum` (slot midpoints) and `_count`.
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
        let end = 1u64 << k;
        // Slots hold whole values in [lo, hi) and never straddle a power of two: the slots
        // with hi <= 2^k hold exactly the values <= 2^k - 1.
        while next < slots.len() && slot_bounds(next as u32).1 <= end {
            cumulative += slots[next];
            next += 1;
        }
        let le = le_value(end - 1, unit);
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{le}\"}} {cumulative}");
    }
    let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {total}");
    let _ = writeln!(out, "{name}_sum{{{labels}}} {}", h.sum_estimate() * scale);
    let _ = writeln!(out, "{name}_count{{{labels}}} {total}");
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use tokio::{
        io::{AsyncReadExt as _, AsyncWriteExt as _},
        net::TcpStream,
    };

    use super::*;
    use crate::kernel::probes::PROBES;

    fn hist(values: &[u64]) -> Histogram {
        Histogram::of_values(values)
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

    /// An `le` back to a whole value of the unit, exactly (no float on the way).
    fn le_whole(le: &str, unit: Unit) -> u64 {
        match unit {
            Unit::Packets => le.parse().unwrap(),
            Unit::Nanoseconds => {
                let (s, frac) = le.split_once('.').unwrap_or((le, ""));
                assert!(frac.len() <= 9, "{le}");
                s.parse::<u64>().unwrap() * 1_000_000_000
                    + format!("{frac:0<9}").parse::<u64>().unwrap()
            }
        }
    }

    /// `(le, count)` of every `_bucket` line but `+Inf`, in order.
    fn buckets(text: &str) -> Vec<(String, u64)> {
        text.lines()
            .filter(|l| l.contains("_bucket{") && !l.contains("+Inf"))
            .map(|l| {
                let le = l.split("le=\"").nth(1).unwrap().split('"').next().unwrap();
                (
                    le.to_owned(),
                    l.rsplit(' ').next().unwrap().parse().unwrap(),
                )
            })
            .collect()
    }

    #[test]
    fn every_bucket_counts_exactly_the_values_up_to_its_le() {
        for (unit, max_pow) in [
            (Unit::Nanoseconds, NS_MAX_POW),
            (Unit::Packets, PACKETS_MAX_POW),
        ] {
            // On every edge 2^k - 1, one below it, and the two above it (2^k, 2^k + 1), up to
            // past the last bound.
            let values: Vec<u64> = (0..=max_pow + 1)
                .flat_map(|k| {
                    let edge = (1u64 << k) - 1;
                    [edge.saturating_sub(1), edge, edge + 1, edge + 2]
                })
                .collect();
            let mut out = String::new();
            histogram(&mut out, "m", "p=\"x\"", &hist(&values), unit);
            let b = buckets(&out);
            assert_eq!(b.len(), max_pow as usize + 1, "{out}");
            for (k, (le, count)) in b.iter().enumerate() {
                let bound = le_whole(le, unit);
                assert_eq!(bound, (1u64 << k) - 1, "le={le} ({unit:?})");
                let want = values.iter().filter(|&&v| v <= bound).count() as u64;
                assert_eq!(*count, want, "le={le} ({unit:?}): values {values:?}");
            }
            let n = values.len() as f64;
            assert_eq!(value(&out, "m_bucket{p=\"x\",le=\"+Inf\"}"), n);
            assert_eq!(value(&out, "m_count{p=\"x\"}"), n);
        }
    }

    #[test]
    fn buckets_are_cumulative_and_in_seconds() {
        let mut out = String::new();
        // 3 values in [1024, 2048) ns, 1 in [4096, 8192) ns, 1 huge (beyond the last bound).
        histogram(
            &mut out,
            "m",
            "probe=\"p\"",
            &hist(&[1500, 1100, 2000, 5000, 1 << 40]),
            Unit::Nanoseconds,
        );
        assert_eq!(value(&out, "m_bucket{probe=\"p\",le=\"0.000001023\"}"), 0.0);
        assert_eq!(value(&out, "m_bucket{probe=\"p\",le=\"0.000002047\"}"), 3.0);
        assert_eq!(value(&out, "m_bucket{probe=\"p\",le=\"0.000004095\"}"), 3.0);
        assert_eq!(value(&out, "m_bucket{probe=\"p\",le=\"0.000008191\"}"), 4.0);
        assert_eq!(
            value(&out, "m_bucket{probe=\"p\",le=\"68.719476735\"}"),
            4.0
        );
        assert_eq!(value(&out, "m_bucket{probe=\"p\",le=\"+Inf\"}"), 5.0);
        assert_eq!(value(&out, "m_count{probe=\"p\"}"), 5.0);
        let sum = value(&out, "m_sum{probe=\"p\"}");
        let truth = (1500 + 1100 + 2000 + 5000 + (1u64 << 40)) as f64 * 1e-9;
        assert!((sum - truth).abs() / truth < 0.125, "{sum} vs {truth}");
        // Cumulative: never decreasing; bounds increasing and parseable as floats.
        let b = buckets(&out);
        assert!(b.windows(2).all(|w| w[0].1 <= w[1].1), "{b:?}");
        let les: Vec<f64> = b.iter().map(|(le, _)| le.parse().unwrap()).collect();
        assert!(les.windows(2).all(|w| w[0] < w[1]), "{les:?}");
        assert_eq!(le_value(1_000_000_000, Unit::Nanoseconds), "1");
        assert_eq!(le_value(0, Unit::Nanoseconds), "0");
    }

    /// Every loss counter is served, zeros included (a counter must exist before it grows),
    /// under the key the JSON uses; the per-program family lists only programs with misses.
    #[test]
    fn losses_are_counters_by_what_and_program() {
        use std::collections::BTreeMap;

        use crate::model::losses::Losses;
        let l = Losses {
            threads_without_slot: 4,
            queue_overflow: 17,
            recursion_misses: Some(BTreeMap::from([("wf_sched_switch".to_owned(), 2)])),
            ..Losses::default()
        };
        let mut out = String::new();
        render_losses(&mut out, &l, "h");
        assert_eq!(
            value(
                &out,
                "rdma_trace_lost_total{what=\"threads_without_slot\",host=\"h\"}"
            ),
            4.0
        );
        assert_eq!(
            value(
                &out,
                "rdma_trace_lost_total{what=\"queue_overflow\",host=\"h\"}"
            ),
            17.0
        );
        assert_eq!(
            value(
                &out,
                "rdma_trace_lost_total{what=\"recursion_misses\",host=\"h\"}"
            ),
            2.0
        );
        assert_eq!(
            value(
                &out,
                "rdma_trace_lost_total{what=\"samples_dropped\",host=\"h\"}"
            ),
            0.0
        );
        assert_eq!(
            out.matches("rdma_trace_lost_total{").count(),
            l.items().len()
        );
        assert_eq!(
            value(
                &out,
                "rdma_trace_program_recursion_misses_total{program=\"wf_sched_switch\",host=\"h\"}"
            ),
            2.0
        );
        assert!(
            !out.contains("rdma_trace_program_kprobe_misses_total"),
            "{out}"
        );
        let mut unreported = String::new();
        render_losses(&mut unreported, &Losses::default(), "h");
        assert!(
            !unreported.contains("rdma_trace_program_recursion_misses_total"),
            "{unreported}"
        );
    }

    #[test]
    fn waterfall_stage_histograms_carry_a_stage_label() {
        use rdma_trace_common::waterfall::{H_RUNQ, W_AWAKE_RUNNABLE_SUM, W_WOKEN, WF_NHIST};

        use crate::waterfall::{
            Snapshot,
            model::{Counts, ThreadData},
        };
        let mut counts = Counts::default();
        counts.counters[W_WOKEN as usize] = 3;
        counts.counters[W_AWAKE_RUNNABLE_SUM as usize] = 1_500_000_250;
        counts.classes[1] = 3;
        let mut hists = vec![Histogram::default(); WF_NHIST as usize];
        hists[H_RUNQ as usize] = hist(&[1500, 1100, 5000]);
        let snap = Snapshot {
            cqs: Default::default(),
            threads: [(
                0,
                ThreadData {
                    tid: 7,
                    tgid: 7,
                    comm: "demo".into(),
                    counts,
                    hists,
                    cpus: Default::default(),
                },
            )]
            .into(),
        };
        let mut out = String::new();
        render_waterfall(&mut out, &snap, "h", &mut CqSeries::default());
        let runq = "rdma_trace_waterfall_stage_seconds_bucket{stage=\"runq\",host=\"h\",le=";
        assert_eq!(value(&out, &format!("{runq}\"0.000002047\"}}")), 2.0);
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
        assert!(
            out.contains(
                "rdma_trace_waterfall_awake_runnable_seconds_total{host=\"h\"} 1.50000025\n"
            ),
            "{out}"
        );
        assert_eq!(
            out.matches("# TYPE rdma_trace_waterfall_stage_seconds histogram")
                .count(),
            1
        );
        assert!(
            !out.contains("rdma_trace_cq_events_total"),
            "no CQ rows: {out}"
        );
        // Per CQ: a series each, the busiest first; past CQ_SERIES the rest are summed.
        let mut snap = snap;
        for i in 0..CQ_SERIES as u32 + 5 {
            let mut c = crate::waterfall::model::CqData {
                res_id: i,
                events: 100 + u64::from(i),
                ..Default::default()
            };
            c.sums[rdma_trace_common::waterfall::CQ_SUMS - 1] = 1_000 * c.events;
            c.device[..4].copy_from_slice(b"rxe0");
            snap.cqs.insert((7, 0x1000 + u64::from(i)), c);
        }
        let mut kept = CqSeries::default();
        let mut out = String::new();
        render_waterfall(&mut out, &snap, "h", &mut kept);
        let series = out
            .lines()
            .filter(|l| l.starts_with("rdma_trace_cq_events_total{"))
            .count();
        assert_eq!(series, CQ_SERIES, "{out}");
        let busiest = CQ_SERIES as u32 + 4;
        assert_eq!(
            value(
                &out,
                &format!(
                    "rdma_trace_cq_events_total{{device=\"rxe0\",cq=\"{busiest}\",host=\"h\"}}"
                )
            ),
            f64::from(100 + busiest)
        );
        // CQs 0..=5 are the six least busy: summed.
        let other: u64 = (0..6).map(|i| 100 + i).sum();
        assert_eq!(
            value(
                &out,
                "rdma_trace_cq_events_total{device=\"other\",cq=\"other\",host=\"h\"}"
            ),
            other as f64
        );
        assert_eq!(
            value(
                &out,
                "rdma_trace_cq_event_seconds_total{device=\"other\",cq=\"other\",host=\"h\"}"
            ),
            other as f64 * 1e-6
        );
        // A CQ in "other" stays there when it gets busy: every series only grows.
        snap.cqs.get_mut(&(7, 0x1000)).unwrap().events += 10_000;
        let mut later = String::new();
        render_waterfall(&mut later, &snap, "h", &mut kept);
        assert_eq!(
            value(
                &later,
                "rdma_trace_cq_events_total{device=\"other\",cq=\"other\",host=\"h\"}"
            ),
            (other + 10_000) as f64
        );
        assert!(!later.contains("cq=\"0\""), "{later}");
        // Nothing without events.
        let mut empty = String::new();
        render_waterfall(
            &mut empty,
            &Snapshot::default(),
            "h",
            &mut CqSeries::default(),
        );
        assert!(empty.is_empty());
    }

    #[test]
    fn a_poll_of_64_packets_is_not_in_le_63() {
        let mut out = String::new();
        histogram(
            &mut out,
            "p",
            "a=\"b\"",
            &hist(&[1, 1, 63, 64, 64, 64]),
            Unit::Packets,
        );
        assert_eq!(value(&out, "p_bucket{a=\"b\",le=\"1\"}"), 2.0);
        assert_eq!(value(&out, "p_bucket{a=\"b\",le=\"63\"}"), 3.0, "64 > 63");
        assert_eq!(value(&out, "p_bucket{a=\"b\",le=\"127\"}"), 6.0);
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

    // ---- the HTTP side, on a local listener

    const GET: &[u8] = b"GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n";

    /// A server on 127.0.0.1 serving the page "hello"; returns its address and its counter of
    /// failed accepts.
    async fn start(limits: Limits) -> (SocketAddr, Arc<AtomicU64>, AbortOnDrop) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let errors = Arc::new(AtomicU64::new(0));
        let page = Arc::new(Mutex::new(Bytes::from_static(b"hello\n")));
        let server = tokio::spawn(serve_http(listener, page, limits, Arc::clone(&errors)));
        (addr, errors, AbortOnDrop(server))
    }

    async fn response(s: &mut TcpStream, within: Duration) -> Option<String> {
        let mut buf = Vec::new();
        tokio::time::timeout(within, s.read_to_end(&mut buf))
            .await
            .ok()
            .map(|r| {
                r.unwrap();
                String::from_utf8_lossy(&buf).into_owned()
            })
    }

    /// Sends `request` on a new connection and reads until the server closes it (or resets it:
    /// what came before is kept).
    async fn exchange(addr: SocketAddr, request: &[u8]) -> String {
        let mut s = TcpStream::connect(addr).await.unwrap();
        // A server refusing the request may close before it has all of it.
        let _ = s.write_all(request).await;
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        let read = async {
            while let Ok(n @ 1..) = s.read(&mut chunk).await {
                buf.extend_from_slice(&chunk[..n]);
            }
        };
        tokio::time::timeout(Duration::from_secs(10), read)
            .await
            .expect("the server closed the connection");
        String::from_utf8_lossy(&buf).into_owned()
    }

    /// The value of header `name` in response `r` (names in any case).
    fn header_of<'a>(r: &'a str, name: &str) -> Option<&'a str> {
        let (head, _) = r.split_once("\r\n\r\n")?;
        head.lines().skip(1).find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }

    #[tokio::test]
    async fn metrics_and_root_answer_the_page_and_the_rest_is_refused() {
        let (addr, _, _server) = start(Limits::DEFAULT).await;
        for path in ["/metrics", "/", "/metrics?x=1"] {
            let r = exchange(
                addr,
                format!("GET {path} HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes(),
            )
            .await;
            assert!(r.starts_with("HTTP/1.1 200 OK\r\n"), "{path}: {r}");
            assert!(r.ends_with("\r\n\r\nhello\n"), "{path}: {r}");
            assert_eq!(
                header_of(&r, "content-type"),
                Some("text/plain; version=0.0.4; charset=utf-8"),
                "{r}"
            );
            assert_eq!(header_of(&r, "content-length"), Some("6"), "{r}");
            assert_eq!(header_of(&r, "connection"), Some("close"), "{r}");
        }
        // HEAD: the GET's headers, no body.
        let r = exchange(addr, b"HEAD /metrics HTTP/1.1\r\nHost: t\r\n\r\n").await;
        assert!(r.starts_with("HTTP/1.1 200 OK\r\n"), "{r}");
        assert!(r.ends_with("\r\n\r\n"), "a body after HEAD: {r}");
        assert_eq!(header_of(&r, "content-length"), Some("6"), "{r}");
        // HTTP/1.0 clients are served too.
        let r = exchange(addr, b"GET /metrics HTTP/1.0\r\n\r\n").await;
        assert!(
            r.starts_with("HTTP/1.0 200 OK\r\n") && r.ends_with("hello\n"),
            "{r}"
        );
        let r = exchange(addr, b"GET /metricsx HTTP/1.1\r\nHost: t\r\n\r\n").await;
        assert!(r.starts_with("HTTP/1.1 404 Not Found\r\n"), "{r}");
        assert!(r.ends_with("try /metrics\n"), "{r}");
        let r = exchange(
            addr,
            b"POST /metrics HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\nhi",
        )
        .await;
        assert!(r.starts_with("HTTP/1.1 405 Method Not Allowed\r\n"), "{r}");
        assert_eq!(header_of(&r, "allow"), Some("GET, HEAD"), "{r}");
        let r = exchange(addr, b"not http at all\r\n\r\n").await;
        assert!(r.is_empty() || r.starts_with("HTTP/1.1 400"), "{r}");
    }

    #[tokio::test]
    async fn a_request_head_over_the_limit_is_refused() {
        let (addr, _, _server) = start(Limits::DEFAULT).await;
        let with_cookie = |len: usize| {
            format!(
                "GET /metrics HTTP/1.1\r\nHost: t\r\nCookie: {}\r\n\r\n",
                "c".repeat(len)
            )
        };
        let r = exchange(addr, with_cookie(MAX_REQUEST_HEAD / 2).as_bytes()).await;
        assert!(r.starts_with("HTTP/1.1 200 OK\r\n"), "{r}");
        // Well within what hyper would take by default (its read buffer grows to ~400 KiB).
        let r = exchange(addr, with_cookie(64 * 1024).as_bytes()).await;
        // The server may close on the unread rest of the request, resetting the connection
        // before its 431 is read: then nothing came.
        assert!(
            r.is_empty() || r.starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\n"),
            "{r}"
        );
    }

    #[tokio::test]
    async fn connections_beyond_the_cap_wait_for_a_free_slot() {
        let (addr, _, _server) = start(Limits {
            connections: 2,
            request_timeout: Duration::from_secs(60),
            ..Limits::DEFAULT
        })
        .await;
        // Two idle connections take both slots (they are accepted first: the backlog is FIFO).
        let idle1 = TcpStream::connect(addr).await.unwrap();
        let _idle2 = TcpStream::connect(addr).await.unwrap();
        let mut third = TcpStream::connect(addr).await.unwrap();
        third.write_all(GET).await.unwrap();
        assert_eq!(
            response(&mut third, Duration::from_millis(500)).await,
            None,
            "a third connection was served while two held both slots"
        );
        drop(idle1);
        let r = response(&mut third, Duration::from_secs(10))
            .await
            .expect("served once a slot was free");
        assert!(
            r.starts_with("HTTP/1.1 200 OK") && r.ends_with("hello\n"),
            "{r}"
        );
    }

    #[tokio::test]
    async fn a_slow_drip_request_is_cut_off_as_a_whole() {
        let (addr, _, _server) = start(Limits {
            request_timeout: Duration::from_secs(1),
            ..Limits::DEFAULT
        })
        .await;
        let (mut rx, mut tx) = TcpStream::connect(addr).await.unwrap().into_split();
        let start = std::time::Instant::now();
        // One byte every 50 ms, each well within any per-read timeout, and never the end of the
        // headers: only a deadline on the whole request ends it.
        let drip = async {
            for &b in GET[..GET.len() - 2].iter().cycle() {
                if tx.write_all(&[b]).await.is_err() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        let mut buf = [0u8; 64];
        tokio::select! {
            r = rx.read(&mut buf) => assert!(matches!(r, Ok(0) | Err(_)), "{r:?}"),
            _ = drip => {}
            _ = tokio::time::sleep(Duration::from_secs(10)) => panic!("still open after 10 s"),
        }
        let took = start.elapsed();
        assert!(took >= Duration::from_millis(900), "closed after {took:?}");
        assert!(took < Duration::from_secs(5), "closed after {took:?}");
    }

    /// Set by the EMFILE test for the copy of this test binary it runs.
    const EMFILE_CHILD: &str = "RDMA_TRACE_TEST_EMFILE_CHILD";

    #[test]
    fn out_of_descriptors_pauses_accepting_instead_of_spinning() {
        if std::env::var_os(EMFILE_CHILD).is_none() {
            // RLIMIT_NOFILE is per process: lower it in a copy of this binary running only
            // this test, not under the other tests running in parallel here.
            let out = std::process::Command::new(std::env::current_exe().unwrap())
                .args([
                    "--exact",
                    "views::prometheus::tests::out_of_descriptors_pauses_accepting_instead_of_spinning",
                    "--test-threads=1",
                    "--nocapture",
                ])
                .env(EMFILE_CHILD, "1")
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr);
            // The last lines say why (a spinning loop logs a line per failed accept).
            let tail: Vec<&str> = text.lines().rev().take(15).collect();
            assert!(out.status.success(), "child failed:\n{}", tail.join("\n"));
            assert!(text.contains("1 passed"), "the child ran no test: {text}");
            return;
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let (addr, errors, _server) = start(Limits::DEFAULT).await;
            let mut client = TcpStream::connect(addr).await.unwrap();
            client.write_all(GET).await.unwrap();
            // Use up the descriptors: a soft limit just above what is open, then /dev/null.
            let open = std::fs::read_dir("/proc/self/fd").unwrap().count() as u64;
            let mut lim = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            // SAFETY: getrlimit/setrlimit read and write the rlimit struct passed.
            assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
            lim.rlim_cur = open + 16;
            // SAFETY: as above; lowering the soft limit needs no privilege.
            assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) }, 0);
            let mut fillers = Vec::new();
            loop {
                match std::fs::File::open("/dev/null") {
                    Ok(f) => fillers.push(f),
                    Err(e) => {
                        assert_eq!(e.raw_os_error(), Some(libc::EMFILE), "{e}");
                        break;
                    }
                }
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
            let failed = errors.load(Ordering::Relaxed);
            // 10 + 20 + 40 + ... ms: 7 tries in the first second; a spinning loop makes
            // hundreds of thousands.
            assert!(
                failed >= 1,
                "accept never failed: the test did not run out of fds"
            );
            assert!(failed <= 12, "{failed} failed accepts in 1 s: spinning");
            drop(fillers);
            let r = response(&mut client, Duration::from_secs(10))
                .await
                .expect("served once descriptors were free again");
            assert!(r.starts_with("HTTP/1.1 200 OK"), "{r}");
        });
    }
}

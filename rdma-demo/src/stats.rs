//! Latency samples and the results block (the seed's summary plus perftest's columns).

use std::fmt::Write as _;
use std::time::Duration;

use serde::Serialize;

/// perftest's latency columns, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Summary {
    pub count: usize,
    pub t_min: f64,
    pub t_max: f64,
    /// The median, as perftest's t_typical.
    pub t_typical: f64,
    pub t_avg: f64,
    pub t_stdev: f64,
    pub p99: f64,
    pub p99_9: f64,
}

/// Summarises samples (nanoseconds); `None` if there are none. Percentiles by nearest rank.
pub fn summarize(samples_ns: &[u64]) -> Option<Summary> {
    if samples_ns.is_empty() {
        return None;
    }
    let mut s = samples_ns.to_vec();
    s.sort_unstable();
    let n = s.len();
    let us = |ns: u64| ns as f64 / 1000.0;
    let avg = s.iter().map(|&x| x as f64).sum::<f64>() / n as f64;
    let var = s.iter().map(|&x| (x as f64 - avg).powi(2)).sum::<f64>() / n as f64;
    let rank = |p: f64| {
        let r = (p * n as f64).ceil() as usize;
        s[r.clamp(1, n) - 1]
    };
    Some(Summary {
        count: n,
        t_min: us(s[0]),
        t_max: us(s[n - 1]),
        t_typical: us(s[n / 2]),
        t_avg: avg / 1000.0,
        t_stdev: var.sqrt() / 1000.0,
        p99: us(rank(0.99)),
        p99_9: us(rank(0.999)),
    })
}

impl Summary {
    /// Every figure divided by two (one-way latency from round trips, as perftest's `*_lat`).
    pub fn halved(&self) -> Summary {
        Summary {
            count: self.count,
            t_min: self.t_min / 2.0,
            t_max: self.t_max / 2.0,
            t_typical: self.t_typical / 2.0,
            t_avg: self.t_avg / 2.0,
            t_stdev: self.t_stdev / 2.0,
            p99: self.p99 / 2.0,
            p99_9: self.p99_9 / 2.0,
        }
    }
}

/// perftest's table header.
pub const TABLE_HEADER: &str = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec]";

/// The one-way table (round trip / 2, as perftest tool `tool` reports it) and the round-trip
/// table of a ping-pong of `bytes`-byte messages.
pub fn one_way_and_round_trip(bytes: u64, one_way: &Summary, rtt: &Summary, tool: &str) -> String {
    let one_way = table(
        &format!("one-way latency = round trip / 2 (as {tool})"),
        bytes,
        one_way,
    );
    one_way + &table("round trip", bytes, rtt)
}

/// A ping-pong's latencies: each round trip, and half of it as perftest's `*_lat` tools report
/// one-way latency; both `None` on the side that does not time them (the server).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct RoundTrips {
    pub round_trip_us: Option<Summary>,
    pub one_way_us: Option<Summary>,
}

impl RoundTrips {
    /// From round-trip samples (nanoseconds).
    pub fn new(samples_ns: &[u64]) -> Self {
        let rtt = summarize(samples_ns);
        RoundTrips {
            one_way_us: rtt.as_ref().map(Summary::halved),
            round_trip_us: rtt,
        }
    }

    /// The one-way and round-trip tables of `bytes`-byte messages, as perftest tool `tool`
    /// prints them; nothing without samples.
    pub fn render(&self, bytes: u64, tool: &str) -> String {
        match (&self.one_way_us, &self.round_trip_us) {
            (Some(one_way), Some(rtt)) => one_way_and_round_trip(bytes, one_way, rtt, tool),
            _ => String::new(),
        }
    }
}

/// A titled perftest table of one row: `--- {title} ---`, the header and the row.
pub fn table(title: &str, bytes: u64, s: &Summary) -> String {
    format!("--- {title} ---\n{TABLE_HEADER}\n{}\n", table_row(bytes, s))
}

/// One perftest row.
pub fn table_row(bytes: u64, s: &Summary) -> String {
    format!(
        " {bytes:<7} {:<10}  {:<13.2}  {:<13.2}  {:<15.2}  {:<13.2}  {:<15.2}  {:<21.2}  {:<.2}",
        s.count, s.t_min, s.t_max, s.t_typical, s.t_avg, s.t_stdev, s.p99, s.p99_9
    )
}

/// The seed's block.
#[derive(Debug, Clone, Serialize)]
pub struct Totals {
    pub total_time_ms: f64,
    /// Per iteration (a round trip for ping-pong).
    pub avg_latency_us: f64,
    pub total_wait_cq_ms: f64,
    pub messages_sent: u64,
    pub messages_received: u64,
    pub throughput_msg_per_sec: f64,
}

impl Totals {
    pub fn new(total: Duration, iterations: u64, wait: Duration, sent: u64, received: u64) -> Self {
        let secs = total.as_secs_f64();
        Totals {
            total_time_ms: secs * 1e3,
            avg_latency_us: if iterations == 0 {
                0.0
            } else {
                secs * 1e6 / iterations as f64
            },
            total_wait_cq_ms: wait.as_secs_f64() * 1e3,
            messages_sent: sent,
            messages_received: received,
            throughput_msg_per_sec: if secs > 0.0 {
                (sent + received) as f64 / secs
            } else {
                0.0
            },
        }
    }

    /// A ping-pong's totals: `iterations` round trips of one message each way, in `total`,
    /// of which `wait` waiting for completions.
    pub fn ping_pong(total: Duration, iterations: u32, wait: Duration) -> Self {
        let n = u64::from(iterations);
        Totals::new(total, n, wait, n, n)
    }

    /// A one-sided client's totals: `iterations` in `total`, of which `wait` waiting for
    /// completions; `ops` requests that each got a response, and the final SEND that tells
    /// the server it is done (sent only).
    pub fn one_sided_client(total: Duration, iterations: u32, wait: Duration, ops: u64) -> Self {
        Totals::new(total, u64::from(iterations), wait, ops + 1, ops)
    }

    /// `=== Results ===` and its lines; `latency_note` says what a latency is.
    pub fn render(&self, latency_note: &str) -> String {
        let mut out = String::from("=== Results ===\n");
        let _ = writeln!(out, "Total time:     {:.3} ms", self.total_time_ms);
        let _ = writeln!(
            out,
            "Avg latency:    {:.3} us ({latency_note})",
            self.avg_latency_us
        );
        let _ = writeln!(out, "Total wait/CQ:  {:.3} ms", self.total_wait_cq_ms);
        let _ = writeln!(
            out,
            "Messages:       {} sent, {} received",
            self.messages_sent, self.messages_received
        );
        let _ = writeln!(
            out,
            "Throughput:     {:.2} msg/sec",
            self.throughput_msg_per_sec
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::assert_contains_all;

    #[test]
    fn one_way_table_then_round_trip_table_each_with_its_header() {
        let rtt = summarize(&[2_000, 4_000, 6_000]).unwrap();
        let text = one_way_and_round_trip(64, &rtt.halved(), &rtt, "ib_write_lat");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 6, "{text}");
        assert_eq!(
            lines[0],
            "--- one-way latency = round trip / 2 (as ib_write_lat) ---"
        );
        assert_eq!(lines[1], TABLE_HEADER);
        assert_eq!(lines[2], table_row(64, &rtt.halved()));
        assert_eq!(lines[3], "--- round trip ---");
        assert_eq!(lines[4], TABLE_HEADER);
        assert_eq!(lines[5], table_row(64, &rtt));
        assert!(text.ends_with('\n'));
    }

    #[test]
    fn summary_of_known_samples() {
        let ns: Vec<u64> = (1..=1000).map(|i| i * 1000).collect();
        let s = summarize(&ns).unwrap();
        assert_eq!(s.count, 1000);
        assert_eq!(s.t_min, 1.0);
        assert_eq!(s.t_max, 1000.0);
        assert_eq!(s.t_typical, 501.0);
        assert!((s.t_avg - 500.5).abs() < 1e-9);
        assert!((s.t_stdev - 288.6749).abs() < 1e-3, "{}", s.t_stdev);
        assert_eq!(s.p99, 990.0);
        assert_eq!(s.p99_9, 999.0);
        let h = s.halved();
        assert_eq!(h.t_min, 0.5);
        assert_eq!(h.count, 1000);
        assert!(summarize(&[]).is_none());
        let one = summarize(&[2500]).unwrap();
        assert_eq!((one.t_min, one.p99_9, one.t_stdev), (2.5, 2.5, 0.0));
    }

    #[test]
    fn results_block() {
        let t = Totals::new(
            Duration::from_millis(100),
            1000,
            Duration::from_millis(90),
            1000,
            1000,
        );
        let text = t.render("round trip");
        assert!(
            text.starts_with("=== Results ===\nTotal time:     100.000 ms\n"),
            "{text}"
        );
        assert_contains_all(
            &text,
            &[
                "Avg latency:    100.000 us (round trip)\n",
                "Total wait/CQ:  90.000 ms\n",
                "Messages:       1000 sent, 1000 received\n",
                "Throughput:     20000.00 msg/sec\n",
            ],
        );
        let row = table_row(64, &summarize(&[1000, 3000]).unwrap());
        let cols: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(
            cols,
            [
                "64", "2", "1.00", "3.00", "3.00", "2.00", "1.00", "3.00", "3.00"
            ]
        );
    }
}

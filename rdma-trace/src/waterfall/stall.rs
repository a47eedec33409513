//! The stall doctor: a thread blocked in a completion channel's read (`ibv_get_cq_event`)
//! for longer than `--stall-after`, and which link of the completion chain broke.
//!
//! The chain, for one CQ and its channel: armed (`ibv_req_notify_cq`) → CQE posted → handler
//! (`ib_uverbs_comp_handler`) → event queued → waiter woken → on CPU → read → CQ polled. The
//! eBPF side keeps the last time of each link (`WfCq` per CQ, `WfQueue` per channel, `WfWake`
//! per woken thread, `WfReading` per read in progress, see `rdma-trace-ebpf/src/waterfall.rs`);
//! nothing goes to user space per event. At each refresh the loader reads the reads in
//! progress and, for each one older than the threshold, these stamps, and [`diagnose`] names
//! the first link that did not happen.

use serde::Serialize;

use rdma_trace_common::waterfall::{NO_ID, WfCq, WfQueue, WfReading, WfWake};

/// The links of the chain, in order.
pub const LINKS: [&str; 8] = [
    "armed",
    "cqe_posted",
    "handler",
    "event_queued",
    "waiter_woken",
    "on_cpu",
    "read",
    "cq_polled",
];

/// What the stamps say about one blocked read, at one moment (all times CLOCK_MONOTONIC ns).
#[derive(Clone, Copy, Debug)]
pub struct Evidence {
    pub now: u64,
    pub tid: u32,
    pub reading: WfReading,
    /// The channel's mirror, when a handler call on it was seen.
    pub queue: Option<WfQueue>,
    /// The CQ's links, when its driver's arm and posts are traced (rxe).
    pub cq: Option<WfCq>,
    /// This thread's pending wake-up by a handler, when there is one.
    pub wake: Option<WfWake>,
}

/// One link of the chain and when it last happened.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Link {
    pub link: &'static str,
    /// Seconds before the diagnosis; `null`: not seen (or not traced on this driver).
    pub ago_s: Option<f64>,
}

/// One stalled thread and its diagnosis.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Stall {
    pub pid: u32,
    pub tid: u32,
    pub comm: String,
    /// The completion channel (kernel address of its event queue, as hex).
    pub channel: String,
    /// The CQ (kernel address, as hex) of the channel's last handler call; `null`: none seen.
    pub cq: Option<String>,
    /// Its restrack id (`rdma resource show cq`'s `cqn`), where the kernel has it.
    pub cq_id: Option<u32>,
    /// How long the read had been blocked when last seen.
    pub blocked_s: f64,
    /// Each link of the chain, in order, with when it last happened.
    pub links: Vec<Link>,
    pub posts_since_arm: Option<u64>,
    /// Events the handler queued on the channel that no read took.
    pub queued_unread: Option<u64>,
    /// rxe: CQEs the program had not polled when the read began.
    pub unpolled_at_wait: Option<u32>,
    /// The first link that did not happen (one of [`LINKS`]), `unknown` when the stamps cannot
    /// tell.
    pub broken: &'static str,
    /// The broken link in words.
    pub diagnosis: String,
}

fn ago(now: u64, t: u64) -> Option<f64> {
    (t != 0).then(|| now.saturating_sub(t) as f64 / 1e9)
}

fn secs(s: f64) -> String {
    format!("{s:.1} s")
}

/// Whether the thread's read is a stall: blocked longer than `after_ns`, on a channel that has
/// already delivered an event (the load had completed events).
pub fn is_stall(e: &Evidence, after_ns: u64) -> bool {
    e.now.saturating_sub(e.reading.since) > after_ns && e.queue.is_some_and(|q| q.read_at != 0)
}

/// The diagnosis of a blocked read (see [`is_stall`] for when to ask).
pub fn diagnose(e: &Evidence, pid: u32, comm: String) -> Stall {
    let now = e.now;
    let q = e.queue;
    let c = e.cq;
    // The wake-up of this thread for an event of this channel, after its read began.
    let wake = e
        .wake
        .filter(|w| w.queue == e.reading.queue && w.t2 >= e.reading.since);
    let queued_at = q.and_then(|q| (q.handler_at != 0).then_some(q.handler_at));
    let unread = q.map(|q| q.tail.saturating_sub(q.head));
    let unpolled = (e.reading.unpolled != NO_ID).then_some(e.reading.unpolled);
    let handler_at = c.map_or(0, |c| c.handler_at);
    let agos = [
        c.and_then(|c| ago(now, c.armed_at)),
        c.and_then(|c| ago(now, c.posted_at)),
        ago(now, handler_at).or_else(|| queued_at.and_then(|t| ago(now, t))),
        queued_at.and_then(|t| ago(now, t)),
        // This wait's wake-up, else the last event's.
        ago(now, wake.map_or(q.map_or(0, |q| q.woken_at), |w| w.t2)),
        ago(now, wake.map_or(q.map_or(0, |q| q.on_cpu_at), |w| w.t3)),
        q.and_then(|q| ago(now, q.read_at)),
        // User space polls the CQ without the kernel (rxe, mlx5): no time, only what was left
        // in it when the wait began (`unpolled_at_wait`).
        None,
    ];
    let links = LINKS
        .iter()
        .zip(agos)
        .map(|(&link, ago_s)| Link { link, ago_s })
        .collect();
    let read_ago = q.and_then(|q| ago(now, q.read_at)).map_or("-".into(), secs);
    let (broken, diagnosis) = match (unread, c) {
        (Some(n), _) if n > 0 => match wake {
            Some(w) if w.t3 != 0 => (
                "read",
                format!(
                    "{n} event(s) queued on the channel; the waiter was woken {} ago and got a CPU {} ago, but its read has not returned",
                    secs(ago(now, w.t2).unwrap_or(0.0)),
                    secs(ago(now, w.t3).unwrap_or(0.0))
                ),
            ),
            Some(w) => (
                "on_cpu",
                format!(
                    "{n} event(s) queued; the waiter was woken {} ago and never got a CPU (run queue)",
                    secs(ago(now, w.t2).unwrap_or(0.0))
                ),
            ),
            None => (
                "waiter_woken",
                format!(
                    "{n} event(s) queued on the channel, the last {} ago, and the waiting thread was not woken",
                    queued_at
                        .and_then(|t| ago(now, t))
                        .map_or("-".into(), secs)
                ),
            ),
        },
        (_, None) => (
            "unknown",
            "nothing queued on the channel since the wait began; this driver's arm and CQE posts are not traced (only rxe's are), so the chain cannot tell more".to_owned(),
        ),
        (_, Some(c)) if c.armed_at > c.handler_at => {
            if c.posts_since_arm > 0 {
                (
                    "handler",
                    format!(
                        "{} CQE(s) posted since the last arm {} ago, and no handler call: the notification was lost (driver)",
                        c.posts_since_arm,
                        ago(now, c.armed_at).map_or("-".into(), secs)
                    ),
                )
            } else if let Some(n) = unpolled.filter(|&n| n > 0) {
                (
                    "cq_polled",
                    format!(
                        "the event was read {read_ago} ago but the CQ was never polled: {n} completion(s) were still in it when the thread began to wait, and no new CQE came to raise an event"
                    ),
                )
            } else {
                (
                    "cqe_posted",
                    format!(
                        "nothing arrived: the CQ was armed {} ago{}, and no CQE was posted since (is the peer alive, did it send?)",
                        ago(now, c.armed_at).map_or("-".into(), secs),
                        if unpolled == Some(0) {
                            " and was empty when the wait began"
                        } else {
                            ""
                        }
                    ),
                )
            }
        }
        (_, Some(c)) => (
            "armed",
            format!(
                "the last event was read {read_ago} ago and the CQ was not armed again: the program did not call ibv_req_notify_cq{}",
                if c.posts_since_handler > 0 {
                    format!(" ({} CQE(s) posted since, raising no event)", c.posts_since_handler)
                } else {
                    String::new()
                }
            ),
        ),
    };
    Stall {
        pid,
        tid: e.tid,
        comm,
        channel: format!("{:#x}", e.reading.queue),
        cq: (e.reading.cq != 0)
            .then(|| format!("{:#x}", e.reading.cq))
            .or_else(|| q.filter(|q| q.cq != 0).map(|q| format!("{:#x}", q.cq))),
        cq_id: c.map(|c| c.res_id).filter(|&id| id != NO_ID),
        blocked_s: now.saturating_sub(e.reading.since) as f64 / 1e9,
        links,
        posts_since_arm: c.map(|c| c.posts_since_arm),
        queued_unread: unread,
        unpolled_at_wait: unpolled,
        broken,
        diagnosis,
    }
}

/// The text report's block: one paragraph per stall.
pub fn render(stalls: &[Stall]) -> String {
    let mut out = String::new();
    for s in stalls {
        out.push_str(&format!(
            "STALL: pid {} ({}) thread {} blocked {} in ibv_get_cq_event on channel {}, CQ {}{}\n",
            s.pid,
            s.comm,
            s.tid,
            secs(s.blocked_s),
            s.channel,
            s.cq.as_deref().unwrap_or("-"),
            s.cq_id.map_or(String::new(), |id| format!(" (cqn {id})")),
        ));
        let chain: Vec<String> = s
            .links
            .iter()
            .map(|l| {
                let when = l.ago_s.map_or("-".to_owned(), |a| format!("{a:.1}s ago"));
                let mark = if l.link == s.broken { " ✗" } else { "" };
                format!("{} {when}{mark}", l.link)
            })
            .collect();
        out.push_str(&format!("  chain: {}\n", chain.join(" → ")));
        out.push_str(&format!("  broken: {}: {}\n", s.broken, s.diagnosis));
    }
    out
}

/// The live view's banner: one line for the stall first seen.
pub fn banner(stalls: &[Stall]) -> Option<String> {
    let s = stalls.first()?;
    let more = if stalls.len() > 1 {
        format!(" (+{} more)", stalls.len() - 1)
    } else {
        String::new()
    };
    Some(format!(
        "STALL pid {} ({}) tid {} blocked {}: {}{more}",
        s.pid,
        s.comm,
        s.tid,
        secs(s.blocked_s),
        s.diagnosis
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdma_trace_common::waterfall::WF_QUEUE_LEN;

    const S: u64 = 1_000_000_000;

    fn queue(read_at: u64, tail: u64, head: u64, t1: u64) -> WfQueue {
        let mut q = WfQueue {
            head,
            tail,
            t0: [0; WF_QUEUE_LEN as usize],
            t1: [0; WF_QUEUE_LEN as usize],
            cpu: [0; WF_QUEUE_LEN as usize],
            seq: [0; WF_QUEUE_LEN as usize],
            handler_at: 0,
            cq: 0xc0,
            buf: 0,
            read_at,
            cqs: [0; WF_QUEUE_LEN as usize],
            woken_at: 0,
            on_cpu_at: 0,
            handler_done_at: 0,
            readers: 1,
        };
        if tail > 0 {
            q.handler_at = t1;
        }
        q
    }

    fn evidence(cq: Option<WfCq>, q: WfQueue, unpolled: u32) -> Evidence {
        Evidence {
            now: 100 * S,
            tid: 7,
            reading: WfReading {
                queue: 0xe0,
                since: 95 * S,
                cq: 0xc0,
                tgid: 6,
                unpolled,
                counted: 1,
                _pad: 0,
            },
            queue: Some(q),
            cq,
            wake: None,
        }
    }

    fn cq(armed: u64, posted: u64, handler: u64, since_arm: u64, since_handler: u64) -> WfCq {
        WfCq {
            t0: 0,
            armed_at: armed,
            posted_at: posted,
            handler_at: handler,
            posts_since_arm: since_arm,
            posts_since_handler: since_handler,
            res_id: 3,
            _pad: 0,
        }
    }

    fn broken(e: &Evidence) -> (&'static str, String) {
        let s = diagnose(e, 6, "demo".into());
        (s.broken, s.diagnosis)
    }

    /// The diagnosis of `e` breaks at `link`, starts with `start` and says each of `parts`.
    fn expect_diagnosis(e: &Evidence, link: &str, start: &str, parts: &[&str]) {
        let (b, d) = broken(e);
        assert_eq!(b, link, "{d}");
        assert!(d.starts_with(start), "{d}");
        for p in parts {
            assert!(d.contains(p), "{p:?} not in {d}");
        }
    }

    #[test]
    fn a_read_is_a_stall_only_after_the_threshold_and_after_a_first_event() {
        let e = evidence(None, queue(90 * S, 3, 3, 89 * S), NO_ID);
        assert!(is_stall(&e, S));
        assert!(!is_stall(&e, 6 * S), "blocked 5 s");
        let first = evidence(None, queue(0, 0, 0, 0), NO_ID);
        assert!(!is_stall(&first, S), "no event read yet");
        let mut no_channel = e;
        no_channel.queue = None;
        assert!(!is_stall(&no_channel, S));
    }

    #[test]
    fn posts_after_the_arm_without_a_handler_call_are_a_lost_notification() {
        let e = evidence(
            Some(cq(94 * S, 96 * S, 93 * S, 2, 2)),
            queue(94 * S, 3, 3, 93 * S),
            2,
        );
        expect_diagnosis(
            &e,
            "handler",
            "2 CQE(s) posted since the last arm 6.0 s ago",
            &["notification was lost (driver)"],
        );
    }

    #[test]
    fn a_cq_not_armed_since_its_last_handler_call_is_a_forgotten_rearm() {
        // Armed at 90, handler at 91 (took the notification), read at 92, a CQE at 96.
        let e = evidence(
            Some(cq(90 * S, 96 * S, 91 * S, 2, 1)),
            queue(92 * S, 3, 3, 91 * S),
            1,
        );
        expect_diagnosis(
            &e,
            "armed",
            "the last event was read 8.0 s ago and the CQ was not armed again",
            &["1 CQE(s) posted since"],
        );
    }

    #[test]
    fn an_armed_cq_with_completions_left_is_not_polled_and_an_empty_one_got_nothing() {
        let armed = Some(cq(94 * S, 91 * S, 92 * S, 0, 0));
        let waiting = queue(93 * S, 3, 3, 92 * S);
        expect_diagnosis(
            &evidence(armed, waiting, 1),
            "cq_polled",
            "",
            &["never polled: 1 completion(s)"],
        );
        expect_diagnosis(
            &evidence(armed, waiting, 0),
            "cqe_posted",
            "nothing arrived: the CQ was armed 6.0 s ago and was empty when the wait began, and no CQE",
            &[],
        );
        // An unknown poll state: nothing arrived.
        expect_diagnosis(&evidence(armed, waiting, NO_ID), "cqe_posted", "", &[]);
    }

    #[test]
    fn queued_events_name_the_wake_up_the_cpu_or_the_read() {
        let mut e = evidence(
            Some(cq(90 * S, 96 * S, 97 * S, 1, 0)),
            queue(92 * S, 4, 3, 97 * S),
            0,
        );
        assert_eq!(broken(&e).0, "waiter_woken");
        let wake = WfWake {
            queue: 0xe0,
            event: 3,
            t2: 97 * S,
            t3: 0,
            cpu_target: 0,
            cpu_on: u32::MAX,
        };
        e.wake = Some(wake);
        assert_eq!(broken(&e).0, "on_cpu");
        e.wake = Some(WfWake { t3: 98 * S, ..wake });
        let s = diagnose(&e, 6, "demo".into());
        assert_eq!(s.broken, "read");
        let on_cpu = s.links.iter().find(|l| l.link == "on_cpu").unwrap();
        assert_eq!(on_cpu.ago_s, Some(2.0));
        // A wake-up from before this read began is not this read's.
        e.wake = Some(WfWake { t2: 94 * S, ..wake });
        assert_eq!(broken(&e).0, "waiter_woken");
    }

    #[test]
    fn without_the_drivers_stamps_the_chain_cannot_tell() {
        let (b, _) = broken(&evidence(None, queue(92 * S, 3, 3, 91 * S), NO_ID));
        assert_eq!(b, "unknown");
    }

    #[test]
    fn the_report_names_the_thread_the_cq_and_every_link_in_order() {
        let e = evidence(
            Some(cq(90 * S, 96 * S, 91 * S, 2, 1)),
            queue(92 * S, 3, 3, 91 * S),
            1,
        );
        let s = diagnose(&e, 6, "demo".into());
        assert_eq!((s.pid, s.tid, s.cq_id), (6, 7, Some(3)));
        assert_eq!(s.cq.as_deref(), Some("0xc0"));
        assert_eq!(s.blocked_s, 5.0);
        let names: Vec<_> = s.links.iter().map(|l| l.link).collect();
        assert_eq!(names, LINKS);
        let text = render(std::slice::from_ref(&s));
        assert!(
            text.starts_with("STALL: pid 6 (demo) thread 7 blocked 5.0 s"),
            "{text}"
        );
        assert!(text.contains("(cqn 3)"), "{text}");
        assert!(
            text.contains("armed 10.0s ago ✗ → cqe_posted 4.0s ago"),
            "{text}"
        );
        assert!(banner(&[s.clone(), s]).unwrap().ends_with("(+1 more)"));
        assert_eq!(banner(&[]), None);
    }
}

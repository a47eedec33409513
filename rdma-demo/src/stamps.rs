//! User-space stamps (`--stamps N`): per thread, the CLOCK_MONOTONIC time right after each
//! completion-event read (`ibv_get_cq_event`) returned and right before each post
//! (`ibv_post_send`), the first N of each kind. `bpf_ktime_get_ns` reads the same clock, so a
//! tracer's stamps of the same events compare with these directly: the read's stamp follows
//! the kernel's return of `ib_uverbs_comp_event_read`, and every completion follows the post
//! that caused it.
//!
//! Off (the default), a wait or a post costs one branch more, and nothing is allocated.

use serde::Serialize;

use crate::verbs::{monotonic_ns, thread_id};

/// What a stamp marks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum StampKind {
    /// `ibv_get_cq_event` has just returned an event.
    Read,
    /// `ibv_post_send` is about to be called.
    Post,
}

/// One stamp: what, and when (CLOCK_MONOTONIC ns).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Stamp {
    pub kind: StampKind,
    pub t_ns: u64,
    /// A read: the completions polled from the CQ before it (so before the CQ was armed
    /// again). The event of the next read was raised by a later completion.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub polled: Option<Polled>,
}

/// Completions polled from a CQ, by what caused them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Polled {
    /// Of this side's own requests (sends, RDMA WRITE/READ, atomics): each follows one of its
    /// posts.
    pub sends: u64,
    /// Of messages received: each follows one of the peer's posts.
    pub recvs: u64,
}

/// The stamps of one thread, as its report's JSON carries them (`stamps`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Stamps {
    /// The thread (gettid) that waited and posted.
    pub tid: u32,
    /// At most this many stamps of each kind are kept: the first ones.
    pub limit: u32,
    /// Events read and requests posted in all, kept or not.
    pub reads: u64,
    pub posts: u64,
    /// The kept stamps, in the order they were taken.
    pub samples: Vec<Stamp>,
}

impl Stamps {
    /// An empty record of the calling thread, keeping up to `limit` stamps of each kind
    /// (room for all of them reserved now, off the waits' path).
    pub fn new(limit: u32) -> Self {
        Self::of_thread(thread_id(), limit)
    }

    fn of_thread(tid: u32, limit: u32) -> Self {
        Stamps {
            tid,
            limit,
            reads: 0,
            posts: 0,
            samples: Vec::with_capacity(2 * limit as usize),
        }
    }

    /// Records an event read at `t_ns` (from [`crate::verbs::Event::read_at`]), with the
    /// completions `polled` from the CQ so far.
    pub fn read_at(&mut self, t_ns: u64, polled: Polled) {
        self.reads += 1;
        if self.reads <= u64::from(self.limit) {
            self.samples.push(Stamp {
                kind: StampKind::Read,
                t_ns,
                polled: Some(polled),
            });
        }
    }

    /// Records a post about to be made, now.
    pub fn post_now(&mut self) {
        self.posts += 1;
        if self.posts <= u64::from(self.limit) {
            self.samples.push(Stamp {
                kind: StampKind::Post,
                t_ns: monotonic_ns(),
                polled: None,
            });
        }
    }

    /// The kept stamps of `kind`, in order.
    pub fn of(&self, kind: StampKind) -> impl Iterator<Item = u64> + '_ {
        self.samples
            .iter()
            .filter(move |s| s.kind == kind)
            .map(|s| s.t_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_first_n_of_each_kind_and_counts_them_all() {
        let mut s = Stamps::of_thread(7, 2);
        for t in [10, 20, 30] {
            s.read_at(t, Polled::default());
        }
        for _ in 0..5 {
            s.post_now();
        }
        assert_eq!((s.reads, s.posts), (3, 5));
        assert_eq!(s.of(StampKind::Read).collect::<Vec<_>>(), [10, 20]);
        let posts: Vec<u64> = s.of(StampKind::Post).collect();
        assert_eq!(posts.len(), 2);
        assert!(posts[0] > 0 && posts[0] <= posts[1], "{posts:?}");
        assert_eq!(s.samples.len(), 4);
        // Kept in the order taken.
        assert_eq!(
            s.samples.iter().map(|x| x.kind).collect::<Vec<_>>(),
            [
                StampKind::Read,
                StampKind::Read,
                StampKind::Post,
                StampKind::Post
            ]
        );
    }

    #[test]
    fn post_stamps_are_monotonic_ns_of_the_calling_thread() {
        let before = monotonic_ns();
        let mut s = Stamps::new(4);
        s.post_now();
        let after = monotonic_ns();
        let t = s.samples[0].t_ns;
        assert!(before <= t && t <= after, "{before} {t} {after}");
        // The test runs on its own thread, not the process's main one.
        let tid = s.tid;
        let other = std::thread::spawn(|| Stamps::new(1).tid).join().unwrap();
        assert!(tid > 0 && other > 0 && tid != other, "{tid} {other}");
        assert_eq!(tid, thread_id());
    }

    #[test]
    fn a_limit_of_zero_keeps_nothing() {
        let mut s = Stamps::of_thread(1, 0);
        s.read_at(5, Polled::default());
        s.post_now();
        assert!(s.samples.is_empty());
        assert_eq!((s.reads, s.posts), (1, 1));
    }

    #[test]
    fn json_shape() {
        let mut s = Stamps::of_thread(42, 3);
        s.read_at(1_000, Polled { sends: 2, recvs: 1 });
        s.samples.push(Stamp {
            kind: StampKind::Post,
            t_ns: 2_000,
            polled: None,
        });
        s.posts = 1;
        assert_eq!(
            serde_json::to_value(&s).unwrap(),
            serde_json::json!({
                "tid": 42,
                "limit": 3,
                "reads": 1,
                "posts": 1,
                "samples": [
                    {"kind": "read", "t_ns": 1000, "polled": {"sends": 2, "recvs": 1}},
                    {"kind": "post", "t_ns": 2000},
                ],
            })
        );
    }
}

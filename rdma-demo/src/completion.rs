//! Waiting for completions: one interface, two strategies.
//!
//! * [`Mode::Poll`]: spin on `ibv_poll_cq` (lowest latency, one core busy).
//! * [`Mode::Event`]: sleep on the completion channel. The CQ is armed (`ibv_req_notify_cq`)
//!   before the first wait and re-armed after each event *before* the CQ is drained, so a
//!   completion that arrives between the drain and the next sleep still raises an event: no
//!   wake-up is lost. Each event is acknowledged at once.
//!
//! Every wait has a deadline; the time spent waiting is summed ("wait/CQ").

use std::collections::VecDeque;
use std::rc::Rc;
use std::time::{Duration, Instant};

use crate::exchange::secs;
use crate::stamps::{Polled, Stamps};
use crate::verbs::{
    CompletionQueue, MemoryRegion, QueuePair, SendOp, VerbsError, WcOpcode, WorkCompletion,
};

/// How to wait for completions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Busy polling
    Poll,
    /// Completion channel events
    Event,
}

impl Mode {
    /// `poll` or `event`, as the flag and the JSON spell it.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Poll => "poll",
            Mode::Event => "event",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CompletionError {
    #[error("no completion within {} ({mode:?} mode) while waiting for {what}: is the peer still alive?", secs(*timeout))]
    Timeout {
        what: String,
        mode: Mode,
        timeout: Duration,
    },
    #[error(
        "{what}: work completion with error status \"{status_str}\" ({status}), vendor_err {vendor_err:#x}, wr_id {wr_id}, QP {qp_num:#x}"
    )]
    Status {
        what: String,
        status: u32,
        status_str: String,
        vendor_err: u32,
        wr_id: u64,
        qp_num: u32,
    },
    #[error("{what}: unexpected completion {opcode:?} (wr_id {wr_id})")]
    Unexpected {
        what: String,
        opcode: WcOpcode,
        wr_id: u64,
    },
    #[error(transparent)]
    Verbs(#[from] VerbsError),
}

/// Mistakes an event-mode program can make, injected for the tests of `rdma-trace`'s stall
/// doctor (`rdma-demo --fault-no-rearm-after N`, `--fault-no-poll`): each one leaves a thread
/// blocked in `ibv_get_cq_event` with a known link of the completion chain broken. And a
/// program that lets events pile up on its channel (`--fault-unread-events N`), for the
/// waterfall's count of events its channel mirror could not hold.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CompletionFaults {
    /// After this many events, the CQ is no longer re-armed (`ibv_req_notify_cq` forgotten).
    pub no_rearm_after: Option<u64>,
    /// Once an event was read, the CQ is never polled again: the next wait blocks with the
    /// completions that raised the event still in the CQ.
    pub no_poll: bool,
    /// The first N waits poll for their completion with the CQ armed (re-armed after each), so
    /// each completion's event stays queued on the channel unread; then every queued event is
    /// read in one burst ([`Completions::burst`] counts them).
    pub unread_events: u64,
}

impl CompletionFaults {
    /// Whether the CQ is re-armed after the `events`-th event.
    fn rearms_after(&self, events: u64) -> bool {
        self.no_rearm_after.is_none_or(|n| events < n)
    }

    /// Whether the CQ is polled once `events` events were read.
    fn polls_after(&self, events: u64) -> bool {
        !self.no_poll || events == 0
    }

    /// Whether the wait after `waits` such waits leaves its event unread.
    fn leaves_unread(&self, waits: u64) -> bool {
        waits < self.unread_events
    }
}

/// Completions of one CQ, fetched by polling or by events.
#[derive(Debug)]
pub struct Completions {
    cq: Rc<CompletionQueue>,
    mode: Mode,
    timeout: Duration,
    pending: VecDeque<WorkCompletion>,
    scratch: Vec<WorkCompletion>,
    wait: Duration,
    events: u64,
    completions: u64,
    /// Poll mode: sleep this long after a poll that found nothing (see [`Completions::passive`]).
    nap: Option<Duration>,
    /// `--stamps`: this thread's event reads and posts (see [`Completions::with_stamps`]),
    /// and the completions polled so far (counted only then).
    stamps: Option<Stamps>,
    polled: Polled,
    faults: CompletionFaults,
    /// Waits that left their event unread ([`CompletionFaults::unread_events`]).
    unread_waits: u64,
    /// Events read in the burst that followed them.
    burst: u64,
}

/// How long a passive poller sleeps between polls that find nothing. Its wait is not measured,
/// and under emulation a wake-up costs a fraction of a millisecond of CPU: at 1 ms the atomic
/// server of a 2 s run took a quarter of a core in some runs of the 6.1 guest.
pub const PASSIVE_NAP: Duration = Duration::from_millis(5);

impl Completions {
    /// In event mode the CQ must have a completion channel; it is armed here.
    pub fn new(cq: Rc<CompletionQueue>, mode: Mode, timeout: Duration) -> Result<Self, VerbsError> {
        if mode == Mode::Event {
            cq.arm()?;
        }
        Ok(Completions {
            cq,
            mode,
            timeout,
            pending: VecDeque::new(),
            scratch: Vec::with_capacity(crate::verbs::POLL_BATCH),
            wait: Duration::ZERO,
            events: 0,
            completions: 0,
            nap: None,
            stamps: None,
            polled: Polled::default(),
            faults: CompletionFaults::default(),
            unread_waits: 0,
            burst: 0,
        })
    }

    /// Injects `faults` into the event-mode waits (none by default).
    pub fn with_faults(mut self, faults: CompletionFaults) -> Self {
        self.faults = faults;
        self
    }

    /// Stamps the first `limit` event reads and posts of the calling thread (none for 0): the
    /// thread that waits on these completions must be the one that calls this.
    pub fn with_stamps(mut self, limit: u32) -> Self {
        self.stamps = (limit > 0).then(|| Stamps::new(limit));
        self
    }

    /// The stamps taken so far, when asked for.
    pub fn stamps(&self) -> Option<Stamps> {
        self.stamps.clone()
    }

    /// Call right before each `ibv_post_send` whose completion comes here (or whose message
    /// the peer receives): stamps it, when asked for.
    pub fn stamp_post(&mut self) {
        if let Some(s) = self.stamps.as_mut() {
            s.post_now();
        }
    }

    /// For a side whose waits are not measured: the server of a one-sided demo (WRITE/READ,
    /// atomics), which only waits for its clients' final messages. In poll mode it sleeps
    /// [`PASSIVE_NAP`] after each empty poll instead of spinning, so it does not take a core
    /// from the client and the Soft-RoCE work it measures (perftest's servers of its READ and
    /// atomic tests sleep too). Event mode is unchanged.
    pub fn passive(mut self) -> Self {
        self.nap = Some(PASSIVE_NAP);
        self
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The error of a wait for `what` that took longer than this timeout.
    pub fn timed_out(&self, what: String) -> CompletionError {
        CompletionError::Timeout {
            what,
            mode: self.mode,
            timeout: self.timeout,
        }
    }

    /// Total time spent waiting in [`next`](Self::next).
    pub fn wait_time(&self) -> Duration {
        self.wait
    }

    /// CQ events received (event mode).
    pub fn events(&self) -> u64 {
        self.events
    }

    pub fn completions(&self) -> u64 {
        self.completions
    }

    /// Events read in one burst after `--fault-unread-events` left them queued (0 without it).
    pub fn burst(&self) -> u64 {
        self.burst
    }

    /// A wait that polls for its completion with the CQ armed and re-arms it: the completion's
    /// event stays queued unread. After the last such wait, every queued event is read.
    fn wait_leaving_the_event(&mut self, deadline: Instant) -> Result<bool, CompletionError> {
        let found = loop {
            if self.drain()? > 0 {
                break true;
            }
            if Instant::now() >= deadline {
                break false;
            }
            std::hint::spin_loop();
        };
        if !found {
            return Ok(false);
        }
        self.unread_waits += 1;
        if self.faults.leaves_unread(self.unread_waits) {
            self.cq.arm()?;
        } else {
            // Not armed after the last one: no event can join the queue during the burst, which
            // therefore reads exactly the events left unread. Every one is queued by now: a read
            // that waits this long found the queue empty.
            while let Some(event) = self
                .cq
                .wait_event(Duration::from_millis(500), self.stamps.is_some())?
            {
                if let (Some(s), Some(t)) = (self.stamps.as_mut(), event.read_at) {
                    s.read_at(t, self.polled);
                }
                self.events += 1;
                self.burst += 1;
            }
            // Armed again for the waits that follow (they poll before they sleep).
            self.cq.arm()?;
        }
        Ok(true)
    }

    fn drain(&mut self) -> Result<usize, VerbsError> {
        self.scratch.clear();
        let n = self.cq.poll(&mut self.scratch)?;
        if self.stamps.is_some() {
            let recvs = self.scratch.iter().filter(|wc| wc.opcode == WcOpcode::Recv);
            let recvs = recvs.count() as u64;
            self.polled.recvs += recvs;
            self.polled.sends += n as u64 - recvs;
        }
        self.pending.extend(self.scratch.drain(..));
        Ok(n)
    }

    /// A completion that is already there, without waiting (one poll of the CQ at most).
    pub fn ready(&mut self) -> Result<Option<WorkCompletion>, CompletionError> {
        if self.pending.is_empty() {
            self.drain()?;
        }
        let wc = self.pending.pop_front();
        if wc.is_some() {
            self.completions += 1;
        }
        Ok(wc)
    }

    /// The next completion, whatever its status, within the timeout.
    pub fn next(&mut self, what: &dyn Fn() -> String) -> Result<WorkCompletion, CompletionError> {
        self.next_within(self.timeout, what)
    }

    /// As [`next`](Self::next) with another timeout; `Ok(None)` when it passes.
    pub fn try_next_within(
        &mut self,
        timeout: Duration,
    ) -> Result<Option<WorkCompletion>, CompletionError> {
        if let Some(wc) = self.pending.pop_front() {
            self.completions += 1;
            return Ok(Some(wc));
        }
        let start = Instant::now();
        let deadline = start + timeout;
        let found = match self.mode {
            Mode::Poll => {
                let mut spins = 0u32;
                loop {
                    if self.drain()? > 0 {
                        break true;
                    }
                    spins = spins.wrapping_add(1);
                    if let Some(nap) = self.nap {
                        if Instant::now() >= deadline {
                            break false;
                        }
                        std::thread::sleep(nap);
                    } else if spins.is_multiple_of(1024) && Instant::now() >= deadline {
                        break false;
                    }
                }
            }
            Mode::Event if self.faults.leaves_unread(self.unread_waits) => {
                self.wait_leaving_the_event(deadline)?
            }
            Mode::Event => loop {
                // Armed here: drain first, sleep only on an empty CQ.
                if self.faults.polls_after(self.events) && self.drain()? > 0 {
                    break true;
                }
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break false;
                }
                let Some(event) = self.cq.wait_event(left, self.stamps.is_some())? else {
                    break false;
                };
                if let (Some(s), Some(t)) = (self.stamps.as_mut(), event.read_at) {
                    s.read_at(t, self.polled);
                }
                self.events += 1;
                if self.faults.rearms_after(self.events) {
                    self.cq.arm()?;
                }
            },
        };
        self.wait += start.elapsed();
        if !found {
            return Ok(None);
        }
        self.completions += 1;
        Ok(self.pending.pop_front())
    }

    pub fn next_within(
        &mut self,
        timeout: Duration,
        what: &dyn Fn() -> String,
    ) -> Result<WorkCompletion, CompletionError> {
        self.try_next_within(timeout)?
            .ok_or_else(|| CompletionError::Timeout {
                what: what(),
                mode: self.mode,
                timeout,
            })
    }
}

/// `Ok(wc)` if it succeeded, else the status error.
pub fn check_status(
    wc: WorkCompletion,
    what: &dyn Fn() -> String,
) -> Result<WorkCompletion, CompletionError> {
    if wc.is_success() {
        Ok(wc)
    } else {
        Err(CompletionError::Status {
            what: what(),
            status: wc.status,
            status_str: wc.status_str(),
            vendor_err: wc.vendor_err,
            wr_id: wc.wr_id,
            qp_num: wc.qp_num,
        })
    }
}

/// Successful, with the expected opcode.
pub fn expect(
    wc: WorkCompletion,
    opcode: WcOpcode,
    what: &dyn Fn() -> String,
) -> Result<WorkCompletion, CompletionError> {
    let wc = check_status(wc, what)?;
    if wc.opcode != opcode {
        return Err(unexpected(&wc, what));
    }
    Ok(wc)
}

/// The error of a successful completion that is not the one awaited.
pub fn unexpected(wc: &WorkCompletion, what: &dyn Fn() -> String) -> CompletionError {
    CompletionError::Unexpected {
        what: what(),
        opcode: wc.opcode,
        wr_id: wc.wr_id,
    }
}

/// Posts one signaled request (`op` on `len` bytes of `mr` at `offset`), waits for its
/// completion and checks it (a success, of `op`'s kind); returns the time from the post to the
/// completion in nanoseconds.
#[allow(clippy::too_many_arguments)]
pub fn post_and_wait(
    comp: &mut Completions,
    qp: &QueuePair,
    wr_id: u64,
    op: SendOp,
    mr: &MemoryRegion,
    offset: usize,
    len: u32,
    what: &dyn Fn() -> String,
) -> Result<u64, CompletionError> {
    comp.stamp_post();
    let t0 = Instant::now();
    qp.post_send(wr_id, op, mr, offset, len, true)?;
    let wc = comp.next(what)?;
    expect(wc, op.completion(), what)?;
    Ok(t0.elapsed().as_nanos() as u64)
}

#[cfg(test)]
mod tests {
    use super::CompletionFaults;

    #[test]
    fn no_faults_rearm_and_poll_always() {
        let f = CompletionFaults::default();
        assert!((0..5).all(|e| f.rearms_after(e) && f.polls_after(e)));
    }

    #[test]
    fn the_rearm_is_forgotten_from_the_nth_event_on() {
        let f = CompletionFaults {
            no_rearm_after: Some(3),
            ..CompletionFaults::default()
        };
        assert!(f.rearms_after(1) && f.rearms_after(2));
        assert!(!f.rearms_after(3) && !f.rearms_after(4));
        assert!(f.polls_after(7));
    }

    #[test]
    fn no_poll_polls_only_before_the_first_event() {
        let f = CompletionFaults {
            no_poll: true,
            ..CompletionFaults::default()
        };
        assert!(f.polls_after(0));
        assert!(!f.polls_after(1) && !f.polls_after(9));
        assert!(f.rearms_after(9));
    }

    #[test]
    fn unread_events_leave_the_first_n_waits_unread() {
        let f = CompletionFaults {
            unread_events: 2,
            ..CompletionFaults::default()
        };
        assert!(f.leaves_unread(0) && f.leaves_unread(1));
        assert!(!f.leaves_unread(2));
        assert!(!CompletionFaults::default().leaves_unread(0));
    }
}

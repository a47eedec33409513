//! Atomics: Fetch-and-Add on a remote 8-byte counter and a Compare-and-Swap spin lock.
//!
//! The server exposes 24 bytes, REMOTE_ATOMIC (plus the LOCAL_WRITE the verbs require) and
//! nothing else: `counter` (offset 0), `lock` (8: 0 = free, else the holder's client id) and
//! `inside` (16: how many clients are in the critical section). Each of the `N` clients
//! (`--clients`), `iterations` times:
//!
//! 1. adds its id to `counter` (FADD; the old value comes back);
//! 2. takes the lock: CAS `lock` 0 → id until it succeeds (the failures are retries);
//! 3. FADD `inside` +1 — the old value must be 0, or two clients hold the lock at once;
//! 4. FADD `inside` −1 — the old value must be 1;
//! 5. releases: CAS `lock` id → 0 — the old value must be its id.
//!
//! Then it tells the server with a SEND. The server checks `counter` = Σ id · iterations,
//! `lock` = 0 and `inside` = 0. Until then it only waits (in poll mode polling every
//! 5 ms, not spinning: [`Completions::passive`]).
//!
//! With `--repeat faa|cas` a client measures what `ib_atomic_lat` does instead: one atomic
//! repeated on one word (`counter`), each timed from post to completion. `faa` adds its id
//! `iterations` times; `cas` swaps the value it last saw for that value + id until `iterations`
//! swaps have succeeded: when another client got there first, it retries with the value the CAS
//! returned (every attempt is timed; the report's `lock_attempts` and `lock_retries` count
//! them). Either way `counter` ends at Σ id · iterations, which the server checks as above.

use std::fmt::Write as _;
use std::time::Instant;

use serde::Serialize;

use crate::completion::{Completions, expect, post_and_wait};
use crate::endpoint::{Endpoint, random_psn};
use crate::error::DemoError;
use crate::exchange::{self, Demo, ExchangeError, RemoteBuf};
use crate::report::Run;
use crate::role::{Client, Server};
use crate::stats::{self, Summary, Totals};
use crate::verbs::{Access, MemoryRegion, SendOp, WcOpcode};

const COUNTER: u64 = 0;
const LOCK: u64 = 8;
const INSIDE: u64 = 16;
const REGION_LEN: u32 = 24;
/// Upper bound of `--clients`.
pub const MAX_CLIENTS: u32 = 64;

const WR_ATOMIC: u64 = 1;
const WR_DONE: u64 = 2;

#[derive(Debug, Clone, Copy, Serialize)]
pub struct Params {
    pub iterations: u32,
    pub clients: u32,
    /// One atomic repeated instead of the lock rounds (the client's choice; the server's
    /// check is the same).
    pub repeat: Option<Repeat>,
}

/// The one atomic a `--repeat` client repeats, as `ib_atomic_lat -A FETCH_AND_ADD` /
/// `-A CMP_AND_SWAP` do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Repeat {
    /// Fetch-and-Add of the client's id
    Faa,
    /// Compare-and-Swap of the last value seen for it + the client's id
    Cas,
}

impl Params {
    /// What the peer must run too.
    fn same_run(&self) -> exchange::SameRun {
        exchange::SameRun {
            iterations: self.iterations,
            size: None,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    #[serde(flatten)]
    pub run: Run,
    pub client_id: Option<u32>,
    /// The atomic repeated (`--repeat`), or none for the lock rounds. The server reports its
    /// own flag: what its clients do is theirs to choose, and its check is the same.
    pub repeat: Option<Repeat>,
    /// Server: the final counter, what it should be, and the lock words.
    pub final_counter: Option<u64>,
    pub expected_counter: Option<u64>,
    pub final_lock: Option<u64>,
    pub final_inside: Option<u64>,
    /// Client: the lock statistics.
    pub lock_attempts: Option<u64>,
    pub lock_retries: Option<u64>,
    pub hold_us: Option<Summary>,
    pub fetch_add_us: Option<Summary>,
    pub cmp_swap_us: Option<Summary>,
    /// Client: what its last FADD on the counter returned.
    pub last_fetched: Option<u64>,
}

impl Report {
    pub fn render(&self) -> String {
        let run = &self.run;
        let who = match self.client_id {
            Some(id) => format!("client {id}"),
            None => run.role.to_string(),
        };
        let what = match self.repeat {
            Some(Repeat::Faa) => "Fetch-and-Add repeated on one word",
            Some(Repeat::Cas) => "Compare-and-Swap repeated on one word",
            None => "atomics",
        };
        let title = format!(
            "{who} {}: {what}, {} rounds, {} mode",
            run.device,
            run.iterations,
            run.mode.name()
        );
        let mut details = String::new();
        if let (Some(c), Some(e)) = (self.final_counter, self.expected_counter) {
            let _ = writeln!(details, "final counter: {c} (expected {e}: correct)");
            // Repeated atomics take no lock: there is no overlap to speak of.
            if self.repeat.is_none() {
                let _ = writeln!(
                    details,
                    "lock word: {}, holders inside: {} (no overlap seen)",
                    self.final_lock.unwrap_or_default(),
                    self.final_inside.unwrap_or_default()
                );
            }
        }
        if let (Some(a), Some(r)) = (self.lock_attempts, self.lock_retries) {
            let what = match self.repeat {
                Some(_) => "Compare-and-Swap",
                None => "lock",
            };
            let _ = writeln!(details, "{what} attempts: {a}, retries: {r}");
        }
        if let Some(last) = self.last_fetched {
            let _ = writeln!(details, "last Fetch-and-Add returned: {last}");
        }
        let latencies = [
            ("Fetch-and-Add", &self.fetch_add_us),
            ("Compare-and-Swap", &self.cmp_swap_us),
            ("lock hold time", &self.hold_us),
        ];
        run.render_with_tables(&title, &details, "one round", &latencies, 8, |name| {
            format!("{name} (full latency, not halved)")
        })
    }
}

/// Server: accepts `clients` clients, waits for all their final SENDs, checks the words.
pub fn server(s: &Server, p: Params) -> Result<Report, DemoError> {
    let ep = Endpoint::open(s.opts)?;
    let n = p.clients as usize;
    let remote = Access {
        remote_atomic: true,
        ..Access::default()
    };
    let region = ep.exposed_region(REGION_LEN as usize, remote)?;
    let signals = MemoryRegion::new(&ep.pd, 8 * n, Access::LOCAL_WRITE)?;
    let cq = ep.cq(2 * p.clients + 4)?;
    let mut comp = ep.completions(std::rc::Rc::clone(&cq))?.passive();
    let buffer = RemoteBuf {
        addr: region.addr(0),
        rkey: region.rkey(),
        len: REGION_LEN,
    };
    // Declared after the regions: dropped before them.
    let mut qps = Vec::with_capacity(n);
    for k in 0..n {
        let qp = ep.init_qp(&cq, 1, 1, remote)?;
        qp.post_recv(k as u64, &signals, 8 * k, 8)?;
        let psn = random_psn();
        let id = k as u32 + 1;
        let ours = ep.local_info(Demo::Atomic, &qp, psn, p.iterations, 8, id, Some(buffer));
        s.handshake(&ours, p.same_run(), |theirs| ep.connect(&qp, psn, theirs))?;
        qps.push(qp);
    }
    let _phase = crate::phase::data(s.opts.fault)?;
    let start = Instant::now();
    let mut done = vec![false; n];
    let mut last = region.read_u64(COUNTER as usize);
    while done.iter().any(|d| !d) {
        let Some(wc) = comp.try_next_within(s.opts.timeout)? else {
            // Clients that still run keep changing the counter.
            let now = region.read_u64(COUNTER as usize);
            if now == last {
                let missing: Vec<String> = (0..n)
                    .filter(|&k| !done[k])
                    .map(|k| (k + 1).to_string())
                    .collect();
                return Err(comp
                    .timed_out(format!("client(s) {} to finish", missing.join(", ")))
                    .into());
            }
            last = now;
            continue;
        };
        let what = || format!("the final message of client {}", wc.wr_id + 1);
        let wc = expect(wc, WcOpcode::Recv, &what)?;
        let k = wc.wr_id as usize;
        if k >= n || done[k] {
            return Err(DemoError::Verify(format!(
                "unexpected final message {}",
                wc.wr_id
            )));
        }
        let rounds = signals.read_u64(8 * k);
        if rounds != u64::from(p.iterations) {
            return Err(DemoError::Verify(format!(
                "client {} reports {rounds} rounds, want {}",
                k + 1,
                p.iterations
            )));
        }
        done[k] = true;
    }
    let counter = region.read_u64(COUNTER as usize);
    let lock = region.read_u64(LOCK as usize);
    let inside = region.read_u64(INSIDE as usize);
    let expected: u64 = (1..=u64::from(p.clients)).sum::<u64>() * u64::from(p.iterations);
    if counter != expected {
        return Err(DemoError::Verify(format!(
            "final counter {counter}, want {expected} (the sum of all adds)"
        )));
    }
    if lock != 0 || inside != 0 {
        return Err(DemoError::Verify(format!(
            "lock word {lock} and {inside} holder(s) inside after all clients finished"
        )));
    }
    let rounds = u64::from(p.iterations) * u64::from(p.clients);
    let totals = Totals::new(
        start.elapsed(),
        rounds,
        comp.wait_time(),
        0,
        u64::from(p.clients),
    );
    let mut run = Run::new("server", &ep, p.iterations, totals).with_stamps(comp.stamps());
    run.notes.push(format!(
        "server: {} client(s); 24 bytes at {:#x} rkey {:#x} (REMOTE_ATOMIC only)",
        p.clients, buffer.addr, buffer.rkey
    ));
    drop(qps);
    Ok(Report {
        run,
        client_id: None,
        repeat: p.repeat,
        final_counter: Some(counter),
        expected_counter: Some(expected),
        final_lock: Some(lock),
        final_inside: Some(inside),
        lock_attempts: None,
        lock_retries: None,
        hold_us: None,
        fetch_add_us: None,
        cmp_swap_us: None,
        last_fetched: None,
    })
}

/// One client.
pub fn client(c: &Client, p: Params) -> Result<Report, DemoError> {
    let ep = Endpoint::open(c.opts)?;
    // [atomic result | final message], local only.
    let local = MemoryRegion::new(&ep.pd, 16, Access::LOCAL_WRITE)?;
    let cq = ep.cq(4)?;
    let qp = ep.init_qp(&cq, 2, 1, Access::default())?;
    let mut comp = ep.completions(cq)?;
    let psn = random_psn();
    let ours = ep.local_info(Demo::Atomic, &qp, psn, p.iterations, 8, 0, None);
    let peer = c.handshake(&ours, p.same_run())?;
    let id = peer.client_id;
    let remote = match peer.buffer {
        Some(b) if b.len == REGION_LEN && b.addr.is_multiple_of(8) && id != 0 => b,
        other => {
            return Err(ExchangeError::Mismatch {
                peer: c.server_name(),
                what: format!(
                    "want an 8-byte aligned {REGION_LEN}-byte region and a client id, got {other:?} and id {id}"
                ),
            }
            .into());
        }
    };
    ep.connect(&qp, psn, &peer)?;
    let _phase = crate::phase::data(c.opts.fault)?;
    let id64 = u64::from(id);

    // The old value and the time from post to completion.
    let atomic = |comp: &mut Completions, op, what: &str| -> Result<(u64, u64), DemoError> {
        let what = || format!("client {id}: {what}");
        let t = post_and_wait(comp, &qp, WR_ATOMIC, op, &local, 0, 8, &what)?;
        Ok((local.read_u64(0), t))
    };
    let fadd = |remote_off, add| SendOp::FetchAdd {
        remote: remote.at(remote_off),
        add,
    };
    let cas = |compare, swap| SendOp::CmpSwap {
        remote: remote.at(LOCK),
        compare,
        swap,
    };
    let k = p.iterations as usize;
    let (mut fadds, mut cass, mut holds) = (
        Vec::with_capacity(k),
        Vec::with_capacity(k),
        Vec::with_capacity(k),
    );
    let (mut attempts, mut retries, mut last_fetched) = (0u64, 0u64, 0u64);
    let start = Instant::now();
    if let Some(repeat) = p.repeat {
        // ib_atomic_lat's loop: the same atomic on the same word, one at a time.
        let (mut seen, mut done) = (0u64, 0u32);
        let mut deadline = Instant::now() + c.opts.timeout;
        while done < p.iterations {
            match repeat {
                Repeat::Faa => {
                    let (old, t) = atomic(&mut comp, fadd(COUNTER, id64), "FADD counter")?;
                    fadds.push(t);
                    // Every add since our last one (ours included) made the counter grow.
                    if done > 0 && old < seen + id64 {
                        return Err(DemoError::Verify(format!(
                            "client {id} add {done}: the counter was {old}, after {seen} + {id64}"
                        )));
                    }
                    seen = old;
                    done += 1;
                }
                Repeat::Cas => {
                    let swap = SendOp::CmpSwap {
                        remote: remote.at(COUNTER),
                        compare: seen,
                        swap: seen + id64,
                    };
                    let (old, t) = atomic(&mut comp, swap, "CAS counter")?;
                    cass.push(t);
                    attempts += 1;
                    if old == seen {
                        seen += id64;
                        done += 1;
                        deadline = Instant::now() + c.opts.timeout;
                    } else {
                        // Another client swapped first: try again from what it left.
                        retries += 1;
                        seen = old;
                        if Instant::now() > deadline {
                            return Err(comp
                                .timed_out(format!(
                                    "client {id}: a CAS of the counter that succeeds"
                                ))
                                .into());
                        }
                    }
                }
            }
            last_fetched = seen;
        }
    } else {
        for round in 0..p.iterations {
            let (old, t) = atomic(&mut comp, fadd(COUNTER, id64), "FADD counter")?;
            fadds.push(t);
            last_fetched = old;
            let deadline = Instant::now() + c.opts.timeout;
            loop {
                let (old, t) = atomic(&mut comp, cas(0, id64), "CAS lock 0 -> id")?;
                cass.push(t);
                attempts += 1;
                if old == 0 {
                    break;
                }
                if old == id64 {
                    return Err(DemoError::Verify(format!(
                        "client {id} round {round}: the lock already names us"
                    )));
                }
                retries += 1;
                if Instant::now() > deadline {
                    return Err(comp
                        .timed_out(format!("client {id}: the lock (held by client {old})"))
                        .into());
                }
            }
            let acquired = Instant::now();
            let (inside, _) = atomic(&mut comp, fadd(INSIDE, 1), "FADD inside +1")?;
            if inside != 0 {
                return Err(DemoError::Verify(format!(
                    "client {id} round {round}: {inside} other holder(s) inside the critical section"
                )));
            }
            let (inside, _) = atomic(&mut comp, fadd(INSIDE, u64::MAX), "FADD inside -1")?;
            if inside != 1 {
                return Err(DemoError::Verify(format!(
                    "client {id} round {round}: {inside} holders inside on leaving, want 1"
                )));
            }
            let (old, t) = atomic(&mut comp, cas(id64, 0), "CAS lock id -> 0")?;
            cass.push(t);
            holds.push(acquired.elapsed().as_nanos() as u64);
            if old != id64 {
                return Err(DemoError::Verify(format!(
                    "client {id} round {round}: released a lock held by {old}"
                )));
            }
        }
    }
    let total = start.elapsed();
    local.write_u64(8, u64::from(p.iterations));
    let what = || format!("client {id}: the final SEND");
    post_and_wait(&mut comp, &qp, WR_DONE, SendOp::Send, &local, 8, 8, &what)?;
    // The lock rounds add two FADDs of `inside` per round, which are not timed.
    let untimed = if p.repeat.is_some() { 0 } else { 2 };
    // Fetch-and-Add alone makes no CAS attempt.
    let made_cas = p.repeat != Some(Repeat::Faa);
    let ops = fadds.len() as u64 + cass.len() as u64 + untimed * u64::from(p.iterations);
    let totals = Totals::one_sided_client(total, p.iterations, comp.wait_time(), ops);
    Ok(Report {
        run: Run::new("client", &ep, p.iterations, totals).with_stamps(comp.stamps()),
        client_id: Some(id),
        repeat: p.repeat,
        final_counter: None,
        expected_counter: None,
        final_lock: None,
        final_inside: None,
        lock_attempts: made_cas.then_some(attempts),
        lock_retries: made_cas.then_some(retries),
        hold_us: stats::summarize(&holds),
        fetch_add_us: stats::summarize(&fadds),
        cmp_swap_us: stats::summarize(&cass),
        // A CAS-only client makes no Fetch-and-Add.
        last_fetched: (p.repeat != Some(Repeat::Cas)).then_some(last_fetched),
    })
}

/// `clients` clients at once, one thread (and device context) each.
pub fn clients(c: &Client, p: Params) -> Result<Vec<Report>, DemoError> {
    let results: Vec<Result<Report, DemoError>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..p.clients).map(|_| s.spawn(|| client(c, p))).collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(DemoError::Other("a client thread panicked".into())))
            })
            .collect()
    });
    let mut reports: Vec<Report> = results.into_iter().collect::<Result<_, _>>()?;
    reports.sort_by_key(|r| r.client_id);
    Ok(reports)
}

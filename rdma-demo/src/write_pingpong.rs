//! RDMA WRITE ping-pong, the measurement of perftest's `ib_write_lat`: each side exposes a
//! buffer with REMOTE_WRITE; the client WRITEs message `n` into the server's buffer, the
//! server polls its memory until message `n` is there and WRITEs it back, and the client polls
//! its own memory for the reply. No receive is posted, no completion is waited for on the
//! timed path: what is timed is the two WRITEs and their placement in memory. One-way latency
//! is half the round trip, as `ib_write_lat` reports it.
//!
//! The last 8 bytes of a message hold its number (1, 2, …): a WRITE lands in memory in order,
//! so once they show `n`, the whole message `n` is there. The bytes before it are a pattern
//! each side writes once, so that the timed path only stores the number (as `ib_write_lat`
//! changes one byte); each side checks the peer's pattern at the end. Both sides poll memory,
//! so there is no event mode (`rdma-demo write-pingpong` refuses `--mode event`). The WRITEs are signaled; their completions are collected while
//! polling, off the timed path.

use std::time::{Duration, Instant};

use serde::Serialize;

use crate::completion::{CompletionError, Completions, Mode, expect};
use crate::endpoint::{Endpoint, random_psn};
use crate::error::DemoError;
use crate::exchange::{ConnInfo, Demo, ExchangeError, RemoteBuf};
use crate::report::Run;
use crate::role::{Client, Server};
use crate::stats::{RoundTrips, Totals};
use crate::verbs::{Access, MemoryRegion, QueuePair, SendOp, WcOpcode};

const WR_WRITE: u64 = 1;
/// WRITEs in flight at most (the send queue's depth).
const SEND_DEPTH: u32 = 2;

/// What both sides must agree on; `size` is a multiple of 8, at least 8 (the message number
/// fills the last 8 bytes).
pub use crate::exchange::SizedParams as Params;

/// Offset of the message number in a message of `p.size` bytes.
fn seq_offset(p: &Params) -> usize {
    p.size as usize - 8
}

/// Byte `i` of every message (before its number) from the client (`from_server` false) or
/// the server.
pub fn pattern(i: usize, from_server: bool) -> u8 {
    let salt = if from_server { 0xa5 } else { 0x3c };
    (i.wrapping_mul(29).wrapping_add(11) % 251) as u8 ^ salt
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    #[serde(flatten)]
    pub run: Run,
    pub size: u32,
    /// WRITE round trips, post to the reply in memory, and their halves, as `ib_write_lat`
    /// reports (client).
    #[serde(flatten)]
    pub latency: RoundTrips,
}

impl Report {
    pub fn render(&self) -> String {
        let title =
            self.run
                .sized_title(": RDMA WRITE ping-pong", self.size, Some("memory polling"));
        self.run
            .render_round_trips(&title, self.size, &self.latency, "ib_write_lat")
    }
}

/// One side: its QP, the buffer the peer writes into, the one it writes from.
struct Side {
    qp: QueuePair,
    comp: Completions,
    inbox: MemoryRegion,
    outbox: MemoryRegion,
    /// WRITEs posted whose completions have not been collected.
    in_flight: u32,
    p: Params,
    timeout: Duration,
}

impl Side {
    fn new(ep: &Endpoint, p: Params, server: bool) -> Result<(Self, u32), DemoError> {
        let size = p.size as usize;
        let remote = Access {
            remote_write: true,
            ..Access::default()
        };
        let inbox = ep.exposed_region(size, remote)?;
        let outbox = MemoryRegion::new(&ep.pd, size, Access::LOCAL_WRITE)?;
        outbox.fill(0, seq_offset(&p), |i| pattern(i, server));
        let cq = ep.cq(SEND_DEPTH * 2)?;
        let qp = ep.init_qp(&cq, SEND_DEPTH, 1, remote)?;
        let comp = ep.completions(cq)?;
        Ok((
            Side {
                qp,
                comp,
                inbox,
                outbox,
                in_flight: 0,
                p,
                timeout: ep.timeout,
            },
            random_psn(),
        ))
    }

    /// What this side tells the peer: its QP and the buffer the peer writes into.
    fn info(&self, ep: &Endpoint, psn: u32) -> ConnInfo {
        let buffer = RemoteBuf {
            addr: self.inbox.addr(0),
            rkey: self.inbox.rkey(),
            len: self.p.size,
        };
        ep.local_info(
            Demo::WritePingPong,
            &self.qp,
            psn,
            self.p.iterations,
            self.p.size,
            0,
            Some(buffer),
        )
    }

    /// Collects the completions of earlier WRITEs that are there, without waiting.
    fn collect(&mut self) -> Result<(), DemoError> {
        while let Some(wc) = self.comp.ready()? {
            let what = || "an RDMA WRITE".to_string();
            expect(wc, WcOpcode::RdmaWrite, &what)?;
            self.in_flight = self.in_flight.saturating_sub(1);
        }
        Ok(())
    }

    /// WRITEs message `n` into the peer's buffer.
    fn send(&mut self, peer: RemoteBuf, n: u64) -> Result<(), DemoError> {
        while self.in_flight >= SEND_DEPTH {
            let what = || "an RDMA WRITE".to_string();
            let wc = self.comp.next(&what)?;
            expect(wc, WcOpcode::RdmaWrite, &what)?;
            self.in_flight -= 1;
        }
        self.outbox.write_u64(seq_offset(&self.p), n);
        self.qp.post_send(
            WR_WRITE,
            SendOp::RdmaWrite(peer.at(0)),
            &self.outbox,
            0,
            self.p.size,
            true,
        )?;
        self.in_flight += 1;
        Ok(())
    }

    /// Polls the buffer until message `n` is there; `what` names it in a timeout.
    fn wait_for(&mut self, n: u64, what: &dyn Fn() -> String) -> Result<(), DemoError> {
        let seq = seq_offset(&self.p);
        let deadline = Instant::now() + self.timeout;
        let mut spins = 0u32;
        while self.inbox.read_u64(seq) != n {
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(256) {
                self.collect()?;
                if Instant::now() >= deadline {
                    return Err(CompletionError::Timeout {
                        what: what(),
                        mode: Mode::Poll,
                        timeout: self.timeout,
                    }
                    .into());
                }
            }
        }
        Ok(())
    }

    /// Checks that the buffer holds the peer's pattern (`from_server`) and message number `n`.
    fn check(&self, n: u64, from_server: bool) -> Result<(), DemoError> {
        let seq = seq_offset(&self.p);
        let mut got = vec![0u8; seq];
        self.inbox.read(0, &mut got);
        if let Some(i) = (0..seq).find(|&i| got[i] != pattern(i, from_server)) {
            return Err(DemoError::Verify(format!(
                "the peer's message: byte {i} is {:#04x}, want {:#04x}",
                got[i],
                pattern(i, from_server)
            )));
        }
        match self.inbox.read_u64(seq) {
            got if got == n => Ok(()),
            got => Err(DemoError::Verify(format!(
                "the last message is number {got}, want {n}"
            ))),
        }
    }

    /// Waits for the completions of the WRITEs still in flight.
    fn drain(&mut self) -> Result<(), DemoError> {
        while self.in_flight > 0 {
            let what = || "the last RDMA WRITE".to_string();
            let wc = self.comp.next(&what)?;
            expect(wc, WcOpcode::RdmaWrite, &what)?;
            self.in_flight -= 1;
        }
        Ok(())
    }
}

/// The peer's buffer, which must be as large as ours.
fn peer_buffer(peer: &ConnInfo, p: Params, who: &str) -> Result<RemoteBuf, DemoError> {
    match peer.buffer {
        Some(b) if b.len == p.size => Ok(b),
        other => Err(ExchangeError::Mismatch {
            peer: who.to_string(),
            what: format!("want a {}-byte buffer, got {other:?}", p.size),
        }
        .into()),
    }
}

/// Server: answers each of the client's messages with its own.
pub fn server(s: &Server, p: Params) -> Result<Report, DemoError> {
    let ep = Endpoint::open(s.opts)?;
    let (mut side, psn) = Side::new(&ep, p, true)?;
    let ours = side.info(&ep, psn);
    let peer = s.handshake(&ours, p.same_run(), |theirs| {
        ep.connect(&side.qp, psn, theirs)
    })?;
    let remote = peer_buffer(&peer, p, "the client")?;
    let _phase = crate::phase::data(s.opts.fault)?;
    let start = Instant::now();
    for n in 1..=u64::from(p.iterations) {
        side.wait_for(n, &|| format!("the client's message {n}"))?;
        side.send(remote, n)?;
    }
    side.drain()?;
    let total = start.elapsed();
    side.check(u64::from(p.iterations), false)?;
    let totals = Totals::ping_pong(total, p.iterations, side.comp.wait_time());
    let mut run = Run::new("server", &ep, p.iterations, totals);
    run.notes.push(format!(
        "server: {} bytes at {:#x} rkey {:#x} (REMOTE_WRITE) for the client's messages",
        p.size,
        side.inbox.addr(0),
        side.inbox.rkey()
    ));
    Ok(Report {
        run,
        size: p.size,
        latency: RoundTrips::default(),
    })
}

/// Client: times each message's round trip, from its post to the reply in memory.
pub fn client(c: &Client, p: Params) -> Result<Report, DemoError> {
    let ep = Endpoint::open(c.opts)?;
    let (mut side, psn) = Side::new(&ep, p, false)?;
    let ours = side.info(&ep, psn);
    let peer = c.handshake(&ours, p.same_run())?;
    let remote = peer_buffer(&peer, p, &c.server_name())?;
    ep.connect(&side.qp, psn, &peer)?;
    let _phase = crate::phase::data(c.opts.fault)?;
    let mut rtts = Vec::with_capacity(p.iterations as usize);
    let start = Instant::now();
    for n in 1..=u64::from(p.iterations) {
        let t0 = Instant::now();
        side.send(remote, n)?;
        side.wait_for(n, &|| format!("the server's reply to message {n}"))?;
        rtts.push(t0.elapsed().as_nanos() as u64);
    }
    let total = start.elapsed();
    side.drain()?;
    side.check(u64::from(p.iterations), true)?;
    let totals = Totals::ping_pong(total, p.iterations, side.comp.wait_time());
    Ok(Report {
        run: Run::new("client", &ep, p.iterations, totals),
        size: p.size,
        latency: RoundTrips::new(&rtts),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_two_sides_write_patterns_that_differ_in_every_byte() {
        // A side that got its own bytes back (or zeros) instead of the peer's would be caught.
        for i in 0..1 << 16 {
            assert_ne!(pattern(i, false), pattern(i, true), "byte {i}");
        }
        assert!((0..4088).any(|i| pattern(i, false) != 0));
        assert!((0..4088).any(|i| pattern(i, true) != 0));
        assert_eq!(
            seq_offset(&Params {
                iterations: 1,
                size: 4096
            }),
            4088
        );
    }
}

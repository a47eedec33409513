//! SEND/RECV ping-pong, as `ibv_rc_pingpong`: the client sends a message, the server answers,
//! `iterations` times. Both sides keep one receive posted ahead.
//!
//! Memory: one region per side, `LOCAL_WRITE` only (no remote access at all): a send slot and
//! a receive slot of `size` bytes. The first 8 bytes of each message carry the iteration number
//! (the server answers with its complement) and are checked on receipt.

use std::time::{Duration, Instant};

use serde::Serialize;

use crate::completion::{Completions, check_status, expect, unexpected};
use crate::endpoint::{Endpoint, EndpointOptions, random_psn};
use crate::error::DemoError;
use crate::exchange::{ConnInfo, Demo};
use crate::report::Run;
use crate::role::{Client, Server};
use crate::stats::{RoundTrips, Totals};
use crate::verbs::{Access, MemoryRegion, QueuePair, SendOp, WcOpcode, WorkCompletion};

const WR_RECV: u64 = 1;
const WR_SEND: u64 = 2;

/// What both sides must agree on.
pub use crate::exchange::SizedParams as Params;

/// The command line of a ping-pong between two devices of this host, in one process, on any
/// free port: `rdma-demo` followed by these, then the mode, size and iterations.
pub fn loopback_args<'a>(client: &'a str, server: &'a str) -> [&'a str; 8] {
    [
        "pingpong",
        "--loopback",
        "--port",
        "0",
        "-d",
        client,
        "--server-device",
        server,
    ]
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    #[serde(flatten)]
    pub run: Run,
    pub port: u8,
    pub gid_index: Option<u8>,
    pub mtu: u32,
    pub size: u32,
    pub local_qpn: u32,
    pub remote_qpn: u32,
    /// CQ events taken (event mode).
    pub cq_events: u64,
    /// Of them, events read in one burst after `--fault-unread-events` left them queued.
    #[serde(skip_serializing_if = "is_zero")]
    pub cq_events_burst: u64,
    /// Per-iteration round trips and their halves, as perftest's `ib_send_lat` reports (client
    /// only).
    #[serde(flatten)]
    pub latency: RoundTrips,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Report {
    pub fn render(&self) -> String {
        let qps = format!(
            " port {}: QP {:#08x} <-> remote QP {:#08x}, MTU {}",
            self.port, self.local_qpn, self.remote_qpn, self.mtu
        );
        let title = self.run.sized_title(&qps, self.size, None);
        self.run
            .render_round_trips(&title, self.size, &self.latency, "ib_send_lat")
    }
}

/// The QP, MR and completions of one side; the QP is declared (and dropped) first.
struct Side {
    qp: QueuePair,
    mr: MemoryRegion,
    comp: Completions,
    ep: Endpoint,
    psn: u32,
    size: u32,
    recv_off: usize,
}

impl Side {
    fn new(opts: &EndpointOptions, size: u32) -> Result<Self, DemoError> {
        let ep = Endpoint::open(opts)?;
        let slot = (size as usize).next_multiple_of(64);
        let mr = MemoryRegion::new(&ep.pd, 2 * slot, Access::LOCAL_WRITE)?;
        let cq = ep.cq(16)?;
        let qp = ep.init_qp(&cq, 4, 4, Access::default())?;
        let comp = ep.completions(cq)?;
        let side = Side {
            qp,
            mr,
            comp,
            psn: random_psn(),
            size,
            recv_off: slot,
            ep,
        };
        side.post_recv()?;
        Ok(side)
    }

    fn post_recv(&self) -> Result<(), DemoError> {
        Ok(self
            .qp
            .post_recv(WR_RECV, &self.mr, self.recv_off, self.size)?)
    }

    fn info(&self, p: Params) -> ConnInfo {
        self.ep.local_info(
            Demo::PingPong,
            &self.qp,
            self.psn,
            p.iterations,
            p.size,
            0,
            None,
        )
    }

    fn send(&mut self, value: u64) -> Result<(), DemoError> {
        self.mr.write(0, &value.to_le_bytes());
        self.comp.stamp_post();
        Ok(self
            .qp
            .post_send(WR_SEND, SendOp::Send, &self.mr, 0, self.size, true)?)
    }

    /// Checks a receive completion and its sequence number, then reposts the receive.
    fn received(&self, byte_len: u32, want: u64) -> Result<(), DemoError> {
        let mut seq = [0u8; 8];
        self.mr.read(self.recv_off, &mut seq);
        let got = u64::from_le_bytes(seq);
        if byte_len != self.size || got != want {
            return Err(DemoError::Verify(format!(
                "received {byte_len} bytes with sequence {got:#x}, want {} bytes with {want:#x}",
                self.size
            )));
        }
        self.post_recv()
    }

    /// The next completion, which must have succeeded (either kind: the caller checks which).
    fn next_successful(&mut self, what: &dyn Fn() -> String) -> Result<WorkCompletion, DemoError> {
        let wc = self.comp.next(what)?;
        Ok(check_status(wc, what)?)
    }

    fn report(
        &self,
        role: &'static str,
        p: Params,
        peer: &ConnInfo,
        totals: Totals,
        latency: RoundTrips,
    ) -> Report {
        Report {
            run: Run::new(role, &self.ep, p.iterations, totals).with_stamps(self.comp.stamps()),
            port: self.ep.port,
            gid_index: self.ep.sgid_index,
            mtu: self.ep.mtu.bytes(),
            size: p.size,
            local_qpn: self.qp.qp_num(),
            remote_qpn: peer.qpn,
            cq_events: self.comp.events(),
            cq_events_burst: self.comp.burst(),
            latency,
        }
    }
}

/// Client side: connects to `host:port`, then runs the ping-pong.
pub fn client(c: &Client, p: Params) -> Result<Report, DemoError> {
    let mut side = Side::new(c.opts, p.size)?;
    let ours = side.info(p);
    let peer = c.handshake(&ours, p.same_run())?;
    side.ep.connect(&side.qp, side.psn, &peer)?;
    let _phase = crate::phase::data(c.opts.fault)?;

    let mut samples = Vec::with_capacity(p.iterations as usize);
    let start = Instant::now();
    for i in 0..u64::from(p.iterations) {
        let t0 = Instant::now();
        side.send(i)?;
        let (mut sent, mut received) = (false, false);
        while !(sent && received) {
            let what = || format!("iteration {i} of {}", p.iterations);
            let wc = side.next_successful(&what)?;
            match wc.opcode {
                WcOpcode::Send if !sent => sent = true,
                WcOpcode::Recv if !received => {
                    side.received(wc.byte_len, !i)?;
                    received = true;
                }
                _ => return Err(unexpected(&wc, &what).into()),
            }
        }
        samples.push(t0.elapsed().as_nanos() as u64);
    }
    let total = start.elapsed();
    let totals = Totals::ping_pong(total, p.iterations, side.comp.wait_time());
    Ok(side.report("client", p, &peer, totals, RoundTrips::new(&samples)))
}

/// Server side: accepts one client on `listener`, then answers `iterations` messages.
pub fn server(s: &Server, p: Params) -> Result<Report, DemoError> {
    let mut side = Side::new(s.opts, p.size)?;
    let ours = side.info(p);
    let peer = s.handshake(&ours, p.same_run(), |theirs| {
        side.ep.connect(&side.qp, side.psn, theirs)
    })?;
    let _phase = crate::phase::data(s.opts.fault)?;

    let mut start = None;
    let mut send_outstanding = false;
    for i in 0..u64::from(p.iterations) {
        let mut received = false;
        while !received || send_outstanding {
            let what = || format!("iteration {i} of {}", p.iterations);
            let wc = side.next_successful(&what)?;
            match wc.opcode {
                WcOpcode::Send if send_outstanding => send_outstanding = false,
                WcOpcode::Recv if !received => {
                    start.get_or_insert_with(Instant::now);
                    side.received(wc.byte_len, i)?;
                    received = true;
                }
                _ => return Err(unexpected(&wc, &what).into()),
            }
        }
        side.send(!i)?;
        send_outstanding = true;
    }
    let what = || "the completion of the last answer".to_string();
    let wc = side.comp.next(&what)?;
    expect(wc, WcOpcode::Send, &what)?;
    let total = start.map_or(Duration::ZERO, |s| s.elapsed());
    let totals = Totals::ping_pong(total, p.iterations, side.comp.wait_time());
    Ok(side.report("server", p, &peer, totals, RoundTrips::default()))
}

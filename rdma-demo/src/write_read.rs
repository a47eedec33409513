//! RDMA WRITE/READ: the client reads the server's buffer, then `iterations` times writes a
//! pattern into it and reads it back, checking every byte. The server's CPU takes no part: it
//! fills its buffer once, waits for the client's final SEND (in poll mode polling every
//! 5 ms, not spinning: [`Completions::passive`]), and checks the last pattern.
//!
//! Memory: the server's demo buffer allows REMOTE_READ | REMOTE_WRITE (and the LOCAL_WRITE the
//! verbs require with REMOTE_WRITE), and nothing else; the final message lands in a separate
//! 8-byte LOCAL_WRITE region. The client's regions are LOCAL_WRITE only.

use std::fmt::Write as _;
use std::time::Instant;

use serde::Serialize;

use crate::completion::{expect, post_and_wait};
use crate::endpoint::{Endpoint, Fault, random_psn};
use crate::error::DemoError;
use crate::exchange::{Demo, ExchangeError, RemoteBuf};
use crate::report::Run;
use crate::role::{Client, Server};
use crate::stats::{self, Summary, Totals};
use crate::verbs::{Access, MemoryRegion, SendOp, WcOpcode};

const WR_RECV: u64 = 1;
const WR_WRITE: u64 = 2;
const WR_READ: u64 = 3;
const WR_DONE: u64 = 4;

/// What both sides must agree on.
pub use crate::exchange::SizedParams as Params;

/// The server's initial content.
pub fn server_pattern(i: usize) -> u8 {
    (i.wrapping_mul(31).wrapping_add(7) % 251) as u8
}

/// What the client writes in iteration `n`.
pub fn client_pattern(n: u32, i: usize) -> u8 {
    (i.wrapping_mul(17).wrapping_add(n as usize * 13 + 3) % 253) as u8 ^ 0x5a
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    #[serde(flatten)]
    pub run: Run,
    pub size: u32,
    /// The first bytes read from the server before writing (client).
    pub first_read: Option<String>,
    /// Latency of each RDMA WRITE, post to completion (client).
    pub write_us: Option<Summary>,
    /// Latency of each RDMA READ, post to completion (client).
    pub read_us: Option<Summary>,
    pub bytes_verified: u64,
}

impl Report {
    pub fn render(&self) -> String {
        let title = self.run.sized_title(": RDMA WRITE/READ", self.size, None);
        let mut details = String::new();
        if let Some(first) = &self.first_read {
            let _ = writeln!(
                details,
                "read from the server: {first} ... (its initial pattern: verified)"
            );
        }
        let _ = writeln!(details, "bytes verified: {}", self.bytes_verified);
        self.run.render_with_tables(
            &title,
            &details,
            "one WRITE + one READ per iteration",
            &[("RDMA WRITE", &self.write_us), ("RDMA READ", &self.read_us)],
            self.size.into(),
            |name| format!("{name} latency, post to completion (full, not halved)"),
        )
    }
}

/// Server: exposes a buffer, waits for the client's final SEND, checks the last pattern.
pub fn server(s: &Server, p: Params) -> Result<Report, DemoError> {
    let ep = Endpoint::open(s.opts)?;
    let size = p.size as usize;
    let remote = Access {
        remote_read: true,
        remote_write: true,
        ..Access::default()
    };
    let demo = ep.exposed_region(size, remote)?;
    demo.fill(0, size, server_pattern);
    let signal = MemoryRegion::new(&ep.pd, 8, Access::LOCAL_WRITE)?;
    let cq = ep.cq(4)?;
    let qp = ep.init_qp(&cq, 1, 1, remote)?;
    qp.post_recv(WR_RECV, &signal, 0, 8)?;
    let mut comp = ep.completions(cq)?.passive();
    let psn = random_psn();
    let buffer = RemoteBuf {
        addr: demo.addr(0),
        rkey: demo.rkey(),
        len: p.size,
    };
    let ours = ep.local_info(
        Demo::WriteRead,
        &qp,
        psn,
        p.iterations,
        p.size,
        0,
        Some(buffer),
    );
    s.handshake(&ours, p.same_run(), |theirs| ep.connect(&qp, psn, theirs))?;
    let _phase = crate::phase::data(s.opts.fault)?;
    let start = Instant::now();
    // The client keeps rewriting the buffer: as long as it changes, the client is alive.
    let mut last = vec![0u8; size.min(64)];
    demo.read(0, &mut last);
    let wc = loop {
        if let Some(wc) = comp.try_next_within(s.opts.timeout)? {
            break wc;
        }
        let mut now = vec![0u8; last.len()];
        demo.read(0, &mut now);
        if now == last {
            return Err(comp
                .timed_out("the client's final message (and its buffer did not change)".to_string())
                .into());
        }
        last = now;
    };
    let what = || "the client's final message".to_string();
    expect(wc, WcOpcode::Recv, &what)?;
    let done = signal.read_u64(0);
    if done != u64::from(p.iterations) {
        return Err(DemoError::Verify(format!(
            "the client reports {done} iterations, want {}",
            p.iterations
        )));
    }
    let mut got = vec![0u8; size];
    demo.read(0, &mut got);
    let last_n = p.iterations - 1;
    if let Some(i) = (0..size).find(|&i| got[i] != client_pattern(last_n, i)) {
        return Err(DemoError::Verify(format!(
            "server buffer byte {i} is {:#04x}, want {:#04x} (the client's last pattern)",
            got[i],
            client_pattern(last_n, i)
        )));
    }
    let totals = Totals::new(
        start.elapsed(),
        u64::from(p.iterations),
        comp.wait_time(),
        0,
        1,
    );
    let mut run = Run::new("server", &ep, p.iterations, totals).with_stamps(comp.stamps());
    run.notes.push(format!(
        "server: exposed {size} bytes at {:#x} rkey {:#x} (REMOTE_READ|REMOTE_WRITE); its CPU only waited for the final SEND",
        buffer.addr, buffer.rkey
    ));
    Ok(Report {
        run,
        size: p.size,
        first_read: None,
        write_us: None,
        read_us: None,
        bytes_verified: size as u64,
    })
}

/// Client: READ, then WRITE + READ back + verify per iteration, then the final SEND.
pub fn client(c: &Client, p: Params) -> Result<Report, DemoError> {
    let ep = Endpoint::open(c.opts)?;
    let size = p.size as usize;
    // [write source | read destination], both local only.
    let local = MemoryRegion::new(&ep.pd, 2 * size, Access::LOCAL_WRITE)?;
    let cq = ep.cq(4)?;
    let qp = ep.init_qp(&cq, 2, 1, Access::default())?;
    let mut comp = ep.completions(cq)?;
    let psn = random_psn();
    let ours = ep.local_info(Demo::WriteRead, &qp, psn, p.iterations, p.size, 0, None);
    let peer = c.handshake(&ours, p.same_run())?;
    let remote = match peer.buffer {
        Some(b) if b.len == p.size && ep.fault == Some(Fault::BadRkey) => RemoteBuf {
            rkey: b.rkey ^ 0x5a5a_5a5a,
            ..b
        },
        Some(b) if b.len == p.size => b,
        other => {
            return Err(ExchangeError::Mismatch {
                peer: c.server_name(),
                what: format!(
                    "the server exposes {:?}, want a {}-byte buffer",
                    other, p.size
                ),
            }
            .into());
        }
    };
    ep.connect(&qp, psn, &peer)?;
    let _phase = crate::phase::data(c.opts.fault)?;

    let mut op = |wr_id, sop, off, what: &str| {
        post_and_wait(&mut comp, &qp, wr_id, sop, &local, off, p.size, &|| {
            what.to_string()
        })
    };
    let start = Instant::now();
    // 1. What does the server hold?
    let read_op = SendOp::RdmaRead(remote.at(0));
    op(WR_READ, read_op, size, "the first RDMA READ")?;
    let mut got = vec![0u8; size];
    local.read(size, &mut got);
    if let Some(i) = (0..size).find(|&i| got[i] != server_pattern(i)) {
        return Err(DemoError::Verify(format!(
            "first READ: byte {i} is {:#04x}, want the server's {:#04x}",
            got[i],
            server_pattern(i)
        )));
    }
    let first_read = got
        .iter()
        .take(16)
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(" ");
    let mut writes = Vec::with_capacity(p.iterations as usize);
    let mut reads = Vec::with_capacity(p.iterations as usize);
    let mut verified = size as u64;
    for n in 0..p.iterations {
        local.fill(0, size, |i| client_pattern(n, i));
        local.fill(size, size, |_| 0);
        let write_op = SendOp::RdmaWrite(remote.at(0));
        writes.push(op(WR_WRITE, write_op, 0, "RDMA WRITE")?);
        reads.push(op(WR_READ, read_op, size, "RDMA READ")?);
        local.read(size, &mut got);
        if let Some(i) = (0..size).find(|&i| got[i] != client_pattern(n, i)) {
            return Err(DemoError::Verify(format!(
                "iteration {n}: read back byte {i} as {:#04x}, wrote {:#04x}",
                got[i],
                client_pattern(n, i)
            )));
        }
        verified += size as u64;
    }
    let total = start.elapsed();
    // 2. Tell the server we are done: a SEND, since TCP is closed.
    local.write(0, &u64::from(p.iterations).to_le_bytes());
    let what = || "the final SEND".to_string();
    post_and_wait(&mut comp, &qp, WR_DONE, SendOp::Send, &local, 0, 8, &what)?;
    let ops = 2 * u64::from(p.iterations) + 1;
    let totals = Totals::one_sided_client(total, p.iterations, comp.wait_time(), ops);
    Ok(Report {
        run: Run::new("client", &ep, p.iterations, totals).with_stamps(comp.stamps()),
        size: p.size,
        first_read: Some(first_read),
        write_us: stats::summarize(&writes),
        read_us: stats::summarize(&reads),
        bytes_verified: verified,
    })
}

//! The TCP exchange of connection information before the data phase.
//!
//! The client connects, both sides send one [`ConnInfo`] message, and the connection is closed:
//! everything after that goes over RDMA. A message is a fixed 8-byte header — magic `RDMO`,
//! version (u16), body length (u16) — and a body of [`BODY_LEN`] bytes, all big-endian:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 1 | demo (1 ping-pong, 2 write-read, 3 atomic) |
//! | 1 | 1 | flags (bit 0: a remote buffer follows; other bits 0) |
//! | 2 | 2 | path MTU in bytes |
//! | 4 | 2 | LID |
//! | 6 | 2 | reserved, 0 |
//! | 8 | 4 | QP number (24 bits, not 0) |
//! | 12 | 4 | first PSN (24 bits) |
//! | 16 | 16 | GID |
//! | 32 | 4 | iterations |
//! | 36 | 4 | message size |
//! | 40 | 4 | client id (atomic; 0 otherwise) |
//! | 44 | 8 | buffer address |
//! | 52 | 4 | rkey |
//! | 56 | 4 | buffer length |
//!
//! Every field is validated on receipt; a header is rejected before its body is read.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use crate::verbs::{Gid, Mtu, RemoteAddr, RemoteQp, wait_readable};

pub const MAGIC: [u8; 4] = *b"RDMO";
pub const VERSION: u16 = 1;
pub const HEADER_LEN: usize = 8;
pub const BODY_LEN: usize = 60;
/// Longer bodies are refused without reading them.
pub const MAX_BODY_LEN: usize = 1024;
/// Upper bound of `iterations` in a message (the CLI has the same bound).
pub const MAX_ITERATIONS: u32 = 10_000_000;
/// Upper bound of `size` in a message (the CLI has the same bound).
pub const MAX_SIZE: u32 = 1 << 24;

const FLAG_BUFFER: u8 = 1;

/// Which demo a message belongs to; both sides must run the same one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Demo {
    PingPong,
    WriteRead,
    Atomic,
    WritePingPong,
}

impl Demo {
    fn code(self) -> u8 {
        match self {
            Demo::PingPong => 1,
            Demo::WriteRead => 2,
            Demo::Atomic => 3,
            Demo::WritePingPong => 4,
        }
    }

    fn from_code(code: u8) -> Option<Self> {
        match code {
            1 => Some(Demo::PingPong),
            2 => Some(Demo::WriteRead),
            3 => Some(Demo::Atomic),
            4 => Some(Demo::WritePingPong),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Demo::PingPong => "pingpong",
            Demo::WriteRead => "write-read",
            Demo::Atomic => "atomic",
            Demo::WritePingPong => "write-pingpong",
        }
    }
}

/// A buffer the peer may access with one-sided operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteBuf {
    pub addr: u64,
    pub rkey: u32,
    pub len: u32,
}

impl RemoteBuf {
    /// The address of byte `offset` with the rkey.
    pub fn at(&self, offset: u64) -> RemoteAddr {
        RemoteAddr {
            addr: self.addr + offset,
            rkey: self.rkey,
        }
    }
}

/// One side's connection information.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnInfo {
    pub demo: Demo,
    pub mtu: Mtu,
    pub lid: u16,
    pub qpn: u32,
    pub psn: u32,
    pub gid: Gid,
    pub iterations: u32,
    pub size: u32,
    pub client_id: u32,
    pub buffer: Option<RemoteBuf>,
}

impl ConnInfo {
    pub fn remote_qp(&self) -> RemoteQp {
        RemoteQp {
            qpn: self.qpn,
            psn: self.psn,
            lid: self.lid,
            gid: self.gid,
        }
    }
}

/// A message that does not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("bad magic {0:02x?} (not an rdma-demo peer?)")]
    BadMagic([u8; 4]),
    #[error("unsupported protocol version {0} (this is version {VERSION})")]
    UnsupportedVersion(u16),
    #[error("oversized message: body of {0} bytes (limit {MAX_BODY_LEN})")]
    Oversized(usize),
    #[error("body of {got} bytes, version {VERSION} has {BODY_LEN}")]
    BadLength { got: usize },
    #[error("truncated message: {got} of {want} bytes")]
    Truncated { got: usize, want: usize },
    #[error("invalid field {field}: {value}")]
    Field { field: &'static str, value: String },
}

/// Encodes a complete message, header included.
pub fn encode(info: &ConnInfo) -> Vec<u8> {
    let mut m = Vec::with_capacity(HEADER_LEN + BODY_LEN);
    m.extend_from_slice(&MAGIC);
    m.extend_from_slice(&VERSION.to_be_bytes());
    m.extend_from_slice(&(BODY_LEN as u16).to_be_bytes());
    m.push(info.demo.code());
    m.push(if info.buffer.is_some() {
        FLAG_BUFFER
    } else {
        0
    });
    m.extend_from_slice(&(info.mtu.bytes() as u16).to_be_bytes());
    m.extend_from_slice(&info.lid.to_be_bytes());
    m.extend_from_slice(&0u16.to_be_bytes());
    m.extend_from_slice(&info.qpn.to_be_bytes());
    m.extend_from_slice(&info.psn.to_be_bytes());
    m.extend_from_slice(info.gid.as_bytes());
    m.extend_from_slice(&info.iterations.to_be_bytes());
    m.extend_from_slice(&info.size.to_be_bytes());
    m.extend_from_slice(&info.client_id.to_be_bytes());
    let buf = info.buffer.unwrap_or(RemoteBuf {
        addr: 0,
        rkey: 0,
        len: 0,
    });
    m.extend_from_slice(&buf.addr.to_be_bytes());
    m.extend_from_slice(&buf.rkey.to_be_bytes());
    m.extend_from_slice(&buf.len.to_be_bytes());
    debug_assert_eq!(m.len(), HEADER_LEN + BODY_LEN);
    m
}

/// Checks a header; returns the body length to read.
pub fn decode_header(h: &[u8; HEADER_LEN]) -> Result<usize, DecodeError> {
    let magic = [h[0], h[1], h[2], h[3]];
    if magic != MAGIC {
        return Err(DecodeError::BadMagic(magic));
    }
    let version = u16::from_be_bytes([h[4], h[5]]);
    if version != VERSION {
        return Err(DecodeError::UnsupportedVersion(version));
    }
    let len = usize::from(u16::from_be_bytes([h[6], h[7]]));
    if len > MAX_BODY_LEN {
        return Err(DecodeError::Oversized(len));
    }
    if len != BODY_LEN {
        return Err(DecodeError::BadLength { got: len });
    }
    Ok(len)
}

fn field(field: &'static str, value: impl ToString) -> DecodeError {
    DecodeError::Field {
        field,
        value: value.to_string(),
    }
}

/// Decodes and validates a body.
pub fn decode_body(b: &[u8]) -> Result<ConnInfo, DecodeError> {
    if b.len() != BODY_LEN {
        return Err(DecodeError::BadLength { got: b.len() });
    }
    let u16_at = |o: usize| u16::from_be_bytes([b[o], b[o + 1]]);
    let u32_at = |o: usize| u32::from_be_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
    let u64_at = |o: usize| (u64::from(u32_at(o)) << 32) | u64::from(u32_at(o + 4));
    let demo = Demo::from_code(b[0]).ok_or_else(|| field("demo", b[0]))?;
    let flags = b[1];
    if flags & !FLAG_BUFFER != 0 {
        return Err(field("flags", format!("{flags:#04x}")));
    }
    let mtu = Mtu::from_bytes(u32::from(u16_at(2))).ok_or_else(|| field("mtu", u16_at(2)))?;
    let lid = u16_at(4);
    if u16_at(6) != 0 {
        return Err(field("reserved", u16_at(6)));
    }
    let qpn = u32_at(8);
    if qpn == 0 || qpn > 0xff_ffff {
        return Err(field("qpn", format!("{qpn:#x}")));
    }
    let psn = u32_at(12);
    if psn > 0xff_ffff {
        return Err(field("psn", format!("{psn:#x}")));
    }
    let mut gid = [0u8; 16];
    gid.copy_from_slice(&b[16..32]);
    let iterations = u32_at(32);
    if iterations == 0 || iterations > MAX_ITERATIONS {
        return Err(field("iterations", iterations));
    }
    let size = u32_at(36);
    if size == 0 || size > MAX_SIZE {
        return Err(field("size", size));
    }
    let client_id = u32_at(40);
    let (addr, rkey, len) = (u64_at(44), u32_at(52), u32_at(56));
    let buffer = if flags & FLAG_BUFFER != 0 {
        if addr == 0 {
            return Err(field("buffer address", 0));
        }
        if len == 0 || len > MAX_SIZE {
            return Err(field("buffer length", len));
        }
        if addr.checked_add(u64::from(len)).is_none() {
            return Err(field("buffer address", format!("{addr:#x}+{len}")));
        }
        Some(RemoteBuf { addr, rkey, len })
    } else {
        if addr != 0 || rkey != 0 || len != 0 {
            return Err(field("buffer", "set without the buffer flag"));
        }
        None
    };
    Ok(ConnInfo {
        demo,
        mtu,
        lid,
        qpn,
        psn,
        gid: Gid::from_bytes(gid),
        iterations,
        size,
        client_id,
        buffer,
    })
}

/// Decodes a complete message (header and body).
pub fn decode(m: &[u8]) -> Result<ConnInfo, DecodeError> {
    if m.len() < HEADER_LEN {
        return Err(DecodeError::Truncated {
            got: m.len(),
            want: HEADER_LEN,
        });
    }
    let mut h = [0u8; HEADER_LEN];
    h.copy_from_slice(&m[..HEADER_LEN]);
    let len = decode_header(&h)?;
    let body = &m[HEADER_LEN..];
    if body.len() < len {
        return Err(DecodeError::Truncated {
            got: m.len(),
            want: HEADER_LEN + len,
        });
    }
    if body.len() > len {
        return Err(DecodeError::BadLength { got: body.len() });
    }
    decode_body(body)
}

/// Why the exchange failed.
#[derive(Debug, thiserror::Error)]
pub enum ExchangeError {
    /// No TCP connection (refused, unreachable, timed out); exit code 5.
    #[error("connecting to {addr}: {source}")]
    Connect { addr: String, source: io::Error },
    #[error("cannot listen on {addr}: {source}{}", listen_hint(source))]
    Listen { addr: String, source: io::Error },
    #[error("no client connected to {addr} within {}", secs(*timeout))]
    AcceptTimeout { addr: String, timeout: Duration },
    #[error("accepting on {addr}: {source}")]
    Accept { addr: String, source: io::Error },
    /// The rest: exit code 6.
    #[error("peer {peer} closed the connection during the exchange")]
    PeerClosed { peer: String },
    /// The whole message has one deadline, however its bytes trickle in.
    #[error(
        "peer {peer} sent {got} of the {} bytes of its message within {} (the whole message must arrive within --timeout)",
        HEADER_LEN + BODY_LEN,
        secs(*timeout)
    )]
    Timeout {
        peer: String,
        timeout: Duration,
        got: usize,
    },
    #[error("exchange with {peer}: {source}")]
    Io { peer: String, source: io::Error },
    #[error("malformed message from {peer}: {source}")]
    Malformed { peer: String, source: DecodeError },
    #[error("peer {peer} runs {theirs}, not {ours}")]
    DemoMismatch {
        peer: String,
        ours: &'static str,
        theirs: &'static str,
    },
    #[error("MTU mismatch: ours is {ours}, peer {peer} uses {theirs} (set the same --mtu on both)")]
    MtuMismatch {
        peer: String,
        ours: u32,
        theirs: u32,
    },
    #[error("parameter mismatch with peer {peer}: {what}")]
    Mismatch { peer: String, what: String },
}

impl ExchangeError {
    /// Failed before any byte was exchanged (exit code 5), as opposed to during it (6).
    pub fn is_connection(&self) -> bool {
        matches!(
            self,
            ExchangeError::Connect { .. }
                | ExchangeError::Listen { .. }
                | ExchangeError::AcceptTimeout { .. }
                | ExchangeError::Accept { .. }
        )
    }
}

fn listen_hint(e: &io::Error) -> &'static str {
    if e.kind() == io::ErrorKind::AddrInUse {
        " (another server on this port? pick another with -p)"
    } else {
        ""
    }
}

pub fn secs(d: Duration) -> String {
    format!("{} s", d.as_secs_f64())
}

/// Connects to `host:port`, trying each address, and again while the connection is refused
/// (the server may not be listening yet), until `timeout` is used up.
pub fn connect(host: &str, port: u16, timeout: Duration) -> Result<TcpStream, ExchangeError> {
    let addr = format!("{host}:{port}");
    let err = |source| ExchangeError::Connect {
        addr: addr.clone(),
        source,
    };
    let addrs: Vec<SocketAddr> = (host, port).to_socket_addrs().map_err(err)?.collect();
    let deadline = Instant::now() + timeout;
    let mut last = io::Error::new(io::ErrorKind::NotFound, "no address");
    loop {
        let mut refused = false;
        for a in &addrs {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            match TcpStream::connect_timeout(a, left) {
                Ok(s) => return Ok(s),
                Err(e) => {
                    refused |= e.kind() == io::ErrorKind::ConnectionRefused;
                    last = e;
                }
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if !refused || left.is_zero() {
            return Err(err(last));
        }
        std::thread::sleep(left.min(Duration::from_millis(50)));
    }
}

/// Listens on `bind:port` (port 0: any free port).
pub fn listen(bind: &str, port: u16) -> Result<TcpListener, ExchangeError> {
    let addr = format!("{bind}:{port}");
    TcpListener::bind((bind, port)).map_err(|source| ExchangeError::Listen { addr, source })
}

/// Accepts one connection within `timeout`.
pub fn accept(listener: &TcpListener, timeout: Duration) -> Result<TcpStream, ExchangeError> {
    let addr = listener
        .local_addr()
        .map_or_else(|_| "?".to_string(), |a| a.to_string());
    let ready =
        wait_readable(listener.as_fd(), timeout).map_err(|source| ExchangeError::Accept {
            addr: addr.clone(),
            source,
        })?;
    if !ready {
        return Err(ExchangeError::AcceptTimeout { addr, timeout });
    }
    let (stream, _) = listener
        .accept()
        .map_err(|source| ExchangeError::Accept { addr, source })?;
    Ok(stream)
}

/// How a read of a whole buffer ended.
enum Got {
    Full,
    /// End of stream after this many bytes.
    Eof(usize),
    /// The deadline passed after this many bytes.
    Late(usize),
}

/// Reads all of `buf` by `deadline` (one deadline for the whole buffer, not per read: a peer
/// sending a byte at a time cannot stretch it).
fn read_by(s: &mut TcpStream, buf: &mut [u8], deadline: Instant) -> io::Result<Got> {
    let mut got = 0;
    while got < buf.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(Got::Late(got));
        }
        s.set_read_timeout(Some(left))?;
        match s.read(&mut buf[got..]) {
            Ok(0) => return Ok(Got::Eof(got)),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Ok(Got::Late(got));
            }
            Err(e) => return Err(e),
        }
    }
    Ok(Got::Full)
}

/// Sends ours, receives theirs (each message within `timeout`), and checks that the peer runs the
/// same demo with the same MTU. The stream is dropped (closed) by the caller afterwards.
pub fn exchange(
    stream: &mut TcpStream,
    ours: &ConnInfo,
    timeout: Duration,
) -> Result<ConnInfo, ExchangeError> {
    let theirs = send_and_receive(stream, ours, timeout)?;
    check_peer(stream, ours, &theirs)?;
    Ok(theirs)
}

/// Both sides must run the same `-n` (and the same `-s` when `size` is given), as perftest's
/// tools require.
pub fn check_same_run(
    stream: &TcpStream,
    theirs: &ConnInfo,
    iterations: u32,
    size: Option<u32>,
) -> Result<(), ExchangeError> {
    if theirs.iterations == iterations && size.is_none_or(|s| s == theirs.size) {
        return Ok(());
    }
    let what = match size {
        Some(s) => format!(
            "peer runs -n {} -s {}, we run -n {iterations} -s {s} (use the same on both sides)",
            theirs.iterations, theirs.size
        ),
        None => format!(
            "peer runs -n {}, we run -n {iterations} (use the same on both sides)",
            theirs.iterations
        ),
    };
    Err(ExchangeError::Mismatch {
        peer: peer_name(stream),
        what,
    })
}

/// What both sides of one run must agree on, besides the demo and the MTU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SameRun {
    pub iterations: u32,
    /// Message size, for the demos that have one.
    pub size: Option<u32>,
}

/// The parameters of a demo with a message size (ping-pong, WRITE/READ, WRITE ping-pong): both
/// sides must run the same ones.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct SizedParams {
    pub iterations: u32,
    pub size: u32,
}

impl SizedParams {
    /// What the peer must run too.
    pub fn same_run(&self) -> SameRun {
        SameRun {
            iterations: self.iterations,
            size: Some(self.size),
        }
    }
}

/// The client's handshake: connect to `host:port`, swap messages, check that the peer runs the
/// same demo, MTU and run. The TCP connection is closed when this returns, before the data
/// phase starts.
pub fn client_handshake(
    host: &str,
    port: u16,
    ours: &ConnInfo,
    run: SameRun,
    timeout: Duration,
) -> Result<ConnInfo, ExchangeError> {
    let mut stream = connect(host, port, timeout)?;
    let theirs = exchange(&mut stream, ours, timeout)?;
    check_same_run(&stream, &theirs, run.iterations, run.size)?;
    Ok(theirs)
}

/// The server's handshake, the counterpart of [`client_handshake`]: accept one client on
/// `listener`, receive its message and check it. On a mismatch the server still answers, so
/// that the client reports the mismatch from its side too. Otherwise `connect` brings our QP
/// up with theirs before we answer: the client starts sending as soon as it has our message.
pub fn server_handshake<E: From<ExchangeError>>(
    listener: &TcpListener,
    ours: &ConnInfo,
    run: SameRun,
    timeout: Duration,
    connect: impl FnOnce(&ConnInfo) -> Result<(), E>,
) -> Result<ConnInfo, E> {
    let mut stream = accept(listener, timeout)?;
    let theirs = receive(&mut stream, timeout)?;
    if let Err(e) = check_peer(&stream, ours, &theirs)
        .and_then(|()| check_same_run(&stream, &theirs, run.iterations, run.size))
    {
        let _ = send(&mut stream, ours, timeout);
        return Err(e.into());
    }
    connect(&theirs)?;
    send(&mut stream, ours, timeout)?;
    Ok(theirs)
}

/// The name of the peer, for messages.
pub fn peer_name(stream: &TcpStream) -> String {
    stream
        .peer_addr()
        .map_or_else(|_| "?".to_string(), |a| a.to_string())
}

/// Receives the peer's message, all of it within `timeout`, without checking it against ours
/// (the server reads first).
pub fn receive(stream: &mut TcpStream, timeout: Duration) -> Result<ConnInfo, ExchangeError> {
    let deadline = Instant::now() + timeout;
    let peer = peer_name(stream);
    let io_err = |source: io::Error| ExchangeError::Io {
        peer: peer.clone(),
        source,
    };
    let late = |got| ExchangeError::Timeout {
        peer: peer.clone(),
        timeout,
        got,
    };
    let malformed = |source| ExchangeError::Malformed {
        peer: peer.clone(),
        source,
    };
    let mut h = [0u8; HEADER_LEN];
    match read_by(stream, &mut h, deadline).map_err(io_err)? {
        Got::Full => {}
        Got::Eof(0) => return Err(ExchangeError::PeerClosed { peer }),
        Got::Eof(got) => {
            return Err(malformed(DecodeError::Truncated {
                got,
                want: HEADER_LEN,
            }));
        }
        Got::Late(got) => return Err(late(got)),
    }
    let len = decode_header(&h).map_err(malformed)?;
    let mut body = vec![0u8; len];
    match read_by(stream, &mut body, deadline).map_err(io_err)? {
        Got::Full => {}
        Got::Eof(got) => {
            return Err(malformed(DecodeError::Truncated {
                got: HEADER_LEN + got,
                want: HEADER_LEN + len,
            }));
        }
        Got::Late(got) => return Err(late(HEADER_LEN + got)),
    }
    decode_body(&body).map_err(malformed)
}

/// Sends our message, all of it within `timeout`.
pub fn send(
    stream: &mut TcpStream,
    ours: &ConnInfo,
    timeout: Duration,
) -> Result<(), ExchangeError> {
    let deadline = Instant::now() + timeout;
    let peer = peer_name(stream);
    let io_err = |source| ExchangeError::Io {
        peer: peer.clone(),
        source,
    };
    let m = encode(ours);
    let mut sent = 0;
    while sent < m.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io_err(io::ErrorKind::TimedOut.into()));
        }
        stream.set_write_timeout(Some(left)).map_err(io_err)?;
        match stream.write(&m[sent..]) {
            Ok(0) => return Err(io_err(io::ErrorKind::WriteZero.into())),
            Ok(n) => sent += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(io_err(e)),
        }
    }
    stream.flush().map_err(io_err)
}

fn send_and_receive(
    stream: &mut TcpStream,
    ours: &ConnInfo,
    timeout: Duration,
) -> Result<ConnInfo, ExchangeError> {
    send(stream, ours, timeout)?;
    receive(stream, timeout)
}

/// Same demo, same MTU.
pub fn check_peer(
    stream: &TcpStream,
    ours: &ConnInfo,
    theirs: &ConnInfo,
) -> Result<(), ExchangeError> {
    let peer = peer_name(stream);
    if theirs.demo != ours.demo {
        return Err(ExchangeError::DemoMismatch {
            peer,
            ours: ours.demo.name(),
            theirs: theirs.demo.name(),
        });
    }
    if theirs.mtu != ours.mtu {
        return Err(ExchangeError::MtuMismatch {
            peer,
            ours: ours.mtu.bytes(),
            theirs: theirs.mtu.bytes(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A listener on a free loopback port, and the port.
    fn local_listener() -> (TcpListener, u16) {
        let l = listen("127.0.0.1", 0).unwrap();
        let port = l.local_addr().unwrap().port();
        (l, port)
    }

    pub(crate) fn sample() -> ConnInfo {
        ConnInfo {
            demo: Demo::WriteRead,
            mtu: Mtu::Mtu1024,
            lid: 0,
            qpn: 0x11,
            psn: 0xabcdef,
            gid: "0000:0000:0000:0000:0000:ffff:0a09:0001".parse().unwrap(),
            iterations: 1000,
            size: 4096,
            client_id: 0,
            buffer: Some(RemoteBuf {
                addr: 0x7f00_1234_5000,
                rkey: 0x1234,
                len: 4096,
            }),
        }
    }

    #[test]
    fn round_trip() {
        let info = sample();
        let m = encode(&info);
        assert_eq!(m.len(), HEADER_LEN + BODY_LEN);
        assert_eq!(&m[..4], b"RDMO");
        assert_eq!(decode(&m), Ok(info));
        let plain = ConnInfo {
            buffer: None,
            demo: Demo::PingPong,
            ..info
        };
        assert_eq!(decode(&encode(&plain)), Ok(plain));
    }

    #[test]
    fn header_errors() {
        let m = encode(&sample());
        let mut bad = m.clone();
        bad[0] = b'X';
        assert!(matches!(decode(&bad), Err(DecodeError::BadMagic(_))));
        let mut bad = m.clone();
        bad[5] = 2;
        assert_eq!(decode(&bad), Err(DecodeError::UnsupportedVersion(2)));
        let mut bad = m.clone();
        bad[6..8].copy_from_slice(&60000u16.to_be_bytes());
        assert_eq!(decode(&bad), Err(DecodeError::Oversized(60000)));
        let mut bad = m.clone();
        bad[6..8].copy_from_slice(&59u16.to_be_bytes());
        assert_eq!(decode(&bad), Err(DecodeError::BadLength { got: 59 }));
        assert!(matches!(
            decode(&m[..30]),
            Err(DecodeError::Truncated { got: 30, want: 68 })
        ));
        assert!(matches!(
            decode(&m[..3]),
            Err(DecodeError::Truncated { got: 3, want: 8 })
        ));
        let mut long = m.clone();
        long.push(0);
        assert!(matches!(decode(&long), Err(DecodeError::BadLength { .. })));
    }

    fn with(offset: usize, bytes: &[u8]) -> Result<ConnInfo, DecodeError> {
        let mut m = encode(&sample());
        m[HEADER_LEN + offset..HEADER_LEN + offset + bytes.len()].copy_from_slice(bytes);
        decode(&m)
    }

    fn bad_field(r: Result<ConnInfo, DecodeError>) -> &'static str {
        match r {
            Err(DecodeError::Field { field, .. }) => field,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn field_errors() {
        assert_eq!(bad_field(with(0, &[9])), "demo");
        assert_eq!(bad_field(with(1, &[3])), "flags");
        assert_eq!(bad_field(with(2, &1000u16.to_be_bytes())), "mtu");
        assert_eq!(bad_field(with(6, &[0, 1])), "reserved");
        assert_eq!(bad_field(with(8, &0u32.to_be_bytes())), "qpn");
        assert_eq!(bad_field(with(8, &0x100_0000u32.to_be_bytes())), "qpn");
        assert_eq!(bad_field(with(12, &0x100_0000u32.to_be_bytes())), "psn");
        assert_eq!(bad_field(with(32, &0u32.to_be_bytes())), "iterations");
        assert_eq!(bad_field(with(36, &u32::MAX.to_be_bytes())), "size");
        assert_eq!(bad_field(with(44, &0u64.to_be_bytes())), "buffer address");
        assert_eq!(
            bad_field(with(44, &u64::MAX.to_be_bytes())),
            "buffer address"
        );
        assert_eq!(bad_field(with(56, &0u32.to_be_bytes())), "buffer length");
        // Buffer fields without the flag.
        assert_eq!(bad_field(with(1, &[0])), "buffer");
    }

    #[test]
    fn errors_read_well() {
        let e = DecodeError::BadMagic(*b"GET ");
        assert_eq!(
            e.to_string(),
            "bad magic [47, 45, 54, 20] (not an rdma-demo peer?)"
        );
        let e = ExchangeError::MtuMismatch {
            peer: "10.9.0.2:5000".into(),
            ours: 1024,
            theirs: 512,
        };
        assert!(
            e.to_string()
                .starts_with("MTU mismatch: ours is 1024, peer 10.9.0.2:5000 uses 512")
        );
        assert!(!e.is_connection());
    }

    #[test]
    fn tcp_garbage_and_close() {
        let (l, port) = local_listener();
        let t = std::thread::spawn(move || {
            let mut c = connect("127.0.0.1", port, Duration::from_secs(5)).unwrap();
            c.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
            let mut c2 = connect("127.0.0.1", port, Duration::from_secs(5)).unwrap();
            drop(c2.write_all(b""));
            drop(c2);
            let c3 = connect("127.0.0.1", port, Duration::from_secs(5)).unwrap();
            std::thread::sleep(Duration::from_millis(400));
            drop(c3);
            drop(c);
        });
        let mut s = accept(&l, Duration::from_secs(5)).unwrap();
        let e = receive(&mut s, Duration::from_secs(5)).unwrap_err();
        assert!(
            matches!(
                e,
                ExchangeError::Malformed {
                    source: DecodeError::BadMagic(_),
                    ..
                }
            ),
            "{e}"
        );
        let mut s = accept(&l, Duration::from_secs(5)).unwrap();
        let e = receive(&mut s, Duration::from_secs(5)).unwrap_err();
        assert!(matches!(e, ExchangeError::PeerClosed { .. }), "{e}");
        let mut s = accept(&l, Duration::from_secs(5)).unwrap();
        let e = receive(&mut s, Duration::from_millis(100)).unwrap_err();
        assert!(matches!(e, ExchangeError::Timeout { .. }), "{e}");
        t.join().unwrap();
        let e = accept(&l, Duration::from_millis(50)).unwrap_err();
        assert!(
            matches!(e, ExchangeError::AcceptTimeout { .. }) && e.is_connection(),
            "{e}"
        );
    }

    /// A valid message, one byte every 20 ms (1.4 s in all): each read gets a byte well within
    /// any per-read timeout, but the message as a whole misses its deadline.
    #[test]
    fn a_slow_drip_peer_misses_the_deadline_of_the_whole_message() {
        let (l, port) = local_listener();
        let t = std::thread::spawn(move || {
            let mut c = connect("127.0.0.1", port, Duration::from_secs(5)).unwrap();
            for b in encode(&sample()) {
                if c.write_all(&[b]).is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        let mut s = accept(&l, Duration::from_secs(5)).unwrap();
        let start = Instant::now();
        let e = receive(&mut s, Duration::from_millis(400)).unwrap_err();
        let took = start.elapsed();
        assert!(
            matches!(e, ExchangeError::Timeout { got, .. } if got > 0 && got < HEADER_LEN + BODY_LEN),
            "{e}"
        );
        assert!(e.to_string().contains("within 0.4 s"), "{e}");
        assert!(took >= Duration::from_millis(400), "{took:?}");
        assert!(took < Duration::from_millis(1000), "{took:?}");
        drop(s);
        t.join().unwrap();
    }

    #[test]
    fn a_port_in_use_is_a_connection_error_with_a_hint() {
        let (_taken, port) = local_listener();
        let e = listen("127.0.0.1", port).unwrap_err();
        assert!(e.is_connection(), "{e}");
        let text = e.to_string();
        assert!(
            text.starts_with(&format!("cannot listen on 127.0.0.1:{port}: ")),
            "{text}"
        );
        assert!(text.contains("pick another with -p"), "{text}");
    }

    #[test]
    fn connect_refused() {
        let (l, port) = local_listener();
        drop(l);
        let start = Instant::now();
        let e = connect("127.0.0.1", port, Duration::from_millis(300)).unwrap_err();
        assert!(start.elapsed() >= Duration::from_millis(300));
        assert!(e.is_connection());
        assert!(e.to_string().contains("refused"), "{e}");
    }
}

#[cfg(test)]
mod props {
    use super::*;
    use proptest::prelude::*;

    fn mtu() -> impl Strategy<Value = Mtu> {
        prop_oneof![
            Just(Mtu::Mtu256),
            Just(Mtu::Mtu512),
            Just(Mtu::Mtu1024),
            Just(Mtu::Mtu2048),
            Just(Mtu::Mtu4096),
        ]
    }

    fn demo() -> impl Strategy<Value = Demo> {
        prop_oneof![
            Just(Demo::PingPong),
            Just(Demo::WriteRead),
            Just(Demo::Atomic)
        ]
    }

    prop_compose! {
        fn conn_info()(
            demo in demo(),
            mtu in mtu(),
            lid in any::<u16>(),
            qpn in 1u32..=0xff_ffff,
            psn in 0u32..=0xff_ffff,
            gid in any::<[u8; 16]>(),
            iterations in 1..=MAX_ITERATIONS,
            size in 1..=MAX_SIZE,
            client_id in any::<u32>(),
            buffer in proptest::option::of((1u64..u64::MAX / 2, any::<u32>(), 1..=MAX_SIZE)),
        ) -> ConnInfo {
            ConnInfo {
                demo, mtu, lid, qpn, psn,
                gid: Gid::from_bytes(gid),
                iterations, size, client_id,
                buffer: buffer.map(|(addr, rkey, len)| RemoteBuf { addr, rkey, len }),
            }
        }
    }

    proptest! {
        #[test]
        fn encode_decode_round_trip(info in conn_info()) {
            let m = encode(&info);
            prop_assert_eq!(m.len(), HEADER_LEN + BODY_LEN);
            prop_assert_eq!(decode(&m), Ok(info));
        }

        /// Arbitrary bytes never panic the decoder, and whatever it accepts re-encodes to the
        /// same bytes (the format has no slack).
        #[test]
        fn decode_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            if let Ok(info) = decode(&bytes) {
                prop_assert_eq!(encode(&info), bytes);
            }
        }

        /// A valid message with one byte changed either still decodes to a valid message that
        /// re-encodes to the changed bytes, or is rejected; a cut-off message is always rejected.
        #[test]
        fn mutated_and_truncated(info in conn_info(), at in 0usize..HEADER_LEN + BODY_LEN, x in 1u8..=255, cut in 0usize..HEADER_LEN + BODY_LEN) {
            let mut m = encode(&info);
            m[at] ^= x;
            if let Ok(other) = decode(&m) {
                prop_assert_eq!(encode(&other), m.clone());
            }
            let m = encode(&info);
            let truncated = decode(&m[..cut]);
            prop_assert!(truncated.is_err());
            let is_truncated = matches!(truncated, Err(DecodeError::Truncated { .. }));
            prop_assert!(is_truncated);
        }
    }
}

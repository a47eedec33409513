//! One side of a demo: the opened device, its port, the chosen GID and MTU, and the steps every
//! demo shares (CQ creation, the QP transitions with the peer's information).

use std::rc::Rc;
use std::time::Duration;

use crate::completion::{CompletionFaults, Completions, Mode};
use crate::devices::{DevicesError, device_list};
use crate::error::DemoError;
use crate::exchange::{ConnInfo, Demo, RemoteBuf};
use crate::verbs::{
    Access, CompletionChannel, CompletionQueue, Context, Gid, LinkLayer, MemoryRegion, Mtu,
    PathParams, PortState, ProtectionDomain, QpCaps, QueuePair,
};

/// Where and how to open an endpoint.
#[derive(Debug, Clone)]
pub struct EndpointOptions {
    /// `None`: the first device.
    pub device: Option<String>,
    pub ib_port: u8,
    /// `None`: the first IPv4-mapped RoCE v2 GID (RoCE), or no GRH (InfiniBand).
    pub gid_index: Option<u32>,
    /// Path MTU in bytes; `None`: the port's active MTU.
    pub mtu: Option<u32>,
    pub mode: Mode,
    pub timeout: Duration,
    /// A fault to inject, for tests of the error paths.
    pub fault: Option<Fault>,
    /// Faults of the event-mode waits, for tests of the stall doctor.
    pub completion_faults: CompletionFaults,
    /// `--stamps N`: stamp the first N event reads and posts of each side (0: none).
    pub stamps: u32,
}

/// Faults `--inject-fault` can cause (hidden; for tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Fault {
    /// Use a wrong rkey for one-sided operations: remote access error.
    BadRkey,
    /// Use a source GID index that does not exist: the INIT → RTR transition fails.
    BadSgid,
    /// Send bytes over TCP during the data phase (`rdma-trace verify` must catch it).
    TcpInData,
}

/// An opened device and port, ready to create QPs.
#[derive(Debug)]
pub struct Endpoint {
    pub pd: Rc<ProtectionDomain>,
    pub ctx: Rc<Context>,
    pub device: String,
    pub port: u8,
    pub lid: u16,
    pub gid: Gid,
    /// `Some`: use a GRH with this source GID index.
    pub sgid_index: Option<u8>,
    pub mtu: Mtu,
    pub link_layer: LinkLayer,
    pub mode: Mode,
    pub timeout: Duration,
    pub fault: Option<Fault>,
    pub completion_faults: CompletionFaults,
    /// Event reads and posts to stamp ([`EndpointOptions::stamps`]).
    pub stamps: u32,
    /// What was chosen, for the user ("using GID index 1 ...").
    pub notes: Vec<String>,
}

/// The local ACK timeout exponent of the QPs: 4.096 µs · 2^14 ≈ 67 ms.
const ACK_TIMEOUT_EXP: u8 = 14;

fn open_context(name: Option<&str>) -> Result<Context, DevicesError> {
    let list = device_list()?;
    let dev = match name {
        None => list.iter().next(),
        Some(n) => list.find(n),
    };
    match dev {
        Some(dev) => Ok(dev.open()?),
        None => Err(DevicesError::UnknownDevice {
            name: name.unwrap_or_default().to_string(),
            available: list.iter().map(|d| d.name()).collect(),
        }),
    }
}

impl Endpoint {
    pub fn open(opts: &EndpointOptions) -> Result<Self, DemoError> {
        let ctx = Rc::new(open_context(opts.device.as_deref())?);
        let name = ctx.name().to_string();
        let dev_attr = ctx.query_device()?;
        if opts.ib_port == 0 || opts.ib_port > dev_attr.phys_port_cnt {
            return Err(DemoError::Port(format!(
                "{name} has {} port(s); --ib-port (-i) {} does not exist (-i is the IB port, as \
                 in perftest; the iteration count is -n)",
                dev_attr.phys_port_cnt, opts.ib_port
            )));
        }
        let port = opts.ib_port;
        let attr = ctx.query_port(port)?;
        if attr.state != PortState::Active {
            return Err(DemoError::Port(format!(
                "{name} port {port} is {}, not PORT_ACTIVE (is its network device up?)",
                attr.state
            )));
        }
        let active = attr.active_mtu.ok_or_else(|| {
            DemoError::Port(format!("{name} port {port} reports an unknown active MTU"))
        })?;
        let mtu = match opts.mtu {
            None => active,
            Some(bytes) => {
                let m = Mtu::from_bytes(bytes).ok_or_else(|| {
                    DemoError::Usage(format!("--mtu {bytes}: want 256, 512, 1024, 2048 or 4096"))
                })?;
                if m > active {
                    return Err(DemoError::Port(format!(
                        "--mtu {bytes} is above the active MTU {active} of {name} port {port}"
                    )));
                }
                m
            }
        };
        let mut notes = Vec::new();
        let roce = attr.link_layer == LinkLayer::Ethernet;
        let (gid, sgid_index) = match opts.gid_index {
            Some(index) => {
                if index >= attr.gid_tbl_len || index > u32::from(u8::MAX) {
                    return Err(DemoError::Port(format!(
                        "GID index {index} is out of range: {name} port {port} has {} entries (see `rdma-demo devices`)",
                        attr.gid_tbl_len.min(256)
                    )));
                }
                let entry = ctx.gid_entry(port, index, &attr)?.ok_or_else(|| {
                    DemoError::Port(format!(
                        "GID index {index} of {name} port {port} is empty (see `rdma-demo devices`)"
                    ))
                })?;
                notes.push(format!(
                    "{name} port {port}: GID index {index} ({}, {}) as given",
                    entry
                        .gid_type
                        .map_or_else(|| "type ?".to_string(), |t| t.to_string()),
                    entry.gid.to_ipv6()
                ));
                (entry.gid, Some(index as u8))
            }
            None if roce => {
                // The first match, without reading the whole table.
                let mut found = None;
                for index in 0..attr.gid_tbl_len.min(256) {
                    if let Ok(Some(e)) = ctx.gid_entry(port, index, &attr)
                        && e.is_roce_v2_ipv4()
                    {
                        found = Some(e);
                        break;
                    }
                }
                let entry = found.ok_or_else(|| {
                    DemoError::Port(format!(
                        "{name} port {port} has no IPv4-mapped RoCE v2 GID (does its network device have an IPv4 address?); pick one with -x (see `rdma-demo devices`)"
                    ))
                })?;
                notes.push(format!(
                    "{name} port {port}: using GID index {} (RoCE v2, {}), the first IPv4-mapped RoCE v2 GID",
                    entry.index,
                    entry.gid.to_ipv6()
                ));
                (entry.gid, Some(entry.index as u8))
            }
            None => {
                notes.push(format!(
                    "{name} port {port}: InfiniBand, LID {:#x}, no GRH",
                    attr.lid
                ));
                (Gid::from_bytes([0; 16]), None)
            }
        };
        let pd = ProtectionDomain::new(Rc::clone(&ctx))?;
        Ok(Endpoint {
            pd,
            ctx,
            device: name,
            port,
            lid: attr.lid,
            gid,
            sgid_index,
            mtu,
            link_layer: attr.link_layer,
            mode: opts.mode,
            timeout: opts.timeout,
            fault: opts.fault,
            completion_faults: opts.completion_faults,
            stamps: opts.stamps,
            notes,
        })
    }

    /// A CQ of `depth` entries, with its own completion channel in event mode.
    pub fn cq(&self, depth: u32) -> Result<Rc<CompletionQueue>, DemoError> {
        let channel = match self.mode {
            Mode::Event => Some(CompletionChannel::new(&self.ctx)?),
            Mode::Poll => None,
        };
        Ok(CompletionQueue::new(&self.ctx, depth, channel.as_ref())?)
    }

    /// The completions of `cq`, waited for in this endpoint's mode and within its timeout,
    /// with the calling thread's stamps when asked for, and the faults asked for.
    pub fn completions(&self, cq: Rc<CompletionQueue>) -> Result<Completions, DemoError> {
        Ok(Completions::new(cq, self.mode, self.timeout)?
            .with_stamps(self.stamps)
            .with_faults(self.completion_faults))
    }

    /// An RC QP that sends and receives on `cq` (at most `send_wr` and `recv_wr` requests
    /// queued), moved to INIT with the rights `remote` gives the peer.
    pub fn init_qp(
        &self,
        cq: &Rc<CompletionQueue>,
        send_wr: u32,
        recv_wr: u32,
        remote: Access,
    ) -> Result<QueuePair, DemoError> {
        let caps = QpCaps {
            max_send_wr: send_wr,
            max_recv_wr: recv_wr,
        };
        let qp = QueuePair::new_rc(&self.pd, cq, cq, caps)?;
        qp.to_init(self.port, remote)?;
        Ok(qp)
    }

    /// A region of `len` bytes the peer may access as `remote` says, with the LOCAL_WRITE the
    /// verbs require alongside remote write and atomic rights.
    pub fn exposed_region(&self, len: usize, remote: Access) -> Result<MemoryRegion, DemoError> {
        let access = Access {
            local_write: true,
            ..remote
        };
        Ok(MemoryRegion::new(&self.pd, len, access)?)
    }

    pub fn path(&self) -> PathParams {
        PathParams {
            port: self.port,
            mtu: self.mtu,
            sgid_index: self.sgid_index,
        }
    }

    /// Our side of the exchange.
    #[allow(clippy::too_many_arguments)]
    pub fn local_info(
        &self,
        demo: Demo,
        qp: &QueuePair,
        psn: u32,
        iterations: u32,
        size: u32,
        client_id: u32,
        buffer: Option<RemoteBuf>,
    ) -> ConnInfo {
        ConnInfo {
            demo,
            mtu: self.mtu,
            lid: self.lid,
            qpn: qp.qp_num(),
            psn,
            gid: self.gid,
            iterations,
            size,
            client_id,
            buffer,
        }
    }

    /// INIT → RTR → RTS towards `peer`; `psn` is ours.
    pub fn connect(&self, qp: &QueuePair, psn: u32, peer: &ConnInfo) -> Result<(), DemoError> {
        if self.sgid_index.is_some() && peer.gid.is_zero() {
            return Err(DemoError::Port(format!(
                "the peer sent an empty GID but {} port {} needs one (RoCE)",
                self.device, self.port
            )));
        }
        let mut path = self.path();
        if self.fault == Some(Fault::BadSgid) {
            path.sgid_index = Some(u8::MAX);
        }
        qp.to_rtr(path, &peer.remote_qp())?;
        qp.to_rts(psn, ACK_TIMEOUT_EXP)?;
        Ok(())
    }
}

/// A 24-bit starting PSN that differs between runs.
pub fn random_psn() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    (h.finish() & 0xff_ffff) as u32
}

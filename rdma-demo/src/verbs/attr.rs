//! Device and port attributes as plain Rust values, converted from the raw `rdma-sys` structs.

use std::fmt;

use rdma_sys::{
    ibv_atomic_cap, ibv_device_attr, ibv_mtu, ibv_port_attr, ibv_port_state, ibv_transport_type,
};

use super::ffi::{IBV_LINK_LAYER_ETHERNET, IBV_LINK_LAYER_INFINIBAND, IBV_LINK_LAYER_UNSPECIFIED};

/// How the device transports data (`ibv_device.transport_type`). Soft-RoCE reports InfiniBand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    InfiniBand,
    Iwarp,
    Usnic,
    UsnicUdp,
    Unspecified,
    Unknown(i32),
}

impl Transport {
    pub(super) fn from_raw(raw: ibv_transport_type::Type) -> Self {
        match raw {
            ibv_transport_type::IBV_TRANSPORT_IB => Transport::InfiniBand,
            ibv_transport_type::IBV_TRANSPORT_IWARP => Transport::Iwarp,
            ibv_transport_type::IBV_TRANSPORT_USNIC => Transport::Usnic,
            ibv_transport_type::IBV_TRANSPORT_USNIC_UDP => Transport::UsnicUdp,
            ibv_transport_type::IBV_TRANSPORT_UNSPECIFIED => Transport::Unspecified,
            other => Transport::Unknown(other),
        }
    }
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Same words as ibv_devinfo.
        match self {
            Transport::InfiniBand => f.write_str("InfiniBand"),
            Transport::Iwarp => f.write_str("iWARP"),
            Transport::Usnic => f.write_str("usNIC"),
            Transport::UsnicUdp => f.write_str("usNIC UDP"),
            Transport::Unspecified => f.write_str("unspecified"),
            Transport::Unknown(raw) => write!(f, "unknown transport ({raw})"),
        }
    }
}

/// Atomic operation support (`ibv_device_attr.atomic_cap`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AtomicCap {
    /// No atomic operations.
    None,
    /// Atomic between QPs of this device only.
    Hca,
    /// Atomic against any agent, CPU included.
    Global,
    Unknown(u32),
}

impl AtomicCap {
    fn from_raw(raw: ibv_atomic_cap::Type) -> Self {
        match raw {
            ibv_atomic_cap::IBV_ATOMIC_NONE => AtomicCap::None,
            ibv_atomic_cap::IBV_ATOMIC_HCA => AtomicCap::Hca,
            ibv_atomic_cap::IBV_ATOMIC_GLOB => AtomicCap::Global,
            other => AtomicCap::Unknown(other),
        }
    }
}

impl fmt::Display for AtomicCap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // ibv_devinfo's ATOMIC_* names.
        match self {
            AtomicCap::None => f.write_str("ATOMIC_NONE"),
            AtomicCap::Hca => f.write_str("ATOMIC_HCA"),
            AtomicCap::Global => f.write_str("ATOMIC_GLOB"),
            AtomicCap::Unknown(raw) => write!(f, "ATOMIC_UNKNOWN({raw})"),
        }
    }
}

/// The subset of `ibv_device_attr` the demos use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceAttr {
    pub fw_ver: String,
    pub phys_port_cnt: u8,
    pub max_qp: i32,
    pub max_cqe: i32,
    pub max_mr_size: u64,
    pub max_qp_rd_atom: i32,
    pub atomic_cap: AtomicCap,
}

impl DeviceAttr {
    pub(super) fn from_raw(raw: &ibv_device_attr) -> Self {
        // fw_ver is a NUL-terminated char[64]; take the bytes up to the first NUL.
        let fw: Vec<u8> = raw
            .fw_ver
            .iter()
            .map(|&c| c as u8)
            .take_while(|&b| b != 0)
            .collect();
        DeviceAttr {
            fw_ver: String::from_utf8_lossy(&fw).into_owned(),
            phys_port_cnt: raw.phys_port_cnt,
            max_qp: raw.max_qp,
            max_cqe: raw.max_cqe,
            max_mr_size: raw.max_mr_size,
            max_qp_rd_atom: raw.max_qp_rd_atom,
            atomic_cap: AtomicCap::from_raw(raw.atomic_cap),
        }
    }
}

/// Logical port state (`enum ibv_port_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortState {
    Nop,
    Down,
    Init,
    Armed,
    Active,
    ActiveDefer,
    Unknown(u32),
}

impl PortState {
    fn from_raw(raw: ibv_port_state::Type) -> Self {
        match raw {
            ibv_port_state::IBV_PORT_NOP => PortState::Nop,
            ibv_port_state::IBV_PORT_DOWN => PortState::Down,
            ibv_port_state::IBV_PORT_INIT => PortState::Init,
            ibv_port_state::IBV_PORT_ARMED => PortState::Armed,
            ibv_port_state::IBV_PORT_ACTIVE => PortState::Active,
            ibv_port_state::IBV_PORT_ACTIVE_DEFER => PortState::ActiveDefer,
            other => PortState::Unknown(other),
        }
    }

    /// The numeric value, as `ibv_devinfo` prints it after the name.
    pub fn raw(self) -> u32 {
        match self {
            PortState::Nop => ibv_port_state::IBV_PORT_NOP,
            PortState::Down => ibv_port_state::IBV_PORT_DOWN,
            PortState::Init => ibv_port_state::IBV_PORT_INIT,
            PortState::Armed => ibv_port_state::IBV_PORT_ARMED,
            PortState::Active => ibv_port_state::IBV_PORT_ACTIVE,
            PortState::ActiveDefer => ibv_port_state::IBV_PORT_ACTIVE_DEFER,
            PortState::Unknown(raw) => raw,
        }
    }
}

impl fmt::Display for PortState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The names of ibv_port_state_str() / ibv_devinfo.
        match self {
            PortState::Nop => f.write_str("PORT_NOP"),
            PortState::Down => f.write_str("PORT_DOWN"),
            PortState::Init => f.write_str("PORT_INIT"),
            PortState::Armed => f.write_str("PORT_ARMED"),
            PortState::Active => f.write_str("PORT_ACTIVE"),
            PortState::ActiveDefer => f.write_str("PORT_ACTIVE_DEFER"),
            PortState::Unknown(raw) => write!(f, "PORT_UNKNOWN({raw})"),
        }
    }
}

/// Path MTU (`enum ibv_mtu`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Mtu {
    Mtu256,
    Mtu512,
    Mtu1024,
    Mtu2048,
    Mtu4096,
}

impl Mtu {
    /// `None` for values outside `IBV_MTU_256..=IBV_MTU_4096`.
    fn from_raw(raw: ibv_mtu::Type) -> Option<Self> {
        match raw {
            ibv_mtu::IBV_MTU_256 => Some(Mtu::Mtu256),
            ibv_mtu::IBV_MTU_512 => Some(Mtu::Mtu512),
            ibv_mtu::IBV_MTU_1024 => Some(Mtu::Mtu1024),
            ibv_mtu::IBV_MTU_2048 => Some(Mtu::Mtu2048),
            ibv_mtu::IBV_MTU_4096 => Some(Mtu::Mtu4096),
            _ => None,
        }
    }

    /// The MTU of `bytes` bytes, if that is one of 256, 512, 1024, 2048, 4096.
    pub fn from_bytes(bytes: u32) -> Option<Self> {
        match bytes {
            256 => Some(Mtu::Mtu256),
            512 => Some(Mtu::Mtu512),
            1024 => Some(Mtu::Mtu1024),
            2048 => Some(Mtu::Mtu2048),
            4096 => Some(Mtu::Mtu4096),
            _ => None,
        }
    }

    pub fn bytes(self) -> u32 {
        match self {
            Mtu::Mtu256 => 256,
            Mtu::Mtu512 => 512,
            Mtu::Mtu1024 => 1024,
            Mtu::Mtu2048 => 2048,
            Mtu::Mtu4096 => 4096,
        }
    }
}

impl fmt::Display for Mtu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.bytes())
    }
}

/// Port link layer (`ibv_port_attr.link_layer`): RoCE and iWARP ports are Ethernet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkLayer {
    Unspecified,
    InfiniBand,
    Ethernet,
    Unknown(u8),
}

impl LinkLayer {
    fn from_raw(raw: u8) -> Self {
        match raw {
            IBV_LINK_LAYER_UNSPECIFIED => LinkLayer::Unspecified,
            IBV_LINK_LAYER_INFINIBAND => LinkLayer::InfiniBand,
            IBV_LINK_LAYER_ETHERNET => LinkLayer::Ethernet,
            other => LinkLayer::Unknown(other),
        }
    }
}

impl fmt::Display for LinkLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LinkLayer::Unspecified => f.write_str("Unspecified"),
            LinkLayer::InfiniBand => f.write_str("InfiniBand"),
            LinkLayer::Ethernet => f.write_str("Ethernet"),
            LinkLayer::Unknown(raw) => write!(f, "Unknown({raw})"),
        }
    }
}

/// The subset of `ibv_port_attr` the demos use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortAttr {
    pub state: PortState,
    pub link_layer: LinkLayer,
    /// `None` if the driver reports a value outside the `ibv_mtu` range.
    pub active_mtu: Option<Mtu>,
    pub max_mtu: Option<Mtu>,
    /// Local identifier; 0 on RoCE, where addressing uses GIDs.
    pub lid: u16,
    /// Number of GID table entries, populated or not.
    pub gid_tbl_len: u32,
}

impl PortAttr {
    pub(super) fn from_raw(raw: &ibv_port_attr) -> Self {
        PortAttr {
            state: PortState::from_raw(raw.state),
            link_layer: LinkLayer::from_raw(raw.link_layer),
            active_mtu: Mtu::from_raw(raw.active_mtu),
            max_mtu: Mtu::from_raw(raw.max_mtu),
            lid: raw.lid,
            gid_tbl_len: u32::try_from(raw.gid_tbl_len).unwrap_or(0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_state_names_match_ibv_port_state_str() {
        let names: Vec<String> = (0..=6)
            .map(|raw| PortState::from_raw(raw).to_string())
            .collect();
        assert_eq!(
            names,
            [
                "PORT_NOP",
                "PORT_DOWN",
                "PORT_INIT",
                "PORT_ARMED",
                "PORT_ACTIVE",
                "PORT_ACTIVE_DEFER",
                "PORT_UNKNOWN(6)"
            ]
        );
        for raw in 0..=6 {
            assert_eq!(PortState::from_raw(raw).raw(), raw);
        }
    }

    #[test]
    fn mtu_values_and_bytes() {
        assert_eq!(Mtu::from_raw(0), None);
        assert_eq!(Mtu::from_raw(6), None);
        let bytes: Vec<u32> = (1..=5)
            .map(|raw| Mtu::from_raw(raw).unwrap().bytes())
            .collect();
        assert_eq!(bytes, [256, 512, 1024, 2048, 4096]);
        assert_eq!(Mtu::Mtu1024.to_string(), "1024");
    }

    #[test]
    fn link_layer_names() {
        assert_eq!(LinkLayer::from_raw(1).to_string(), "InfiniBand");
        assert_eq!(LinkLayer::from_raw(2).to_string(), "Ethernet");
        assert_eq!(LinkLayer::from_raw(0), LinkLayer::Unspecified);
        assert_eq!(LinkLayer::from_raw(9), LinkLayer::Unknown(9));
    }

    #[test]
    fn transport_and_atomic_names() {
        assert_eq!(Transport::from_raw(0).to_string(), "InfiniBand");
        assert_eq!(Transport::from_raw(1).to_string(), "iWARP");
        assert_eq!(Transport::from_raw(-1), Transport::Unknown(-1));
        assert_eq!(AtomicCap::from_raw(1).to_string(), "ATOMIC_HCA");
        assert_eq!(AtomicCap::from_raw(2), AtomicCap::Global);
    }

    #[test]
    fn device_attr_reads_nul_terminated_firmware() {
        // SAFETY: ibv_device_attr is plain old data (integers and a char array); all-zero is valid.
        let mut raw: ibv_device_attr = unsafe { std::mem::zeroed() };
        for (dst, &src) in raw.fw_ver.iter_mut().zip(b"20.31.1014\0junk") {
            *dst = src as libc::c_char;
        }
        raw.phys_port_cnt = 2;
        raw.atomic_cap = ibv_atomic_cap::IBV_ATOMIC_HCA;
        let a = DeviceAttr::from_raw(&raw);
        assert_eq!(a.fw_ver, "20.31.1014");
        assert_eq!(a.phys_port_cnt, 2);
        assert_eq!(a.atomic_cap, AtomicCap::Hca);
    }
}

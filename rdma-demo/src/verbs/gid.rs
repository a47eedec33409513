//! GIDs and the per-port GID table.
//!
//! On RoCE the GID table is how a port is addressed: one entry per (IP address of the netdev,
//! RoCE version). RoCE v2 entries holding an IPv4-mapped address (`::ffff:a.b.c.d`) are routable
//! over IPv4 and are what the demos pick by default.

use std::fmt;
use std::mem::{MaybeUninit, size_of};
use std::net::{Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use rdma_sys::{
    IBV_GID_TYPE_IB, IBV_GID_TYPE_ROCE_V1, IBV_GID_TYPE_ROCE_V2, ibv_gid_entry, ibv_gid_type,
};

use super::attr::{LinkLayer, PortAttr};
use super::device::Context;
use super::ffi::_ibv_query_gid_ex;
use super::{VerbsError, check_rc};
use crate::sysfs::Sysfs;

/// A 128-bit global identifier, in network byte order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Gid([u8; 16]);

impl Gid {
    pub const fn from_bytes(bytes: [u8; 16]) -> Self {
        Gid(bytes)
    }

    pub const fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }

    /// Unpopulated table entries read as all zeroes.
    pub fn is_zero(&self) -> bool {
        self.0 == [0; 16]
    }

    /// The GID as an IPv6 address (RoCE GIDs are IP addresses).
    pub fn to_ipv6(&self) -> Ipv6Addr {
        Ipv6Addr::from(self.0)
    }

    /// `Some(a.b.c.d)` for an IPv4-mapped GID `::ffff:a.b.c.d`.
    pub fn ipv4_mapped(&self) -> Option<Ipv4Addr> {
        self.to_ipv6().to_ipv4_mapped()
    }
}

/// The fixed colon form of `ibv_devinfo -v` and sysfs: eight groups of four hex digits.
impl fmt::Display for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, pair) in self.0.chunks_exact(2).enumerate() {
            if i > 0 {
                f.write_str(":")?;
            }
            write!(f, "{:02x}{:02x}", pair[0], pair[1])?;
        }
        Ok(())
    }
}

/// A string that is not eight colon-separated groups of 1 to 4 hex digits.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a GID (want eight colon-separated groups of hex digits): {0:?}")]
pub struct ParseGidError(String);

/// Parses the fixed colon form (as in sysfs `ports/<p>/gids/<i>`); `::` shortening is not
/// accepted.
impl FromStr for Gid {
    type Err = ParseGidError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || ParseGidError(s.to_string());
        let mut bytes = [0u8; 16];
        let mut groups = s.trim().split(':');
        for pair in bytes.chunks_exact_mut(2) {
            let group = groups.next().ok_or_else(err)?;
            if group.is_empty() || group.len() > 4 || !group.bytes().all(|b| b.is_ascii_hexdigit())
            {
                return Err(err());
            }
            let v = u16::from_str_radix(group, 16).map_err(|_| err())?;
            pair.copy_from_slice(&v.to_be_bytes());
        }
        if groups.next().is_some() {
            return Err(err());
        }
        Ok(Gid(bytes))
    }
}

/// What kind of address a GID table entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GidType {
    /// InfiniBand.
    Ib,
    /// RoCE v1: Ethernet frames, ethertype 0x8915, not routable.
    RoceV1,
    /// RoCE v2: UDP/IP, port 4791, routable.
    RoceV2,
}

impl GidType {
    fn from_raw(raw: ibv_gid_type) -> Option<Self> {
        match raw {
            IBV_GID_TYPE_IB => Some(GidType::Ib),
            IBV_GID_TYPE_ROCE_V1 => Some(GidType::RoceV1),
            IBV_GID_TYPE_ROCE_V2 => Some(GidType::RoceV2),
            _ => None,
        }
    }

    /// Parses sysfs `ports/<p>/gid_attrs/types/<i>`. The kernel writes `IB/RoCE v1` for both IB
    /// and RoCE v1 entries; as libibverbs does, the port's link layer tells them apart.
    pub fn from_sysfs(s: &str, link_layer: LinkLayer) -> Option<Self> {
        match (s.trim(), link_layer) {
            ("RoCE v2", _) => Some(GidType::RoceV2),
            ("IB/RoCE v1", LinkLayer::Ethernet) => Some(GidType::RoceV1),
            ("IB/RoCE v1", LinkLayer::InfiniBand) => Some(GidType::Ib),
            _ => None,
        }
    }
}

impl fmt::Display for GidType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            GidType::Ib => "IB",
            GidType::RoceV1 => "RoCE v1",
            GidType::RoceV2 => "RoCE v2",
        })
    }
}

/// One populated GID table entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GidEntry {
    pub index: u32,
    pub gid: Gid,
    /// `None` if neither libibverbs nor sysfs could tell.
    pub gid_type: Option<GidType>,
    /// The network device the entry belongs to (RoCE only).
    pub netdev: Option<String>,
}

impl GidEntry {
    /// An IPv4-mapped RoCE v2 GID: the demos' default choice.
    pub fn is_roce_v2_ipv4(&self) -> bool {
        self.gid_type == Some(GidType::RoceV2) && self.gid.ipv4_mapped().is_some()
    }
}

impl Context {
    /// The populated entries of the GID table of `port` (all-zero entries skipped), via
    /// `ibv_query_gid_ex`; entries it cannot read are taken from sysfs instead.
    pub fn gid_table(&self, port: u8, attr: &PortAttr) -> Result<Vec<GidEntry>, VerbsError> {
        let mut entries = Vec::new();
        let mut first_error = None;
        for index in 0..attr.gid_tbl_len {
            match self.gid_entry(port, index, attr) {
                Ok(Some(entry)) => entries.push(entry),
                Ok(None) => {}
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            Some(e) if entries.is_empty() => Err(e),
            _ => Ok(entries),
        }
    }

    /// Entry `index` of the GID table of `port`: `Ok(None)` if it is empty. Read with
    /// `ibv_query_gid_ex`, or from sysfs if that fails.
    pub fn gid_entry(
        &self,
        port: u8,
        index: u32,
        attr: &PortAttr,
    ) -> Result<Option<GidEntry>, VerbsError> {
        let sysfs = Sysfs::default();
        let mut raw = MaybeUninit::<ibv_gid_entry>::zeroed();
        // SAFETY: the context is open; `raw` is a writable ibv_gid_entry of the size passed.
        let rc = unsafe {
            _ibv_query_gid_ex(
                self.as_ptr(),
                port.into(),
                index,
                raw.as_mut_ptr(),
                0,
                size_of::<ibv_gid_entry>(),
            )
        };
        match check_rc(rc, "ibv_query_gid_ex", || {
            format!("{} port {port} index {index}", self.name())
        }) {
            Ok(()) => {
                // SAFETY: zero-initialised plain old data, filled in by the successful call.
                let raw = unsafe { raw.assume_init_ref() };
                // SAFETY: both union variants are plain bytes; `raw` covers all 16.
                let gid = Gid(unsafe { raw.gid.raw });
                if gid.is_zero() {
                    return Ok(None);
                }
                let netdev = interface_name(raw.ndev_ifindex)
                    .or_else(|| sysfs.gid_netdev(self.name(), port, index));
                Ok(Some(GidEntry {
                    index,
                    gid,
                    gid_type: GidType::from_raw(raw.gid_type),
                    netdev,
                }))
            }
            // An empty entry.
            Err(e) if e.errno() == Some(libc::ENODATA) => Ok(None),
            Err(e) => match sysfs.gid(self.name(), port, index) {
                Some(gid) if gid.is_zero() => Ok(None),
                Some(gid) => Ok(Some(GidEntry {
                    index,
                    gid,
                    gid_type: sysfs.gid_type(self.name(), port, index, attr.link_layer),
                    netdev: sysfs.gid_netdev(self.name(), port, index),
                })),
                None => Err(e),
            },
        }
    }
}

/// The name of network interface `ifindex` in this network namespace (0 = none).
fn interface_name(ifindex: u32) -> Option<String> {
    if ifindex == 0 {
        return None;
    }
    let mut buf = [0 as libc::c_char; libc::IF_NAMESIZE];
    // SAFETY: `buf` has the IF_NAMESIZE bytes if_indextoname may write, NUL included.
    let p = unsafe { libc::if_indextoname(ifindex, buf.as_mut_ptr()) };
    if p.is_null() {
        return None;
    }
    let bytes: Vec<u8> = buf
        .iter()
        .map(|&c| c as u8)
        .take_while(|&b| b != 0)
        .collect();
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPPED: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 9, 0, 1];
    const LINK_LOCAL: [u8; 16] = [
        0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x50, 0x54, 0x00, 0xff, 0xfe, 0x12, 0x34, 0x56,
    ];

    #[test]
    fn gid_colon_form() {
        assert_eq!(
            Gid(LINK_LOCAL).to_string(),
            "fe80:0000:0000:0000:5054:00ff:fe12:3456"
        );
        assert_eq!(
            Gid(MAPPED).to_string(),
            "0000:0000:0000:0000:0000:ffff:0a09:0001"
        );
    }

    #[test]
    fn gid_parse_round_trip() {
        for bytes in [MAPPED, LINK_LOCAL, [0xff; 16], [0; 16]] {
            let g = Gid(bytes);
            assert_eq!(g.to_string().parse::<Gid>(), Ok(g));
        }
        // sysfs ends the value with a newline; short groups are fine.
        assert_eq!(
            "fe80:0:0:0:5054:ff:fe12:3456\n".parse::<Gid>(),
            Ok(Gid(LINK_LOCAL))
        );
    }

    #[test]
    fn gid_parse_rejects_malformed() {
        for bad in [
            "",
            "fe80::1",
            "fe80:0000:0000:0000:5054:00ff:fe12",
            "fe80:0000:0000:0000:5054:00ff:fe12:3456:0000",
            "fe80:0000:0000:0000:5054:00ff:fe12:34567",
            "ge80:0000:0000:0000:5054:00ff:fe12:3456",
            "+e80:0000:0000:0000:5054:00ff:fe12:3456",
        ] {
            assert!(bad.parse::<Gid>().is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn ipv4_mapped_detection() {
        assert_eq!(Gid(MAPPED).ipv4_mapped(), Some(Ipv4Addr::new(10, 9, 0, 1)));
        assert_eq!(Gid(MAPPED).to_ipv6().to_string(), "::ffff:10.9.0.1");
        assert_eq!(Gid(LINK_LOCAL).ipv4_mapped(), None);
        // IPv4-compatible (::a.b.c.d, deprecated) is not IPv4-mapped.
        let mut compat = MAPPED;
        compat[10] = 0;
        compat[11] = 0;
        assert_eq!(Gid(compat).ipv4_mapped(), None);
        assert!(Gid([0; 16]).is_zero());
        assert!(!Gid(MAPPED).is_zero());
    }

    #[test]
    fn gid_type_from_sysfs() {
        assert_eq!(
            GidType::from_sysfs("RoCE v2\n", LinkLayer::Ethernet),
            Some(GidType::RoceV2)
        );
        assert_eq!(
            GidType::from_sysfs("IB/RoCE v1\n", LinkLayer::Ethernet),
            Some(GidType::RoceV1)
        );
        assert_eq!(
            GidType::from_sysfs("IB/RoCE v1", LinkLayer::InfiniBand),
            Some(GidType::Ib)
        );
        assert_eq!(
            GidType::from_sysfs("IB/RoCE v1", LinkLayer::Unspecified),
            None
        );
        assert_eq!(GidType::from_sysfs("RoCE v3", LinkLayer::Ethernet), None);
        assert_eq!(GidType::from_sysfs("", LinkLayer::Ethernet), None);
    }

    #[test]
    fn gid_type_from_raw_and_names() {
        let names: Vec<String> = (0..3)
            .map(|raw| GidType::from_raw(raw).unwrap().to_string())
            .collect();
        assert_eq!(names, ["IB", "RoCE v1", "RoCE v2"]);
        assert_eq!(GidType::from_raw(3), None);
    }

    #[test]
    fn roce_v2_ipv4_needs_both() {
        let entry = |bytes, gid_type| GidEntry {
            index: 0,
            gid: Gid(bytes),
            gid_type,
            netdev: None,
        };
        assert!(entry(MAPPED, Some(GidType::RoceV2)).is_roce_v2_ipv4());
        assert!(!entry(MAPPED, Some(GidType::RoceV1)).is_roce_v2_ipv4());
        assert!(!entry(MAPPED, None).is_roce_v2_ipv4());
        assert!(!entry(LINK_LOCAL, Some(GidType::RoceV2)).is_roce_v2_ipv4());
    }
}

//! `rdma-demo devices`: the RDMA devices, their ports and GID tables, like `ibv_devinfo` plus
//! `show_gids`.
//!
//! [`collect`] gathers an [`Inventory`] through [`crate::verbs`] and [`crate::sysfs`]; the
//! inventory serialises to JSON as is and renders as text with [`render_text`].

use std::fmt::Write as _;

use serde::Serialize;

use crate::sysfs::{ClassState, Sysfs};
use crate::verbs::{Context, Device, DeviceList, GidEntry, PortAttr, VerbsError};

/// Everything `devices` reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Inventory {
    pub devices: Vec<DeviceReport>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeviceReport {
    pub name: String,
    /// `xxxx:xxxx:xxxx:xxxx`, as ibv_devinfo prints it.
    pub node_guid: String,
    pub transport: String,
    /// Kernel driver of the parent device (`mlx5_core`, ...), if sysfs shows one.
    pub driver: Option<String>,
    /// Network device under a software RDMA device (Soft-RoCE), if sysfs shows one.
    pub parent_netdev: Option<String>,
    pub fw_ver: String,
    pub max_qp: i32,
    pub max_cqe: i32,
    pub max_mr_size: u64,
    pub max_qp_rd_atom: i32,
    pub atomic_cap: String,
    pub ports: Vec<PortReport>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PortReport {
    pub port: u8,
    /// `PORT_ACTIVE`, ...
    pub state: String,
    /// `InfiniBand` or `Ethernet` (RoCE).
    pub link_layer: String,
    /// Bytes.
    pub active_mtu: Option<u32>,
    pub max_mtu: Option<u32>,
    pub lid: u16,
    pub gids: Vec<GidReport>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GidReport {
    pub index: u32,
    /// Colon form, `0000:0000:0000:0000:0000:ffff:0a09:0001`.
    pub gid: String,
    /// `IB`, `RoCE v1` or `RoCE v2`; `null` if unknown.
    #[serde(rename = "type")]
    pub gid_type: Option<String>,
    pub netdev: Option<String>,
    /// The IPv4 address of an IPv4-mapped GID.
    pub ipv4: Option<String>,
    /// IPv4-mapped RoCE v2: the kind of GID the demos use by default.
    pub roce_v2_ipv4: bool,
}

/// Why `devices` could not report.
#[derive(Debug, thiserror::Error)]
pub enum DevicesError {
    /// No usable RDMA device at all; the text says what was checked and what to do.
    #[error("no RDMA devices: {0}")]
    NoDevices(String),
    #[error("no RDMA device named {name:?} (available: {})", available.join(", "))]
    UnknownDevice {
        name: String,
        available: Vec<String>,
    },
    #[error(transparent)]
    Verbs(#[from] VerbsError),
}

/// The devices libibverbs sees; none is an error that says why (what sysfs shows, what to do).
pub fn device_list() -> Result<DeviceList, DevicesError> {
    let sysfs = Sysfs::default();
    match DeviceList::new() {
        Ok(list) if !list.is_empty() => Ok(list),
        Ok(_) => Err(DevicesError::NoDevices(no_device_reason(
            &sysfs,
            &sysfs.scan(),
            None,
        ))),
        Err(e) => Err(DevicesError::NoDevices(no_device_reason(
            &sysfs,
            &sysfs.scan(),
            Some(&e),
        ))),
    }
}

/// Gathers the report for all devices, or only for `only`.
pub fn collect(only: Option<&str>) -> Result<Inventory, DevicesError> {
    let sysfs = Sysfs::default();
    let list = device_list()?;
    let devices: Vec<Device<'_>> = match only {
        None => list.iter().collect(),
        Some(name) => match list.find(name) {
            Some(dev) => vec![dev],
            None => {
                return Err(DevicesError::UnknownDevice {
                    name: name.to_string(),
                    available: list.iter().map(|d| d.name()).collect(),
                });
            }
        },
    };
    let devices = devices
        .iter()
        .map(|dev| device_report(&sysfs, dev))
        .collect::<Result<_, _>>()?;
    Ok(Inventory { devices })
}

fn device_report(sysfs: &Sysfs, dev: &Device<'_>) -> Result<DeviceReport, VerbsError> {
    let ctx = dev.open()?;
    let attr = ctx.query_device()?;
    let ports = (1..=attr.phys_port_cnt)
        .map(|port| port_report(&ctx, port))
        .collect::<Result<_, _>>()?;
    let name = ctx.name().to_string();
    Ok(DeviceReport {
        node_guid: format_guid(dev.guid()),
        transport: dev.transport().to_string(),
        driver: sysfs.driver(&name),
        parent_netdev: sysfs.parent(&name),
        fw_ver: attr.fw_ver,
        max_qp: attr.max_qp,
        max_cqe: attr.max_cqe,
        max_mr_size: attr.max_mr_size,
        max_qp_rd_atom: attr.max_qp_rd_atom,
        atomic_cap: attr.atomic_cap.to_string(),
        ports,
        name,
    })
}

fn port_report(ctx: &Context, port: u8) -> Result<PortReport, VerbsError> {
    let attr: PortAttr = ctx.query_port(port)?;
    let gids = ctx.gid_table(port, &attr)?.iter().map(gid_report).collect();
    Ok(PortReport {
        port,
        state: attr.state.to_string(),
        link_layer: attr.link_layer.to_string(),
        active_mtu: attr.active_mtu.map(|m| m.bytes()),
        max_mtu: attr.max_mtu.map(|m| m.bytes()),
        lid: attr.lid,
        gids,
    })
}

fn gid_report(entry: &GidEntry) -> GidReport {
    GidReport {
        index: entry.index,
        gid: entry.gid.to_string(),
        gid_type: entry.gid_type.map(|t| t.to_string()),
        netdev: entry.netdev.clone(),
        ipv4: entry.gid.ipv4_mapped().map(|a| a.to_string()),
        roce_v2_ipv4: entry.is_roce_v2_ipv4(),
    }
}

/// A node GUID the way ibv_devinfo prints it: four groups of four hex digits.
pub fn format_guid(guid: u64) -> String {
    let b = guid.to_be_bytes();
    format!(
        "{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}",
        b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]
    )
}

const SOFT_ROCE_HINT: &str = "modprobe rdma_rxe && rdma link add rxe0 type rxe netdev <ifname>";

/// Explains why libibverbs reported no device, from what sysfs shows, and says what to do.
pub fn no_device_reason(
    sysfs: &Sysfs,
    class: &ClassState,
    list_error: Option<&VerbsError>,
) -> String {
    let root = sysfs.root().display();
    let (finding, advice) = match class {
        ClassState::Missing => (
            format!("{root} does not exist: no RDMA core (ib_core) in the running kernel"),
            format!(
                "load the driver of an RDMA NIC, or create a Soft-RoCE device: {SOFT_ROCE_HINT}"
            ),
        ),
        ClassState::Unreadable(e) => (
            format!("cannot read {root}: {e}"),
            "check that sysfs is mounted and readable".to_string(),
        ),
        ClassState::Devices(names) if names.is_empty() => (
            format!("{root} is empty"),
            format!("load a driver, or create a Soft-RoCE device: {SOFT_ROCE_HINT}"),
        ),
        ClassState::Devices(names) => (
            format!(
                "libibverbs found none although {root} lists {}",
                names.join(", ")
            ),
            "install the user-space provider (Debian: ibverbs-providers) and check access to \
             /dev/infiniband/uverbs*"
                .to_string(),
        ),
    };
    match list_error {
        Some(e) => format!("{finding} ({e}); {advice}"),
        None => format!("{finding}; {advice}"),
    }
}

/// The text form of [`Inventory`].
pub fn render_text(inv: &Inventory) -> String {
    let mut out = String::new();
    let mut marked = false;
    for dev in &inv.devices {
        let _ = writeln!(out, "device {}", dev.name);
        field(&mut out, 1, "node GUID", &dev.node_guid);
        field(&mut out, 1, "transport", &dev.transport);
        if let Some(driver) = &dev.driver {
            field(&mut out, 1, "driver", driver);
        }
        if let Some(parent) = &dev.parent_netdev {
            field(&mut out, 1, "parent netdev", parent);
        }
        field(&mut out, 1, "firmware", &dev.fw_ver);
        field(
            &mut out,
            1,
            "limits",
            &format!(
                "max_qp {}, max_cqe {}, max_mr_size {:#x}, max_qp_rd_atom {}",
                dev.max_qp, dev.max_cqe, dev.max_mr_size, dev.max_qp_rd_atom
            ),
        );
        field(&mut out, 1, "atomics", &dev.atomic_cap);
        for port in &dev.ports {
            let _ = writeln!(out, "    port {}", port.port);
            field(&mut out, 2, "state", &port.state);
            field(&mut out, 2, "link layer", &port.link_layer);
            field(
                &mut out,
                2,
                "active MTU",
                &format!(
                    "{} (max {})",
                    mtu_text(port.active_mtu),
                    mtu_text(port.max_mtu)
                ),
            );
            field(&mut out, 2, "LID", &port.lid.to_string());
            if port.gids.is_empty() {
                field(&mut out, 2, "GIDs", "none");
                continue;
            }
            let _ = writeln!(out, "        GIDs");
            let netdev_width = port
                .gids
                .iter()
                .filter_map(|g| g.netdev.as_deref().map(str::len))
                .fold("netdev".len(), usize::max);
            let header = format!(
                "            {:>5}  {:<39}  {:<7}  {:<netdev_width$}",
                "index", "GID", "type", "netdev"
            );
            let _ = writeln!(out, "{}", header.trim_end());
            for g in &port.gids {
                marked |= g.roce_v2_ipv4;
                let mut line = format!(
                    "          {} {:>5}  {:<39}  {:<7}  {:<netdev_width$}",
                    if g.roce_v2_ipv4 { '*' } else { ' ' },
                    g.index,
                    g.gid,
                    g.gid_type.as_deref().unwrap_or("?"),
                    g.netdev.as_deref().unwrap_or("-"),
                );
                if let Some(ip) = &g.ipv4 {
                    let _ = write!(line, "  ::ffff:{ip}");
                }
                let _ = writeln!(out, "{}", line.trim_end());
            }
        }
    }
    if marked {
        out.push_str("* IPv4-mapped RoCE v2 GID: what the demos use by default\n");
    }
    out
}

fn field(out: &mut String, depth: usize, key: &str, value: &str) {
    let _ = writeln!(
        out,
        "{:indent$}{:<14} {value}",
        "",
        format!("{key}:"),
        indent = depth * 4
    );
}

fn mtu_text(mtu: Option<u32>) -> String {
    mtu.map_or_else(|| "?".to_string(), |m| m.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sysfs::tests::Scratch;
    use crate::test_util::assert_contains_all;

    fn gid(index: u32, gid: &str, gid_type: &str, ipv4: Option<&str>) -> GidReport {
        GidReport {
            index,
            gid: gid.into(),
            gid_type: Some(gid_type.into()),
            netdev: Some("va".into()),
            ipv4: ipv4.map(Into::into),
            roce_v2_ipv4: ipv4.is_some() && gid_type == "RoCE v2",
        }
    }

    fn rxe0() -> Inventory {
        Inventory {
            devices: vec![DeviceReport {
                name: "rxe0".into(),
                node_guid: "5054:00ff:fe12:3456".into(),
                transport: "InfiniBand".into(),
                driver: None,
                parent_netdev: Some("va".into()),
                fw_ver: "0.0.0".into(),
                max_qp: 1048560,
                max_cqe: 32767,
                max_mr_size: u64::MAX,
                max_qp_rd_atom: 128,
                atomic_cap: "ATOMIC_HCA".into(),
                ports: vec![PortReport {
                    port: 1,
                    state: "PORT_ACTIVE".into(),
                    link_layer: "Ethernet".into(),
                    active_mtu: Some(1024),
                    max_mtu: Some(4096),
                    lid: 0,
                    gids: vec![
                        gid(
                            0,
                            "fe80:0000:0000:0000:5054:00ff:fe12:3456",
                            "RoCE v1",
                            None,
                        ),
                        gid(
                            1,
                            "0000:0000:0000:0000:0000:ffff:0a09:0001",
                            "RoCE v1",
                            Some("10.9.0.1"),
                        ),
                        gid(
                            2,
                            "0000:0000:0000:0000:0000:ffff:0a09:0001",
                            "RoCE v2",
                            Some("10.9.0.1"),
                        ),
                    ],
                }],
            }],
        }
    }

    #[test]
    fn guid_groups() {
        assert_eq!(format_guid(0x5054_00ff_fe12_3456), "5054:00ff:fe12:3456");
        assert_eq!(format_guid(1), "0000:0000:0000:0001");
    }

    #[test]
    fn text_lists_ports_and_marks_roce_v2_ipv4() {
        let text = render_text(&rxe0());
        assert!(text.starts_with("device rxe0\n"), "{text}");
        assert!(!text.contains("driver:"), "{text}");
        assert_contains_all(
            &text,
            &[
                "    parent netdev: va\n",
                "        state:         PORT_ACTIVE\n",
                "        link layer:    Ethernet\n",
                "        active MTU:    1024 (max 4096)\n",
            ],
        );
        let gid_lines: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("0000:0000:0000:0000:0000:ffff:0a09:0001"))
            .collect();
        assert_eq!(gid_lines.len(), 2, "{text}");
        // Only the RoCE v2 one is marked; both show the IPv4 form.
        assert!(
            !gid_lines[0].trim_start().starts_with('*') && gid_lines[0].contains("RoCE v1"),
            "{text}"
        );
        assert!(
            gid_lines[1].trim_start().starts_with("* ") && gid_lines[1].contains("RoCE v2"),
            "{text}"
        );
        let tokens: Vec<&str> = gid_lines[1].split_whitespace().collect();
        assert_eq!(
            tokens,
            [
                "*",
                "2",
                "0000:0000:0000:0000:0000:ffff:0a09:0001",
                "RoCE",
                "v2",
                "va",
                "::ffff:10.9.0.1"
            ]
        );
        assert!(gid_lines[0].ends_with("va      ::ffff:10.9.0.1"), "{text}");
        assert!(
            text.ends_with("* IPv4-mapped RoCE v2 GID: what the demos use by default\n"),
            "{text}"
        );
    }

    #[test]
    fn text_without_roce_v2_ipv4_has_no_legend() {
        let mut inv = rxe0();
        inv.devices[0].ports[0].gids.truncate(1);
        let text = render_text(&inv);
        assert!(!text.contains('*'), "{text}");
        inv.devices[0].ports[0].gids.clear();
        assert!(render_text(&inv).contains("        GIDs:          none\n"));
    }

    #[test]
    fn json_field_names() {
        let v = serde_json::to_value(rxe0()).unwrap();
        let dev = &v["devices"][0];
        assert_eq!(dev["name"], "rxe0");
        assert_eq!(dev["driver"], serde_json::Value::Null);
        assert_eq!(dev["parent_netdev"], "va");
        let port = &dev["ports"][0];
        assert_eq!(port["state"], "PORT_ACTIVE");
        assert_eq!(port["link_layer"], "Ethernet");
        assert_eq!(port["active_mtu"], 1024);
        let g = &port["gids"][2];
        assert_eq!(g["type"], "RoCE v2");
        assert_eq!(g["ipv4"], "10.9.0.1");
        assert_eq!(g["netdev"], "va");
        assert_eq!(g["roce_v2_ipv4"], true);
        assert_eq!(port["gids"][1]["roce_v2_ipv4"], false);
    }

    #[test]
    fn reason_for_missing_class_dir() {
        let s = Scratch::new("reason-missing");
        let sysfs = Sysfs::at(s.0.join("infiniband"));
        let r = no_device_reason(&sysfs, &sysfs.scan(), None);
        assert!(
            r.starts_with(&format!("{} does not exist", sysfs.root().display())),
            "{r}"
        );
        assert!(
            r.contains("rdma link add rxe0 type rxe netdev <ifname>"),
            "{r}"
        );
        assert!(!r.contains('\n'));
    }

    #[test]
    fn reason_for_empty_class_dir_includes_list_error() {
        let s = Scratch::new("reason-empty");
        let sysfs = Sysfs::at(&s.0);
        let err = VerbsError {
            call: "ibv_get_device_list",
            target: String::new(),
            source: std::io::Error::from_raw_os_error(libc::ENOSYS),
        };
        let r = no_device_reason(&sysfs, &sysfs.scan(), Some(&err));
        assert!(
            r.starts_with(&format!(
                "{} is empty ({err}); load a driver",
                s.0.display()
            )),
            "{r}"
        );
        assert!(
            r.ends_with("rdma link add rxe0 type rxe netdev <ifname>"),
            "{r}"
        );
    }

    #[test]
    fn reason_when_only_the_provider_is_missing() {
        let s = Scratch::new("reason-provider");
        s.write("mlx5_0/node_type", "1: CA\n");
        s.write("rxe0/parent", "va\n");
        let sysfs = Sysfs::at(&s.0);
        let r = no_device_reason(&sysfs, &sysfs.scan(), None);
        assert!(
            r.contains("lists mlx5_0, rxe0; install the user-space provider"),
            "{r}"
        );
    }

    #[test]
    fn errors_are_one_line() {
        let e = DevicesError::UnknownDevice {
            name: "nosuchdev".into(),
            available: vec!["rxe0".into(), "rxe1".into()],
        };
        assert_eq!(
            e.to_string(),
            "no RDMA device named \"nosuchdev\" (available: rxe0, rxe1)"
        );
        assert_eq!(
            DevicesError::NoDevices("x".into()).to_string(),
            "no RDMA devices: x"
        );
    }
}

//! What the kernel shows under `/sys/class/infiniband`: which RDMA devices exist, their drivers,
//! and GID attributes. Used to explain a missing device and as the GID table fallback.
//!
//! Every path is relative to a root directory so tests can point it at a fixture tree.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use crate::verbs::{Gid, GidType, LinkLayer};

/// Where the kernel lists RDMA devices.
pub const INFINIBAND_CLASS: &str = "/sys/class/infiniband";

/// What the device class directory holds.
#[derive(Debug)]
pub enum ClassState {
    /// The directory does not exist: no RDMA core (`ib_core`) in the running kernel.
    Missing,
    /// It exists but cannot be read.
    Unreadable(io::Error),
    /// Device names, sorted; empty when no driver registered a device.
    Devices(Vec<String>),
}

/// `/sys/class/infiniband`, or a fixture copy of it.
#[derive(Debug, Clone)]
pub struct Sysfs {
    root: PathBuf,
}

impl Default for Sysfs {
    fn default() -> Self {
        Sysfs::at(INFINIBAND_CLASS)
    }
}

impl Sysfs {
    pub fn at(root: impl Into<PathBuf>) -> Self {
        Sysfs { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn scan(&self) -> ClassState {
        let dir = match fs::read_dir(&self.root) {
            Ok(dir) => dir,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return ClassState::Missing,
            Err(e) => return ClassState::Unreadable(e),
        };
        let mut names = Vec::new();
        for entry in dir {
            match entry {
                Ok(entry) => names.push(entry.file_name().to_string_lossy().into_owned()),
                Err(e) => return ClassState::Unreadable(e),
            }
        }
        names.sort();
        ClassState::Devices(names)
    }

    /// The kernel driver bound to the device's parent (`<dev>/device/driver`, e.g. `mlx5_core`).
    /// Software devices such as Soft-RoCE have none.
    pub fn driver(&self, dev: &str) -> Option<String> {
        let target = fs::read_link(self.root.join(dev).join("device/driver")).ok()?;
        Some(target.file_name()?.to_string_lossy().into_owned())
    }

    /// The network device a software RDMA device (Soft-RoCE rxe, siw) is layered on
    /// (`<dev>/parent`).
    pub fn parent(&self, dev: &str) -> Option<String> {
        self.read_value(&self.root.join(dev).join("parent"))
    }

    /// `<dev>/ports/<port>/gids/<index>`.
    pub fn gid(&self, dev: &str, port: u8, index: u32) -> Option<Gid> {
        self.read_value(&self.port_dir(dev, port).join(format!("gids/{index}")))?
            .parse()
            .ok()
    }

    /// `<dev>/ports/<port>/gid_attrs/types/<index>`; reading an empty entry fails (EINVAL).
    pub fn gid_type(
        &self,
        dev: &str,
        port: u8,
        index: u32,
        link_layer: LinkLayer,
    ) -> Option<GidType> {
        let s = self.read_value(
            &self
                .port_dir(dev, port)
                .join(format!("gid_attrs/types/{index}")),
        )?;
        GidType::from_sysfs(&s, link_layer)
    }

    /// `<dev>/ports/<port>/gid_attrs/ndevs/<index>`; RoCE only.
    pub fn gid_netdev(&self, dev: &str, port: u8, index: u32) -> Option<String> {
        self.read_value(
            &self
                .port_dir(dev, port)
                .join(format!("gid_attrs/ndevs/{index}")),
        )
    }

    fn port_dir(&self, dev: &str, port: u8) -> PathBuf {
        self.root.join(dev).join("ports").join(port.to_string())
    }

    /// A one-line sysfs value without its newline; `None` if unreadable or empty.
    fn read_value(&self, path: &Path) -> Option<String> {
        let s = fs::read_to_string(path).ok()?;
        let s = s.trim();
        (!s.is_empty()).then(|| s.to_string())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A scratch directory removed on drop.
    pub(crate) struct Scratch(pub(crate) PathBuf);

    impl Scratch {
        pub(crate) fn new(tag: &str) -> Self {
            static N: AtomicUsize = AtomicUsize::new(0);
            let n = N.fetch_add(1, Ordering::Relaxed);
            let dir =
                std::env::temp_dir().join(format!("rdma-demo-{tag}-{}-{n}", std::process::id()));
            let _ = fs::remove_dir_all(&dir);
            fs::create_dir_all(&dir).unwrap();
            Scratch(dir)
        }

        pub(crate) fn write(&self, rel: &str, contents: &str) {
            let p = self.0.join(rel);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(p, contents).unwrap();
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn scan_missing_empty_and_devices() {
        let s = Scratch::new("scan");
        assert!(matches!(
            Sysfs::at(s.0.join("nope")).scan(),
            ClassState::Missing
        ));
        let class = Sysfs::at(&s.0);
        assert!(matches!(class.scan(), ClassState::Devices(v) if v.is_empty()));
        s.write("rxe1/parent", "vb\n");
        s.write("rxe0/parent", "va\n");
        match class.scan() {
            ClassState::Devices(v) => assert_eq!(v, ["rxe0", "rxe1"]),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn rxe_fixture_parent_gids_and_attrs() {
        let s = Scratch::new("rxe");
        s.write("rxe0/parent", "va\n");
        s.write(
            "rxe0/ports/1/gids/0",
            "fe80:0000:0000:0000:5054:00ff:fe12:3456\n",
        );
        s.write(
            "rxe0/ports/1/gids/1",
            "0000:0000:0000:0000:0000:ffff:0a09:0001\n",
        );
        s.write("rxe0/ports/1/gid_attrs/types/0", "IB/RoCE v1\n");
        s.write("rxe0/ports/1/gid_attrs/types/1", "RoCE v2\n");
        s.write("rxe0/ports/1/gid_attrs/ndevs/1", "va\n");
        let class = Sysfs::at(&s.0);
        assert_eq!(class.parent("rxe0").as_deref(), Some("va"));
        assert_eq!(class.driver("rxe0"), None);
        let gid = class.gid("rxe0", 1, 1).unwrap();
        assert_eq!(
            gid.ipv4_mapped(),
            Some(std::net::Ipv4Addr::new(10, 9, 0, 1))
        );
        assert_eq!(
            class.gid_type("rxe0", 1, 0, LinkLayer::Ethernet),
            Some(GidType::RoceV1)
        );
        assert_eq!(
            class.gid_type("rxe0", 1, 1, LinkLayer::Ethernet),
            Some(GidType::RoceV2)
        );
        assert_eq!(class.gid_netdev("rxe0", 1, 1).as_deref(), Some("va"));
        assert_eq!(class.gid_netdev("rxe0", 1, 0), None);
        assert_eq!(class.gid("rxe0", 1, 7), None);
    }

    #[test]
    fn driver_is_the_symlink_basename() {
        let s = Scratch::new("drv");
        s.write("drivers/mlx5_core/.keep", "");
        fs::create_dir_all(s.0.join("mlx5_0/device")).unwrap();
        std::os::unix::fs::symlink(
            s.0.join("drivers/mlx5_core"),
            s.0.join("mlx5_0/device/driver"),
        )
        .unwrap();
        assert_eq!(
            Sysfs::at(&s.0).driver("mlx5_0").as_deref(),
            Some("mlx5_core")
        );
    }
}

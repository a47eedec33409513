//! A temporary Soft-RoCE device for hosts with `rdma_rxe` but no RDMA device.
//!
//! `rdma link add` binds an rxe device to an existing netdev; it touches no address, route or
//! rule, and [`TempRxe`] removes the device again when dropped (normal exit, error, Ctrl-C,
//! SIGTERM: every path that unwinds through `main`).

use std::{path::Path, process::Command};

use anyhow::{Context as _, Result, bail};

/// Name of the temporary device: ours, so we never remove a device we did not create.
pub const NAME: &str = "rdmatrace0";

/// The temporary device; removed on drop.
#[derive(Debug)]
pub struct TempRxe {
    pub name: String,
    pub netdev: String,
}

/// rdma_rxe is loaded, or its module file is there to load.
pub fn available() -> bool {
    if Path::new("/sys/module/rdma_rxe").exists() {
        return true;
    }
    let Ok(release) = std::fs::read_to_string("/proc/sys/kernel/osrelease") else {
        return false;
    };
    let dir = Path::new("/lib/modules")
        .join(release.trim())
        .join("kernel/drivers/infiniband/sw/rxe");
    ["rdma_rxe.ko", "rdma_rxe.ko.xz", "rdma_rxe.ko.zst"]
        .iter()
        .any(|f| dir.join(f).is_file())
}

impl TempRxe {
    /// Create the device on the first netdev that is up and has an IPv4 address.
    pub fn create() -> Result<Self> {
        if !Path::new("/sys/module/rdma_rxe").exists() {
            let ok = Command::new("modprobe")
                .arg("rdma_rxe")
                .status()
                .is_ok_and(|s| s.success());
            if !ok {
                bail!("the kernel has no rdma_rxe module (modprobe rdma_rxe failed)");
            }
        }
        let out = Command::new("ip")
            .args(["-o", "-4", "addr", "show", "up"])
            .output()
            .context("running `ip -o -4 addr show up` (iproute2)")?;
        let netdev = pick_netdev(&String::from_utf8_lossy(&out.stdout))
            .context("no netdev is up with an IPv4 address to bind a Soft-RoCE device to")?;
        let status = Command::new("rdma")
            .args(["link", "add", NAME, "type", "rxe", "netdev", &netdev])
            .status()
            .context("running `rdma link add` (iproute2)")?;
        if !status.success() {
            bail!("`rdma link add {NAME} type rxe netdev {netdev}` failed ({status})");
        }
        Ok(Self {
            name: NAME.to_owned(),
            netdev,
        })
    }
}

impl Drop for TempRxe {
    fn drop(&mut self) {
        let ok = Command::new("rdma")
            .args(["link", "delete", &self.name])
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            eprintln!(
                "rdma-trace: removed the temporary Soft-RoCE device {}",
                self.name
            );
        } else {
            eprintln!(
                "rdma-trace: could not remove the temporary Soft-RoCE device {}: run `rdma link delete {}`",
                self.name, self.name
            );
        }
    }
}

/// First non-loopback interface in `ip -o -4 addr show up` output.
fn pick_netdev(ip_output: &str) -> Option<String> {
    ip_output.lines().find_map(|l| {
        let mut it = l.split_whitespace();
        let _index = it.next()?;
        let name = it.next()?.trim_end_matches(':');
        (name != "lo").then(|| name.split('@').next().unwrap_or(name).to_owned())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_the_first_non_loopback_ipv4_netdev() {
        let out = "\
1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever preferred_lft forever
2: eth0    inet 10.0.2.15/24 brd 10.0.2.255 scope global eth0\\       valid_lft forever
3: va@vb    inet 10.9.0.1/24 scope global va\\       valid_lft forever
";
        assert_eq!(pick_netdev(out).as_deref(), Some("eth0"));
        assert_eq!(
            pick_netdev(&out.lines().skip(2).collect::<Vec<_>>().join("\n")).as_deref(),
            Some("va")
        );
        assert_eq!(pick_netdev("1: lo    inet 127.0.0.1/8 scope host lo"), None);
    }
}

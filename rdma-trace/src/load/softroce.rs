//! A temporary Soft-RoCE device for hosts with `rdma_rxe` but no RDMA device.
//!
//! `rdma link add` binds an rxe device to an existing netdev; it touches no address, route or
//! rule, and [`TempRxe`] removes the device again when dropped (normal exit, error, and every
//! stop signal: they unwind through `main`, see `crate::signals`).
//!
//! A SIGKILL (or a crash) skips the drop. So the device has an owner on record: before creating
//! it, rdma-trace takes an exclusive `flock` on `/run/rdma-trace/rdmatrace0.lock` and writes its
//! pid there, and holds the lock while the device lives. The kernel releases the lock when the
//! process dies, however it dies. The next run that finds `rdmatrace0` and gets the lock knows its
//! owner is gone: it removes the device and says so ([`prepare`]).

use std::{
    fs::File,
    io::{Read as _, Seek as _, Write as _},
    os::{fd::AsRawFd as _, unix::fs::MetadataExt as _},
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

use crate::kernel::facts::RdmaDevice;

/// Name of the temporary device: ours, so we never remove a device we did not create.
pub const NAME: &str = "rdmatrace0";

/// Where the owner of the temporary device is on record (root-only, like `/run` itself).
pub const LOCK_DIR: &str = "/run/rdma-trace";

/// The temporary device; removed on drop.
#[derive(Debug)]
pub struct TempRxe {
    pub name: String,
    pub netdev: String,
    /// Dropped after the device is removed (fields drop after `Drop::drop`).
    _owner: Owner,
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

fn device_exists(name: &str) -> bool {
    Path::new("/sys/class/infiniband").join(name).exists()
}

/// Before anything else is set up: remove a leftover `rdmatrace0` whose owner is gone (saying
/// so), then, when `devices` holds no other RDMA device and Soft-RoCE is available, create the
/// temporary device. `None`: real devices are there (or Soft-RoCE is not).
pub fn prepare(devices: &[RdmaDevice]) -> Result<Option<TempRxe>> {
    let others = devices.iter().any(|d| d.name != NAME);
    let leftover = device_exists(NAME);
    let wanted = !others && available();
    if !leftover && !wanted {
        return Ok(None);
    }
    let owner = match claim(Path::new(LOCK_DIR))? {
        Claim::Busy(pid) if wanted => bail!(
            "another rdma-trace{} is using the temporary Soft-RoCE device {NAME}: wait until it \
             ends",
            pid.map(|p| format!(" (pid {p})")).unwrap_or_default()
        ),
        // Another run's device, and we use the real ones.
        Claim::Busy(_) => return Ok(None),
        Claim::Ours(owner) => owner,
    };
    if leftover {
        delete(NAME).with_context(|| {
            format!("removing the leftover temporary Soft-RoCE device {NAME} of an earlier run")
        })?;
        eprintln!(
            "rdma-trace: removed the leftover temporary Soft-RoCE device {NAME} (its owner{} is \
             gone)",
            owner
                .previous
                .map(|p| format!(", rdma-trace pid {p},"))
                .unwrap_or_default()
        );
    }
    if !wanted {
        return Ok(None);
    }
    let t = TempRxe::create(owner)?;
    eprintln!(
        "rdma-trace: no RDMA device: created the temporary Soft-RoCE device {} on {} (removed at exit)",
        t.name, t.netdev
    );
    // A stop signal during `rdma link add` lands here: the device goes again at once.
    crate::signals::check()?;
    Ok(Some(t))
}

/// `devices` without another run's temporary device (ours, when `temp` is there, stays).
pub fn usable(devices: Vec<RdmaDevice>, temp: Option<&TempRxe>) -> Vec<RdmaDevice> {
    devices
        .into_iter()
        .filter(|d| d.name != NAME || temp.is_some())
        .collect()
}

fn delete(name: &str) -> Result<()> {
    let status = Command::new("rdma")
        .args(["link", "delete", name])
        .status()
        .context("running `rdma link delete` (iproute2)")?;
    if !status.success() {
        bail!("`rdma link delete {name}` failed ({status})");
    }
    Ok(())
}

impl TempRxe {
    /// Create the device on the first netdev that is up and has an IPv4 address.
    fn create(owner: Owner) -> Result<Self> {
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
            // Killed half-way, it may still have made the device.
            if device_exists(NAME) {
                let _ = delete(NAME);
            }
            bail!("`rdma link add {NAME} type rxe netdev {netdev}` failed ({status})");
        }
        Ok(Self {
            name: NAME.to_owned(),
            netdev,
            _owner: owner,
        })
    }
}

impl Drop for TempRxe {
    fn drop(&mut self) {
        match delete(&self.name) {
            Ok(()) => eprintln!(
                "rdma-trace: removed the temporary Soft-RoCE device {}",
                self.name
            ),
            Err(e) => eprintln!(
                "rdma-trace: could not remove the temporary Soft-RoCE device {}: {e:#}; run `rdma link delete {}`",
                self.name, self.name
            ),
        }
    }
}

/// The lock on record for the temporary device: held while this lives; the file goes on drop.
#[derive(Debug)]
struct Owner {
    _file: File,
    path: PathBuf,
    /// The pid the file named before (an owner that is gone).
    previous: Option<u32>,
}

#[derive(Debug)]
enum Claim {
    Ours(Owner),
    /// A live process holds the lock; the pid it wrote, if readable.
    Busy(Option<u32>),
}

fn read_pid(file: &mut File) -> Option<u32> {
    let mut s = String::new();
    file.rewind().ok()?;
    file.read_to_string(&mut s).ok()?;
    s.trim().parse().ok()
}

/// Take the lock in `dir` (created 0700 if missing) without waiting.
fn claim(dir: &Path) -> Result<Claim> {
    match std::fs::create_dir(dir) {
        Ok(()) => {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
                .with_context(|| format!("setting the mode of {}", dir.display()))?;
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e).with_context(|| format!("creating {}", dir.display())),
    }
    let meta = std::fs::symlink_metadata(dir).with_context(|| format!("{}", dir.display()))?;
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    if !meta.is_dir() || meta.uid() != euid {
        bail!(
            "{} is not a directory of ours: remove it and run again",
            dir.display()
        );
    }
    let path = dir.join(format!("{NAME}.lock"));
    loop {
        let mut file = crate::output::no_follow(0o600)
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .with_context(|| format!("opening the lock file {}", path.display()))?;
        // SAFETY: flock on a descriptor we own; no memory is involved.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
                return Ok(Claim::Busy(read_pid(&mut file)));
            }
            return Err(e).with_context(|| format!("locking {}", path.display()));
        }
        // The previous owner removes the file before it unlocks: if it did so after our open,
        // we hold a lock on a file nobody else sees. Then start over.
        let ours = file.metadata().context("the lock file")?;
        match std::fs::symlink_metadata(&path) {
            Ok(m) if m.dev() == ours.dev() && m.ino() == ours.ino() => {}
            _ => continue,
        }
        let previous = read_pid(&mut file);
        file.set_len(0).context("truncating the lock file")?;
        file.rewind().context("the lock file")?;
        writeln!(file, "{}", std::process::id()).context("writing the lock file")?;
        return Ok(Claim::Ours(Owner {
            _file: file,
            path,
            previous,
        }));
    }
}

impl Drop for Owner {
    fn drop(&mut self) {
        // Still locked: nobody can take the lock on this file between unlink and close.
        // `file` closes (and unlocks) right after this.
        let _ = std::fs::remove_file(&self.path);
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

    #[test]
    fn the_lock_names_its_owner_and_tells_a_live_owner_from_a_gone_one() {
        let d = crate::output::PrivateDir::new("rdma-trace-test-").unwrap();
        let dir = d.path().join("run");
        let lock = dir.join("rdmatrace0.lock");
        // First claim: no previous owner; the file holds our pid; the directory is private.
        let Claim::Ours(first) = claim(&dir).unwrap() else {
            panic!("not claimed")
        };
        assert_eq!(first.previous, None);
        let me = std::process::id();
        assert_eq!(std::fs::read_to_string(&lock).unwrap(), format!("{me}\n"));
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        // While it is held (a separate open file: flock conflicts), the owner is alive.
        match claim(&dir).unwrap() {
            Claim::Busy(pid) => assert_eq!(pid, Some(me)),
            Claim::Ours(_) => panic!("claimed a held lock"),
        }
        // Released: the file is gone with it.
        drop(first);
        assert!(!lock.exists());
        // A file left by an owner that died (no lock held): ours, naming the gone owner.
        std::fs::write(&lock, "4242\n").unwrap();
        let Claim::Ours(second) = claim(&dir).unwrap() else {
            panic!("a stale lock file was taken for a live owner")
        };
        assert_eq!(second.previous, Some(4242));
        assert_eq!(std::fs::read_to_string(&lock).unwrap(), format!("{me}\n"));
    }

    #[test]
    fn another_runs_device_is_not_used_as_a_real_one() {
        let dev = |n: &str| RdmaDevice {
            name: n.to_owned(),
            driver: None,
            parent_netdev: None,
        };
        let kept = usable(vec![dev("mlx5_0"), dev(NAME)], None);
        assert_eq!(kept.len(), 1);
        assert_eq!(kept[0].name, "mlx5_0");
    }
}

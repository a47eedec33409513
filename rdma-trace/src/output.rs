//! Files rdma-trace writes, safely as root: no predictable name in a shared directory, no
//! write through a symlink planted there, no half-written report.
//!
//! * [`PrivateDir`]: a directory of our own (mode 0700, random name, created atomically by
//!   `mkdtemp`) under `$TMPDIR`, for files a child writes for us (the demo's JSON); removed with
//!   what it holds when dropped. It holds a `flock`ed `owner` file while it lives, so after a
//!   SIGKILL the next run can tell it is orphaned and remove it ([`PrivateDir::reclaim`]).
//! * [`check_writable`]: before anything is attached, the output path is tried, so a bad path
//!   costs nothing.
//! * [`write_atomic`]: a temporary file in the target's directory, then `rename` over the
//!   target: readers see the old file or the whole new one, never a part; a symlink at the
//!   target is replaced, not followed. Targets that are not regular files (`/dev/stdout`, a
//!   FIFO) are written in place.

use std::{
    ffi::{CString, OsString},
    fs::File,
    io::Write as _,
    os::unix::{
        ffi::{OsStrExt as _, OsStringExt as _},
        fs::PermissionsExt as _,
    },
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result, bail};
use serde::Serialize;

/// A private directory (0700, unpredictable name); removed, with its contents, on drop.
#[derive(Debug)]
pub struct PrivateDir {
    path: PathBuf,
    /// `owner`, locked while the directory is in use.
    _owner: File,
}

/// The lock file inside a private directory.
const OWNER: &str = "owner";

/// Options that never open through a symlink at the path (`O_NOFOLLOW`), keep the descriptor
/// from children (`O_CLOEXEC`), and create a file with `mode`.
pub fn no_follow(mode: u32) -> std::fs::OpenOptions {
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut options = std::fs::OpenOptions::new();
    options
        .mode(mode)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC);
    options
}

/// Open `path` without following a symlink and try to lock it; `Ok(true)`: locked by us now.
fn try_lock(path: &Path, create: bool) -> std::io::Result<(File, bool)> {
    let file = no_follow(0o600)
        .read(true)
        .write(true)
        .create_new(create)
        .open(path)?;
    // SAFETY: flock on a descriptor we own; no memory is involved.
    let locked = unsafe {
        libc::flock(
            std::os::fd::AsRawFd::as_raw_fd(&file),
            libc::LOCK_EX | libc::LOCK_NB,
        )
    } == 0;
    Ok((file, locked))
}

impl PrivateDir {
    /// `$TMPDIR/<prefix>XXXXXX`, made by `mkdtemp` (mode 0700; fails rather than reuse an
    /// existing name).
    pub fn new(prefix: &str) -> Result<Self> {
        Self::new_in(&std::env::temp_dir(), prefix)
    }

    pub fn new_in(parent: &Path, prefix: &str) -> Result<Self> {
        let template = parent.join(format!("{prefix}XXXXXX"));
        let mut bytes = CString::new(template.as_os_str().as_bytes())
            .context("the temporary directory's path contains a NUL byte")?
            .into_bytes_with_nul();
        // SAFETY: `bytes` is a writable NUL-terminated buffer ending in "XXXXXX", as mkdtemp
        // requires; it only rewrites those six bytes.
        let made = unsafe { libc::mkdtemp(bytes.as_mut_ptr().cast()) };
        if made.is_null() {
            return Err(std::io::Error::last_os_error()).with_context(|| {
                format!(
                    "creating a private directory in {} (set TMPDIR to a writable directory)",
                    parent.display()
                )
            });
        }
        bytes.pop(); // the NUL
        let path = PathBuf::from(OsString::from_vec(bytes));
        let owner = match try_lock(&path.join(OWNER), true) {
            Ok((f, true)) => f,
            Ok((_, false)) => {
                let _ = std::fs::remove_dir_all(&path);
                bail!("could not lock {}", path.join(OWNER).display());
            }
            Err(e) => {
                let _ = std::fs::remove_dir_all(&path);
                return Err(e).with_context(|| format!("creating {}", path.join(OWNER).display()));
            }
        };
        Ok(Self {
            path,
            _owner: owner,
        })
    }

    /// Remove the private directories (`<prefix>XXXXXX` in `$TMPDIR`) of processes that are
    /// gone: ours (same owner, mode 0700) with an `owner` file nobody holds locked. Returns
    /// their paths.
    pub fn reclaim(prefix: &str) -> Vec<PathBuf> {
        Self::reclaim_in(&std::env::temp_dir(), prefix)
    }

    pub fn reclaim_in(parent: &Path, prefix: &str) -> Vec<PathBuf> {
        use std::os::unix::fs::MetadataExt as _;
        let Ok(dir) = std::fs::read_dir(parent) else {
            return Vec::new();
        };
        // SAFETY: geteuid has no preconditions.
        let euid = unsafe { libc::geteuid() };
        let mut removed = Vec::new();
        for entry in dir.filter_map(Result::ok) {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if !name.starts_with(prefix) || name.len() != prefix.len() + 6 {
                continue;
            }
            let path = entry.path();
            let ours = std::fs::symlink_metadata(&path)
                .is_ok_and(|m| m.is_dir() && m.uid() == euid && m.mode() & 0o777 == 0o700);
            // Locked: its process is alive. No owner file: not one of ours (or just being made).
            if ours
                && let Ok((_lock, true)) = try_lock(&path.join(OWNER), false)
                && std::fs::remove_dir_all(&path).is_ok()
            {
                removed.push(path);
            }
        }
        removed
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for PrivateDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// The directory a file at `path` goes into.
fn parent_of(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// A new file with a random name next to `path` (mode 0600 until renamed), and its path.
fn temp_beside(path: &Path) -> std::io::Result<(File, PathBuf)> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let template = parent_of(path).join(format!(".{name}.tmpXXXXXX"));
    let mut bytes = CString::new(template.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?
        .into_bytes_with_nul();
    // SAFETY: `bytes` is a writable NUL-terminated template ending in "XXXXXX"; mkstemp
    // rewrites those bytes and returns a new descriptor (O_EXCL, mode 0600) or -1.
    let fd = unsafe { libc::mkostemp(bytes.as_mut_ptr().cast(), libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: mkostemp returned a fresh descriptor that nothing else owns.
    let file = unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    bytes.pop();
    Ok((file, PathBuf::from(OsString::from_vec(bytes))))
}

/// An existing target that is not a regular file (or a symlink): written in place.
fn is_special(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| {
        let t = m.file_type();
        !t.is_file() && !t.is_symlink() && !t.is_dir()
    })
}

/// Fail now, before anything is attached, when a report could not be written to `path` later
/// (`-` is stdout: always fine). Creates and removes a temporary file beside it.
pub fn check_writable(path: &Path) -> Result<()> {
    if path == Path::new("-") || is_special(path) {
        return Ok(());
    }
    if path.is_dir() {
        bail!(
            "{} is a directory: give a file name for the report",
            path.display()
        );
    }
    let dir = parent_of(path);
    if !dir.is_dir() {
        bail!(
            "cannot write {}: the directory {} does not exist",
            path.display(),
            dir.display()
        );
    }
    let (file, tmp) =
        temp_beside(path).with_context(|| format!("cannot write {}", path.display()))?;
    drop(file);
    let _ = std::fs::remove_file(&tmp);
    Ok(())
}

/// Write `bytes` to `path` atomically (`-`: stdout).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    if path == Path::new("-") {
        let mut out = std::io::stdout().lock();
        out.write_all(bytes)
            .and_then(|()| out.flush())
            .context("writing to stdout")?;
        return Ok(());
    }
    if is_special(path) {
        return std::fs::write(path, bytes).with_context(|| format!("writing {}", path.display()));
    }
    let (mut file, tmp) =
        temp_beside(path).with_context(|| format!("cannot write {}", path.display()))?;
    let written = (|| {
        file.write_all(bytes)?;
        // Readable like a file made by a plain write (umask 022).
        file.set_permissions(std::fs::Permissions::from_mode(0o644))?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e).with_context(|| format!("writing {}", path.display()));
    }
    Ok(())
}

/// Write `report` as pretty JSON to `path` (`-` = stdout), atomically (see `output`).
pub fn write_json(path: &Path, report: &impl Serialize) -> Result<()> {
    let text = serde_json::to_string_pretty(report).context("serializing the report")?;
    write_atomic(path, (text + "\n").as_bytes()).context("writing the JSON report")
}

/// [`write_json`] of the report `report` builds, when the command's `--json` named a `path`.
pub fn write_json_if<R: Serialize>(path: Option<&Path>, report: impl FnOnce() -> R) -> Result<()> {
    match path {
        Some(path) => write_json(path, &report()),
        None => Ok(()),
    }
}

/// Prints a report's text: on stdout, or on stderr when `json` is `-` (stdout then carries the
/// JSON document alone).
pub fn print_text(json: Option<&Path>, text: &str) {
    if json == Some(Path::new("-")) {
        eprint!("{text}");
    } else {
        print!("{text}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch() -> PrivateDir {
        PrivateDir::new("rdma-trace-test-").unwrap()
    }

    #[test]
    fn private_dirs_are_0700_unpredictable_and_removed_on_drop() {
        let a = scratch();
        let b = scratch();
        assert_ne!(a.path(), b.path());
        let name = a.path().file_name().unwrap().to_string_lossy().into_owned();
        assert!(
            name.starts_with("rdma-trace-test-") && name.len() == 22,
            "{name}"
        );
        let meta = std::fs::symlink_metadata(a.path()).unwrap();
        assert!(meta.is_dir());
        assert_eq!(meta.permissions().mode() & 0o777, 0o700);
        // A live one is never reclaimed; one whose process is gone (its `owner` file unlocked,
        // as after a SIGKILL) is.
        let live = PrivateDir::new_in(a.path(), "rdma-trace-x-").unwrap();
        let gone = a.path().join("rdma-trace-x-abcdef");
        std::fs::create_dir(&gone).unwrap();
        std::fs::set_permissions(&gone, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::fs::write(gone.join(OWNER), "").unwrap();
        std::fs::write(gone.join("demo.json"), "{}").unwrap();
        let not_ours = a.path().join("rdma-trace-x-ghijkl"); // no owner file
        std::fs::create_dir(&not_ours).unwrap();
        std::fs::set_permissions(&not_ours, std::fs::Permissions::from_mode(0o700)).unwrap();
        let removed = PrivateDir::reclaim_in(a.path(), "rdma-trace-x-");
        assert_eq!(removed, std::slice::from_ref(&gone));
        assert!(!gone.exists());
        assert!(live.path().is_dir() && not_ours.is_dir(), "others stay");
        drop(live);
        std::fs::write(a.path().join("demo.json"), "{}").unwrap();
        let path = a.path().to_path_buf();
        drop(a);
        assert!(!path.exists(), "removed with its contents");
    }

    #[test]
    fn atomic_write_replaces_a_planted_symlink_instead_of_following_it() {
        let d = scratch();
        let victim = d.path().join("victim");
        std::fs::write(&victim, "precious").unwrap();
        let report = d.path().join("report.json");
        std::os::unix::fs::symlink(&victim, &report).unwrap();
        // The path every `--json` report takes.
        write_json(&report, &serde_json::json!({ "ok": 1 })).unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        assert_eq!(
            std::fs::read_to_string(&report).unwrap(),
            "{\n  \"ok\": 1\n}\n"
        );
        assert!(std::fs::symlink_metadata(&report).unwrap().is_file());
        // An existing report is replaced whole, and no temporary file stays behind.
        write_atomic(&report, b"2\n").unwrap();
        assert_eq!(std::fs::read_to_string(&report).unwrap(), "2\n");
        let mut names: Vec<String> = std::fs::read_dir(d.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n != OWNER)
            .collect();
        names.sort();
        assert_eq!(names, ["report.json", "victim"]);
        let mode = std::fs::metadata(&report).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o644);
    }

    #[test]
    fn bad_output_paths_are_refused_up_front_and_leave_nothing() {
        let d = scratch();
        let e = check_writable(&d.path().join("no/such/dir/r.json")).unwrap_err();
        assert!(e.to_string().contains("does not exist"), "{e}");
        let e = check_writable(d.path()).unwrap_err();
        assert!(e.to_string().contains("is a directory"), "{e}");
        check_writable(&d.path().join("r.json")).unwrap();
        check_writable(Path::new("-")).unwrap();
        check_writable(Path::new("/dev/null")).unwrap();
        assert_eq!(
            std::fs::read_dir(d.path()).unwrap().count(),
            1,
            "only `owner`"
        );
        // A directory we may not write to (only meaningful without CAP_DAC_OVERRIDE).
        let ro = d.path().join("ro");
        std::fs::create_dir(&ro).unwrap();
        std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o500)).unwrap();
        let ro_file = ro.join("r.json");
        let can_create = File::create(ro.join("probe")).is_ok();
        assert_eq!(check_writable(&ro_file).is_ok(), can_create);
        // Writing in place to a non-regular file works too.
        write_atomic(Path::new("/dev/null"), b"x").unwrap();
    }
}

//! Booting the guest under QEMU: accelerator choice, console streaming, markers, watchdogs.

use std::{
    collections::VecDeque,
    fs::OpenOptions,
    io::{self, BufRead as _, BufReader, Read as _, Write as _},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc::{self, RecvTimeoutError},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use crate::util::say;

pub const QEMU: &str = "qemu-system-x86_64";

/// Which QEMU boots the guest.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Build {
    /// The host's own (bookworm: 7.2), from `cargo xtask setup`. With a TCG thread per vCPU,
    /// guest kernels died under it while kernel text was patched (docs/testing.md, "Guest
    /// kernel deaths"): it is no longer the test bed's.
    Host,
    /// bookworm-backports' (10.0), downloaded and unpacked into the cache on first use; it
    /// runs from there with its own firmware and the host's libraries. The test bed's.
    #[default]
    Backports,
}

/// A QEMU program and the firmware folders it is given (`-L`).
#[derive(Clone, Debug)]
pub struct Program {
    pub path: PathBuf,
    pub firmware: Vec<PathBuf>,
}

/// The packages of bookworm-backports' QEMU that the guest needs: the emulator, its modules,
/// its option ROMs, and the SeaBIOS it asks for (newer than bookworm's).
const BACKPORTS_DEBS: &[&str] = &[
    "qemu-system-x86",
    "qemu-system-common",
    "qemu-system-data",
    "seabios",
];

impl Build {
    /// Which QEMU this is, for the log.
    pub fn describe(self) -> &'static str {
        match self {
            Build::Host => "the host's (bookworm: 7.2)",
            Build::Backports => "bookworm-backports' (10.0)",
        }
    }

    /// The program of this build, fetched first if it is the backports one.
    pub fn program(self, cache: &Path) -> Result<Program> {
        match self {
            Build::Host => Ok(Program {
                path: PathBuf::from(QEMU),
                firmware: Vec::new(),
            }),
            Build::Backports => {
                let dir = cache.join("qemu-backports");
                let root = dir.join("root");
                let done = dir.join("unpacked");
                if !done.exists() {
                    let debs = dir.join("debs");
                    let _ = std::fs::remove_dir_all(&dir);
                    let apt = super::apt::Apt::private(&cache.join("apt"), "bookworm-backports")?;
                    let names: Vec<String> = BACKPORTS_DEBS
                        .iter()
                        .map(|n| format!("{n}/bookworm-backports"))
                        .collect();
                    let names: Vec<&str> = names.iter().map(String::as_str).collect();
                    apt.download(&debs, &names)?;
                    for deb in std::fs::read_dir(&debs)
                        .with_context(|| format!("reading {}", debs.display()))?
                    {
                        let deb = deb?.path();
                        crate::util::run_cmd(
                            Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&root),
                        )
                        .with_context(|| format!("unpacking {}", deb.display()))?;
                    }
                    std::fs::write(&done, "")?;
                }
                Ok(Program {
                    path: root.join("usr/bin").join(QEMU),
                    firmware: vec![root.join("usr/share/qemu"), root.join("usr/share/seabios")],
                })
            }
        }
    }
}
const BOOTED: &[u8] = b"@@RDMA_VM_BOOTED@@";
const EXIT: &[u8] = b"@@RDMA_VM_EXIT=";
/// How long the guest may take to power off after printing its exit status.
const POWEROFF_GRACE: Duration = Duration::from_secs(10);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Accel {
    Kvm,
    Tcg,
}

impl std::fmt::Display for Accel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Accel::Kvm => "KVM",
            Accel::Tcg => "TCG",
        })
    }
}

impl Accel {
    /// `one_tcg_thread`: every vCPU in one host thread (TCG only).
    fn args(self, one_tcg_thread: bool) -> [&'static str; 4] {
        match self {
            Accel::Kvm => ["-accel", "kvm", "-cpu", "host"],
            Accel::Tcg if one_tcg_thread => ["-accel", "tcg,thread=single", "-cpu", "max"],
            Accel::Tcg => ["-accel", "tcg,thread=multi", "-cpu", "max"],
        }
    }
}

/// KVM only where a stock kernel really boots with it: /dev/kvm writable AND a hardware KVM
/// module (kvm_intel/kvm_amd) loaded; TCG as the fallback (and always as the second try).
pub fn accelerators() -> Vec<Accel> {
    let writable = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .is_ok();
    let module = |m: &str| Path::new("/sys/module").join(m).exists();
    let hardware = module("kvm_intel") || module("kvm_amd");
    if writable && hardware {
        return vec![Accel::Kvm, Accel::Tcg];
    }
    let why = if module("kvm_pvm") {
        "/dev/kvm is kvm_pvm, which boots only PVM guest kernels"
    } else if !Path::new("/dev/kvm").exists() {
        "no /dev/kvm"
    } else if !writable {
        "/dev/kvm is not writable"
    } else {
        "neither kvm_intel nor kvm_amd is loaded"
    };
    say(format!("using TCG ({why})"));
    vec![Accel::Tcg]
}

/// A host folder exported over virtio-9p with a mount tag.
pub struct Share {
    pub tag: &'static str,
    pub path: PathBuf,
    pub readonly: bool,
}

pub struct Boot<'a> {
    /// A bzImage, or a vmlinux ELF with a PVH note.
    pub kernel: &'a Path,
    pub initrd: &'a Path,
    pub mem_mib: u32,
    pub smp: u32,
    pub shares: &'a [Share],
    /// No boot marker within this time: kill (and retry with TCG after KVM).
    pub boot_timeout: Duration,
    /// The whole run ends here.
    pub deadline: Instant,
    /// Connect this terminal to the guest's console: keys in, bytes out unchanged.
    pub interactive: bool,
    /// Under TCG, run every vCPU in one host thread (see `GuestRun::one_tcg_thread`).
    pub one_tcg_thread: bool,
    pub qemu: &'a Program,
}

#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The guest command's exit status.
    Exit(i32),
    /// The overall deadline passed.
    Timeout,
    /// The guest ended (panic, crash) without printing its exit status; what its console said
    /// of it (`panic_digest`).
    NoExitMarker(String),
    /// No boot marker within the boot timeout.
    BootWatchdog,
}

/// Kills QEMU when dropped, whatever path leaves the function.
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
        }
        let _ = self.0.wait();
    }
}

/// Commas in QEMU option values are doubled.
fn qemu_escape(p: &Path) -> String {
    p.display().to_string().replace(',', ",,")
}

fn command(b: &Boot, accel: Accel) -> Command {
    let mut c = Command::new(&b.qemu.path);
    for dir in &b.qemu.firmware {
        c.arg("-L").arg(dir);
    }
    c.args([
        "-nodefaults",
        "-no-user-config",
        "-display",
        "none",
        "-M",
        "pc",
    ])
    .args(accel.args(b.one_tcg_thread))
    .args(["-m", &b.mem_mib.to_string(), "-smp", &b.smp.to_string()])
    .arg("-kernel")
    .arg(b.kernel)
    .arg("-initrd")
    .arg(b.initrd)
    .args([
        "-append",
        // A soft lockup (a CPU that does not schedule for 60 s) panics, and the guest ends
        // without a status at once instead of hanging until the run's timeout. The clock is
        // the TSC, as on the machines rdma-trace is for: under TCG the kernel distrusts it and
        // falls back to the HPET, whose every read is an emulated device access. That made
        // each `bpf_ktime_get_ns` (two per timed call, in rdma-trace and bpftrace alike) and
        // each `clock_gettime` of the loader (a syscall instead of the vDSO) cost most of what
        // `cargo xtask bench` measured. TCG's TSC comes from one host clock for every vCPU.
        "clocksource=tsc tsc=reliable console=ttyS0 quiet loglevel=3 panic=-1 softlockup_panic=1 watchdog_thresh=30 rdinit=/init",
        "-no-reboot",
    ]);
    if b.interactive {
        // QEMU puts the terminal in raw mode; Ctrl-C goes to the guest, not to QEMU.
        c.args([
            "-chardev",
            "stdio,id=console,signal=off",
            "-serial",
            "chardev:console",
        ]);
    } else {
        c.args(["-serial", "stdio"]);
    }
    for (i, s) in b.shares.iter().enumerate() {
        let ro = if s.readonly { ",readonly=on" } else { "" };
        c.arg("-fsdev").arg(format!(
            "local,id=fs{i},path={},security_model=none{ro}",
            qemu_escape(&s.path)
        ));
        c.arg("-device")
            .arg(format!("virtio-9p-pci,fsdev=fs{i},mount_tag={}", s.tag));
    }
    c.stdin(if b.interactive {
        Stdio::inherit()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::inherit());
    c
}

/// Restores the terminal settings of stdin when dropped (QEMU changes them in interactive
/// mode, and a killed QEMU cannot put them back).
struct TermRestore(Option<libc::termios>);

impl TermRestore {
    fn save(interactive: bool) -> Self {
        if !interactive {
            return Self(None);
        }
        // SAFETY: an all-zero termios is a valid value to be overwritten by tcgetattr.
        let mut t: libc::termios = unsafe { std::mem::zeroed() };
        // SAFETY: fd 0 and a valid, writable termios; failure (not a terminal) is checked.
        let ok = unsafe { libc::tcgetattr(0, &mut t) } == 0;
        Self(ok.then_some(t))
    }
}

impl Drop for TermRestore {
    fn drop(&mut self) {
        if let Some(t) = &self.0 {
            // SAFETY: fd 0 and the termios tcgetattr filled in.
            unsafe { libc::tcsetattr(0, libc::TCSANOW, t) };
        }
    }
}

/// Console lines kept for `panic_digest` (an oops with its call trace is 50-100 lines).
const TAIL_LINES: usize = 400;

/// One line that says why a guest died, from its console's last lines: the oops or panic lines
/// the kernel printed (`BUG:`, `Oops`, `RIP:`, `Kernel panic`, ...) without their timestamps,
/// or, when there are none, the last lines it printed.
pub fn panic_digest(tail: &[String]) -> String {
    const SIGNS: &[&str] = &[
        "Kernel panic",
        "BUG:",
        "Oops",
        "general protection",
        "invalid opcode",
        "double fault",
        "watchdog:",
        "RIP:",
        "Comm:",
    ];
    let clean = |l: &str| -> String {
        let l = l.trim();
        // `[  123.456789] text`: the timestamp says nothing here.
        let l = match l.strip_prefix('[').and_then(|r| r.split_once(']')) {
            Some((stamp, rest)) if stamp.trim().parse::<f64>().is_ok() => rest.trim(),
            _ => l,
        };
        l.chars().take(160).collect()
    };
    let last: Vec<String> = tail
        .iter()
        .map(|l| clean(l))
        .filter(|l| !l.is_empty())
        .collect();
    let mut lines: Vec<&String> = Vec::new();
    for l in &last {
        if SIGNS.iter().any(|s| l.contains(s)) && !lines.contains(&l) && lines.len() < 6 {
            lines.push(l);
        }
    }
    if lines.is_empty() {
        let from = last.len().saturating_sub(3);
        return if last.is_empty() {
            "its console printed nothing".to_owned()
        } else {
            format!(
                "no oops on its console; its last lines: {}",
                last[from..].join(" | ")
            )
        };
    }
    lines
        .iter()
        .map(|l| l.as_str())
        .collect::<Vec<_>>()
        .join(" | ")
}

/// How many bytes at the end of `buf` could be the start of a console marker (kept back
/// until the marker completes or turns out to be text).
fn marker_prefix_len(buf: &[u8]) -> usize {
    const START: &[u8] = b"@@RDMA_VM_";
    if let Some(at) = find(buf, START) {
        return buf.len() - at;
    }
    (1..START.len().min(buf.len() + 1))
        .rev()
        .find(|&k| buf.ends_with(&START[..k]))
        .unwrap_or(0)
}

/// Boots once; streams the console (without `\r` and the markers) to stdout.
pub fn boot(b: &Boot, accel: Accel) -> Result<Outcome> {
    let start = Instant::now();
    let mut cmd = command(b, accel);
    let mut child = Guard(cmd.spawn().with_context(|| {
        format!(
            "starting {} (install qemu-system-x86: cargo xtask setup)",
            b.qemu.path.display()
        )
    })?);
    let stdout = child.0.stdout.take().context("qemu stdout")?;
    let (tx, rx) = mpsc::channel::<Vec<u8>>();
    let interactive = b.interactive;
    let _term = TermRestore::save(interactive);
    let reader = thread::spawn(move || {
        let mut r = BufReader::new(stdout);
        loop {
            let mut line = Vec::new();
            // Interactive: whatever arrives, at once (a screen is not made of lines).
            let read = if interactive {
                let mut buf = [0u8; 4096];
                r.read(&mut buf)
                    .inspect(|&n| line.extend_from_slice(&buf[..n]))
            } else {
                r.read_until(b'\n', &mut line)
            };
            match read {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            }
        }
    });

    let boot_deadline = (start + b.boot_timeout).min(b.deadline);
    let mut booted: Option<Duration> = None;
    let mut exit: Option<(i32, Instant)> = None;
    let mut out = io::stdout().lock();
    let mut carry: Vec<u8> = Vec::new();
    // The console's last lines, for the digest of a guest that dies without a status.
    let mut tail: VecDeque<String> = VecDeque::with_capacity(TAIL_LINES);
    let outcome = loop {
        let limit = match (exit, booted) {
            (Some((_, at)), _) => (at + POWEROFF_GRACE).min(b.deadline),
            (None, None) => boot_deadline,
            (None, Some(_)) => b.deadline,
        };
        match rx.recv_timeout(limit.saturating_duration_since(Instant::now())) {
            Ok(chunk) if interactive => {
                if exit.is_some() {
                    continue; // power-off noise
                }
                carry.extend_from_slice(&chunk);
                if let Some(at) = find(&carry, BOOTED) {
                    booted.get_or_insert(start.elapsed());
                    carry.drain(at..at + BOOTED.len());
                }
                if let Some((prefix, status)) = parse_exit(&carry) {
                    out.write_all(prefix)?;
                    out.flush()?;
                    exit = Some((status, Instant::now()));
                    continue;
                }
                let keep = marker_prefix_len(&carry);
                out.write_all(&carry[..carry.len() - keep])?;
                out.flush()?;
                carry.drain(..carry.len() - keep);
            }
            Ok(mut line) => {
                line.retain(|&c| c != b'\r');
                if exit.is_some() {
                    continue; // power-off noise
                }
                if let Some(at) = find(&line, BOOTED) {
                    booted.get_or_insert(start.elapsed());
                    line.drain(at..at + BOOTED.len());
                    if line == b"\n" {
                        continue;
                    }
                }
                if let Some((prefix, status)) = parse_exit(&line) {
                    if !prefix.is_empty() {
                        out.write_all(prefix)?;
                        out.write_all(b"\n")?;
                    }
                    exit = Some((status, Instant::now()));
                    continue;
                }
                out.write_all(&line)?;
                out.flush()?;
                if tail.len() == TAIL_LINES {
                    tail.pop_front();
                }
                tail.push_back(String::from_utf8_lossy(&line).trim_end().to_owned());
            }
            Err(RecvTimeoutError::Timeout) => {
                break match (exit, booted) {
                    (Some((status, _)), _) => Outcome::Exit(status),
                    (None, None) if Instant::now() < b.deadline => Outcome::BootWatchdog,
                    _ => Outcome::Timeout,
                };
            }
            Err(RecvTimeoutError::Disconnected) => {
                let status = child.0.wait().context("waiting for qemu")?;
                if let Some((status, _)) = exit {
                    break Outcome::Exit(status);
                }
                if booted.is_none() && !status.success() {
                    bail!("{QEMU} failed before the guest booted ({status})");
                }
                break Outcome::NoExitMarker(panic_digest(tail.make_contiguous()));
            }
        }
    };
    out.flush()?;
    drop(out);
    drop(child); // kills qemu if it still runs
    let _ = reader.join();
    let boot_s = booted.map_or("-".to_owned(), |d| format!("{:.1} s", d.as_secs_f64()));
    say(format!(
        "qemu ({accel}): boot {boot_s}, total {:.1} s",
        start.elapsed().as_secs_f64()
    ));
    Ok(outcome)
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// `...@@RDMA_VM_EXIT=<n>@@`: the text before the marker and the status.
fn parse_exit(line: &[u8]) -> Option<(&[u8], i32)> {
    let at = find(line, EXIT)?;
    let rest = &line[at + EXIT.len()..];
    let digits = rest.iter().take_while(|c| c.is_ascii_digit()).count();
    if !rest[digits..].starts_with(b"@@") {
        return None;
    }
    let status = std::str::from_utf8(&rest[..digits]).ok()?.parse().ok()?;
    Some((&line[..at], status))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_marker() {
        assert_eq!(parse_exit(b"@@RDMA_VM_EXIT=0@@\n"), Some((&b""[..], 0)));
        assert_eq!(
            parse_exit(b"no newline@@RDMA_VM_EXIT=137@@\n"),
            Some((&b"no newline"[..], 137))
        );
        assert_eq!(parse_exit(b"@@RDMA_VM_EXIT=@@"), None);
        assert_eq!(parse_exit(b"@@RDMA_VM_EXIT=1x@@"), None);
        assert_eq!(parse_exit(b"hello\n"), None);
    }

    #[test]
    fn marker_prefixes_are_held_back() {
        assert_eq!(marker_prefix_len(b"plain text"), 0);
        assert_eq!(marker_prefix_len(b"text @"), 1);
        assert_eq!(marker_prefix_len(b"text @@RDMA"), 6);
        assert_eq!(
            marker_prefix_len(b"text @@RDMA_VM_EXIT=1"),
            "@@RDMA_VM_EXIT=1".len()
        );
        assert_eq!(marker_prefix_len(b"a@b"), 0);
    }

    #[test]
    fn a_panic_digest_names_the_oops_and_its_place() {
        let tail: Vec<String> = [
            "test waterfall::stages_add_up ... ",
            "[  301.123456] BUG: kernel NULL pointer dereference, address: 0000000000000008",
            "[  301.123460] #PF: supervisor read access in kernel mode",
            "[  301.123470] Oops: 0000 [#1] PREEMPT SMP NOPTI",
            "[  301.123480] CPU: 1 PID: 77 Comm: ksoftirqd/1 Not tainted 6.12.95+deb12-amd64 #1",
            "[  301.123490] RIP: 0010:rxe_cq_post+0x12/0x30 [rdma_rxe]",
            "[  301.123500]  ? rxe_completer+0x1/0x30 [rdma_rxe]",
            "[  301.123510] Kernel panic - not syncing: Fatal exception in interrupt",
        ]
        .map(str::to_owned)
        .to_vec();
        let d = panic_digest(&tail);
        assert!(d.starts_with("BUG: kernel NULL pointer dereference"), "{d}");
        assert!(d.contains("RIP: 0010:rxe_cq_post+0x12/0x30"), "{d}");
        assert!(d.contains("Comm: ksoftirqd/1"), "{d}");
        assert!(
            d.ends_with("Kernel panic - not syncing: Fatal exception in interrupt"),
            "{d}"
        );
        assert!(!d.contains("301.12"), "timestamps are dropped: {d}");
        assert!(
            !d.contains("rxe_completer"),
            "the call trace is left out: {d}"
        );
        // Without an oops, the last lines say where it stopped.
        let quiet = ["a", "", "b", "c", "d"].map(str::to_owned);
        assert_eq!(
            panic_digest(&quiet),
            "no oops on its console; its last lines: b | c | d"
        );
        assert_eq!(panic_digest(&[]), "its console printed nothing");
    }

    #[test]
    fn commas_are_escaped() {
        assert_eq!(qemu_escape(Path::new("/a,b")), "/a,,b");
    }
}

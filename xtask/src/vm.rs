//! `cargo xtask vm`: boot a Debian kernel (6.1 or 6.12) with two Soft-RoCE devices in QEMU and run
//! a command in it, with the workspace shared read-only at its host path.
//!
//! Layout: `packages` pins what comes from Debian, `apt` downloads it, `image` builds the cached
//! base initramfs and the per-run overlay (`cpio` writes the archives, `kmod` orders the modules),
//! `qemu` boots and watches the guest, `xtask/guest/init.sh` is the guest's PID 1.

mod apt;
mod cpio;
mod image;
mod kimage;
mod kmod;
mod packages;
mod qemu;

pub use qemu::Build as QemuBuild;

use std::{
    collections::BTreeSet,
    fs::{self, File},
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use crate::util::{cache_dir, root, run_cmd, say, target_dir};

/// Exit status when the overall `--timeout` expired.
pub const EXIT_TIMEOUT: i32 = 124;
/// Exit status when the guest ended without reporting the command's status (panic, crash).
pub const EXIT_NO_STATUS: i32 = 125;
/// Exit status when the guest did not reach its init within the boot watchdog.
pub const EXIT_BOOT_WATCHDOG: i32 = 126;

const EXIT_CODES_HELP: &str = "\
Exit status:
  N    the guest command's exit status
  124  the overall --timeout expired (QEMU killed)
  125  the guest ended without reporting a status (kernel panic, crash)
  126  the boot watchdog fired (no init within --boot-timeout, also after a TCG retry)
  1    xtask itself failed (download, image build, QEMU start)

The guest: two Soft-RoCE devices, rxe0 on veth va (10.9.0.1) and rxe1 on vb (10.9.0.2); policy
routing sends RoCE between them through the veth (NET_RX). RXE_GID_INDEX holds the index of the
RoCE v2 IPv4 GID. The workspace is mounted read-only at its host path (the command starts there),
<target>/vm-results read-write at its host path (RESULTS_DIR). PATH starts with
<target>/<profile>. One CMD argument is a shell script; several are quoted and joined. Downloads
and images are cached in <workspace>/.cache/vm.";

#[derive(clap::Args)]
#[command(after_help = EXIT_CODES_HELP)]
pub struct Args {
    /// Guest kernel (Debian bookworm 6.1, or 6.12 from bookworm-backports).
    #[arg(long, value_enum, default_value = "6.1")]
    kernel: Kernel,
    /// Kill the guest this many seconds after QEMU starts (exit status 124).
    #[arg(long, default_value_t = 600, value_name = "SECS")]
    timeout: u64,
    /// Kill the guest when its init has not started after this many seconds (exit status 126).
    #[arg(long, default_value_t = 60, value_name = "SECS")]
    boot_timeout: u64,
    /// Guest memory in MiB.
    #[arg(long, default_value_t = 2048, value_name = "MIB")]
    mem: u32,
    /// Build and use the release profile.
    #[arg(long)]
    release: bool,
    /// Do not run `cargo build` first.
    #[arg(long)]
    no_build: bool,
    /// Boot the bench image (the test bed plus bpftrace and bpftool; give it --mem 3072).
    #[arg(long)]
    bench_image: bool,
    /// Give the command this terminal (keys in, screen out), e.g. for the live view. Needs
    /// stdin and stdout to be terminals.
    #[arg(short = 't', long)]
    interactive: bool,
    /// Under TCG, run both vCPUs in one host thread: slower, but kernel text patched while
    /// another vCPU runs it is seen at once (see `cargo xtask test`'s --enforce boot).
    #[arg(long)]
    one_tcg_thread: bool,
    /// Which QEMU: bookworm-backports' (10.0, fetched into the cache on first use; the test
    /// bed's) or the host's (7.2 on bookworm).
    #[arg(long, value_enum, default_value_t)]
    qemu: qemu::Build,
    /// The command to run in the guest (after `--`).
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        required = true,
        value_name = "CMD"
    )]
    cmd: Vec<String>,
}

/// The guest kernels.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Kernel {
    /// Debian bullseye 5.10 (smoke suite only: rxe on tasklets, no module BTF).
    #[value(name = "5.10")]
    V5_10,
    /// Debian bookworm 6.1.
    #[default]
    #[value(name = "6.1")]
    V6_1,
    /// Debian 6.12 (bookworm-backports).
    #[value(name = "6.12")]
    V6_12,
    /// The newest 7.x Debian serves (trixie-backports; smoke suite only).
    #[value(name = "7.x")]
    V7,
}

impl Kernel {
    pub fn name(self) -> &'static str {
        match self {
            Kernel::V5_10 => "5.10",
            Kernel::V6_1 => "6.1",
            Kernel::V6_12 => "6.12",
            Kernel::V7 => "7.x",
        }
    }
}

/// One guest run. Build with `GuestRun { kernel, cmd, ..Default::default() }`.
#[derive(Clone, Debug)]
pub struct GuestRun {
    pub kernel: Kernel,
    /// The guest is killed this long after QEMU starts (exit status 124); downloads and image
    /// builds do not count.
    pub timeout: Duration,
    /// One element: a shell script; several: a command and its arguments.
    pub cmd: Vec<String>,
    /// "debug" or "release": `<target>/<profile>` leads the guest's PATH.
    pub profile: String,
    /// No init after this: kill (exit status 126).
    pub boot_timeout: Duration,
    /// The guest command gets this terminal: keys go in, bytes come out unchanged (for the
    /// live view). Only when stdin and stdout are terminals.
    pub interactive: bool,
    pub mem_mib: u32,
    /// Use the bench image: the test bed plus bpftrace and bpftool (`packages::BENCH_EXTRA`),
    /// cached separately. Give it 3 GiB of memory.
    pub bench: bool,
    /// Under TCG, run every vCPU in one host thread (`-accel tcg,thread=single`). With one
    /// thread per vCPU (the default, twice as fast on 2 cores), kernel text that one vCPU
    /// patches while another runs it (kprobes detached under traffic) has crashed the guest
    /// kernel; with one thread the other vCPU sees the new text at once.
    pub one_tcg_thread: bool,
    pub qemu: qemu::Build,
}

impl Default for GuestRun {
    fn default() -> Self {
        GuestRun {
            kernel: Kernel::V6_1,
            timeout: Duration::from_secs(600),
            cmd: vec!["true".into()],
            profile: "debug".into(),
            boot_timeout: Duration::from_secs(60),
            mem_mib: 2048,
            bench: false,
            interactive: false,
            one_tcg_thread: false,
            qemu: qemu::Build::default(),
        }
    }
}

/// `cargo xtask vm`: build (unless `--no-build`), then run the command in the guest.
pub fn run(args: &Args) -> Result<i32> {
    if !args.no_build {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut c = Command::new(cargo);
        c.arg("build").current_dir(root());
        if args.release {
            c.arg("--release");
        }
        run_cmd(&mut c)?;
    }
    run_in_guest(&GuestRun {
        kernel: args.kernel,
        timeout: Duration::from_secs(args.timeout),
        cmd: args.cmd.clone(),
        profile: if args.release { "release" } else { "debug" }.into(),
        boot_timeout: Duration::from_secs(args.boot_timeout),
        mem_mib: args.mem,
        bench: args.bench_image,
        interactive: args.interactive,
        one_tcg_thread: args.one_tcg_thread,
        qemu: args.qemu,
    })
}

/// Both stdin and stdout are terminals (an interactive guest makes sense).
pub fn on_terminal() -> bool {
    use std::io::IsTerminal as _;
    std::io::stdin().is_terminal() && std::io::stdout().is_terminal()
}

/// How a guest run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestEnd {
    /// The guest command's exit status, or 124 / 125 / 126 (see `EXIT_CODES_HELP`).
    pub code: i32,
    /// When the guest ended without a status (125): what its console said of it, in one line.
    pub panic: Option<String>,
}

/// Prepares the cached images if needed, boots the guest, runs `r.cmd`, and returns its exit
/// status (or 124 / 125 / 126, see `EXIT_CODES_HELP`). Builds nothing.
pub fn run_in_guest(r: &GuestRun) -> Result<i32> {
    run_in_guest_to_end(r).map(|end| end.code)
}

/// `run_in_guest`, with what the console said when the guest died without a status.
pub fn run_in_guest_to_end(r: &GuestRun) -> Result<GuestEnd> {
    let started = Instant::now();
    if r.cmd.is_empty() {
        bail!("no guest command given");
    }
    // The build ensures only its toolchain: a guest run needs the test bed too.
    crate::setup::ensure()?;
    if r.interactive && !on_terminal() {
        bail!(
            "an interactive guest needs stdin and stdout to be a terminal; drop -t/--interactive"
        );
    }
    let base = {
        let _lock = CacheLock::acquire(&image::vm_cache())?;
        image::prepare(r.kernel, r.bench)?
    };

    let root = root();
    let target = target_dir();
    let profile_dir = target.join(&r.profile);
    let results = target.join("vm-results");
    fs::create_dir_all(&results).with_context(|| format!("creating {}", results.display()))?;

    // Libraries that host-built binaries need and the image lacks.
    let extra_libs = extra_libs(&profile_dir, &r.cmd, &base.libs)?;

    let target_share = !target.starts_with(&root);
    let env_sh = guest_env(
        &root,
        &profile_dir,
        &results,
        target_share.then_some(target.as_path()),
    );
    let env_sh = if r.interactive {
        env_sh + "export VM_INTERACTIVE=1\n"
    } else {
        env_sh
    };
    let script = format!("{}\n", command_script(&r.cmd));

    let run_dir = TempDir::new(&image::vm_cache().join("runs"))?;
    let initrd = run_dir.0.join("initrd");
    image::write_run_initrd(&base, &initrd, &script, &env_sh, &extra_libs)?;

    let mut shares = vec![qemu::Share {
        tag: "workspace",
        path: root.clone(),
        readonly: true,
    }];
    if target_share {
        shares.push(qemu::Share {
            tag: "target",
            path: target.clone(),
            readonly: true,
        });
    }
    shares.push(qemu::Share {
        tag: "results",
        path: results,
        readonly: false,
    });
    // The timeout covers the guest run, not the (one-time) download and image build.
    let deadline = Instant::now() + r.timeout;
    let program = r.qemu.program(&cache_dir().join("vm"))?;
    say(format!("QEMU: {}", r.qemu.describe()));
    let boot = qemu::Boot {
        kernel: &base.kernel,
        initrd: &initrd,
        mem_mib: r.mem_mib,
        smp: 2,
        shares: &shares,
        boot_timeout: r.boot_timeout,
        deadline,
        interactive: r.interactive,
        one_tcg_thread: r.one_tcg_thread,
        qemu: &program,
    };
    say(format!(
        "booting {} ({}), prepared in {:.1} s",
        r.kernel.name(),
        base.kver.trim(),
        started.elapsed().as_secs_f64()
    ));
    let mut outcome = qemu::Outcome::BootWatchdog;
    for accel in qemu::accelerators() {
        outcome = qemu::boot(&boot, accel)?;
        if outcome != qemu::Outcome::BootWatchdog {
            break;
        }
        say(format!(
            "boot watchdog: no init within {} s with {accel}",
            r.boot_timeout.as_secs()
        ));
    }
    let mut panic = None;
    let code = match outcome {
        qemu::Outcome::Exit(status) => {
            if status != 0 {
                say(format!("guest command exited with status {status}"));
            }
            status
        }
        qemu::Outcome::Timeout => {
            say(format!(
                "timeout: killed the guest after {} s",
                r.timeout.as_secs()
            ));
            EXIT_TIMEOUT
        }
        qemu::Outcome::NoExitMarker(digest) => {
            say(format!(
                "the guest ended without reporting an exit status (panic or crash): {digest}"
            ));
            panic = Some(digest);
            EXIT_NO_STATUS
        }
        qemu::Outcome::BootWatchdog => EXIT_BOOT_WATCHDOG,
    };
    Ok(GuestEnd { code, panic })
}

/// Shell-quotes one word for bash (single quotes unless it is plainly safe).
pub fn shell_quote(s: &str) -> String {
    let safe = |c: char| c.is_ascii_alphanumeric() || "_@%+=:,./-".contains(c);
    if !s.is_empty() && s.chars().all(safe) {
        s.to_owned()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// The guest script: one argument is a shell script itself; several are a quoted command line.
pub fn command_script(cmd: &[String]) -> String {
    match cmd {
        [script] => script.clone(),
        words => words
            .iter()
            .map(|w| shell_quote(w))
            .collect::<Vec<_>>()
            .join(" "),
    }
}

/// Host variables passed to the guest command.
fn passes_through(name: &str) -> bool {
    matches!(
        name,
        "TERM" | "COLUMNS" | "LINES" | "RUST_BACKTRACE" | "RUST_LIB_BACKTRACE"
    ) || name.starts_with("RUST_LOG")
        || name.starts_with("RDMA_TRACE_")
}

/// `/vm/env.sh`: sourced by the init before it runs the command.
fn guest_env(root: &Path, profile_dir: &Path, results: &Path, target: Option<&Path>) -> String {
    let mut vars: Vec<(String, String)> = std::env::vars()
        .filter(|(k, _)| passes_through(k))
        .collect();
    let path = format!(
        "{}:/usr/sbin:/usr/bin:/sbin:/bin:/usr/local/busybox",
        profile_dir.display()
    );
    vars.extend([
        ("PATH".into(), path),
        (
            "LD_LIBRARY_PATH".into(),
            format!("/{}", image::EXTRA_LIB_DIR),
        ),
        ("HOME".into(), "/root".into()),
        ("RESULTS_DIR".into(), results.display().to_string()),
        ("RDMA_VM".into(), "1".into()),
        ("VM_WORKSPACE".into(), root.display().to_string()),
        (
            "VM_TARGET".into(),
            target.map(|t| t.display().to_string()).unwrap_or_default(),
        ),
    ]);
    vars.iter()
        .map(|(k, v)| format!("export {k}={}\n", shell_quote(v)))
        .collect()
}

/// Host libraries that the ELF files in `<target>/<profile>/` (top level) and the ELF paths in
/// the command need and the image lacks (by file name).
fn extra_libs(
    profile_dir: &Path,
    cmd: &[String],
    have: &std::collections::HashSet<String>,
) -> Result<Vec<PathBuf>> {
    let mut elfs = BTreeSet::new();
    if let Ok(rd) = fs::read_dir(profile_dir) {
        for e in rd.flatten() {
            let p = e.path();
            let executable = e
                .metadata()
                .is_ok_and(|m| m.is_file() && m.mode() & 0o111 != 0);
            if executable && image::is_elf(&p) {
                elfs.insert(p);
            }
        }
    }
    let cwd = std::env::current_dir().unwrap_or_else(|_| root());
    for word in cmd.iter().flat_map(|a| a.split_whitespace()) {
        let word = word.trim_matches(|c| "'\";&|()<>".contains(c));
        if !word.contains('/') {
            continue;
        }
        for p in [root().join(word), cwd.join(word)] {
            if p.is_file() && image::is_elf(&p) {
                elfs.insert(p);
                break;
            }
        }
    }
    let mut libs: Vec<PathBuf> = Vec::new();
    let mut names = BTreeSet::new();
    for elf in &elfs {
        for lib in image::ldd(elf, None)? {
            let Some(name) = lib.file_name().map(|n| n.to_string_lossy().into_owned()) else {
                continue;
            };
            if !have.contains(&name) && names.insert(name.clone()) {
                say(format!("  extra guest lib {name} (for {})", elf.display()));
                libs.push(lib);
            }
        }
    }
    Ok(libs)
}

/// An exclusive lock (flock) on `<cache>/lock`, held while the cache is prepared.
struct CacheLock {
    _file: File,
}

impl CacheLock {
    fn acquire(dir: &Path) -> Result<Self> {
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let path = dir.join("lock");
        let f = File::create(&path).with_context(|| format!("opening {}", path.display()))?;
        // std's File::lock is flock(2) on Linux; released when the file is closed.
        match f.try_lock() {
            Ok(()) => {}
            Err(fs::TryLockError::WouldBlock) => {
                say("waiting for another xtask preparing the VM cache");
                f.lock()
                    .with_context(|| format!("locking {}", path.display()))?;
            }
            Err(fs::TryLockError::Error(e)) => {
                return Err(e).with_context(|| format!("locking {}", path.display()));
            }
        }
        Ok(CacheLock { _file: f })
    }
}

/// A folder removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    /// A new `run-<pid>-<nanos>` folder in `parent`; first removes those of processes that are
    /// gone (killed before they could clean up).
    fn new(parent: &Path) -> Result<Self> {
        if let Ok(rd) = fs::read_dir(parent) {
            for e in rd.flatten() {
                let name = e.file_name();
                let pid = name
                    .to_str()
                    .and_then(|n| n.strip_prefix("run-"))
                    .and_then(|n| n.split('-').next());
                if let Some(pid) = pid
                    && !Path::new("/proc").join(pid).exists()
                {
                    let _ = fs::remove_dir_all(e.path());
                }
            }
        }
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let dir = parent.join(format!("run-{}-{nanos}", std::process::id()));
        fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(TempDir(dir))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting() {
        assert_eq!(shell_quote("uname"), "uname");
        assert_eq!(shell_quote("-r"), "-r");
        assert_eq!(shell_quote("/a/b.c:d,e=f@g%h+i"), "/a/b.c:d,e=f@g%h+i");
        assert_eq!(shell_quote(""), "''");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote("$HOME;*"), "'$HOME;*'");
    }

    #[test]
    fn one_argument_is_a_script_several_are_quoted() {
        assert_eq!(
            command_script(&["ibv_devinfo; ls".into()]),
            "ibv_devinfo; ls"
        );
        assert_eq!(command_script(&["uname".into(), "-r".into()]), "uname -r");
        assert_eq!(
            command_script(&["sh".into(), "-c".into(), "echo $1".into(), "x y".into()]),
            "sh -c 'echo $1' 'x y'"
        );
    }

    #[test]
    fn environment_filter() {
        for yes in [
            "TERM",
            "COLUMNS",
            "LINES",
            "RUST_LOG",
            "RUST_LOG_STYLE",
            "RUST_BACKTRACE",
            "RDMA_TRACE_X",
        ] {
            assert!(passes_through(yes), "{yes}");
        }
        for no in ["PATH", "HOME", "RDMA_TRACEX", "CARGO", "LD_LIBRARY_PATH"] {
            assert!(!passes_through(no), "{no}");
        }
    }
}

//! `rdma-trace verify`: prove that a demo's data phase moves no data through sockets.
//!
//! The demo runs as a child whose syscalls eBPF counts from the `sys_enter`/`sys_exit` raw
//! tracepoints, by phase (the demo thread's own markers: it renames itself `rdma-demo:data`
//! and `rdma-demo:done`), by descriptor class (socket, RDMA device file, other) and by syscall.
//! How sockets are recognised is explained in `rdma-trace-ebpf/src/syscalls.rs`.
//!
//! The child starts as a shell that waits for a line on its stdin; once its pid is in the eBPF
//! filter it execs the demo (same pid), so even the demo's first syscall is counted.

use std::{collections::BTreeMap, io::Write as _, path::PathBuf, process::Stdio};

use anyhow::{Context as _, Result, anyhow, bail};
use aya::{
    Ebpf,
    maps::{HashMap as BpfHashMap, MapData, PerCpuHashMap},
    programs::RawTracePoint,
};
use rdma_trace_common::syscalls::{
    CLASS_NONE, CLASS_RDMA, CLASS_SOCKET, KIND_CLOSE, KIND_DUP, KIND_FCNTL, KIND_FD, KIND_NEW_SOCK,
    KIND_OPEN, KIND_OPENAT, KIND_SOCK, KIND_SOCKETPAIR, MAX_SYSCALLS, NR_PHASES, PHASE_DATA,
    split_syscall_key,
};
use serde::Serialize;

use crate::{
    bpf::loader::load_object,
    error::chain,
    error::{DemoFailed, Unsupported},
    kernel::facts::Kernel,
    model::window::{Window, wait_window},
    output::write_json,
};

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Busy polling of the CQ.
    Poll,
    /// Completion channel: sleep until a completion event arrives.
    Event,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Demo {
    /// SEND/RECV ping-pong.
    Pingpong,
    /// One-sided RDMA WRITE and READ.
    WriteRead,
    /// Remote atomics (Fetch-and-Add, Compare-and-Swap).
    Atomic,
}

impl Demo {
    fn arg(self) -> &'static str {
        match self {
            Demo::Pingpong => "pingpong",
            Demo::WriteRead => "write-read",
            Demo::Atomic => "atomic",
        }
    }
}

#[derive(clap::Args, Debug)]
#[command(
    after_help = "Exit codes: 0 the data phase used no socket; 10 it did (the calls are \
                        named); 11 the demo failed (its own status and message are printed, no \
                        verdict); 1 failure; 2 bad usage; 3 no RDMA device, not root, or no eBPF; \
                        130, 143, 129 stopped by SIGINT, SIGTERM, SIGHUP (the table of both \
                        binaries: rdma-trace --help).\n\n\
                        Examples:\n  sudo rdma-trace verify\n  \
                        sudo rdma-trace verify --demo write-read --mode event -s 65536\n  \
                        sudo rdma-trace verify --demo atomic -- --clients 4\n  \
                        sudo rdma-trace verify --json verify.json -d mlx5_0"
)]
pub struct Args {
    /// Completion mode of the demo.
    #[arg(long, value_enum, default_value = "poll")]
    pub mode: Mode,
    /// Which demo to run (`rdma-demo <demo> --loopback`).
    #[arg(long, value_enum, default_value = "pingpong")]
    pub demo: Demo,
    /// Iterations (perftest's -n) [default: the demo's].
    #[arg(short = 'n', long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=i64::from(rdma_demo::limits::MAX_ITERATIONS)))]
    pub iterations: Option<u32>,
    /// Message or buffer size in bytes (pingpong, write-read; perftest's -s) [default: the
    /// demo's].
    #[arg(short = 's', long, value_name = "BYTES", value_parser = clap::value_parser!(u32).range(i64::from(rdma_demo::limits::MIN_SIZE)..=i64::from(rdma_demo::limits::MAX_SIZE)))]
    pub size: Option<u32>,
    /// RDMA device of the client [default: rxe1 when rxe0 and rxe1 exist, else the first].
    #[arg(short, long, value_name = "DEV")]
    pub device: Option<String>,
    /// RDMA device of the server [default: rxe0 when rxe0 and rxe1 exist, else --device].
    #[arg(long, value_name = "DEV")]
    pub server_device: Option<String>,
    /// Write the counts and the verdict as JSON to this file (`-`: stdout).
    #[arg(long, value_name = "PATH")]
    pub json: Option<PathBuf>,
    /// The rdma-demo binary [default: next to rdma-trace, else on PATH].
    #[arg(long, value_name = "PATH")]
    pub demo_binary: Option<PathBuf>,
    /// More rdma-demo flags, after `--` (e.g. `-- --clients 4 --mtu 1024`).
    #[arg(last = true, value_name = "DEMO FLAGS")]
    pub demo_args: Vec<String>,
}

/// The data phase touched a socket (exit code 10).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct SocketInDataPhase(pub String);

pub const PHASE_NAMES: [&str; NR_PHASES as usize] = ["setup", "data", "teardown"];

/// Calls of one syscall on one class of descriptor in one phase.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Calls {
    pub syscall: String,
    pub calls: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PhaseCounts {
    pub phase: &'static str,
    pub socket: Vec<Calls>,
    pub rdma: Vec<Calls>,
    pub other: Vec<Calls>,
}

impl PhaseCounts {
    pub fn socket_calls(&self) -> u64 {
        self.socket.iter().map(|c| c.calls).sum()
    }
    pub fn rdma_calls(&self) -> u64 {
        self.rdma.iter().map(|c| c.calls).sum()
    }
    pub fn other_calls(&self) -> u64 {
        self.other.iter().map(|c| c.calls).sum()
    }
}

#[derive(Serialize)]
struct Report<'a> {
    demo: Demo,
    mode: Mode,
    command: Vec<String>,
    window: Window,
    phases: &'a [PhaseCounts],
    verdict: String,
    data_phase_clean: bool,
}

pub async fn run(args: &Args) -> Result<Option<i32>> {
    if let Some(path) = &args.json {
        crate::output::check_writable(path)?;
    }
    let table = SyscallTable::native()?;
    let demo = crate::load::demo::binary(args.demo_binary.as_deref())?;
    let demo_args = demo_args(args, &Kernel::live())?;
    let mut tracer = Tracer::load(&table)?;
    crate::signals::check()?;

    // The child is held before the demo starts: a shell waits for one line on stdin, then
    // execs the demo (same pid) with stdin from /dev/null. The pid is registered meanwhile.
    let (read_end, mut write_end) = std::io::pipe().context("creating a pipe")?;
    let mut cmd = tokio::process::Command::new("/bin/sh");
    cmd.arg("-c")
        .arg(r#"read -r _ || exit 125; exec "$0" "$@" </dev/null"#)
        .arg(&demo)
        .args(&demo_args)
        .stdin(Stdio::from(read_end))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    // A SIGKILL of rdma-trace ends the demo too (the setting survives the exec).
    crate::signals::die_with_parent(&mut cmd, libc::SIGKILL);
    let mut child = cmd
        .spawn()
        .with_context(|| format!("could not start /bin/sh to run {}", demo.display()))?;
    let pid = child
        .id()
        .context("the demo exited before it was registered")?;
    tracer.follow(pid)?;
    write_end.write_all(b"go\n").context("releasing the demo")?;
    drop(write_end);
    eprintln!(
        "rdma-trace: counting the syscalls of {} {} (pid {pid})",
        demo.display(),
        demo_args.join(" ")
    );

    let output = crate::load::demo::Output::capture(&mut child)?;
    let window = wait_window(None, Some(&mut child)).await?;
    let (stdout, stderr) = output.finish().await;
    let counts = tracer.read()?;
    drop(tracer); // detach before printing
    let phases = classify(&counts, &table);

    if window.interrupted() {
        let s = crate::signals::received().unwrap_or(crate::signals::Stop(libc::SIGINT));
        return Err(crate::signals::Stopped(s)).context("the demo had not finished: no verdict");
    }
    if window.command_status != Some(0) {
        // The demo's status is its own (rdma-demo's codes): reported, not passed through, so it
        // is never read as a verdict.
        return Err(anyhow!(DemoFailed(format!(
            "rdma-demo failed with status {} ({}), so there is no verdict: {}",
            window
                .command_status
                .map_or("none".into(), |s| s.to_string()),
            crate::load::demo::status_meaning(window.command_status),
            stderr.trim()
        ))));
    }
    crate::output::print_text(
        args.json.as_deref(),
        &format!(
            "--- rdma-demo ---\n{}\n\n{}",
            stdout.trim_end(),
            render(&phases)
        ),
    );
    let data = &phases[PHASE_DATA as usize];
    if data.socket_calls() + data.rdma_calls() + data.other_calls() == 0 {
        bail!(
            "rdma-demo never entered its data phase (no thread named itself rdma-demo:data): \
             is {} older than rdma-trace? Rebuild both (cargo build)",
            demo.display()
        );
    }
    let verdict = verdict(data);
    crate::output::print_text(args.json.as_deref(), &format!("{verdict}\n"));
    if let Some(path) = &args.json {
        let mut command = vec![demo.display().to_string()];
        command.extend(demo_args.iter().cloned());
        let report = Report {
            demo: args.demo,
            mode: args.mode,
            command,
            window,
            phases: &phases,
            verdict: verdict.clone(),
            data_phase_clean: data.socket_calls() == 0,
        };
        write_json(path, &report)?;
    }
    if data.socket_calls() != 0 {
        return Err(anyhow!(SocketInDataPhase(verdict)));
    }
    Ok(None)
}

/// The rdma-demo command line.
fn demo_args(args: &Args, kernel: &Kernel) -> Result<Vec<String>> {
    let names: Vec<String> = kernel.rdma_devices().into_iter().map(|d| d.name).collect();
    if names.is_empty() {
        return Err(anyhow!(Unsupported(
            "no RDMA device on this machine (/sys/class/infiniband is empty): create a Soft-RoCE \
             device (rdma link add rxe0 type rxe netdev <ifname>), or use the guest: cargo xtask vm -- rdma-trace verify"
                .to_owned()
        )));
    }
    let pair = names.iter().any(|n| n == "rxe0") && names.iter().any(|n| n == "rxe1");
    let mut v: Vec<String> = vec![
        args.demo.arg().into(),
        "--loopback".into(),
        "--port".into(),
        "0".into(),
    ];
    let mut push = |a: &str, b: String| {
        v.push(a.into());
        v.push(b);
    };
    match (&args.device, &args.server_device) {
        (None, None) if pair => {
            push("-d", "rxe1".into());
            push("--server-device", "rxe0".into());
        }
        (d, s) => {
            if let Some(d) = d {
                push("-d", d.clone());
            }
            if let Some(s) = s {
                push("--server-device", s.clone());
            }
        }
    }
    let mode = match args.mode {
        Mode::Poll => "poll",
        Mode::Event => "event",
    };
    push("--mode", mode.into());
    if let Some(i) = args.iterations {
        push("--iterations", i.to_string());
    }
    if let Some(s) = args.size {
        if args.demo == Demo::Atomic {
            bail!("--size does not apply to the atomic demo (its operands are 8 bytes)");
        }
        push("--size", s.to_string());
    }
    v.extend(args.demo_args.iter().cloned());
    Ok(v)
}

/// The syscall programs, attached while this lives.
struct Tracer {
    ebpf: Ebpf,
}

impl Tracer {
    fn load(table: &SyscallTable) -> Result<Self> {
        let dupfd = [libc::F_DUPFD as u64, libc::F_DUPFD_CLOEXEC as u64];
        let mut ebpf = load_object("the eBPF object", |l| {
            l.override_global("SYSCALL_KIND", &table.kinds, true)
                .override_global("SYSCALL_ARG_OFFSETS", &table.arg_offsets, true)
                .override_global("SYSCALL_IOCTL", &table.ioctl, true)
                .override_global("FCNTL_DUPFD", &dupfd, true)
        })?;
        for (prog, tp) in [
            ("verify_sys_enter", "sys_enter"),
            ("verify_sys_exit", "sys_exit"),
        ] {
            let p: &mut RawTracePoint = ebpf
                .program_mut(prog)
                .with_context(|| format!("program {prog} is not in the eBPF object"))?
                .try_into()
                .map_err(|e: aya::programs::ProgramError| anyhow!("{prog}: {}", chain(&e)))?;
            p.load()
                .map_err(|e| permission(&e, &format!("loading {prog}")))?;
            p.attach(tp)
                .map_err(|e| permission(&e, &format!("attaching {prog} to raw tracepoint {tp}")))?;
        }
        Ok(Self { ebpf })
    }

    /// Count `pid`'s syscalls from now on; sockets it inherited are known from the start.
    fn follow(&mut self, pid: u32) -> Result<()> {
        {
            let mut tgids: BpfHashMap<&mut MapData, u32, u8> = BpfHashMap::try_from(
                self.ebpf
                    .map_mut("VERIFY_TGIDS")
                    .context("map VERIFY_TGIDS")?,
            )?;
            tgids
                .insert(pid, 1, 0)
                .map_err(|e| anyhow!("registering pid {pid}: {}", chain(&e)))?;
        }
        let mut fds: BpfHashMap<&mut MapData, u64, u32> =
            BpfHashMap::try_from(self.ebpf.map_mut("VERIFY_FDS").context("map VERIFY_FDS")?)?;
        for fd in inherited_sockets(pid) {
            fds.insert((u64::from(pid) << 32) | u64::from(fd), CLASS_SOCKET, 0)
                .map_err(|e| anyhow!("seeding fd {fd}: {}", chain(&e)))?;
        }
        Ok(())
    }

    /// Calls by (phase, class, syscall number), summed over CPUs.
    fn read(&self) -> Result<BTreeMap<(u32, u32, u32), u64>> {
        let map: PerCpuHashMap<&MapData, u64, u64> =
            PerCpuHashMap::try_from(self.ebpf.map("SYSCALLS").context("map SYSCALLS")?)?;
        let mut out = BTreeMap::new();
        for entry in map.iter() {
            let (key, values) = entry.map_err(|e| anyhow!("reading SYSCALLS: {}", chain(&e)))?;
            *out.entry(split_syscall_key(key)).or_default() += values.iter().sum::<u64>();
        }
        Ok(out)
    }
}

/// `e` as the error of `what`: [`Unsupported`] (with the advice to run as root) when the
/// kernel refused for want of privileges (EPERM or EACCES in the error's sources).
fn permission(e: &(dyn std::error::Error + 'static), what: &str) -> anyhow::Error {
    let text = chain(e);
    if crate::bpf::loader::is_permission_error(e) {
        anyhow!(Unsupported(format!(
            "{what}: {text}: run as root (CAP_BPF and CAP_PERFMON)"
        )))
    } else {
        anyhow!("{what}: {text}")
    }
}

/// Sockets `pid` holds that survive exec (no FD_CLOEXEC), from /proc.
fn inherited_sockets(pid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return Vec::new();
    };
    dir.filter_map(Result::ok)
        .filter_map(|e| {
            let fd: u32 = e.file_name().to_str()?.parse().ok()?;
            let target = std::fs::read_link(e.path()).ok()?;
            if !target.to_string_lossy().starts_with("socket:") {
                return None;
            }
            let info = std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{fd}")).ok()?;
            let flags = info
                .lines()
                .find_map(|l| l.strip_prefix("flags:"))
                .and_then(|f| u64::from_str_radix(f.trim(), 8).ok())?;
            (flags & libc::O_CLOEXEC as u64 == 0).then_some(fd)
        })
        .collect()
}

/// The syscall numbers of this architecture, what they mean for the counting, and their names.
pub struct SyscallTable {
    kinds: [u8; MAX_SYSCALLS as usize],
    arg_offsets: [u32; 6],
    ioctl: u32,
    names: BTreeMap<u32, &'static str>,
}

macro_rules! syscalls {
    ($($name:ident => $kind:expr),* $(,)?) => {
        &[$((libc::$name as u32, strip_sys(stringify!($name)), $kind)),*]
    };
}

const fn strip_sys(s: &'static str) -> &'static str {
    // "SYS_sendto" -> "sendto"
    let (_, rest) = s.as_bytes().split_at(4);
    match std::str::from_utf8(rest) {
        Ok(r) => r,
        Err(_) => s,
    }
}

const NONE: u8 = rdma_trace_common::syscalls::KIND_OTHER;

/// (number, name, kind) of the syscalls both x86_64 and arm64 have.
const COMMON: &[(u32, &str, u8)] = syscalls![
    SYS_read => KIND_FD, SYS_write => KIND_FD, SYS_readv => KIND_FD, SYS_writev => KIND_FD,
    SYS_pread64 => KIND_FD, SYS_pwrite64 => KIND_FD, SYS_sendfile => KIND_FD,
    SYS_splice => KIND_FD, SYS_ioctl => KIND_FD, SYS_fstat => KIND_FD, SYS_lseek => KIND_FD,
    SYS_mmap => NONE, SYS_munmap => NONE, SYS_mprotect => NONE, SYS_madvise => NONE,
    SYS_brk => NONE, SYS_futex => NONE, SYS_ppoll => NONE, SYS_pselect6 => NONE,
    SYS_epoll_pwait => NONE, SYS_clock_nanosleep => NONE, SYS_nanosleep => NONE,
    SYS_sched_yield => NONE, SYS_getrandom => NONE, SYS_clone => NONE, SYS_clone3 => NONE,
    SYS_exit => NONE, SYS_exit_group => NONE, SYS_rt_sigaction => NONE,
    SYS_rt_sigprocmask => NONE, SYS_sigaltstack => NONE, SYS_set_robust_list => NONE,
    SYS_rseq => NONE, SYS_prlimit64 => NONE, SYS_getpid => NONE, SYS_gettid => NONE,
    SYS_prctl => NONE, SYS_statx => NONE, SYS_newfstatat => NONE, SYS_execve => NONE,
    SYS_readlinkat => NONE, SYS_getdents64 => NONE, SYS_faccessat => NONE,
    SYS_sched_getaffinity => NONE, SYS_mremap => NONE, SYS_set_tid_address => NONE,
    SYS_eventfd2 => NONE, SYS_pipe2 => NONE, SYS_uname => NONE, SYS_getuid => NONE,
    SYS_geteuid => NONE, SYS_getcwd => NONE, SYS_fcntl => KIND_FCNTL, SYS_close => KIND_CLOSE,
    SYS_dup => KIND_DUP, SYS_dup3 => KIND_DUP, SYS_openat => KIND_OPENAT,
    SYS_openat2 => KIND_OPENAT,
    SYS_socket => KIND_NEW_SOCK, SYS_accept => KIND_NEW_SOCK, SYS_accept4 => KIND_NEW_SOCK,
    SYS_socketpair => KIND_SOCKETPAIR,
    SYS_connect => KIND_SOCK, SYS_bind => KIND_SOCK, SYS_listen => KIND_SOCK,
    SYS_shutdown => KIND_SOCK, SYS_setsockopt => KIND_SOCK, SYS_getsockopt => KIND_SOCK,
    SYS_getsockname => KIND_SOCK, SYS_getpeername => KIND_SOCK, SYS_sendto => KIND_SOCK,
    SYS_recvfrom => KIND_SOCK, SYS_sendmsg => KIND_SOCK, SYS_recvmsg => KIND_SOCK,
    SYS_sendmmsg => KIND_SOCK, SYS_recvmmsg => KIND_SOCK,
];

#[cfg(target_arch = "x86_64")]
const ARCH: &[(u32, &str, u8)] = syscalls![
    SYS_open => KIND_OPEN, SYS_dup2 => KIND_DUP, SYS_poll => NONE, SYS_select => NONE,
    SYS_epoll_wait => NONE, SYS_stat => NONE, SYS_lstat => NONE, SYS_access => NONE,
    SYS_readlink => NONE, SYS_arch_prctl => NONE, SYS_pipe => NONE,
];
#[cfg(target_arch = "aarch64")]
const ARCH: &[(u32, &str, u8)] = &[];

impl SyscallTable {
    pub fn native() -> Result<Self> {
        // Syscall arguments in struct pt_regs (arch/*/include/asm/ptrace.h).
        let arg_offsets: [u32; 6] = if cfg!(target_arch = "x86_64") {
            // di, si, dx, r10, r8, r9 of r15 r14 r13 r12 bp bx r11 r10 r9 r8 ax cx dx si di ...
            [14 * 8, 13 * 8, 12 * 8, 7 * 8, 9 * 8, 8 * 8]
        } else if cfg!(target_arch = "aarch64") {
            [0, 8, 16, 24, 32, 40]
        } else {
            return Err(anyhow!(Unsupported(
                "rdma-trace verify knows the syscall layout of x86_64 and arm64 only".to_owned()
            )));
        };
        let mut kinds = [NONE; MAX_SYSCALLS as usize];
        let mut names = BTreeMap::new();
        for &(nr, name, kind) in COMMON.iter().chain(ARCH) {
            if nr < MAX_SYSCALLS {
                kinds[nr as usize] = kind;
                names.insert(nr, name);
            }
        }
        Ok(Self {
            kinds,
            arg_offsets,
            ioctl: libc::SYS_ioctl as u32,
            names,
        })
    }

    fn name(&self, nr: u32) -> String {
        self.names
            .get(&nr)
            .map_or_else(|| format!("syscall {nr}"), |n| (*n).to_owned())
    }
}

/// Per phase: socket, RDMA and other calls by syscall, most frequent first.
pub fn classify(counts: &BTreeMap<(u32, u32, u32), u64>, table: &SyscallTable) -> Vec<PhaseCounts> {
    let mut phases: Vec<PhaseCounts> = PHASE_NAMES
        .iter()
        .map(|&phase| PhaseCounts {
            phase,
            ..PhaseCounts::default()
        })
        .collect();
    for (&(phase, class, nr), &calls) in counts {
        let Some(p) = phases.get_mut(phase as usize) else {
            continue;
        };
        let list = match class {
            CLASS_SOCKET => &mut p.socket,
            CLASS_RDMA => &mut p.rdma,
            CLASS_NONE => &mut p.other,
            _ => continue,
        };
        list.push(Calls {
            syscall: table.name(nr),
            calls,
        });
    }
    for p in &mut phases {
        for list in [&mut p.socket, &mut p.rdma, &mut p.other] {
            list.sort_by(|a, b| b.calls.cmp(&a.calls).then(a.syscall.cmp(&b.syscall)));
        }
    }
    phases
}

fn list(calls: &[Calls]) -> String {
    calls
        .iter()
        .map(|c| format!("{} ×{}", c.syscall, c.calls))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The table of calls per phase and class.
pub fn render(phases: &[PhaseCounts]) -> String {
    let mut out = format!(
        "{:<10} {:>8} {:>8} {:>8}\n",
        "phase", "socket", "rdma", "other"
    );
    for p in phases {
        out.push_str(&format!(
            "{:<10} {:>8} {:>8} {:>8}\n",
            p.phase,
            p.socket_calls(),
            p.rdma_calls(),
            p.other_calls()
        ));
    }
    for p in phases {
        if !p.socket.is_empty() {
            out.push_str(&format!("{} socket calls: {}\n", p.phase, list(&p.socket)));
        }
        if !p.rdma.is_empty() {
            out.push_str(&format!("{} RDMA calls: {}\n", p.phase, list(&p.rdma)));
        }
    }
    // What else the data phase did (waiting for completion events, clocks, the markers).
    if let Some(data) = phases
        .get(PHASE_DATA as usize)
        .filter(|d| !d.other.is_empty())
    {
        let top: Vec<Calls> = data.other.iter().take(8).cloned().collect();
        out.push_str(&format!("data other calls: {}\n", list(&top)));
    }
    out
}

/// "data phase: 0 socket syscalls, N RDMA operations", or the offending calls.
pub fn verdict(data: &PhaseCounts) -> String {
    let rdma = data.rdma_calls();
    match data.socket_calls() {
        0 => format!("data phase: 0 socket syscalls, {rdma} RDMA operations"),
        n => format!(
            "data phase: {n} socket syscalls ({}), {rdma} RDMA operations: data went through a socket",
            list(&data.socket)
        ),
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[test]
    fn refusals_for_want_of_privileges_are_unsupported_by_errno() {
        for errno in [libc::EPERM, libc::EACCES] {
            let e = permission(&std::io::Error::from_raw_os_error(errno), "loading p");
            assert!(e.downcast_ref::<Unsupported>().is_some(), "{e}");
            assert!(e.to_string().starts_with("loading p: "), "{e}");
        }
        let e = permission(
            &std::io::Error::from_raw_os_error(libc::EINVAL),
            "loading p",
        );
        assert!(e.downcast_ref::<Unsupported>().is_none(), "{e}");
    }
    use rdma_trace_common::syscalls::{PHASE_SETUP, PHASE_TEARDOWN};

    fn table() -> SyscallTable {
        SyscallTable::native().unwrap()
    }

    #[test]
    fn table_knows_the_socket_calls() {
        let t = table();
        for (nr, kind) in [
            (libc::SYS_sendto, KIND_SOCK),
            (libc::SYS_recvmsg, KIND_SOCK),
            (libc::SYS_connect, KIND_SOCK),
            (libc::SYS_socket, KIND_NEW_SOCK),
            (libc::SYS_accept4, KIND_NEW_SOCK),
            (libc::SYS_write, KIND_FD),
            (libc::SYS_close, KIND_CLOSE),
            (libc::SYS_openat, KIND_OPENAT),
        ] {
            assert_eq!(t.kinds[nr as usize], kind, "{}", t.name(nr as u32));
        }
        assert_eq!(t.name(libc::SYS_sendto as u32), "sendto");
        assert_eq!(t.name(9999), "syscall 9999");
    }

    #[test]
    fn verdict_passes_without_sockets_and_names_offenders() {
        let t = table();
        let w = libc::SYS_write as u32;
        let mut counts = BTreeMap::new();
        counts.insert((PHASE_SETUP, CLASS_SOCKET, libc::SYS_connect as u32), 1);
        counts.insert((PHASE_DATA, CLASS_RDMA, w), 2000);
        counts.insert((PHASE_DATA, CLASS_RDMA, libc::SYS_ioctl as u32), 4);
        counts.insert((PHASE_DATA, CLASS_NONE, w), 3);
        counts.insert((PHASE_TEARDOWN, CLASS_RDMA, libc::SYS_ioctl as u32), 20);
        let phases = classify(&counts, &t);
        assert_eq!(phases[0].socket_calls(), 1);
        assert_eq!(
            verdict(&phases[1]),
            "data phase: 0 socket syscalls, 2004 RDMA operations"
        );
        let table = render(&phases);
        assert!(
            table.contains("data RDMA calls: write ×2000, ioctl ×4"),
            "{table}"
        );

        counts.insert((PHASE_DATA, CLASS_SOCKET, w), 1);
        counts.insert((PHASE_DATA, CLASS_SOCKET, libc::SYS_connect as u32), 1);
        let phases = classify(&counts, &t);
        let v = verdict(&phases[1]);
        assert!(v.starts_with("data phase: 2 socket syscalls ("), "{v}");
        assert!(v.contains("write ×1") && v.contains("connect ×1"), "{v}");
    }

    #[test]
    fn demo_command_line() {
        let args = Args {
            mode: Mode::Event,
            demo: Demo::WriteRead,
            iterations: Some(5),
            size: Some(64),
            device: None,
            server_device: None,
            json: None,
            demo_binary: None,
            demo_args: vec!["--mtu".into(), "1024".into()],
        };
        let kernel = Kernel::at(Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/guest-6.1-rxe"
        )));
        let v = demo_args(&args, &kernel).unwrap();
        assert_eq!(
            v.join(" "),
            "write-read --loopback --port 0 -d rxe1 --server-device rxe0 --mode event --iterations 5 --size 64 --mtu 1024"
        );
        let e = demo_args(
            &Args {
                demo: Demo::Atomic,
                ..args
            },
            &kernel,
        )
        .unwrap_err();
        assert!(e.to_string().contains("--size"), "{e}");
        let empty = Kernel::at(Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/host-6.18-no-rdma"
        )));
        let e = demo_args(
            &Args {
                demo: Demo::Pingpong,
                mode: Mode::Poll,
                iterations: None,
                size: None,
                device: None,
                server_device: None,
                json: None,
                demo_binary: None,
                demo_args: vec![],
            },
            &empty,
        )
        .unwrap_err();
        assert!(e.downcast_ref::<Unsupported>().is_some(), "{e}");
    }
}

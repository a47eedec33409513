//! Workloads other than the demo: the process tree of `run -- CMD`, running processes
//! (`--pid`), or the whole system (`--all`). The eBPF side (`rdma-trace-ebpf/src/workload.rs`)
//! keeps the traced set in `TGIDS` (children join at fork, before they run) and counts per
//! process in `PROC_EVENTS`; this module configures it, spawns the CMD, and reads the counts.

use std::{
    collections::{BTreeMap, HashSet},
    os::fd::AsFd as _,
    path::{Path, PathBuf},
    process::Stdio,
};

use anyhow::{Context as _, Result, anyhow, bail};
use aya::{
    Ebpf,
    maps::{HashMap as BpfHashMap, MapData, PerCpuHashMap},
};
use rdma_trace_common::workload::{PROC_KEY_SLOT, TIMELINE_RING_BYTES, WL_ALL, WL_OFF, WL_TREE};
use serde::Serialize;

use crate::{
    bpf::loader::{Bpf, ObjectConfig},
    error::Unsupported,
    error::chain,
    kernel::facts::{Kernel, format_offset},
};

/// Load-time configuration of the workload and timeline programs (globals of the eBPF object).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extra {
    /// `WL_OFF`, `WL_TREE` or `WL_ALL`.
    pub workload: u32,
    /// With `WL_TREE`: the process whose new children are traced (rdma-trace, spawning a CMD).
    pub tracer_tgid: u32,
    pub newtask_pid_offset: u32,
    pub newtask_flags_offset: u32,
    /// Emit timeline records.
    pub timeline: bool,
}

impl Default for Extra {
    fn default() -> Self {
        Self {
            workload: WL_OFF,
            tracer_tgid: 0,
            newtask_pid_offset: 8,
            newtask_flags_offset: 32,
            timeline: false,
        }
    }
}

impl Extra {
    /// Size of the timeline ring buffer: one page when the timeline is off.
    pub fn timeline_ring_bytes(&self) -> u32 {
        if self.timeline {
            TIMELINE_RING_BYTES
        } else {
            4096
        }
    }

    /// The object's globals and map sizes for this configuration.
    pub fn object_config(&self) -> ObjectConfig {
        ObjectConfig {
            globals: vec![
                ("WORKLOAD", self.workload),
                ("TRACER_TGID", self.tracer_tgid),
                ("NEWTASK_PID_OFFSET", self.newtask_pid_offset),
                ("NEWTASK_FLAGS_OFFSET", self.newtask_flags_offset),
                ("TIMELINE", u32::from(self.timeline)),
                ("FILTER_TGIDS", u32::from(!self.every_process())),
            ],
            map_sizes: vec![("TIMELINE_EVENTS", self.timeline_ring_bytes())],
            ..ObjectConfig::default()
        }
    }

    /// `--all`: the user-space probes count every process too.
    pub fn every_process(&self) -> bool {
        self.workload == WL_ALL
    }

    /// Trace the processes of `target`; offsets of `task:task_newtask` from tracefs.
    pub fn for_target(target: &Target, timeline: bool) -> Result<Self> {
        let mut e = Extra {
            timeline,
            ..Extra::default()
        };
        match target {
            Target::All => e.workload = WL_ALL,
            Target::Command(_) | Target::Pids(_) => {
                e.workload = WL_TREE;
                if matches!(target, Target::Command(_)) {
                    e.tracer_tgid = std::process::id();
                }
                let (pid, flags) = newtask_offsets()?;
                e.newtask_pid_offset = pid;
                e.newtask_flags_offset = flags;
            }
        }
        Ok(e)
    }
}

/// What `run` traces instead of the demo.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Target {
    /// This command and its descendants.
    Command(Vec<String>),
    /// These running processes and their descendants.
    Pids(Vec<u32>),
    /// Every process, until Ctrl-C or `--duration`.
    All,
}

/// Offsets of `pid` and `clone_flags` in the `task:task_newtask` record.
fn newtask_offsets() -> Result<(u32, u32)> {
    let text = Kernel::live()
        .event_format("task/task_newtask")
        .ok_or_else(|| {
            anyhow!(Unsupported(
                "the tracepoint task:task_newtask is not readable (mount tracefs: mount -t tracefs \
                 tracefs /sys/kernel/tracing): it is how children of the traced processes are followed"
                    .to_owned()
            ))
        })?;
    let pid = format_offset(&text, "pid").context("task_newtask format: no pid field")?;
    let flags =
        format_offset(&text, "clone_flags").context("task_newtask format: no clone_flags field")?;
    Ok((pid, flags))
}

/// Attach the programs that follow the traced processes (forks and execs).
pub fn attach(bpf: &mut Bpf, extra: &Extra) -> Result<()> {
    if extra.workload == WL_OFF {
        return Ok(());
    }
    if extra.workload == WL_TREE {
        bpf.attach_tracepoint("task_newtask", "task", "task_newtask")?;
        bpf.attach_raw_tracepoint("proc_exit", "sched_process_exit")?;
    }
    bpf.attach_raw_tracepoint("proc_exec", "sched_process_exec")
}

/// Put running process `pid` (and its current descendants) in the traced set.
pub fn watch_running(bpf: &mut Bpf, pid: u32) -> Result<Vec<u32>> {
    let mut all = vec![pid];
    all.extend(descendants(pid));
    for &p in &all {
        bpf.watch_pid(p)?;
        if let Some(comm) = proc_comm(p) {
            let mut b = [0u8; 16];
            let n = comm.len().min(15);
            b[..n].copy_from_slice(&comm.as_bytes()[..n]);
            let mut map: BpfHashMap<&mut MapData, u32, [u8; 16]> = BpfHashMap::try_from(
                bpf.ebpf_mut()
                    .map_mut("PROC_COMM")
                    .context("map PROC_COMM is not in the eBPF object")?,
            )?;
            map.insert(p, b, 0)
                .map_err(|e| anyhow!("naming pid {p}: {}", chain(&e)))?;
        }
    }
    Ok(all)
}

/// `comm` of a running process.
pub fn proc_comm(pid: u32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .ok()
        .map(|s| s.trim_end().to_owned())
}

/// Whether `pid` runs (exists and is not a zombie).
pub fn alive(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // pid (comm) S ...: the state follows the last ')'.
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .is_some_and(|state| state != "Z" && state != "X")
}

/// Every descendant of `root` now running (from the parent field of /proc/*/stat).
pub fn descendants(root: u32) -> Vec<u32> {
    let mut parent_of = Vec::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for e in dir.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
                continue;
            };
            if let Some(ppid) = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .and_then(|p| p.parse::<u32>().ok())
            {
                parent_of.push((pid, ppid));
            }
        }
    }
    let mut found: HashSet<u32> = HashSet::from([root]);
    let mut out = Vec::new();
    loop {
        let before = out.len();
        for &(pid, ppid) in &parent_of {
            if found.contains(&ppid) && found.insert(pid) {
                out.push(pid);
            }
        }
        if out.len() == before {
            return out;
        }
    }
}

/// The program a CMD names, checked before anything is attached.
pub fn resolve_command(name: &str) -> Result<PathBuf> {
    let exec_ok = |p: &Path| {
        use std::os::unix::fs::PermissionsExt as _;
        p.metadata()
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if name.contains('/') {
        let p = PathBuf::from(name);
        if exec_ok(&p) {
            return Ok(p);
        }
        bail!(
            "command {name}: {}",
            if p.exists() {
                "not an executable file"
            } else {
                "no such file"
            }
        );
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|d| d.join(name))
        .find(|p| exec_ok(p))
        .with_context(|| {
            format!("command {name:?} not found on PATH: check its name, or give its path")
        })
}

/// Output kept per stream of a CMD whose output is held back (the live screen owns the terminal).
const KEPT_OUTPUT: usize = 64 * 1024;

/// A CMD's stdout and stderr, held back while the live screen is up; the last 64 KiB of each.
pub struct HeldOutput {
    out: tokio::task::JoinHandle<String>,
    err: tokio::task::JoinHandle<String>,
}

impl HeldOutput {
    /// What CMD wrote, once it has exited.
    pub async fn take(self) -> (String, String) {
        (
            self.out.await.unwrap_or_default(),
            self.err.await.unwrap_or_default(),
        )
    }
}

async fn keep_tail(mut r: impl tokio::io::AsyncRead + Unpin) -> String {
    use tokio::io::AsyncReadExt as _;
    let mut kept = Vec::new();
    let mut buf = [0u8; 8192];
    while let Ok(n) = r.read(&mut buf).await {
        if n == 0 {
            break;
        }
        kept.extend_from_slice(&buf[..n]);
        if kept.len() > 2 * KEPT_OUTPUT {
            kept.drain(..kept.len() - KEPT_OUTPUT);
        }
    }
    if kept.len() > KEPT_OUTPUT {
        kept.drain(..kept.len() - KEPT_OUTPUT);
    }
    String::from_utf8_lossy(&kept).into_owned()
}

/// Start CMD (its program already resolved). Its own children are traced from their fork on;
/// CMD itself is the tracer's next child, which `task_newtask` adopts. With `hold`, CMD gets no
/// terminal: no stdin, and its output is kept for later.
pub fn spawn(
    program: &Path,
    cmd: &[String],
    hold: bool,
    stdout_to_stderr: bool,
) -> Result<(tokio::process::Child, Option<HeldOutput>)> {
    let io = || {
        if hold {
            Stdio::piped()
        } else {
            Stdio::inherit()
        }
    };
    // With `--json -` our stdout carries the JSON document alone: the command writes its
    // output to our stderr instead.
    let out = if stdout_to_stderr && !hold {
        Stdio::from(
            std::io::stderr()
                .as_fd()
                .try_clone_to_owned()
                .context("duplicating stderr for the command's output")?,
        )
    } else {
        io()
    };
    let mut child = tokio::process::Command::new(program)
        .arg0(&cmd[0])
        .args(&cmd[1..])
        .stdin(if hold {
            Stdio::null()
        } else {
            Stdio::inherit()
        })
        .stdout(out)
        .stderr(io())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("could not start {}", cmd[0]))?;
    let held = match (child.stdout.take(), child.stderr.take()) {
        (Some(out), Some(err)) => Some(HeldOutput {
            out: tokio::spawn(keep_tail(out)),
            err: tokio::spawn(keep_tail(err)),
        }),
        _ => None,
    };
    Ok((child, held))
}

/// One traced process and what it counted.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ProcessCounts {
    pub pid: u32,
    pub comm: String,
    /// Probe events while one of its threads was current, by probe id.
    #[serde(skip)]
    pub probes: BTreeMap<u32, u64>,
    /// Calls of kernel functions in its context, by function slot.
    #[serde(skip)]
    pub calls: BTreeMap<u32, u64>,
}

impl ProcessCounts {
    pub fn total(&self) -> u64 {
        self.probes.values().sum::<u64>() + self.calls.values().sum::<u64>()
    }

    /// The counts since `before` (the same process at the window's start): the maps count
    /// from attach, a report from its window's start.
    pub fn since(mut self, before: Option<&ProcessCounts>) -> Self {
        if let Some(b) = before {
            for (k, v) in self.probes.iter_mut() {
                *v = v.saturating_sub(b.probes.get(k).copied().unwrap_or(0));
            }
            for (k, v) in self.calls.iter_mut() {
                *v = v.saturating_sub(b.calls.get(k).copied().unwrap_or(0));
            }
        }
        self
    }
}

/// The traced processes with their counts and names, by pid.
pub fn read_processes(ebpf: &Ebpf) -> Result<BTreeMap<u32, ProcessCounts>> {
    let mut out: BTreeMap<u32, ProcessCounts> = BTreeMap::new();
    let comms: BpfHashMap<&MapData, u32, [u8; 16]> = BpfHashMap::try_from(
        ebpf.map("PROC_COMM")
            .context("map PROC_COMM is not in the eBPF object")?,
    )?;
    for item in comms.iter() {
        let (pid, comm) = item.map_err(|e| anyhow!("reading PROC_COMM: {}", chain(&e)))?;
        out.entry(pid).or_default().comm = crate::bpf::c_string(&comm);
    }
    let events: PerCpuHashMap<&MapData, u64, u64> = PerCpuHashMap::try_from(
        ebpf.map("PROC_EVENTS")
            .context("map PROC_EVENTS is not in the eBPF object")?,
    )?;
    for item in events.iter() {
        let (key, per_cpu) = item.map_err(|e| anyhow!("reading PROC_EVENTS: {}", chain(&e)))?;
        let pid = (key >> 32) as u32;
        let what = key as u32;
        let n: u64 = per_cpu.iter().sum();
        let p = out.entry(pid).or_default();
        if what & PROC_KEY_SLOT != 0 {
            *p.calls.entry(what & !PROC_KEY_SLOT).or_default() += n;
        } else {
            *p.probes.entry(what).or_default() += n;
        }
    }
    for (pid, p) in out.iter_mut() {
        p.pid = *pid;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The truth: counts at the window's start and end; the report counts the difference, and
    /// a process born in the window keeps all of its counts.
    #[test]
    fn process_counts_since_the_windows_start() {
        let counts = |probes: &[(u32, u64)], calls: &[(u32, u64)]| ProcessCounts {
            pid: 7,
            comm: "ib_send_lat".into(),
            probes: probes.iter().copied().collect(),
            calls: calls.iter().copied().collect(),
        };
        let before = counts(&[(1, 663), (2, 10)], &[(0, 663)]);
        let after = counts(&[(1, 1663), (2, 10), (3, 5)], &[(0, 1663)]);
        let d = after.clone().since(Some(&before));
        assert_eq!(d.probes, BTreeMap::from([(1, 1000), (2, 0), (3, 5)]));
        assert_eq!(d.calls, BTreeMap::from([(0, 1000)]));
        assert_eq!(after.clone().since(None).total(), after.total());
    }

    #[test]
    fn missing_commands_are_named() {
        let e = resolve_command("no-such-command-rdma-trace").unwrap_err();
        assert!(e.to_string().contains("not found on PATH"), "{e}");
        let e = resolve_command("/no/such/file").unwrap_err();
        assert!(e.to_string().contains("no such file"), "{e}");
        assert!(resolve_command("sh").is_ok());
    }

    #[test]
    fn this_process_is_alive_and_has_no_children_listed_twice() {
        assert!(alive(std::process::id()));
        assert!(!alive(u32::MAX - 1));
        let d = descendants(1);
        let set: HashSet<_> = d.iter().collect();
        assert_eq!(set.len(), d.len());
        assert!(d.contains(&std::process::id()));
    }
}

//! `rdma-trace cq`: a log of every call of the CQ-path functions (`CQ_FUNCTIONS`: ib_uverbs's
//! completion handler, rxe's CQ post/poll/arm, mlx5's EQ interrupt and CQ callbacks), each with
//! timestamp, CPU, task, and its caller resolved from the kernel stack against /proc/kallsyms —
//! the lines of an ftrace function log (`comm-pid [cpu] secs: function <-caller`), or NDJSON.
//! Events come through a ring buffer (kprobes `cq_N`, `rdma-trace-ebpf/src/cq.rs`).

use std::{collections::HashMap, io::Write as _, path::PathBuf, time::Duration};

use anyhow::{Context as _, Result, anyhow};
use aya::maps::{Array, MapData, RingBuf, StackTraceMap};
use rdma_trace_common::cq::{CQ_FUNCTIONS, CqEvent};
use serde::Serialize;
use tokio::time::MissedTickBehavior;

use crate::{
    bpf::loader::Bpf,
    error::Unsupported,
    error::chain,
    kernel::facts::Kernel,
    kernel::plan::{self, Facts, Options},
    model::overhead::{LoaderUsage, Overhead},
    model::window::Waiter,
};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Log for this many seconds (default: until Ctrl-C).
    #[arg(long, value_name = "SECS", value_parser = crate::cmd::parse_seconds)]
    pub duration: Option<Duration>,
    /// Only calls made in this process (its tgid).
    #[arg(short, long, value_name = "PID", value_parser = clap::value_parser!(u32).range(1..))]
    pub pid: Option<u32>,
    /// Also write the calls as newline-delimited JSON to this file (`-`: to stdout, instead
    /// of the text lines).
    #[arg(long, value_name = "PATH")]
    pub json: Option<PathBuf>,
}

/// One logged call.
#[derive(Debug, Serialize, PartialEq)]
pub struct Line {
    pub ts_ns: u64,
    pub cpu: u32,
    pub comm: String,
    pub pid: u32,
    pub tid: u32,
    pub function: &'static str,
    /// The caller's symbol (`rxe_completer+0x1a5`), when the stack could be taken.
    pub caller: Option<String>,
}

impl Line {
    /// ftrace's function-tracer format: `comm-pid [cpu] secs: function <-caller`.
    pub fn text(&self) -> String {
        format!(
            "{:>16}-{:<7} [{:03}] {:>13.6}: {} <-{}",
            self.comm,
            self.tid,
            self.cpu,
            self.ts_ns as f64 / 1e9,
            self.function,
            self.caller.as_deref().unwrap_or("?")
        )
    }
}

/// Text symbols of /proc/kallsyms, sorted by address.
pub struct Kallsyms {
    syms: Vec<(u64, String)>,
}

impl Kallsyms {
    pub fn parse(text: &str) -> Self {
        let mut syms: Vec<(u64, String)> = text
            .lines()
            .filter_map(|l| {
                let mut it = l.split_whitespace();
                let addr = u64::from_str_radix(it.next()?, 16).ok()?;
                let kind = it.next()?;
                let name = it.next()?;
                (addr != 0 && matches!(kind, "t" | "T" | "w" | "W"))
                    .then(|| (addr, name.to_owned()))
            })
            .collect();
        syms.sort_unstable_by_key(|s| s.0);
        Self { syms }
    }

    /// `name+0xoff` of the text symbol holding `addr`.
    pub fn resolve(&self, addr: u64) -> Option<(&str, u64)> {
        let i = self.syms.partition_point(|s| s.0 <= addr).checked_sub(1)?;
        let (start, name) = &self.syms[i];
        Some((name.as_str(), addr - start))
    }

    /// The caller in a stack (innermost first): the first frame outside `function`.
    pub fn caller(&self, frames: &[u64], function: &str) -> Option<String> {
        frames.iter().find_map(|&ip| {
            let (name, off) = self.resolve(ip)?;
            (name != function).then(|| format!("{name}+{off:#x}"))
        })
    }
}

/// `--json -`: the JSON lines go to stdout, instead of the text lines.
fn json_on_stdout(args: &Args) -> bool {
    args.json.as_deref() == Some(std::path::Path::new("-"))
}

/// The file of `--json PATH`, created (or emptied) now; a symlink there is refused, not
/// followed.
fn json_file(args: &Args) -> Result<Option<std::io::BufWriter<std::fs::File>>> {
    let Some(path) = args.json.as_deref().filter(|_| !json_on_stdout(args)) else {
        return Ok(None);
    };
    crate::output::check_writable(path)?;
    let file = crate::output::no_follow(0o644)
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(Some(std::io::BufWriter::new(file)))
}

pub async fn run(args: &Args) -> Result<()> {
    let mut json = json_file(args)?;
    let kernel = Kernel::live();
    let symbols = kernel.functions(&CQ_FUNCTIONS);
    let present: Vec<(usize, &str)> = CQ_FUNCTIONS
        .iter()
        .enumerate()
        .filter(|(_, f)| symbols.contains_key(**f))
        .map(|(i, f)| (i, *f))
        .collect();
    if present.is_empty() {
        return Err(anyhow!(Unsupported(format!(
            "none of the CQ-path functions is in /proc/kallsyms ({}): no RDMA driver loaded here; \
             run it in the guest (cargo xtask vm -- rdma-trace cq)",
            CQ_FUNCTIONS.join(", ")
        ))));
    }
    if !kernel.has_kprobes() {
        return Err(anyhow!(Unsupported(
            "rdma-trace cq needs kprobes, and this kernel has none (no kprobe PMU in \
             /sys/bus/event_source/devices): run it in the guest (cargo xtask vm -- rdma-trace cq)"
                .to_owned()
        )));
    }
    let kallsyms = Kallsyms::parse(
        &std::fs::read_to_string("/proc/kallsyms").context("reading /proc/kallsyms")?,
    );
    let empty = plan::plan(&[], &Facts::default(), Options::default());
    let mut bpf = Bpf::load(&empty)?;
    {
        let mut pid: Array<&mut MapData, u32> = Array::try_from(
            bpf.ebpf_mut()
                .map_mut("CQ_PID")
                .context("map CQ_PID is not in the eBPF object")?,
        )?;
        pid.set(0, args.pid.unwrap_or(0), 0)
            .map_err(|e| anyhow!("setting the PID filter: {}", chain(&e)))?;
    }
    let mut attached = Vec::new();
    for &(i, f) in &present {
        match bpf.attach_kprobe(&format!("cq_{i}"), f) {
            Ok(()) => attached.push(f),
            Err(e) => eprintln!("rdma-trace: {f}: skipped ({e:#})"),
        }
    }
    if attached.is_empty() {
        return Err(anyhow!(Unsupported(
            "no CQ-path function could be probed (see above)".to_owned()
        )));
    }
    // A stop signal while attaching: detach again before going on.
    crate::signals::check()?;
    let mut ring = RingBuf::try_from(
        bpf.ebpf_mut()
            .take_map("CQ_EVENTS")
            .context("map CQ_EVENTS is not in the eBPF object")?,
    )?;
    eprintln!(
        "rdma-trace: logging calls of {}{}{}; Ctrl-C to stop",
        attached.join(", "),
        args.pid.map(|p| format!(" in PID {p}")).unwrap_or_default(),
        args.duration
            .map(|d| format!(" for {} s", d.as_secs_f64()))
            .unwrap_or_default()
    );

    let usage0 = LoaderUsage::now();
    let stats0 = bpf.program_stats();
    let mut waiter = Waiter::new(args.duration, None)
        .every(Duration::from_millis(20), MissedTickBehavior::Burst);
    let mut callers: HashMap<(i64, u32), Option<String>> = HashMap::new();
    let mut counts: HashMap<&'static str, u64> = HashMap::new();
    let stdout = std::io::stdout();
    loop {
        let done = waiter.next_tick().await?.is_some();
        // Drain what is there (also after the end: the last events).
        let stacks: StackTraceMap<&MapData> = StackTraceMap::try_from(
            bpf.ebpf()
                .map("CQ_STACKS")
                .context("map CQ_STACKS is not in the eBPF object")?,
        )?;
        let mut out = stdout.lock();
        while let Some(item) = ring.next() {
            if item.len() < std::mem::size_of::<CqEvent>() {
                continue;
            }
            // SAFETY: the eBPF side submits whole CqEvents (checked length); read_unaligned
            // copes with the ring's 8-byte alignment and CqEvent is Pod.
            let ev: CqEvent = unsafe { std::ptr::read_unaligned(item.as_ptr().cast()) };
            let Some(&function) = CQ_FUNCTIONS.get(ev.function as usize) else {
                continue;
            };
            let caller = callers
                .entry((ev.stack_id, ev.function))
                .or_insert_with(|| {
                    let id = u32::try_from(ev.stack_id).ok()?;
                    let st = stacks.get(&id, 0).ok()?;
                    let frames: Vec<u64> = st.frames().iter().map(|f| f.ip).collect();
                    kallsyms.caller(&frames, function)
                })
                .clone();
            *counts.entry(function).or_default() += 1;
            let line = Line {
                ts_ns: ev.ts_ns,
                cpu: ev.cpu,
                comm: crate::bpf::c_string(&ev.comm),
                pid: (ev.pid_tgid >> 32) as u32,
                tid: ev.pid_tgid as u32,
                function,
                caller,
            };
            let text = if json_on_stdout(args) {
                serde_json::to_string(&line).context("serializing an event")?
            } else {
                line.text()
            };
            if let Some(f) = &mut json {
                let l = serde_json::to_string(&line).context("serializing an event")?;
                writeln!(f, "{l}").context("writing the --json file")?;
            }
            if writeln!(out, "{text}").is_err() {
                return Ok(()); // stdout closed (| head): stop quietly
            }
        }
        let _ = out.flush();
        if let Some(f) = &mut json {
            f.flush().context("writing the --json file")?;
        }
        if done {
            break;
        }
    }
    let drops = Array::<&MapData, u64>::try_from(
        bpf.ebpf()
            .map("CQ_DROPS")
            .context("map CQ_DROPS is not in the eBPF object")?,
    )?
    .get(&0, 0)
    .unwrap_or(0);
    let overhead = Overhead::between(
        bpf.stats_how(),
        &stats0,
        &bpf.program_stats(),
        usage0,
        LoaderUsage::now(),
    );
    drop(bpf); // detach
    let mut summary: Vec<String> = attached
        .iter()
        .map(|f| format!("{f} {}", counts.get(f).copied().unwrap_or(0)))
        .collect();
    summary.sort();
    eprintln!(
        "rdma-trace: {:.1} s, calls: {}; {drops} lost (ring buffer full)\n{}",
        waiter.elapsed().as_secs_f64(),
        summary.join(", "),
        overhead.render().trim_end()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const KALLSYMS: &str = "\
ffffffffc0a01000 t rxe_completer\t[rdma_rxe]
ffffffffc0a00000 t rxe_cq_post\t[rdma_rxe]
ffffffffc0a02000 T rxe_responder\t[rdma_rxe]
ffffffffc0a03000 d rxe_data\t[rdma_rxe]
0000000000000000 t hidden
";

    #[test]
    fn callers_resolve_to_the_first_other_function() {
        let k = Kallsyms::parse(KALLSYMS);
        assert_eq!(k.resolve(0xffffffffc0a01010), Some(("rxe_completer", 0x10)));
        assert_eq!(
            k.resolve(0xffffffffc0a03010).unwrap().0,
            "rxe_responder",
            "data symbols are not text"
        );
        assert_eq!(k.resolve(0x10), None);
        // Innermost first: the probed function itself, then its caller.
        let frames = [0xffffffffc0a00005, 0xffffffffc0a011a5, 0xffffffffc0a02000];
        assert_eq!(
            k.caller(&frames, "rxe_cq_post").as_deref(),
            Some("rxe_completer+0x1a5")
        );
        assert_eq!(k.caller(&[], "rxe_cq_post"), None);
    }

    #[test]
    fn ftrace_like_lines() {
        let l = Line {
            ts_ns: 1_234_567_890_123,
            cpu: 1,
            comm: "rdma-demo".into(),
            pid: 42,
            tid: 43,
            function: "rxe_cq_post",
            caller: Some("rxe_completer+0x1a5".into()),
        };
        assert_eq!(
            l.text(),
            "       rdma-demo-43      [001]   1234.567890: rxe_cq_post <-rxe_completer+0x1a5"
        );
        let j: serde_json::Value =
            serde_json::from_str(&serde_json::to_string(&l).unwrap()).unwrap();
        assert_eq!(j["function"], "rxe_cq_post");
        assert_eq!(j["caller"], "rxe_completer+0x1a5");
    }
}

//! `rdma-trace funclat`: how often kernel functions run and how long each call takes
//! (kprobe at entry, kretprobe at return), optionally while a command runs.

use std::{path::PathBuf, time::Duration};

use anyhow::{Result, anyhow, bail};
use rdma_trace_common::{FC_ENTRY, FC_RETURN, FC_RETURN_NO_ENTRY, FUNC_SLOTS, NR_FC, SLOTS};
use serde::Serialize;

use crate::{
    bpf::Bpf,
    cmd::{Window, collect_window, write_json},
    error::Unsupported,
    hist::{HistReport, Log2Hist, human_ns},
    kernel::Kernel,
};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Kernel functions to time (at most 8), e.g. ib_uverbs_comp_handler rxe_cq_post.
    #[arg(required = true, value_name = "FUNCTION")]
    pub functions: Vec<String>,
    /// Collect for this many seconds (with a command: at most this long).
    #[arg(short, long, value_name = "SECS", value_parser = crate::parse_seconds)]
    pub duration: Option<Duration>,
    /// Also write the report as JSON to this file.
    #[arg(long, value_name = "PATH")]
    pub json: Option<PathBuf>,
    /// Command to run while tracing; collection ends when it exits.
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

#[derive(Serialize)]
struct Report {
    kernel: Option<String>,
    window: Window,
    functions: Vec<Function>,
}

#[derive(Serialize)]
struct Function {
    name: String,
    module: Option<String>,
    attach: &'static str,
    calls: u64,
    returns: u64,
    returns_without_entry: u64,
    duration: HistReport,
}

/// Returns the traced command's exit status, if a command ran.
pub async fn run(args: &Args) -> Result<Option<i32>> {
    if args.functions.len() > FUNC_SLOTS as usize {
        bail!(
            "{} functions given; at most {FUNC_SLOTS} can be timed at once",
            args.functions.len()
        );
    }
    let kernel = Kernel::live();
    if !kernel.has_kprobes() {
        return Err(anyhow!(Unsupported(format!(
            "this kernel ({}) has no kprobes (no /sys/bus/event_source/devices/kprobe): \
             funclat needs CONFIG_KPROBES; try it in the guest: cargo xtask vm -- rdma-trace funclat ...",
            kernel.release().unwrap_or_default()
        ))));
    }
    let mut symbols = Vec::new();
    for f in &args.functions {
        let sym = kernel.find_function(f).ok_or_else(|| {
            anyhow!(Unsupported(format!(
                "function {f} is not in /proc/kallsyms: check the name, and that its module is loaded"
            )))
        })?;
        if sym.occurrences > 1 {
            eprintln!(
                "rdma-trace: warning: {f} names {} functions; the kernel may refuse an ambiguous kprobe",
                sym.occurrences
            );
        }
        symbols.push(sym);
    }

    let mut bpf = Bpf::load()?;
    for (slot, f) in args.functions.iter().enumerate() {
        bpf.attach_kprobe(&format!("func_entry_{slot}"), f)?;
        bpf.attach_kprobe(&format!("func_return_{slot}"), f)?;
    }
    eprintln!(
        "rdma-trace: timing {} (kprobe + kretprobe)",
        args.functions.join(", ")
    );
    let window = collect_window(args.duration, &args.command).await?;

    let n = args.functions.len() as u32;
    let counts = bpf.read_sums("FUNC_COUNTS", 0, n * NR_FC)?;
    let hists = bpf.read_sums("FUNC_HIST", 0, n * SLOTS)?;
    drop(bpf); // detach before printing

    let functions: Vec<Function> = symbols
        .into_iter()
        .zip(
            counts
                .chunks_exact(NR_FC as usize)
                .zip(hists.chunks_exact(SLOTS as usize)),
        )
        .map(|(sym, (c, h))| Function {
            name: sym.name,
            module: sym.module,
            attach: "kprobe",
            calls: c[FC_ENTRY as usize],
            returns: c[FC_RETURN as usize],
            returns_without_entry: c[FC_RETURN_NO_ENTRY as usize],
            duration: (&Log2Hist::from_buckets(h.try_into().expect("chunks of SLOTS"))).into(),
        })
        .collect();

    println!(
        "function durations over {:.1} s (log2 buckets)",
        window.seconds
    );
    println!(
        "{:<28} {:>10} {:>10} {:>10}",
        "function", "calls", "p50 <", "p99 <"
    );
    for f in &functions {
        let q = |x: Option<u64>| x.map(human_ns).unwrap_or_else(|| "-".into());
        println!(
            "{:<28} {:>10} {:>10} {:>10}",
            f.name,
            f.calls,
            q(f.duration.p50_upper_ns),
            q(f.duration.p99_upper_ns)
        );
    }
    for (f, h) in functions.iter().zip(hists.chunks_exact(SLOTS as usize)) {
        if f.duration.count > 0 {
            let hist = Log2Hist::from_buckets(h.try_into().expect("chunks of SLOTS"));
            print!("\n{}:\n{}", f.name, hist.render(40));
        }
    }
    let status = window.command_status;
    if let Some(path) = &args.json {
        write_json(
            path,
            &Report {
                kernel: kernel.release(),
                window,
                functions,
            },
        )?;
    }
    Ok(status)
}

//! `rdma-trace funclat`: how often kernel functions run and how long each call takes
//! (kprobe/kretprobe, or fentry/fexit for vmlinux functions without kprobes), optionally while a
//! command runs.

use std::{borrow::Cow, path::PathBuf, time::Duration};

use anyhow::{Context as _, Result, anyhow, bail};
use rdma_trace_common::MAX_KSLOTS;
use serde::Serialize;

use crate::{
    bpf::session::Session,
    error::Unsupported,
    kernel::facts::Kernel,
    kernel::plan::Options,
    kernel::probes::{Driver, Method, ProbeDef, Shape},
    model::report::{ProbeReport, probe_reports, render},
    model::window::{Window, wait_window},
    output::write_json_if,
};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Kernel functions to time (at most 16), e.g. ib_uverbs_comp_handler rxe_cq_post.
    #[arg(required = true, value_name = "FUNCTION")]
    pub functions: Vec<String>,
    /// Collect for this many seconds (with a command: at most this long).
    #[arg(long, value_name = "SECS", value_parser = crate::cmd::parse_seconds)]
    pub duration: Option<Duration>,
    /// Also write the report as JSON to this file (`-`: stdout).
    #[arg(long, value_name = "PATH")]
    pub json: Option<PathBuf>,
    /// Command line to run while tracing, like `-- COMMAND` (split as a shell splits words,
    /// without expansions); collection ends when it exits.
    #[arg(short = 'c', long = "command", value_name = "\"CMD ARGS\"", conflicts_with = "command",
          value_parser = crate::cmd::CommandLine::parse)]
    pub command_line: Option<crate::cmd::CommandLine>,
    /// Command to run while tracing; collection ends when it exits.
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

#[derive(Serialize)]
struct Report {
    kernel: Option<String>,
    window: Window,
    functions: Vec<ProbeReport>,
}

/// Returns the traced command's exit status, if a command ran.
pub async fn run(args: &Args) -> Result<Option<i32>> {
    if args.functions.len() > MAX_KSLOTS as usize {
        bail!(
            "{} functions given; at most {MAX_KSLOTS} can be timed at once",
            args.functions.len()
        );
    }
    if let Some(path) = &args.json {
        crate::output::check_writable(path)?;
    }
    let kernel = Kernel::live();
    let defs: Vec<ProbeDef> = args
        .functions
        .iter()
        .map(|f| {
            // This command's own rows: `run`'s presets never see them.
            ProbeDef::stage(
                Cow::Owned(f.clone()),
                "kernel function, entry → return",
                Driver::Network,
                Shape::Duration {
                    function: Cow::Owned(f.clone()),
                },
                &[Method::Kprobe, Method::Fentry],
            )
        })
        .collect();
    let mut session = Session::start(&kernel, &defs, Options::default())?;
    if let Some(why) = session.outcomes.iter().find_map(|o| match o {
        crate::bpf::loader::Outcome::Skipped(why) => Some(why.clone()),
        crate::bpf::loader::Outcome::Attached(_) => None,
    }) {
        return Err(anyhow!(Unsupported(format!(
            "cannot time every function given: {why}"
        ))));
    }
    eprintln!("rdma-trace: timing {}", args.functions.join(", "));
    let command = args.command_line.as_ref().map_or(&args.command, |c| &c.0);
    let mut child = match command.split_first() {
        Some((prog, rest)) => {
            let mut cmd = tokio::process::Command::new(prog);
            cmd.args(rest).kill_on_drop(true);
            // A SIGKILL of rdma-trace sends the command a SIGTERM, as a closing terminal would.
            crate::signals::die_with_parent(&mut cmd, libc::SIGTERM);
            Some(
                cmd.spawn()
                    .with_context(|| format!("could not start the command `{prog}`"))?,
            )
        }
        None => None,
    };
    let window = wait_window(args.duration, child.as_mut()).await?;
    let data = session.finish()?;
    let functions = probe_reports(&session, &data, window.seconds);
    crate::output::print_text(
        args.json.as_deref(),
        &format!(
            "function durations over {:.1} s\n{}",
            window.seconds,
            render(&functions)
        ),
    );
    let status = window.command_status;
    write_json_if(args.json.as_deref(), || Report {
        kernel: kernel.release(),
        window,
        functions,
    })?;
    Ok(status)
}

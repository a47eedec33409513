//! `cargo xtask bench [demo|trace|model]`: benchmarks in the QEMU guest (not tests).
//!
//! Each bench boots ONE 6.1 guest and runs a generated bash script there that alternates the
//! compared programs for a number of rounds (9 by default) and leaves raw results (the programs' own
//! output, JSON, `bpftool` snapshots) in `$RESULTS_DIR/bench-<name>/`. The host parses them,
//! computes medians, min/max and ratios, and prints the table. `cargo xtask bench` runs both
//! and writes `docs/benchmarks.md` (generated: never edit it by hand).
//!
//! - `demo` (`bench/demo.rs`): rdma-demo against the C tools (ibv_rc_pingpong, perftest).
//! - `trace` (`bench/trace.rs`): the demo alone, under rdma-trace, under bpftrace with an
//!   equivalent script (`bench/equivalent.bt`), and under bpftrace with empty probe bodies.
//! - `model` (`bench/model.rs`): each preset's hook hits per round trip (guest) times each
//!   mechanism's cost on this host's CPU: what it would add to a real NIC's round trip.
//! - `crashes` (`bench/crashes.rs`, not in the default run): guest kernel deaths and oopses over
//!   attach/detach cycles of rdma-trace, per QEMU and TCG setup (docs/testing.md quotes it).

mod agreement;
mod crashes;
mod demo;
mod model;
mod stats;
mod trace;

use std::{
    fmt::Write as _,
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use crate::{
    build_ebpf,
    util::{root, run_cmd, say, target_dir},
    vm,
};

#[derive(clap::Args)]
pub struct Args {
    /// Which bench (default: all three, and write docs/benchmarks.md).
    #[command(subcommand)]
    which: Option<Which>,
    /// Alternating rounds (more rounds make the 95 % intervals trustworthy: 5 rounds flipped 29
    /// of 104 verdicts against the run before; 5 rounds of both benches took 433 s, so 9 stay
    /// within the bench's 15 minutes).
    #[arg(long, global = true, default_value_t = 9, value_parser = clap::value_parser!(u32).range(1..=50))]
    rounds: u32,
    /// Do not build first (use the release binaries already in target/release).
    #[arg(long, global = true)]
    no_build: bool,
}

#[derive(clap::Subcommand, Clone, Copy, PartialEq, Eq)]
enum Which {
    /// rdma-demo against ibv_rc_pingpong and perftest (ib_send_lat, ib_write_lat, ib_read_lat,
    /// ib_atomic_lat): median ratios ours / C, target <= 1.02.
    Demo,
    /// The demo alone (A), under rdma-trace (B), under bpftrace with bench/equivalent.bt (C)
    /// and with bench/empty.bt (D): latency ratios, BPF time per run, start-up, loader CPU/RSS.
    Trace,
    /// What each probe preset would add to a real host's 8 µs event-mode round trip: hook hits
    /// per round trip counted in the guest, times each mechanism's cost calibrated on this
    /// host (root).
    Model,
    /// Guest kernel deaths over N attach/detach cycles of rdma-trace under traffic (one
    /// tracer, then two at once), under the host's QEMU and bookworm-backports' 10.0, with one
    /// TCG thread per vCPU and with one for both (not part of the default run).
    Crashes {
        /// Attach/detach cycles per setup.
        #[arg(long, default_value_t = 50)]
        cycles: u32,
        /// Only the setups with one TCG thread per vCPU (the test bed's), under both QEMUs.
        #[arg(long)]
        per_vcpu_only: bool,
        /// Only this QEMU (default: both).
        #[arg(long, value_enum)]
        qemu: Option<vm::QemuBuild>,
    },
}

/// The generated docs page.
const DOC: &str = "docs/benchmarks.md";

/// One bench's outcome: the console table and its section of the docs page.
pub struct Section {
    pub title: &'static str,
    pub markdown: String,
    pub guest_kernel: String,
}

impl Section {
    /// A bench's section from its results folder `dir`: `markdown` with, last, the line naming
    /// the runs that `failed` (if any), and the guest kernel that the folder's `uname` names.
    fn new(title: &'static str, mut markdown: String, dir: &Path, failed: &[String]) -> Self {
        if !failed.is_empty() {
            let _ = writeln!(
                markdown,
                "\nRuns that failed (their figures are left out): {}.",
                failed.join(", ")
            );
        }
        Section {
            title,
            markdown,
            guest_kernel: fs::read_to_string(dir.join("uname"))
                .map(|s| s.trim().to_owned())
                .unwrap_or_default(),
        }
    }

    /// The section with, first, the line saying its guest was cut short (if it was).
    fn cut_short(mut self, line: Option<String>) -> Self {
        if let Some(line) = line {
            self.markdown = format!("**{line}**\n\n{}", self.markdown);
        }
        self
    }
}

pub fn run(args: &Args) -> Result<i32> {
    let started = Instant::now();
    if !args.no_build {
        build(args.which != Some(Which::Demo))?;
    }
    let which: Vec<Which> = match args.which {
        Some(w) => vec![w],
        None => vec![Which::Demo, Which::Trace, Which::Model],
    };
    let mut sections = Vec::new();
    for w in which {
        let s = match w {
            Which::Demo => demo::run(args.rounds)?,
            Which::Trace => trace::run(args.rounds)?,
            Which::Model => model::run(args.rounds)?,
            Which::Crashes {
                cycles,
                per_vcpu_only,
                qemu,
            } => {
                crashes::run(cycles, per_vcpu_only, qemu)?;
                continue;
            }
        };
        println!("\n## {}\n\n{}", s.title, s.markdown);
        sections.push(s);
    }
    let elapsed = started.elapsed();
    let mut page = page(&sections, args.rounds, elapsed);
    let dest = if args.which.is_none() {
        let dest = root().join(DOC);
        // Verdicts that noise cannot flip: say which ones this run changed.
        let old = fs::read_to_string(&dest).unwrap_or_default();
        if let Some(s) = agreement::section(&old, &page) {
            print!("{s}");
            page.push_str(&s);
        }
        dest
    } else {
        let dir = target_dir().join("bench");
        fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        dir.join("benchmarks.md")
    };
    fs::write(&dest, page).with_context(|| format!("writing {}", dest.display()))?;
    say(format!(
        "wrote {} ({:.0} s in all)",
        dest.display(),
        elapsed.as_secs_f64()
    ));
    Ok(0)
}

/// Release builds of the workspace (and the eBPF object the tracer embeds).
fn build(with_ebpf: bool) -> Result<()> {
    if with_ebpf {
        build_ebpf::run(&build_ebpf::Args { release: true })?;
    }
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    run_cmd(
        Command::new(cargo)
            .args(["build", "--release"])
            .current_dir(root()),
    )
}

/// The runs of the results folder `dir` that failed: `failed` names a run that did, from the
/// fields of its line of `runs.csv` (the header skipped).
fn failed_runs(dir: &Path, failed: impl Fn(&[&str]) -> Option<String>) -> Vec<String> {
    let text = fs::read_to_string(dir.join("runs.csv")).unwrap_or_default();
    text.lines()
        .skip(1)
        .filter_map(|l| failed(&l.split(',').collect::<Vec<_>>()))
        .collect()
}

/// What a bench guest left: its results folder, and the line the page shows when the guest
/// was stopped (timeout), or died, before its script ended.
pub struct GuestResults {
    pub dir: PathBuf,
    pub cut_short: Option<String>,
}

/// Runs a bench in the guest ([`run_guest`], `script(first, rounds)` its script for rounds
/// `first..=rounds`) and makes its section: `report(results folder, rounds)`, led by the line
/// saying that the guest was cut short (if it was).
fn run_bench(
    name: &str,
    rounds: u32,
    timeout: Duration,
    bench_image: bool,
    script: fn(u32, u32) -> String,
    report: fn(&Path, u32) -> Section,
) -> Result<Section> {
    let g = run_guest(
        name,
        &|first| script(first, rounds),
        rounds,
        timeout,
        bench_image,
    )?;
    Ok(report(&g.dir, rounds).cut_short(g.cut_short))
}

/// Boots for a bench whose guest kernel died (under TCG, kernel text patched while the other
/// vCPU runs it has hung or crashed a guest now and then: a probe attached or detached, a
/// tracepoint's static key flipped).
const MAX_BOOTS: u32 = 3;

/// Runs rounds `1..=rounds` of a bench in the guest: `script(first)` is the guest script for
/// rounds `first..=rounds`. A guest whose kernel dies after finishing some rounds is booted
/// again for the rest, within `timeout` in all (at most [`MAX_BOOTS`] boots, each one getting
/// further); the page names each death. A guest stopped at its timeout, or that finished no
/// round, gives the rounds it finished (the page says so); one that finished none fails.
fn run_guest(
    name: &str,
    script: &dyn Fn(u32) -> String,
    rounds: u32,
    timeout: Duration,
    bench_image: bool,
) -> Result<GuestResults> {
    let dir = target_dir()
        .join("vm-results")
        .join(format!("bench-{name}"));
    let _ = fs::remove_dir_all(&dir);
    let deadline = Instant::now() + timeout;
    let mut first = 1;
    let mut deaths: Vec<String> = Vec::new();
    for boot in 1..=MAX_BOOTS {
        let full = format!("{}\n{}", prelude(name, first == 1), script(first));
        let left = deadline.saturating_duration_since(Instant::now());
        let end = vm::run_in_guest_to_end(&vm::GuestRun {
            kernel: vm::Kernel::V6_1,
            timeout: left,
            cmd: vec![full],
            profile: "release".into(),
            mem_mib: if bench_image { 3072 } else { 2048 },
            bench: bench_image,
            ..Default::default()
        })?;
        let log = fs::read_to_string(dir.join("log.txt")).unwrap_or_default();
        let done = rounds_done(&log);
        if end.code == 0 {
            return Ok(GuestResults {
                dir,
                cut_short: (!deaths.is_empty()).then(|| {
                    format!(
                        "The {name} bench's guest kernel died {}; the next boot went on from \
                         the round that died: all {rounds} rounds ran.",
                        deaths.join("; then ")
                    )
                }),
            });
        }
        let died = end.code == vm::EXIT_NO_STATUS;
        if died {
            let what = end.panic.as_deref().unwrap_or("no oops on its console");
            deaths.push(format!("in round {} ({what})", done.unwrap_or(0) + 1));
        }
        // Another boot only after a death that came after this boot finished a round, with
        // time left for a round.
        let progressed = done.is_some_and(|d| d >= first);
        let time_left =
            deadline.saturating_duration_since(Instant::now()) > Duration::from_secs(60);
        if died && progressed && boot < MAX_BOOTS && time_left {
            first = done.unwrap_or(0) + 1;
            say(format!(
                "the {name} bench's guest kernel died in round {first}: booting again for rounds \
                 {first}–{rounds}"
            ));
            continue;
        }
        let ended = if end.code == vm::EXIT_TIMEOUT {
            Some(format!(
                "was stopped after {} s (its timeout)",
                timeout.as_secs()
            ))
        } else if died {
            Some(format!("kernel died {}", deaths.join("; then ")))
        } else {
            None
        };
        if let Some(ended) = ended
            && let Some(done) = done
        {
            let line = format!(
                "The {name} bench's guest {ended}: the figures below come from rounds 1–{done} \
                 of {rounds} only."
            );
            say(&line);
            return Ok(GuestResults {
                dir,
                cut_short: Some(line),
            });
        }
        let tail: Vec<&str> = log.lines().rev().take(15).collect();
        bail!(
            "the {name} bench failed in the guest (status {}); last lines of {}:\n{}",
            end.code,
            dir.join("log.txt").display(),
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
    unreachable!("the last boot returns")
}

/// Rounds a bench script finished, from its `== round N` lines (the last one begun did not
/// finish); None when none did.
fn rounds_done(log: &str) -> Option<u32> {
    let begun = log
        .lines()
        .filter_map(|l| l.strip_prefix("== round ")?.trim().parse::<u32>().ok())
        .max()?;
    (begun > 1).then(|| begun - 1)
}

/// Shell helpers every bench script starts with. `$R` is the results folder (emptied by the
/// first boot, kept by the next ones), `now` prints microseconds since the epoch,
/// `wait_listen PORT` waits until a TCP port listens, `wait_mark FILE TEXT PID` until FILE
/// contains TEXT (fails if PID ends first).
fn prelude(name: &str, first_boot: bool) -> String {
    let fresh = if first_boot { "rm -rf \"$R\"; " } else { "" };
    format!(
        r#"set -u
R="$RESULTS_DIR/bench-{name}"
{fresh}mkdir -p "$R"
[ -e /dev/fd ] || ln -s /proc/self/fd /dev/fd
exec > >(tee -a "$R/log.txt") 2>&1
G=${{RXE_GID_INDEX:?no RoCE v2 GID on rxe0}}
uname -r > "$R/uname"
nproc > "$R/nproc"
now() {{ echo "${{EPOCHREALTIME/./}}"; }}
wait_listen() {{
    local hex i
    hex=$(printf '%04X' "$1")
    for i in $(seq 500); do
        grep -qE ":$hex 0+:0000 0A" /proc/net/tcp /proc/net/tcp6 2>/dev/null && return 0
        sleep 0.01
    done
    echo "port $1 never listened"; return 1
}}
wait_mark() {{
    local l
    while :; do
        if [ -f "$1" ]; then
            while IFS= read -r l; do [[ $l == *"$2"* ]] && return 0; done < "$1"
        fi
        kill -0 "$3" 2>/dev/null || return 1
        sleep 0.02
    done
}}
"#
    )
}

/// The page: header (date, machine, method) and each bench's section.
fn page(sections: &[Section], rounds: u32, elapsed: Duration) -> String {
    let mut out = String::from(
        "# Benchmarks\n\n\
         <!-- Generated by `cargo xtask bench`: do not edit by hand, run it again. -->\n\n",
    );
    let kernel = sections
        .iter()
        .map(|s| s.guest_kernel.as_str())
        .find(|k| !k.is_empty())
        .unwrap_or("?");
    let _ = writeln!(out, "- date: {}", date());
    let _ = writeln!(out, "- host: {}", host());
    let _ = writeln!(
        out,
        "- guest: Debian kernel {kernel} in QEMU ({}), 2 vCPUs; two Soft-RoCE devices rxe0 \
         (veth va, 10.9.0.1) and rxe1 (vb, 10.9.0.2) whose RoCE traffic crosses the IP stack",
        accel()
    );
    let _ = writeln!(
        out,
        "- method: one guest boot per bench, {rounds} rounds; in each round every compared \
         program runs once, in an order reversed every other round so that drift of the \
         machine hits all of them alike. Each run gives one figure (its median latency unless \
         the row says otherwise); the tables show the median of the {rounds} figures and their \
         min/max, and ratios as the median of the per-round ratios; each median has an exact \
         95 % confidence interval from order statistics (none with fewer than 6 figures): a \
         verdict is met or MISSED only when the whole interval is on one side of the goal, \
         else undecided. Release builds.",
    );
    let _ = writeln!(out, "- whole run: {:.0} s\n", elapsed.as_secs_f64());
    out.push_str(
        "Figures under TCG emulation are slow and noisy in absolute terms; the ratios, measured \
         side by side in one boot, are what these tables are for.\n",
    );
    for s in sections {
        let _ = write!(out, "\n## {}\n\n{}", s.title, s.markdown);
    }
    out
}

fn date() -> String {
    Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "?".into())
}

fn host() -> String {
    let cpu = fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|v| v.trim_start_matches([' ', '\t', ':']).trim().to_owned())
        })
        .unwrap_or_else(|| "?".into());
    let n = std::thread::available_parallelism().map_or(0, |n| n.get());
    let kernel = fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default();
    format!("{cpu}, {n} CPUs, Linux {kernel}")
}

fn accel() -> &'static str {
    if Path::new("/dev/kvm").exists()
        && fs::read_to_string("/proc/modules")
            .is_ok_and(|m| m.contains("kvm_intel") || m.contains("kvm_amd"))
    {
        "KVM"
    } else {
        "TCG, no KVM"
    }
}

// ---- statistics

/// Median, min and max of some figures.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub n: usize,
}

/// `None` without figures. The median of an even count is the mean of the middle two.
pub fn spread(values: &[f64]) -> Option<Spread> {
    let v = stats::sorted_finite(values);
    let median = stats::median_of_sorted(&v)?;
    Some(Spread {
        median,
        min: v[0],
        max: v[v.len() - 1],
        n: v.len(),
    })
}

/// A number for the tables: `-` when missing.
pub fn num(v: Option<f64>, decimals: usize) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.decimals$}"))
}

/// A markdown table.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut out = format!("| {} |\n", header.join(" | "));
    let _ = writeln!(
        out,
        "|{}",
        header.iter().map(|_| "---|").collect::<String>()
    );
    for r in rows {
        let _ = writeln!(out, "| {} |", r.join(" | "));
    }
    out
}

/// The first number after `key` on a line of `text` containing `key`.
pub fn number_after(text: &str, key: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        let rest = &l[l.find(key)? + key.len()..];
        rest.split(|c: char| !(c.is_ascii_digit() || c == '.'))
            .find(|w| !w.is_empty())?
            .parse()
            .ok()
    })
}

/// A JSON file of the results folder (`None` when missing or unreadable).
pub fn read_json(path: &Path) -> Option<serde_json::Value> {
    serde_json::from_slice(&fs::read(path).ok()?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_of_odd_even_and_empty() {
        let s = spread(&[3.0, 1.0, 2.0, 10.0, 4.0]).unwrap();
        assert_eq!((s.median, s.min, s.max, s.n), (3.0, 1.0, 10.0, 5));
        assert_eq!(spread(&[4.0, 1.0, 2.0, 3.0]).unwrap().median, 2.5);
        assert!(spread(&[]).is_none());
        assert!(spread(&[f64::NAN]).is_none());
    }

    #[test]
    fn numbers_for_tables() {
        assert_eq!(num(Some(1.234), 2), "1.23");
        assert_eq!(num(None, 2), "-");
    }

    #[test]
    fn numbers_in_text() {
        let t = "4096000 bytes in 0.55 seconds = 59.4 Mbit/sec\n1000 iters in 0.55 seconds = 551.52 usec/iter\n";
        assert_eq!(number_after(t, "seconds ="), Some(59.4));
        assert_eq!(number_after(t, "iters in"), Some(0.55));
        assert_eq!(number_after(t, "nothing"), None);
    }

    #[test]
    fn markdown_table() {
        let t = table(&["a", "b"], &[vec!["1".into(), "2".into()]]);
        assert_eq!(t, "| a | b |\n|---|---|\n| 1 | 2 |\n");
    }

    #[test]
    fn rounds_done_are_those_before_the_last_begun() {
        assert_eq!(
            rounds_done("x\n== round 1\n== round 2\n== round 3\n"),
            Some(2)
        );
        assert_eq!(rounds_done("== round 1\n"), None);
        assert_eq!(rounds_done("no rounds\n"), None);
    }

    #[test]
    fn prelude_is_plain_bash() {
        let p = prelude("x", true);
        assert!(p.contains("R=\"$RESULTS_DIR/bench-x\""));
        assert!(p.contains("G=${RXE_GID_INDEX:?"));
        assert!(!p.contains("{{"));
    }

    #[test]
    fn only_the_first_boot_empties_the_results_and_the_log_is_appended() {
        assert!(prelude("x", true).contains("rm -rf \"$R\"; mkdir -p \"$R\""));
        let again = prelude("x", false);
        assert!(!again.contains("rm -rf"), "{again}");
        assert!(again.contains("tee -a \"$R/log.txt\""), "{again}");
        // The rounds of both boots count: the second boot began round 3 after round 2 died.
        assert_eq!(
            rounds_done("== round 1\n== round 2\n== round 2\n== round 3\n"),
            Some(2)
        );
    }
}

//! `cargo xtask bench trace`: what tracing costs the traced demo, rdma-trace against bpftrace.
//!
//! Per round, in one 6.1 guest boot (the bench image, with bpftrace and bpftool):
//! - A: `rdma-demo pingpong --loopback` rxe1 ↔ rxe0 alone, poll then event mode;
//! - B: `rdma-trace run --no-tui --no-waterfall --mode both` (it spawns that same demo
//!   command, poll then event, with every probe of its table attached): histograms only;
//! - W: the same with the completion waterfall (its default): histograms + waterfall;
//! - C: bpftrace running `bench/equivalent.bt` (same probe points, hist() maps) around the same
//!   two demo runs; D: bpftrace running `bench/empty.bt` (same points, empty bodies).
//!
//! B's demo is a wrapper (`--demo`) that runs rdma-demo and then, while rdma-trace still has
//! its probes attached, snapshots `bpftool prog show` / `bpftool perf show` and the tracer's
//! /proc status; C and D take the same snapshots after each demo run. BPF run-time statistics
//! are on for the whole bench (`kernel.bpf_stats_enabled=1`) in every run, A included, since
//! rdma-trace turns them on itself.

use std::{collections::BTreeMap, fmt::Write as _, fs, path::Path, time::Duration};

use anyhow::Result;
use serde_json::Value;

use super::{Section, Spread, num, ratio, read_json, spread, table, verdict};

const ITERATIONS: u32 = 150;
const SIZE: u32 = 64;
const MODES: [&str; 2] = ["poll", "event"];
const VARIANTS: [&str; 5] = ["A", "B", "W", "C", "D"];
/// The marker both bpftrace scripts print from BEGIN (after all probes are attached).
const BT_MARK: &str = "@@BPFTRACE_ATTACHED@@";
/// What rdma-trace prints on stderr once every probe is attached.
const OURS_MARK: &str = "probes:";

fn demo_cmd(mode: &str, json: &str) -> String {
    format!(
        "rdma-demo pingpong --loopback --port 0 -d rxe1 --server-device rxe0 --mode {mode} \
         -i {ITERATIONS} -S {SIZE} --json {json}"
    )
}

/// The guest script.
fn script(rounds: u32) -> String {
    let mut s = format!(
        r#"echo 1 > /proc/sys/kernel/bpf_stats_enabled
getconf CLK_TCK > $R/clk_tck 2>/dev/null || echo 100 > $R/clk_tck
# snap PREFIX PID: bpftool views and the tracer's /proc figures, with the time.
snap() {{
    now > "$1.time"
    cat /proc/$2/stat > "$1.stat" 2>/dev/null
    cat /proc/$2/status > "$1.status" 2>/dev/null
    [ "${{3:-}}" = short ] && return 0
    bpftool -j prog show > "$1.prog.json" 2>/dev/null
    bpftool -j perf show > "$1.perf.json" 2>/dev/null
    bpftool -j link show > "$1.link.json" 2>/dev/null
}}
# The demo rdma-trace runs in B: rdma-demo, then a snapshot while the probes are attached.
mkdir -p /tmp/bench
cat > /tmp/bench/demo.sh <<'EOF'
#!/bin/bash
rdma-demo "$@"; rc=$?
mode=x; json=; prev=
for a in "$@"; do
    [ "$prev" = --mode ] && mode=$a
    [ "$prev" = --json ] && json=$a
    prev=$a
done
[ -n "$json" ] && cp "$json" "$BENCH_PREFIX-$mode.demo.json"
now() {{ echo "${{EPOCHREALTIME/./}}"; }}
{snap_body}
snap "$BENCH_PREFIX-$mode" $PPID
exit $rc
EOF
chmod +x /tmp/bench/demo.sh
echo 'round,variant,status' > $R/runs.csv
"#,
        snap_body = "snap() { now > \"$1.time\"; cat /proc/$2/stat > \"$1.stat\"; cat /proc/$2/status > \"$1.status\"; bpftool -j prog show > \"$1.prog.json\" 2>/dev/null; bpftool -j perf show > \"$1.perf.json\" 2>/dev/null; bpftool -j link show > \"$1.link.json\" 2>/dev/null; }",
    );
    for round in 1..=rounds {
        let order: Vec<&str> = if round % 2 == 1 {
            VARIANTS.to_vec()
        } else {
            VARIANTS.iter().rev().copied().collect()
        };
        let _ = writeln!(s, "echo \"== round {round}\"");
        for v in order {
            let p = format!("$R/r{round}-{v}");
            match v {
                "A" => {
                    for m in MODES {
                        let _ = writeln!(
                            s,
                            "timeout 300 {} > {p}-{m}.out 2>&1; echo \"{round},A-{m},$?\" >> $R/runs.csv",
                            demo_cmd(m, &format!("{p}-{m}.demo.json"))
                        );
                    }
                }
                "B" | "W" => {
                    let waterfall = if v == "B" { " --no-waterfall" } else { "" };
                    let _ = writeln!(
                        s,
                        "T0=$(now); BENCH_PREFIX={p} timeout 600 rdma-trace run --no-tui{waterfall} --mode both \
                         -i {ITERATIONS} -S {SIZE} --demo /tmp/bench/demo.sh > {p}.out 2> {p}.err & TP=$!\n\
                         echo $T0 > {p}.start\n\
                         wait_mark {p}.err '{OURS_MARK}' $TP && snap {p}-attach $TP short\n\
                         wait $TP; echo \"{round},{v},$?\" >> $R/runs.csv"
                    );
                }
                _ => {
                    let bt = if v == "C" { "equivalent" } else { "empty" };
                    let _ = writeln!(
                        s,
                        "T0=$(now); timeout 600 bpftrace bench/{bt}.bt > {p}.out 2>&1 & TP=$!\n\
                         echo $T0 > {p}.start\n\
                         if wait_mark {p}.out '{BT_MARK}' $TP; then\n\
                         snap {p}-attach $TP short"
                    );
                    for m in MODES {
                        let _ = writeln!(
                            s,
                            "timeout 300 {} > {p}-{m}.out 2>&1; echo \"{round},{v}-{m},$?\" >> $R/runs.csv\n\
                             snap {p}-{m} $TP",
                            demo_cmd(m, &format!("{p}-{m}.demo.json"))
                        );
                    }
                    let _ = writeln!(
                        s,
                        "else echo \"bpftrace ({bt}) ended before attaching\"; tail -5 {p}.out; fi\n\
                         kill -INT $TP 2>/dev/null; wait $TP; echo \"{round},{v},$?\" >> $R/runs.csv"
                    );
                }
            }
        }
    }
    s
}

pub fn run(rounds: u32) -> Result<Section> {
    let dir = super::run_guest("trace", &script(rounds), Duration::from_secs(1500), true)?;
    Ok(report(&dir, rounds))
}

/// Median round trip (µs) of the demo's client in one run.
fn demo_rtt(path: &Path) -> Option<f64> {
    let v = read_json(path)?;
    v.get("reports")?
        .as_array()?
        .iter()
        .find(|r| r.get("role").and_then(Value::as_str) == Some("client"))?
        .get("round_trip_us")?
        .get("t_typical")?
        .as_f64()
}

fn read_u64(path: &Path) -> Option<u64> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// utime + stime (clock ticks) from a /proc/PID/stat line.
fn cpu_ticks(stat: &str) -> Option<u64> {
    let after = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    // Fields after the command: state(3) ... utime(14) stime(15), counted from 3.
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

/// `VmHWM` (KiB) from /proc/PID/status.
fn peak_rss_kib(status: &str) -> Option<f64> {
    super::number_after(status, "VmHWM:")
}

/// Per attach point (`kprobe rxe_rcv`, `kretprobe rxe_rcv`, `tracepoint softirq_entry`):
/// (run count, run time ns), from one snapshot's bpftool views.
fn bpf_by_point(prefix: &str, dir: &Path) -> BTreeMap<String, (u64, u64)> {
    let mut out = BTreeMap::new();
    // rdma-trace's report (`<run>.out`, the prefix without its mode) lists its programs.
    let run = prefix.rsplit_once('-').map_or(prefix, |(run, _)| run);
    let functions = fs::read_to_string(dir.join(format!("{run}.out")))
        .map(|t| program_functions(&t))
        .unwrap_or_default();
    let Some(progs) = read_json(&dir.join(format!("{prefix}.prog.json"))) else {
        return out;
    };
    let mut point_of: BTreeMap<u64, String> = BTreeMap::new();
    if let Some(perf) = read_json(&dir.join(format!("{prefix}.perf.json"))) {
        for e in perf.as_array().into_iter().flatten() {
            let Some(id) = e.get("prog_id").and_then(Value::as_u64) else {
                continue;
            };
            let kind = e.get("fd_type").and_then(Value::as_str).unwrap_or("?");
            let what = e
                .get("func")
                .or_else(|| e.get("tracepoint"))
                .and_then(Value::as_str)
                .unwrap_or("?");
            point_of.insert(id, format!("{} {what}", normal_kind(kind)));
        }
    }
    if let Some(links) = read_json(&dir.join(format!("{prefix}.link.json"))) {
        for e in links.as_array().into_iter().flatten() {
            let (Some(id), Some(tp)) = (
                e.get("prog_id").and_then(Value::as_u64),
                e.get("tp_name").and_then(Value::as_str),
            ) else {
                continue;
            };
            point_of
                .entry(id)
                .or_insert_with(|| format!("tracepoint {tp}"));
        }
    }
    for p in progs.as_array().into_iter().flatten() {
        let Some(id) = p.get("id").and_then(Value::as_u64) else {
            continue;
        };
        let cnt = p.get("run_cnt").and_then(Value::as_u64).unwrap_or(0);
        let ns = p.get("run_time_ns").and_then(Value::as_u64).unwrap_or(0);
        // bpftool shows no attach point for aya's perf-event links: rdma-trace's own program
        // table names the function of each kentry_N/kreturn_N; anything else counts under
        // its program name, so that the totals hold every program of the tracer.
        let point = point_of.get(&id).cloned().unwrap_or_else(|| {
            let name = p.get("name").and_then(Value::as_str).unwrap_or("?");
            kernel_function_point(name, &functions).unwrap_or_else(|| format!("program {name}"))
        });
        let e = out.entry(point).or_insert((0, 0));
        e.0 += cnt;
        e.1 += ns;
    }
    out
}

/// `kentry_N` / `kreturn_N` → function, from the program table rdma-trace prints
/// (`  kentry_7           rxe_cq_post      4000    2380`).
fn program_functions(report: &str) -> BTreeMap<String, String> {
    report
        .lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let (prog, function) = (it.next()?, it.next()?);
            (prog.starts_with("kentry_") || prog.starts_with("kreturn_"))
                .then(|| (prog.to_owned(), function.to_owned()))
        })
        .collect()
}

/// The attach point of one of rdma-trace's kernel-function programs, named like bpftool
/// names bpftrace's (`kprobe rxe_rcv`, `kretprobe rxe_rcv`). bpftool truncates program names
/// to 15 characters, which these names never reach.
fn kernel_function_point(name: &str, functions: &BTreeMap<String, String>) -> Option<String> {
    let f = functions.get(name)?;
    let kind = if name.starts_with("kentry_") {
        "kprobe"
    } else {
        "kretprobe"
    };
    Some(format!("{kind} {f}"))
}

/// kprobe / kretprobe / tracepoint (raw or perf-event: the same kernel tracepoint).
fn normal_kind(kind: &str) -> &str {
    match kind {
        "raw_tracepoint" | "tracepoint" => "tracepoint",
        k => k,
    }
}

/// The figures of one tracer session (B, C or D) of one round.
#[derive(Default)]
struct Session {
    startup_s: Option<f64>,
    cpu_percent: Option<f64>,
    peak_rss_mib: Option<f64>,
    /// BPF ns per demo iteration, per mode.
    bpf_ns_per_iter: BTreeMap<&'static str, f64>,
    /// At the end: per attach point (runs, ns).
    points: BTreeMap<String, (u64, u64)>,
}

fn session(dir: &Path, round: u32, v: &str, clk_tck: f64) -> Session {
    let p = |s: &str| format!("r{round}-{v}{s}");
    let mut out = Session::default();
    let start = read_u64(&dir.join(p(".start")));
    let attach = read_u64(&dir.join(p("-attach.time")));
    if let (Some(s), Some(a)) = (start, attach) {
        out.startup_s = Some(a.saturating_sub(s) as f64 / 1e6);
    }
    let end = read_u64(&dir.join(p("-event.time")));
    let ticks = |f: &str| {
        fs::read_to_string(dir.join(p(f)))
            .ok()
            .and_then(|s| cpu_ticks(&s))
    };
    if let (Some(a), Some(e), Some(ta), Some(te)) =
        (attach, end, ticks("-attach.stat"), ticks("-event.stat"))
        && e > a
    {
        let cpu_s = te.saturating_sub(ta) as f64 / clk_tck;
        out.cpu_percent = Some(100.0 * cpu_s / ((e - a) as f64 / 1e6));
    }
    out.peak_rss_mib = fs::read_to_string(dir.join(p("-event.status")))
        .ok()
        .and_then(|s| peak_rss_kib(&s))
        .map(|k| k / 1024.0);
    let poll = bpf_by_point(&p("-poll"), dir);
    let event = bpf_by_point(&p("-event"), dir);
    let total = |m: &BTreeMap<String, (u64, u64)>| m.values().map(|x| x.1).sum::<u64>();
    if !poll.is_empty() {
        out.bpf_ns_per_iter
            .insert("poll", total(&poll) as f64 / f64::from(ITERATIONS));
    }
    if !event.is_empty() {
        out.bpf_ns_per_iter.insert(
            "event",
            total(&event).saturating_sub(total(&poll)) as f64 / f64::from(ITERATIONS),
        );
    }
    out.points = event;
    out
}

/// The section from the results folder.
fn report(dir: &Path, rounds: u32) -> Section {
    let clk_tck = read_u64(&dir.join("clk_tck")).unwrap_or(100) as f64;
    // Per-iteration latency.
    let mut lat: BTreeMap<(&str, &str), Option<Spread>> = BTreeMap::new();
    for m in MODES {
        for v in VARIANTS {
            let figures: Vec<f64> = (1..=rounds)
                .filter_map(|r| demo_rtt(&dir.join(format!("r{r}-{v}-{m}.demo.json"))))
                .collect();
            lat.insert((m, v), spread(&figures));
        }
    }
    let sessions: BTreeMap<&str, Vec<Session>> = ["B", "W", "C", "D"]
        .into_iter()
        .map(|v| {
            (
                v,
                (1..=rounds).map(|r| session(dir, r, v, clk_tck)).collect(),
            )
        })
        .collect();
    let med = |v: &str, f: &dyn Fn(&Session) -> Option<f64>| -> Option<Spread> {
        spread(&sessions[v].iter().filter_map(f).collect::<Vec<_>>())
    };

    let mut md = String::new();
    let _ = writeln!(
        md,
        "The demo (`rdma-demo pingpong --loopback`, rxe1 ↔ rxe0, {ITERATIONS} iterations of \
         {SIZE} B per mode) alone (A), under `rdma-trace run --no-tui --mode both` with every \
         probe its table attaches here (B), under bpftrace 0.17 running `bench/equivalent.bt` \
         — the same probe points with hist() maps (C) — and under bpftrace running \
         `bench/empty.bt`, the same points with empty bodies: the cost of the probe mechanism \
         itself (D). One 6.1 guest boot, {rounds} rounds, A B C D then D C B A. Latency = the \
         demo's median round trip per run (µs). BPF run-time statistics \
         (`kernel.bpf_stats_enabled=1`) are on in every run, as rdma-trace turns them on \
         itself; bpftrace 0.17 has no raw tracepoints, so C and D use the perf-event form of \
         the same tracepoints (softirq_entry/exit, napi_poll).\n"
    );
    // Table 1: latency.
    let goals = [("poll", 1.7), ("event", 1.10)];
    let mut rows = Vec::new();
    for (m, goal) in goals {
        let a = lat[&(m, "A")].map(|s| s.median);
        for v in VARIANTS {
            let s = lat[&(m, v)];
            let r = ratio(s.map(|s| s.median), a);
            rows.push(vec![
                m.to_owned(),
                label(v).to_owned(),
                num(s.map(|s| s.median), 1),
                s.map_or("-".into(), |s| {
                    format!("{:.1}–{:.1} (n={})", s.min, s.max, s.n)
                }),
                if v == "A" { "1".into() } else { num(r, 3) },
                match v {
                    "B" => verdict(r, goal),
                    _ => String::new(),
                },
            ]);
        }
    }
    md.push_str("\n### Per-iteration latency\n\n");
    md.push_str(&table(
        &["mode", "run", "median µs", "min–max", "ratio to A", "goal"],
        &rows,
    ));

    // Table 1b: what the waterfall adds (W against B).
    md.push_str("\n### What the completion waterfall costs (W against B)\n\n");
    let mut rows = Vec::new();
    for m in MODES {
        let b = lat[&(m, "B")].map(|s| s.median);
        let w = lat[&(m, "W")].map(|s| s.median);
        rows.push(vec![
            format!("{m}: median round trip, µs"),
            num(b, 1),
            num(w, 1),
            num(ratio(w, b), 3),
        ]);
        let bb = med("B", &|s| s.bpf_ns_per_iter.get(m).copied()).map(|s| s.median);
        let wb = med("W", &|s| s.bpf_ns_per_iter.get(m).copied()).map(|s| s.median);
        rows.push(vec![
            format!("{m}: BPF ns per demo iteration"),
            num(bb, 0),
            num(wb, 0),
            num(ratio(wb, bb), 3),
        ]);
    }
    let cpu = |v: &str| med(v, &|s| s.cpu_percent).map(|s| s.median);
    rows.push(vec![
        "tracer CPU, % of a core".into(),
        num(cpu("B"), 2),
        num(cpu("W"), 2),
        num(ratio(cpu("W"), cpu("B")), 3),
    ]);
    let rss = |v: &str| med(v, &|s| s.peak_rss_mib).map(|s| s.median);
    rows.push(vec![
        "tracer peak RSS, MiB".into(),
        num(rss("B"), 1),
        num(rss("W"), 1),
        num(ratio(rss("W"), rss("B")), 3),
    ]);
    md.push_str(&table(
        &[
            "figure (median)",
            "histograms only (B)",
            "+ waterfall (W)",
            "W / B",
        ],
        &rows,
    ));
    md.push_str(
        "\nW adds the waterfall's programs (kprobes on ib_uverbs_comp_handler and \
         ib_uverbs_comp_event_read, rxe_cq_post and rxe_req_notify_cq, and the sched_waking and \
         sched_switch tracepoints, which run on every wake-up and context switch of the machine \
         and bail out early for threads no completion handler woke).\n",
    );

    // Table 2: BPF time.
    md.push_str("\n### BPF time (kernel run-time statistics, `bpftool prog show`)\n\n");
    let mut rows = Vec::new();
    for m in MODES {
        let b = med("B", &|s| s.bpf_ns_per_iter.get(m).copied());
        let c = med("C", &|s| s.bpf_ns_per_iter.get(m).copied());
        let d = med("D", &|s| s.bpf_ns_per_iter.get(m).copied());
        let r = ratio(b.map(|s| s.median), c.map(|s| s.median));
        rows.push(vec![
            format!("{m}: BPF ns per demo iteration, all programs"),
            num(b.map(|s| s.median), 0),
            num(c.map(|s| s.median), 0),
            num(d.map(|s| s.median), 0),
            num(r, 3),
            verdict(r, 0.3),
        ]);
    }
    // Per attach point, ns per program run, over both modes.
    let mut points: BTreeMap<String, [Vec<f64>; 3]> = BTreeMap::new();
    for (i, v) in ["B", "C", "D"].iter().enumerate() {
        for s in &sessions[v] {
            for (pt, (cnt, ns)) in &s.points {
                if *cnt > 0 {
                    points.entry(pt.clone()).or_default()[i].push(*ns as f64 / *cnt as f64);
                }
            }
        }
    }
    for (pt, [b, c, d]) in &points {
        let (b, c, d) = (spread(b), spread(c), spread(d));
        let r = ratio(b.map(|s| s.median), c.map(|s| s.median));
        rows.push(vec![
            format!("`{pt}`: ns per program run"),
            num(b.map(|s| s.median), 0),
            num(c.map(|s| s.median), 0),
            num(d.map(|s| s.median), 0),
            num(r, 3),
            if b.is_some() && c.is_some() {
                verdict(r, 0.3)
            } else {
                "attached by one side only".into()
            },
        ]);
    }
    md.push_str(&table(
        &[
            "figure (median of rounds)",
            "rdma-trace (B)",
            "bpftrace (C)",
            "bpftrace empty (D)",
            "B / C",
            "goal",
        ],
        &rows,
    ));

    // Table 3: start-up and the loader.
    md.push_str("\n### Start-up and the loader process\n\n");
    let startup = |v| med(v, &|s| s.startup_s);
    let cpu = |v| med(v, &|s| s.cpu_percent);
    let rss = |v| med(v, &|s| s.peak_rss_mib);
    let mm = |s: Option<Spread>, d: usize| {
        s.map_or("-".into(), |s| {
            format!(
                "{} ({}–{})",
                num(Some(s.median), d),
                num(Some(s.min), d),
                num(Some(s.max), d)
            )
        })
    };
    let su = ratio(
        startup("B").map(|s| s.median),
        startup("C").map(|s| s.median),
    );
    let b_cpu = cpu("B").map(|s| s.median);
    let b_rss = rss("B").map(|s| s.median);
    let rows = vec![
        vec![
            "start-up: exec → all probes attached, s".into(),
            mm(startup("B"), 2),
            mm(startup("C"), 2),
            mm(startup("D"), 2),
            format!("B / C = {}: {}", num(su, 3), verdict(su, 0.2)),
        ],
        vec![
            "tracer CPU while the demos run, % of one core".into(),
            mm(cpu("B"), 1),
            mm(cpu("C"), 1),
            mm(cpu("D"), 1),
            format!("B: {}", verdict(b_cpu, 2.0)),
        ],
        vec![
            "tracer peak RSS (VmHWM), MiB".into(),
            mm(rss("B"), 1),
            mm(rss("C"), 1),
            mm(rss("D"), 1),
            format!("B: {}", verdict(b_rss, 25.0)),
        ],
    ];
    md.push_str(&table(
        &[
            "figure, median (min–max)",
            "rdma-trace (B)",
            "bpftrace (C)",
            "bpftrace empty (D)",
            "goal",
        ],
        &rows,
    ));
    md.push_str(
        "\nStart-up is measured from the shell's fork of the tracer to the moment its \
         \"all attached\" output appears (rdma-trace's probe table on stderr; the scripts' \
         BEGIN marker, which bpftrace runs after attaching every probe), polled every 20 ms. \
         The tracer's CPU is its utime + stime from /proc between that moment and the end of \
         the event-mode demo, over the wall time between them; rdma-trace runs with `--no-tui` \
         (its once-a-second text view), bpftrace only aggregates in the kernel.\n",
    );
    let failed = failed_runs(dir);
    if !failed.is_empty() {
        let _ = writeln!(
            md,
            "\nRuns that failed (their figures are left out): {}.",
            failed.join(", ")
        );
    }
    Section {
        title: "rdma-trace vs bpftrace vs no tracing (`cargo xtask bench trace`)",
        markdown: md,
        guest_kernel: fs::read_to_string(dir.join("uname"))
            .map(|s| s.trim().to_owned())
            .unwrap_or_default(),
    }
}

fn label(v: &str) -> &'static str {
    match v {
        "A" => "A: demo alone",
        "B" => "B: rdma-trace, histograms only",
        "W" => "W: rdma-trace, histograms + waterfall",
        "C" => "C: bpftrace, equivalent.bt",
        _ => "D: bpftrace, empty bodies",
    }
}

fn failed_runs(dir: &Path) -> Vec<String> {
    let text = fs::read_to_string(dir.join("runs.csv")).unwrap_or_default();
    text.lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            let [round, what, status] = f[..] else {
                return None;
            };
            // bpftrace ends with 0 on SIGINT; `timeout` reports 124.
            (status != "0").then(|| format!("r{round}-{what} (status {status})"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_function_programs_get_their_attach_point() {
        let report = "\
  kentry_0           ib_uverbs_comp_handler             3816       2409
  kreturn_7          rxe_cq_post                        4000       3007
  softirq_entry      raw_tp softirq_entry              12361       6997
";
        let f = program_functions(report);
        assert_eq!(f.len(), 2);
        assert_eq!(
            kernel_function_point("kentry_0", &f).as_deref(),
            Some("kprobe ib_uverbs_comp_handler")
        );
        assert_eq!(
            kernel_function_point("kreturn_7", &f).as_deref(),
            Some("kretprobe rxe_cq_post")
        );
        assert_eq!(kernel_function_point("softirq_entry", &f), None);
    }

    #[test]
    fn proc_stat_and_status() {
        let stat =
            "123 (rdma trace) S 1 123 123 0 -1 4194560 500 0 0 0 7 3 0 0 20 0 1 0 100 1000 200";
        assert_eq!(cpu_ticks(stat), Some(10));
        assert_eq!(cpu_ticks("garbage"), None);
        assert_eq!(
            peak_rss_kib("VmPeak:\t 1000 kB\nVmHWM:\t   26100 kB\n"),
            Some(26100.0)
        );
    }

    #[test]
    fn bpf_stats_by_attach_point() {
        let dir = std::env::temp_dir().join(format!("xtask-bench-trace-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        fs::write(
            dir.join("s.prog.json"),
            r#"[{"id":10,"run_cnt":4,"run_time_ns":400},{"id":11,"run_cnt":2,"run_time_ns":60},
                {"id":12,"run_cnt":5,"run_time_ns":50},{"id":99,"run_cnt":1,"run_time_ns":1}]"#,
        )
        .unwrap();
        fs::write(
            dir.join("s.perf.json"),
            r#"[{"pid":7,"fd":3,"prog_id":10,"fd_type":"kprobe","func":"rxe_rcv","offset":0},
                {"pid":7,"fd":4,"prog_id":11,"fd_type":"tracepoint","tracepoint":"softirq_entry"}]"#,
        )
        .unwrap();
        fs::write(
            dir.join("s.link.json"),
            r#"[{"id":1,"type":"raw_tracepoint","prog_id":12,"tp_name":"napi_poll"}]"#,
        )
        .unwrap();
        let m = bpf_by_point("s", &dir);
        assert_eq!(m.get("kprobe rxe_rcv"), Some(&(4, 400)));
        assert_eq!(m.get("tracepoint softirq_entry"), Some(&(2, 60)));
        assert_eq!(m.get("tracepoint napi_poll"), Some(&(5, 50)));
        assert_eq!(
            m.get("program ?"),
            Some(&(1, 1)),
            "unmapped programs count by name"
        );
        assert_eq!(m.len(), 4);
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn script_runs_every_variant_each_round() {
        let s = script(2);
        assert_eq!(s.matches("rdma-trace run --no-tui").count(), 4);
        assert_eq!(
            s.matches("rdma-trace run --no-tui --no-waterfall --mode both")
                .count(),
            2,
            "B: histograms only; W: with the waterfall"
        );
        assert!(
            s.contains("r1-W.start") && s.contains("echo \"2,W,$?\""),
            "{s}"
        );
        assert_eq!(s.matches("bpftrace bench/equivalent.bt").count(), 2);
        assert_eq!(s.matches("bpftrace bench/empty.bt").count(), 2);
        // A, C and D run the demo as rdma-trace does: 3 variants x 2 modes x 2 rounds.
        assert_eq!(
            s.matches("rdma-demo pingpong --loopback --port 0").count(),
            12
        );
        let a1 = s.find("r1-A-poll").unwrap();
        let d1 = s.find("r1-D.start").unwrap();
        let a2 = s.find("r2-A-poll").unwrap();
        let d2 = s.find("r2-D.start").unwrap();
        assert!(a1 < d1 && d2 < a2, "round 2 runs D first");
    }
}

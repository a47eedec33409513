//! `cargo xtask bench demo`: rdma-demo against the C tools it stands in for, rxe0 (server) ↔
//! rxe1 (client), separate server and client processes for every program.
//!
//! | row | ours | C |
//! |---|---|---|
//! | ping-pong poll/event, µs per iteration | `pingpong` total time / iterations | `ibv_rc_pingpong` usec/iter |
//! | ping-pong poll/event, one-way median | `pingpong` round trip / 2 | `ib_send_lat` t_typical (`-e` for event) |
//! | RDMA WRITE ping-pong, one-way median | `write-pingpong` round trip / 2 | `ib_write_lat` t_typical |
//! | RDMA READ median | `write-read` READ post → completion | `ib_read_lat` t_typical |
//! | Fetch-and-Add median | `atomic --repeat faa` | `ib_atomic_lat -A FETCH_AND_ADD` |
//! | Compare-and-Swap median | `atomic --repeat cas` | `ib_atomic_lat -A CMP_AND_SWAP` |

use std::{fmt::Write as _, fs, path::Path, time::Duration};

use anyhow::Result;

use super::{
    Section, num, read_json, spread,
    stats::{self, Verdict},
    table,
};

/// Goal: ours / C median ratio.
const TARGET: f64 = 1.02;
/// Message/buffer size of the ping-pong and WRITE/READ runs (ibv_rc_pingpong's default).
const SIZE: u32 = 4096;
const ITER_POLL: u32 = 300;
/// Event mode is ~10x slower per iteration under TCG (wake-ups): fewer iterations.
const ITER_EVENT: u32 = 200;
const ITER_ONE_SIDED: u32 = 500;

/// One program run: a server and a client (the client gets the server address appended).
struct Run {
    name: &'static str,
    server: String,
    client: String,
}

fn runs() -> Vec<Run> {
    let ours = |name, demo: &str, iters: u32, extra: &str| Run {
        name,
        server: format!(
            "rdma-demo {demo} --server -d rxe0 --bind 10.9.0.1 -p $P -n {iters} {extra}"
        ),
        client: format!(
            "rdma-demo {demo} -d rxe1 -p $P -n {iters} {extra} --json $R/$N.json 10.9.0.1"
        ),
    };
    let c = |name, tool: &str, args: String| Run {
        name,
        server: format!("{tool} -d rxe0 -p $P {args}"),
        client: format!("{tool} -d rxe1 -p $P {args} 10.9.0.1"),
    };
    vec![
        ours("pp-poll-ours", "pingpong", ITER_POLL, &format!("-s {SIZE}")),
        c(
            "pp-poll-rc",
            "ibv_rc_pingpong",
            format!("-g $G -s {SIZE} -n {ITER_POLL}"),
        ),
        c(
            "pp-poll-sendlat",
            "ib_send_lat",
            format!("-x $G -s {SIZE} -n {ITER_POLL} -F"),
        ),
        ours(
            "pp-event-ours",
            "pingpong",
            ITER_EVENT,
            &format!("-s {SIZE} -e"),
        ),
        c(
            "pp-event-rc",
            "ibv_rc_pingpong",
            format!("-g $G -s {SIZE} -n {ITER_EVENT} -e"),
        ),
        c(
            "pp-event-sendlat",
            "ib_send_lat",
            format!("-x $G -s {SIZE} -n {ITER_EVENT} -F -e"),
        ),
        ours(
            "wr-ours",
            "write-read",
            ITER_ONE_SIDED,
            &format!("-s {SIZE}"),
        ),
        ours(
            "wp-ours",
            "write-pingpong",
            ITER_ONE_SIDED,
            &format!("-s {SIZE}"),
        ),
        c(
            "wr-writelat",
            "ib_write_lat",
            format!("-x $G -s {SIZE} -n {ITER_ONE_SIDED} -F"),
        ),
        c(
            "wr-readlat",
            "ib_read_lat",
            format!("-x $G -s {SIZE} -n {ITER_ONE_SIDED} -F"),
        ),
        // ib_atomic_lat's measurement: one atomic repeated on one word (the lock rounds of
        // plain `atomic` mix five atomics on three words).
        ours("at-faa-ours", "atomic", ITER_ONE_SIDED, "--repeat faa"),
        ours("at-cas-ours", "atomic", ITER_ONE_SIDED, "--repeat cas"),
        c(
            "at-fadd",
            "ib_atomic_lat",
            format!("-x $G -A FETCH_AND_ADD -n {ITER_ONE_SIDED} -F"),
        ),
        c(
            "at-cas",
            "ib_atomic_lat",
            format!("-x $G -A CMP_AND_SWAP -n {ITER_ONE_SIDED} -F"),
        ),
    ]
}

/// The guest script: rounds `first..=rounds` of every run, the order reversed every other
/// round. Each run appends `name,client status,server status,wall µs` to `$R/runs.csv`.
fn script(first: u32, rounds: u32) -> String {
    let runs = runs();
    let mut s = String::from(
        "[ -s $R/runs.csv ] || echo 'round,name,client,server,wall_us' > $R/runs.csv\nP=18700\n",
    );
    for round in first..=rounds {
        let order: Vec<&Run> = if round % 2 == 1 {
            runs.iter().collect()
        } else {
            runs.iter().rev().collect()
        };
        let _ = writeln!(s, "echo \"== round {round}\"");
        for r in order {
            let _ = writeln!(
                s,
                "P=$((P + 1)); N=r{round}-{name}\n\
                 timeout 120 {server} > $R/$N.srv 2>&1 & SP=$!\n\
                 wait_listen $P\n\
                 T0=$(now); timeout 120 {client} > $R/$N.out 2> $R/$N.err; RC=$?; T1=$(now)\n\
                 wait $SP; SRC=$?\n\
                 echo \"{round},{name},$RC,$SRC,$((T1 - T0))\" >> $R/runs.csv\n\
                 [ $RC = 0 ] || {{ echo \"$N: client status $RC\"; tail -3 $R/$N.err; }}",
                name = r.name,
                server = r.server,
                client = r.client,
            );
        }
    }
    s
}

/// A figure from one run's results.
type Extract = fn(&Path, &str) -> Option<f64>;

/// One row of the table.
struct Row {
    what: &'static str,
    ours_run: &'static str,
    ours: Extract,
    c_label: &'static str,
    c_run: &'static str,
    c: Extract,
}

fn rows() -> Vec<Row> {
    vec![
        Row {
            what: "ping-pong poll: µs per iteration (round trip, mean)",
            ours_run: "pp-poll-ours",
            ours: |d, n| client_json(d, n, &["totals", "avg_latency_us"]),
            c_label: "ibv_rc_pingpong",
            c_run: "pp-poll-rc",
            c: usec_per_iter,
        },
        Row {
            what: "ping-pong poll: one-way median (round trip / 2)",
            ours_run: "pp-poll-ours",
            ours: |d, n| client_json(d, n, &["one_way_us", "t_typical"]),
            c_label: "ib_send_lat",
            c_run: "pp-poll-sendlat",
            c: perftest_typical,
        },
        Row {
            what: "ping-pong event: µs per iteration (round trip, mean)",
            ours_run: "pp-event-ours",
            ours: |d, n| client_json(d, n, &["totals", "avg_latency_us"]),
            c_label: "ibv_rc_pingpong -e",
            c_run: "pp-event-rc",
            c: usec_per_iter,
        },
        Row {
            what: "ping-pong event: one-way median (round trip / 2)",
            ours_run: "pp-event-ours",
            ours: |d, n| client_json(d, n, &["one_way_us", "t_typical"]),
            c_label: "ib_send_lat -e",
            c_run: "pp-event-sendlat",
            c: perftest_typical,
        },
        Row {
            what: "RDMA WRITE ping-pong: one-way median (round trip / 2)",
            ours_run: "wp-ours",
            ours: |d, n| client_json(d, n, &["one_way_us", "t_typical"]),
            c_label: "ib_write_lat",
            c_run: "wr-writelat",
            c: perftest_typical,
        },
        Row {
            what: "RDMA READ median (post → completion)",
            ours_run: "wr-ours",
            ours: |d, n| client_json(d, n, &["read_us", "t_typical"]),
            c_label: "ib_read_lat",
            c_run: "wr-readlat",
            c: perftest_typical,
        },
        Row {
            what: "Fetch-and-Add median (post → completion)",
            ours_run: "at-faa-ours",
            ours: |d, n| client_json(d, n, &["fetch_add_us", "t_typical"]),
            c_label: "ib_atomic_lat -A FETCH_AND_ADD",
            c_run: "at-fadd",
            c: perftest_typical,
        },
        Row {
            what: "Compare-and-Swap median (post → completion)",
            ours_run: "at-cas-ours",
            ours: |d, n| client_json(d, n, &["cmp_swap_us", "t_typical"]),
            c_label: "ib_atomic_lat -A CMP_AND_SWAP",
            c_run: "at-cas",
            c: perftest_typical,
        },
    ]
}

/// A number in the client's report of an rdma-demo `--json` file (`<dir>/<name>.json`).
fn client_json(dir: &Path, name: &str, path: &[&str]) -> Option<f64> {
    let v = read_json(&dir.join(format!("{name}.json")))?;
    let client = v
        .get("reports")?
        .as_array()?
        .iter()
        .find(|r| r.get("role").and_then(|x| x.as_str()) == Some("client"))?;
    path.iter().try_fold(client, |v, k| v.get(k))?.as_f64()
}

/// ibv_rc_pingpong's client line `N iters in S seconds = X usec/iter`.
fn usec_per_iter(dir: &Path, name: &str) -> Option<f64> {
    parse_usec_per_iter(&fs::read_to_string(dir.join(format!("{name}.out"))).ok()?)
}

fn parse_usec_per_iter(text: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        let before = l
            .split("usec/iter")
            .next()
            .filter(|_| l.contains("usec/iter"))?;
        before.split_whitespace().last()?.parse().ok()
    })
}

/// perftest's `t_typical[usec]` column (the median) from the client's output.
fn perftest_typical(dir: &Path, name: &str) -> Option<f64> {
    parse_perftest_typical(&fs::read_to_string(dir.join(format!("{name}.out"))).ok()?)
}

fn parse_perftest_typical(text: &str) -> Option<f64> {
    let mut lines = text.lines();
    while let Some(l) = lines.next() {
        let cols: Vec<&str> = l.split_whitespace().collect();
        if cols.first() != Some(&"#bytes") {
            continue;
        }
        let idx = cols.iter().position(|c| c.starts_with("t_typical"))?;
        let values: Vec<&str> = lines.next()?.split_whitespace().collect();
        return values.get(idx)?.parse().ok();
    }
    None
}

pub fn run(rounds: u32) -> Result<Section> {
    super::run_bench(
        "demo",
        rounds,
        Duration::from_secs(900),
        false,
        script,
        report,
    )
}

/// The section from the results folder.
fn report(dir: &Path, rounds: u32) -> Section {
    let mut table_rows = Vec::new();
    let mut missed = 0;
    let mut undecided = 0;
    for row in rows() {
        let collect = |run: &str, f: Extract| -> Vec<Option<f64>> {
            (1..=rounds)
                .map(|r| f(dir, &format!("r{r}-{run}")))
                .collect()
        };
        let (ours_r, theirs_r) = (collect(row.ours_run, row.ours), collect(row.c_run, row.c));
        let some = |v: &[Option<f64>]| v.iter().flatten().copied().collect::<Vec<f64>>();
        let ours = spread(&some(&ours_r));
        let theirs = spread(&some(&theirs_r));
        let rt = stats::ratio_ci(&stats::paired(&ours_r, &theirs_r));
        match stats::judge(rt, TARGET) {
            Verdict::Met => {}
            Verdict::Missed => missed += 1,
            Verdict::Undecided | Verdict::NoData => undecided += 1,
        }
        let mm = |s: Option<super::Spread>| {
            s.map_or_else(
                || "-".to_owned(),
                |s| format!("{:.1}–{:.1} (n={})", s.min, s.max, s.n),
            )
        };
        table_rows.push(vec![
            row.what.to_owned(),
            num(ours.map(|s| s.median), 1),
            mm(ours),
            row.c_label.to_owned(),
            num(theirs.map(|s| s.median), 1),
            mm(theirs),
            stats::with_ci(rt, 3),
            stats::verdict_text(rt, TARGET),
        ]);
    }
    let failed = failed_runs(dir);
    let mut md = String::new();
    let _ = writeln!(
        md,
        "rdma-demo against the C programs it replaces, rxe0 (server) ↔ rxe1 (client), separate \
         server and client processes for every program, in one 6.1 guest boot, {rounds} \
         alternating rounds. Ping-pong and WRITE/READ use {SIZE}-byte messages; {ITER_POLL} \
         iterations in polling mode, {ITER_EVENT} in event mode (a wake-up per completion is \
         slow under TCG), {ITER_ONE_SIDED} for the one-sided and atomic runs. Latencies in µs; \
         ratio = the median over the rounds where both ran of ours / C in that round, with \
         its exact 95 % confidence interval (order statistics of the per-round ratios; fewer \
         than {min_n} rounds give none); target ≤ {TARGET}: met when the whole interval is at \
         or below it, MISSED when the whole interval is above it, undecided when it spans it.\n",
        min_n = stats::MIN_N
    );
    md.push_str(&table(
        &[
            "figure",
            "rdma-demo",
            "min–max",
            "C program",
            "C",
            "min–max",
            "ratio [95 % CI]",
            "goal",
        ],
        &table_rows,
    ));
    md.push_str(
        "\nNotes: `ibv_rc_pingpong` reports only the mean time per iteration, so that row \
         compares means (total time / iterations, with TCG's long tails); the other rows \
         compare medians. The WRITE row compares like with like: `rdma-demo write-pingpong` \
         measures what `ib_write_lat` does, a ping-pong of RDMA WRITEs with both sides \
         polling memory, halved. (`rdma-demo write-read` times one WRITE from post to its \
         completion, the responder's ACK, which no perftest tool reports.) So do the atomic \
         rows: `rdma-demo atomic --repeat faa|cas` repeats one atomic on one 8-byte word, \
         each timed post → completion, as `ib_atomic_lat` does (plain `atomic` runs lock \
         rounds of five atomics on three words).\n",
    );
    let _ = writeln!(
        md,
        "\n{} of {} rows met, {missed} MISSED, {undecided} undecided or without data.",
        table_rows.len() - missed - undecided,
        table_rows.len()
    );
    Section::new(
        "rdma-demo vs the C tools (`cargo xtask bench demo`)",
        md,
        dir,
        &failed,
    )
}

/// `r<round>-<name> (client c, server s)` of the runs whose client or server failed.
fn failed_runs(dir: &Path) -> Vec<String> {
    super::failed_runs(dir, |f| {
        let [round, name, c, s, ..] = *f else {
            return None;
        };
        (c != "0" || s != "0").then(|| format!("r{round}-{name} (client {c}, server {s})"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rc_pingpong_output() {
        let t = "  local address:  LID 0x0000, QPN 0x000011\n\
                 8192000 bytes in 0.55 seconds = 118.95 Mbit/sec\n\
                 1000 iters in 0.55 seconds = 551.52 usec/iter\n";
        assert_eq!(parse_usec_per_iter(t), Some(551.52));
        assert_eq!(parse_usec_per_iter("no figure"), None);
    }

    #[test]
    fn perftest_output() {
        let t = "---\n #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] \n \
                 4096    1000          160.99         30426.27      345.63   \t       2854.80     \t3224.76\t\t12721.11 \t\t30426.27\n---\n";
        assert_eq!(parse_perftest_typical(t), Some(345.63));
        assert_eq!(parse_perftest_typical(" #bytes t_typical[usec]\n"), None);
        assert_eq!(parse_perftest_typical(""), None);
    }

    #[test]
    fn every_row_names_runs_that_exist() {
        let names: Vec<&str> = runs().iter().map(|r| r.name).collect();
        for row in rows() {
            assert!(names.contains(&row.ours_run), "{}", row.ours_run);
            assert!(names.contains(&row.c_run), "{}", row.c_run);
        }
        assert!(
            runs()
                .iter()
                .filter(|r| r.name.ends_with("-ours"))
                .all(|r| r.client.contains("--json $R/$N.json"))
        );
    }

    #[test]
    fn atomic_rows_time_one_repeated_atomic_as_ib_atomic_lat() {
        let runs = runs();
        for (what, op, tool_op) in [
            ("Fetch-and-Add", "--repeat faa", "-A FETCH_AND_ADD"),
            ("Compare-and-Swap", "--repeat cas", "-A CMP_AND_SWAP"),
        ] {
            let row = rows()
                .into_iter()
                .find(|r| r.what.starts_with(what))
                .unwrap();
            let run = |name| runs.iter().find(|r| r.name == name).unwrap();
            let (ours, c) = (run(row.ours_run), run(row.c_run));
            assert!(
                ours.server.contains(op) && ours.client.contains(op),
                "{}",
                ours.client
            );
            assert!(c.client.contains(tool_op), "{}", c.client);
        }
    }

    #[test]
    fn script_alternates_and_records_every_run() {
        let s = script(1, 2);
        let n = runs().len();
        assert_eq!(s.matches(">> $R/runs.csv").count(), 2 * n);
        let first = s.find("N=r1-pp-poll-ours").unwrap();
        let first_c = s.find("N=r1-at-cas").unwrap();
        assert!(first < first_c);
        let second = s.find("N=r2-pp-poll-ours").unwrap();
        let second_c = s.find("N=r2-at-cas").unwrap();
        assert!(second_c < second, "round 2 runs in reverse order");
    }

    #[test]
    fn report_from_results() {
        let dir = std::env::temp_dir().join(format!("xtask-bench-demo-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let json = |rtt: f64| {
            format!(
                r#"{{"reports":[{{"role":"client","totals":{{"avg_latency_us":{rtt}}},"one_way_us":{{"t_typical":{}}}}},{{"role":"server"}}]}}"#,
                rtt / 2.0
            )
        };
        for (r, ours, c) in [
            (1, 100.0, 100.0),
            (2, 110.0, 100.0),
            (3, 90.0, 100.0),
            (4, 105.0, 100.0),
            (5, 95.0, 100.0),
            (6, 100.0, 100.0),
        ] {
            fs::write(dir.join(format!("r{r}-pp-poll-ours.json")), json(ours)).unwrap();
            fs::write(
                dir.join(format!("r{r}-pp-poll-rc.out")),
                format!("1000 iters in 0.1 seconds = {c} usec/iter\n"),
            )
            .unwrap();
        }
        fs::write(
            dir.join("runs.csv"),
            "round,name,client,server,wall_us\n1,pp-poll-ours,0,0,5\n2,at-cas,1,0,5\n",
        )
        .unwrap();
        let s = report(&dir, 6);
        let row = s
            .markdown
            .lines()
            .find(|l| l.contains("ping-pong poll: µs per iteration"))
            .unwrap();
        assert!(
            row.contains("| 100.0 | 90.0–110.0 (n=6) | ibv_rc_pingpong | 100.0 |"),
            "{row}"
        );
        assert!(
            row.contains("| 1.000 [0.900–1.100] | undecided (CI spans the goal"),
            "{row}"
        );
        assert!(s.markdown.contains("r2-at-cas (client 1, server 0)"));
        assert!(
            s.markdown
                .contains("0 of 8 rows met, 0 MISSED, 8 undecided"),
            "{}",
            s.markdown
        );
        let _ = fs::remove_dir_all(&dir);
    }
}

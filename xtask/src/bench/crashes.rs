//! `cargo xtask bench crashes`: does attaching and detaching rdma-trace crash the guest kernel,
//! and under which QEMU? Counts, per emulation setup (the host's QEMU 7.2 or bookworm-backports'
//! 10.0, one TCG thread per vCPU or one for all), the guest kernel deaths over a number of
//! attach/detach cycles of `rdma-trace run --all` while an event-mode ping-pong runs. Odd
//! cycles run one tracer, even cycles two at once (both start-ups, calibrations included, in
//! the same moment). A guest that dies is booted again for the cycles left, up to
//! [`MAX_BOOTS`] boots per setup; each death is listed with its cycle, its kind (one tracer or
//! two) and the first line of its oops.
//!
//! It writes `target/vm-results/bench-crashes.md`; docs/testing.md quotes a run of it.

use std::{
    fmt::Write as _,
    fs,
    time::{Duration, Instant},
};

use anyhow::Result;

use crate::{
    util::{say, target_dir},
    vm::{self, QemuBuild},
};

/// Boots per setup at the most (each death costs one).
const MAX_BOOTS: u32 = 8;
/// Guest time per setup, all boots together.
const SETUP_TIMEOUT: Duration = Duration::from_secs(20 * 60);

/// One emulation setup.
#[derive(Clone, Copy)]
struct Setup {
    qemu: QemuBuild,
    one_tcg_thread: bool,
}

impl Setup {
    /// (results folder part, label) of its QEMU and of its TCG threading.
    fn parts(self) -> [(&'static str, &'static str); 2] {
        [
            match self.qemu {
                QemuBuild::Host => ("qemu7.2", "QEMU 7.2 (bookworm)"),
                QemuBuild::Backports => ("qemu10.0", "QEMU 10.0 (bookworm-backports)"),
            },
            if self.one_tcg_thread {
                ("one-thread", "one TCG thread for both vCPUs")
            } else {
                ("thread-per-vcpu", "one TCG thread per vCPU")
            },
        ]
    }

    fn name(self) -> String {
        let [(q, _), (t, _)] = self.parts();
        format!("crashes-{q}-{t}")
    }

    fn label(self) -> String {
        let [(_, q), (_, t)] = self.parts();
        format!("{q}, {t}")
    }
}

/// What a cycle runs: odd cycles one tracer, even cycles two at once.
fn cycle_kind(cycle: u32) -> &'static str {
    if cycle % 2 == 1 {
        "one tracer"
    } else {
        "two tracers"
    }
}

/// What one setup gave.
struct Outcome {
    setup: Setup,
    cycles_done: u32,
    tracer_runs: u32,
    tracer_failures: u32,
    boots: u32,
    /// (cycle, "one tracer" / "two tracers", the console's line).
    deaths: Vec<(u32, &'static str, String)>,
    /// Oopses the kernel survived: (cycle, the first lines of each).
    oopses: Vec<(u32, String)>,
    /// The guest was stopped at its timeout, or could not go on.
    ended_early: Option<String>,
    secs: f64,
}

/// The guest script for cycles `first..=cycles`: a ping-pong loop in the background, then per
/// cycle one tracer (odd) or two at once (even), each `rdma-trace run --all --duration 1`.
fn script(first: u32, cycles: u32) -> String {
    format!(
        r#"
dmesg -c > /dev/null 2>&1
# The kernel's oopses since the last look: a line `oops N: ...` with the first of its lines.
oopses() {{
    local d
    d=$(dmesg -c 2>/dev/null | grep -E "BUG:|Oops:|general protection|RIP:" | head -3 | tr '\n' ' ')
    [ -n "$d" ] && echo "oops $1: $d"
    return 0
}}
( while :; do rdma-demo pingpong --loopback --port 0 -d rxe1 --server-device rxe0 --mode event -n 100000 > /dev/null 2>&1 || sleep 0.5; done ) &
LOAD=$!
sleep 2
trace() {{
    rdma-trace run --no-tui --all --duration 1 > "$R/last.$1" 2>&1
    local rc=$?
    [ $rc -eq 0 ] || cp "$R/last.$1" "$R/failed.$2.$1"
    return $rc
}}
for i in $(seq {first} {cycles}); do
    echo "== round $i"
    if [ $((i % 2)) -eq 1 ]; then
        trace a $i; echo "cycle $i one: $?"
    else
        trace a $i & A=$!
        trace b $i & B=$!
        wait $A; ra=$?; wait $B; rb=$?
        echo "cycle $i two: $ra $rb"
    fi
    oopses $i
done
echo "== round $(({cycles} + 1))"
kill $LOAD 2>/dev/null
"#
    )
}

/// The oopses the log names (`oops N: LINES`), by cycle.
fn oopses(log: &str) -> Vec<(u32, String)> {
    log.lines()
        .filter_map(|l| {
            let (n, what) = l.strip_prefix("oops ")?.split_once(": ")?;
            Some((n.parse().ok()?, what.trim().to_owned()))
        })
        .collect()
}

/// The last cycle the log says was begun (`== round N`), 0 for none.
fn last_begun(log: &str) -> u32 {
    log.lines()
        .filter_map(|l| l.strip_prefix("== round ")?.trim().parse::<u32>().ok())
        .max()
        .unwrap_or(0)
}

/// Tracer runs and failures in the log's `cycle N one: RC` / `cycle N two: RC RC` lines.
fn tracer_counts(log: &str) -> (u32, u32) {
    let (mut runs, mut failed) = (0, 0);
    for l in log.lines().filter(|l| l.starts_with("cycle ")) {
        let Some((_, codes)) = l.split_once(": ") else {
            continue;
        };
        for c in codes.split_whitespace() {
            runs += 1;
            failed += u32::from(c != "0");
        }
    }
    (runs, failed)
}

fn run_setup(setup: Setup, cycles: u32) -> Result<Outcome> {
    let name = setup.name();
    let dir = target_dir()
        .join("vm-results")
        .join(format!("bench-{name}"));
    let _ = fs::remove_dir_all(&dir);
    let started = Instant::now();
    let deadline = started + SETUP_TIMEOUT;
    let mut first = 1;
    let mut deaths = Vec::new();
    let mut boots = 0;
    let mut ended_early = None;
    while first <= cycles {
        if boots == MAX_BOOTS {
            ended_early = Some(format!("stopped after {MAX_BOOTS} boots"));
            break;
        }
        boots += 1;
        say(format!(
            "{}: boot {boots}, cycles {first}–{cycles}",
            setup.label()
        ));
        let full = format!(
            "{}\n{}",
            super::prelude(&name, first == 1),
            script(first, cycles)
        );
        let end = vm::run_in_guest_to_end(&vm::GuestRun {
            kernel: vm::Kernel::V6_1,
            timeout: deadline.saturating_duration_since(Instant::now()),
            cmd: vec![full],
            profile: "release".into(),
            one_tcg_thread: setup.one_tcg_thread,
            qemu: setup.qemu,
            ..Default::default()
        })?;
        let log = fs::read_to_string(dir.join("log.txt")).unwrap_or_default();
        let begun = last_begun(&log);
        if end.code == 0 {
            first = cycles + 1;
            break;
        }
        if end.code == vm::EXIT_NO_STATUS {
            // The cycle that died is the last one begun; none begun in this boot: it died
            // before its first cycle (at boot, or while the load started).
            let (cycle, kind) = if begun >= first {
                (begun, cycle_kind(begun))
            } else {
                (first, "before its first cycle")
            };
            deaths.push((
                cycle,
                kind,
                end.panic
                    .clone()
                    .unwrap_or_else(|| "no oops on its console".into()),
            ));
            // Go on after the cycle that died.
            first = first.max(begun + 1);
            continue;
        }
        ended_early = Some(if end.code == vm::EXIT_TIMEOUT {
            format!("stopped at its timeout ({} s)", SETUP_TIMEOUT.as_secs())
        } else {
            format!("the guest script ended with status {}", end.code)
        });
        break;
    }
    let log = fs::read_to_string(dir.join("log.txt")).unwrap_or_default();
    let (tracer_runs, tracer_failures) = tracer_counts(&log);
    let oopses = oopses(&log);
    Ok(Outcome {
        setup,
        cycles_done: first.saturating_sub(1).min(cycles),
        tracer_runs,
        tracer_failures,
        boots,
        deaths,
        oopses,
        ended_early,
        secs: started.elapsed().as_secs_f64(),
    })
}

fn markdown(outcomes: &[Outcome], cycles: u32) -> String {
    let mut md = format!(
        "Guest 6.1 (TCG, 2 vCPUs), {cycles} cycles per setup under an event-mode ping-pong: odd \
         cycles one `rdma-trace run --all --duration 1`, even cycles two at once.\n\n\
         | setup | cycles | tracer runs (failed) | boots | kernel deaths | oopses survived | minutes |\n\
         |---|---|---|---|---|---|---|\n"
    );
    for o in outcomes {
        let _ = writeln!(
            md,
            "| {} | {}{} | {} ({}) | {} | {} | {} | {:.1} |",
            o.setup.label(),
            o.cycles_done,
            o.ended_early
                .as_ref()
                .map_or(String::new(), |e| format!(" ({e})")),
            o.tracer_runs,
            o.tracer_failures,
            o.boots,
            o.deaths.len(),
            o.oopses.len(),
            o.secs / 60.0
        );
    }
    for o in outcomes
        .iter()
        .filter(|o| !o.deaths.is_empty() || !o.oopses.is_empty())
    {
        let _ = writeln!(md, "\n{}:", o.setup.label());
        for (cycle, kind, line) in &o.deaths {
            let _ = writeln!(md, "- died in cycle {cycle} ({kind}): `{line}`");
        }
        for (cycle, line) in &o.oopses {
            let _ = writeln!(
                md,
                "- oops in cycle {cycle} ({}): `{line}`",
                cycle_kind(*cycle)
            );
        }
    }
    md
}

/// `per_vcpu_only`: leave out the setups with one TCG thread for both vCPUs; `only`: one QEMU.
pub fn run(cycles: u32, per_vcpu_only: bool, only: Option<QemuBuild>) -> Result<()> {
    let mut outcomes = Vec::new();
    let threads: &[bool] = if per_vcpu_only {
        &[false]
    } else {
        &[false, true]
    };
    for qemu in [QemuBuild::Host, QemuBuild::Backports] {
        if only.is_some_and(|o| o != qemu) {
            continue;
        }
        for &one_tcg_thread in threads {
            outcomes.push(run_setup(
                Setup {
                    qemu,
                    one_tcg_thread,
                },
                cycles,
            )?);
        }
    }
    let md = markdown(&outcomes, cycles);
    let dest = target_dir().join("vm-results").join("bench-crashes.md");
    fs::write(&dest, &md)?;
    println!("\n## Guest kernel deaths while rdma-trace attaches and detaches\n\n{md}");
    say(format!("written to {}", dest.display()));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tracer_runs_and_failures_come_from_the_cycle_lines() {
        let log = "== round 1\ncycle 1 one: 0\n== round 2\ncycle 2 two: 0 1\n== round 3\n";
        assert_eq!(tracer_counts(log), (3, 1));
        assert_eq!(last_begun(log), 3);
        assert_eq!(last_begun("booting\n"), 0);
        assert_eq!(
            oopses(
                "cycle 4 two: 137 137\noops 4: BUG: kernel NULL pointer dereference RIP: 0010:0x0\n"
            ),
            vec![(
                4,
                "BUG: kernel NULL pointer dereference RIP: 0010:0x0".to_owned()
            )]
        );
    }

    #[test]
    fn the_script_alternates_one_and_two_tracers_and_marks_each_cycle() {
        let s = script(3, 50);
        assert!(s.contains("seq 3 50"), "{s}");
        assert!(s.contains("echo \"== round $i\""), "{s}");
        assert!(s.contains("== round $((50 + 1))"), "{s}");
        assert!(!s.contains("{{"), "{s}");
    }
}

//! `cargo xtask test`: every test layer, in order, with a summary at the end.
//!
//! Layers: `cargo fmt --check`; the eBPF object; clippy `-D warnings` on all targets, including
//! the `host` and `guest` test targets; unit and CLI tests (`cargo test`); host eBPF tests (the
//! `host` targets; root); guest tests (the `guest` targets) inside the QEMU test bed on Debian
//! 6.1 (all) and 6.12 (the part [`kernel_suite`] names), and on each the `--enforce` test in a
//! boot of its own with one TCG thread ([`ENFORCE_TEST`]) and the cross-checks against bpftrace
//! in a boot of the bench image ([`CROSSCHECK_TESTS`]); the main job (`cargo xtask run`)
//! driven in tmux: live view up, `q` quits. A layer is skipped only when a flag asks for it, and
//! the summary says so. A layer of tests that ran no test fails; the summary gives the number of
//! tests each one ran.

use std::{
    io::{BufRead, BufReader},
    path::PathBuf,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use crate::{
    build_ebpf, setup,
    util::{describe, is_root, root, say, target_dir},
    vm,
};

#[derive(clap::Args)]
pub struct Args {
    /// Skip the host eBPF tests (they need root).
    #[arg(long)]
    skip_host: bool,
    /// Skip the guest tests (they boot QEMU guests, ~1 min each under TCG).
    #[arg(long)]
    skip_guest: bool,
    /// Guest kernels to test (default: all).
    #[arg(long = "kernel", value_enum)]
    kernels: Vec<vm::Kernel>,
}

/// What one layer did.
struct Step {
    name: String,
    outcome: Outcome,
    secs: f64,
    /// `test result:` lines of the test runners it ran.
    summaries: Vec<String>,
    /// Tests run (passed or failed), for layers of tests.
    tests: Option<u64>,
}

enum Outcome {
    Passed,
    Failed(String),
    Skipped(String),
}

pub fn run(args: &Args) -> Result<()> {
    let t0 = Instant::now();
    setup::ensure()?;
    let mut steps: Vec<Step> = Vec::new();

    step(&mut steps, "fmt", || {
        cargo(&["fmt", "--all", "--", "--check"])
    });
    step(&mut steps, "build-ebpf", || {
        build_ebpf::run(&build_ebpf::Args { release: false }).map(|_| Vec::new())
    });
    let special = special_test_targets()?;
    step(&mut steps, "clippy", || {
        let mut summaries = cargo(&["clippy", "--all-targets", "--", "-D", "warnings"])?;
        for (package, target) in &special {
            summaries.extend(cargo(&[
                "clippy", "-p", package, "--test", target, "--", "-D", "warnings",
            ])?);
        }
        // The eBPF crate, for its own target with its own toolchain (as build-ebpf builds it).
        build_ebpf::clippy()?;
        Ok(summaries)
    });
    test_step(&mut steps, "unit and CLI tests", || cargo(&["test"]));

    let host: Vec<_> = special.iter().filter(|(_, t)| t == "host").collect();
    if args.skip_host {
        skip(&mut steps, "host eBPF tests", "--skip-host was given");
    } else {
        test_step(&mut steps, "host eBPF tests", || {
            if !is_root() {
                bail!("the host eBPF tests load BPF programs: run as root, or pass --skip-host");
            }
            let mut summaries = Vec::new();
            for (package, target) in &host {
                let s = cargo(&["test", "-p", package, "--test", target])?;
                if tests_run(&s) == 0 {
                    bail!("{package}/{target} ran no test");
                }
                summaries.extend(s);
            }
            Ok(summaries)
        });
    }

    if args.skip_guest {
        skip(&mut steps, "guest tests", "--skip-guest was given");
    } else {
        let guest: Vec<_> = special.iter().filter(|(_, t)| t == "guest").collect();
        let smoke: Vec<_> = special.iter().filter(|(_, t)| t == "smoke").collect();
        let mut executables = Vec::new();
        let mut smoke_executables = Vec::new();
        step(&mut steps, "build for the guest", || {
            cargo(&["build"])?;
            for (package, target) in &guest {
                executables.push(test_executable(package, target)?);
            }
            for (package, target) in &smoke {
                smoke_executables.push(test_executable(package, target)?);
            }
            Ok(Vec::new())
        });
        let first = kernel_rows(&args.kernels)
            .into_iter()
            .find_map(|(k, left_out)| left_out.is_none().then_some(k));
        if let Some(kernel) = first {
            let name = format!("a kernel panic resumes ({})", kernel.name());
            test_step(&mut steps, &name, || resume_after_a_panic(kernel));
        }
        for (kernel, not_selected) in kernel_rows(&args.kernels) {
            if !full_suite(kernel) {
                // The other kernels: the smoke suite only (CI time), one boot.
                let name = format!("smoke tests on {}", kernel.name());
                if let Some(why) = not_selected {
                    skip(&mut steps, &name, &why);
                } else if smoke_executables.is_empty() || smoke_executables.len() != smoke.len() {
                    skip(&mut steps, &name, "the smoke suite's build failed");
                } else {
                    test_step(&mut steps, &name, || {
                        guest_tests(kernel, &smoke_executables, "smoke")
                    });
                }
                continue;
            }
            let name = format!("guest tests on {}", kernel.name());
            if let Some(why) = not_selected {
                skip(&mut steps, &name, &why);
                continue;
            }
            if executables.len() != guest.len() {
                skip(&mut steps, &name, "the guest build failed");
                continue;
            }
            let suite = kernel_suite(kernel);
            let name = match suite {
                Suite::Every => name,
                Suite::Part(modules) => format!("{name} ({})", modules.join(" ")),
            };
            test_step(&mut steps, &name, || {
                let selected = executables
                    .iter()
                    .zip(&guest)
                    .map(|(exe, (package, _))| {
                        Ok(match suite {
                            Suite::Part(modules) if package == "rdma-trace" => {
                                select_tests(exe, modules)?
                            }
                            _ => Vec::new(),
                        })
                    })
                    .collect::<Result<Vec<_>>>()?;
                guest_tests_of(kernel, &executables, &selected, "test")
            });
            let trace = guest
                .iter()
                .position(|(package, _)| package == "rdma-trace")
                .and_then(|i| executables.get(i));
            let name = format!("--enforce on {} (1 TCG thread)", kernel.name());
            match trace {
                Some(exe) => test_step(&mut steps, &name, || enforce_test(kernel, exe)),
                None => skip(&mut steps, &name, "no rdma-trace guest test executable"),
            }
            let name = format!("bpftrace cross-check on {}", kernel.name());
            match trace {
                Some(exe) => test_step(&mut steps, &name, || crosscheck_test(kernel, exe)),
                None => skip(&mut steps, &name, "no rdma-trace guest test executable"),
            }
        }
    }

    let tarball = "the release tarball in the 6.1 guest";
    if args.skip_guest {
        skip(&mut steps, tarball, "--skip-guest was given");
    } else if let Some((_, Some(why))) = kernel_rows(&args.kernels)
        .into_iter()
        .find(|(k, _)| *k == vm::Kernel::V6_1)
    {
        skip(&mut steps, tarball, &why);
    } else {
        step(&mut steps, tarball, tarball_in_guest);
    }

    if args.skip_guest {
        skip(&mut steps, "main job in tmux", "--skip-guest was given");
    } else {
        step(&mut steps, "main job in tmux", live_view_in_tmux);
    }

    println!(
        "\n===== cargo xtask test: summary ({:.0} s) =====",
        t0.elapsed().as_secs_f64()
    );
    let mut failed = 0;
    for s in &steps {
        let (mark, detail) = match &s.outcome {
            Outcome::Passed => ("PASS", String::new()),
            Outcome::Failed(why) => {
                failed += 1;
                ("FAIL", format!(": {why}"))
            }
            Outcome::Skipped(why) => ("SKIP", format!(": {why}")),
        };
        let tests = s.tests.map_or(String::new(), |n| format!(", {n} tests"));
        println!("{mark} {:<28} {:>6.1} s{tests}{detail}", s.name, s.secs);
        for line in &s.summaries {
            println!("       {line}");
        }
    }
    if failed > 0 {
        bail!("{failed} test layer(s) failed");
    }
    Ok(())
}

fn step(steps: &mut Vec<Step>, name: &str, f: impl FnOnce() -> Result<Vec<String>>) {
    say(format!("=== {name}"));
    let t = Instant::now();
    let (outcome, summaries) = match f() {
        Ok(s) => (Outcome::Passed, s),
        Err(e) => {
            eprintln!("[xtask] {name} failed: {e:#}");
            (Outcome::Failed(format!("{e:#}")), Vec::new())
        }
    };
    steps.push(Step {
        name: name.to_owned(),
        outcome,
        secs: t.elapsed().as_secs_f64(),
        summaries,
        tests: None,
    });
}

/// The kernels that get the guest suites (and the `--enforce` boot); the others get the smoke
/// suite (`rdma-trace/tests/smoke.rs`), which keeps `cargo xtask test` within its time.
fn full_suite(kernel: vm::Kernel) -> bool {
    matches!(kernel, vm::Kernel::V6_1 | vm::Kernel::V6_12)
}

/// What of `rdma-trace`'s guest suite a kernel runs.
#[derive(Clone, Copy)]
enum Suite {
    /// Every test.
    Every,
    /// The tests of these modules (and top-level tests of these names) only.
    Part(&'static [&'static str]),
}

/// 6.1 runs every guest test. 6.12 runs the tests whose truth depends on the kernel: the
/// waterfall (BTF offsets, `sched_switch`'s task state, rxe's workqueue), its ground truth and
/// user-space stamps, the stall doctor, NVMe over RDMA and the drivers' own modules, with one
/// plain run in both modes. The rest (CLI behaviour, cleanup, privileges, `run -- CMD`) is the
/// same code on either kernel; running it twice took CI past 70 minutes.
fn kernel_suite(kernel: vm::Kernel) -> Suite {
    match kernel {
        vm::Kernel::V6_12 => Suite::Part(&[
            "ground_truth",
            "stamps",
            "waterfall",
            "stall",
            "nvme",
            "nfs",
            "guest_drivers",
            "run_both_modes_between_rxe0_and_rxe1",
        ]),
        _ => Suite::Every,
    }
}

/// The tests of `exe` (its `--list`) that `modules` select: every test of a module named
/// there, and a top-level test of that name. Fails when a name selects nothing (a renamed
/// module must not drop its tests silently).
fn select_tests(exe: &std::path::Path, modules: &[&str]) -> Result<Vec<String>> {
    let out = Command::new(exe)
        .args(["--list", "--format", "terse"])
        .output()
        .with_context(|| format!("listing the tests of {}", exe.display()))?;
    if !out.status.success() {
        bail!(
            "{} --list failed: {}",
            exe.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    select_from_list(&String::from_utf8_lossy(&out.stdout), modules)
}

fn select_from_list(list: &str, modules: &[&str]) -> Result<Vec<String>> {
    let tests: Vec<&str> = list
        .lines()
        .filter_map(|l| l.strip_suffix(": test"))
        .collect();
    let mut selected = Vec::new();
    for m in modules {
        let prefix = format!("{m}::");
        let before = selected.len();
        selected.extend(
            tests
                .iter()
                .filter(|t| **t == *m || t.starts_with(&prefix))
                .map(|t| (*t).to_owned()),
        );
        if selected.len() == before {
            bail!(
                "no guest test is named {m} or in a module {m}: xtask/src/test.rs's kernel_suite names it"
            );
        }
    }
    Ok(selected)
}

/// Every guest kernel, with why it is left out when `--kernel` did not select it (an empty
/// selection selects all).
fn kernel_rows(selected: &[vm::Kernel]) -> Vec<(vm::Kernel, Option<String>)> {
    let given: Vec<String> = selected
        .iter()
        .map(|k| format!("--kernel {}", k.name()))
        .collect();
    [
        vm::Kernel::V6_1,
        vm::Kernel::V6_12,
        vm::Kernel::V5_10,
        vm::Kernel::V7,
    ]
    .into_iter()
    .map(|k| {
        let left_out = !selected.is_empty() && !selected.contains(&k);
        (
            k,
            left_out.then(|| format!("not selected ({} was given)", given.join(" "))),
        )
    })
    .collect()
}

/// A layer of tests: as [`step`], with the number of tests it ran; a layer that ran none
/// fails, whatever its runners' status.
fn test_step(steps: &mut Vec<Step>, name: &str, f: impl FnOnce() -> Result<Vec<String>>) {
    step(steps, name, f);
    let s = steps.last_mut().expect("step pushed a row");
    let n = tests_run(&s.summaries);
    match s.outcome {
        Outcome::Passed if n == 0 => {
            eprintln!("[xtask] {name} failed: it ran no test");
            s.outcome = Outcome::Failed("it ran no test".to_owned());
            s.tests = Some(0);
        }
        Outcome::Passed => s.tests = Some(n),
        // A failed layer's error carries its runners' results.
        Outcome::Failed(_) | Outcome::Skipped(_) => {}
    }
}

/// Tests run (passed + failed) according to libtest's `test result:` lines.
fn tests_run(summaries: &[String]) -> u64 {
    let field = |line: &str, word: &str| -> u64 {
        line.split(';')
            .find_map(|part| {
                let mut it = part.split_whitespace().rev();
                (it.next() == Some(word)).then(|| it.next()?.parse().ok())?
            })
            .unwrap_or(0)
    };
    summaries
        .iter()
        .map(|l| field(l, "passed") + field(l, "failed"))
        .sum()
}

fn skip(steps: &mut Vec<Step>, name: &str, why: &str) {
    say(format!("=== {name}: SKIPPED ({why})"));
    steps.push(Step {
        name: name.to_owned(),
        outcome: Outcome::Skipped(why.to_owned()),
        secs: 0.0,
        summaries: Vec::new(),
        tests: None,
    });
}

/// Run cargo in the workspace, echoing its output; return the `test result:` lines.
fn cargo(args: &[&str]) -> Result<Vec<String>> {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.current_dir(root()).args(args).stdout(Stdio::piped());
    let desc = describe(&cmd);
    let mut child = cmd
        .spawn()
        .with_context(|| format!("could not start `{desc}`"))?;
    let stdout = child.stdout.take().context("cargo stdout")?;
    let summaries = echo_summaries(BufReader::new(stdout));
    let status = child
        .wait()
        .with_context(|| format!("waiting for `{desc}`"))?;
    if !status.success() {
        bail!("`{desc}` failed ({status}) {}", summaries.join("; "));
    }
    Ok(summaries)
}

/// Print every line and keep libtest's `test result:` lines.
fn echo_summaries(input: impl BufRead) -> Vec<String> {
    let mut summaries = Vec::new();
    for line in input.lines().map_while(Result::ok) {
        println!("{line}");
        if let Some(pos) = line.find("test result:") {
            summaries.push(line[pos..].to_owned());
        }
    }
    summaries
}

/// `cargo xtask run` (the README's main job) in a tmux window: the live view comes up in the
/// guest with counts, and `q` ends it with status 0.
fn live_view_in_tmux() -> Result<Vec<String>> {
    // `cargo xtask run` builds the release profile first: build it here, outside the time the
    // live view gets to come up (a cold release build alone can take minutes on 2 cores).
    build_ebpf::run(&build_ebpf::Args { release: true })?;
    cargo(&["build", "--release"])?;
    let socket = format!("xtask-test-{}", std::process::id());
    let tmux = |args: &[&str]| -> Result<String> {
        let out = Command::new("tmux")
            .args(["-L", &socket])
            .args(args)
            .output()
            .context("running tmux (cargo xtask setup installs it)")?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    };
    struct KillServer<'a>(&'a dyn Fn(&[&str]) -> Result<String>);
    impl Drop for KillServer<'_> {
        fn drop(&mut self) {
            let _ = (self.0)(&["kill-server"]);
        }
    }
    let exit_file = target_dir().join("vm-results/tmux-main-job.exit");
    let _ = std::fs::remove_file(&exit_file);
    // Through cargo, as the README says: this xtask's own binary may have been rebuilt (and
    // replaced) by the workspace build since it started.
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let script = format!(
        "cd {} && {} xtask run -- -n 1000000; echo $? > {}; sleep 120",
        vm::shell_quote(&root().to_string_lossy()),
        vm::shell_quote(&cargo),
        vm::shell_quote(&exit_file.to_string_lossy())
    );
    tmux(&["new-session", "-d", "-x", "130", "-y", "45", &script])?;
    let _guard = KillServer(&tmux);
    let start = Instant::now();
    let count = loop {
        let screen = tmux(&["capture-pane", "-p"])?;
        let count = screen.lines().find_map(|l| {
            let rest = &l[l.find("rxe_cq_post ")?..];
            rest.split_whitespace().nth(1)?.parse::<u64>().ok()
        });
        // Counts, the completion waterfall pane and the heat map of the selected probe.
        if let Some(n) = count.filter(|&n| n > 0)
            && screen.contains("completion waterfall")
            && screen.contains(" over time (rows")
        {
            break n;
        }
        if start.elapsed() > Duration::from_secs(300) {
            bail!(
                "the live view never showed rxe_cq_post counting with the waterfall pane and the heat map; the screen:\n{screen}"
            );
        }
        std::thread::sleep(Duration::from_secs(2));
    };
    tmux(&["send-keys", "q"])?;
    let start = Instant::now();
    let status = loop {
        if let Ok(s) = std::fs::read_to_string(&exit_file) {
            break s.trim().to_owned();
        }
        if start.elapsed() > Duration::from_secs(120) {
            bail!("`cargo xtask run` did not end after q");
        }
        std::thread::sleep(Duration::from_secs(1));
    };
    if status != "0" {
        // What the command said last (its error, or xtask's) is on the screen: it sleeps there.
        let screen = tmux(&["capture-pane", "-p"]).unwrap_or_default();
        let tail: Vec<&str> = screen.lines().filter(|l| !l.trim().is_empty()).collect();
        bail!(
            "`cargo xtask run` ended with status {status} after q; the screen ends with:\n{}",
            tail[tail.len().saturating_sub(15)..].join("\n")
        );
    }
    Ok(vec![format!(
        "live view in the guest: rxe_cq_post counted {count}, waterfall pane and heat map shown; q ended it with status 0"
    )])
}

/// `(package, target)` for every integration-test target named `host` or `guest`: they have
/// `test = false`, so plain `cargo test` leaves them to this command.
fn special_test_targets() -> Result<Vec<(String, String)>> {
    let out = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .current_dir(root())
        .args(["metadata", "--no-deps", "--format-version", "1"])
        .output()
        .context("running cargo metadata")?;
    if !out.status.success() {
        bail!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let meta: serde_json::Value =
        serde_json::from_slice(&out.stdout).context("parsing cargo metadata")?;
    let mut found = Vec::new();
    for package in meta["packages"].as_array().context("metadata packages")? {
        for target in package["targets"].as_array().into_iter().flatten() {
            let name = target["name"].as_str().unwrap_or_default();
            let is_test = target["kind"]
                .as_array()
                .is_some_and(|k| k.iter().any(|k| k == "test"));
            if is_test && (name == "host" || name == "guest" || name == "smoke") {
                found.push((
                    package["name"].as_str().unwrap_or_default().to_owned(),
                    name.to_owned(),
                ));
            }
        }
    }
    found.sort();
    Ok(found)
}

/// Build test target `target` of `package` and return its executable.
fn test_executable(package: &str, target: &str) -> Result<PathBuf> {
    let out = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .current_dir(root())
        .args([
            "test",
            "-p",
            package,
            "--test",
            target,
            "--no-run",
            "--message-format=json",
        ])
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("building test {package}/{target}"))?;
    if !out.status.success() {
        bail!("building test {package}/{target} failed");
    }
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if msg["reason"] == "compiler-artifact"
            && msg["target"]["name"] == target
            && msg["package_id"].as_str().is_some_and(|id| {
                id.contains(&format!("/{package}#")) || id.contains(&format!("{package} "))
            })
            && let Some(exe) = msg["executable"].as_str()
        {
            return Ok(PathBuf::from(exe));
        }
    }
    bail!("cargo did not report an executable for test {package}/{target}")
}

/// Boots one layer may take: after a boot whose guest kernel panicked, the next one runs only
/// the tests that have not passed yet, as long as each boot gets further than the one before.
/// (One full run had the 6.12 guest die twice of a stray int3 in one layer, the third boot
/// finishing it: patched kernel text that the other TCG vCPU had not seen change.)
const MAX_BOOTS: u32 = 5;

/// Run every guest test executable in one boot of `kernel`; each writes its log to the
/// results folder, which gives the summaries back. A boot whose kernel panicked (under TCG,
/// live kernel-text patching has crashed the guest kernel in rare runs) is followed by one that
/// resumes where it stopped; the summary names every panic with its oops.
fn guest_tests(kernel: vm::Kernel, executables: &[PathBuf], label: &str) -> Result<Vec<String>> {
    let every = vec![Vec::new(); executables.len()];
    guest_tests_of(kernel, executables, &every, label)
}

/// [`guest_tests`], each executable running only the tests named in `selected` (by exact
/// name; none named: all of them).
fn guest_tests_of(
    kernel: vm::Kernel,
    executables: &[PathBuf],
    selected: &[Vec<String>],
    label: &str,
) -> Result<Vec<String>> {
    let results = target_dir()
        .join("vm-results")
        .join(format!("{label}-{}", kernel.name()));
    let _ = std::fs::remove_dir_all(&results);
    std::fs::create_dir_all(&results).with_context(|| format!("creating {}", results.display()))?;
    let n = executables.len();
    // Per executable: its outcome once its runner finished, and the tests that passed in
    // boots that panicked before it finished.
    let mut finished: Vec<Option<SuiteOutcome>> = (0..n).map(|_| None).collect();
    let mut passed_before: Vec<Vec<String>> = vec![Vec::new(); n];
    // Tests that failed in such a boot (they run again in the next one): named in the summary.
    let mut failed_before: Vec<Vec<String>> = vec![Vec::new(); n];
    let mut panics: Vec<String> = Vec::new();
    let mut code = 0;
    for boot_no in 1..=MAX_BOOTS {
        let log_path = |i: usize, suffix: &str| {
            let boot = if boot_no == 1 {
                String::new()
            } else {
                format!(".boot{boot_no}")
            };
            results.join(format!("{i}{boot}{suffix}.log"))
        };
        let pending: Vec<usize> = (0..n).filter(|&i| finished[i].is_none()).collect();
        let mut script = String::from(GUEST_RUNNER);
        for &i in &pending {
            let quote = |p: PathBuf| vm::shell_quote(&p.to_string_lossy());
            script.push_str(&format!(
                "suite {} {} {}{}{}\n",
                vm::shell_quote(&executables[i].to_string_lossy()),
                quote(log_path(i, "")),
                quote(log_path(i, ".rerun")),
                name_args(&selected[i]),
                skip_args(&passed_before[i]),
            ));
        }
        script.push_str("exit $rc\n");
        let end = vm::run_in_guest_to_end(&vm::GuestRun {
            kernel,
            // A safety net against a hung guest, not a speed goal: under TCG the suites take
            // 10-20 min on a quiet 2-core machine, and several times that on a loaded one.
            timeout: Duration::from_secs(2700),
            cmd: vec![script],
            ..Default::default()
        })?;
        code = end.code;
        let mut progress = false;
        for &i in &pending {
            let read =
                |suffix: &str| std::fs::read_to_string(log_path(i, suffix)).unwrap_or_default();
            let (first, rerun) = (read(""), read(".rerun"));
            if end.panic.is_none() || suite_finished(&first, &rerun) {
                finished[i] = Some(suite_outcome(&first, &rerun));
                progress = true;
            } else {
                failed_before[i].extend(tests_that(&first, "FAILED").map(str::to_owned));
                let new = tests_that(&first, "ok").chain(tests_that(&rerun, "ok"));
                let before = passed_before[i].len();
                passed_before[i].extend(new.map(str::to_owned));
                passed_before[i].sort();
                passed_before[i].dedup();
                progress |= passed_before[i].len() > before;
            }
        }
        let Some(digest) = end.panic else { break };
        panics.push(format!(
            "boot {boot_no}: the guest kernel panicked: {digest}"
        ));
        if finished.iter().all(Option::is_some) {
            break;
        }
        if !progress {
            bail!(
                "{}; that boot got no further, so no boot follows",
                panics.join("; ")
            );
        }
        if boot_no == MAX_BOOTS {
            bail!("{}; no boot is left", panics.join("; "));
        }
        say(format!(
            "the {} guest's kernel panicked ({digest}); booting once more for the tests that have not passed",
            kernel.name()
        ));
    }
    let quarantine = Quarantine::load()?;
    // Tests that passed only when run again and are not on the quarantine list: a test that
    // passes on a rerun has not passed.
    let mut not_passed: Vec<String> = Vec::new();
    let mut summaries = Vec::new();
    for (i, exe) in executables.iter().enumerate() {
        let Some(outcome) = &finished[i] else {
            bail!(
                "guest exited with status {code}; {} reported no test result{}",
                exe.display(),
                if panics.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", panics.join("; "))
                }
            );
        };
        let Some(last) = outcome.summaries.last() else {
            bail!(
                "guest exited with status {code}; {} reported no test result",
                exe.display()
            );
        };
        if tests_run(&outcome.summaries) == 0 {
            bail!("{} ran no test in the guest: {last}", exe.display());
        }
        if !passed_before[i].is_empty() {
            summaries.push(format!(
                "{}, in boots whose kernel panicked before its runner finished: {} passed",
                exe.file_name().unwrap_or_default().to_string_lossy(),
                passed_before[i].len()
            ));
        }
        failed_before[i].retain(|t| !passed_before[i].contains(t));
        if !failed_before[i].is_empty() {
            summaries.push(format!(
                "{}: failed in a boot whose kernel then panicked, and ran again after it: {}",
                exe.file_name().unwrap_or_default().to_string_lossy(),
                failed_before[i].join(", ")
            ));
        }
        summaries.extend(outcome.summaries.iter().cloned());
        if !outcome.slowest.is_empty() {
            summaries.push(format!(
                "{} slowest: {}",
                exe.file_name().unwrap_or_default().to_string_lossy(),
                outcome
                    .slowest
                    .iter()
                    .map(|(t, secs)| format!("{t} {secs:.0} s"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        if !outcome.passed_again.is_empty() {
            let (known, unknown) = quarantine.split(&outcome.passed_again);
            let line = format!(
                "{}: {} test(s) failed or hung in the first run and passed when run again: {}",
                exe.file_name().unwrap_or_default().to_string_lossy(),
                outcome.passed_again.len(),
                outcome
                    .passed_again
                    .iter()
                    .map(|t| match known.iter().find(|(k, _)| k == t) {
                        Some((_, why)) => format!("{t} (quarantined: {why})"),
                        None => t.clone(),
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            say(&line);
            summaries.push(line);
            not_passed.extend(unknown);
        }
    }
    let all_passed = finished.iter().flatten().all(|o| {
        o.summaries
            .last()
            .is_some_and(|l| l.starts_with("test result: ok"))
    });
    // Every summary line and every panic, for a failure's message.
    let everything = || {
        summaries
            .iter()
            .chain(&panics)
            .cloned()
            .collect::<Vec<_>>()
            .join("; ")
    };
    if !not_passed.is_empty() {
        bail!(
            "guest tests passed only when run again, and are not on the quarantine list ({QUARANTINE}): {}; {}",
            not_passed.join(", "),
            everything()
        );
    }
    // A kernel that panicked after the last runner finished leaves no status: the runners'
    // own results decide then.
    if (code != 0 && code != vm::EXIT_NO_STATUS) || !all_passed {
        bail!("guest tests failed (status {code}): {}", everything());
    }
    summaries.extend(panics);
    Ok(summaries)
}

/// The checked-in list of guest tests known to fail now and then, each with the reason
/// (`NAME: WHY` a line, `#` comments). One of them passing only when run again does not fail
/// its layer; any other test that does, fails it.
const QUARANTINE: &str = "xtask/quarantine.txt";

struct Quarantine(Vec<(String, String)>);

impl Quarantine {
    fn load() -> Result<Self> {
        let path = crate::util::root().join(QUARANTINE);
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        Self::parse(&text).with_context(|| format!("in {}", path.display()))
    }

    fn parse(text: &str) -> Result<Self> {
        let mut out = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            // Test names hold `::`: the name ends at the first `: `.
            match line.split_once(": ") {
                Some((name, why)) if !name.trim().is_empty() && !why.trim().is_empty() => {
                    out.push((name.trim().to_owned(), why.trim().to_owned()))
                }
                _ => bail!("line {}: `TEST: REASON` expected, got {line:?}", n + 1),
            }
        }
        Ok(Self(out))
    }

    /// `tests` split into the quarantined ones (with their reasons) and the others.
    fn split(&self, tests: &[String]) -> (Vec<(String, String)>, Vec<String>) {
        let mut known = Vec::new();
        let mut unknown = Vec::new();
        for t in tests {
            match self.0.iter().find(|(name, _)| name == t) {
                Some((name, why)) => known.push((name.clone(), why.clone())),
                None => unknown.push(t.clone()),
            }
        }
        (known, unknown)
    }
}

/// The test bed's own check of `guest_tests`' resume: a stand-in test executable passes one
/// test, then crashes the guest kernel (sysrq); the second boot must skip that test, run the
/// other, and the summary must name the panic.
fn resume_after_a_panic(kernel: vm::Kernel) -> Result<Vec<String>> {
    let dir = target_dir().join("vm-results").join("resume-fixture");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let exe = dir.join("panics-once");
    std::fs::write(&exe, PANICS_ONCE).with_context(|| format!("writing {}", exe.display()))?;
    std::fs::set_permissions(&exe, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .with_context(|| format!("making {} executable", exe.display()))?;
    let summaries = guest_tests(kernel, &[exe], "resume")?;
    let has = |what: &str| summaries.iter().any(|l| l.contains(what));
    if !has("boot 1: the guest kernel panicked: ") || !has("sysrq triggered crash") {
        bail!("the summary does not name the first boot's panic: {summaries:?}");
    }
    if !has("panicked before its runner finished: 1 passed")
        || !has("test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 1 filtered out")
    {
        bail!("the second boot did not resume after the passed test: {summaries:?}");
    }
    Ok(summaries)
}

/// A stand-in libtest executable for `resume_after_a_panic`: without `--skip resume::first` it
/// passes that test and crashes the kernel; with it, it passes the other one.
const PANICS_ONCE: &str = r#"#!/bin/sh
case " $* " in
  *" --exact --skip resume::first "*)
    echo "test resume::second ... ok"
    echo "test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 1 filtered out; finished in 0.00s" ;;
  *)
    echo "test resume::first ... ok"
    sleep 1
    echo c > /proc/sysrq-trigger
    sleep 60 ;;
esac
"#;

/// The tests to run, by exact name (the runner adds `--exact`); none: all.
fn name_args(names: &[String]) -> String {
    names
        .iter()
        .map(|t| format!(" {}", vm::shell_quote(t)))
        .collect()
}

/// `--skip NAME` for each test that already passed (the runner adds `--exact`).
fn skip_args(passed: &[String]) -> String {
    passed
        .iter()
        .map(|t| format!(" --skip {}", vm::shell_quote(t)))
        .collect()
}

/// The tests whose libtest line (`test NAME ... RESULT`) in `log` ends with `result` (`ok`,
/// `FAILED`).
fn tests_that<'a>(log: &'a str, result: &'a str) -> impl Iterator<Item = &'a str> {
    log.lines()
        .filter_map(result_line)
        .filter(move |(_, r, _)| *r == result)
        .map(|(name, _, _)| name)
}

/// A libtest result line's test, result and time (`--report-time`: `test a ... ok <1.250s>`).
fn result_line(line: &str) -> Option<(&str, &str, Option<f64>)> {
    let (rest, secs) = without_time(line);
    let (name, result) = rest.strip_prefix("test ")?.split_once(" ... ")?;
    Some((name, result, secs))
}

/// A result line without its time (`--report-time`: `test a ... ok <1.250s>`), and that time.
fn without_time(line: &str) -> (&str, Option<f64>) {
    let Some((rest, time)) = line.rsplit_once(" <") else {
        return (line, None);
    };
    match time.strip_suffix("s>").map(str::parse::<f64>) {
        Some(Ok(secs)) => (rest, Some(secs)),
        _ => (line, None),
    }
}

/// The `n` tests that took longest in `logs` (from their result lines' times), longest first.
fn slowest(logs: &[&str], n: usize) -> Vec<(String, f64)> {
    let mut times: Vec<(String, f64)> = logs
        .iter()
        .flat_map(|log| log.lines())
        .filter_map(|l| {
            let (name, _, secs) = result_line(l)?;
            Some((name.to_owned(), secs?))
        })
        .collect();
    times.sort_by(|a, b| b.1.total_cmp(&a.1));
    times.truncate(n);
    times
}

/// Whether a runner ended: its first run passed, or its second run (of the tests that did not
/// pass) printed its result.
fn suite_finished(first: &str, rerun: &str) -> bool {
    first.lines().any(|l| l.starts_with("test result: ok"))
        || rerun.lines().any(|l| l.starts_with("test result:"))
}

/// Runs `boot`, and once more when its guest kernel panicked (it ended without a status; the
/// summary names its oops): under TCG, live kernel-text patching (kprobes attached and
/// detached while traffic runs) has crashed the guest kernel in rare runs. A second panic
/// fails. Returns the last boot's status and, after a second boot, the line the summary adds.
fn boot_again_after_a_panic(
    what: &str,
    boot: impl Fn() -> Result<vm::GuestEnd>,
) -> Result<(i32, Option<String>)> {
    let end = boot()?;
    let Some(digest) = end.panic else {
        return Ok((end.code, None));
    };
    say(format!(
        "{what}'s kernel panicked ({digest}); running it once more"
    ));
    let again = boot()?;
    if let Some(second) = again.panic {
        bail!("{what}'s kernel panicked twice: {digest}; then {second}");
    }
    Ok((
        again.code,
        Some(format!(
            "the first boot's kernel panicked ({digest}); this is the second boot"
        )),
    ))
}

/// The guest test of `--overhead-budget 1 --enforce`, which detaches kprobes while the demo's
/// traffic runs. It is `#[ignore]`d in the suites' boots: under TCG with a host thread per vCPU,
/// kernel text one vCPU patches while the other runs it has crashed the 6.1 guest kernel (the
/// other vCPU is suspected to have run a stale translation of the patched text). Here it runs
/// alone, in a boot whose vCPUs share one TCG thread, where a patch is seen at once.
pub const ENFORCE_TEST: &str =
    "budget::run_over_a_tight_budget_with_enforce_drops_probes_and_says_which";

fn enforce_test(kernel: vm::Kernel, exe: &std::path::Path) -> Result<Vec<String>> {
    let run = vm::GuestRun {
        kernel,
        timeout: Duration::from_secs(900),
        one_tcg_thread: true,
        ..Default::default()
    };
    tests_in_their_own_boot(exe, &[ENFORCE_TEST], "enforce", "--enforce", run)
}

/// The guest tests that hold the completion waterfall against bpftrace, a second tracer run
/// at the same time. They are `#[ignore]`d in the suites' boots, whose image has no bpftrace;
/// here they run in a boot of the bench image (the test bed plus bpftrace and bpftool).
pub const CROSSCHECK_TESTS: &[&str] = &[
    "crosscheck::handler_to_read_per_thread_agrees_with_bpftrace",
    "crosscheck::already_awake_split_agrees_with_bpftraces_switch_log_under_a_cpu_hog",
];

fn crosscheck_test(kernel: vm::Kernel, exe: &std::path::Path) -> Result<Vec<String>> {
    let run = vm::GuestRun {
        kernel,
        timeout: Duration::from_secs(600),
        bench: true,
        mem_mib: 3072,
        ..Default::default()
    };
    tests_in_their_own_boot(exe, CROSSCHECK_TESTS, "crosscheck", "bpftrace", run)
}

/// Runs the ignored guest tests `tests` of `exe` alone in a boot of their own (`run`, whose
/// command this sets), booted once more after a kernel panic; `label` names its results
/// folder, `what` the boot in messages. Fails unless exactly those tests ran and passed.
fn tests_in_their_own_boot(
    exe: &std::path::Path,
    tests: &[&str],
    label: &str,
    what: &str,
    mut run: vm::GuestRun,
) -> Result<Vec<String>> {
    let kernel = run.kernel;
    let results = target_dir()
        .join("vm-results")
        .join(format!("{label}-{}", kernel.name()));
    let _ = std::fs::remove_dir_all(&results);
    std::fs::create_dir_all(&results).with_context(|| format!("creating {}", results.display()))?;
    let log = results.join(format!("{label}.log"));
    run.cmd = vec![format!(
        "{} --ignored --exact {} --test-threads=1 2>&1 | tee {}\nexit ${{PIPESTATUS[0]}}\n",
        vm::shell_quote(&exe.to_string_lossy()),
        tests.join(" "),
        vm::shell_quote(&log.to_string_lossy()),
    )];
    let boot = || vm::run_in_guest_to_end(&run);
    let (code, reran) =
        boot_again_after_a_panic(&format!("the {} {what} guest", kernel.name()), boot)?;
    let out = std::fs::read_to_string(&log).unwrap_or_default();
    let mut summaries = suite_outcome(&out, "").summaries;
    if code != 0 || tests_run(&summaries) != tests.len() as u64 {
        bail!(
            "the {what} guest tests failed (status {code}): {}",
            summaries.join("; ")
        );
    }
    summaries.extend(reran);
    Ok(summaries)
}

/// A host with a real NIC and no test bed, played by the 6.1 guest: `cargo xtask dist`'s
/// tarball unpacked under /tmp, a PATH without the workspace's binaries, and from there
/// `rdma-trace --version`, `probes` and `run -- ibv_rc_pingpong -e` (its server started beside
/// it). The truth is the pair's own traffic: 200 iterations in event mode, which the client
/// must be seen reading as completion events.
fn tarball_in_guest() -> Result<Vec<String>> {
    const ITERS: u64 = 200;
    let tarball = crate::dist::run(&crate::dist::Args { no_zig: false })?;
    let results = target_dir().join("vm-results").join("tarball-6.1");
    let _ = std::fs::remove_dir_all(&results);
    std::fs::create_dir_all(&results).with_context(|| format!("creating {}", results.display()))?;
    let script = tarball_script(&tarball, &results, ITERS);
    let end = vm::run_in_guest_to_end(&vm::GuestRun {
        kernel: vm::Kernel::V6_1,
        timeout: Duration::from_secs(600),
        cmd: vec![script],
        ..Default::default()
    })?;
    let read = |f: &str| std::fs::read_to_string(results.join(f)).unwrap_or_default();
    if end.code != 0 {
        bail!(
            "the tarball's run failed in the guest (status {}): {}",
            end.code,
            read("run.txt").lines().last().unwrap_or("no output")
        );
    }
    let version = read("version.txt");
    if !version.contains("eBPF object") {
        bail!("`rdma-trace --version` names no eBPF object build id: {version}");
    }
    if !read("probes.txt")
        .lines()
        .any(|l| l.starts_with("ib_uverbs_comp_handler") && l.contains("kprobe"))
    {
        bail!("`rdma-trace probes` from the tarball plans no kprobe on ib_uverbs_comp_handler");
    }
    let doc: serde_json::Value = serde_json::from_str(&read("run.json"))
        .with_context(|| format!("the JSON report in {}", results.display()))?;
    let phase = &doc["phases"][0];
    let read_events: u64 = phase["processes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["comm"] == "ibv_rc_pingpong")
        .filter_map(|p| p["completion_events_read"].as_u64())
        .sum();
    if phase["completion_mode"] != "completion events" || read_events < ITERS / 2 {
        bail!(
            "the tarball's rdma-trace saw {read_events} completion events read for {ITERS} \
             event-mode iterations (completion mode {})",
            phase["completion_mode"]
        );
    }
    Ok(vec![format!(
        "{}: run -- ibv_rc_pingpong -e read {read_events} completion events",
        version.trim()
    )])
}

/// The guest's script for [`tarball_in_guest`]: unpack `tarball`, write what it shows to `out`.
fn tarball_script(tarball: &std::path::Path, out: &std::path::Path, iters: u64) -> String {
    let q = |p: &std::path::Path| vm::shell_quote(&p.to_string_lossy());
    format!(
        r#"set -e
# The guest's PATH starts with the workspace's binaries: drop them, as on a host without it.
export PATH=${{PATH#*:}}
! command -v rdma-trace > /dev/null || {{ echo "the test bed's rdma-trace is on PATH"; exit 98; }}
d=/tmp/dist.$$; mkdir "$d"
tar xzf {tarball} -C "$d"
cd "$d"/rdma-trace-*
sha256sum -c SHA256SUMS > /dev/null
./rdma-trace --version > {out}/version.txt
./rdma-trace probes > {out}/probes.txt
g=$RXE_GID_INDEX
timeout 180 ibv_rc_pingpong -d rxe1 -g $g -n {iters} -p 18790 -e > /dev/null & s=$!
i=0; until grep -q ':{port:04X} 00000000:0000 0A' /proc/net/tcp; do i=$((i+1)); [ $i -gt 600 ] && exit 99; sleep 0.1; done
./rdma-trace run --no-tui --json {out}/run.json -- timeout 180 ibv_rc_pingpong -d rxe0 -g $g -n {iters} -p 18790 -e 10.9.0.2 > {out}/run.txt 2>&1
wait $s
"#,
        tarball = q(tarball),
        out = q(out),
        port = 18790,
    )
}

/// The guest's test runner (sh). `suite EXE LOG RERUN_LOG` runs one test executable, its log
/// streaming to the console (so a hang shows its test). A watchdog stops a runner in which no
/// test has finished for `IDLE` seconds (a hung test), with the programs the tests spawn. When the
/// runner fails or is stopped, the tests that did not pass run once more, in the same boot; the
/// host's summary names them. A second failure fails the suite.
const GUEST_RUNNER: &str = r#"rc=0
IDLE=600
watchdog() { # log exe
  last=-1; idle=0
  while sleep 10; do
    n=$(wc -c < "$1")
    if [ "$n" = "$last" ]; then idle=$((idle + 10)); else idle=0; last=$n; fi
    if [ $idle -ge $IDLE ]; then
      echo "== no test finished for $IDLE s: stopping the runner and what it spawned" >> "$1"
      pkill -9 -f "^$2"; pkill -9 rdma-trace; pkill -9 rdma-demo
      pkill -9 ibv_rc_pingpong; pkill -9 ib_send_lat; pkill -9 rping; pkill -9 qperf
      return
    fi
  done
}
run_logged() { # log exe args...
  log=$1; shift
  : > "$log"; tail -n +1 -f "$log" & t=$!
  watchdog "$log" "$1" & w=$!
  # The runner itself runs in the foreground: a command put in the background by a
  # non-interactive shell starts with SIGINT ignored, and so would every rdma-trace it spawns
  # (the signal tests send SIGINT before rdma-trace installs its handlers).
  # Each test's time on its result line (`ok <12.345s>`): libtest's unstable flag, which a
  # stable test executable takes when RUSTC_BOOTSTRAP is set.
  RUSTC_BOOTSTRAP=1 "$@" --test-threads=1 -Z unstable-options --report-time > "$log" 2>&1; st=$?
  kill $w 2> /dev/null; sleep 1.5; kill $t; wait $t $w 2> /dev/null
  return $st
}
# exe log rerun-log [TEST]... (the tests to run; none: all)
#   [--skip TEST]... (tests an earlier boot passed)
suite() {
  s_exe=$1; s_log=$2; s_rerun=$3; shift 3
  echo "== $s_exe"
  run_logged "$s_log" "$s_exe" ${1:+--exact} "$@" && return
  echo "== $s_exe failed: the tests that did not pass run once more"
  if grep -q '^test result:' "$s_log"; then
    # The runner's own list of failures (the last `failures:` block).
    again=$(awk '/^failures:$/ { n = "" } /^    [^ ]/ { n = n " " $1 } END { print n }' "$s_log")
    run_logged "$s_rerun" "$s_exe" --exact $again || rc=1
  else
    # Stopped by the watchdog: every test that had not passed.
    skip=$(sed -n 's/^test \(.*\) \.\.\. ok\( <[0-9.]*s>\)\{0,1\}$/--skip \1/p' "$s_log" | tr '\n' ' ')
    run_logged "$s_rerun" "$s_exe" --exact "$@" $skip || rc=1
  fi
}
"#;

/// What a test executable's logs say: its summary lines (the first run's, and the second's when
/// there was one) and the tests that passed only when run again.
struct SuiteOutcome {
    summaries: Vec<String>,
    passed_again: Vec<String>,
    /// The slowest tests with their times (`slowest`), for the summary.
    slowest: Vec<(String, f64)>,
}

fn suite_outcome(first: &str, rerun: &str) -> SuiteOutcome {
    let results = |log: &str| -> Vec<String> {
        log.lines()
            .filter_map(|l| l.find("test result:").map(|p| l[p..].to_owned()))
            .collect()
    };
    let mut summaries = results(first);
    let rerun_summaries = results(rerun);
    let passed_again = if rerun_summaries.is_empty() {
        Vec::new()
    } else {
        tests_that(rerun, "ok").map(str::to_owned).collect()
    };
    if !rerun_summaries.is_empty() {
        // The first run's own line (if it got that far) says FAILED; the second decides.
        summaries = summaries
            .into_iter()
            .map(|l| format!("first run: {l}"))
            .chain(rerun_summaries)
            .collect();
    }
    SuiteOutcome {
        summaries,
        passed_again,
        slowest: slowest(&[first, rerun], 5),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The script run by hand in the 6.1 guest (it read 400 completion events): the braces of
    /// the shell survive `format!`, the port is the one polled, and the workspace leaves PATH.
    #[test]
    fn the_tarball_script_is_plain_shell() {
        let s = tarball_script(
            std::path::Path::new("/w/target/dist/t.tar.gz"),
            std::path::Path::new("/w/out"),
            200,
        );
        assert!(s.contains("export PATH=${PATH#*:}\n"), "{s}");
        assert!(s.contains("|| { echo "), "{s}");
        assert!(
            s.contains("grep -q ':4966 00000000:0000 0A'"),
            "18790 in hex: {s}"
        );
        assert!(s.contains("tar xzf /w/target/dist/t.tar.gz -C"), "{s}");
        assert!(s.contains("--json /w/out/run.json -- timeout 180 ibv_rc_pingpong -d rxe0"));
        assert_eq!(s.matches("-n 200 -p 18790 -e").count(), 2, "{s}");
    }

    #[test]
    fn the_summary_names_the_slowest_tests_from_their_report_times() {
        let first = "test a ... ok <12.500s>\ntest b ... FAILED <3.000s>\ntest c ... ok <120.250s>\ntest d ... ok\ntest e ... ignored\n";
        let rerun = "test b ... ok <40.000s>\n";
        assert_eq!(
            slowest(&[first, rerun], 3),
            [
                ("c".to_owned(), 120.25),
                ("b".to_owned(), 40.0),
                ("a".to_owned(), 12.5)
            ]
        );
        assert_eq!(
            without_time("test x ... ok <s>"),
            ("test x ... ok <s>", None)
        );
        assert_eq!(tests_that(first, "ok").collect::<Vec<_>>(), ["a", "c", "d"]);
        assert!(slowest(&["test a ... ok\n"], 5).is_empty());
    }

    #[test]
    fn a_suite_that_passes_when_run_again_names_those_tests() {
        let first = "test a ... ok\ntest b ... FAILED\ntest result: FAILED. 1 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out; finished in 1s\n";
        let rerun = "test b ... ok\ntest result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 1 filtered out; finished in 1s\n";
        let o = suite_outcome(first, rerun);
        assert_eq!(o.passed_again, ["b"]);
        assert_eq!(o.summaries.len(), 2);
        assert!(o.summaries[0].starts_with("first run: test result: FAILED"));
        assert!(o.summaries[1].starts_with("test result: ok."));
        // A runner stopped by the watchdog has no line of its own.
        let o = suite_outcome("test a ... ok\n== no test finished for 600 s\n", rerun);
        assert_eq!((o.summaries.len(), o.passed_again.len()), (1, 1));
        // Without a second run, nothing passed again.
        let o = suite_outcome(first, "");
        assert!(o.passed_again.is_empty());
        assert_eq!(o.summaries.len(), 1);
    }

    #[test]
    fn a_rerun_pass_counts_only_for_quarantined_tests_with_a_reason() {
        let q =
            Quarantine::parse("# comment\n\nslow_cpu_share: under load the share moves\n").unwrap();
        let (known, unknown) = q.split(&["slow_cpu_share".to_owned(), "other".to_owned()]);
        assert_eq!(
            known,
            [(
                "slow_cpu_share".to_owned(),
                "under load the share moves".to_owned()
            )]
        );
        assert_eq!(unknown, ["other"]);
        assert!(Quarantine::parse("no_reason_given\n").is_err());
        assert!(Quarantine::parse("name:   \n").is_err());
        // The checked-in list parses.
        Quarantine::load().unwrap();
    }

    #[test]
    fn a_resumed_runner_skips_exactly_the_tests_an_earlier_boot_passed() {
        let log = "test a::one ... ok <1.250s>\ntest a::two ... FAILED <0.5s>\ntest a::three ... ok\ntest a::fo";
        let passed: Vec<String> = tests_that(log, "ok").map(str::to_owned).collect();
        assert_eq!(passed, ["a::one", "a::three"]);
        assert_eq!(tests_that(log, "FAILED").collect::<Vec<_>>(), ["a::two"]);
        assert_eq!(skip_args(&passed), " --skip a::one --skip a::three");
        assert_eq!(skip_args(&[]), "");
        // A runner whose kernel died mid-way has not finished; one whose rerun printed its
        // result has, whatever it was.
        assert!(!suite_finished(log, ""));
        assert!(suite_finished("test result: ok. 2 passed; 0 failed", ""));
        assert!(!suite_finished(
            "test result: FAILED. 1 passed; 1 failed",
            ""
        ));
        assert!(suite_finished(
            "test result: FAILED. 1 passed; 1 failed",
            "test result: FAILED. 0 passed; 1 failed"
        ));
    }

    /// The guest runner itself, run by bash with a stand-in test executable that records its
    /// arguments: a resumed suite passes `--exact` and the skips, a first one neither.
    #[test]
    fn the_guest_runner_passes_the_skips_to_the_test_executable() {
        let dir = std::env::temp_dir().join(format!("xtask-runner-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let exe = dir.join("fake-tests");
        let args = dir.join("args");
        std::fs::write(
            &exe,
            format!(
                "#!/bin/sh\necho \"$*\" >> {}\necho 'test x ... ok'\necho 'test result: ok. 1 passed; 0 failed'\n",
                args.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&exe, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let script = format!(
            "{GUEST_RUNNER}suite {e} {d}/0.log {d}/0.rerun.log\nsuite {e} {d}/1.log {d}/1.rerun.log{}\nsuite {e} {d}/2.log {d}/2.rerun.log{}{}\nexit $rc\n",
            skip_args(&["m::a".to_owned(), "m::b".to_owned()]),
            name_args(&["m::a".to_owned(), "m::c".to_owned()]),
            skip_args(&["m::a".to_owned()]),
            e = exe.display(),
            d = dir.display(),
        );
        // Not piped: the runner's watchdog leaves a `sleep` behind that would hold a pipe open.
        let status = Command::new("bash")
            .arg("-c")
            .arg(&script)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap();
        let got = std::fs::read_to_string(&args).unwrap_or_default();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(status.success(), "{status:?}");
        assert_eq!(
            got,
            "--test-threads=1 -Z unstable-options --report-time\n--exact --skip m::a --skip m::b --test-threads=1 -Z unstable-options --report-time\n--exact m::a m::c --skip m::a --test-threads=1 -Z unstable-options --report-time\n"
        );
    }

    /// A kernel's part of the suite: each module's tests and a top-level test by its name, not
    /// a test whose name only starts with it; a name that selects nothing is an error.
    #[test]
    fn a_partial_suite_selects_whole_modules_and_named_tests() {
        let list = "stall::a: test\nstall::b: test\nstalled_run: test\nnvme::c: test\nrun_x: test\nrun_x_too: test\nbench: benchmark\n";
        assert_eq!(
            select_from_list(list, &["stall", "run_x"]).unwrap(),
            ["stall::a", "stall::b", "run_x"]
        );
        let e = select_from_list(list, &["stall", "gone"]).unwrap_err();
        assert!(e.to_string().contains("gone"), "{e}");
        // Every name the 6.12 part gives is a module or test of the real suite.
        let Suite::Part(modules) = kernel_suite(vm::Kernel::V6_12) else {
            panic!("6.12 runs a part of the suite");
        };
        let text = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../rdma-trace/tests/guest.rs"),
        )
        .unwrap();
        for m in modules {
            assert!(
                text.contains(&format!("mod {m};")) || text.contains(&format!("fn {m}()")),
                "{m} is neither a module nor a test of rdma-trace/tests/guest.rs"
            );
        }
    }

    #[test]
    fn tests_run_counts_passed_and_failed() {
        let lines = [
            "test result: ok. 7 passed; 0 failed; 2 ignored; 0 measured; 47 filtered out; finished in 1.79s".to_owned(),
            "test result: FAILED. 3 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.2s".to_owned(),
            "test result: ok. 0 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.00s".to_owned(),
        ];
        assert_eq!(tests_run(&lines), 11);
        assert_eq!(tests_run(&lines[2..]), 0);
        assert_eq!(tests_run(&[]), 0);
    }

    #[test]
    fn a_kernel_left_out_gets_a_skip_row_with_the_reason() {
        let rows = kernel_rows(&[vm::Kernel::V6_1]);
        assert_eq!(rows.len(), 4);
        assert_eq!(rows[0], (vm::Kernel::V6_1, None));
        assert_eq!(
            rows[3],
            (
                vm::Kernel::V7,
                Some("not selected (--kernel 6.1 was given)".to_owned())
            )
        );
        let full: Vec<_> = rows.iter().map(|(k, _)| full_suite(*k)).collect();
        assert_eq!(full, [true, true, false, false]);
        assert_eq!(
            rows[1],
            (
                vm::Kernel::V6_12,
                Some("not selected (--kernel 6.1 was given)".to_owned())
            )
        );
        assert!(kernel_rows(&[]).iter().all(|(_, why)| why.is_none()));
    }

    #[test]
    fn a_layer_that_ran_no_test_fails() {
        let mut steps = Vec::new();
        test_step(&mut steps, "empty", || {
            Ok(vec![
                "test result: ok. 0 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.00s".to_owned(),
            ])
        });
        test_step(&mut steps, "one", || {
            Ok(vec![
                "test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.00s".to_owned(),
            ])
        });
        assert!(
            matches!(&steps[0].outcome, Outcome::Failed(why) if why == "it ran no test"),
            "a layer of 0 tests passed"
        );
        assert_eq!(steps[0].tests, Some(0));
        assert!(matches!(steps[1].outcome, Outcome::Passed));
        assert_eq!(steps[1].tests, Some(1));
    }
}

//! Start-up calibration: what each attach mechanism costs on this kernel, per hit.
//!
//! For each mechanism (kprobe, kretprobe, raw tracepoint, tracepoint, fentry) an empty program of
//! the eBPF object (`rdma-trace-ebpf/src/calibrate.rs`) is attached to the umask path
//! (`__x64_sys_umask`, or the `sys_enter` tracepoint, raw or perf-event), and this thread calls umask
//! [`CALLS`] times. The loop is timed with and without the probe (the best of [`REPS`] each,
//! alternated); the difference per call is the mechanism's cost, its empty body included. The
//! BPF run-time statistics of the empty program give the body's own time, so that
//! `per hit = mechanism − empty body + our body` adds up for the programs of a session.
//!
//! The whole calibration takes a few tens of milliseconds on hardware and stays well under a
//! second under TCG emulation. A mechanism the kernel refuses is reported as unavailable, with
//! why.

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow};
use aya::{
    Ebpf,
    programs::{FEntry, KProbe, RawTracePoint, TracePoint},
};
use serde::Serialize;

use crate::error::chain;

/// umask calls per timed loop.
pub const CALLS: u32 = 2000;
/// Timed loops per configuration (the fastest counts: noise only adds time).
pub const REPS: usize = 3;
/// The kernel function umask goes through on x86_64 (in kallsyms and in the BTF of the
/// Debian kernels, so fentry can attach to it too; getppid's is not in their BTF).
const FUNCTION: &str = "__x64_sys_umask";

/// What one mechanism costs per hit, or why it could not be measured.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MechanismCost {
    /// `kprobe`, `kretprobe`, `raw_tp`, `tracepoint`, `fentry`.
    pub mechanism: &'static str,
    /// Wall-clock ns a hit adds to the traced call, an empty body included.
    pub ns_per_hit: Option<f64>,
    /// The empty body's own run time (BPF statistics), ns per run.
    pub empty_body_ns: Option<f64>,
    /// Why it is missing.
    pub unavailable: Option<String>,
    /// Loading, attaching and detaching the empty program, ms.
    pub setup_ms: f64,
}

impl MechanismCost {
    /// What a hit costs outside the program's body (trap, trampoline, dispatch).
    pub fn outside_body_ns(&self) -> Option<f64> {
        self.ns_per_hit
            .map(|m| (m - self.empty_body_ns.unwrap_or(0.0)).max(0.0))
    }
}

/// The calibration of one run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Calibration {
    pub mechanisms: Vec<MechanismCost>,
    /// ns of one umask call without any probe.
    pub baseline_ns_per_call: f64,
    pub took_ms: f64,
}

impl Calibration {
    pub fn get(&self, mechanism: &str) -> Option<&MechanismCost> {
        self.mechanisms.iter().find(|m| m.mechanism == mechanism)
    }

    /// One line per mechanism, for the report.
    pub fn render(&self) -> String {
        let mut out = format!(
            "calibration ({:.0} ms; umask alone {:.0} ns): per hit",
            self.took_ms, self.baseline_ns_per_call
        );
        for m in &self.mechanisms {
            match (m.ns_per_hit, &m.unavailable) {
                (Some(ns), _) => out.push_str(&format!(
                    " {} {ns:.0} ns ({:.0} ms to set up),",
                    m.mechanism, m.setup_ms
                )),
                (None, Some(why)) => out.push_str(&format!(
                    " {} unavailable ({}),",
                    m.mechanism,
                    why.lines().next().unwrap_or_default()
                )),
                (None, None) => out.push_str(&format!(" {} -,", m.mechanism)),
            }
        }
        out.pop();
        out
    }
}

/// `n` umask calls that set the mask it already has (nothing changes), timed.
fn syscall_loop(n: u32) -> Duration {
    let mask = current_umask();
    let t = Instant::now();
    for _ in 0..n {
        // SAFETY: as above; the mask stays what it was.
        std::hint::black_box(unsafe { libc::umask(std::hint::black_box(mask)) });
    }
    t.elapsed()
}

/// The process's umask, from /proc (umask(2) cannot read it without setting it).
fn current_umask() -> libc::mode_t {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let v = s.lines().find_map(|l| l.strip_prefix("Umask:"))?;
            libc::mode_t::from_str_radix(v.trim(), 8).ok()
        })
        .unwrap_or(0o022)
}

/// Best of `REPS` timed loops.
fn best(n: u32) -> Duration {
    (0..REPS).map(|_| syscall_loop(n)).min().unwrap_or_default()
}

/// Run time per run of program `name` (BPF statistics), if it ran.
fn body_ns(ebpf: &Ebpf, name: &str) -> Option<f64> {
    let info = ebpf.program(name)?.info().ok()?;
    let runs = info.run_count();
    (runs > 0).then(|| info.run_time().as_nanos() as f64 / runs as f64)
}

/// Measures every mechanism with the empty programs of `ebpf` (a session's object: loading
/// it again would cost more than the whole calibration). Needs the BPF run-time statistics on
/// for the empty-body figures (the session turns them on). fentry is measured only when
/// `with_fentry` (the session attached some fentry programs): reading the kernel's BTF for it
/// takes longer than all the rest together.
pub fn run(ebpf: &mut Ebpf, with_fentry: bool) -> Calibration {
    let started = Instant::now();
    // Warm up (page faults, caches), then the reference loop.
    syscall_loop(CALLS / 4);
    let baseline = best(CALLS);
    let mut mechanisms = Vec::new();
    for (mechanism, prog) in [
        ("kprobe", "cal_kprobe"),
        ("kretprobe", "cal_kretprobe"),
        ("raw_tp", "cal_raw_tp"),
        ("tracepoint", "cal_tracepoint"),
        ("fentry", "cal_fentry"),
    ] {
        let t0 = Instant::now();
        let attached = if mechanism == "fentry" && !with_fentry {
            Err(anyhow!("not measured: no fentry program in this session"))
        } else {
            attach(ebpf, mechanism, prog)
        };
        let mut setup = t0.elapsed();
        let cost = match attached {
            Ok(()) => {
                let with = best(CALLS);
                let empty_body_ns = body_ns(ebpf, prog);
                let t1 = Instant::now();
                unload(ebpf, prog);
                setup += t1.elapsed();
                // The reference again, right after: drift of the machine hits both alike.
                let without_now = best(CALLS);
                let reference = baseline.min(without_now);
                let extra = with.saturating_sub(reference).as_nanos() as f64 / f64::from(CALLS);
                MechanismCost {
                    mechanism,
                    ns_per_hit: Some(extra),
                    empty_body_ns,
                    unavailable: None,
                    setup_ms: setup.as_secs_f64() * 1e3,
                }
            }
            Err(e) => {
                // A program loaded before its attach failed: unloaded, for the next round.
                unload(ebpf, prog);
                MechanismCost {
                    mechanism,
                    ns_per_hit: None,
                    empty_body_ns: None,
                    unavailable: Some(format!("{e:#}")),
                    setup_ms: setup.as_secs_f64() * 1e3,
                }
            }
        };
        mechanisms.push(cost);
    }
    Calibration {
        mechanisms,
        baseline_ns_per_call: baseline.as_nanos() as f64 / f64::from(CALLS),
        took_ms: started.elapsed().as_secs_f64() * 1e3,
    }
}

fn attach(ebpf: &mut Ebpf, mechanism: &str, prog: &str) -> Result<()> {
    let p = ebpf
        .program_mut(prog)
        .with_context(|| format!("program {prog} is not in the eBPF object"))?;
    match mechanism {
        "kprobe" | "kretprobe" => {
            let p: &mut KProbe = p.try_into().map_err(|e| anyhow!("{prog}: {}", chain(&e)))?;
            p.load()
                .map_err(|e| anyhow!("loading {prog}: {}", chain(&e)))?;
            p.attach(FUNCTION, 0)
                .map_err(|e| anyhow!("attaching {prog} to {FUNCTION}: {}", chain(&e)))?;
        }
        "raw_tp" => {
            let p: &mut RawTracePoint =
                p.try_into().map_err(|e| anyhow!("{prog}: {}", chain(&e)))?;
            p.load()
                .map_err(|e| anyhow!("loading {prog}: {}", chain(&e)))?;
            p.attach("sys_enter")
                .map_err(|e| anyhow!("attaching {prog} to sys_enter: {}", chain(&e)))?;
        }
        "tracepoint" => {
            let p: &mut TracePoint = p.try_into().map_err(|e| anyhow!("{prog}: {}", chain(&e)))?;
            p.load()
                .map_err(|e| anyhow!("loading {prog}: {}", chain(&e)))?;
            p.attach("raw_syscalls", "sys_enter").map_err(|e| {
                anyhow!("attaching {prog} to raw_syscalls/sys_enter: {}", chain(&e))
            })?;
        }
        _ => {
            let btf = crate::bpf::loader::kernel_btf()?;
            let p: &mut FEntry = p.try_into().map_err(|e| anyhow!("{prog}: {}", chain(&e)))?;
            p.load(FUNCTION, btf)
                .map_err(|e| anyhow!("loading {prog} for {FUNCTION}: {}", chain(&e)))?;
            p.attach()
                .map_err(|e| anyhow!("attaching {prog}: {}", chain(&e)))?;
        }
    }
    Ok(())
}

/// Detach and unload a calibration program.
fn unload(ebpf: &mut Ebpf, prog: &str) {
    if let Some(p) = ebpf.program_mut(prog) {
        super::loader::unload(p);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cal() -> Calibration {
        Calibration {
            mechanisms: vec![
                MechanismCost {
                    mechanism: "kprobe",
                    ns_per_hit: Some(500.0),
                    empty_body_ns: Some(40.0),
                    unavailable: None,
                    setup_ms: 3.0,
                },
                MechanismCost {
                    mechanism: "fentry",
                    ns_per_hit: None,
                    empty_body_ns: None,
                    unavailable: Some("attaching cal_fentry: EPERM\nmore".into()),
                    setup_ms: 1.0,
                },
                MechanismCost {
                    mechanism: "raw_tp",
                    ns_per_hit: Some(10.0),
                    empty_body_ns: Some(30.0),
                    unavailable: None,
                    setup_ms: 2.0,
                },
            ],
            baseline_ns_per_call: 120.0,
            took_ms: 42.0,
        }
    }

    #[test]
    fn outside_body_cost_never_goes_negative() {
        let c = cal();
        assert_eq!(c.get("kprobe").unwrap().outside_body_ns(), Some(460.0));
        assert_eq!(c.get("raw_tp").unwrap().outside_body_ns(), Some(0.0));
        assert_eq!(c.get("fentry").unwrap().outside_body_ns(), None);
        assert!(c.get("kretprobe").is_none());
    }

    #[test]
    fn rendering_names_each_mechanism() {
        let t = cal().render();
        assert_eq!(
            t,
            "calibration (42 ms; umask alone 120 ns): per hit kprobe 500 ns (3 ms to set \
             up), fentry unavailable (attaching cal_fentry: EPERM), raw_tp 10 ns (2 ms to set up)"
        );
    }
}

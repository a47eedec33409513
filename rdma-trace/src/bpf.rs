//! Loading the embedded eBPF object, attaching its programs, reading its maps.
//!
//! Probes stay attached while the [`Bpf`] value lives: dropping it detaches everything.

use anyhow::{Context as _, Result, anyhow};
use aya::{
    Ebpf,
    maps::{MapData, PerCpuArray},
    programs::{KProbe, RawTracePoint},
};

use crate::error::Unsupported;

/// The eBPF object built by `cargo xtask build-ebpf` (see build.rs).
static OBJECT: &[u8] = aya::include_bytes_aligned!(env!("RDMA_TRACE_EBPF_OBJECT"));

pub struct Bpf {
    ebpf: Ebpf,
}

impl Bpf {
    /// Load the object (creates the maps; programs are loaded when attached).
    pub fn load() -> Result<Self> {
        raise_memlock();
        let ebpf = Ebpf::load(OBJECT).map_err(|e| {
            let text = chain(&e);
            if text.contains("Operation not permitted") {
                anyhow!(Unsupported(format!(
                    "loading eBPF maps was refused ({text}): run as root (CAP_BPF and CAP_PERFMON)"
                )))
            } else {
                anyhow!("loading the eBPF object: {text}")
            }
        })?;
        Ok(Self { ebpf })
    }

    /// Load program `prog` and attach it to raw tracepoint `name` (e.g. `softirq_entry`).
    pub fn attach_raw_tracepoint(&mut self, prog: &str, name: &str) -> Result<()> {
        let p: &mut RawTracePoint = self
            .ebpf
            .program_mut(prog)
            .with_context(|| format!("program {prog} is not in the eBPF object"))?
            .try_into()
            .with_context(|| format!("program {prog} is not a raw tracepoint program"))?;
        p.load()
            .map_err(|e| anyhow!("loading {prog}: {}", chain(&e)))?;
        p.attach(name)
            .map_err(|e| anyhow!("attaching {prog} to raw tracepoint {name}: {}", chain(&e)))?;
        Ok(())
    }

    /// Load k(ret)probe program `prog` and attach it to kernel function `function`.
    pub fn attach_kprobe(&mut self, prog: &str, function: &str) -> Result<()> {
        let p: &mut KProbe = self
            .ebpf
            .program_mut(prog)
            .with_context(|| format!("program {prog} is not in the eBPF object"))?
            .try_into()
            .with_context(|| format!("program {prog} is not a kprobe program"))?;
        p.load()
            .map_err(|e| anyhow!("loading {prog}: {}", chain(&e)))?;
        p.attach(function, 0)
            .map_err(|e| anyhow!("attaching {prog} to {function}: {}", chain(&e)))?;
        Ok(())
    }

    /// Sum over CPUs of entries `first..first + len` of per-CPU array `map`.
    pub fn read_sums(&self, map: &str, first: u32, len: u32) -> Result<Vec<u64>> {
        let m = self
            .ebpf
            .map(map)
            .with_context(|| format!("map {map} is not in the eBPF object"))?;
        let array: PerCpuArray<&MapData, u64> = PerCpuArray::try_from(m)
            .with_context(|| format!("map {map} is not a per-CPU array"))?;
        (first..first + len)
            .map(|i| {
                array
                    .get(&i, 0)
                    .map(|values| values.iter().sum())
                    .map_err(|e| anyhow!("reading {map}[{i}]: {}", chain(&e)))
            })
            .collect()
    }
}

/// Kernels before 5.11 charge BPF memory to RLIMIT_MEMLOCK; later ones use memcg and ignore it.
fn raise_memlock() {
    let rlim = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: setrlimit reads the struct we pass and has no other preconditions; failure
    // (e.g. EPERM without CAP_SYS_RESOURCE) is harmless on memcg-accounted kernels.
    let _ = unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &rlim) };
}

/// An error and its sources on one line (aya nests io errors and verifier logs).
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let t = c.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        cur = c.source();
    }
    s
}

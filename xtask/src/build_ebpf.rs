//! `cargo xtask build-ebpf [--release]`: build `rdma-trace-ebpf` for `bpfel-unknown-none`.
//!
//! The eBPF crate needs `-Z build-std=core`, so it is built by its own cargo invocation with
//! `RUSTC_BOOTSTRAP=1` and its own target directory (`target/ebpf`): the userspace build, on
//! the stable toolchain, never sees those settings and keeps its cache. The object keeps its BTF
//! (`-C debuginfo=2 -C link-arg=--btf`) and is copied to [`object_path`], where `rdma-trace`'s
//! build script picks it up.

use std::{path::PathBuf, process::Command};

use anyhow::{Context as _, Result, bail};

use crate::{
    setup,
    util::{root, run_cmd, say, target_dir, tools_dir},
};

const TARGET: &str = "bpfel-unknown-none";

#[derive(clap::Args)]
pub struct Args {
    /// Build with the release profile (the default profile is also optimized: the verifier
    /// rejects unoptimized BPF).
    #[arg(long)]
    pub release: bool,
}

/// Where the built object is published for `rdma-trace/build.rs` (keep the two in sync).
pub fn object_path() -> PathBuf {
    target_dir().join("ebpf/rdma-trace-ebpf.o")
}

pub fn run(args: &Args) -> Result<PathBuf> {
    let (profile, dir) = if args.release {
        ("RELEASE", "release")
    } else {
        ("DEV", "debug")
    };
    let mut cmd = ebpf_cargo("build", profile)?;
    if args.release {
        cmd.arg("--release");
    }
    run_cmd(&mut cmd)?;

    let ebpf_target = target_dir().join("ebpf");
    let built = ebpf_target.join(TARGET).join(dir).join("rdma-trace-ebpf");
    let bytes = std::fs::read(&built).with_context(|| format!("reading {}", built.display()))?;
    check_object(&bytes).with_context(|| format!("checking {}", built.display()))?;
    let published = object_path();
    // Copy only when changed, so rdma-trace is not rebuilt for nothing.
    if std::fs::read(&published).ok().as_deref() != Some(&bytes[..]) {
        std::fs::write(&published, &bytes)
            .with_context(|| format!("writing {}", published.display()))?;
    }
    say(format!(
        "eBPF object: {} ({} bytes, with .BTF)",
        published.display(),
        bytes.len()
    ));
    Ok(published)
}

/// `cargo clippy -D warnings` on the eBPF crate, for its target, with the eBPF toolchain
/// (Debian's `rust-web-clippy` provides clippy for `debian-web`).
pub fn clippy() -> Result<()> {
    let mut cmd = ebpf_cargo("clippy", "DEV")?;
    cmd.args(["--", "-D", "warnings"]);
    run_cmd(&mut cmd)
}

/// `cargo +<eBPF toolchain> <subcommand> --package rdma-trace-ebpf --target bpfel-unknown-none`
/// with build-std, the eBPF target directory and the settings of `profile` (`DEV`/`RELEASE`).
fn ebpf_cargo(subcommand: &str, profile: &str) -> Result<Command> {
    setup::ensure_build()?;
    let toolchain = setup::ebpf_toolchain()?
        .context("no rustup toolchain with rust-src for the eBPF build: run `cargo xtask setup`")?;
    let ebpf_target = target_dir().join("ebpf");
    let path = format!(
        "{}:{}",
        tools_dir().join("bin").display(),
        std::env::var("PATH").unwrap_or_default()
    );
    say(format!(
        "cargo {subcommand} rdma-trace-ebpf ({}) with toolchain {toolchain}",
        profile.to_lowercase()
    ));
    let mut cmd = Command::new("cargo");
    cmd.current_dir(root())
        .arg(format!("+{toolchain}"))
        .args([
            subcommand,
            "--package",
            "rdma-trace-ebpf",
            "--target",
            TARGET,
        ])
        .args(["-Z", "build-std=core", "--target-dir"])
        .arg(&ebpf_target)
        // The workspace's `profile.dev.package."*"` (for the host's debug builds) must not lower
        // the eBPF dependencies' optimization: the verifier rejects unoptimized BPF.
        .arg("--config")
        .arg(format!(
            "profile.{}.package.\"*\".opt-level=3",
            if profile == "DEV" { "dev" } else { "release" }
        ));
    // Settings of the cargo that runs xtask must not leak into this build.
    for var in [
        "RUSTC",
        "RUSTDOC",
        "RUSTC_WRAPPER",
        "RUSTC_WORKSPACE_WRAPPER",
        "RUSTUP_TOOLCHAIN",
        "CARGO_ENCODED_RUSTFLAGS",
        "CARGO_TARGET_DIR",
    ] {
        cmd.env_remove(var);
    }
    cmd.env("RUSTC_BOOTSTRAP", "1")
        .env("PATH", path)
        .env("RUSTFLAGS", "-C debuginfo=2 -C link-arg=--btf")
        .env(format!("CARGO_PROFILE_{profile}_DEBUG"), "2")
        .env(format!("CARGO_PROFILE_{profile}_CODEGEN_UNITS"), "1")
        .env(format!("CARGO_PROFILE_{profile}_OPT_LEVEL"), "3")
        .env(format!("CARGO_PROFILE_{profile}_OVERFLOW_CHECKS"), "false")
        .env(format!("CARGO_PROFILE_{profile}_DEBUG_ASSERTIONS"), "false");
    Ok(cmd)
}

/// The object is a little-endian BPF ELF with BTF and at least one program section.
fn check_object(bytes: &[u8]) -> Result<()> {
    use object::{Object as _, ObjectSection as _};
    let file = object::File::parse(bytes).context("not an ELF object")?;
    if file.architecture() != object::Architecture::Bpf {
        bail!("not a BPF object ({:?})", file.architecture());
    }
    let names: Vec<&str> = file.sections().filter_map(|s| s.name().ok()).collect();
    if !names.contains(&".BTF") {
        bail!("no .BTF section (sections: {})", names.join(" "));
    }
    if !names
        .iter()
        .any(|n| n.starts_with("kprobe") || n.starts_with("tracepoint"))
    {
        bail!("no program sections (sections: {})", names.join(" "));
    }
    // The programs that feed the histograms can be interrupted by one of ours that adds to the
    // same per-CPU row (see "recording" in rdma-trace-ebpf/src/main.rs): their adds must be
    // atomic, so each of their sections has BPF_XADD instructions.
    for section in file.sections() {
        let name = section.name().unwrap_or_default();
        if !RECORDING_SECTIONS.contains(&name) {
            continue;
        }
        let code = section.data().context("reading a program section")?;
        if !code.chunks_exact(8).any(is_atomic_add) {
            bail!("section {name} has no atomic add: its histogram counts can lose adds");
        }
    }
    Ok(())
}

/// Sections of the programs that add to the histogram rows.
const RECORDING_SECTIONS: &[&str] = &[
    "kprobe",
    "kretprobe",
    "fentry",
    "fexit",
    "uprobe",
    "uretprobe",
    "raw_tp/softirq_entry",
    "raw_tp/softirq_exit",
    "raw_tp/irq_handler_entry",
    "raw_tp/irq_handler_exit",
    "raw_tp/napi_poll",
];

/// A 64-bit atomic add to memory: class STX, mode ATOMIC, size DW (opcode 0xdb), imm BPF_ADD (0).
fn is_atomic_add(insn: &[u8]) -> bool {
    insn[0] == 0xdb && insn[4..8] == [0, 0, 0, 0]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_adds_are_recognised() {
        // lock *(u64 *)(r0 + 0) += r1
        assert!(is_atomic_add(&[0xdb, 0x10, 0, 0, 0, 0, 0, 0]));
        // *(u64 *)(r0 + 0) = r1 (a plain store), and an atomic fetch-or.
        assert!(!is_atomic_add(&[0x7b, 0x10, 0, 0, 0, 0, 0, 0]));
        assert!(!is_atomic_add(&[0xdb, 0x10, 0, 0, 0x41, 0, 0, 0]));
    }
}

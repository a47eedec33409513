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
    setup::ensure()?;
    let toolchain = setup::ebpf_toolchain()?
        .context("no rustup toolchain with rust-src for the eBPF build: run `cargo xtask setup`")?;
    let (profile, dir) = if args.release {
        ("RELEASE", "release")
    } else {
        ("DEV", "debug")
    };
    let ebpf_target = target_dir().join("ebpf");
    let path = format!(
        "{}:{}",
        tools_dir().join("bin").display(),
        std::env::var("PATH").unwrap_or_default()
    );
    say(format!(
        "building rdma-trace-ebpf ({dir}) with toolchain {toolchain}"
    ));
    let mut cmd = Command::new("cargo");
    cmd.current_dir(root())
        .arg(format!("+{toolchain}"))
        .args(["build", "--package", "rdma-trace-ebpf", "--target", TARGET])
        .args(["-Z", "build-std=core", "--target-dir"])
        .arg(&ebpf_target);
    if args.release {
        cmd.arg("--release");
    }
    // Settings of the cargo that runs xtask must not leak into this build.
    for var in [
        "RUSTC",
        "RUSTDOC",
        "RUSTC_WRAPPER",
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
    run_cmd(&mut cmd)?;

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
    Ok(())
}

//! `cargo xtask setup`: install what the project needs, idempotently.
//!
//! - Debian packages, in two lists: the build toolchain ([`BUILD_PACKAGES`]: rustc-web,
//!   cargo-web, rust-web-src, llvm-22-dev, the verbs libraries and libclang 14 for rdma-sys),
//!   which is all that `build-ebpf` and `dist` ensure ([`ensure_build`]), and the test bed
//!   ([`TESTBED_PACKAGES`]: QEMU, xz, zstd, tmux), which `setup`, `test` and the guest runs add
//!   ([`ensure`]).
//! - A rustup toolchain for the eBPF build: Debian's rustc-web linked as `debian-web`, unless a
//!   rustup toolchain with rust-src already exists (or `RDMA_TRACE_EBPF_TOOLCHAIN` names one).
//! - bpf-linker 0.13 built against LLVM 22 into `.tools/bin`.

use std::{path::PathBuf, process::Command, time::Instant};

use anyhow::{Context as _, Result, bail};

use crate::util::{output, run_cmd, say, tools_dir};

/// Debian packages that build rdma-trace (with its eBPF object) and rdma-demo: all that
/// `build-ebpf` and `dist` need.
pub const BUILD_PACKAGES: &[&str] = &[
    // eBPF toolchain: Debian's Rust 1.96 with its std sources, and LLVM 22 for bpf-linker.
    "rustc-web",
    "cargo-web",
    "rust-web-src",
    "llvm-22-dev",
    // rdma-demo: libibverbs/librdmacm, and a libclang older than 16 for rdma-sys' bindgen.
    "libibverbs-dev",
    "librdmacm-dev",
    "libclang-14-dev",
    "pkg-config",
];

/// Debian packages of the test bed only (`setup`, `test`, `vm`, `bench`, `run` in the guest);
/// the guest's own packages are downloaded, not installed.
pub const TESTBED_PACKAGES: &[&str] = &[
    // clippy for the eBPF toolchain: `cargo xtask test` lints the eBPF crate with it.
    "rust-web-clippy",
    // Guest test bed.
    "qemu-system-x86",
    "xz-utils",
    "zstd",
    // Tests of the live view drive it in tmux.
    "tmux",
];

/// What to make sure of: the build toolchain only, or that and the test bed.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Scope {
    Build,
    All,
}

impl Scope {
    pub fn packages(self) -> Vec<&'static str> {
        match self {
            Scope::Build => BUILD_PACKAGES.to_vec(),
            Scope::All => [BUILD_PACKAGES, TESTBED_PACKAGES].concat(),
        }
    }
}

/// The rustup name under which Debian's toolchain is linked.
pub const DEBIAN_TOOLCHAIN: &str = "debian-web";
/// Environment variable naming another rustup toolchain (with rust-src) for the eBPF build.
pub const TOOLCHAIN_ENV: &str = "RDMA_TRACE_EBPF_TOOLCHAIN";
/// bpf-linker version (0.13 is the one that builds against LLVM 22 and Rust 1.95).
const BPF_LINKER_VERSION: &str = "0.13.0";
const LLVM_PREFIX: &str = "/usr/lib/llvm-22";

#[derive(clap::Args)]
pub struct Args {}

pub fn run(_args: &Args) -> Result<()> {
    run_scope(Scope::All)
}

fn run_scope(scope: Scope) -> Result<()> {
    let t0 = Instant::now();
    let missing = missing_packages(scope)?;
    if missing.is_empty() {
        say("apt packages: all present");
    } else {
        install_packages(&missing)?;
    }
    let toolchain = ensure_toolchain()?;
    say(format!("eBPF toolchain: {toolchain}"));
    ensure_bpf_linker()?;
    say(format!("setup done in {:.1} s", t0.elapsed().as_secs_f64()));
    Ok(())
}

/// Everything `scope` needs is there (cheap; no network).
pub fn is_complete(scope: Scope) -> Result<bool> {
    Ok(missing_packages(scope)?.is_empty() && ebpf_toolchain()?.is_some() && bpf_linker_ok())
}

/// Run setup when something the test bed or the build needs is missing, saying why (`setup`,
/// `test`, and every guest run).
pub fn ensure() -> Result<()> {
    if !is_complete(Scope::All)? {
        say("something the test bed needs is missing: running `cargo xtask setup`");
        run_scope(Scope::All)?;
    }
    Ok(())
}

/// Install only what the build needs when it is missing (`build-ebpf`, `dist`): never QEMU or
/// tmux.
pub fn ensure_build() -> Result<()> {
    if !is_complete(Scope::Build)? {
        say("something the build needs is missing: installing the build toolchain only");
        run_scope(Scope::Build)?;
    }
    Ok(())
}

fn missing_packages(scope: Scope) -> Result<Vec<&'static str>> {
    let packages = scope.packages();
    if which("dpkg-query").is_none() {
        // Not Debian: docs/install.md lists the packages; check only the toolchain and linker.
        return Ok(Vec::new());
    }
    // One dpkg-query call for all packages; unknown packages make it exit 1, so read stdout only.
    let out = Command::new("dpkg-query")
        .args(["-W", "-f=${Package} ${db:Status-Abbrev}\n"])
        .args(&packages)
        .output()
        .context("could not run dpkg-query")?;
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(packages
        .into_iter()
        .filter(|p| !installed_in(&text, p))
        .collect())
}

/// `program` on PATH.
pub fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

/// `dpkg-query` output says `pkg` is installed (status `ii`).
fn installed_in(dpkg_output: &str, pkg: &str) -> bool {
    dpkg_output.lines().any(|l| {
        let mut it = l.split_whitespace();
        it.next()
            .is_some_and(|name| name == pkg || name.split(':').next() == Some(pkg))
            && it.next() == Some("ii")
    })
}

fn install_packages(pkgs: &[&str]) -> Result<()> {
    if !crate::util::is_root() {
        bail!(
            "missing Debian packages: {}; run `cargo xtask setup` as root (or apt-get install them)",
            pkgs.join(" ")
        );
    }
    say(format!("installing Debian packages: {}", pkgs.join(" ")));
    let apt = |args: &[&str]| {
        let mut c = Command::new("apt-get");
        c.env("DEBIAN_FRONTEND", "noninteractive")
            .args(["-q", "-y", "-o", "DPkg::Lock::Timeout=600"])
            .args(args);
        c
    };
    run_cmd(apt(&["update"]).stdout(std::process::Stdio::null()))?;
    run_cmd(
        apt(&["install", "--no-install-recommends"])
            .args(pkgs)
            .stdout(std::process::Stdio::null()),
    )
}

fn rustup_toolchains() -> Result<Vec<String>> {
    Ok(output(Command::new("rustup").args(["toolchain", "list"]))?
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect())
}

fn has_rust_src(toolchain: &str) -> bool {
    let Ok(sysroot) = output(
        Command::new("rustc")
            .arg(format!("+{toolchain}"))
            .args(["--print", "sysroot"]),
    ) else {
        return false;
    };
    PathBuf::from(sysroot.trim())
        .join("lib/rustlib/src/rust/library/core")
        .is_dir()
}

/// The rustup toolchain used to build the eBPF crate, if one is usable: the one named by
/// `RDMA_TRACE_EBPF_TOOLCHAIN`, else Debian's linked toolchain, else any with rust-src.
pub fn ebpf_toolchain() -> Result<Option<String>> {
    if let Ok(tc) = std::env::var(TOOLCHAIN_ENV) {
        if !has_rust_src(&tc) {
            bail!(
                "{TOOLCHAIN_ENV}={tc}: that rustup toolchain has no rust-src (rustup component add rust-src --toolchain {tc})"
            );
        }
        return Ok(Some(tc));
    }
    let toolchains = rustup_toolchains()?;
    if toolchains.iter().any(|t| t == DEBIAN_TOOLCHAIN) && has_rust_src(DEBIAN_TOOLCHAIN) {
        return Ok(Some(DEBIAN_TOOLCHAIN.to_owned()));
    }
    Ok(toolchains.into_iter().find(|t| has_rust_src(t)))
}

fn ensure_toolchain() -> Result<String> {
    if let Some(tc) = ebpf_toolchain()? {
        return Ok(tc);
    }
    say(format!(
        "linking Debian's rustc-web into rustup as `{DEBIAN_TOOLCHAIN}`"
    ));
    run_cmd(Command::new("rustup").args(["toolchain", "link", DEBIAN_TOOLCHAIN, "/usr"]))?;
    if !has_rust_src(DEBIAN_TOOLCHAIN) {
        bail!(
            "toolchain {DEBIAN_TOOLCHAIN} has no rust-src after linking; is rust-web-src installed?"
        );
    }
    Ok(DEBIAN_TOOLCHAIN.to_owned())
}

/// Path of the project's bpf-linker.
pub fn bpf_linker() -> PathBuf {
    tools_dir().join("bin/bpf-linker")
}

fn bpf_linker_ok() -> bool {
    output(Command::new(bpf_linker()).arg("--version"))
        .is_ok_and(|v| v.contains(BPF_LINKER_VERSION))
}

fn ensure_bpf_linker() -> Result<()> {
    if bpf_linker_ok() {
        say(format!("bpf-linker {BPF_LINKER_VERSION}: present"));
        return Ok(());
    }
    say(format!(
        "building bpf-linker {BPF_LINKER_VERSION} against LLVM 22 into {} (about 2 minutes)",
        tools_dir().display()
    ));
    run_cmd(
        Command::new("cargo")
            .args([
                "install",
                "bpf-linker",
                "--version",
                BPF_LINKER_VERSION,
                "--locked",
            ])
            .args(["--no-default-features", "--features", "llvm-22", "--root"])
            .arg(tools_dir())
            // /usr/bin/llvm-config is LLVM 14: point the build at LLVM 22 (Debian's, unless
            // LLVM_PREFIX names another).
            .env(
                "LLVM_PREFIX",
                std::env::var_os("LLVM_PREFIX").unwrap_or_else(|| LLVM_PREFIX.into()),
            )
            .env_remove("RUSTUP_TOOLCHAIN")
            .env_remove("CARGO_TARGET_DIR"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dpkg_status_parsing() {
        let out = "rustc-web ii \nllvm-22-dev rc \nxz-utils:amd64 ii \n";
        assert!(installed_in(out, "rustc-web"));
        assert!(
            !installed_in(out, "llvm-22-dev"),
            "rc = removed, config left"
        );
        assert!(installed_in(out, "xz-utils"));
        assert!(!installed_in(out, "qemu-system-x86"));
    }

    #[test]
    fn the_build_needs_no_test_bed() {
        let build = Scope::Build.packages();
        for p in ["qemu-system-x86", "tmux", "xz-utils", "zstd"] {
            assert!(!build.contains(&p), "{p} is in the build list");
            assert!(
                Scope::All.packages().contains(&p),
                "{p} is not in setup's list"
            );
        }
        for p in ["rustc-web", "rust-web-src", "llvm-22-dev", "libibverbs-dev"] {
            assert!(build.contains(&p), "{p} is missing from the build list");
        }
    }
}

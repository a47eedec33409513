//! `cargo xtask dist [--no-zig]`: the release tarball
//! `target/dist/rdma-trace-<version>-x86_64-linux.tar.gz`.
//!
//! It builds the eBPF object (release) and the release binaries, then lays out one directory:
//! `rdma-trace` (the eBPF object is embedded) and `rdma-demo` side by side (rdma-trace finds the
//! demo beside itself), the man pages and shell completions that the binaries generate,
//! README.md, docs/install.md, and SHA256SUMS over all of them.
//!
//! The binaries are linked against glibc 2.31 with cargo-zigbuild (zig from PyPI's `ziglang`),
//! so they run on Debian 11, Ubuntu 20.04, RHEL 9 and anything newer (Rust's std calls `gettid`,
//! glibc 2.30); xtask installs
//! cargo-zigbuild with pip when it is missing. `--no-zig`, or no way to get it, builds with the
//! host's toolchain, and the tarball then needs the host's glibc: either way the glibc the
//! binaries need is read off them and printed. Only the build toolchain is ensured: no QEMU.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};
use sha2::{Digest as _, Sha256};

use crate::{
    build_ebpf, setup,
    util::{output, root, run_cmd, say, target_dir},
};

/// The glibc baseline of the zig build (Debian 11, Ubuntu 20.04, RHEL 9 and later).
pub const GLIBC_BASELINE: &str = "2.31";
const TRIPLE: &str = "x86_64-unknown-linux-gnu";
pub const BINARIES: [&str; 2] = ["rdma-trace", "rdma-demo"];
const SHELLS: [Shell; 3] = [Shell::Bash, Shell::Zsh, Shell::Fish];

#[derive(clap::Args)]
pub struct Args {
    /// Build with the host's toolchain instead of cargo-zigbuild (the binaries then need the
    /// host's glibc or newer).
    #[arg(long)]
    pub no_zig: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Shell {
    Bash,
    Zsh,
    Fish,
}

impl Shell {
    fn name(self) -> &'static str {
        match self {
            Shell::Bash => "bash",
            Shell::Zsh => "zsh",
            Shell::Fish => "fish",
        }
    }

    /// The file name each shell looks for.
    fn file(self, bin: &str) -> String {
        match self {
            Shell::Bash => bin.to_owned(),
            Shell::Zsh => format!("_{bin}"),
            Shell::Fish => format!("{bin}.fish"),
        }
    }
}

/// Where a file of the tarball comes from.
#[derive(Debug, PartialEq, Eq)]
enum Source {
    /// A release binary.
    Binary(&'static str),
    /// A file of the repository.
    Repo(&'static str),
    /// `BIN completions SHELL`.
    Completion(&'static str, Shell),
}

/// The files of the tarball (paths inside its top directory), but the man pages (one per
/// subcommand: `man/man1/*.1`, as many as the binaries write) and SHA256SUMS.
fn layout() -> Vec<(String, Source)> {
    let mut files: Vec<(String, Source)> = BINARIES
        .iter()
        .map(|b| ((*b).to_owned(), Source::Binary(b)))
        .collect();
    for doc in ["README.md", "docs/install.md"] {
        files.push((doc.to_owned(), Source::Repo(doc)));
    }
    for bin in BINARIES {
        for shell in SHELLS {
            files.push((
                format!("completions/{}/{}", shell.name(), shell.file(bin)),
                Source::Completion(bin, shell),
            ));
        }
    }
    files
}

/// `rdma-trace-<version>-x86_64-linux`: the tarball's name without `.tar.gz`, and its top
/// directory.
pub fn package_name() -> String {
    format!("rdma-trace-{}-x86_64-linux", env!("CARGO_PKG_VERSION"))
}

pub fn run(args: &Args) -> Result<PathBuf> {
    setup::ensure_build()?;
    let object = build_ebpf::run(&build_ebpf::Args { release: true })?;
    let bin_dir = build_binaries(args.no_zig, &object)?;

    let dist = target_dir().join("dist");
    let name = package_name();
    let stage = dist.join(&name);
    if stage.exists() {
        std::fs::remove_dir_all(&stage).with_context(|| format!("removing {}", stage.display()))?;
    }
    for (rel, source) in layout() {
        let dest = stage.join(&rel);
        std::fs::create_dir_all(dest.parent().expect("inside the stage"))?;
        match source {
            Source::Binary(bin) => {
                copy(&bin_dir.join(bin), &dest)?;
            }
            Source::Repo(path) => {
                copy(&root().join(path), &dest)?;
            }
            Source::Completion(bin, shell) => {
                let script =
                    output(Command::new(stage.join(bin)).args(["completions", shell.name()]))?;
                std::fs::write(&dest, script)?;
            }
        }
    }
    let man = stage.join("man/man1");
    for bin in BINARIES {
        run_cmd(
            Command::new(stage.join(bin))
                .arg("man")
                .arg("--out")
                .arg(&man),
        )
        .with_context(|| format!("generating the man pages of {bin}"))?;
    }

    let files = list_files(&stage)?;
    let mut entries = Vec::new();
    for rel in &files {
        entries.push((rel.clone(), std::fs::read(stage.join(rel))?));
    }
    std::fs::write(stage.join("SHA256SUMS"), sha256sums(&entries))?;

    let tarball = dist.join(format!("{name}.tar.gz"));
    // Owner root, sorted, so that the listing does not depend on who built it.
    run_cmd(
        Command::new("tar")
            .args([
                "--sort=name",
                "--owner=0",
                "--group=0",
                "--numeric-owner",
                "-czf",
            ])
            .arg(&tarball)
            .arg("-C")
            .arg(&dist)
            .arg(&name),
    )?;
    let glibc = glibc_needed(&std::fs::read(stage.join("rdma-trace"))?);
    let glibc_demo = glibc_needed(&std::fs::read(stage.join("rdma-demo"))?);
    say(format!(
        "{}: {} files; rdma-trace needs glibc >= {}, rdma-demo glibc >= {} and libibverbs",
        tarball.display(),
        files.len() + 1,
        glibc.as_deref().unwrap_or("?"),
        glibc_demo.as_deref().unwrap_or("?"),
    ));
    Ok(tarball)
}

fn copy(from: &Path, to: &Path) -> Result<()> {
    std::fs::copy(from, to)
        .map(|_| ())
        .with_context(|| format!("copying {} to {}", from.display(), to.display()))
}

/// Builds rdma-trace (embedding `object`) and rdma-demo in release; returns their directory.
fn build_binaries(no_zig: bool, object: &Path) -> Result<PathBuf> {
    let zig = !no_zig && ensure_zigbuild();
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.current_dir(root())
        .env("RDMA_TRACE_EBPF_OBJECT", object)
        .arg(if zig { "zigbuild" } else { "build" })
        .args(["--release", "-p", "rdma-trace", "-p", "rdma-demo"]);
    let dir = if zig {
        say(format!(
            "building the release binaries with cargo-zigbuild for glibc {GLIBC_BASELINE}"
        ));
        cmd.arg("--target")
            .arg(format!("{TRIPLE}.{GLIBC_BASELINE}"));
        target_dir().join(TRIPLE).join("release")
    } else {
        say("building the release binaries with the host's toolchain (its glibc is the baseline)");
        target_dir().join("release")
    };
    run_cmd(&mut cmd)?;
    for bin in BINARIES {
        if !dir.join(bin).is_file() {
            bail!("{} was not built", dir.join(bin).display());
        }
    }
    Ok(dir)
}

/// cargo-zigbuild (and zig) work, installing them from PyPI (`pip install cargo-zigbuild`,
/// which brings `ziglang`) when missing. False, saying why, when that fails.
fn ensure_zigbuild() -> bool {
    let works = || output(Command::new("cargo-zigbuild").arg("--version")).is_ok();
    if works() {
        return true;
    }
    say("cargo-zigbuild is missing: pip install cargo-zigbuild (it brings zig from ziglang)");
    let installed = run_cmd(Command::new("python3").args([
        "-m",
        "pip",
        "install",
        "--quiet",
        "cargo-zigbuild",
    ]));
    match installed {
        Ok(()) if works() => true,
        Ok(()) => {
            say("cargo-zigbuild installed but not on PATH: building with the host's toolchain");
            false
        }
        Err(e) => {
            say(format!(
                "could not install cargo-zigbuild ({e:#}): building with the host's toolchain"
            ));
            false
        }
    }
}

/// Files under `dir`, relative to it, sorted.
fn list_files(dir: &Path) -> Result<Vec<String>> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).with_context(|| format!("reading {}", d.display()))? {
            let p = e?.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let rel = p.strip_prefix(dir).expect("under dir");
                out.push(rel.to_string_lossy().into_owned());
            }
        }
    }
    out.sort();
    Ok(out)
}

/// `sha256sum`'s format: `<hex>  <path>` per file, in the order given.
fn sha256sums(files: &[(String, Vec<u8>)]) -> String {
    files
        .iter()
        .map(|(path, bytes)| {
            let hex: String = Sha256::digest(bytes)
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            format!("{hex}  {path}\n")
        })
        .collect()
}

/// The newest `GLIBC_x.y[.z]` symbol version an ELF binary needs (from its dynamic string
/// table, where the version needs are named).
pub fn glibc_needed(elf: &[u8]) -> Option<String> {
    use object::{Object as _, ObjectSection as _};
    let file = object::File::parse(elf).ok()?;
    let dynstr = file.section_by_name(".dynstr")?.data().ok()?;
    dynstr
        .split(|b| *b == 0)
        .filter_map(|s| std::str::from_utf8(s).ok()?.strip_prefix("GLIBC_"))
        .filter_map(|v| {
            let parts: Option<Vec<u32>> = v.split('.').map(|p| p.parse().ok()).collect();
            Some((parts?, v.to_owned()))
        })
        .max()
        .map(|(_, v)| v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tarball_holds_both_binaries_docs_and_completions() {
        let files: Vec<String> = layout().into_iter().map(|(p, _)| p).collect();
        for f in [
            "rdma-trace",
            "rdma-demo",
            "README.md",
            "docs/install.md",
            "completions/bash/rdma-trace",
            "completions/zsh/_rdma-trace",
            "completions/fish/rdma-trace.fish",
            "completions/bash/rdma-demo",
            "completions/zsh/_rdma-demo",
            "completions/fish/rdma-demo.fish",
        ] {
            assert!(files.iter().any(|p| p == f), "{f} missing from {files:?}");
        }
        assert_eq!(files.len(), 10, "{files:?}");
        // The binaries sit side by side at the top: rdma-trace finds rdma-demo beside itself.
        assert_eq!(
            layout()[0],
            ("rdma-trace".into(), Source::Binary("rdma-trace"))
        );
        assert_eq!(
            layout()[1],
            ("rdma-demo".into(), Source::Binary("rdma-demo"))
        );
        for (_, source) in layout() {
            if let Source::Repo(path) = source {
                assert!(
                    root().join(path).is_file(),
                    "{path} is not in the repository"
                );
            }
        }
        assert_eq!(
            package_name(),
            "rdma-trace-0.1.0-x86_64-linux".replace("0.1.0", env!("CARGO_PKG_VERSION"))
        );
    }

    #[test]
    fn sums_are_in_sha256sum_format() {
        let sums = sha256sums(&[("a/abc".into(), b"abc".to_vec())]);
        assert_eq!(
            sums,
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad  a/abc\n"
        );
    }

    #[test]
    fn the_glibc_of_this_test_binary_is_read() {
        let exe = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let v = glibc_needed(&exe).expect("a glibc-linked test binary");
        assert!(v.starts_with("2."), "{v}");
        assert_eq!(glibc_needed(b"not an elf"), None);
    }
}

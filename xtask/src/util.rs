//! Paths and process helpers shared by the subcommands.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

/// The workspace root (the parent of the xtask crate).
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives inside the workspace")
        .to_path_buf()
}

/// Project-local tools folder (bpf-linker lives in `bin/`).
pub fn tools_dir() -> PathBuf {
    root().join(".tools")
}

/// Project-local download/build cache (guest kernels, userland, initramfs).
pub fn cache_dir() -> PathBuf {
    root().join(".cache")
}

/// Cargo's target directory for this workspace.
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target"))
}

/// Print a step the way every subcommand does.
pub fn say(msg: impl AsRef<str>) {
    eprintln!("[xtask] {}", msg.as_ref());
}

/// Run a command, inheriting stdio; fail with its command line when it fails.
pub fn run_cmd(cmd: &mut Command) -> Result<()> {
    let desc = describe(cmd);
    let status = cmd
        .status()
        .with_context(|| format!("could not start `{desc}`"))?;
    if !status.success() {
        bail!("`{desc}` failed ({status})");
    }
    Ok(())
}

/// Run a command and capture stdout as a string.
pub fn output(cmd: &mut Command) -> Result<String> {
    let desc = describe(cmd);
    let out = cmd
        .output()
        .with_context(|| format!("could not start `{desc}`"))?;
    if !out.status.success() {
        bail!(
            "`{desc}` failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `program arg arg ...` for messages.
pub fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// True when running as root (apt, eBPF and QEMU setup need it).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

//! What the tests of the kernel's own RDMA consumers (NVMe over RDMA, NFS over RDMA) share:
//! commands that must succeed, sysfs/procfs writes, and the consumers' modules loaded in the
//! order xtask computed (the guest has no modprobe).

use std::{
    path::Path,
    process::{Command, Output},
};

/// Runs `cmd` to its end (whatever its status).
pub fn run(cmd: &mut Command) -> Output {
    cmd.output().unwrap_or_else(|e| panic!("run {cmd:?}: {e}"))
}

/// Runs `cmd` and fails the test, with its output, unless it succeeded.
pub fn run_ok(cmd: &mut Command) -> Output {
    let out = run(cmd);
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    out
}

pub fn write(path: &str, value: &str) {
    std::fs::write(path, value).unwrap_or_else(|e| panic!("write {value:?} to {path}: {e}"));
}

/// Loads kernel consumer module `root` and what it needs, in the load order xtask computed
/// (`/lib/modules/consumers/<root>.list`; the guest has no modprobe). Modules already loaded
/// are left alone.
pub fn load_consumer(root: &str, params: &[&str]) {
    let list_path = format!("/lib/modules/consumers/{root}.list");
    let list = std::fs::read_to_string(&list_path)
        .unwrap_or_else(|e| panic!("{list_path} ({e}): is this the xtask guest image?"));
    for m in list.lines().filter(|l| !l.is_empty()) {
        if Path::new("/sys/module").join(m).exists() {
            continue;
        }
        let mut insmod = Command::new("insmod");
        insmod.arg(format!("/lib/modules/{m}.ko"));
        if m == root {
            insmod.args(params);
        }
        run_ok(&mut insmod);
    }
}

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

/// Every CQ `rdma res show cq` (RDMA netlink) lists: (device, cqn, owner). The owner is the
/// process for a user CQ, the allocating module for a kernel CQ (printed `[rpcrdma]`: without
/// the brackets here).
pub fn rdma_res_cqs() -> Vec<(String, u64, String)> {
    let res = run_ok(Command::new("rdma").args(["-j", "res", "show", "cq"]));
    let res: serde_json::Value = serde_json::from_slice(&res.stdout).expect("rdma -j JSON");
    res.as_array()
        .expect("rdma res show cq: a list")
        .iter()
        .map(|c| {
            (
                c["ifname"].as_str().expect("ifname").to_owned(),
                c["cqn"].as_u64().expect("cqn"),
                c["comm"]
                    .as_str()
                    .unwrap_or("")
                    .trim_start_matches('[')
                    .trim_end_matches(']')
                    .to_owned(),
            )
        })
        .collect()
}

/// The `cqs` of a report's phase, each checked against `rdma res show cq` (RDMA netlink: the
/// same device, cqn and owner), as (CQ, device, owner). `what` names the test in its log line.
pub fn checked_cqs<'a>(
    phase: &'a serde_json::Value,
    what: &str,
) -> Vec<(&'a serde_json::Value, String, String)> {
    let known = rdma_res_cqs();
    let cqs = phase["cqs"].as_array().expect("cqs");
    eprintln!("{what}: cqs {cqs:?}; rdma res show cq {known:?}");
    cqs.iter()
        .map(|c| {
            let dev = c["device"]
                .as_str()
                .unwrap_or_else(|| panic!("unlabelled CQ {c}"))
                .to_owned();
            let id = c["id"].as_u64().expect("id");
            let owner = c["owner"].as_str().unwrap_or("?").to_owned();
            assert!(
                known.contains(&(dev.clone(), id, owner.clone())),
                "CQ {c} is not in rdma res show cq: {known:?}"
            );
            (c, dev, owner)
        })
        .collect()
}

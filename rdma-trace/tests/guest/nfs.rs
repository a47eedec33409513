//! NFS over RDMA between the test bed's two Soft-RoCE devices: the kernel's NFS server (nfsd,
//! NFSv4 only) listening on RDMA port 20049 of rxe0 (10.9.0.1), exporting a tmpfs, and the
//! kernel's NFS client mounting it with `proto=rdma` from rxe1 (10.9.0.2), traced with
//! `rdma-trace run -- CMD`.
//!
//! The busybox guest has none of nfs-utils, and needs none. nfsd is started through its own
//! files (`/proc/fs/nfsd`: versions, lease and grace times, `portlist`, threads). The export is written
//! into the kernel's export caches, as rpc.mountd would answer their upcalls
//! (`/proc/net/rpc/{auth.unix.ip,nfsd.export,nfsd.fh}/channel`). NFSv4 needs no rpcbind. The
//! client mounts with the kernel's text options: busybox's `mount -t nfs4` passes them through.

use std::{path::Path, process::Command};

use serde_json::Value;

use super::{
    consumers::{checked_cqs, load_consumer, run, run_ok, write},
    harness::{count, probe, run_json},
};

const NFSD: &str = "/proc/fs/nfsd";
/// The exported tmpfs, and where the client mounts it.
const EXPORT: &str = "/srv/nfs-rdma";
const MOUNT: &str = "/mnt/nfs-rdma";
/// The export caches' entries never expire within a test (seconds since the epoch: 2038).
const EXPIRY: &str = "2147483647";
/// The client's name for the server's export caches.
const DOMAIN: &str = "rdmatrace";
/// `NFSEXP_INSECURE_PORT | NFSEXP_NOSUBTREECHECK | NFSEXP_FSID` (include/uapi/linux/nfsd/
/// export.h): read-write, root not squashed, `fsid=0` (the NFSv4 root; tmpfs has no UUID).
const EXPORT_FLAGS: u32 = 0x2 | 0x400 | 0x2000;

/// The server, up until dropped (the client's mount, when a test made one, goes too).
struct NfsServer;

impl NfsServer {
    fn start() -> Self {
        for root in ["nfsd", "rpcrdma", "nfsv4"] {
            load_consumer(root, &[]);
        }
        if !Path::new(NFSD).join("threads").exists() {
            run_ok(Command::new("mount").args(["-t", "nfsd", "nfsd", NFSD]));
        }
        // A run that died before its teardown left its server behind.
        stop();
        let server = NfsServer;
        std::fs::create_dir_all(EXPORT).unwrap_or_else(|e| panic!("mkdir {EXPORT}: {e}"));
        std::fs::create_dir_all(MOUNT).unwrap_or_else(|e| panic!("mkdir {MOUNT}: {e}"));
        run_ok(Command::new("mount").args(["-t", "tmpfs", "tmpfs", EXPORT]));
        // Before the threads start: NFSv4 only (no rpcbind, no MOUNT protocol; v2 is off by
        // default, and a kernel built without it refuses "-2"), and the
        // shortest lease and grace the kernel takes.
        write(&format!("{NFSD}/versions"), "-3 +4 +4.1 +4.2\n");
        write(&format!("{NFSD}/nfsv4leasetime"), "10\n");
        write(&format!("{NFSD}/nfsv4gracetime"), "10\n");
        write(&format!("{NFSD}/portlist"), "rdma 20049\n");
        write(&format!("{NFSD}/threads"), "2\n");
        // The grace period (10 s) is waited out by the client's first OPEN: `v4_end_grace`
        // refuses (EBUSY) a server started this way on 6.1.
        for ip in ["10.9.0.1", "10.9.0.2"] {
            write(
                "/proc/net/rpc/auth.unix.ip/channel",
                &format!("nfsd {ip} {EXPIRY} {DOMAIN}\n"),
            );
        }
        write(
            "/proc/net/rpc/nfsd.export/channel",
            &format!("{DOMAIN} {EXPORT} {EXPIRY} {EXPORT_FLAGS} 65534 65534 0\n"),
        );
        // The NFSv4 root's file handle: fsid type 1 (a 4-byte fsid number), fsid 0.
        write(
            "/proc/net/rpc/nfsd.fh/channel",
            &format!("{DOMAIN} 1 \\x00000000 {EXPIRY} {EXPORT}\n"),
        );
        server
    }
}

/// Unmounts the client, stops nfsd (its listeners go with its last thread) and removes the
/// export, each step whether or not the one before it worked.
fn stop() {
    let _ = run(Command::new("umount").arg(MOUNT));
    let _ = std::fs::write(format!("{NFSD}/threads"), "0");
    let _ = run(Command::new("umount").arg(EXPORT));
}

impl Drop for NfsServer {
    fn drop(&mut self) {
        stop();
    }
}

/// The mount's block of `/proc/self/mountstats`.
fn mountstats() -> String {
    let text = std::fs::read_to_string("/proc/self/mountstats").expect("/proc/self/mountstats");
    let start = text
        .find(&format!("mounted on {MOUNT} "))
        .unwrap_or_else(|| panic!("{MOUNT} is not mounted: {text}"));
    let block = &text[start..];
    block[..block[1..].find("\ndevice ").map_or(block.len(), |i| i + 1)].to_owned()
}

/// The numbers after `key` on the line of `block` that starts with it (after blanks).
fn stat_numbers(block: &str, key: &str) -> Vec<u64> {
    let line = block
        .lines()
        .map(str::trim_start)
        .find(|l| l.starts_with(key))
        .unwrap_or_else(|| panic!("no {key:?} line in mountstats: {block}"));
    line[key.len()..]
        .split_whitespace()
        .map(|n| n.parse().unwrap_or_else(|e| panic!("{n} in {line:?}: {e}")))
        .collect()
}

/// A mount over RDMA, a write and 4 KiB direct reads through it, under one `rdma-trace run`.
///
/// Independent truths: dd's own count, and the NFS client's own counters
/// (`/proc/self/mountstats`). The mount is made inside the window, so those counters cover
/// it, but for lease renewals after the command ends (one SEQUENCE per few seconds). The
/// kernel's sources say how each side allocates its CQs: xprtrdma and svcrdma take
/// IB_POLL_WORKQUEUE CQs. `rdma res show cm_id` lists the connection, and the client's
/// `connect_count` counts it. RPC over RDMA sends each call and each reply as a SEND that
/// completes a RECV on the other side: the client's CQs poll at least one completion per reply
/// (`recvs`), and the server's one per call (`sends`).
#[test]
fn nfs_over_rdma_mount_and_reads_poll_each_sides_cqs_in_the_kernel() {
    const N: u64 = 256;
    let server = NfsServer::start();
    let cmd = format!(
        "mount -t nfs4 -o vers=4.1,proto=rdma,port=20049,addr=10.9.0.1,clientaddr=10.9.0.2 \
         10.9.0.1:/ {MOUNT} && dd if=/dev/zero of={MOUNT}/f bs=64k count=16 conv=fsync && \
         dd if={MOUNT}/f of=/dev/null bs=4k count={N} iflag=direct"
    );
    let out = run_json(
        &[
            "run", "--no-tui", "--probes", "full", "--", "sh", "-c", &cmd,
        ],
        "nfs-dd",
    );
    out.assert_success("rdma-trace run -- mount and dd over NFS/RDMA");
    let stats = mountstats();
    assert!(
        out.stderr.contains(&format!("{N}+0 records in")),
        "dd did not read {N} blocks: {}",
        out.stderr
    );
    let phases = out.report["phases"].as_array().expect("phases");
    assert_eq!(phases.len(), 1, "a -- CMD run has one window");
    let phase = &phases[0];

    // The client's counters: `xprt: rdma` (port, bind_count, connect_count, connect_time,
    // idle_time, sends, recvs, ...) and the per-op READ line (ops, transmissions, ...).
    let xprt = stat_numbers(&stats, "xprt:\trdma");
    let (connects, sends, recvs) = (xprt[2], xprt[5], xprt[6]);
    let reads = stat_numbers(&stats, "READ:")[0];
    eprintln!("nfs: xprt {xprt:?}; READ ops {reads}");
    assert!(reads >= N, "{N} direct reads of 4 KiB, {reads} READ calls");
    assert_eq!(connects, 1, "one connection for the mount: {stats}");

    // The per-CQ list, each CQ as RDMA netlink lists it (device, cqn, owner). The client
    // leaves through rxe1 (the test bed's policy routing) in most runs; in the full suite it
    // has also been seen looping back on rxe0, both ends' CQs on one device. So the sides are
    // not told apart by device: rpcrdma's CQs together polled at least one completion per
    // call (the server's RECV) and one per reply (the client's).
    let cqs = checked_cqs(phase, "nfs");
    let mut rpcrdma = 0;
    let mut rpcrdma_cqs = 0;
    for (c, dev, owner) in &cqs {
        assert!(
            ["rxe0", "rxe1"].contains(&dev.as_str()),
            "CQ {c} on neither test bed device"
        );
        // rpcrdma's CQs, not the MAD layer's (unbound workqueue, ib_core's), which carry no RPC.
        if owner == "rpcrdma" {
            assert_eq!(
                c["poll_ctx"], "workqueue",
                "xprtrdma and svcrdma poll in a workqueue: {c}"
            );
            // The consumer comes from another source than the owner: the module of the
            // callback of a completion polled from the CQ (kallsyms), where the owner is the
            // CQ's restrack name. A CQ that polled anything names it.
            if c["completions"].as_u64() > Some(0) {
                assert_eq!(c["consumer"], "rpcrdma", "{c}");
            }
            rpcrdma += c["completions"].as_u64().expect("completions");
            rpcrdma_cqs += 1;
        }
    }
    assert_eq!(rpcrdma_cqs, 4, "a send and a receive CQ per end: {cqs:?}");
    // Renewals after the window are in the client's counts but not in the trace.
    let slack = 4;
    assert!(
        rpcrdma + slack >= sends + recvs,
        "rpcrdma's CQs polled {rpcrdma} completions for {sends} calls and {recvs} replies"
    );
    let completions: u64 = cqs
        .iter()
        .map(|(c, ..)| c["completions"].as_u64().unwrap())
        .sum();
    let posted = count(phase, "rxe_cq_post");
    assert!(
        completions.abs_diff(posted) <= 16,
        "the CQs' polls returned {completions} completions, rxe posted {posted} CQEs in the window"
    );
    assert!(
        count(phase, "rxe_poll_cq") > 0,
        "the driver's poll row counts kernel consumers' polls"
    );

    // The mount's rdma_cm connection: the client's kernel QP gets ESTABLISHED from the kernel
    // (unlike librdmacm's), so both ends end their set-up at ESTABLISHED.
    let connected = String::from_utf8_lossy(
        &run_ok(Command::new("rdma").args(["res", "show", "cm_id"])).stdout,
    )
    .lines()
    .filter(|l| l.contains("dst-addr") && l.contains(":20049"))
    .count() as u64;
    let cm: &Value = &phase["rdma_cm"];
    assert_eq!(connected, 2, "rdma res show cm_id: one id per end");
    assert_eq!(cm["events"]["CONNECT_REQUEST"], 1, "{cm}");
    assert_eq!(cm["events"]["ESTABLISHED"], 2, "{cm}");
    assert!(cm["events"]["CONNECT_RESPONSE"].is_null(), "{cm}");
    assert_eq!(cm["failures"], 0, "{cm}");
    let row = probe(phase, "rdma_cm connect");
    assert_eq!(row["count"], connected, "{row}");
    assert_eq!(row["unmatched"], 0, "{row}");
    assert_eq!(row["summary"]["count"], connected, "{row}");
    drop(server);
    assert!(
        !std::fs::read_to_string("/proc/mounts")
            .unwrap()
            .contains(MOUNT),
        "the client's mount outlived the test"
    );
}

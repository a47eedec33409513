//! Guest tests: need the QEMU test bed's two Soft-RoCE devices, `rxe0` on netdev `va`
//! (10.9.0.1) and `rxe1` on netdev `vb` (10.9.0.2). Declared `test = false` in Cargo.toml, so a
//! plain `cargo test` skips them; `cargo xtask test` builds this binary and runs it in the guest.
//!
//! The `rdma-demo` binary is `$RDMA_DEMO_BIN` if set, else the path Cargo compiled in, else the
//! `rdma-demo` next to this test's `deps/` directory.

use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::Value;

struct Rxe {
    name: &'static str,
    netdev: &'static str,
    ipv4: &'static str,
    gid: &'static str,
}

const RXE0: Rxe = Rxe {
    name: "rxe0",
    netdev: "va",
    ipv4: "10.9.0.1",
    gid: "0000:0000:0000:0000:0000:ffff:0a09:0001",
};
const RXE1: Rxe = Rxe {
    name: "rxe1",
    netdev: "vb",
    ipv4: "10.9.0.2",
    gid: "0000:0000:0000:0000:0000:ffff:0a09:0002",
};

fn bin() -> PathBuf {
    if let Some(p) = std::env::var_os("RDMA_DEMO_BIN") {
        return p.into();
    }
    let built = PathBuf::from(env!("CARGO_BIN_EXE_rdma-demo"));
    if built.exists() {
        return built;
    }
    let exe = std::env::current_exe().expect("current_exe");
    let target_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("test binary in <target>/deps");
    target_dir.join("rdma-demo")
}

fn rdma_demo(args: &[&str]) -> Output {
    let bin = bin();
    let out = Command::new(&bin)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", bin.display()));
    assert!(
        out.status.code().is_some(),
        "rdma-demo {args:?} killed by a signal: {:?}",
        out.status
    );
    out
}

fn success_stdout(args: &[&str]) -> String {
    let out = rdma_demo(args);
    assert_eq!(
        out.status.code(),
        Some(0),
        "rdma-demo {args:?}: stderr {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8 stdout")
}

/// The text block of one device: from `device <name>` up to the next device (or the legend).
fn text_block<'a>(stdout: &'a str, name: &str) -> Vec<&'a str> {
    let header = format!("device {name}");
    let mut lines = stdout.lines().skip_while(|l| *l != header);
    let first = lines
        .next()
        .unwrap_or_else(|| panic!("no `{header}` line in:\n{stdout}"));
    std::iter::once(first)
        .chain(lines.take_while(|l| l.starts_with(' ')))
        .collect()
}

/// The value of `key:` in a block (first match).
fn text_value<'a>(block: &[&'a str], key: &str) -> Option<&'a str> {
    let prefix = format!("{key}:");
    block
        .iter()
        .find_map(|l| l.trim_start().strip_prefix(prefix.as_str()).map(str::trim))
}

fn check_text_block(stdout: &str, rxe: &Rxe) {
    let block = text_block(stdout, rxe.name);
    let shown = block.join("\n");
    assert_eq!(
        text_value(&block, "parent netdev"),
        Some(rxe.netdev),
        "{shown}"
    );
    assert_eq!(text_value(&block, "state"), Some("PORT_ACTIVE"), "{shown}");
    assert_eq!(
        text_value(&block, "link layer"),
        Some("Ethernet"),
        "{shown}"
    );
    let mapped = format!("::ffff:{}", rxe.ipv4);
    let v2 = block.iter().find(|l| {
        let t: Vec<&str> = l.split_whitespace().collect();
        t.first() == Some(&"*")
            && t.contains(&rxe.gid)
            && t.windows(2).any(|w| w == ["RoCE", "v2"])
            && t.contains(&rxe.netdev)
            && t.last() == Some(&mapped.as_str())
    });
    assert!(
        v2.is_some(),
        "no marked RoCE v2 GID {mapped} on {}:\n{shown}",
        rxe.netdev
    );
}

fn json_device<'a>(v: &'a Value, name: &str) -> &'a Value {
    v["devices"]
        .as_array()
        .expect("devices array")
        .iter()
        .find(|d| d["name"] == name)
        .unwrap_or_else(|| panic!("{name} not in {v:#}"))
}

fn check_json_device(v: &Value, rxe: &Rxe) {
    let dev = json_device(v, rxe.name);
    assert_eq!(dev["parent_netdev"], rxe.netdev, "{dev:#}");
    assert_eq!(dev["transport"], "InfiniBand", "{dev:#}");
    let port = &dev["ports"][0];
    assert_eq!(port["port"], 1, "{dev:#}");
    assert_eq!(port["state"], "PORT_ACTIVE", "{dev:#}");
    assert_eq!(port["link_layer"], "Ethernet", "{dev:#}");
    assert!(port["active_mtu"].as_u64().is_some(), "{dev:#}");
    let gids = port["gids"].as_array().expect("gids array");
    let found = gids.iter().any(|g| {
        g["type"] == "RoCE v2"
            && g["gid"] == rxe.gid
            && g["ipv4"] == rxe.ipv4
            && g["netdev"] == rxe.netdev
            && g["roce_v2_ipv4"] == true
    });
    assert!(
        found,
        "no RoCE v2 GID ::ffff:{} on {}: {dev:#}",
        rxe.ipv4, rxe.netdev
    );
    for g in gids {
        assert_ne!(
            g["gid"], "0000:0000:0000:0000:0000:0000:0000:0000",
            "zero GID listed: {dev:#}"
        );
    }
}

#[test]
fn devices_lists_both_rxe() {
    let stdout = success_stdout(&["devices"]);
    check_text_block(&stdout, &RXE0);
    check_text_block(&stdout, &RXE1);
    assert!(
        !text_block(&stdout, "rxe0").join("\n").contains(RXE1.ipv4),
        "{stdout}"
    );
    assert!(
        !text_block(&stdout, "rxe1").join("\n").contains(RXE0.ipv4),
        "{stdout}"
    );
}

#[test]
fn devices_json_lists_both_rxe() {
    let stdout = success_stdout(&["devices", "--json"]);
    let v: Value =
        serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("bad JSON ({e}):\n{stdout}"));
    check_json_device(&v, &RXE0);
    check_json_device(&v, &RXE1);
}

#[test]
fn device_filter_shows_only_rxe1() {
    let stdout = success_stdout(&["devices", "-d", "rxe1"]);
    check_text_block(&stdout, &RXE1);
    let headers: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("device "))
        .collect();
    assert_eq!(headers, ["device rxe1"], "{stdout}");

    let stdout = success_stdout(&["devices", "--device", "rxe1", "--json"]);
    let v: Value = serde_json::from_str(&stdout).expect("JSON");
    assert_eq!(v["devices"].as_array().map(Vec::len), Some(1), "{v:#}");
    check_json_device(&v, &RXE1);
}

#[test]
fn unknown_device_names_the_available_ones() {
    let out = rdma_demo(&["devices", "-d", "nosuchdev"]);
    assert_eq!(out.status.code(), Some(3));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(
        lines[0].starts_with("rdma-demo: no RDMA device named \"nosuchdev\" (available: "),
        "{stderr}"
    );
    assert!(
        lines[0].contains("rxe0") && lines[0].contains("rxe1"),
        "{stderr}"
    );
}

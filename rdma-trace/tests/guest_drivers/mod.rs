//! Guest tests of the hardware driver rows (mlx5, irdma, bnxt_re, mana_ib) on the guest kernel's
//! own modules. The image carries them unloaded with a load order per driver
//! (`/lib/modules/drivers/<root>.list`, see xtask/src/vm/packages.rs); a module loads without its
//! device. `rdma-trace probes --all-drivers --check` then attaches every row for real.

use std::{collections::HashMap, process::Command};

use serde_json::Value;

use super::harness::{find_by, kernel_release, rdma_trace};

/// Driver roots of the image, by the driver path their rows belong to.
const ROOTS: [(&str, &str); 4] = [
    ("mlx5", "mlx5_ib"),
    ("irdma", "irdma"),
    ("bnxt_re", "bnxt_re"),
    ("mana", "mana_ib"),
];

/// Loads the driver modules of the image (dependencies first) and unloads, in reverse order,
/// the ones it loaded when dropped.
struct DriverModules {
    loaded: Vec<String>,
    /// Driver paths whose root module the kernel package has.
    present: Vec<&'static str>,
}

impl DriverModules {
    fn load() -> Self {
        let mut me = DriverModules {
            loaded: Vec::new(),
            present: Vec::new(),
        };
        for (path, root) in ROOTS {
            let Ok(list) = std::fs::read_to_string(format!("/lib/modules/drivers/{root}.list"))
            else {
                continue;
            };
            me.present.push(path);
            for m in list.lines().filter(|l| !l.is_empty()) {
                if std::path::Path::new("/sys/module").join(m).exists() {
                    continue;
                }
                let out = Command::new("insmod")
                    .arg(format!("/lib/modules/{m}.ko"))
                    .output()
                    .expect("insmod");
                assert!(
                    out.status.success(),
                    "insmod {m} (for {root}): {}",
                    String::from_utf8_lossy(&out.stderr)
                );
                me.loaded.push(m.to_owned());
            }
        }
        me
    }
}

impl Drop for DriverModules {
    fn drop(&mut self) {
        for m in self.loaded.iter().rev() {
            let _ = Command::new("rmmod").arg(m).status();
        }
    }
}

/// Rows by name from `rdma-trace probes --all-drivers --check --json -`.
fn check_all() -> HashMap<String, Value> {
    let out = rdma_trace(&["probes", "--all-drivers", "--check", "--json", "-"]);
    out.assert_success("probes --check");
    let stdout = &out.stdout;
    let v: Value = serde_json::from_str(stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    v["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["name"].as_str().unwrap().to_owned(), r.clone()))
        .collect()
}

/// The driver functions that attach by kprobe on the guest kernels' own modules, and whether
/// only the 6.12 kernel has their module.
const ATTACHED_BY_KPROBE: [(&str, bool); 15] = [
    ("mlx5_eq_comp_int", false),
    ("mlx5_cq_tasklet_cb", false),
    ("mlx5_ib_cq_comp", false),
    ("mlx5_ib_poll_cq", false),
    ("irdma_ceq_handler", false),
    ("irdma_ceq_dpc", false),
    ("irdma_process_ceq", false),
    ("irdma_poll_cq", false),
    ("bnxt_qplib_nq_irq", true),
    ("bnxt_qplib_service_nq", true),
    ("bnxt_re_cqn_handler", true),
    ("bnxt_re_poll_cq", true),
    ("mana_gd_intr", true),
    ("mana_gd_process_eq_events", true),
    ("mana_ib_cq_handler", true),
];

fn attached_by_kprobe(rows: &HashMap<String, Value>, name: &str) {
    let r = &rows[name];
    assert_eq!(r["check"]["attached"], "kprobe", "{name}: {r:#}");
}

fn skipped_as(rows: &HashMap<String, Value>, name: &str, kind: &str) {
    let r = &rows[name];
    assert_eq!(r["skipped"]["kind"], kind, "{name}: {r:#}");
    assert!(
        r["check"].is_null(),
        "{name} was attached although skipped: {r:#}"
    );
}

#[test]
fn driver_rows_attach_on_the_kernels_own_modules_or_name_the_kernel_fact() {
    let release = kernel_release();
    let v612 = release.starts_with("6.12.");
    assert!(
        v612 || release.starts_with("6.1."),
        "unexpected kernel {release}"
    );
    let modules = DriverModules::load();
    // Debian builds mlx5 and irdma for both kernels, bnxt_re and mana_ib only for 6.12.
    let expected: &[&str] = if v612 {
        &["mlx5", "irdma", "bnxt_re", "mana"]
    } else {
        &["mlx5", "irdma"]
    };
    assert_eq!(
        modules.present, expected,
        "driver modules in the {release} image"
    );
    let rows = check_all();

    // Every hardware-driver row: attached by kprobe, or skipped for a fact that the test names.
    for (name, r) in &rows {
        let driver = r["driver"].as_str().unwrap();
        if !["mlx5", "irdma", "bnxt_re", "mana"].contains(&driver) {
            continue;
        }
        if !r["irq_patterns"].as_array().unwrap().is_empty() {
            // No device in the guest: no completion vector is registered.
            skipped_as(&rows, name, "no_irq");
            continue;
        }
        if !modules.present.contains(&driver) {
            // The kernel package has no such module: not loaded, or younger than this kernel.
            let kind = r["skipped"]["kind"].as_str().unwrap_or("attached");
            assert!(
                ["module_not_loaded", "not_in_version"].contains(&kind) && r["check"].is_null(),
                "{name}: {r:#}"
            );
            continue;
        }
        match r["skipped"]["kind"].as_str() {
            None => attached_by_kprobe(&rows, name),
            Some(kind) => assert!(
                r["skipped"]["kernel_fact"] == true,
                "{name} skipped for {kind}, not a kernel fact: {r:#}"
            ),
        }
    }

    // The facts themselves, as found in the modules of both Debian kernels (and of 6.12 only:
    // bnxt_re and mana_ib).
    for (name, only_6_12) in ATTACHED_BY_KPROBE {
        if v612 || !only_6_12 {
            attached_by_kprobe(&rows, name);
        }
    }
    // irdma_iwarp_ce_handler (static, one caller) is inlined into irdma_process_ceq.
    skipped_as(&rows, "irdma_iwarp_ce_handler", "inlined");
    assert!(
        rows["irdma_iwarp_ce_handler"]["skipped"]["reason"]
            .as_str()
            .unwrap()
            .contains("irdma is loaded"),
        "{:#}",
        rows["irdma_iwarp_ce_handler"]
    );
    if v612 {
        // mana_ib gained a kernel-side poll_cq after 6.12.
        skipped_as(&rows, "mana_ib_poll_cq", "not_in_version");
    } else {
        skipped_as(&rows, "bnxt_re_poll_cq", "module_not_loaded");
        skipped_as(&rows, "mana_ib_cq_handler", "module_not_loaded");
    }
    // Nothing stays attached after the check.
    let list = std::fs::read_to_string("/sys/kernel/debug/kprobes/list").unwrap_or_default();
    assert!(
        !list.contains("mlx5_") && !list.contains("irdma_"),
        "kprobes left: {list}"
    );
}

#[test]
fn probes_lists_the_drivers_rows_without_attaching_and_filters_by_driver() {
    let out = rdma_trace(&["probes", "--driver", "irdma", "--json", "-"]);
    out.assert_success("rdma-trace probes --driver irdma");
    let v: Value = serde_json::from_str(&out.stdout).unwrap();
    let rows = v["rows"].as_array().unwrap();
    assert!(!rows.is_empty());
    assert!(
        rows.iter()
            .all(|r| r["driver"] == "irdma" && r["check"].is_null())
    );
    // Without the module loaded, the functions' module is named as the reason.
    let r = find_by(rows, "name", "irdma_process_ceq").unwrap();
    if !std::path::Path::new("/sys/module/irdma").exists() {
        assert_eq!(r["skipped"]["kind"], "module_not_loaded", "{r:#}");
    }
    let bad = rdma_trace(&["probes", "--driver", "mlx4"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(bad.stderr.contains("mlx5"));
}

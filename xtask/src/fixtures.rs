//! `cargo xtask fixtures [--kernel K]`: kernel fixtures of the hardware RDMA drivers, read off the
//! guest kernels' own modules.
//!
//! One boot per kernel loads every driver module the image carries (no device needed), runs
//! `rdma-trace probes --all-drivers --json -` (the table's functions) and dumps kallsyms,
//! /proc/modules, the kprobe blacklist, available_filter_functions, the tracepoints, the kprobe
//! PMU type and the config into `<target>/vm-results/fixtures-<kernel>/`. The host then writes
//! `rdma-trace/tests/fixtures/<driver>-<kernel>/`: the real files, cut to the table's functions
//! (and their compiler clones) and to the modules a host with that driver has loaded (the boot's
//! own plus the driver's load list). Only the device is made up, as no such NIC is here: its
//! sysfs entry and its `/proc/interrupts` lines, named as the kernel sources of that version
//! name them ([`device`]).

use std::{
    collections::{BTreeSet, HashSet},
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use anyhow::{Context as _, Result, bail};

use crate::{
    build_ebpf,
    util::{root, run_cmd, say, target_dir},
    vm::{self, GuestRun, Kernel},
};

#[derive(clap::Args)]
pub struct Args {
    /// Only this guest kernel (default: 6.1 and 6.12, the only ones it takes).
    #[arg(long, value_enum)]
    pub kernel: Option<Kernel>,
}

/// Driver path (rdma-trace's name) and the root module of its load list in the image.
const DRIVERS: [(&str, &str); 4] = [
    ("mlx5", "mlx5_ib"),
    ("irdma", "irdma"),
    ("bnxt_re", "bnxt_re"),
    ("mana", "mana_ib"),
];

/// Config options kept in the fixtures (the rest of the config is not read by rdma-trace).
const CONFIG: &[&str] = &[
    "CONFIG_BPF_SYSCALL=",
    "CONFIG_KPROBES=",
    "CONFIG_KPROBE_EVENTS=",
    "CONFIG_DEBUG_INFO_BTF=",
    "CONFIG_DEBUG_INFO_BTF_MODULES=",
    "CONFIG_FUNCTION_TRACER=",
    "CONFIG_DYNAMIC_FTRACE=",
    "CONFIG_INFINIBAND=",
    "CONFIG_INFINIBAND_USER_ACCESS=",
    "CONFIG_MLX5_CORE=",
    "CONFIG_MLX5_INFINIBAND=",
    "CONFIG_INFINIBAND_IRDMA=",
    "CONFIG_INFINIBAND_BNXT_RE=",
    "CONFIG_MICROSOFT_MANA=",
    "CONFIG_MANA_INFINIBAND=",
    "CONFIG_RDMA_RXE=",
];

/// What the guest dumps (bash; `$OUT` is set by the caller).
const GUEST_SCRIPT: &str = r#"set -e
rm -rf "$OUT"; mkdir -p "$OUT"
cut -d' ' -f1 /proc/modules >"$OUT/modules.base"
for l in /lib/modules/drivers/*.list; do
    [ -e "$l" ] || continue
    cp "$l" "$OUT/"
    while read -r m; do
        [ -d "/sys/module/$m" ] || insmod "/lib/modules/$m.ko"
    done <"$l"
done
rdma-trace probes --all-drivers --json - >"$OUT/probes.json"
cat /proc/kallsyms >"$OUT/kallsyms"
cat /proc/modules >"$OUT/modules"
cat /sys/kernel/debug/kprobes/blacklist >"$OUT/kprobe_blacklist"
cat /sys/kernel/tracing/available_filter_functions >"$OUT/available_filter_functions"
cat /sys/kernel/tracing/available_events >"$OUT/available_events"
cat /proc/sys/kernel/osrelease >"$OUT/osrelease"
cat /sys/bus/event_source/devices/kprobe/type >"$OUT/kprobe_type"
if [ -e /sys/kernel/btf/vmlinux ]; then : >"$OUT/btf"; fi
cp "/boot/config-$(uname -r)" "$OUT/config"
"#;

pub fn run(args: &Args) -> Result<()> {
    build_ebpf::run(&build_ebpf::Args { release: false })?;
    run_cmd(
        Command::new(env!("CARGO"))
            .current_dir(root())
            .args(["build", "-p", "rdma-trace"]),
    )?;
    let kernels = match args.kernel {
        // The made-up devices' IRQ names ([`device`]) are checked against the 6.1 and 6.12
        // sources only (5.10 has no irdma at all: i40iw came before it).
        Some(k @ (Kernel::V5_10 | Kernel::V7)) => bail!(
            "no driver fixtures for {} yet: the devices' IRQ names are known for 6.1 and 6.12 only",
            k.name()
        ),
        Some(k) => vec![k],
        None => vec![Kernel::V6_1, Kernel::V6_12],
    };
    let fixtures = root().join("rdma-trace/tests/fixtures");
    for kernel in kernels {
        let dump = target_dir()
            .join("vm-results")
            .join(format!("fixtures-{}", kernel.name()));
        let script = format!("OUT={}\n{GUEST_SCRIPT}", shell_quote(&dump));
        let code = vm::run_in_guest(&GuestRun {
            kernel,
            cmd: vec![script],
            timeout: Duration::from_secs(600),
            ..GuestRun::default()
        })?;
        if code != 0 {
            bail!(
                "the {} guest could not dump its kernel facts (status {code})",
                kernel.name()
            );
        }
        for dir in write_fixtures(&dump, kernel, &fixtures)? {
            say(format!("wrote {}", dir.display()));
        }
    }
    Ok(())
}

fn shell_quote(p: &Path) -> String {
    format!("'{}'", p.display().to_string().replace('\'', "'\\''"))
}

/// Writes `<fixtures>/<driver>-<kernel>/` for every driver whose load list the dump has.
fn write_fixtures(dump: &Path, kernel: Kernel, fixtures: &Path) -> Result<Vec<PathBuf>> {
    let read = |name: &str| {
        fs::read_to_string(dump.join(name))
            .with_context(|| format!("reading {}", dump.join(name).display()))
    };
    let probes: serde_json::Value =
        serde_json::from_str(&read("probes.json")?).context("parsing probes.json")?;
    let wanted: HashSet<String> = probes["rows"]
        .as_array()
        .context("probes.json has no rows")?
        .iter()
        .flat_map(|r| r["functions"].as_array().cloned().unwrap_or_default())
        .filter_map(|f| f.as_str().map(str::to_owned))
        .collect();
    let release = read("osrelease")?.trim().to_owned();
    let base: BTreeSet<String> = read("modules.base")?.lines().map(str::to_owned).collect();
    let (kallsyms, modules) = (read("kallsyms")?, read("modules")?);
    let (blacklist, traceable) = (
        read("kprobe_blacklist")?,
        read("available_filter_functions")?,
    );
    let (events, config) = (read("available_events")?, read("config")?);
    let kprobe_type = read("kprobe_type")?;
    let btf = dump.join("btf").exists();

    let mut written = Vec::new();
    for (driver, root_module) in DRIVERS {
        let Ok(list) = fs::read_to_string(dump.join(format!("{root_module}.list"))) else {
            continue;
        };
        let mut loaded = base.clone();
        loaded.extend(list.lines().filter(|l| !l.is_empty()).map(str::to_owned));
        let dir = fixtures.join(format!("{driver}-{}", kernel.name()));
        if dir.exists() {
            fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
        }
        let put = |rel: &str, text: String| -> Result<()> {
            let p = dir.join(rel);
            fs::create_dir_all(p.parent().expect("relative path with a parent"))?;
            fs::write(&p, text).with_context(|| format!("writing {}", p.display()))
        };
        put("proc/sys/kernel/osrelease", format!("{release}\n"))?;
        put(
            "proc/kallsyms",
            keep(&kallsyms, |l| kallsyms_line(l, &wanted, &loaded)),
        )?;
        put(
            "proc/modules",
            keep(&modules, |l| {
                l.split_whitespace()
                    .next()
                    .is_some_and(|m| loaded.contains(m))
            }),
        )?;
        put(
            "sys/kernel/debug/kprobes/blacklist",
            keep(&blacklist, |l| {
                l.split_whitespace()
                    .nth(1)
                    .is_some_and(|f| wanted.contains(f))
            }),
        )?;
        put(
            "sys/kernel/tracing/available_filter_functions",
            keep(&traceable, |l| {
                let mut it = l.split_whitespace();
                let f = it.next().unwrap_or("");
                let module = it.next().map(|m| m.trim_matches(|c| c == '[' || c == ']'));
                wanted.contains(f) && module.is_none_or(|m| loaded.contains(m))
            }),
        )?;
        put(
            "sys/kernel/tracing/available_events",
            keep(&events, |l| l.starts_with("irq:") || l.starts_with("napi:")),
        )?;
        put(
            "sys/bus/event_source/devices/kprobe/type",
            kprobe_type.clone(),
        )?;
        if btf {
            put("sys/kernel/btf/vmlinux", String::new())?;
        }
        put(
            &format!("boot/config-{release}"),
            keep(&config, |l| CONFIG.iter().any(|c| l.starts_with(c))),
        )?;
        let dev = device(driver, kernel);
        let link = dir.join(format!("sys/class/infiniband/{}/device/driver", dev.ibdev));
        fs::create_dir_all(link.parent().expect("has a parent"))?;
        std::os::unix::fs::symlink(
            format!("../../../../bus/pci/drivers/{}", dev.pci_driver),
            &link,
        )
        .with_context(|| format!("linking {}", link.display()))?;
        let mut interrupts = String::from("            CPU0       CPU1\n");
        interrupts.push_str("   0:         44          0   IO-APIC   2-edge      timer\n");
        for (i, name) in dev.irqs.iter().enumerate() {
            interrupts.push_str(&format!(
                " {:>3}:      {:>5}        {:>3}   PCI-MSIX-{}  {i}-edge      {name}\n",
                120 + i,
                1000 * (i + 1),
                i,
                dev.bdf
            ));
        }
        interrupts.push_str(" NMI:          0          0   Non-maskable interrupts\n");
        put("proc/interrupts", interrupts)?;
        written.push(dir);
    }
    Ok(written)
}

fn keep(text: &str, pred: impl Fn(&str) -> bool) -> String {
    text.lines()
        .filter(|l| pred(l))
        .flat_map(|l| [l, "\n"])
        .collect()
}

/// A kallsyms text symbol of a wanted function (or a compiler clone of one: `f.isra.0`,
/// `f.cold`), in vmlinux or in a loaded module.
fn kallsyms_line(line: &str, wanted: &HashSet<String>, loaded: &BTreeSet<String>) -> bool {
    let mut it = line.split_whitespace();
    let (Some(_), Some(kind), Some(sym)) = (it.next(), it.next(), it.next()) else {
        return false;
    };
    let base = sym.split('.').next().unwrap_or(sym);
    let module = it.next().map(|m| m.trim_matches(|c| c == '[' || c == ']'));
    matches!(kind, "t" | "T") && wanted.contains(base) && module.is_none_or(|m| loaded.contains(m))
}

/// The made-up part of a fixture: one device of the driver, as the kernel names it.
struct Device {
    ibdev: &'static str,
    /// The PCI driver `/sys/class/infiniband/<dev>/device/driver` names (ib_device's parent is
    /// the PCI function).
    pci_driver: &'static str,
    bdf: &'static str,
    /// `/proc/interrupts` names, from the `request_irq` calls of that kernel version.
    irqs: Vec<&'static str>,
}

fn device(driver: &str, kernel: Kernel) -> Device {
    match (driver, kernel) {
        // drivers/net/ethernet/mellanox/mlx5/core/pci_irq.c: "mlx5_async%d" / "mlx5_comp%d",
        // then "%s@pci:%s" with the PCI name (6.1 and 6.12).
        ("mlx5", _) => Device {
            ibdev: "mlx5_0",
            pci_driver: "mlx5_core",
            bdf: "0000:3b:00.0",
            irqs: vec![
                "mlx5_async0@pci:0000:3b:00.0",
                "mlx5_comp0@pci:0000:3b:00.0",
                "mlx5_comp1@pci:0000:3b:00.0",
            ],
        },
        // drivers/infiniband/hw/irdma/hw.c: 6.1 names the vectors "irdma" (AEQ), "CEQ",
        // "AEQCEQ" (shared); 6.12 "irdma-<pci>-AEQ", "irdma-<pci>-CEQ-<n>". ice's own queues
        // are "ice-<netdev>-TxRx-<n>".
        ("irdma", Kernel::V6_1) => Device {
            ibdev: "irdma0",
            pci_driver: "ice",
            bdf: "0000:3b:00.0",
            irqs: vec!["ice-enp59s0f0-TxRx-0", "irdma", "CEQ", "CEQ"],
        },
        ("irdma", Kernel::V6_12) => Device {
            ibdev: "irdma0",
            pci_driver: "ice",
            bdf: "0000:3b:00.0",
            irqs: vec![
                "ice-enp59s0f0-TxRx-0",
                "irdma-0000:3b:00.0-AEQ",
                "irdma-0000:3b:00.0-CEQ-0",
                "irdma-0000:3b:00.0-CEQ-1",
            ],
        },
        // drivers/infiniband/hw/bnxt_re/qplib_fp.c: "bnxt_re-nq-%d@pci:%s".
        ("bnxt_re", _) => Device {
            ibdev: "bnxt_re0",
            pci_driver: "bnxt_en",
            bdf: "0000:3b:00.0",
            irqs: vec![
                "enp59s0f0np0-TxRx-0",
                "bnxt_re-nq-0@pci:0000:3b:00.0",
                "bnxt_re-nq-1@pci:0000:3b:00.0",
            ],
        },
        // drivers/net/ethernet/microsoft/mana/gdma_main.c: "mana_hwc@pci:%s",
        // "mana_q%d@pci:%s" (shared by the Ethernet and RDMA EQs).
        _ => Device {
            ibdev: "mana_0",
            pci_driver: "mana",
            bdf: "7870:00:00.0",
            irqs: vec![
                "mana_hwc@pci:7870:00:00.0",
                "mana_q0@pci:7870:00:00.0",
                "mana_q1@pci:7870:00:00.0",
            ],
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kallsyms_keeps_wanted_functions_their_clones_and_loaded_modules_only() {
        let wanted: HashSet<String> = ["irdma_dpc", "__napi_poll"].map(String::from).into();
        let loaded: BTreeSet<String> = ["irdma".to_owned()].into();
        let text = "\
ffffffff817e0420 t __napi_poll
ffffffff81000000 T startup_64
ffffffffc0001000 t irdma_dpc\t[irdma]
ffffffffc0002000 t irdma_dpc.cold\t[irdma]
ffffffffc0003000 d irdma_dpc\t[irdma]
ffffffffc0004000 t irdma_dpc\t[other]
";
        let kept = keep(text, |l| kallsyms_line(l, &wanted, &loaded));
        assert_eq!(
            kept,
            "ffffffff817e0420 t __napi_poll\nffffffffc0001000 t irdma_dpc\t[irdma]\n\
             ffffffffc0002000 t irdma_dpc.cold\t[irdma]\n"
        );
    }

    #[test]
    fn every_driver_has_a_device_on_both_kernels() {
        for (driver, _) in DRIVERS {
            for k in [Kernel::V6_1, Kernel::V6_12] {
                let d = device(driver, k);
                assert!(!d.irqs.is_empty() && !d.ibdev.is_empty(), "{driver}");
            }
        }
        assert_eq!(device("mana", Kernel::V6_12).pci_driver, "mana");
    }
}

//! CPU topology from sysfs (`/sys/devices/system/cpu`, `/sys/devices/system/node`), and the
//! placement class of two CPUs: same CPU, SMT sibling, same LLC, same NUMA node, other node.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::Path,
};

use rdma_trace_common::waterfall::{NO_ID, WfCpuTopo};

/// Names of the classes, by class number.
pub const CLASS_NAMES: [&str; 6] = [
    "same CPU",
    "SMT sibling",
    "same LLC",
    "same NUMA node",
    "other node",
    "unknown",
];

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Topology {
    /// Per CPU: its SMT siblings (itself included), the CPUs sharing its last-level cache, and
    /// its NUMA node.
    cpus: BTreeMap<u32, CpuInfo>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct CpuInfo {
    siblings: BTreeSet<u32>,
    llc: BTreeSet<u32>,
    node: Option<u32>,
}

/// `0-3,8,10-11` → {0,1,2,3,8,10,11}; `None` on anything else.
pub fn parse_cpu_list(s: &str) -> Option<BTreeSet<u32>> {
    let mut out = BTreeSet::new();
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u32, u32) = (a.parse().ok()?, b.parse().ok()?);
                if b < a || b - a > 65_536 {
                    return None;
                }
                out.extend(a..=b);
            }
            None => {
                out.insert(part.parse().ok()?);
            }
        }
    }
    Some(out)
}

fn read(p: &Path) -> Option<String> {
    fs::read_to_string(p).ok()
}

impl Topology {
    /// Read under `root` (`/` for the running machine; a fixture tree in tests).
    pub fn read(root: &Path) -> Topology {
        let cpu_dir = root.join("sys/devices/system/cpu");
        let mut cpus = BTreeMap::new();
        let Ok(entries) = fs::read_dir(&cpu_dir) else {
            return Topology::default();
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(n) = name.strip_prefix("cpu").and_then(|n| n.parse::<u32>().ok()) else {
                continue;
            };
            let dir = e.path();
            let siblings = ["topology/core_cpus_list", "topology/thread_siblings_list"]
                .iter()
                .find_map(|f| read(&dir.join(f)).and_then(|s| parse_cpu_list(&s)))
                .unwrap_or_else(|| BTreeSet::from([n]));
            // The last-level cache: the highest level among the unified/data caches.
            let mut llc: Option<(u32, BTreeSet<u32>)> = None;
            if let Ok(caches) = fs::read_dir(dir.join("cache")) {
                for c in caches.flatten() {
                    let p = c.path();
                    let level = read(&p.join("level")).and_then(|l| l.trim().parse::<u32>().ok());
                    let kind = read(&p.join("type")).unwrap_or_default();
                    let shared = read(&p.join("shared_cpu_list")).and_then(|s| parse_cpu_list(&s));
                    if let (Some(level), Some(shared)) = (level, shared)
                        && kind.trim() != "Instruction"
                        && llc.as_ref().is_none_or(|(l, _)| level > *l)
                    {
                        llc = Some((level, shared));
                    }
                }
            }
            let node = fs::read_dir(&dir).ok().and_then(|d| {
                d.flatten().find_map(|e| {
                    e.file_name()
                        .to_string_lossy()
                        .strip_prefix("node")
                        .and_then(|n| n.parse().ok())
                })
            });
            cpus.insert(
                n,
                CpuInfo {
                    siblings,
                    llc: llc.map(|(_, s)| s).unwrap_or_default(),
                    node,
                },
            );
        }
        // Nodes from /sys/devices/system/node when the CPU directories have no node links.
        if let Ok(nodes) = fs::read_dir(root.join("sys/devices/system/node")) {
            for e in nodes.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                let Some(node) = name.strip_prefix("node").and_then(|n| n.parse().ok()) else {
                    continue;
                };
                for c in read(&e.path().join("cpulist"))
                    .and_then(|s| parse_cpu_list(&s))
                    .unwrap_or_default()
                {
                    if let Some(info) = cpus.get_mut(&c) {
                        info.node.get_or_insert(node);
                    }
                }
            }
        }
        Topology { cpus }
    }

    #[cfg(test)]
    pub fn cpus(&self) -> impl Iterator<Item = u32> + '_ {
        self.cpus.keys().copied()
    }

    /// CPU `cpu`'s place as the eBPF side's `WF_CPU_TOPO` holds it: the lowest CPU of its
    /// core and of its LLC, and its node ([`WfCpuTopo::UNKNOWN`] for a CPU sysfs did not list).
    pub fn ids(&self, cpu: u32) -> WfCpuTopo {
        let Some(x) = self.cpus.get(&cpu) else {
            return WfCpuTopo::UNKNOWN;
        };
        let lowest = |s: &BTreeSet<u32>| s.first().copied().unwrap_or(NO_ID);
        WfCpuTopo {
            core: lowest(&x.siblings),
            llc: lowest(&x.llc),
            node: x.node.unwrap_or(NO_ID),
            known: 1,
        }
    }

    /// `WF_CPU_TOPO`'s entries for CPUs `0..ncpus`.
    pub fn table(&self, ncpus: u32) -> Vec<WfCpuTopo> {
        (0..ncpus).map(|c| self.ids(c)).collect()
    }

    /// Placement class of a completion handled on CPU `a` for a waiter on CPU `b`: what the
    /// eBPF side computes from [`Self::table`] (the tests' check of the table).
    #[cfg(test)]
    pub fn class(&self, a: u32, b: u32) -> u32 {
        WfCpuTopo::class(a, &self.ids(a), b, &self.ids(b))
    }
}

/// The machine's possible CPUs under `root` (`sys/devices/system/cpu/possible`) as the per-CPU
/// maps count them: the highest CPU id + 1.
pub fn possible_cpus(root: &Path) -> Result<u32, String> {
    let path = root.join("sys/devices/system/cpu/possible");
    let text = fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    parse_cpu_list(&text)
        .and_then(|cpus| cpus.last().map(|&c| c + 1))
        .ok_or_else(|| format!("{}: not a CPU list: {:?}", path.display(), text.trim()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdma_trace_common::waterfall::{
        CLASS_LLC, CLASS_NODE, CLASS_OTHER_NODE, CLASS_SAME_CPU, CLASS_SMT, CLASS_UNKNOWN,
    };

    /// A directory removed when dropped.
    struct TempDir(std::path::PathBuf);

    impl TempDir {
        fn new() -> TempDir {
            use std::sync::atomic::{AtomicU32, Ordering};
            static N: AtomicU32 = AtomicU32::new(0);
            let p = std::env::temp_dir().join(format!(
                "rdma-trace-topology-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            fs::create_dir_all(&p).unwrap();
            TempDir(p)
        }

        fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn write(root: &Path, rel: &str, text: &str) {
        let p = root.join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, text).unwrap();
    }

    /// A CPU's cache `index` (its `level` and `type`) shared by the CPUs of `shared`, under
    /// the CPU's directory `base`.
    fn cache(root: &Path, base: &str, (index, level, kind): (u32, u32, &str), shared: &str) {
        let dir = format!("{base}/cache/index{index}");
        write(root, &format!("{dir}/level"), &format!("{level}\n"));
        write(root, &format!("{dir}/type"), &format!("{kind}\n"));
        write(root, &format!("{dir}/shared_cpu_list"), shared);
    }

    /// Two nodes × one LLC × two cores × two threads: CPUs 0..8, siblings (n, n+4) as Intel
    /// numbers them.
    fn fixture() -> TempDir {
        let dir = TempDir::new();
        let r = dir.path();
        for cpu in 0..8u32 {
            let base = format!("sys/devices/system/cpu/cpu{cpu}");
            let sib = cpu % 4;
            write(
                r,
                &format!("{base}/topology/thread_siblings_list"),
                &format!("{},{}\n", sib, sib + 4),
            );
            let llc = if sib < 2 { "0-1,4-5" } else { "2-3,6-7" };
            cache(r, &base, (0, 1, "Data"), &format!("{},{}\n", sib, sib + 4));
            cache(r, &base, (3, 3, "Unified"), &format!("{llc}\n"));
        }
        write(r, "sys/devices/system/node/node0/cpulist", "0-1,4-5\n");
        write(r, "sys/devices/system/node/node1/cpulist", "2-3,6-7\n");
        write(r, "sys/devices/system/cpu/online", "0-7\n");
        dir
    }

    #[test]
    fn cpu_lists() {
        assert_eq!(
            parse_cpu_list("0-2,5\n"),
            Some(BTreeSet::from([0, 1, 2, 5]))
        );
        assert_eq!(parse_cpu_list(""), Some(BTreeSet::new()));
        assert_eq!(parse_cpu_list("3-1"), None);
        assert_eq!(parse_cpu_list("x"), None);
    }

    #[test]
    fn classes_from_a_two_node_fixture() {
        let dir = fixture();
        let t = Topology::read(dir.path());
        assert_eq!(t.cpus().count(), 8);
        assert_eq!(t.class(1, 1), CLASS_SAME_CPU);
        assert_eq!(t.class(1, 5), CLASS_SMT);
        assert_eq!(t.class(0, 1), CLASS_LLC);
        assert_eq!(t.class(2, 7), CLASS_LLC);
        assert_eq!(t.class(0, 2), CLASS_OTHER_NODE);
        assert_eq!(t.class(0, 99), CLASS_UNKNOWN);
    }

    #[test]
    fn same_node_without_a_shared_llc_and_missing_trees() {
        let dir = fixture();
        // Split node 0's LLC in two: 0,4 and 1,5 now share only the node.
        for (cpu, llc) in [(0u32, "0,4"), (4, "0,4"), (1, "1,5"), (5, "1,5")] {
            write(
                dir.path(),
                &format!("sys/devices/system/cpu/cpu{cpu}/cache/index3/shared_cpu_list"),
                &format!("{llc}\n"),
            );
        }
        let t = Topology::read(dir.path());
        assert_eq!(t.class(0, 1), CLASS_NODE);
        let empty = TempDir::new();
        let t = Topology::read(empty.path());
        assert_eq!(t.class(0, 0), CLASS_UNKNOWN);
    }

    /// 256 CPUs: two nodes × two LLCs × 32 cores × two threads, the siblings numbered (n, n+128)
    /// as Intel does. The old fixed tables covered CPUs 0..64 only.
    fn fixture_256() -> TempDir {
        let dir = TempDir::new();
        let r = dir.path();
        let list =
            |a: u32, n: u32| format!("{}-{},{}-{}\n", a, a + n - 1, a + 128, a + 128 + n - 1);
        for cpu in 0..256u32 {
            let base = format!("sys/devices/system/cpu/cpu{cpu}");
            let core = cpu % 128;
            write(
                r,
                &format!("{base}/topology/core_cpus_list"),
                &format!("{},{}\n", core, core + 128),
            );
            cache(r, &base, (3, 3, "Unified"), &list(core / 32 * 32, 32));
        }
        write(r, "sys/devices/system/node/node0/cpulist", &list(0, 64));
        write(r, "sys/devices/system/node/node1/cpulist", &list(64, 64));
        write(r, "sys/devices/system/cpu/possible", "0-255\n");
        dir
    }

    #[test]
    fn a_256_cpu_machine_gets_a_table_entry_and_a_class_for_every_cpu() {
        let dir = fixture_256();
        let t = Topology::read(dir.path());
        let n = possible_cpus(dir.path()).unwrap();
        assert_eq!(n, 256);
        let table = t.table(n);
        assert_eq!(table.len(), 256);
        assert!(table.iter().all(|e| e.known == 1), "every CPU read");
        // What the eBPF side computes from the table, for CPUs past the old 64.
        let class = |a: u32, b: u32| WfCpuTopo::class(a, &table[a as usize], b, &table[b as usize]);
        assert_eq!(class(200, 200), CLASS_SAME_CPU);
        assert_eq!(class(200, 72), CLASS_SMT);
        assert_eq!(class(255, 127), CLASS_SMT);
        assert_eq!(class(0, 31), CLASS_LLC);
        assert_eq!(
            class(160, 31),
            CLASS_NODE,
            "cores 32 and 31: other LLCs, one node"
        );
        assert_eq!(class(0, 32), CLASS_NODE);
        assert_eq!(class(0, 255), CLASS_OTHER_NODE);
        assert_eq!(class(190, 70), CLASS_OTHER_NODE, "cores 62 and 70");
        for (a, b) in [(0, 255), (190, 70), (3, 131), (64, 100)] {
            assert_eq!(
                class(a, b),
                t.class(a, b),
                "table against the sets: {a}, {b}"
            );
        }
    }

    #[test]
    fn possible_cpus_count_up_to_the_highest_id_and_a_bad_list_says_where() {
        let dir = TempDir::new();
        write(dir.path(), "sys/devices/system/cpu/possible", "0-3,8\n");
        assert_eq!(possible_cpus(dir.path()), Ok(9));
        write(dir.path(), "sys/devices/system/cpu/possible", "junk\n");
        let e = possible_cpus(dir.path()).unwrap_err();
        assert!(e.contains("possible") && e.contains("junk"), "{e}");
        assert!(possible_cpus(&dir.path().join("none")).is_err());
    }
}

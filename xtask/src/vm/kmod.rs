//! Kernel modules: their `depends=` from the `.modinfo` strings, and a load order (dependencies
//! first) computed on the host, since the guest has no modprobe.

use std::collections::HashSet;

use anyhow::Result;

/// Module names use `_` and `-` interchangeably; the kernel reports `_`.
pub fn normalize(name: &str) -> String {
    name.replace('-', "_")
}

/// The module name of a file `foo-bar.ko` / `foo-bar.ko.xz` (`foo_bar`), if it is a module.
pub fn module_file_name(file_name: &str) -> Option<String> {
    let stem = file_name
        .strip_suffix(".ko")
        .or_else(|| file_name.strip_suffix(".ko.xz"))?;
    Some(normalize(stem))
}

/// The `depends=` list of a module image: the NUL-separated `key=value` strings of `.modinfo`.
/// A module without dependencies has an empty `depends=` (or none at all).
pub fn modinfo_depends(ko: &[u8]) -> Vec<String> {
    const KEY: &[u8] = b"depends=";
    let mut start = 0;
    while let Some(pos) = find(&ko[start..], KEY) {
        let at = start + pos;
        if at == 0 || ko[at - 1] == 0 {
            let value = &ko[at + KEY.len()..];
            let end = value.iter().position(|&b| b == 0).unwrap_or(value.len());
            return String::from_utf8_lossy(&value[..end])
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(normalize)
                .collect();
        }
        start = at + 1;
    }
    Vec::new()
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// The load order of `roots` and everything they depend on: each module after its dependencies,
/// each once. `deps(name)` returns `Ok(None)` for a module that needs no loading (built in).
/// A dependency cycle cannot loop: a module being visited is not visited again.
pub fn load_order(
    roots: &[&str],
    mut deps: impl FnMut(&str) -> Result<Option<Vec<String>>>,
) -> Result<Vec<String>> {
    fn visit(
        name: &str,
        deps: &mut dyn FnMut(&str) -> Result<Option<Vec<String>>>,
        seen: &mut HashSet<String>,
        order: &mut Vec<String>,
    ) -> Result<()> {
        let name = normalize(name);
        if !seen.insert(name.clone()) {
            return Ok(());
        }
        let Some(ds) = deps(&name)? else {
            return Ok(());
        };
        for d in ds {
            visit(&d, deps, seen, order)?;
        }
        order.push(name);
        Ok(())
    }
    let mut seen = HashSet::new();
    let mut order = Vec::new();
    for r in roots {
        visit(r, &mut deps, &mut seen, &mut order)?;
    }
    Ok(order)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    #[test]
    fn parses_depends_from_modinfo() {
        let ko = b"\x7fELF junk __UNIQUE_ID_depends123\0license=GPL\0depends=ib_core,ib-uverbs,udp_tunnel\0\
                   retpoline=Y\0name=rdma_rxe\0";
        assert_eq!(modinfo_depends(ko), ["ib_core", "ib_uverbs", "udp_tunnel"]);
    }

    #[test]
    fn empty_or_missing_depends() {
        assert!(modinfo_depends(b"\0license=GPL\0depends=\0name=veth\0").is_empty());
        assert!(modinfo_depends(b"\0license=GPL\0name=x\0").is_empty());
        // "depends=" not at the start of a string is not the modinfo key.
        assert!(modinfo_depends(b"\0xdepends=a\0").is_empty());
        assert_eq!(modinfo_depends(b"depends=a"), ["a"]);
    }

    #[test]
    fn module_file_names() {
        assert_eq!(
            module_file_name("9pnet_virtio.ko").as_deref(),
            Some("9pnet_virtio")
        );
        assert_eq!(
            module_file_name("crc32-generic.ko.xz").as_deref(),
            Some("crc32_generic")
        );
        assert_eq!(module_file_name("modules.order"), None);
    }

    fn order(map: &HashMap<&str, Vec<&str>>, roots: &[&str]) -> Vec<String> {
        load_order(roots, |n| {
            Ok(map
                .get(n)
                .map(|ds| ds.iter().map(|d| d.to_string()).collect()))
        })
        .unwrap()
    }

    #[test]
    fn dependencies_first_each_once() {
        let map = HashMap::from([
            ("rdma_rxe", vec!["ib_core", "ib_uverbs", "udp_tunnel"]),
            ("ib_uverbs", vec!["ib_core"]),
            ("ib_core", vec![]),
            ("udp_tunnel", vec![]),
            ("crc32_generic", vec![]),
        ]);
        let o = order(&map, &["crc32_generic", "rdma_rxe", "ib_uverbs"]);
        assert_eq!(
            o,
            [
                "crc32_generic",
                "ib_core",
                "ib_uverbs",
                "udp_tunnel",
                "rdma_rxe"
            ]
        );
    }

    #[test]
    fn builtins_are_skipped_and_cycles_end() {
        // virtio_pci is not in the map: built in, nothing to load.
        let map = HashMap::from([("a", vec!["b", "virtio_pci"]), ("b", vec!["a"])]);
        let o = order(&map, &["a", "virtio_pci"]);
        assert_eq!(o, ["b", "a"]);
    }

    #[test]
    fn dashes_are_normalized() {
        let map = HashMap::from([("x_y", vec!["p-q"]), ("p_q", vec![])]);
        assert_eq!(order(&map, &["x-y"]), ["p_q", "x_y"]);
    }
}

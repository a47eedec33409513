//! Everything the guest test bed takes from Debian, pinned in ONE place: the kernel packages, the
//! guest userland, the kernel modules to load and the kernel options the project relies on.

use super::Kernel;

/// Where a kernel package comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// The host's own apt lists (bookworm, bookworm-security).
    System,
    /// A private apt sources list inside the cache: this suite (bookworm-backports, bullseye,
    /// trixie-backports) of the host's Debian mirror.
    Suite(&'static str),
}

/// A Debian kernel package: the pinned name, and the pattern `<prefix><N><suffix>` (N a number, or
/// dot-separated numbers such as `3.4`) that newer ABI packages of the same series follow, for when
/// Debian has retired the pinned one.
#[derive(Clone, Copy, Debug)]
pub struct KernelPackage {
    pub pinned: &'static str,
    pub prefix: &'static str,
    pub suffix: &'static str,
    pub origin: Origin,
}

/// The kernel package for each guest kernel.
pub fn kernel_package(kernel: Kernel) -> KernelPackage {
    match kernel {
        Kernel::V5_10 => KernelPackage {
            pinned: "linux-image-5.10.0-32-amd64-unsigned",
            prefix: "linux-image-5.10.0-",
            suffix: "-amd64-unsigned",
            origin: Origin::Suite("bullseye"),
        },
        Kernel::V6_1 => KernelPackage {
            pinned: "linux-image-6.1.0-57-amd64-unsigned",
            prefix: "linux-image-6.1.0-",
            suffix: "-amd64-unsigned",
            origin: Origin::System,
        },
        Kernel::V6_12 => KernelPackage {
            pinned: "linux-image-6.12.95+deb12-amd64-unsigned",
            prefix: "linux-image-6.12.",
            suffix: "+deb12-amd64-unsigned",
            origin: Origin::Suite("bookworm-backports"),
        },
        // Since trixie the image package has no -unsigned twin: the signed one holds the same
        // bzImage (the signature is appended). Its series is every 7.x, newest first.
        Kernel::V7 => KernelPackage {
            pinned: "linux-image-7.3.4+deb13-amd64",
            prefix: "linux-image-7.",
            suffix: "+deb13-amd64",
            origin: Origin::Suite("trixie-backports"),
        },
    }
}

/// Guest userland (bookworm), unpacked with `dpkg -x`, never installed on the host: busybox for the
/// init, bash for the commands, libibverbs + the rxe provider + ibverbs-utils + perftest, the
/// rdma_cm programs (rdmacm-utils: rping, rdma_server/rdma_client, ucmatose; qperf), iproute2
/// (`ip`, `rdma`), nvme-cli (`nvme connect -t rdma` to the NVMe over RDMA target) and every
/// library these link. fio is left out: Debian links it with librados, librbd and libgfapi, whose
/// closure is most of Ceph; the NVMe guest test reads with busybox `dd iflag=direct`.
pub const USERLAND: &[&str] = &[
    "busybox-static",
    "bash",
    "libtinfo6",
    "libc6",
    "libgcc-s1",
    "libibverbs1",
    "ibverbs-providers",
    "ibverbs-utils",
    "perftest",
    "rdmacm-utils",
    "qperf",
    "librdmacm1",
    "libibumad3",
    "libnl-3-200",
    "libnl-route-3-200",
    "libpci3",
    "libudev1",
    "zlib1g",
    "iproute2",
    "libmnl0",
    "libbsd0",
    "libcap2",
    "libmd0",
    "libelf1",
    "libbpf1",
    "libselinux1",
    "libpcre2-8-0",
    "libdb5.3",
    "libtirpc3",
    "libxtables12",
    "libgssapi-krb5-2",
    "libkrb5-3",
    "libk5crypto3",
    "libcom-err2",
    "libkrb5support0",
    "libkeyutils1",
    "libatm1",
    "libssl3",
    "nvme-cli",
    "libnvme1",
    "libjson-c5",
];

/// Added to `USERLAND` in the bench image (`GuestRun::bench`): bpftrace and bpftool for
/// `cargo xtask bench trace`, tmux for its live-view run (and libc-bin for the C.UTF-8 locale,
/// without which tmux refuses to start), with the libraries they link that the test bed lacks.
pub const BENCH_EXTRA: &[&str] = &[
    "bpftrace",
    "bpftool",
    "tmux",
    "libc-bin",
    "libevent-core-2.1-7",
    "libutempter0",
    "ncurses-base",
    "libbpfcc",
    "libdw1",
    "libclang1-14",
    "libclang-cpp14",
    "libllvm14",
    "libstdc++6",
    "libffi8",
    "libedit2",
    "libz3-4",
    "libxml2",
    "libicu72",
    "liblzma5",
    "libbz2-1.0",
    "gcc-12-base",
];

/// Modules to load (their `depends=` closure is computed on the host). `crc32_generic` is named
/// explicitly: rdma_rxe needs the crc32 crypto driver and the guest has no modprobe to find it.
/// `rdma_ucm` (`/dev/infiniband/rdma_cm`, for librdmacm's programs) brings rdma_cm, ib_cm and
/// iw_cm with it.
pub const MODULE_ROOTS: &[&str] = &[
    "crc32_generic",
    "ib_core",
    "ib_uverbs",
    "rdma_ucm",
    "ib_umad",
    "rdma_rxe",
    "veth",
    "virtio_pci",
    "9pnet_virtio",
    "9p",
];

/// Hardware RDMA drivers that go into the image but are NOT loaded at boot (the guest has none
/// of their devices; a module loads without its device). Each root's load order, dependencies
/// first, is in `/lib/modules/drivers/<root>.list`; `rdma-trace`'s driver guest test and
/// `cargo xtask fixtures` load them. A root the kernel package lacks (Debian's 6.1 builds neither
/// bnxt_re nor mana_ib) has no list.
pub const DRIVER_MODULES: &[&str] = &["mlx5_ib", "irdma", "bnxt_re", "mana_ib"];

/// The kernel's own RDMA consumers: in the image but NOT loaded at boot. Each root's load order,
/// dependencies first, is in `/lib/modules/consumers/<root>.list`; the NVMe over RDMA guest test
/// loads them (nvmet_rdma brings nvmet and configfs, nvme_rdma brings nvme_fabrics and
/// nvme_core, and null_blk is the target's namespace). Unlike a hardware driver, every root must be in the
/// kernel package.
pub const CONSUMER_MODULES: &[&str] = &[
    "null_blk",
    "nvmet_rdma",
    "nvme_rdma",
    "nfsd",
    "rpcrdma",
    "nfsv4",
];

/// Kernel options the project needs, checked in the package's `boot/config-*` (see
/// [`required_config`]).
pub const REQUIRED_CONFIG: &[&str] = &[
    "CONFIG_KPROBES=y",
    "CONFIG_KPROBE_EVENTS=y",
    "CONFIG_DEBUG_INFO_BTF=y",
    "CONFIG_DEBUG_INFO_BTF_MODULES=y",
    "CONFIG_RDMA_RXE=m",
    "CONFIG_INFINIBAND_USER_ACCESS=m",
];

/// The packages a split kernel image package `image` (`linux-image-<abi>`) depends on for its
/// files: every `linux-<part>-<abi>` in its `Depends` field (`linux-base-`, `linux-binary-`,
/// `linux-modules-<abi>`). None for the older, whole image packages.
pub fn kernel_parts(image: &str, depends: &str) -> Vec<String> {
    let Some(abi) = image.strip_prefix("linux-image-") else {
        return Vec::new();
    };
    let mut parts: Vec<String> = depends
        .split([',', '|'])
        .filter_map(|dep| dep.split_whitespace().next())
        .filter(|name| {
            name.strip_prefix("linux-")
                .and_then(|rest| rest.strip_suffix(abi))
                .and_then(|rest| rest.strip_suffix('-'))
                .is_some_and(|part| !part.is_empty() && part != "image")
        })
        .map(str::to_owned)
        .collect();
    parts.sort();
    parts.dedup();
    parts
}

/// [`MODULE_ROOTS`] for `kernel`. From 6.15 rxe computes its CRC with the crc32 library, and
/// the crypto driver `crc32_generic` is gone.
pub fn module_roots(kernel: Kernel) -> Vec<&'static str> {
    MODULE_ROOTS
        .iter()
        .copied()
        .filter(|m| kernel != Kernel::V7 || *m != "crc32_generic")
        .collect()
}

/// [`REQUIRED_CONFIG`] for `kernel`. Module BTF came in 5.11: 5.10 lacks it, and rdma-trace names
/// what degrades there.
pub fn required_config(kernel: Kernel) -> Vec<&'static str> {
    REQUIRED_CONFIG
        .iter()
        .copied()
        .filter(|o| kernel != Kernel::V5_10 || *o != "CONFIG_DEBUG_INFO_BTF_MODULES=y")
        .collect()
}

/// The candidates that follow `<prefix><N><suffix>` (N digits, or dot-separated digits compared
/// as numbers: `3.10` is newer than `3.4`), newest (largest N) first. Flavours such as `-cloud` or
/// `-rt` do not match, because their middle part is not a number.
pub fn matching_newest_first<'a>(
    candidates: impl IntoIterator<Item = &'a str>,
    prefix: &str,
    suffix: &str,
) -> Vec<&'a str> {
    let mut found: Vec<(Vec<u64>, &str)> = candidates
        .into_iter()
        .filter_map(|name| {
            let middle = name.strip_prefix(prefix)?.strip_suffix(suffix)?;
            let version = middle
                .split('.')
                .map(|part| {
                    if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
                        return None;
                    }
                    part.parse().ok()
                })
                .collect::<Option<Vec<u64>>>()?;
            Some((version, name))
        })
        .collect();
    found.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(b.1)));
    found.dedup_by(|a, b| a.1 == b.1);
    found.into_iter().map(|(_, name)| name).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The newest of `names` that is a package of kernel `k`.
    fn newest<'a>(k: Kernel, names: &[&'a str]) -> Option<&'a str> {
        let p = kernel_package(k);
        matching_newest_first(names.iter().copied(), p.prefix, p.suffix)
            .first()
            .copied()
    }

    #[test]
    fn newest_6_1_by_number_not_by_text() {
        let names = [
            "linux-image-6.1.0-9-amd64-unsigned",
            "linux-image-6.1.0-57-amd64-unsigned",
            "linux-image-6.1.0-100-amd64-unsigned",
            "linux-image-6.1.0-200-cloud-amd64-unsigned",
            "linux-image-6.1.0-300-rt-amd64-unsigned",
            "linux-image-6.1.0-400-amd64",
            "linux-image-6.1.0--amd64-unsigned",
            "linux-headers-6.1.0-500-amd64-unsigned",
        ];
        assert_eq!(
            newest(Kernel::V6_1, &names),
            Some("linux-image-6.1.0-100-amd64-unsigned")
        );
        let p = kernel_package(Kernel::V6_1);
        assert_eq!(
            matching_newest_first(names, p.prefix, p.suffix),
            [
                "linux-image-6.1.0-100-amd64-unsigned",
                "linux-image-6.1.0-57-amd64-unsigned",
                "linux-image-6.1.0-9-amd64-unsigned",
            ]
        );
    }

    #[test]
    fn newest_6_12() {
        let names = [
            "linux-image-6.12.95+deb12-amd64-unsigned",
            "linux-image-6.12.117+deb12-amd64-unsigned",
            "linux-image-6.12.117+deb12-cloud-amd64-unsigned",
            "linux-image-6.12.118+deb12-rt-amd64-unsigned",
            "linux-image-6.12.119+deb13-amd64-unsigned",
            "linux-image-6.12.120+deb12-amd64-unsigned-dbg",
        ];
        assert_eq!(
            newest(Kernel::V6_12, &names),
            Some("linux-image-6.12.117+deb12-amd64-unsigned")
        );
        assert_eq!(newest(Kernel::V6_12, &[]), None);
    }

    #[test]
    fn newest_7_by_version_numbers() {
        let names = [
            "linux-image-7.3.4+deb13-amd64",
            "linux-image-7.3.10+deb13-amd64",
            "linux-image-7.2.99+deb13-amd64",
            "linux-image-7.4+deb13-amd64",
            "linux-image-7.5.1+deb13-cloud-amd64",
            "linux-image-7.5.1+deb13-rt-amd64",
            "linux-image-7.5..1+deb13-amd64",
            "linux-image-7.6.1+deb14-amd64",
            "linux-image-7.6.1+deb13-amd64-dbg",
        ];
        let p = kernel_package(Kernel::V7);
        assert_eq!(
            matching_newest_first(names, p.prefix, p.suffix),
            [
                "linux-image-7.4+deb13-amd64",
                "linux-image-7.3.10+deb13-amd64",
                "linux-image-7.3.4+deb13-amd64",
                "linux-image-7.2.99+deb13-amd64",
            ]
        );
    }

    #[test]
    fn parts_of_a_split_kernel() {
        let depends = "dracut | initramfs-tools (>= 0.120+deb8u2) | linux-initramfs-tool, \
            linux-base-7.3.4+deb13-amd64 (= 7.3.4-1~bpo13+1), \
            linux-binary-7.3.4+deb13-amd64 (= 7.3.4-1~bpo13+1), \
            linux-modules-7.3.4+deb13-amd64 (= 7.3.4-1~bpo13+1), linux-base (>= 4.17~), \
            linux-modules-7.3.4+deb13-cloud-amd64";
        assert_eq!(
            kernel_parts("linux-image-7.3.4+deb13-amd64", depends),
            [
                "linux-base-7.3.4+deb13-amd64",
                "linux-binary-7.3.4+deb13-amd64",
                "linux-modules-7.3.4+deb13-amd64",
            ]
        );
        // The older packages hold the files themselves.
        let whole =
            "kmod, linux-base (>= 4.3~), initramfs-tools (>= 0.120+deb8u2) | linux-initramfs-tool";
        assert!(kernel_parts("linux-image-6.1.0-57-amd64-unsigned", whole).is_empty());
    }

    #[test]
    fn pinned_names_follow_their_own_pattern() {
        for k in [Kernel::V5_10, Kernel::V6_1, Kernel::V6_12, Kernel::V7] {
            let pinned = kernel_package(k).pinned;
            assert_eq!(newest(k, &[pinned]), Some(pinned));
        }
    }
}

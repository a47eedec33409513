//! The guest images: a cached base initramfs per kernel (userland + modules + init), and a tiny
//! per-run cpio (command, environment, extra libraries) appended to a copy of it.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    fs::{self, File},
    io::{BufWriter, Read as _, Write as _},
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

use super::{Kernel, apt, cpio, kimage, kmod, packages};
use crate::util::{cache_dir, output, say};

/// Bump when the image-building logic changes in a way the stamp cannot see. The cached base
/// files carry it in their names, so checkouts with different image logic (branches) share the
/// cache without rebuilding each other's image on every run.
const LOGIC_VERSION: &str = "3";

/// The guest's PID 1.
const INIT: &str = include_str!("../../guest/init.sh");

/// Where host-found libraries go in the per-run overlay (first on the guest's LD_LIBRARY_PATH).
pub const EXTRA_LIB_DIR: &str = "usr/local/lib";

/// Library folders of the image whose file names count as "present" for host binaries.
const LIB_DIRS: &[&str] = &["usr/lib/x86_64-linux-gnu", "usr/lib64", "usr/lib"];

/// The cached base image of one kernel.
pub struct Base {
    /// The kernel to boot: the vmlinux ELF (PVH entry) when it could be decompressed, else the
    /// bzImage.
    pub kernel: PathBuf,
    pub cpio: PathBuf,
    /// File names in the image's library folders.
    pub libs: HashSet<String>,
    pub kver: String,
}

/// The cache folder of the guest test bed.
pub fn vm_cache() -> PathBuf {
    cache_dir().join("vm")
}

fn kernel_dir(kernel: Kernel) -> PathBuf {
    vm_cache().join(format!("kernel-{}", kernel.name()))
}

/// The userland packages of an image: the test bed's, plus bpftrace and bpftool for `bench`.
fn userland_packages(bench: bool) -> Vec<&'static str> {
    let mut p = packages::USERLAND.to_vec();
    if bench {
        for x in packages::BENCH_EXTRA {
            if !p.contains(x) {
                p.push(x);
            }
        }
    }
    p
}

/// File-name suffix of the bench image's cached files (`base-bench.cpio`, `userland-bench`).
fn variant(bench: bool) -> &'static str {
    if bench { "-bench" } else { "" }
}

/// Makes sure the base image of `kernel` (the bench variant with `bench`) is built and current;
/// the caller holds the cache lock.
pub fn prepare(kernel: Kernel, bench: bool) -> Result<Base> {
    let cache = vm_cache();
    let debs = cache.join("debs");
    let kdir = kernel_dir(kernel);
    fs::create_dir_all(&kdir).with_context(|| format!("creating {}", kdir.display()))?;
    let v = variant(bench);
    let b = format!("{v}-l{LOGIC_VERSION}");

    let kernel_debs = kernel_debs(kernel, &cache, &debs, &kdir)?;
    let user_debs = userland_debs(&debs, &userland_packages(bench))?;

    let mut stamp_input = vec![format!("logic {LOGIC_VERSION}"), INIT.to_owned()];
    stamp_input.extend(kernel_debs.iter().map(|d| file_name(d)));
    stamp_input.extend(user_debs.iter().map(|d| file_name(d)));
    stamp_input.extend(packages::module_roots(kernel).iter().map(|s| s.to_string()));
    stamp_input.extend(
        packages::DRIVER_MODULES
            .iter()
            .map(|s| format!("driver {s}")),
    );
    stamp_input.extend(
        packages::CONSUMER_MODULES
            .iter()
            .map(|s| format!("consumer {s}")),
    );
    stamp_input.extend(
        packages::required_config(kernel)
            .iter()
            .map(|s| s.to_string()),
    );
    let stamp = stamp_of(&stamp_input);

    let base = Base {
        kernel: kdir.join("kernel"),
        cpio: kdir.join(format!("base{b}.cpio")),
        libs: HashSet::new(),
        kver: fs::read_to_string(kdir.join("kver")).unwrap_or_default(),
    };
    let current = fs::read_to_string(kdir.join(format!("base{b}.stamp"))).is_ok_and(|s| s == stamp)
        && base.kernel.is_file()
        && base.cpio.is_file();
    if current && let Ok(libs) = fs::read_to_string(kdir.join(format!("base{b}.libs"))) {
        return Ok(Base {
            libs: libs.lines().map(str::to_owned).collect(),
            ..base
        });
    }

    let userland = extract_userland(&cache, &user_debs, v)?;
    let base = build_base(kernel, &kernel_debs, &userland, &kdir, &b)?;
    fs::write(kdir.join(format!("base{b}.stamp")), stamp)
        .context("writing the base image stamp")?;
    Ok(base)
}

/// The kernel's .debs: the image package ([`kernel_deb`]), then the parts it depends on when
/// Debian splits the kernel (since 6.17: linux-base-, linux-binary-, linux-modules-<abi>), each
/// downloaded from the image's suite when not cached.
fn kernel_debs(kernel: Kernel, cache: &Path, debs: &Path, kdir: &Path) -> Result<Vec<PathBuf>> {
    let image = kernel_deb(kernel, cache, debs, kdir)?;
    let depends = output(
        Command::new("dpkg-deb")
            .arg("-f")
            .arg(&image)
            .arg("Depends"),
    )
    .with_context(|| format!("reading the Depends of {}", image.display()))?;
    let name = file_name(&image);
    let name = name.split('_').next().unwrap_or_default();
    let parts = packages::kernel_parts(name, &depends);
    let missing: Vec<&str> = parts
        .iter()
        .map(String::as_str)
        .filter(|p| find_deb(debs, p).is_none())
        .collect();
    if !missing.is_empty() {
        say(format!("kernel parts: {} (downloading)", missing.join(" ")));
        apt::fetch_parts(&packages::kernel_package(kernel), cache, debs, &missing)?;
    }
    let mut all = vec![image];
    for p in &parts {
        all.push(find_deb(debs, p).with_context(|| {
            format!(
                "{p}_*.deb not found in {} after apt-get download",
                debs.display()
            )
        })?);
    }
    Ok(all)
}

/// The kernel image .deb: the pinned package if cached, else the one chosen earlier for this pin, else
/// fetched now (the pin, or the newest of its series when Debian has retired it).
fn kernel_deb(kernel: Kernel, cache: &Path, debs: &Path, kdir: &Path) -> Result<PathBuf> {
    let pkg = packages::kernel_package(kernel);
    if let Some(deb) = find_deb(debs, pkg.pinned) {
        return Ok(deb);
    }
    let record = kdir.join("package");
    if let Ok(text) = fs::read_to_string(&record)
        && let Some((pinned, chosen)) = text.trim().split_once(' ')
        && pinned == pkg.pinned
        && let Some(deb) = find_deb(debs, chosen)
    {
        return Ok(deb);
    }
    let chosen = apt::fetch_kernel(&pkg, cache, debs)?;
    fs::write(&record, format!("{} {chosen}\n", pkg.pinned))
        .context("recording the kernel package")?;
    find_deb(debs, &chosen).with_context(|| {
        format!(
            "{chosen}_*.deb not found in {} after apt-get download",
            debs.display()
        )
    })
}

/// The userland .debs, downloading the missing ones from the host's lists.
fn userland_debs(debs: &Path, wanted: &[&str]) -> Result<Vec<PathBuf>> {
    let missing: Vec<&str> = wanted
        .iter()
        .copied()
        .filter(|p| find_deb(debs, p).is_none())
        .collect();
    if !missing.is_empty() {
        say(format!(
            "downloading {} guest userland packages",
            missing.len()
        ));
        apt::Apt::system().download(debs, &missing)?;
    }
    wanted
        .iter()
        .map(|p| {
            find_deb(debs, p).with_context(|| format!("{p}_*.deb missing after apt-get download"))
        })
        .collect()
}

/// `<dir>/<package>_<version>_<arch>.deb` (the last by name if there are several).
fn find_deb(dir: &Path, package: &str) -> Option<PathBuf> {
    let prefix = format!("{package}_");
    let mut found: Vec<PathBuf> = fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok())
        .filter(|e| {
            let n = e.file_name();
            let n = n.to_string_lossy();
            n.starts_with(&prefix) && n.ends_with(".deb")
        })
        .map(|e| e.path())
        .collect();
    found.sort();
    found.pop()
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// FNV-1a (64 bit) of the lines: a content stamp stable across Rust versions.
pub fn stamp_of(lines: &[String]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for line in lines {
        for b in line.bytes().chain(std::iter::once(0)) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    format!("{h:016x}")
}

/// The userland packages unpacked (dpkg -x) into `<cache>/userland<variant>`, redone when the
/// .debs change.
fn extract_userland(cache: &Path, debs: &[PathBuf], variant: &str) -> Result<PathBuf> {
    let dir = cache.join(format!("userland{variant}"));
    let stamp = stamp_of(&debs.iter().map(|d| file_name(d)).collect::<Vec<_>>());
    let stamp_file = cache.join(format!("userland{variant}.stamp"));
    if dir.is_dir() && fs::read_to_string(&stamp_file).is_ok_and(|s| s == stamp) {
        return Ok(dir);
    }
    say("unpacking the guest userland");
    remove_dir(&dir)?;
    fs::create_dir_all(&dir)?;
    for deb in debs {
        dpkg_extract(deb, &dir)?;
    }
    fs::write(&stamp_file, stamp)?;
    Ok(dir)
}

fn dpkg_extract(deb: &Path, dir: &Path) -> Result<()> {
    output(Command::new("dpkg-deb").arg("-x").arg(deb).arg(dir))
        .with_context(|| format!("unpacking {}", deb.display()))?;
    Ok(())
}

fn remove_dir(dir: &Path) -> Result<()> {
    match fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(e).with_context(|| format!("removing {}", dir.display()))
        }
        _ => Ok(()),
    }
}

/// Builds `<kdir>/base.cpio`, `kernel`, `kver` and `base.libs` from the kernel's packages and the
/// unpacked userland. The unpacked kernel is deleted afterwards (only the .debs are kept).
fn build_base(
    kernel: Kernel,
    debs: &[PathBuf],
    userland: &Path,
    kdir: &Path,
    variant: &str,
) -> Result<Base> {
    say(format!(
        "building the base initramfs for kernel {} ({})",
        kernel.name(),
        debs.iter()
            .map(|d| file_name(d))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    let kroot = kdir.join("unpacked");
    remove_dir(&kroot)?;
    for deb in debs {
        dpkg_extract(deb, &kroot)?;
    }
    let result = build_base_from(kernel, &kroot, userland, kdir, variant);
    remove_dir(&kroot)?;
    result
}

/// The kernel release, image and configuration in an unpacked kernel package: `boot/vmlinuz-<kver>`
/// and `boot/config-<kver>`, or (split packages, since 6.17) `usr/lib/modules/<kver>/vmlinuz` and
/// `config`.
fn kernel_files(kroot: &Path) -> Result<(String, PathBuf, PathBuf)> {
    let boot = kroot.join("boot");
    if let Ok(rd) = fs::read_dir(&boot) {
        let kver = rd.filter_map(|e| e.ok()).find_map(|e| {
            e.file_name()
                .to_str()?
                .strip_prefix("vmlinuz-")
                .map(str::to_owned)
        });
        if let Some(kver) = kver {
            let (vmlinuz, config) = (format!("vmlinuz-{kver}"), format!("config-{kver}"));
            return Ok((kver, boot.join(vmlinuz), boot.join(config)));
        }
    }
    for dir in ["usr/lib/modules", "lib/modules"] {
        let Ok(rd) = fs::read_dir(kroot.join(dir)) else {
            continue;
        };
        for e in rd.filter_map(|e| e.ok()) {
            let p = e.path();
            if p.join("vmlinuz").is_file() {
                let kver = e.file_name().to_string_lossy().into_owned();
                return Ok((kver, p.join("vmlinuz"), p.join("config")));
            }
        }
    }
    bail!("no boot/vmlinuz-* nor usr/lib/modules/*/vmlinuz in the kernel package")
}

fn build_base_from(
    kernel: Kernel,
    kroot: &Path,
    userland: &Path,
    kdir: &Path,
    variant: &str,
) -> Result<Base> {
    // The kernel and its configuration.
    let (kver, vmlinuz, config_path) = kernel_files(kroot)?;
    let config = fs::read_to_string(&config_path)
        .with_context(|| format!("reading {} of the kernel package", config_path.display()))?;
    check_config(&config, &packages::required_config(kernel))
        .with_context(|| format!("kernel {kver} does not fit"))?;
    let mut tree = Tree::default();

    // Userland, merged-/usr style, and host libraries it lacks.
    tree.add_host_dir(userland, "")?;
    add_missing_host_libs(&mut tree, userland)?;
    tree.add("bin", Node::Link("usr/bin".into()));
    tree.add("sbin", Node::Link("usr/sbin".into()));
    tree.add("lib", Node::Link("usr/lib".into()));
    tree.add("lib64", Node::Link("usr/lib64".into()));
    if !tree.0.contains_key("usr/bin/sh") {
        tree.add("usr/bin/sh", Node::Link("bash".into()));
    }
    let busybox = userland.join("bin/busybox");
    for applet in output(Command::new(&busybox).arg("--list"))
        .with_context(|| format!("listing the applets of {}", busybox.display()))?
        .lines()
        .filter(|a| !a.is_empty() && !a.contains('/'))
    {
        tree.add(
            &format!("usr/local/busybox/{applet}"),
            Node::Link("/bin/busybox".into()),
        );
    }

    // Modules, in load order.
    let moddir = ["lib/modules", "usr/lib/modules"]
        .iter()
        .map(|d| kroot.join(d).join(&kver))
        .find(|d| d.is_dir())
        .context("no lib/modules/<version> in the kernel package")?;
    let Modules {
        order,
        drivers,
        consumers,
        images,
    } = modules(kernel, &moddir)?;
    for (dir, lists) in [("drivers", drivers), ("consumers", consumers)] {
        for (root, list) in lists {
            tree.add(
                &format!("usr/lib/modules/{dir}/{root}.list"),
                Node::data(0o644, format!("{}\n", list.join("\n")).into_bytes()),
            );
        }
    }
    for (name, data) in images {
        tree.add(
            &format!("usr/lib/modules/{name}.ko"),
            Node::data(0o644, data),
        );
    }
    let mut list = order.join("\n");
    list.push('\n');
    tree.add(
        "usr/lib/modules/load.list",
        Node::data(0o644, list.into_bytes()),
    );

    // Init, mount points and the few /etc files a root shell wants.
    tree.add("init", Node::data(0o755, INIT.as_bytes().to_vec()));
    for d in [
        "proc",
        "sys",
        "dev",
        "run",
        "root",
        "vm",
        "mnt",
        EXTRA_LIB_DIR,
    ] {
        tree.add(d, Node::Dir(0o755));
    }
    tree.add("tmp", Node::Dir(0o1777));
    tree.add(
        "etc/passwd",
        Node::data(0o644, b"root:x:0:0:root:/root:/bin/bash\n".to_vec()),
    );
    tree.add("etc/group", Node::data(0o644, b"root:x:0:\n".to_vec()));
    tree.add(
        "etc/hosts",
        Node::data(0o644, b"127.0.0.1 localhost\n::1 localhost\n".to_vec()),
    );
    tree.add(
        "etc/nsswitch.conf",
        Node::data(
            0o644,
            b"passwd: files\ngroup: files\nhosts: files\n".to_vec(),
        ),
    );
    // The kernel's configuration, where its package put it and rdma-trace looks for it
    // (CONFIG_KPROBES, ...): /boot, or beside the modules (split packages).
    let config_at = match config_path.strip_prefix(kroot) {
        Ok(rel) if !rel.starts_with("boot") => rel.to_string_lossy().into_owned(),
        _ => format!("boot/config-{kver}"),
    };
    tree.add(&config_at, Node::data(0o644, config.clone().into_bytes()));
    tree.add(
        "etc/kver",
        Node::data(0o644, format!("{kver}\n").into_bytes()),
    );

    // Write everything.
    let tmp = kdir.join(format!("base{variant}.cpio.tmp"));
    tree.write(&tmp)?;
    let base = Base {
        kernel: kdir.join("kernel"),
        cpio: kdir.join(format!("base{variant}.cpio")),
        libs: tree.lib_names(),
        kver: kver.clone(),
    };
    fs::rename(&tmp, &base.cpio).context("installing base.cpio")?;
    write_kernel(&vmlinuz, &config, kdir, &base.kernel)?;
    fs::write(kdir.join("kver"), &kver)?;
    let mut libs: Vec<&str> = base.libs.iter().map(String::as_str).collect();
    libs.sort_unstable();
    fs::write(kdir.join(format!("base{variant}.libs")), libs.join("\n"))?;
    let size = fs::metadata(&base.cpio).map(|m| m.len()).unwrap_or(0);
    say(format!(
        "base initramfs for {kver}: {} MiB, {} modules",
        size >> 20,
        order.len()
    ));
    Ok(base)
}

/// Installs the kernel to boot: the decompressed vmlinux when the kernel has a PVH entry point and
/// the host can decompress it (saves the guest's slow decompression under TCG), else the bzImage.
fn write_kernel(vmlinuz: &Path, config: &str, kdir: &Path, dest: &Path) -> Result<()> {
    let bz = fs::read(vmlinuz).with_context(|| format!("reading {}", vmlinuz.display()))?;
    let pvh = config.lines().any(|l| l.trim() == "CONFIG_PVH=y");
    let elf = if pvh {
        match kimage::vmlinux(&bz, &kdir.join("payload.tmp")) {
            Ok(Some(elf)) => Some(elf),
            Ok(None) => {
                let tool = kimage::payload(&bz).map(|p| p.0.tool()).unwrap_or("?");
                say(format!(
                    "NOTE: `{tool}` is not installed: the guest boots its compressed kernel (slower under TCG)"
                ));
                None
            }
            Err(e) => {
                say(format!("NOTE: booting the compressed kernel: {e:#}"));
                None
            }
        }
    } else {
        None
    };
    let tmp = kdir.join("kernel.tmp");
    fs::write(&tmp, elf.as_deref().unwrap_or(&bz)).context("writing the guest kernel")?;
    fs::rename(&tmp, dest).context("installing the guest kernel")?;
    Ok(())
}

/// Errors naming every required option the kernel config lacks.
fn check_config(config: &str, required: &[&str]) -> Result<()> {
    let have: HashSet<&str> = config.lines().map(str::trim).collect();
    let missing: Vec<&str> = required
        .iter()
        .copied()
        .filter(|o| !have.contains(o))
        .collect();
    if !missing.is_empty() {
        bail!("its config lacks {}", missing.join(", "));
    }
    Ok(())
}

/// Per module root, its load order.
type RootLists = Vec<(String, Vec<String>)>;

/// The modules that go into the image.
struct Modules {
    /// The load order of the module roots and their dependencies (loaded at boot).
    order: Vec<String>,
    /// The load order of each driver root the package has (`packages::DRIVER_MODULES`).
    drivers: RootLists,
    /// The load order of each consumer root (`packages::CONSUMER_MODULES`).
    consumers: RootLists,
    /// Each module's (decompressed) image, by name.
    images: BTreeMap<String, Vec<u8>>,
}

/// The modules of the image, from the kernel package's module directory `moddir`.
fn modules(kernel: Kernel, moddir: &Path) -> Result<Modules> {
    let mut files: HashMap<String, PathBuf> = HashMap::new();
    walk_files(&moddir.join("kernel"), &mut |p| {
        if let Some(name) = p
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(kmod::module_file_name)
        {
            files.insert(name, p.to_path_buf());
        }
    })?;
    let builtin: HashSet<String> = fs::read_to_string(moddir.join("modules.builtin"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.rsplit('/').next().and_then(kmod::module_file_name))
        .collect();
    let mut images = BTreeMap::new();
    let mut deps_of = |name: &str| {
        let Some(path) = files.get(name) else {
            if builtin.contains(name) {
                return Ok(None);
            }
            bail!("module {name} is neither in the kernel package nor built in");
        };
        let data = read_module(path)?;
        let deps = kmod::modinfo_depends(&data);
        images.insert(name.to_owned(), data);
        Ok(Some(deps))
    };
    let order = kmod::load_order(&packages::module_roots(kernel), &mut deps_of)?;
    let mut drivers = Vec::new();
    for root in packages::DRIVER_MODULES {
        if files.contains_key(*root) {
            drivers.push((root.to_string(), kmod::load_order(&[root], &mut deps_of)?));
        }
    }
    let mut consumers = Vec::new();
    for root in packages::CONSUMER_MODULES {
        let list = kmod::load_order(&[root], &mut deps_of)
            .with_context(|| format!("the load order of consumer module {root}"))?;
        if list.is_empty() {
            bail!("consumer module {root} is built in: the guest test expects a module");
        }
        consumers.push((root.to_string(), list));
    }
    Ok(Modules {
        order,
        drivers,
        consumers,
        images,
    })
}

/// A module's bytes; `.ko.xz` (6.12) is decompressed with xz.
fn read_module(path: &Path) -> Result<Vec<u8>> {
    if path.extension().is_some_and(|e| e == "xz") {
        let out = Command::new("xz")
            .arg("-dc")
            .arg(path)
            .output()
            .context("running xz (install xz-utils: cargo xtask setup)")?;
        if !out.status.success() {
            bail!(
                "xz -dc {} failed: {}",
                path.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(out.stdout)
    } else {
        fs::read(path).with_context(|| format!("reading {}", path.display()))
    }
}

fn walk_files(dir: &Path, f: &mut dyn FnMut(&Path)) -> Result<()> {
    for e in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let e = e?;
        let ty = e.file_type()?;
        if ty.is_dir() {
            walk_files(&e.path(), f)?;
        } else if ty.is_file() {
            f(&e.path());
        }
    }
    Ok(())
}

/// Libraries the userland links that it does not ship itself: copied from the host (found by
/// running the host's `ldd` with the userland's library folders first).
fn add_missing_host_libs(tree: &mut Tree, userland: &Path) -> Result<()> {
    let lib_path = [
        "lib/x86_64-linux-gnu",
        "usr/lib/x86_64-linux-gnu",
        "usr/lib/x86_64-linux-gnu/libibverbs",
    ]
    .iter()
    .map(|d| userland.join(d).display().to_string())
    .collect::<Vec<_>>()
    .join(":");
    let mut elfs = Vec::new();
    for (path, node) in &tree.0 {
        if let Node::File {
            src: Src::Host(p), ..
        } = node
            && (path.starts_with("usr/bin/")
                || path.starts_with("usr/sbin/")
                || path.starts_with("usr/lib/"))
            && is_elf(p)
        {
            elfs.push(p.clone());
        }
    }
    let mut have = tree.lib_names();
    for elf in elfs {
        for lib in ldd(&elf, Some(&lib_path))? {
            if lib.starts_with(userland) {
                continue;
            }
            let name = file_name(&lib);
            if have.insert(name.clone()) {
                say(format!(
                    "  guest lib from the host: {} (for {})",
                    lib.display(),
                    file_name(&elf)
                ));
                tree.add(
                    &format!("usr/lib/x86_64-linux-gnu/{name}"),
                    Node::host(0o644, lib),
                );
            }
        }
    }
    Ok(())
}

/// True for a file starting with the ELF magic.
pub fn is_elf(p: &Path) -> bool {
    let mut magic = [0u8; 4];
    File::open(p)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok_and(|()| &magic == b"\x7fELF")
}

/// The resolved library paths `ldd` prints for `elf` (nothing for a static binary). A library
/// ldd cannot find is reported, not fatal: the guest may still have it.
pub fn ldd(elf: &Path, ld_library_path: Option<&str>) -> Result<Vec<PathBuf>> {
    let mut c = Command::new("ldd");
    c.arg(elf);
    if let Some(p) = ld_library_path {
        c.env("LD_LIBRARY_PATH", p);
    }
    let out = c.output().context("running ldd")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let (libs, not_found) = parse_ldd(&text);
    for n in not_found {
        say(format!(
            "  ldd: {n} (needed by {}) not found on the host",
            elf.display()
        ));
    }
    Ok(libs)
}

/// ldd's `name => /path (0x...)` lines: the paths, and the names it could not find.
pub fn parse_ldd(text: &str) -> (Vec<PathBuf>, Vec<String>) {
    let mut libs = Vec::new();
    let mut not_found = Vec::new();
    for line in text.lines() {
        let Some((name, rest)) = line.split_once("=>") else {
            continue;
        };
        let rest = rest.trim();
        if rest.starts_with("not found") {
            not_found.push(name.trim().to_owned());
        } else if let Some(path) = rest
            .split_whitespace()
            .next()
            .filter(|p| p.starts_with('/'))
        {
            libs.push(PathBuf::from(path));
        }
    }
    (libs, not_found)
}

/// The per-run initramfs: a copy of the base image followed by a cpio with `/vm/cmd.sh`,
/// `/vm/env.sh` and the extra libraries.
pub fn write_run_initrd(
    base: &Base,
    dest: &Path,
    script: &str,
    env_sh: &str,
    extra_libs: &[PathBuf],
) -> Result<()> {
    fs::copy(&base.cpio, dest)
        .with_context(|| format!("copying the base image to {}", dest.display()))?;
    let f = fs::OpenOptions::new()
        .append(true)
        .open(dest)
        .with_context(|| format!("opening {}", dest.display()))?;
    let mut w = cpio::Writer::new(BufWriter::new(f));
    w.file("vm/cmd.sh", 0o755, script.as_bytes())?;
    w.file("vm/env.sh", 0o644, env_sh.as_bytes())?;
    for lib in extra_libs {
        let data = fs::read(lib).with_context(|| format!("reading {}", lib.display()))?;
        w.file(&format!("{EXTRA_LIB_DIR}/{}", file_name(lib)), 0o755, &data)?;
    }
    w.finish()?.flush()?;
    Ok(())
}

/// A file-system tree to archive, keyed by path (sorted, so parents come before children).
#[derive(Default)]
struct Tree(BTreeMap<String, Node>);

enum Node {
    Dir(u32),
    File { perm: u32, src: Src },
    Link(String),
}

enum Src {
    Host(PathBuf),
    Data(Vec<u8>),
}

impl Node {
    fn data(perm: u32, data: Vec<u8>) -> Self {
        Node::File {
            perm,
            src: Src::Data(data),
        }
    }

    fn host(perm: u32, path: PathBuf) -> Self {
        Node::File {
            perm,
            src: Src::Host(path),
        }
    }
}

/// What the userland contributes under `path` (relative, merged /usr): `None` to leave it out.
fn image_path(path: &str) -> Option<String> {
    const DROP: &[&str] = &[
        "usr/share",
        "usr/include",
        "usr/lib/x86_64-linux-gnu/gconv",
        "usr/lib/x86_64-linux-gnu/perl",
        "usr/lib/x86_64-linux-gnu/pkgconfig",
        "usr/lib/systemd",
        "usr/lib/udev",
        "etc/init.d",
        "var",
    ];
    let merged = match path.split_once('/').map_or((path, ""), |(a, b)| (a, b)) {
        ("bin" | "sbin" | "lib" | "lib64", rest) => {
            let top = path.split('/').next().unwrap_or_default();
            if rest.is_empty() {
                format!("usr/{top}")
            } else {
                format!("usr/{top}/{rest}")
            }
        }
        _ => path.to_owned(),
    };
    let dropped = DROP
        .iter()
        .any(|d| merged == *d || merged.strip_prefix(d).is_some_and(|r| r.starts_with('/')));
    (!dropped).then_some(merged)
}

impl Tree {
    /// Adds `node` at `path` (already an image path), creating missing parent folders.
    fn add(&mut self, path: &str, node: Node) {
        let path = path.trim_matches('/').to_owned();
        let mut parent = String::new();
        for comp in path
            .split('/')
            .collect::<Vec<_>>()
            .split_last()
            .map_or(&[][..], |(_, p)| p)
        {
            if !parent.is_empty() {
                parent.push('/');
            }
            parent.push_str(comp);
            self.0.entry(parent.clone()).or_insert(Node::Dir(0o755));
        }
        self.0.insert(path, node);
    }

    /// Adds the host folder `dir` (recursively) at `prefix`, leaving out what `image_path` drops.
    fn add_host_dir(&mut self, dir: &Path, prefix: &str) -> Result<()> {
        let mut entries: Vec<_> = fs::read_dir(dir)
            .with_context(|| format!("reading {}", dir.display()))?
            .collect::<Result<_, _>>()?;
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let name = e.file_name().to_string_lossy().into_owned();
            let rel = if prefix.is_empty() {
                name
            } else {
                format!("{prefix}/{name}")
            };
            let Some(target) = image_path(&rel) else {
                continue;
            };
            let meta = e.path().symlink_metadata()?;
            let perm = meta.permissions().mode() & 0o7777;
            if meta.file_type().is_symlink() {
                let to = fs::read_link(e.path())?;
                self.add(&target, Node::Link(to.to_string_lossy().into_owned()));
            } else if meta.is_dir() {
                self.add(&target, Node::Dir(perm));
                self.add_host_dir(&e.path(), &rel)?;
            } else if meta.is_file() {
                self.add(&target, Node::host(perm, e.path()));
            }
        }
        Ok(())
    }

    /// Names of the files and symlinks in the library folders.
    fn lib_names(&self) -> HashSet<String> {
        self.0
            .iter()
            .filter(|(_, node)| !matches!(node, Node::Dir(_)))
            .filter_map(|(p, _)| {
                let (dir, name) = p.rsplit_once('/')?;
                LIB_DIRS.contains(&dir).then(|| name.to_owned())
            })
            .collect()
    }

    fn write(&self, dest: &Path) -> Result<()> {
        let f = File::create(dest).with_context(|| format!("creating {}", dest.display()))?;
        let mut w = cpio::Writer::new(BufWriter::with_capacity(1 << 20, f));
        for (path, node) in &self.0 {
            match node {
                Node::Dir(perm) => w.dir(path, *perm)?,
                Node::Link(to) => w.symlink(path, to)?,
                Node::File {
                    perm,
                    src: Src::Data(d),
                } => w.file(path, *perm, d)?,
                Node::File {
                    perm,
                    src: Src::Host(p),
                } => {
                    let d = fs::read(p).with_context(|| format!("reading {}", p.display()))?;
                    w.file(path, *perm, &d)?;
                }
            }
        }
        let mut out = w.finish()?;
        out.flush()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merged_usr_and_dropped_paths() {
        assert_eq!(image_path("bin/bash").as_deref(), Some("usr/bin/bash"));
        assert_eq!(image_path("lib").as_deref(), Some("usr/lib"));
        assert_eq!(
            image_path("lib/x86_64-linux-gnu/libc.so.6").as_deref(),
            Some("usr/lib/x86_64-linux-gnu/libc.so.6")
        );
        assert_eq!(image_path("usr/share/doc/x"), None);
        assert_eq!(image_path("usr/share"), None);
        assert_eq!(image_path("usr/sharex").as_deref(), Some("usr/sharex"));
        assert_eq!(
            image_path("etc/libibverbs.d/rxe.driver").as_deref(),
            Some("etc/libibverbs.d/rxe.driver")
        );
    }

    #[test]
    fn tree_creates_parents_in_order() {
        let mut t = Tree::default();
        t.add("usr/lib/modules/x.ko", Node::data(0o644, vec![1]));
        t.add(
            "/usr/lib/x86_64-linux-gnu/libfoo.so.1",
            Node::data(0o644, vec![]),
        );
        let keys: Vec<_> = t.0.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [
                "usr",
                "usr/lib",
                "usr/lib/modules",
                "usr/lib/modules/x.ko",
                "usr/lib/x86_64-linux-gnu",
                "usr/lib/x86_64-linux-gnu/libfoo.so.1"
            ]
        );
        assert_eq!(t.lib_names(), HashSet::from(["libfoo.so.1".to_owned()]));
    }

    #[test]
    fn ldd_output() {
        let text = "\tlinux-vdso.so.1 (0x00007ffd)\n\
                    \tlibgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x00007f)\n\
                    \tlibibverbs.so.1 => not found\n\
                    \t/lib64/ld-linux-x86-64.so.2 (0x00007f)\n";
        let (libs, missing) = parse_ldd(text);
        assert_eq!(libs, [PathBuf::from("/lib/x86_64-linux-gnu/libgcc_s.so.1")]);
        assert_eq!(missing, ["libibverbs.so.1"]);
    }

    #[test]
    fn config_check_names_what_is_missing() {
        let ok = packages::REQUIRED_CONFIG.join("\n");
        assert!(check_config(&ok, packages::REQUIRED_CONFIG).is_ok());
        let bad = ok.replace("CONFIG_RDMA_RXE=m", "# CONFIG_RDMA_RXE is not set");
        let err = check_config(&bad, packages::REQUIRED_CONFIG)
            .unwrap_err()
            .to_string();
        assert!(err.contains("CONFIG_RDMA_RXE=m"), "{err}");
    }

    #[test]
    fn stamp_is_stable() {
        assert_eq!(stamp_of(&[]), "cbf29ce484222325");
        assert_ne!(
            stamp_of(&["a".into(), "b".into()]),
            stamp_of(&["ab".into()])
        );
    }
}

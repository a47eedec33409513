//! Embed the eBPF object built by `cargo xtask build-ebpf`.
use std::path::PathBuf;

use sha2::Digest as _;

fn main() {
    println!("cargo::rerun-if-env-changed=RDMA_TRACE_EBPF_OBJECT");
    println!("cargo::rerun-if-env-changed=CARGO_TARGET_DIR");
    let object = match std::env::var_os("RDMA_TRACE_EBPF_OBJECT") {
        Some(p) => PathBuf::from(p),
        None => {
            let manifest =
                PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
            let target = std::env::var_os("CARGO_TARGET_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|| manifest.join("../target"));
            target.join("ebpf/rdma-trace-ebpf.o")
        }
    };
    println!("cargo::rerun-if-changed={}", object.display());
    if !object.is_file() {
        eprintln!(
            "error: the eBPF object {} is missing: run `cargo xtask build-ebpf` first \
             (or set RDMA_TRACE_EBPF_OBJECT to a built rdma-trace-ebpf object)",
            object.display()
        );
        std::process::exit(1);
    }
    println!(
        "cargo::rustc-env=RDMA_TRACE_EBPF_OBJECT={}",
        object.display()
    );
    // The object's build id for `--version`: the first 12 hex digits of its SHA-256.
    let bytes = std::fs::read(&object).unwrap_or_default();
    let digest = sha2::Sha256::digest(&bytes);
    let id: String = digest[..6].iter().map(|b| format!("{b:02x}")).collect();
    println!("cargo::rustc-env=RDMA_TRACE_EBPF_BUILD_ID={id}");
}

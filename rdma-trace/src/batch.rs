//! Reading the whole per-CPU `ROWS` array in one `BPF_MAP_LOOKUP_BATCH` syscall (Linux 5.6),
//! so that a refresh of the views costs the same number of syscalls whatever the probe count.
//! aya 0.14 has no batched lookups: this is the one raw `bpf(2)` call of the loader.

use std::os::fd::RawFd;

use rdma_trace_common::ProbeRow;

const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;

/// `union bpf_attr` for the `BPF_MAP_*_BATCH` commands.
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// Every row of a per-CPU array of `entries` [`ProbeRow`]s, `cpus` (possible CPUs) values per
/// key, key-major: row `k` of CPU `c` is at `k * cpus + c`. `None` when the kernel refuses the
/// batched lookup (the caller then reads key by key) or returns fewer rows.
pub fn lookup_rows(map_fd: RawFd, entries: u32, cpus: usize) -> Option<Vec<ProbeRow>> {
    let zero = ProbeRow {
        counters: [0; rdma_trace_common::NR_COUNTERS as usize],
        slots: [0; rdma_trace_common::HIST_SLOTS as usize],
    };
    let mut values = vec![zero; entries as usize * cpus];
    let mut keys = vec![0u32; entries as usize];
    let mut out_batch = 0u32;
    let mut attr = BatchAttr {
        in_batch: 0,
        out_batch: &mut out_batch as *mut u32 as u64,
        keys: keys.as_mut_ptr() as u64,
        values: values.as_mut_ptr() as u64,
        count: entries,
        map_fd: u32::try_from(map_fd).ok()?,
        ..Default::default()
    };
    // SAFETY: `attr` is a valid BPF_MAP_LOOKUP_BATCH attribute whose pointers reference
    // buffers that outlive the call: `keys` holds `entries` u32 keys, `values` holds `entries`
    // times `cpus` rows (a per-CPU value is one 8-byte-aligned row per possible CPU, and
    // ProbeRow is all u64), `out_batch` one u32 (an array's batch token is its next index).
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_MAP_LOOKUP_BATCH,
            &mut attr as *mut BatchAttr,
            std::mem::size_of::<BatchAttr>(),
        )
    };
    // The end of the map is ENOENT, with `count` set to the rows copied.
    let done = rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::ENOENT);
    (done && attr.count == entries && keys.iter().enumerate().all(|(i, &k)| k == i as u32))
        .then_some(values)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attr_layout_matches_the_kernel() {
        // struct { __aligned_u64 in_batch, out_batch, keys, values; __u32 count, map_fd;
        //          __u64 elem_flags, flags; } batch;
        assert_eq!(std::mem::size_of::<BatchAttr>(), 56);
        assert_eq!(std::mem::offset_of!(BatchAttr, count), 32);
        assert_eq!(std::mem::offset_of!(BatchAttr, map_fd), 36);
        assert_eq!(std::mem::offset_of!(BatchAttr, flags), 48);
    }

    #[test]
    fn a_bad_fd_is_refused_not_misread() {
        assert!(lookup_rows(-1, 4, 2).is_none());
        // An fd that is not a map.
        let f = std::fs::File::open("/proc/self/status").unwrap();
        use std::os::fd::AsRawFd as _;
        assert!(lookup_rows(f.as_raw_fd(), 4, 2).is_none());
    }
}

//! Reading many elements of an array map in one `BPF_MAP_LOOKUP_BATCH` syscall (Linux 5.6), so
//! that a refresh of the views costs a fixed number of syscalls: one for the whole per-CPU
//! `ROWS` array whatever the probe count, one per active thread slot of the waterfall.
//! aya 0.14 has no batched lookups: a raw `bpf(2)` call, through [`sys_bpf`] (which `stats`
//! uses too).

use std::os::fd::RawFd;

use aya::Pod;
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

/// `bpf(cmd, attr, sizeof attr)`: its return value (errno in `last_os_error` when negative).
///
/// # Safety
/// `attr` must be a valid `union bpf_attr` for `cmd`, and every pointer in it must reference a
/// buffer of the size the command expects that outlives the call.
pub(super) unsafe fn sys_bpf<A>(cmd: libc::c_long, attr: &mut A) -> libc::c_long {
    // SAFETY: the caller's contract.
    unsafe { libc::syscall(libc::SYS_bpf, cmd, attr as *mut A, std::mem::size_of::<A>()) }
}

/// The number of possible CPUs (the values of a per-CPU map element), read from sysfs once per
/// process: aya's `nr_cpus` opens and parses the file at every call, and the views need it at
/// every refresh.
pub fn possible_cpus() -> Option<usize> {
    static CPUS: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    *CPUS.get_or_init(|| aya::util::nr_cpus().ok())
}

/// Every row of a per-CPU array of `entries` [`ProbeRow`]s, `cpus` (possible CPUs) values per
/// key, key-major: row `k` of CPU `c` is at `k * cpus + c`. `None` when the kernel refuses the
/// batched lookup (the caller then reads key by key) or returns fewer rows.
pub fn lookup_rows(map_fd: RawFd, entries: u32, cpus: usize) -> Option<Vec<ProbeRow>> {
    lookup_range(map_fd, 0, entries, cpus)
}

/// Elements `start .. start + count` of an array map (u32 keys) of `T`, in one syscall.
/// `cpus` is 1 for a plain array and the number of possible CPUs for a per-CPU one (then
/// key-major: element `k` of CPU `c` is at `(k - start) * cpus + c`). `None` when the kernel
/// refuses the batched lookup, returns fewer elements, or `T` cannot be a per-CPU value as is
/// (its size is not a multiple of 8).
pub fn lookup_range<T: Pod>(map_fd: RawFd, start: u32, count: u32, cpus: usize) -> Option<Vec<T>> {
    if cpus == 0 || (cpus > 1 && !size_of::<T>().is_multiple_of(8)) {
        return None;
    }
    let n = usize::try_from(count).ok()?.checked_mul(cpus)?;
    let mut values: Vec<T> = Vec::with_capacity(n);
    let mut keys = vec![0u32; count as usize];
    // The batch token of an array is the last key read: start after `start - 1`.
    let mut in_batch = start.wrapping_sub(1);
    let mut out_batch = 0u32;
    let mut attr = BatchAttr {
        in_batch: if start == 0 {
            0
        } else {
            &mut in_batch as *mut u32 as u64
        },
        out_batch: &mut out_batch as *mut u32 as u64,
        keys: keys.as_mut_ptr() as u64,
        values: values.as_mut_ptr() as u64,
        count,
        map_fd: u32::try_from(map_fd).ok()?,
        ..Default::default()
    };
    // SAFETY: `attr` is a valid BPF_MAP_LOOKUP_BATCH attribute whose pointers reference
    // buffers that outlive the call: `in_batch`/`out_batch` one u32 each (an array's key),
    // `keys` `count` u32 keys, `values` room for `count * cpus` values of T (a per-CPU value is
    // one 8-byte-aligned T per possible CPU; T's size is a multiple of 8 then).
    let rc = unsafe { sys_bpf(BPF_MAP_LOOKUP_BATCH, &mut attr) };
    // The end of the map is ENOENT, with `count` set to the elements copied.
    let done = rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::ENOENT);
    let whole = done
        && attr.count == count
        && keys
            .iter()
            .enumerate()
            .all(|(i, &k)| u64::from(k) == u64::from(start) + i as u64);
    if !whole {
        return None;
    }
    // SAFETY: the kernel wrote `count` elements of `cpus` values each (checked above) into the
    // buffer of capacity `n`, and any bytes are a valid T (`Pod`).
    unsafe { values.set_len(n) };
    Some(values)
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

    #[test]
    fn a_per_cpu_value_must_be_whole_u64s_and_cpus_nonzero() {
        // 12 bytes: a per-CPU value would be padded to 16, so it is refused before any call.
        #[derive(Clone, Copy)]
        #[repr(C)]
        struct Odd([u32; 3]);
        // SAFETY: plain integers, any bit pattern is valid.
        unsafe impl aya::Pod for Odd {}
        assert!(lookup_range::<Odd>(0, 0, 1, 2).is_none());
        assert!(lookup_range::<ProbeRow>(0, 0, 1, 0).is_none());
    }
}

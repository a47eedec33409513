//! Syscall counting for `rdma-trace verify`: every syscall of the traced processes, by phase,
//! file-descriptor class and number (layout in `rdma_trace_common::syscalls`).
//!
//! - Which processes: the loader puts their tgids into `VERIFY_TGIDS` (before they exec).
//! - Phase: the calling thread's comm. A demo thread renames itself `rdma-demo:data` when its
//!   data phase starts and `rdma-demo:done` when it ends; any other name is setup.
//! - Class: whether the descriptor the syscall works on is a socket or an RDMA device file.
//!   Whether an fd is a socket cannot be read cheaply from a raw tracepoint without kernel
//!   struct offsets, so it is learned per (tgid, fd) from the syscalls that create or prove
//!   sockets (socket, accept*, socketpair, successful socket-only calls such as connect or
//!   setsockopt), copied by dup*/fcntl(F_DUPFD*), and forgotten on close. RDMA files are learned
//!   from open(at) of `/dev/infiniband/*`; verbs ioctls are recognised by their request type.
//!   The loader seeds sockets the process inherited.
//!
//! Syscall arguments are read from the `pt_regs` that `sys_enter` gets, at offsets the loader
//! sets for the architecture (`SYSCALL_ARG_OFFSETS`). Calls that learn a descriptor finish in
//! `sys_exit`, which sees the return value.

use aya_ebpf::{
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_probe_read_kernel, bpf_probe_read_user,
        bpf_probe_read_user_str_bytes,
    },
    macros::{map, raw_tracepoint},
    maps::{HashMap, PerCpuHashMap},
    programs::RawTracePointContext,
};
use rdma_trace_common::syscalls::{
    CLASS_NONE, CLASS_RDMA, CLASS_SOCKET, KIND_CLOSE, KIND_DUP, KIND_FCNTL, KIND_FD, KIND_NEW_SOCK,
    KIND_OPEN, KIND_OPENAT, KIND_OTHER, KIND_SOCK, KIND_SOCKETPAIR, MAX_SYSCALLS, RDMA_IOCTL_MAGIC,
    RDMA_PATH_PREFIX, has_prefix, phase_of_comm, syscall_key,
};

// ---- configuration, set by the loader before load

/// `KIND_*` of each syscall number on this architecture.
#[unsafe(no_mangle)]
static SYSCALL_KIND: [u8; MAX_SYSCALLS as usize] = [KIND_OTHER; MAX_SYSCALLS as usize];
/// Byte offsets of syscall arguments 0..6 in `struct pt_regs`.
#[unsafe(no_mangle)]
static SYSCALL_ARG_OFFSETS: [u32; 6] = [0; 6];
/// The ioctl syscall number (verbs ioctls are classed by request, whatever the fd).
#[unsafe(no_mangle)]
static SYSCALL_IOCTL: u32 = u32::MAX;
/// fcntl commands that duplicate a descriptor: F_DUPFD, F_DUPFD_CLOEXEC.
#[unsafe(no_mangle)]
static FCNTL_DUPFD: [u64; 2] = [u64::MAX; 2];

// ---- maps

/// Traced processes (tgid → 1).
#[map]
static VERIFY_TGIDS: HashMap<u32, u8> = HashMap::with_max_entries(64, 0);
/// Class of each known descriptor: key tgid << 32 | fd.
#[map]
static VERIFY_FDS: HashMap<u64, u32> = HashMap::with_max_entries(4096, 0);
/// Calls by `syscall_key(phase, class, nr)`.
#[map]
static SYSCALLS: PerCpuHashMap<u64, u64> = PerCpuHashMap::with_max_entries(2048, 0);
/// Calls whose descriptor bookkeeping finishes in `sys_exit`, by thread.
#[map]
static VERIFY_PENDING: HashMap<u32, Pending> = HashMap::with_max_entries(1024, 0);

#[repr(C)]
#[derive(Clone, Copy)]
struct Pending {
    kind: u32,
    /// Class the new descriptor gets (open of an RDMA file, dup of a known fd).
    class: u32,
    arg0: u64,
    arg3: u64,
}

#[inline(always)]
fn traced() -> Option<(u32, u32)> {
    let id = bpf_get_current_pid_tgid();
    let tgid = (id >> 32) as u32;
    // SAFETY: the value is only tested for presence.
    unsafe { VERIFY_TGIDS.get(tgid) }.map(|_| (tgid, id as u32))
}

#[inline(always)]
fn fd_key(tgid: u32, fd: u64) -> u64 {
    ((tgid as u64) << 32) | (fd & 0xFFFF_FFFF)
}

#[inline(always)]
fn class_of(tgid: u32, fd: u64) -> u32 {
    // SAFETY: the value is copied out at once.
    unsafe { VERIFY_FDS.get(fd_key(tgid, fd)) }
        .copied()
        .unwrap_or(CLASS_NONE)
}

#[inline(always)]
fn learn(tgid: u32, fd: u64, class: u32) {
    let key = fd_key(tgid, fd);
    if class == CLASS_NONE {
        let _ = VERIFY_FDS.remove(key);
    } else {
        let _ = VERIFY_FDS.insert(key, class, 0);
    }
}

#[inline(always)]
fn arg(regs: u64, n: usize) -> u64 {
    let off = crate::config(&SYSCALL_ARG_OFFSETS)[n] as u64;
    // SAFETY: reads 8 bytes of the kernel's pt_regs through the probe-read helper, which
    // checks the address; a failed read gives 0.
    unsafe { bpf_probe_read_kernel((regs + off) as *const u64) }.unwrap_or(0)
}

#[inline(always)]
fn is_rdma_path(ptr: u64) -> bool {
    let mut buf = [0u8; 20];
    // SAFETY: the helper copies at most `buf.len()` bytes from user memory and checks them.
    match unsafe { bpf_probe_read_user_str_bytes(ptr as *const u8, &mut buf) } {
        Ok(s) => has_prefix(s, RDMA_PATH_PREFIX),
        Err(_) => false,
    }
}

#[inline(always)]
fn bump(key: u64) {
    match SYSCALLS.get_ptr_mut(key) {
        // SAFETY: this CPU's copy of a per-CPU hash value; programs do not nest on one CPU.
        Some(p) => unsafe { *p += 1 },
        None => {
            let _ = SYSCALLS.insert(key, 1, 0);
        }
    }
}

// TP_PROTO(struct pt_regs *regs, long id)
#[raw_tracepoint(tracepoint = "sys_enter")]
pub fn verify_sys_enter(ctx: RawTracePointContext) -> i32 {
    let Some((tgid, tid)) = traced() else {
        return 0;
    };
    let regs: u64 = ctx.arg(0);
    let nr: u64 = ctx.arg(1);
    let kind = if nr < MAX_SYSCALLS as u64 {
        // SAFETY: an in-bounds element of a static, read volatile as the loader patches it.
        unsafe { core::ptr::read_volatile(&SYSCALL_KIND[nr as usize]) }
    } else {
        KIND_OTHER
    };
    let phase = match bpf_get_current_comm() {
        Ok(comm) => phase_of_comm(&comm),
        Err(_) => 0,
    };
    let mut pending = Pending {
        kind: kind as u32,
        class: CLASS_NONE,
        arg0: 0,
        arg3: 0,
    };
    let mut finish = false;
    let class = match kind {
        KIND_FD => {
            let fd = arg(regs, 0);
            if nr == crate::config(&SYSCALL_IOCTL) as u64
                && (arg(regs, 1) >> 8) & 0xff == RDMA_IOCTL_MAGIC
            {
                CLASS_RDMA
            } else {
                class_of(tgid, fd)
            }
        }
        KIND_SOCK | KIND_NEW_SOCK | KIND_SOCKETPAIR => {
            pending.arg0 = arg(regs, 0);
            pending.arg3 = arg(regs, 3);
            finish = true;
            CLASS_SOCKET
        }
        KIND_DUP | KIND_FCNTL => {
            let fd = arg(regs, 0);
            let c = class_of(tgid, fd);
            let dups = crate::config(&FCNTL_DUPFD);
            let cmd = arg(regs, 1);
            if kind == KIND_DUP || cmd == dups[0] || cmd == dups[1] {
                pending.class = c;
                finish = true;
            }
            c
        }
        KIND_CLOSE => {
            let fd = arg(regs, 0);
            let c = class_of(tgid, fd);
            learn(tgid, fd, CLASS_NONE);
            c
        }
        KIND_OPENAT | KIND_OPEN => {
            let path = arg(regs, if kind == KIND_OPEN { 0 } else { 1 });
            if is_rdma_path(path) {
                pending.class = CLASS_RDMA;
            }
            finish = true;
            CLASS_NONE
        }
        _ => CLASS_NONE,
    };
    bump(syscall_key(phase, class, nr as u32));
    if finish {
        let _ = VERIFY_PENDING.insert(tid, pending, 0);
    }
    0
}

// TP_PROTO(struct pt_regs *regs, long ret)
#[raw_tracepoint(tracepoint = "sys_exit")]
pub fn verify_sys_exit(ctx: RawTracePointContext) -> i32 {
    let Some((tgid, tid)) = traced() else {
        return 0;
    };
    // SAFETY: the value is copied out before the entry is removed.
    let Some(p) = (unsafe { VERIFY_PENDING.get(tid) }).copied() else {
        return 0;
    };
    let _ = VERIFY_PENDING.remove(tid);
    let ret: i64 = ctx.arg(1);
    if ret < 0 {
        return 0;
    }
    let ret = ret as u64;
    match p.kind as u8 {
        // A socket-only call that worked proves argument 0 is a socket.
        KIND_SOCK => learn(tgid, p.arg0, CLASS_SOCKET),
        // socket, accept, accept4 return a new socket.
        KIND_NEW_SOCK => learn(tgid, ret, CLASS_SOCKET),
        KIND_SOCKETPAIR => {
            // SAFETY: reads the two ints the kernel just wrote to the caller's array.
            if let Ok(fds) = unsafe { bpf_probe_read_user(p.arg3 as *const [i32; 2]) } {
                learn(tgid, fds[0] as u64, CLASS_SOCKET);
                learn(tgid, fds[1] as u64, CLASS_SOCKET);
            }
        }
        // New descriptors: the class found at entry, or none (forgets a stale entry).
        KIND_DUP | KIND_FCNTL | KIND_OPENAT | KIND_OPEN => learn(tgid, ret, p.class),
        _ => {}
    }
    0
}

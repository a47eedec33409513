//! Layout shared by the syscall-counting programs (`rdma-trace verify`) and their loader.
//!
//! The eBPF side counts every syscall of the traced processes into `SYSCALLS`, keyed by
//! [`syscall_key`] (phase, fd class, syscall number). What a syscall number means on this
//! architecture comes from the loader, as one [`KIND_*`](KIND_OTHER) byte per number, so the
//! programs carry no syscall table of their own.

/// Syscall numbers the kind table covers (x86_64 and arm64 stay below 512).
pub const MAX_SYSCALLS: u32 = 512;

/// The thread has not marked a phase yet (connection setup).
pub const PHASE_SETUP: u32 = 0;
/// The thread's comm is [`DATA_COMM`]: the demo moves data over RDMA only.
pub const PHASE_DATA: u32 = 1;
/// The thread's comm is [`TEARDOWN_COMM`]: data is done, resources are released.
pub const PHASE_TEARDOWN: u32 = 2;
pub const NR_PHASES: u32 = 3;

/// Thread name (comm) a demo thread takes when its data phase starts.
pub const DATA_COMM: &[u8] = b"rdma-demo:data";
/// Thread name a demo thread takes when its data phase ends.
pub const TEARDOWN_COMM: &[u8] = b"rdma-demo:done";

/// The syscall touches no file descriptor we classify.
pub const CLASS_NONE: u32 = 0;
/// On a socket (or a socket-only syscall).
pub const CLASS_SOCKET: u32 = 1;
/// On an RDMA device file (`/dev/infiniband/*`), or an `ib_uverbs` ioctl.
pub const CLASS_RDMA: u32 = 2;

/// No file descriptor semantics.
pub const KIND_OTHER: u8 = 0;
/// Argument 0 is a file descriptor (read, write, readv, writev, ioctl, ...).
pub const KIND_FD: u8 = 1;
/// A socket-only syscall on the socket in argument 0 (sendto, recvmsg, connect, ...).
pub const KIND_SOCK: u8 = 2;
/// Returns a new socket (socket, accept, accept4).
pub const KIND_NEW_SOCK: u8 = 3;
/// socketpair: writes two new sockets to the array in argument 3.
pub const KIND_SOCKETPAIR: u8 = 4;
/// dup, dup2, dup3: the returned descriptor is a copy of argument 0.
pub const KIND_DUP: u8 = 5;
/// fcntl: a copy of argument 0 when argument 1 is F_DUPFD or F_DUPFD_CLOEXEC.
pub const KIND_FCNTL: u8 = 6;
/// close: forget argument 0.
pub const KIND_CLOSE: u8 = 7;
/// openat, openat2: the path is argument 1.
pub const KIND_OPENAT: u8 = 8;
/// open: the path is argument 0.
pub const KIND_OPEN: u8 = 9;

/// `ioctl` request type (bits 8..16) of the RDMA verbs ioctls (`RDMA_IOCTL_MAGIC`).
pub const RDMA_IOCTL_MAGIC: u64 = 0x1b;
/// Paths whose descriptors are of [`CLASS_RDMA`].
pub const RDMA_PATH_PREFIX: &[u8] = b"/dev/infiniband/";

/// Key of `SYSCALLS`: phase, class and syscall number.
#[inline(always)]
pub const fn syscall_key(phase: u32, class: u32, nr: u32) -> u64 {
    ((phase as u64) << 40) | ((class as u64) << 32) | nr as u64
}

/// (phase, class, nr) of a `SYSCALLS` key.
pub const fn split_syscall_key(key: u64) -> (u32, u32, u32) {
    (
        ((key >> 40) & 0xff) as u32,
        ((key >> 32) & 0xff) as u32,
        key as u32,
    )
}

/// Phase of a thread whose comm is `comm` (NUL-padded, as the kernel keeps it).
#[inline(always)]
pub fn phase_of_comm(comm: &[u8; 16]) -> u32 {
    if comm_is(comm, DATA_COMM) {
        PHASE_DATA
    } else if comm_is(comm, TEARDOWN_COMM) {
        PHASE_TEARDOWN
    } else {
        PHASE_SETUP
    }
}

#[inline(always)]
fn comm_is(comm: &[u8; 16], name: &[u8]) -> bool {
    name.len() < comm.len() && comm[name.len()] == 0 && has_prefix(comm, name)
}

/// `bytes` begins with `prefix`. A byte loop, as the eBPF programs need: a slice comparison
/// would call `memcmp`.
#[inline(always)]
pub fn has_prefix(bytes: &[u8], prefix: &[u8]) -> bool {
    if bytes.len() < prefix.len() {
        return false;
    }
    let mut i = 0;
    while i < prefix.len() {
        if bytes[i] != prefix[i] {
            return false;
        }
        i += 1;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn comm(s: &[u8]) -> [u8; 16] {
        let mut c = [0u8; 16];
        c[..s.len()].copy_from_slice(s);
        c
    }

    #[test]
    fn phases_follow_the_comm_markers() {
        assert_eq!(phase_of_comm(&comm(b"rdma-demo")), PHASE_SETUP);
        assert_eq!(phase_of_comm(&comm(b"server")), PHASE_SETUP);
        assert_eq!(phase_of_comm(&comm(DATA_COMM)), PHASE_DATA);
        assert_eq!(phase_of_comm(&comm(TEARDOWN_COMM)), PHASE_TEARDOWN);
        assert_eq!(phase_of_comm(&comm(b"rdma-demo:datax")), PHASE_SETUP);
        assert!(DATA_COMM.len() < 16 && TEARDOWN_COMM.len() < 16);
    }

    #[test]
    fn prefixes() {
        assert!(has_prefix(b"/dev/infiniband/uverbs0", RDMA_PATH_PREFIX));
        assert!(has_prefix(RDMA_PATH_PREFIX, RDMA_PATH_PREFIX));
        assert!(!has_prefix(b"/dev/infiniband", RDMA_PATH_PREFIX));
        assert!(!has_prefix(b"/dev/null", RDMA_PATH_PREFIX));
    }

    #[test]
    fn keys_round_trip() {
        for (p, c, n) in [(0, 0, 0), (2, 2, 511), (1, 1, 44)] {
            assert_eq!(split_syscall_key(syscall_key(p, c, n)), (p, c, n));
        }
    }
}

//! Protection domains and memory regions.

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::ffi::c_void;
use std::ptr::{self, NonNull};
use std::rc::Rc;
use std::sync::atomic::{Ordering, fence};

use rdma_sys::{
    ibv_access_flags, ibv_alloc_pd, ibv_dealloc_pd, ibv_dereg_mr, ibv_mr, ibv_pd, ibv_reg_mr,
};

use super::device::Context;
use super::{VerbsError, check_rc, last_os_error};

/// What a memory region (or a queue pair) lets the local and the remote side do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Access {
    pub local_write: bool,
    pub remote_read: bool,
    pub remote_write: bool,
    pub remote_atomic: bool,
}

impl Access {
    /// Local access only (SEND/RECV buffers, RDMA READ destinations).
    pub const LOCAL_WRITE: Access = Access {
        local_write: true,
        remote_read: false,
        remote_write: false,
        remote_atomic: false,
    };

    pub(super) fn bits(self) -> u32 {
        let mut bits = 0;
        for (on, flag) in [
            (self.local_write, ibv_access_flags::IBV_ACCESS_LOCAL_WRITE),
            (self.remote_read, ibv_access_flags::IBV_ACCESS_REMOTE_READ),
            (self.remote_write, ibv_access_flags::IBV_ACCESS_REMOTE_WRITE),
            (
                self.remote_atomic,
                ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC,
            ),
        ] {
            if on {
                bits |= flag.0;
            }
        }
        bits
    }
}

/// A protection domain (`ibv_alloc_pd`); keeps its context open.
#[derive(Debug)]
pub struct ProtectionDomain {
    raw: NonNull<ibv_pd>,
    ctx: Rc<Context>,
}

impl ProtectionDomain {
    pub fn new(ctx: Rc<Context>) -> Result<Rc<Self>, VerbsError> {
        // SAFETY: the context is open; the result is NULL or a PD we free in Drop.
        let raw = unsafe { ibv_alloc_pd(ctx.as_ptr()) };
        let raw = NonNull::new(raw)
            .ok_or_else(|| VerbsError::new("ibv_alloc_pd", ctx.name(), last_os_error()))?;
        Ok(Rc::new(ProtectionDomain { raw, ctx }))
    }

    pub fn context(&self) -> &Rc<Context> {
        &self.ctx
    }

    pub(super) fn as_ptr(&self) -> *mut ibv_pd {
        self.raw.as_ptr()
    }
}

impl Drop for ProtectionDomain {
    fn drop(&mut self) {
        // SAFETY: allocated by ibv_alloc_pd, freed once. MRs and QPs hold an `Rc` to the PD, so
        // they are gone. A failure (EBUSY) cannot happen then and could not be acted on here.
        let _ = unsafe { ibv_dealloc_pd(self.raw.as_ptr()) };
    }
}

/// A zeroed, page-aligned buffer registered as a memory region (`ibv_reg_mr`).
///
/// The adapter may write the buffer at any time (RECV, RDMA READ results, remote WRITEs and
/// atomics), so no Rust reference into it is ever handed out: data moves in and out by copies.
#[derive(Debug)]
pub struct MemoryRegion {
    mr: NonNull<ibv_mr>,
    buf: NonNull<u8>,
    layout: Layout,
    access: Access,
    _pd: Rc<ProtectionDomain>,
}

const PAGE: usize = 4096;

impl MemoryRegion {
    /// Allocates `len` bytes (at least 1) and registers them with `access`.
    pub fn new(pd: &Rc<ProtectionDomain>, len: usize, access: Access) -> Result<Self, VerbsError> {
        let target = || format!("{} {len} bytes", pd.ctx.name());
        let layout = Layout::from_size_align(len.max(1), PAGE).map_err(|_| {
            VerbsError::new(
                "ibv_reg_mr",
                target(),
                std::io::Error::from_raw_os_error(libc::EINVAL),
            )
        })?;
        // SAFETY: the layout has a non-zero size.
        let buf = unsafe { alloc_zeroed(layout) };
        let buf = NonNull::new(buf).ok_or_else(|| {
            VerbsError::new(
                "ibv_reg_mr",
                target(),
                std::io::Error::from_raw_os_error(libc::ENOMEM),
            )
        })?;
        // SAFETY: the PD is live; `buf` points to `layout.size()` bytes that stay allocated until
        // after ibv_dereg_mr (Drop). The flags are valid ibv_access_flags bits.
        let mr = unsafe {
            ibv_reg_mr(
                pd.as_ptr(),
                buf.as_ptr().cast::<c_void>(),
                layout.size(),
                access.bits() as i32,
            )
        };
        match NonNull::new(mr) {
            Some(mr) => Ok(MemoryRegion {
                mr,
                buf,
                layout,
                access,
                _pd: Rc::clone(pd),
            }),
            None => {
                let e = VerbsError::new("ibv_reg_mr", target(), last_os_error());
                // SAFETY: allocated above with this layout and not registered.
                unsafe { dealloc(buf.as_ptr(), layout) };
                Err(e)
            }
        }
    }

    pub fn len(&self) -> usize {
        self.layout.size()
    }

    pub fn is_empty(&self) -> bool {
        false
    }

    pub fn access(&self) -> Access {
        self.access
    }

    pub fn lkey(&self) -> u32 {
        // SAFETY: `mr` is a live registration.
        unsafe { self.mr.as_ref() }.lkey
    }

    pub fn rkey(&self) -> u32 {
        // SAFETY: `mr` is a live registration.
        unsafe { self.mr.as_ref() }.rkey
    }

    /// The virtual address of byte `offset`, as the adapter and the peer see it.
    pub fn addr(&self, offset: usize) -> u64 {
        self.buf.as_ptr() as u64 + offset as u64
    }

    /// Panics (a programming error) unless `offset..offset + len` lies in the buffer.
    pub(super) fn check_range(&self, offset: usize, len: usize) {
        assert!(
            offset.checked_add(len).is_some_and(|end| end <= self.len()),
            "range {offset}+{len} outside a {}-byte memory region",
            self.len()
        );
    }

    /// Copies `data` into the buffer at `offset`.
    pub fn write(&self, offset: usize, data: &[u8]) {
        self.check_range(offset, data.len());
        // Order earlier reads of completions before touching the buffer.
        fence(Ordering::Acquire);
        // SAFETY: in bounds (checked); the buffer is never borrowed, so nothing aliases it on
        // the Rust side; the adapter only writes where we posted work requests.
        unsafe {
            ptr::copy_nonoverlapping(data.as_ptr(), self.buf.as_ptr().add(offset), data.len())
        };
        fence(Ordering::Release);
    }

    /// Copies `out.len()` bytes at `offset` out of the buffer.
    pub fn read(&self, offset: usize, out: &mut [u8]) {
        self.check_range(offset, out.len());
        fence(Ordering::Acquire);
        // SAFETY: in bounds (checked); see `write`.
        unsafe {
            ptr::copy_nonoverlapping(self.buf.as_ptr().add(offset), out.as_mut_ptr(), out.len())
        };
    }

    /// Sets `len` bytes at `offset` to `f(i)` for i in 0..len.
    pub fn fill(&self, offset: usize, len: usize, f: impl Fn(usize) -> u8) {
        let data: Vec<u8> = (0..len).map(f).collect();
        self.write(offset, &data);
    }

    /// A native-endian u64 at an 8-byte aligned `offset` (the form atomics use).
    pub fn read_u64(&self, offset: usize) -> u64 {
        assert!(offset.is_multiple_of(8), "unaligned u64 at {offset}");
        self.check_range(offset, 8);
        fence(Ordering::Acquire);
        // SAFETY: in bounds and aligned (the buffer is page-aligned); volatile because the
        // adapter writes it behind the compiler's back.
        unsafe { ptr::read_volatile(self.buf.as_ptr().add(offset).cast::<u64>()) }
    }

    pub fn write_u64(&self, offset: usize, value: u64) {
        assert!(offset.is_multiple_of(8), "unaligned u64 at {offset}");
        self.check_range(offset, 8);
        // SAFETY: in bounds and aligned; see `read_u64`.
        unsafe { ptr::write_volatile(self.buf.as_ptr().add(offset).cast::<u64>(), value) };
        fence(Ordering::Release);
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        // SAFETY: registered by ibv_reg_mr and deregistered once; QPs that used it are
        // destroyed first (they are dropped before the MRs by their owners, and any work still
        // in flight ends with the QP).
        let rc = unsafe { ibv_dereg_mr(self.mr.as_ptr()) };
        if check_rc(rc, "ibv_dereg_mr", String::new).is_ok() {
            // SAFETY: allocated in `new` with this layout; no longer registered.
            unsafe { dealloc(self.buf.as_ptr(), self.layout) };
        }
        // If deregistration failed the adapter may still own the pages: leak them.
    }
}

//! Device list, devices, and open device contexts.

use std::ffi::CStr;
use std::marker::PhantomData;
use std::mem::MaybeUninit;
use std::ptr::NonNull;

use rdma_sys::{
    ___ibv_query_port, ibv_close_device, ibv_context, ibv_device, ibv_device_attr,
    ibv_free_device_list, ibv_get_device_guid, ibv_get_device_list, ibv_get_device_name,
    ibv_open_device, ibv_port_attr, ibv_query_device,
};

use super::attr::{DeviceAttr, PortAttr, Transport};
use super::{VerbsError, check_rc, last_os_error};

/// The RDMA devices libibverbs knows about (`ibv_get_device_list`), freed on drop.
#[derive(Debug)]
pub struct DeviceList {
    /// NULL-terminated array of `len` device pointers, owned by libibverbs until freed.
    list: NonNull<*mut ibv_device>,
    len: usize,
}

impl DeviceList {
    /// Lists the devices. An empty list is `Ok`; libibverbs fails (e.g. `ENOSYS`) when the
    /// kernel has no RDMA support at all.
    pub fn new() -> Result<Self, VerbsError> {
        let mut n: libc::c_int = 0;
        // SAFETY: `n` is a valid out-pointer; the result is NULL or an array we free in Drop.
        let list = unsafe { ibv_get_device_list(&mut n) };
        let list = NonNull::new(list)
            .ok_or_else(|| VerbsError::new("ibv_get_device_list", "", last_os_error()))?;
        Ok(DeviceList {
            list,
            len: usize::try_from(n).unwrap_or(0),
        })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn iter(&self) -> impl Iterator<Item = Device<'_>> + '_ {
        (0..self.len).filter_map(move |i| {
            // SAFETY: i < len, and libibverbs filled entries 0..len of the array.
            let dev = unsafe { *self.list.as_ptr().add(i) };
            NonNull::new(dev).map(|raw| Device {
                raw,
                _list: PhantomData,
            })
        })
    }

    /// The device called `name`, if any.
    pub fn find(&self, name: &str) -> Option<Device<'_>> {
        self.iter().find(|d| d.name() == name)
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        // SAFETY: `list` came from ibv_get_device_list and is freed exactly once. Borrowed
        // `Device`s cannot outlive `self`; opened `Context`s stay valid after the free.
        unsafe { ibv_free_device_list(self.list.as_ptr()) }
    }
}

/// One entry of a [`DeviceList`]; valid while the list is.
#[derive(Debug, Clone, Copy)]
pub struct Device<'list> {
    raw: NonNull<ibv_device>,
    _list: PhantomData<&'list DeviceList>,
}

impl Device<'_> {
    /// Kernel device name, e.g. `mlx5_0` or `rxe0`.
    pub fn name(&self) -> String {
        // SAFETY: `raw` is a live device of the list; the returned name is a NUL-terminated
        // string inside the device struct (or NULL, handled below).
        let p = unsafe { ibv_get_device_name(self.raw.as_ptr()) };
        if p.is_null() {
            return String::new();
        }
        // SAFETY: non-NULL, NUL-terminated, and alive as long as the device.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }

    /// Node GUID in host byte order (libibverbs returns it big-endian).
    pub fn guid(&self) -> u64 {
        // SAFETY: `raw` is a live device of the list.
        u64::from_be(unsafe { ibv_get_device_guid(self.raw.as_ptr()) })
    }

    pub fn transport(&self) -> Transport {
        // SAFETY: `raw` points to a live, initialised `struct ibv_device`.
        Transport::from_raw(unsafe { self.raw.as_ref() }.transport_type)
    }

    /// Opens the device (`ibv_open_device`).
    pub fn open(&self) -> Result<Context, VerbsError> {
        let name = self.name();
        // SAFETY: `raw` is a live device of the list; the result is NULL or a context we close
        // in Drop.
        let ctx = unsafe { ibv_open_device(self.raw.as_ptr()) };
        match NonNull::new(ctx) {
            Some(raw) => Ok(Context { raw, name }),
            None => Err(VerbsError::new("ibv_open_device", name, last_os_error())),
        }
    }
}

/// An open device (`struct ibv_context`), closed on drop.
#[derive(Debug)]
pub struct Context {
    raw: NonNull<ibv_context>,
    name: String,
}

impl Context {
    /// The device name this context was opened from.
    pub fn name(&self) -> &str {
        &self.name
    }

    pub(super) fn as_ptr(&self) -> *mut ibv_context {
        self.raw.as_ptr()
    }

    /// `ibv_query_device`.
    pub fn query_device(&self) -> Result<DeviceAttr, VerbsError> {
        let mut attr = MaybeUninit::<ibv_device_attr>::zeroed();
        // SAFETY: the context is open and `attr` is a writable ibv_device_attr.
        let rc = unsafe { ibv_query_device(self.as_ptr(), attr.as_mut_ptr()) };
        check_rc(rc, "ibv_query_device", || self.name.clone())?;
        // SAFETY: zero-initialised plain old data, filled in by the successful call.
        Ok(DeviceAttr::from_raw(unsafe { attr.assume_init_ref() }))
    }

    /// `ibv_query_port` for port `port` (1-based).
    pub fn query_port(&self, port: u8) -> Result<PortAttr, VerbsError> {
        let mut attr = MaybeUninit::<ibv_port_attr>::zeroed();
        // SAFETY: the context is open and `attr` is a writable, zeroed ibv_port_attr. In C,
        // ibv_query_port() is a macro for this inline function; the exported symbol that
        // rdma-sys binds as `ibv_query_port` takes the smaller compat struct.
        let rc = unsafe { ___ibv_query_port(self.as_ptr(), port, attr.as_mut_ptr()) };
        check_rc(rc, "ibv_query_port", || {
            format!("{} port {port}", self.name)
        })?;
        // SAFETY: zero-initialised plain old data, filled in by the successful call.
        Ok(PortAttr::from_raw(unsafe { attr.assume_init_ref() }))
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: `raw` came from ibv_open_device and is closed exactly once. Resources created
        // from the context will borrow it, so they are gone by now.
        // A failed close cannot be acted on here (and does not happen short of a kernel bug).
        let _ = unsafe { ibv_close_device(self.raw.as_ptr()) };
    }
}

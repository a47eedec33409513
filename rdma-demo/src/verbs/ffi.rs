//! Pieces of `<infiniband/verbs.h>` that `rdma-sys` 0.3 does not bind.

use rdma_sys::{ibv_context, ibv_gid_entry};

// `enum { IBV_LINK_LAYER_* }` is anonymous in verbs.h, so rdma-sys' bindgen skips it.
pub(super) const IBV_LINK_LAYER_UNSPECIFIED: u8 = 0;
pub(super) const IBV_LINK_LAYER_INFINIBAND: u8 = 1;
pub(super) const IBV_LINK_LAYER_ETHERNET: u8 = 2;

// rdma-sys binds only `ibv_*` names, so the exported `_ibv_query_gid_ex` (libibverbs
// IBVERBS_1.11, rdma-core >= v32) behind the static inline `ibv_query_gid_ex()` is missing.
// It returns 0, or an errno value: ENODATA for an empty table entry. libibverbs is already
// linked by rdma-sys.
unsafe extern "C" {
    pub(super) fn _ibv_query_gid_ex(
        context: *mut ibv_context,
        port_num: u32,
        gid_index: u32,
        entry: *mut ibv_gid_entry,
        flags: u32,
        entry_size: usize,
    ) -> libc::c_int;
}

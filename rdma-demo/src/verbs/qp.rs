//! Reliable-connected queue pairs: creation, the RESET → INIT → RTR → RTS transitions, and
//! posting work requests.

use std::mem::MaybeUninit;
use std::ptr::{self, NonNull};
use std::rc::Rc;

use rdma_sys::{
    atomic_t, ibv_create_qp, ibv_destroy_qp, ibv_gid, ibv_modify_qp, ibv_post_recv, ibv_post_send,
    ibv_qp, ibv_qp_attr, ibv_qp_attr_mask, ibv_qp_init_attr, ibv_qp_state, ibv_qp_type,
    ibv_recv_wr, ibv_send_flags, ibv_send_wr, ibv_sge, ibv_wr_opcode, rdma_t,
};

use super::attr::Mtu;
use super::cq::{CompletionQueue, WcOpcode};
use super::gid::Gid;
use super::pd::{Access, MemoryRegion, ProtectionDomain};
use super::{VerbsError, check_rc, last_os_error};

/// Queue sizes of a new QP.
#[derive(Debug, Clone, Copy)]
pub struct QpCaps {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
}

/// A reliable-connected queue pair; keeps its PD and CQs alive, and is destroyed before them.
#[derive(Debug)]
pub struct QueuePair {
    raw: NonNull<ibv_qp>,
    _send_cq: Rc<CompletionQueue>,
    _recv_cq: Rc<CompletionQueue>,
    pd: Rc<ProtectionDomain>,
}

/// Where the remote QP is and how to reach it (the fields the RTR transition needs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteQp {
    pub qpn: u32,
    pub psn: u32,
    pub lid: u16,
    pub gid: Gid,
}

/// How to reach the peer from here.
#[derive(Debug, Clone, Copy)]
pub struct PathParams {
    pub port: u8,
    pub mtu: Mtu,
    /// `Some(local GID index)`: route with a GRH (RoCE, always); `None`: LID only (IB subnet).
    pub sgid_index: Option<u8>,
}

/// Where a one-sided operation goes on the peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteAddr {
    pub addr: u64,
    pub rkey: u32,
}

/// The operation of a send work request.
#[derive(Debug, Clone, Copy)]
pub enum SendOp {
    Send,
    RdmaWrite(RemoteAddr),
    RdmaRead(RemoteAddr),
    /// 8 bytes; the old value lands in the local buffer.
    FetchAdd {
        remote: RemoteAddr,
        add: u64,
    },
    /// 8 bytes; the old value lands in the local buffer.
    CmpSwap {
        remote: RemoteAddr,
        compare: u64,
        swap: u64,
    },
}

impl SendOp {
    /// The opcode of the request's completion.
    pub fn completion(&self) -> WcOpcode {
        match self {
            SendOp::Send => WcOpcode::Send,
            SendOp::RdmaWrite(_) => WcOpcode::RdmaWrite,
            SendOp::RdmaRead(_) => WcOpcode::RdmaRead,
            SendOp::FetchAdd { .. } => WcOpcode::FetchAdd,
            SendOp::CmpSwap { .. } => WcOpcode::CompSwap,
        }
    }
}

fn mtu_raw(mtu: Mtu) -> u32 {
    use rdma_sys::ibv_mtu;
    match mtu {
        Mtu::Mtu256 => ibv_mtu::IBV_MTU_256,
        Mtu::Mtu512 => ibv_mtu::IBV_MTU_512,
        Mtu::Mtu1024 => ibv_mtu::IBV_MTU_1024,
        Mtu::Mtu2048 => ibv_mtu::IBV_MTU_2048,
        Mtu::Mtu4096 => ibv_mtu::IBV_MTU_4096,
    }
}

/// The one scatter/gather entry of a work request: `len` bytes of `mr` at `offset` (panics
/// outside the region).
fn sge(mr: &MemoryRegion, offset: usize, len: u32) -> ibv_sge {
    mr.check_range(offset, len as usize);
    ibv_sge {
        addr: mr.addr(offset),
        length: len,
        lkey: mr.lkey(),
    }
}

impl QueuePair {
    /// `ibv_create_qp` for an RC QP, every send signaled only if asked per WR.
    pub fn new_rc(
        pd: &Rc<ProtectionDomain>,
        send_cq: &Rc<CompletionQueue>,
        recv_cq: &Rc<CompletionQueue>,
        caps: QpCaps,
    ) -> Result<Self, VerbsError> {
        // SAFETY: all-zero is a valid ibv_qp_init_attr (NULL pointers, zero sizes).
        let mut init: ibv_qp_init_attr = unsafe { MaybeUninit::zeroed().assume_init() };
        init.send_cq = send_cq.as_ptr();
        init.recv_cq = recv_cq.as_ptr();
        init.qp_type = ibv_qp_type::IBV_QPT_RC;
        init.sq_sig_all = 0;
        init.cap.max_send_wr = caps.max_send_wr;
        init.cap.max_recv_wr = caps.max_recv_wr;
        init.cap.max_send_sge = 1;
        init.cap.max_recv_sge = 1;
        // SAFETY: PD and CQs are live (we keep `Rc`s to them); the result is NULL or a QP we
        // destroy in Drop.
        let raw = unsafe { ibv_create_qp(pd.as_ptr(), &mut init) };
        let raw = NonNull::new(raw).ok_or_else(|| {
            VerbsError::new("ibv_create_qp", pd.context().name(), last_os_error())
        })?;
        Ok(QueuePair {
            raw,
            _send_cq: Rc::clone(send_cq),
            _recv_cq: Rc::clone(recv_cq),
            pd: Rc::clone(pd),
        })
    }

    pub fn qp_num(&self) -> u32 {
        // SAFETY: the QP is live.
        unsafe { self.raw.as_ref() }.qp_num
    }

    fn target(&self) -> String {
        format!("{} QP {:#x}", self.pd.context().name(), self.qp_num())
    }

    fn modify(
        &self,
        call: &'static str,
        attr: &mut ibv_qp_attr,
        mask: ibv_qp_attr_mask,
    ) -> Result<(), VerbsError> {
        // SAFETY: the QP is live; `attr` is a valid ibv_qp_attr with the masked fields set.
        let rc = unsafe { ibv_modify_qp(self.raw.as_ptr(), attr, mask.0 as i32) };
        check_rc(rc, call, || self.target())
    }

    fn zeroed_attr() -> ibv_qp_attr {
        // SAFETY: all-zero is a valid ibv_qp_attr.
        unsafe { MaybeUninit::zeroed().assume_init() }
    }

    /// RESET → INIT, allowing the peer `remote` access through this QP.
    pub fn to_init(&self, port: u8, remote: Access) -> Result<(), VerbsError> {
        let mut a = Self::zeroed_attr();
        a.qp_state = ibv_qp_state::IBV_QPS_INIT;
        a.pkey_index = 0;
        a.port_num = port;
        a.qp_access_flags = remote.bits();
        let mask = ibv_qp_attr_mask::IBV_QP_STATE
            | ibv_qp_attr_mask::IBV_QP_PKEY_INDEX
            | ibv_qp_attr_mask::IBV_QP_PORT
            | ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS;
        self.modify("ibv_modify_qp(RESET->INIT)", &mut a, mask)
    }

    /// INIT → RTR (ready to receive from `peer`).
    pub fn to_rtr(&self, path: PathParams, peer: &RemoteQp) -> Result<(), VerbsError> {
        let mut a = Self::zeroed_attr();
        a.qp_state = ibv_qp_state::IBV_QPS_RTR;
        a.path_mtu = mtu_raw(path.mtu);
        a.dest_qp_num = peer.qpn;
        a.rq_psn = peer.psn;
        a.max_dest_rd_atomic = 1;
        a.min_rnr_timer = 12;
        a.ah_attr.dlid = peer.lid;
        a.ah_attr.sl = 0;
        a.ah_attr.src_path_bits = 0;
        a.ah_attr.port_num = path.port;
        if let Some(sgid_index) = path.sgid_index {
            a.ah_attr.is_global = 1;
            a.ah_attr.grh.dgid = ibv_gid {
                raw: *peer.gid.as_bytes(),
            };
            a.ah_attr.grh.sgid_index = sgid_index;
            a.ah_attr.grh.hop_limit = 64;
        }
        let mask = ibv_qp_attr_mask::IBV_QP_STATE
            | ibv_qp_attr_mask::IBV_QP_AV
            | ibv_qp_attr_mask::IBV_QP_PATH_MTU
            | ibv_qp_attr_mask::IBV_QP_DEST_QPN
            | ibv_qp_attr_mask::IBV_QP_RQ_PSN
            | ibv_qp_attr_mask::IBV_QP_MAX_DEST_RD_ATOMIC
            | ibv_qp_attr_mask::IBV_QP_MIN_RNR_TIMER;
        self.modify("ibv_modify_qp(INIT->RTR)", &mut a, mask)
    }

    /// RTR → RTS with our send PSN `psn`. `timeout_exp`: local ACK timeout 4.096 µs · 2^exp.
    pub fn to_rts(&self, psn: u32, timeout_exp: u8) -> Result<(), VerbsError> {
        let mut a = Self::zeroed_attr();
        a.qp_state = ibv_qp_state::IBV_QPS_RTS;
        a.timeout = timeout_exp;
        a.retry_cnt = 7;
        a.rnr_retry = 7;
        a.sq_psn = psn;
        a.max_rd_atomic = 1;
        let mask = ibv_qp_attr_mask::IBV_QP_STATE
            | ibv_qp_attr_mask::IBV_QP_TIMEOUT
            | ibv_qp_attr_mask::IBV_QP_RETRY_CNT
            | ibv_qp_attr_mask::IBV_QP_RNR_RETRY
            | ibv_qp_attr_mask::IBV_QP_SQ_PSN
            | ibv_qp_attr_mask::IBV_QP_MAX_QP_RD_ATOMIC;
        self.modify("ibv_modify_qp(RTR->RTS)", &mut a, mask)
    }

    /// Posts one receive of `len` bytes into `mr` at `offset`.
    pub fn post_recv(
        &self,
        wr_id: u64,
        mr: &MemoryRegion,
        offset: usize,
        len: u32,
    ) -> Result<(), VerbsError> {
        let mut sge = sge(mr, offset, len);
        let mut wr = ibv_recv_wr {
            wr_id,
            next: ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
        };
        let mut bad: *mut ibv_recv_wr = ptr::null_mut();
        // SAFETY: the QP is live; `wr` and `sge` are valid for the call (the provider copies
        // them); the SGE lies inside the registered region (`sge` checks it).
        let rc = unsafe { ibv_post_recv(self.raw.as_ptr(), &mut wr, &mut bad) };
        check_rc(rc, "ibv_post_recv", || self.target())
    }

    /// Posts one send work request with a single SGE (`len` bytes of `mr` at `offset`; 8 for
    /// atomics). Unsignaled requests produce a completion only on error.
    pub fn post_send(
        &self,
        wr_id: u64,
        op: SendOp,
        mr: &MemoryRegion,
        offset: usize,
        len: u32,
        signaled: bool,
    ) -> Result<(), VerbsError> {
        let mut sge = sge(mr, offset, len);
        // SAFETY: all-zero is a valid ibv_send_wr (NULL pointers, zero unions).
        let mut wr: ibv_send_wr = unsafe { MaybeUninit::zeroed().assume_init() };
        wr.wr_id = wr_id;
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        wr.send_flags = if signaled {
            ibv_send_flags::IBV_SEND_SIGNALED.0
        } else {
            0
        };
        let rdma = |r: RemoteAddr| rdma_t {
            remote_addr: r.addr,
            rkey: r.rkey,
        };
        match op {
            SendOp::Send => wr.opcode = ibv_wr_opcode::IBV_WR_SEND,
            SendOp::RdmaWrite(r) => {
                wr.opcode = ibv_wr_opcode::IBV_WR_RDMA_WRITE;
                wr.wr.rdma = rdma(r);
            }
            SendOp::RdmaRead(r) => {
                wr.opcode = ibv_wr_opcode::IBV_WR_RDMA_READ;
                wr.wr.rdma = rdma(r);
            }
            SendOp::FetchAdd { remote, add } => {
                wr.opcode = ibv_wr_opcode::IBV_WR_ATOMIC_FETCH_AND_ADD;
                wr.wr.atomic = atomic_t {
                    remote_addr: remote.addr,
                    compare_add: add,
                    swap: 0,
                    rkey: remote.rkey,
                };
            }
            SendOp::CmpSwap {
                remote,
                compare,
                swap,
            } => {
                wr.opcode = ibv_wr_opcode::IBV_WR_ATOMIC_CMP_AND_SWP;
                wr.wr.atomic = atomic_t {
                    remote_addr: remote.addr,
                    compare_add: compare,
                    swap,
                    rkey: remote.rkey,
                };
            }
        }
        let mut bad: *mut ibv_send_wr = ptr::null_mut();
        // SAFETY: the QP is live; `wr` and `sge` are valid for the call (the provider copies
        // them); the local SGE lies inside the registered region (`sge` checks it). Remote
        // addresses are checked by the peer's adapter against its rkey, not trusted here.
        let rc = unsafe { ibv_post_send(self.raw.as_ptr(), &mut wr, &mut bad) };
        check_rc(rc, "ibv_post_send", || self.target())
    }
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        // SAFETY: created by ibv_create_qp, destroyed once, before the CQs and PD it holds.
        let _ = unsafe { ibv_destroy_qp(self.raw.as_ptr()) };
    }
}

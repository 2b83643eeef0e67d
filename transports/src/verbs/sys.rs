//! libibverbs' C types and constants, declared here (as NCCL declares its own in `ibvcore.h`)
//! so that nothing links to or builds against rdma-core. Layouts are those of rdma-core 44 on
//! x86-64 (`tests` below pins every size and field offset; the figures come from a C program
//! built against rdma-core 44.0's `verbs.h`, `standins/ibverbs/layout.c`). Only the fields
//! topoccl reads or writes are named; the rest are padding of the right size and alignment.
//!
//! Enums the library hands back are plain integers: a value outside a Rust enum would be
//! undefined behaviour, an unknown integer is only an error. `imm_data` is big-endian on the
//! wire and in both the work request and the completion, as in rdma-core.
//!
//! The stand-in library (`standins/ibverbs`) uses these same declarations.

#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_int, c_void};

/// `pthread_mutex_t` (40 bytes on x86-64 glibc), never touched by topoccl.
pub type PthreadMutex = [u64; 5];
/// `pthread_cond_t` (48 bytes).
pub type PthreadCond = [u64; 6];

/// `struct ibv_device`: opaque (its name comes from `ibv_get_device_name`).
#[repr(C)]
pub struct ibv_device {
    _opaque: [u8; 0],
}

pub type PollCq = unsafe extern "C" fn(cq: *mut ibv_cq, num_entries: c_int, wc: *mut ibv_wc) -> c_int;
pub type ReqNotifyCq = unsafe extern "C" fn(cq: *mut ibv_cq, solicited_only: c_int) -> c_int;
pub type PostSend = unsafe extern "C" fn(qp: *mut ibv_qp, wr: *mut ibv_send_wr, bad_wr: *mut *mut ibv_send_wr) -> c_int;
pub type PostRecv = unsafe extern "C" fn(qp: *mut ibv_qp, wr: *mut ibv_recv_wr, bad_wr: *mut *mut ibv_recv_wr) -> c_int;

/// `struct ibv_context_ops`: 32 function pointers; `ibv_poll_cq`, `ibv_post_send` and
/// `ibv_post_recv` are inline functions in `verbs.h` that call through these.
#[repr(C)]
pub struct ibv_context_ops {
    pub _compat_before: [*mut c_void; 11],
    pub poll_cq: Option<PollCq>,
    pub req_notify_cq: Option<ReqNotifyCq>,
    pub _compat_middle: [*mut c_void; 12],
    pub post_send: Option<PostSend>,
    pub post_recv: Option<PostRecv>,
    pub _compat_after: [*mut c_void; 5],
}

/// `struct ibv_context`.
#[repr(C)]
pub struct ibv_context {
    pub device: *mut ibv_device,
    pub ops: ibv_context_ops,
    pub cmd_fd: c_int,
    pub async_fd: c_int,
    pub num_comp_vectors: c_int,
    pub mutex: PthreadMutex,
    pub abi_compat: *mut c_void,
}

/// `struct ibv_device_attr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_device_attr {
    pub fw_ver: [c_char; 64],
    pub node_guid: u64,
    pub sys_image_guid: u64,
    pub max_mr_size: u64,
    pub page_size_cap: u64,
    pub vendor_id: u32,
    pub vendor_part_id: u32,
    pub hw_ver: u32,
    pub max_qp: c_int,
    pub max_qp_wr: c_int,
    pub device_cap_flags: u32,
    pub max_sge: c_int,
    pub max_sge_rd: c_int,
    pub max_cq: c_int,
    pub max_cqe: c_int,
    pub max_mr: c_int,
    pub max_pd: c_int,
    pub max_qp_rd_atom: c_int,
    /// `max_ee_rd_atom` … `max_srq_sge`: 19 ints.
    pub _ints: [c_int; 19],
    pub max_pkeys: u16,
    pub local_ca_ack_delay: u8,
    pub phys_port_cnt: u8,
}

/// `struct ibv_port_attr` (rdma-core 44: no `active_speed_ex` yet).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_port_attr {
    pub state: u32,
    pub max_mtu: u32,
    pub active_mtu: u32,
    pub gid_tbl_len: c_int,
    pub port_cap_flags: u32,
    pub max_msg_sz: u32,
    pub bad_pkey_cntr: u32,
    pub qkey_viol_cntr: u32,
    pub pkey_tbl_len: u16,
    pub lid: u16,
    pub sm_lid: u16,
    pub lmc: u8,
    pub max_vl_num: u8,
    pub sm_sl: u8,
    pub subnet_timeout: u8,
    pub init_type_reply: u8,
    pub active_width: u8,
    pub active_speed: u8,
    pub phys_state: u8,
    pub link_layer: u8,
    pub flags: u8,
    pub port_cap_flags2: u16,
}

/// `union ibv_gid`: 16 raw bytes (subnet prefix, then interface id, both big-endian).
#[repr(C, align(8))]
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash, Debug)]
pub struct ibv_gid {
    pub raw: [u8; 16],
}

/// `struct ibv_pd`.
#[repr(C)]
pub struct ibv_pd {
    pub context: *mut ibv_context,
    pub handle: u32,
}

/// `struct ibv_mr`.
#[repr(C)]
pub struct ibv_mr {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub addr: *mut c_void,
    pub length: usize,
    pub handle: u32,
    pub lkey: u32,
    pub rkey: u32,
}

/// `struct ibv_comp_channel`: opaque (topoccl polls, it never waits on a channel).
#[repr(C)]
pub struct ibv_comp_channel {
    _opaque: [u8; 0],
}

/// `struct ibv_cq`.
#[repr(C)]
pub struct ibv_cq {
    pub context: *mut ibv_context,
    pub channel: *mut ibv_comp_channel,
    pub cq_context: *mut c_void,
    pub handle: u32,
    pub cqe: c_int,
    pub mutex: PthreadMutex,
    pub cond: PthreadCond,
    pub comp_events_completed: u32,
    pub async_events_completed: u32,
}

/// `struct ibv_srq`: opaque (not used).
#[repr(C)]
pub struct ibv_srq {
    _opaque: [u8; 0],
}

/// `struct ibv_qp`.
#[repr(C)]
pub struct ibv_qp {
    pub context: *mut ibv_context,
    pub qp_context: *mut c_void,
    pub pd: *mut ibv_pd,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub handle: u32,
    pub qp_num: u32,
    pub state: u32,
    pub qp_type: u32,
    pub mutex: PthreadMutex,
    pub cond: PthreadCond,
    pub events_completed: u32,
}

/// `struct ibv_qp_cap`.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub struct ibv_qp_cap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

/// `struct ibv_qp_init_attr`.
#[repr(C)]
pub struct ibv_qp_init_attr {
    pub qp_context: *mut c_void,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub cap: ibv_qp_cap,
    pub qp_type: u32,
    pub sq_sig_all: c_int,
}

/// `struct ibv_global_route`.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct ibv_global_route {
    pub dgid: ibv_gid,
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
}

/// `struct ibv_ah_attr`.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct ibv_ah_attr {
    pub grh: ibv_global_route,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub is_global: u8,
    pub port_num: u8,
}

/// `struct ibv_qp_attr`.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct ibv_qp_attr {
    pub qp_state: u32,
    pub cur_qp_state: u32,
    pub path_mtu: u32,
    pub path_mig_state: u32,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: u32,
    pub cap: ibv_qp_cap,
    pub ah_attr: ibv_ah_attr,
    pub alt_ah_attr: ibv_ah_attr,
    pub pkey_index: u16,
    pub alt_pkey_index: u16,
    pub en_sqd_async_notify: u8,
    pub sq_draining: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub alt_port_num: u8,
    pub alt_timeout: u8,
    pub rate_limit: u32,
}

/// `struct ibv_sge`.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct ibv_sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// The `rdma` arm of `ibv_send_wr`'s `wr` union (32 bytes: the atomic arm is the largest).
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct ibv_rdma_wr {
    pub remote_addr: u64,
    pub rkey: u32,
    pub _rest: [u32; 5],
}

/// `struct ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_send_wr {
    pub wr_id: u64,
    pub next: *mut ibv_send_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
    pub opcode: u32,
    pub send_flags: u32,
    /// Big-endian (`__be32`).
    pub imm_data: u32,
    pub wr: ibv_rdma_wr,
    /// `qp_type.xrc.remote_srqn`.
    pub qp_type: u32,
    /// The `bind_mw` / `tso` union.
    pub _bind_mw: [u64; 6],
}

impl Default for ibv_send_wr {
    fn default() -> ibv_send_wr {
        ibv_send_wr {
            wr_id: 0,
            next: std::ptr::null_mut(),
            sg_list: std::ptr::null_mut(),
            num_sge: 0,
            opcode: 0,
            send_flags: 0,
            imm_data: 0,
            wr: ibv_rdma_wr::default(),
            qp_type: 0,
            _bind_mw: [0; 6],
        }
    }
}

/// `struct ibv_recv_wr`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_recv_wr {
    pub wr_id: u64,
    pub next: *mut ibv_recv_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
}

impl Default for ibv_recv_wr {
    fn default() -> ibv_recv_wr {
        ibv_recv_wr { wr_id: 0, next: std::ptr::null_mut(), sg_list: std::ptr::null_mut(), num_sge: 0 }
    }
}

/// `struct ibv_wc`.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct ibv_wc {
    pub wr_id: u64,
    pub status: u32,
    pub opcode: u32,
    pub vendor_err: u32,
    pub byte_len: u32,
    /// Big-endian (`__be32`), valid when `wc_flags` has [`WC_WITH_IMM`].
    pub imm_data: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: u32,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

// `enum ibv_qp_state`.
pub const QPS_RESET: u32 = 0;
pub const QPS_INIT: u32 = 1;
pub const QPS_RTR: u32 = 2;
pub const QPS_RTS: u32 = 3;
pub const QPS_SQD: u32 = 4;
pub const QPS_SQE: u32 = 5;
pub const QPS_ERR: u32 = 6;

// `enum ibv_qp_attr_mask`.
pub const QP_STATE: c_int = 1;
pub const QP_CUR_STATE: c_int = 1 << 1;
pub const QP_EN_SQD_ASYNC_NOTIFY: c_int = 1 << 2;
pub const QP_ACCESS_FLAGS: c_int = 1 << 3;
pub const QP_PKEY_INDEX: c_int = 1 << 4;
pub const QP_PORT: c_int = 1 << 5;
pub const QP_QKEY: c_int = 1 << 6;
pub const QP_AV: c_int = 1 << 7;
pub const QP_PATH_MTU: c_int = 1 << 8;
pub const QP_TIMEOUT: c_int = 1 << 9;
pub const QP_RETRY_CNT: c_int = 1 << 10;
pub const QP_RNR_RETRY: c_int = 1 << 11;
pub const QP_RQ_PSN: c_int = 1 << 12;
pub const QP_MAX_QP_RD_ATOMIC: c_int = 1 << 13;
pub const QP_ALT_PATH: c_int = 1 << 14;
pub const QP_MIN_RNR_TIMER: c_int = 1 << 15;
pub const QP_SQ_PSN: c_int = 1 << 16;
pub const QP_MAX_DEST_RD_ATOMIC: c_int = 1 << 17;
pub const QP_PATH_MIG_STATE: c_int = 1 << 18;
pub const QP_CAP: c_int = 1 << 19;
pub const QP_DEST_QPN: c_int = 1 << 20;

// `enum ibv_qp_type`.
pub const QPT_RC: u32 = 2;

// `enum ibv_wr_opcode`.
pub const WR_RDMA_WRITE: u32 = 0;
pub const WR_RDMA_WRITE_WITH_IMM: u32 = 1;
pub const WR_SEND: u32 = 2;
pub const WR_SEND_WITH_IMM: u32 = 3;
pub const WR_RDMA_READ: u32 = 4;

// `enum ibv_send_flags`.
pub const SEND_FENCE: u32 = 1;
pub const SEND_SIGNALED: u32 = 1 << 1;
pub const SEND_SOLICITED: u32 = 1 << 2;
pub const SEND_INLINE: u32 = 1 << 3;

// `enum ibv_wc_opcode`.
pub const WC_SEND: u32 = 0;
pub const WC_RDMA_WRITE: u32 = 1;
pub const WC_RDMA_READ: u32 = 2;
pub const WC_RECV: u32 = 128;
pub const WC_RECV_RDMA_WITH_IMM: u32 = 129;

// `enum ibv_wc_flags`.
pub const WC_WITH_IMM: u32 = 1 << 1;

// `enum ibv_wc_status`.
pub const WC_SUCCESS: u32 = 0;
pub const WC_LOC_LEN_ERR: u32 = 1;
pub const WC_LOC_QP_OP_ERR: u32 = 2;
pub const WC_LOC_PROT_ERR: u32 = 4;
pub const WC_WR_FLUSH_ERR: u32 = 5;
pub const WC_REM_INV_REQ_ERR: u32 = 9;
pub const WC_REM_ACCESS_ERR: u32 = 10;
pub const WC_REM_OP_ERR: u32 = 11;
pub const WC_RETRY_EXC_ERR: u32 = 12;
pub const WC_RNR_RETRY_EXC_ERR: u32 = 13;
pub const WC_GENERAL_ERR: u32 = 21;

// `enum ibv_access_flags`.
pub const ACCESS_LOCAL_WRITE: c_int = 1;
pub const ACCESS_REMOTE_WRITE: c_int = 1 << 1;
pub const ACCESS_REMOTE_READ: c_int = 1 << 2;
pub const ACCESS_REMOTE_ATOMIC: c_int = 1 << 3;
pub const ACCESS_ON_DEMAND: c_int = 1 << 6;
pub const ACCESS_RELAXED_ORDERING: c_int = 1 << 20;

// `enum ibv_port_state`, `enum ibv_mtu`, link layers.
pub const PORT_ACTIVE: u32 = 4;
pub const MTU_1024: u32 = 3;
pub const MTU_4096: u32 = 5;
pub const LINK_LAYER_UNSPECIFIED: u8 = 0;
pub const LINK_LAYER_INFINIBAND: u8 = 1;
pub const LINK_LAYER_ETHERNET: u8 = 2;

/// The wire's names for a completion status (rdma-core's `ibv_wc_status_str`, abridged).
pub fn wc_status_name(status: u32) -> &'static str {
    match status {
        WC_SUCCESS => "success",
        WC_LOC_LEN_ERR => "local length error",
        WC_LOC_QP_OP_ERR => "local QP operation error",
        WC_LOC_PROT_ERR => "local protection error",
        WC_WR_FLUSH_ERR => "work request flushed",
        WC_REM_INV_REQ_ERR => "remote invalid request",
        WC_REM_ACCESS_ERR => "remote access error",
        WC_REM_OP_ERR => "remote operation error",
        WC_RETRY_EXC_ERR => "transport retry counter exceeded",
        WC_RNR_RETRY_EXC_ERR => "RNR retry counter exceeded",
        WC_GENERAL_ERR => "general error",
        _ => "unknown status",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{align_of, offset_of, size_of};

    // Every figure below is printed by standins/ibverbs/layout.c compiled against rdma-core
    // 44.0's verbs.h on x86-64 (Debian 12's libibverbs-dev).
    #[test]
    fn layouts_match_rdma_core_44() {
        assert_eq!(size_of::<ibv_context>(), 328);
        assert_eq!(offset_of!(ibv_context, ops), 8);
        assert_eq!(offset_of!(ibv_context, cmd_fd), 264);
        assert_eq!(offset_of!(ibv_context, async_fd), 268);
        assert_eq!(offset_of!(ibv_context, num_comp_vectors), 272);
        assert_eq!(offset_of!(ibv_context, mutex), 280);
        assert_eq!(offset_of!(ibv_context, abi_compat), 320);
        assert_eq!(size_of::<ibv_context_ops>(), 256);
        assert_eq!(offset_of!(ibv_context_ops, poll_cq), 88);
        assert_eq!(offset_of!(ibv_context_ops, req_notify_cq), 96);
        assert_eq!(offset_of!(ibv_context_ops, post_send), 200);
        assert_eq!(offset_of!(ibv_context_ops, post_recv), 208);

        assert_eq!(size_of::<ibv_device_attr>(), 232);
        assert_eq!(offset_of!(ibv_device_attr, node_guid), 64);
        assert_eq!(offset_of!(ibv_device_attr, max_mr_size), 80);
        assert_eq!(offset_of!(ibv_device_attr, max_qp), 108);
        assert_eq!(offset_of!(ibv_device_attr, max_qp_wr), 112);
        assert_eq!(offset_of!(ibv_device_attr, max_sge), 120);
        assert_eq!(offset_of!(ibv_device_attr, max_cqe), 132);
        assert_eq!(offset_of!(ibv_device_attr, max_mr), 136);
        assert_eq!(offset_of!(ibv_device_attr, max_qp_rd_atom), 144);
        assert_eq!(offset_of!(ibv_device_attr, phys_port_cnt), 227);

        assert_eq!((size_of::<ibv_port_attr>(), align_of::<ibv_port_attr>()), (52, 4));
        assert_eq!(offset_of!(ibv_port_attr, max_mtu), 4);
        assert_eq!(offset_of!(ibv_port_attr, active_mtu), 8);
        assert_eq!(offset_of!(ibv_port_attr, gid_tbl_len), 12);
        assert_eq!(offset_of!(ibv_port_attr, port_cap_flags), 16);
        assert_eq!(offset_of!(ibv_port_attr, max_msg_sz), 20);
        assert_eq!(offset_of!(ibv_port_attr, lid), 34);
        assert_eq!(offset_of!(ibv_port_attr, sm_lid), 36);
        assert_eq!(offset_of!(ibv_port_attr, active_width), 43);
        assert_eq!(offset_of!(ibv_port_attr, active_speed), 44);
        assert_eq!(offset_of!(ibv_port_attr, phys_state), 45);
        assert_eq!(offset_of!(ibv_port_attr, link_layer), 46);
        assert_eq!(offset_of!(ibv_port_attr, flags), 47);
        assert_eq!(offset_of!(ibv_port_attr, port_cap_flags2), 48);

        assert_eq!((size_of::<ibv_gid>(), align_of::<ibv_gid>()), (16, 8));
        assert_eq!(size_of::<ibv_pd>(), 16);
        assert_eq!(offset_of!(ibv_pd, handle), 8);

        assert_eq!(size_of::<ibv_mr>(), 48);
        assert_eq!(offset_of!(ibv_mr, pd), 8);
        assert_eq!(offset_of!(ibv_mr, addr), 16);
        assert_eq!(offset_of!(ibv_mr, length), 24);
        assert_eq!(offset_of!(ibv_mr, handle), 32);
        assert_eq!(offset_of!(ibv_mr, lkey), 36);
        assert_eq!(offset_of!(ibv_mr, rkey), 40);

        assert_eq!(size_of::<ibv_cq>(), 128);
        assert_eq!(offset_of!(ibv_cq, channel), 8);
        assert_eq!(offset_of!(ibv_cq, cq_context), 16);
        assert_eq!(offset_of!(ibv_cq, handle), 24);
        assert_eq!(offset_of!(ibv_cq, cqe), 28);
        assert_eq!(offset_of!(ibv_cq, mutex), 32);
        assert_eq!(offset_of!(ibv_cq, cond), 72);
        assert_eq!(offset_of!(ibv_cq, comp_events_completed), 120);
        assert_eq!(offset_of!(ibv_cq, async_events_completed), 124);

        assert_eq!(size_of::<ibv_qp>(), 160);
        assert_eq!(offset_of!(ibv_qp, qp_context), 8);
        assert_eq!(offset_of!(ibv_qp, pd), 16);
        assert_eq!(offset_of!(ibv_qp, send_cq), 24);
        assert_eq!(offset_of!(ibv_qp, recv_cq), 32);
        assert_eq!(offset_of!(ibv_qp, srq), 40);
        assert_eq!(offset_of!(ibv_qp, handle), 48);
        assert_eq!(offset_of!(ibv_qp, qp_num), 52);
        assert_eq!(offset_of!(ibv_qp, state), 56);
        assert_eq!(offset_of!(ibv_qp, qp_type), 60);
        assert_eq!(offset_of!(ibv_qp, mutex), 64);
        assert_eq!(offset_of!(ibv_qp, cond), 104);
        assert_eq!(offset_of!(ibv_qp, events_completed), 152);

        assert_eq!(size_of::<ibv_qp_cap>(), 20);
        assert_eq!(offset_of!(ibv_qp_cap, max_inline_data), 16);
        assert_eq!(size_of::<ibv_qp_init_attr>(), 64);
        assert_eq!(offset_of!(ibv_qp_init_attr, send_cq), 8);
        assert_eq!(offset_of!(ibv_qp_init_attr, recv_cq), 16);
        assert_eq!(offset_of!(ibv_qp_init_attr, srq), 24);
        assert_eq!(offset_of!(ibv_qp_init_attr, cap), 32);
        assert_eq!(offset_of!(ibv_qp_init_attr, qp_type), 52);
        assert_eq!(offset_of!(ibv_qp_init_attr, sq_sig_all), 56);

        assert_eq!((size_of::<ibv_global_route>(), align_of::<ibv_global_route>()), (24, 8));
        assert_eq!(offset_of!(ibv_global_route, flow_label), 16);
        assert_eq!(offset_of!(ibv_global_route, sgid_index), 20);
        assert_eq!(offset_of!(ibv_global_route, hop_limit), 21);
        assert_eq!(offset_of!(ibv_global_route, traffic_class), 22);
        assert_eq!(size_of::<ibv_ah_attr>(), 32);
        assert_eq!(offset_of!(ibv_ah_attr, dlid), 24);
        assert_eq!(offset_of!(ibv_ah_attr, sl), 26);
        assert_eq!(offset_of!(ibv_ah_attr, src_path_bits), 27);
        assert_eq!(offset_of!(ibv_ah_attr, static_rate), 28);
        assert_eq!(offset_of!(ibv_ah_attr, is_global), 29);
        assert_eq!(offset_of!(ibv_ah_attr, port_num), 30);

        assert_eq!(size_of::<ibv_qp_attr>(), 144);
        assert_eq!(offset_of!(ibv_qp_attr, cur_qp_state), 4);
        assert_eq!(offset_of!(ibv_qp_attr, path_mtu), 8);
        assert_eq!(offset_of!(ibv_qp_attr, path_mig_state), 12);
        assert_eq!(offset_of!(ibv_qp_attr, qkey), 16);
        assert_eq!(offset_of!(ibv_qp_attr, rq_psn), 20);
        assert_eq!(offset_of!(ibv_qp_attr, sq_psn), 24);
        assert_eq!(offset_of!(ibv_qp_attr, dest_qp_num), 28);
        assert_eq!(offset_of!(ibv_qp_attr, qp_access_flags), 32);
        assert_eq!(offset_of!(ibv_qp_attr, cap), 36);
        assert_eq!(offset_of!(ibv_qp_attr, ah_attr), 56);
        assert_eq!(offset_of!(ibv_qp_attr, alt_ah_attr), 88);
        assert_eq!(offset_of!(ibv_qp_attr, pkey_index), 120);
        assert_eq!(offset_of!(ibv_qp_attr, alt_pkey_index), 122);
        assert_eq!(offset_of!(ibv_qp_attr, en_sqd_async_notify), 124);
        assert_eq!(offset_of!(ibv_qp_attr, sq_draining), 125);
        assert_eq!(offset_of!(ibv_qp_attr, max_rd_atomic), 126);
        assert_eq!(offset_of!(ibv_qp_attr, max_dest_rd_atomic), 127);
        assert_eq!(offset_of!(ibv_qp_attr, min_rnr_timer), 128);
        assert_eq!(offset_of!(ibv_qp_attr, port_num), 129);
        assert_eq!(offset_of!(ibv_qp_attr, timeout), 130);
        assert_eq!(offset_of!(ibv_qp_attr, retry_cnt), 131);
        assert_eq!(offset_of!(ibv_qp_attr, rnr_retry), 132);
        assert_eq!(offset_of!(ibv_qp_attr, alt_port_num), 133);
        assert_eq!(offset_of!(ibv_qp_attr, alt_timeout), 134);
        assert_eq!(offset_of!(ibv_qp_attr, rate_limit), 136);

        assert_eq!(size_of::<ibv_sge>(), 16);
        assert_eq!(offset_of!(ibv_sge, length), 8);
        assert_eq!(offset_of!(ibv_sge, lkey), 12);

        assert_eq!(size_of::<ibv_send_wr>(), 128);
        assert_eq!(offset_of!(ibv_send_wr, next), 8);
        assert_eq!(offset_of!(ibv_send_wr, sg_list), 16);
        assert_eq!(offset_of!(ibv_send_wr, num_sge), 24);
        assert_eq!(offset_of!(ibv_send_wr, opcode), 28);
        assert_eq!(offset_of!(ibv_send_wr, send_flags), 32);
        assert_eq!(offset_of!(ibv_send_wr, imm_data), 36);
        assert_eq!(offset_of!(ibv_send_wr, wr), 40);
        assert_eq!(offset_of!(ibv_send_wr, wr) + offset_of!(ibv_rdma_wr, rkey), 48);
        assert_eq!(offset_of!(ibv_send_wr, qp_type), 72);
        assert_eq!(offset_of!(ibv_send_wr, _bind_mw), 80);

        assert_eq!(size_of::<ibv_recv_wr>(), 32);
        assert_eq!(offset_of!(ibv_recv_wr, next), 8);
        assert_eq!(offset_of!(ibv_recv_wr, sg_list), 16);
        assert_eq!(offset_of!(ibv_recv_wr, num_sge), 24);

        assert_eq!(size_of::<ibv_wc>(), 48);
        assert_eq!(offset_of!(ibv_wc, status), 8);
        assert_eq!(offset_of!(ibv_wc, opcode), 12);
        assert_eq!(offset_of!(ibv_wc, vendor_err), 16);
        assert_eq!(offset_of!(ibv_wc, byte_len), 20);
        assert_eq!(offset_of!(ibv_wc, imm_data), 24);
        assert_eq!(offset_of!(ibv_wc, qp_num), 28);
        assert_eq!(offset_of!(ibv_wc, src_qp), 32);
        assert_eq!(offset_of!(ibv_wc, wc_flags), 36);
        assert_eq!(offset_of!(ibv_wc, pkey_index), 40);
        assert_eq!(offset_of!(ibv_wc, slid), 42);
        assert_eq!(offset_of!(ibv_wc, sl), 44);
        assert_eq!(offset_of!(ibv_wc, dlid_path_bits), 45);
    }

    #[test]
    fn constants_match_rdma_core_44() {
        assert_eq!(
            [QP_STATE, QP_AV, QP_PORT, QP_PKEY_INDEX, QP_ACCESS_FLAGS, QP_PATH_MTU, QP_DEST_QPN],
            [1, 128, 32, 16, 8, 256, 1_048_576]
        );
        assert_eq!(
            [QP_RQ_PSN, QP_MAX_DEST_RD_ATOMIC, QP_MIN_RNR_TIMER, QP_SQ_PSN, QP_TIMEOUT, QP_RETRY_CNT],
            [4096, 131_072, 32_768, 65_536, 512, 1024]
        );
        assert_eq!([QP_RNR_RETRY, QP_MAX_QP_RD_ATOMIC], [2048, 8192]);
        assert_eq!([WC_RECV, WC_RECV_RDMA_WITH_IMM, WC_RETRY_EXC_ERR, WC_REM_ACCESS_ERR], [128, 129, 12, 10]);
        assert_eq!([ACCESS_ON_DEMAND, ACCESS_RELAXED_ORDERING], [64, 1_048_576]);
    }
}

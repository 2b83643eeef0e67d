//! Devices (`mlx5_0`, `mlx5_1`, … one port each), their attributes, the addressing that makes
//! every process one node of a single emulated fabric, and device contexts.
//!
//! A node is a process: every GID and LID of its ports carries its identity.
//! - GID 0, link-local: `fe80::` then the port GUID `02:54:00:<dev>:<pid, 4 bytes>`.
//! - GID 1, IPv4-mapped (RoCE v2): `::ffff:10.a.b.c` with `a.b.c` = `dev << 22 | pid` (a Linux
//!   pid is below 2^22).
//! - LID (InfiniBand link only): `1 + (pid % 0x2ffe) * 4 + dev`, below 0xc000.
//!
//! The NIC of a node listens on an abstract Unix socket named by its routing key: the pid on
//! Ethernet, `pid % 0x2ffe` on InfiniBand (see `nic`).

use std::ffi::{c_int, CString};
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, OnceLock};

use crate::config::{config, Devices, MAX_DEVICES};
use crate::registry::{self, reg_mut};
use crate::sys::*;
use crate::util::Public;
use crate::{nic, ops};

/// Limits the emulated device grants (and enforces).
pub const MAX_QP_WR: u32 = 16384;
pub const MAX_SGE: u32 = 16;
pub const MAX_INLINE: u32 = 256;
pub const MAX_CQE: c_int = 1 << 22;
pub const MAX_MSG: u32 = 1 << 30;
pub const MAX_RD_ATOMIC: u8 = 16;
pub const GID_TBL_LEN: c_int = 2;
pub const PKEY_TBL_LEN: u16 = 1;
pub const ACTIVE_MTU: u32 = MTU_4096;
/// Routing keys of InfiniBand nodes: `pid % LID_KEYS`.
pub const LID_KEYS: u32 = 0x2ffe;

/// What an `ibv_device *` points at (opaque to callers).
pub struct Device {
    pub name: CString,
    pub index: u8,
}

fn all() -> &'static [Device] {
    static DEVICES: OnceLock<Box<[Device]>> = OnceLock::new();
    DEVICES.get_or_init(|| {
        let n = match config().devices {
            Devices::Enosys => 0,
            Devices::Count(n) => n.min(MAX_DEVICES),
        };
        (0..n).map(|i| Device { name: CString::new(format!("mlx5_{i}")).unwrap_or_default(), index: i }).collect()
    })
}

/// The device list, or the errno `ibv_get_device_list` fails with.
pub fn list() -> Result<&'static [Device], c_int> {
    match config().devices {
        Devices::Enosys => Err(libc::ENOSYS),
        Devices::Count(_) => Ok(all()),
    }
}

pub fn device_ptr(d: &'static Device) -> *mut ibv_device {
    d as *const Device as *mut ibv_device
}

/// The device an `ibv_device *` of ours points at.
pub fn device(p: *const ibv_device) -> Option<&'static Device> {
    all().iter().find(|d| std::ptr::eq(device_ptr(d), p))
}

/// Where a packet goes: a node (its socket) and a device of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct NodeAddr {
    pub key: u32,
    pub dev: u8,
}

fn pid() -> u32 {
    std::process::id()
}

/// This node's routing key.
pub fn local_key() -> u32 {
    if config().ib {
        pid() % LID_KEYS
    } else {
        pid()
    }
}

pub fn local_addr(dev: u8) -> NodeAddr {
    NodeAddr { key: local_key(), dev }
}

/// The port GUID (also the node GUID), in wire (big-endian) order.
pub fn guid_bytes(dev: u8) -> [u8; 8] {
    let p = pid().to_be_bytes();
    [0x02, 0x54, 0x00, dev, p[0], p[1], p[2], p[3]]
}

/// GID `index` of device `dev`'s port.
pub fn gid(dev: u8, index: c_int) -> Option<ibv_gid> {
    let mut raw = [0u8; 16];
    match index {
        0 => {
            raw[0] = 0xfe;
            raw[1] = 0x80;
            raw[8..].copy_from_slice(&guid_bytes(dev));
        }
        1 => {
            raw[10] = 0xff;
            raw[11] = 0xff;
            raw[12] = 10;
            let v = (u32::from(dev) << 22 | (pid() & 0x3f_ffff)).to_be_bytes();
            raw[13..].copy_from_slice(&v[1..]);
        }
        _ => return None,
    }
    Some(ibv_gid { raw })
}

/// The LID of device `dev`'s port on an InfiniBand link.
pub fn lid(dev: u8) -> u16 {
    (1 + (pid() % LID_KEYS) * 4 + u32::from(dev)) as u16
}

/// The node a GID of ours names (Ethernet routing), if it is one.
pub fn addr_of_gid(g: &ibv_gid) -> Option<NodeAddr> {
    let r = &g.raw;
    let (pid, dev) = if r[..8] == [0xfe, 0x80, 0, 0, 0, 0, 0, 0] && r[8..11] == [0x02, 0x54, 0x00] {
        (u32::from_be_bytes([r[12], r[13], r[14], r[15]]), r[11])
    } else if r[..10] == [0; 10] && r[10..13] == [0xff, 0xff, 10] {
        let v = u32::from_be_bytes([0, r[13], r[14], r[15]]);
        (v & 0x3f_ffff, (v >> 22) as u8)
    } else {
        return None;
    };
    (pid != 0 && dev < MAX_DEVICES).then_some(NodeAddr { key: pid, dev })
}

/// The node a LID names (InfiniBand routing), if it is a unicast LID of the scheme.
pub fn addr_of_lid(lid: u16) -> Option<NodeAddr> {
    let l = u32::from(lid);
    (1..0xc000).contains(&l).then(|| NodeAddr { key: (l - 1) / 4, dev: ((l - 1) % 4) as u8 })
}

pub fn mtu_bytes(mtu: u32) -> u32 {
    128 << mtu.clamp(1, 5)
}

pub fn port_attr(dev: u8) -> ibv_port_attr {
    let ib = config().ib;
    ibv_port_attr {
        state: PORT_ACTIVE,
        max_mtu: MTU_4096,
        active_mtu: ACTIVE_MTU,
        gid_tbl_len: GID_TBL_LEN,
        max_msg_sz: MAX_MSG,
        pkey_tbl_len: PKEY_TBL_LEN,
        lid: if ib { lid(dev) } else { 0 },
        sm_lid: u16::from(ib),
        max_vl_num: 4,
        subnet_timeout: 18,
        active_width: 2,  // 4X
        active_speed: 64, // HDR
        phys_state: 5,    // LinkUp
        link_layer: if ib { LINK_LAYER_INFINIBAND } else { LINK_LAYER_ETHERNET },
        ..Default::default()
    }
}

pub fn device_attr(dev: u8) -> ibv_device_attr {
    let mut fw_ver = [0; 64];
    for (d, s) in fw_ver.iter_mut().zip(b"20.99.0000 (topoccl stand-in)") {
        *d = *s as std::ffi::c_char;
    }
    let mut ints = [0; 19];
    ints[1] = c_int::from(MAX_RD_ATOMIC) * 1024; // max_res_rd_atom
    ints[2] = c_int::from(MAX_RD_ATOMIC); // max_qp_init_rd_atom
    let guid = u64::from_ne_bytes(guid_bytes(dev));
    ibv_device_attr {
        fw_ver,
        node_guid: guid,
        sys_image_guid: guid,
        max_mr_size: u64::MAX,
        page_size_cap: 0xffff_f000,
        vendor_id: 0x02c9,
        vendor_part_id: 4123,
        hw_ver: 0,
        max_qp: 1 << 17,
        max_qp_wr: MAX_QP_WR as c_int,
        device_cap_flags: 0,
        max_sge: MAX_SGE as c_int,
        max_sge_rd: MAX_SGE as c_int,
        max_cq: 1 << 16,
        max_cqe: MAX_CQE,
        max_mr: 1 << 20,
        max_pd: 1 << 16,
        max_qp_rd_atom: c_int::from(MAX_RD_ATOMIC),
        _ints: ints,
        max_pkeys: PKEY_TBL_LEN,
        local_ca_ack_delay: 16,
        phys_port_cnt: 1,
    }
}

/// A device context: `ibv_context` with `ops` pointing at `ops.rs`.
pub struct Ctx {
    public: Public<ibv_context>,
    pub dev: u8,
    /// PDs and CQs created on it and not yet destroyed.
    pub children: AtomicUsize,
}

impl Ctx {
    pub fn ptr(&self) -> *mut ibv_context {
        self.public.ptr()
    }
}

pub fn open_device(dev: *const ibv_device) -> Result<*mut ibv_context, c_int> {
    let d = device(dev).ok_or(libc::EINVAL)?;
    nic::start()?;
    let ops = ibv_context_ops {
        _compat_before: [std::ptr::null_mut(); 11],
        poll_cq: Some(ops::poll_cq),
        req_notify_cq: Some(ops::req_notify_cq),
        _compat_middle: [std::ptr::null_mut(); 12],
        post_send: Some(ops::post_send),
        post_recv: Some(ops::post_recv),
        _compat_after: [std::ptr::null_mut(); 5],
    };
    let public = ibv_context {
        device: device_ptr(d),
        ops,
        cmd_fd: -1,
        async_fd: -1,
        num_comp_vectors: 1,
        mutex: [0; 5],
        abi_compat: std::ptr::null_mut(),
    };
    let ctx = Arc::new(Ctx { public: Public::new(public), dev: d.index, children: AtomicUsize::new(0) });
    let p = ctx.ptr();
    reg_mut().ctxs.insert(registry::key(p), ctx);
    Ok(p)
}

pub fn close_device(p: *const ibv_context) -> c_int {
    let Some(ctx) = reg_mut().ctxs.remove(&registry::key(p)) else { return libc::EINVAL };
    let live = ctx.children.load(std::sync::atomic::Ordering::Relaxed);
    if live > 0 {
        // The kernel would tear them down; here they stay usable until destroyed.
        eprintln!("topoccl ibverbs stand-in: ibv_close_device with {live} PDs/CQs still allocated on it");
    }
    0
}

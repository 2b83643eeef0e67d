//! Safe owners of verbs objects, over the loaded [`Verbs`] table (cudarc's layering: `sys`,
//! then checked calls, then types that free what they hold). Each owner keeps what it was made
//! from alive (a queue pair its protection domain and completion queue, a region its domain,
//! a domain its device context), so objects are destroyed in the order verbs requires.
//!
//! libibverbs' objects may be used from any thread; the owners are `Send` and `Sync` on that
//! ground. What the library hands back (pointers, counts, completions) is checked before use.

use std::ffi::{c_int, c_void, CStr};
use std::io;
use std::ptr::NonNull;
use std::sync::Arc;

use super::library::Verbs;
use super::sys::*;
use crate::error::{Error, Result};

/// The error of a verbs call that returned an errno value (`rc > 0`) or -1 with `errno` set.
fn failed(call: &str, rc: c_int) -> Error {
    let e = if rc > 0 { io::Error::from_raw_os_error(rc) } else { io::Error::last_os_error() };
    Error::io(call, e)
}

/// The names of the devices the library reports; why none where it reports none (ENOSYS on a
/// kernel without RDMA, an empty list on a host without a NIC).
pub fn device_names(verbs: &Verbs) -> std::result::Result<Vec<String>, String> {
    let mut n: c_int = 0;
    // SAFETY: `n` is a valid out-pointer; the list is freed below.
    let list = unsafe { (verbs.get_device_list)(&mut n) };
    if list.is_null() {
        return Err(format!("ibv_get_device_list failed: {}", io::Error::last_os_error()));
    }
    let mut names = Vec::new();
    for i in 0..n.clamp(0, 1024) as usize {
        // SAFETY: the list holds `n` device pointers (bounded above).
        let dev = unsafe { *list.add(i) };
        if dev.is_null() {
            break;
        }
        // SAFETY: a device of the list, which is still alive.
        let name = unsafe { (verbs.get_device_name)(dev) };
        if !name.is_null() {
            // SAFETY: a NUL-terminated name the library owns, copied at once.
            names.push(unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned());
        }
    }
    // SAFETY: the list `get_device_list` returned, freed once.
    unsafe { (verbs.free_device_list)(list) };
    if names.is_empty() {
        return Err("no RDMA device".to_string());
    }
    Ok(names)
}

/// An open device.
pub struct Context {
    pub verbs: Arc<Verbs>,
    ptr: NonNull<ibv_context>,
    pub name: String,
}

// SAFETY: verbs contexts may be used from any thread (rdma-core serialises internally).
unsafe impl Send for Context {}
// SAFETY: as above.
unsafe impl Sync for Context {}

impl Context {
    /// Opens the device called `name`.
    pub fn open(verbs: Arc<Verbs>, name: &str) -> Result<Arc<Context>> {
        let mut n: c_int = 0;
        // SAFETY: as in `device_names`.
        let list = unsafe { (verbs.get_device_list)(&mut n) };
        if list.is_null() {
            return Err(failed("ibv_get_device_list", -1));
        }
        let mut ctx = std::ptr::null_mut();
        for i in 0..n.clamp(0, 1024) as usize {
            // SAFETY: the list holds `n` device pointers.
            let dev = unsafe { *list.add(i) };
            if dev.is_null() {
                break;
            }
            // SAFETY: a live device of the list; its name is NUL-terminated and copied at once.
            let this = unsafe {
                let p = (verbs.get_device_name)(dev);
                !p.is_null() && CStr::from_ptr(p).to_bytes() == name.as_bytes()
            };
            if this {
                // SAFETY: a live device of the list (opening it keeps it alive past the free).
                ctx = unsafe { (verbs.open_device)(dev) };
                if ctx.is_null() {
                    let e = failed(&format!("ibv_open_device({name})"), -1);
                    // SAFETY: freed once.
                    unsafe { (verbs.free_device_list)(list) };
                    return Err(e);
                }
                break;
            }
        }
        // SAFETY: freed once.
        unsafe { (verbs.free_device_list)(list) };
        let ptr = NonNull::new(ctx).ok_or_else(|| Error::Unsupported(format!("no RDMA device `{name}`")))?;
        // SAFETY: a context just opened: its ops table is filled.
        let ops = unsafe { &(*ptr.as_ptr()).ops };
        if ops.poll_cq.is_none() || ops.post_send.is_none() || ops.post_recv.is_none() {
            // SAFETY: closed once.
            unsafe { (verbs.close_device)(ptr.as_ptr()) };
            return Err(Error::Unsupported(format!("{name}: the device's operations table is incomplete")));
        }
        Ok(Arc::new(Context { verbs, ptr, name: name.to_string() }))
    }

    pub fn query_device(&self) -> Result<ibv_device_attr> {
        // SAFETY: all-zero is a valid value of this plain C struct.
        let mut attr: ibv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: a live context and a valid out-pointer.
        let rc = unsafe { (self.verbs.query_device)(self.ptr.as_ptr(), &mut attr) };
        if rc != 0 {
            return Err(failed("ibv_query_device", rc));
        }
        Ok(attr)
    }

    pub fn query_port(&self, port: u8) -> Result<ibv_port_attr> {
        let mut attr = ibv_port_attr::default();
        // SAFETY: a live context and a valid out-pointer.
        let rc = unsafe { (self.verbs.query_port)(self.ptr.as_ptr(), port, &mut attr) };
        if rc != 0 {
            return Err(failed(&format!("ibv_query_port({}, {port})", self.name), rc));
        }
        Ok(attr)
    }

    pub fn query_gid(&self, port: u8, index: i32) -> Result<ibv_gid> {
        let mut gid = ibv_gid::default();
        // SAFETY: a live context and a valid out-pointer.
        let rc = unsafe { (self.verbs.query_gid)(self.ptr.as_ptr(), port, index, &mut gid) };
        if rc != 0 {
            return Err(failed(&format!("ibv_query_gid({}, {port}, {index})", self.name), rc));
        }
        Ok(gid)
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: opened by `open`, closed once, after every object made from it (they hold it).
        unsafe { (self.verbs.close_device)(self.ptr.as_ptr()) };
    }
}

/// A protection domain.
pub struct ProtectionDomain {
    pub ctx: Arc<Context>,
    ptr: NonNull<ibv_pd>,
}

// SAFETY: see `Context`.
unsafe impl Send for ProtectionDomain {}
// SAFETY: see `Context`.
unsafe impl Sync for ProtectionDomain {}

impl ProtectionDomain {
    pub fn new(ctx: Arc<Context>) -> Result<Arc<ProtectionDomain>> {
        // SAFETY: a live context.
        let pd = unsafe { (ctx.verbs.alloc_pd)(ctx.ptr.as_ptr()) };
        let ptr = NonNull::new(pd).ok_or_else(|| failed("ibv_alloc_pd", -1))?;
        Ok(Arc::new(ProtectionDomain { ctx, ptr }))
    }
}

impl ProtectionDomain {
    /// Whether device memory can be registered through dma-buf here, asked as NCCL asks: a
    /// registration of an invalid descriptor fails with `EOPNOTSUPP` or `EPROTONOSUPPORT`
    /// where the kernel or the driver lacks dma-buf, with another error (`EBADF`) where not.
    pub fn dmabuf(&self) -> std::result::Result<(), String> {
        let Some(reg) = self.ctx.verbs.reg_dmabuf_mr else {
            return Err(format!("{} has no ibv_reg_dmabuf_mr", self.ctx.verbs.path));
        };
        // SAFETY: a live domain; descriptor -1 is refused before any memory is touched.
        let mr = unsafe { reg(self.ptr.as_ptr(), 0, 0, 0, -1, 0) };
        let e = io::Error::last_os_error();
        if !mr.is_null() {
            // SAFETY: a region the call just made, deregistered once.
            unsafe { (self.ctx.verbs.dereg_mr)(mr) };
            return Ok(());
        }
        match e.raw_os_error() {
            Some(EOPNOTSUPP | EPROTONOSUPPORT) => Err(format!("ibv_reg_dmabuf_mr: {e}")),
            _ => Ok(()),
        }
    }
}

/// `EOPNOTSUPP` and `EPROTONOSUPPORT` on Linux.
const EOPNOTSUPP: i32 = 95;
const EPROTONOSUPPORT: i32 = 93;

impl Drop for ProtectionDomain {
    fn drop(&mut self) {
        // SAFETY: allocated by `new`, freed once, after its regions and queue pairs.
        unsafe { (self.ctx.verbs.dealloc_pd)(self.ptr.as_ptr()) };
    }
}

/// A registered memory region.
pub struct MemoryRegion {
    pd: Arc<ProtectionDomain>,
    ptr: NonNull<ibv_mr>,
    pub addr: usize,
    pub len: usize,
    pub lkey: u32,
    pub rkey: u32,
}

// SAFETY: see `Context`.
unsafe impl Send for MemoryRegion {}
// SAFETY: see `Context`.
unsafe impl Sync for MemoryRegion {}

impl MemoryRegion {
    /// Registers `len` bytes at `addr` with `access` (`ACCESS_*`).
    ///
    /// # Safety
    /// The memory must stay mapped until the region is dropped, and nothing may expect it
    /// unchanged while a peer holding the rkey may write it.
    pub unsafe fn register(pd: Arc<ProtectionDomain>, addr: usize, len: usize, access: c_int) -> Result<MemoryRegion> {
        // SAFETY: a live domain; the memory is the caller's promise.
        let mr = unsafe { (pd.ctx.verbs.reg_mr)(pd.ptr.as_ptr(), addr as *mut c_void, len, access) };
        let ptr = NonNull::new(mr).ok_or_else(|| failed(&format!("ibv_reg_mr of {len} bytes"), -1))?;
        // SAFETY: a region just registered; its keys are filled.
        let (lkey, rkey, got_addr, got_len) = unsafe {
            let m = &*ptr.as_ptr();
            (m.lkey, m.rkey, m.addr as usize, m.length)
        };
        let region = MemoryRegion { pd, ptr, addr, len, lkey, rkey };
        if got_addr != addr || got_len != len {
            return Err(Error::Protocol(format!(
                "ibv_reg_mr registered {got_len} bytes at {got_addr:#x} for {len} at {addr:#x}"
            )));
        }
        Ok(region)
    }

    /// Registers `len` bytes of the dma-buf `fd` (device memory the GPU driver exported) from
    /// its start, known to the NIC and the peer as `iova` (the device address), with `access`.
    /// The descriptor may be closed once this returns (the registration holds the buffer).
    pub fn register_dmabuf(
        pd: Arc<ProtectionDomain>,
        fd: std::os::fd::BorrowedFd<'_>,
        iova: u64,
        len: usize,
        access: c_int,
    ) -> Result<MemoryRegion> {
        use std::os::fd::AsRawFd;
        let reg = pd.ctx.verbs.reg_dmabuf_mr.ok_or_else(|| Error::Unsupported("no ibv_reg_dmabuf_mr".into()))?;
        // SAFETY: a live domain and an open descriptor; the kernel checks the range against the
        // buffer, and the NIC writes only through this registration, which holds the buffer.
        let mr = unsafe { reg(pd.ptr.as_ptr(), 0, len, iova, fd.as_raw_fd(), access) };
        let ptr = NonNull::new(mr).ok_or_else(|| failed(&format!("ibv_reg_dmabuf_mr of {len} bytes"), -1))?;
        // SAFETY: a region just registered; its keys are filled.
        let (lkey, rkey, got_addr, got_len) = unsafe {
            let m = &*ptr.as_ptr();
            (m.lkey, m.rkey, m.addr as u64, m.length)
        };
        let addr = usize::try_from(iova).map_err(|_| Error::Protocol(format!("an iova of {iova:#x}")))?;
        let region = MemoryRegion { pd, ptr, addr, len, lkey, rkey };
        if got_addr != iova || got_len != len {
            return Err(Error::Protocol(format!(
                "ibv_reg_dmabuf_mr registered {got_len} bytes at {got_addr:#x} for {len} at {iova:#x}"
            )));
        }
        Ok(region)
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        // SAFETY: registered by `register`, deregistered once.
        unsafe { (self.pd.ctx.verbs.dereg_mr)(self.ptr.as_ptr()) };
    }
}

/// A completion queue, polled (no completion channel).
pub struct CompletionQueue {
    ctx: Arc<Context>,
    ptr: NonNull<ibv_cq>,
    poll: PollCq,
    pub depth: usize,
}

// SAFETY: see `Context`.
unsafe impl Send for CompletionQueue {}
// SAFETY: see `Context`.
unsafe impl Sync for CompletionQueue {}

impl CompletionQueue {
    pub fn new(ctx: Arc<Context>, depth: usize) -> Result<CompletionQueue> {
        let depth_c = c_int::try_from(depth).map_err(|_| Error::Unsupported(format!("a CQ of {depth} entries")))?;
        // SAFETY: a live context; no channel, no user context.
        let cq =
            unsafe { (ctx.verbs.create_cq)(ctx.ptr.as_ptr(), depth_c, std::ptr::null_mut(), std::ptr::null_mut(), 0) };
        let ptr = NonNull::new(cq).ok_or_else(|| failed(&format!("ibv_create_cq({depth})"), -1))?;
        // SAFETY: `Context::open` checked the table has `poll_cq`.
        let poll = unsafe { (*ctx.ptr.as_ptr()).ops.poll_cq };
        let poll = poll.ok_or_else(|| Error::Unsupported("no poll_cq".into()))?;
        Ok(CompletionQueue { ctx, ptr, poll, depth })
    }

    /// Takes up to `out.len()` completions; how many.
    pub fn poll(&self, out: &mut [ibv_wc]) -> Result<usize> {
        let n = c_int::try_from(out.len()).unwrap_or(c_int::MAX);
        // SAFETY: a live CQ and room for `n` completions.
        let got = unsafe { (self.poll)(self.ptr.as_ptr(), n, out.as_mut_ptr()) };
        if got < 0 {
            return Err(Error::io(
                format!("ibv_poll_cq on {}", self.ctx.name),
                io::Error::other(format!("returned {got} (CQ overrun or device error)")),
            ));
        }
        Ok((got as usize).min(out.len()))
    }
}

impl Drop for CompletionQueue {
    fn drop(&mut self) {
        // SAFETY: created by `new`, destroyed once, after the queue pairs that use it.
        unsafe { (self.ctx.verbs.destroy_cq)(self.ptr.as_ptr()) };
    }
}

/// Where one end of a reliable connection is: what the peer needs to connect its queue pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Endpoint {
    pub qpn: u32,
    pub lid: u16,
    pub gid: ibv_gid,
    pub link_layer: u8,
    pub mtu: u32,
}

/// How a queue pair is connected (NCCL's `NCCL_IB_*` settings, and the local port).
#[derive(Debug, Clone, Copy)]
pub struct PathSettings {
    pub port: u8,
    pub gid_index: u8,
    pub traffic_class: u8,
    pub service_level: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
}

/// A reliable-connected queue pair.
pub struct QueuePair {
    pub cq: Arc<CompletionQueue>,
    pd: Arc<ProtectionDomain>,
    ptr: NonNull<ibv_qp>,
    post_send: PostSend,
    post_recv: PostRecv,
    pub qpn: u32,
    pub cap: ibv_qp_cap,
}

// SAFETY: see `Context`.
unsafe impl Send for QueuePair {}
// SAFETY: see `Context`.
unsafe impl Sync for QueuePair {}

impl QueuePair {
    /// A queue pair of `pd` completing into `cq` both ways, with room for `send` and `recv`
    /// outstanding work requests of one gather element each.
    pub fn new(pd: Arc<ProtectionDomain>, cq: Arc<CompletionQueue>, send: u32, recv: u32) -> Result<QueuePair> {
        let mut init = ibv_qp_init_attr {
            qp_context: std::ptr::null_mut(),
            send_cq: cq.ptr.as_ptr(),
            recv_cq: cq.ptr.as_ptr(),
            srq: std::ptr::null_mut(),
            cap: ibv_qp_cap {
                max_send_wr: send,
                max_recv_wr: recv,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: QPT_RC,
            sq_sig_all: 0,
        };
        // SAFETY: a live domain and CQ; `init` is valid for the call.
        let qp = unsafe { (pd.ctx.verbs.create_qp)(pd.ptr.as_ptr(), &mut init) };
        let ptr = NonNull::new(qp).ok_or_else(|| failed("ibv_create_qp", -1))?;
        // SAFETY: `Context::open` checked the table; the QP is live.
        let (post_send, post_recv, qpn) = unsafe {
            let ops = &(*pd.ctx.ptr.as_ptr()).ops;
            (ops.post_send, ops.post_recv, (*ptr.as_ptr()).qp_num)
        };
        let qp = QueuePair {
            cq,
            pd,
            ptr,
            post_send: post_send.ok_or_else(|| Error::Unsupported("no post_send".into()))?,
            post_recv: post_recv.ok_or_else(|| Error::Unsupported("no post_recv".into()))?,
            qpn,
            cap: init.cap,
        };
        if qp.cap.max_send_wr < send || qp.cap.max_recv_wr < recv {
            return Err(Error::Unsupported(format!(
                "the device grants {}/{} work requests for {send}/{recv}",
                qp.cap.max_send_wr, qp.cap.max_recv_wr
            )));
        }
        Ok(qp)
    }

    fn modify(&self, attr: &mut ibv_qp_attr, mask: c_int, what: &str) -> Result<()> {
        // SAFETY: a live QP; `attr` is valid for the call.
        let rc = unsafe { (self.pd.ctx.verbs.modify_qp)(self.ptr.as_ptr(), attr, mask) };
        if rc != 0 {
            return Err(failed(&format!("ibv_modify_qp to {what}"), rc));
        }
        Ok(())
    }

    /// RESET → INIT: the port, and remote writes allowed.
    pub fn init(&self, path: &PathSettings) -> Result<()> {
        let mut a = ibv_qp_attr {
            qp_state: QPS_INIT,
            pkey_index: 0,
            port_num: path.port,
            qp_access_flags: (ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE) as u32,
            ..Default::default()
        };
        self.modify(&mut a, QP_STATE | QP_PKEY_INDEX | QP_PORT | QP_ACCESS_FLAGS, "INIT")
    }

    /// INIT → RTR → RTS, connected to `remote` (addressed by GID where either side needs it:
    /// RoCE always, InfiniBand across subnets; by LID otherwise).
    pub fn connect(&self, path: &PathSettings, local: &Endpoint, remote: &Endpoint) -> Result<()> {
        let global = local.link_layer != LINK_LAYER_INFINIBAND || remote.lid == 0;
        let mut a = ibv_qp_attr {
            qp_state: QPS_RTR,
            path_mtu: local.mtu.min(remote.mtu),
            dest_qp_num: remote.qpn,
            rq_psn: 0,
            max_dest_rd_atomic: 1,
            min_rnr_timer: 12,
            ah_attr: ibv_ah_attr {
                grh: ibv_global_route {
                    dgid: remote.gid,
                    flow_label: 0,
                    sgid_index: path.gid_index,
                    hop_limit: 255,
                    traffic_class: path.traffic_class,
                },
                dlid: remote.lid,
                sl: path.service_level,
                src_path_bits: 0,
                static_rate: 0,
                is_global: u8::from(global),
                port_num: path.port,
            },
            ..Default::default()
        };
        let rtr = QP_STATE | QP_AV | QP_PATH_MTU | QP_DEST_QPN | QP_RQ_PSN | QP_MAX_DEST_RD_ATOMIC | QP_MIN_RNR_TIMER;
        self.modify(&mut a, rtr, "RTR")?;
        let mut a = ibv_qp_attr {
            qp_state: QPS_RTS,
            timeout: path.timeout,
            retry_cnt: path.retry_cnt,
            rnr_retry: 7,
            sq_psn: 0,
            max_rd_atomic: 1,
            ..Default::default()
        };
        let rts = QP_STATE | QP_TIMEOUT | QP_RETRY_CNT | QP_RNR_RETRY | QP_SQ_PSN | QP_MAX_QP_RD_ATOMIC;
        self.modify(&mut a, rts, "RTS")
    }

    /// Any state → ERR: the queue pair stops (a peer's writes to it fail, its own work
    /// requests are flushed).
    pub fn to_error(&self) -> Result<()> {
        let mut a = ibv_qp_attr { qp_state: QPS_ERR, ..Default::default() };
        self.modify(&mut a, QP_STATE, "ERR")
    }

    /// Posts a chain of send work requests.
    ///
    /// # Safety
    /// Every gather element must name memory of a live region of this domain that stays
    /// unchanged until the request's completion is polled; `wr` must be a valid chain.
    pub unsafe fn post_send(&self, wr: &mut ibv_send_wr) -> Result<()> {
        let mut bad = std::ptr::null_mut();
        // SAFETY: a live QP; the chain is the caller's promise.
        let rc = unsafe { (self.post_send)(self.ptr.as_ptr(), wr, &mut bad) };
        if rc != 0 {
            return Err(failed("ibv_post_send", rc));
        }
        Ok(())
    }

    /// Posts a chain of receive work requests.
    ///
    /// # Safety
    /// As [`QueuePair::post_send`], for memory the receive may write.
    pub unsafe fn post_recv(&self, wr: &mut ibv_recv_wr) -> Result<()> {
        let mut bad = std::ptr::null_mut();
        // SAFETY: a live QP; the chain is the caller's promise.
        let rc = unsafe { (self.post_recv)(self.ptr.as_ptr(), wr, &mut bad) };
        if rc != 0 {
            return Err(failed("ibv_post_recv", rc));
        }
        Ok(())
    }
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        // SAFETY: created by `new`, destroyed once; after this no write lands through it.
        unsafe { (self.pd.ctx.verbs.destroy_qp)(self.ptr.as_ptr()) };
    }
}

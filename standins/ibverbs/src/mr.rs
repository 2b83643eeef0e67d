//! Protection domains and memory regions: keys, access flags, and the range checks the NIC
//! makes with them.
//!
//! lkey and rkey of an MR differ (a transport that sends its lkey as the rkey fails here as it
//! would on a NIC whose keys differ), and no key is handed out twice in a process run: keys are
//! a bijective scramble of a counter.

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use crate::device::Ctx;
use crate::registry::{self, reg_mut};
use crate::sys::*;
use crate::util::{self, Public};

/// `IBV_ACCESS_MW_BIND`.
const ACCESS_MW_BIND: c_int = 1 << 4;
/// `IBV_ACCESS_OPTIONAL_RANGE`: flags a provider may ignore.
const ACCESS_OPTIONAL_RANGE: c_int = 0x3ff0_0000;

pub struct Pd {
    public: Public<ibv_pd>,
    pub ctx: Arc<Ctx>,
    /// MRs and QPs using it.
    pub users: AtomicUsize,
}

impl Pd {
    pub fn ptr(&self) -> *mut ibv_pd {
        self.public.ptr()
    }
}

pub struct Mr {
    public: Public<ibv_mr>,
    pub pd: Arc<Pd>,
    pub addr: u64,
    pub len: u64,
    pub access: c_int,
    pub lkey: u32,
    pub rkey: u32,
    /// True until deregistered. The NIC holds the read lock while it touches the memory, so
    /// `ibv_dereg_mr` returns only once no access is under way (as on hardware).
    pub live: RwLock<bool>,
    /// A dma-buf region's mapping: the NIC reaches `[addr, addr + len)` (the iova) through it.
    window: Option<Window>,
}

/// A dma-buf mapped into this process, unmapped when its region goes.
struct Window {
    /// The mapping's first byte, its length, and where the region's first byte lies in it.
    map: usize,
    map_len: usize,
    at: usize,
}

impl Drop for Window {
    fn drop(&mut self) {
        // SAFETY: a mapping made in `reg_dmabuf_mr`, unmapped once, after the region is gone
        // (the last reference) and no access holds its `live` lock.
        unsafe { libc::munmap(self.map as *mut c_void, self.map_len) };
    }
}

impl Mr {
    pub fn ptr(&self) -> *mut ibv_mr {
        self.public.ptr()
    }

    /// Where the NIC touches byte `addr` of the region (checked by [`Mr::covers`] first): the
    /// address itself, or its place in a dma-buf's mapping.
    pub fn host(&self, addr: u64) -> u64 {
        match &self.window {
            Some(w) => (w.map + w.at) as u64 + (addr - self.addr),
            None => addr,
        }
    }

    /// Whether `[addr, addr + len)` lies inside the region.
    pub fn covers(&self, addr: u64, len: u64) -> bool {
        addr >= self.addr && addr.checked_add(len).is_some_and(|end| end <= self.addr + self.len)
    }
}

static NEXT_HANDLE: AtomicU32 = AtomicU32::new(1);

fn handle() -> u32 {
    NEXT_HANDLE.fetch_add(1, Ordering::Relaxed)
}

/// A key never handed out before in this process: an odd multiplier and a xor are bijections
/// of u32, so distinct counters give distinct keys.
fn new_key() -> u32 {
    static COUNTER: AtomicU32 = AtomicU32::new(1);
    static SALT: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    let salt = *SALT.get_or_init(|| util::with_rng(|r| r.next_u64() as u32));
    loop {
        let k = COUNTER.fetch_add(1, Ordering::Relaxed).wrapping_mul(0x9E37_79B1) ^ salt;
        if k != 0 {
            return k;
        }
    }
}

pub fn alloc_pd(ctx_ptr: *const ibv_context) -> Result<*mut ibv_pd, c_int> {
    let ctx = registry::ctx(ctx_ptr).ok_or(libc::EINVAL)?;
    let public = ibv_pd { context: ctx.ptr(), handle: handle() };
    ctx.children.fetch_add(1, Ordering::Relaxed);
    let pd = Arc::new(Pd { public: Public::new(public), ctx, users: AtomicUsize::new(0) });
    let p = pd.ptr();
    reg_mut().pds.insert(registry::key(p), pd);
    Ok(p)
}

pub fn dealloc_pd(p: *const ibv_pd) -> c_int {
    let mut reg = reg_mut();
    let Some(pd) = reg.pds.get(&registry::key(p)) else { return libc::EINVAL };
    if pd.users.load(Ordering::Relaxed) > 0 {
        return libc::EBUSY;
    }
    if let Some(pd) = reg.pds.remove(&registry::key(p)) {
        pd.ctx.children.fetch_sub(1, Ordering::Relaxed);
    }
    0
}

pub fn reg_mr(pd_ptr: *const ibv_pd, addr: *mut c_void, len: usize, access: c_int) -> Result<*mut ibv_mr, c_int> {
    let pd = registry::pd(pd_ptr).ok_or(libc::EINVAL)?;
    let mut known =
        ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE | ACCESS_REMOTE_READ | ACCESS_REMOTE_ATOMIC | ACCESS_MW_BIND;
    // On-demand paging where the knob allows it (a device without it answers EINVAL).
    if crate::config::config().odp {
        known |= ACCESS_ON_DEMAND;
    }
    if access & !(known | ACCESS_OPTIONAL_RANGE) != 0 {
        return Err(libc::EINVAL);
    }
    // Remote write and atomic need local write (IB spec 10.6.3.1; rdma-core answers EINVAL).
    if access & (ACCESS_REMOTE_WRITE | ACCESS_REMOTE_ATOMIC) != 0 && access & ACCESS_LOCAL_WRITE == 0 {
        return Err(libc::EINVAL);
    }
    if len == 0 {
        return Err(libc::EINVAL);
    }
    // Pinning fails on memory that is not mapped, or not writable when the MR allows writes;
    // an on-demand region pins nothing (its pages are looked up at each access, which the NIC
    // here does anyway).
    let writable = access & (ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE | ACCESS_REMOTE_ATOMIC | ACCESS_MW_BIND) != 0;
    if access & ACCESS_ON_DEMAND == 0 && !crate::memio::mapped_with(addr as u64, len as u64, writable) {
        return Err(libc::EFAULT);
    }
    Ok(insert(pd, addr as u64, len, access, None))
}

/// A new region of `pd` at `addr` (the address keys are checked against), reached through
/// `window` if given.
fn insert(pd: Arc<Pd>, addr: u64, len: usize, access: c_int, window: Option<Window>) -> *mut ibv_mr {
    let (lkey, rkey) = (new_key(), new_key());
    let public = ibv_mr {
        context: pd.ctx.ptr(),
        pd: pd.ptr(),
        addr: addr as *mut c_void,
        length: len,
        handle: handle(),
        lkey,
        rkey,
    };
    pd.users.fetch_add(1, Ordering::Relaxed);
    let mr = Arc::new(Mr {
        public: Public::new(public),
        pd,
        addr,
        len: len as u64,
        access,
        lkey,
        rkey,
        live: RwLock::new(true),
        window,
    });
    let p = mr.ptr();
    let mut reg = reg_mut();
    reg.lkeys.insert(lkey, mr.clone());
    reg.rkeys.insert(rkey, mr.clone());
    reg.mrs.insert(registry::key(p), mr);
    p
}

/// `ibv_reg_dmabuf_mr`: `length` bytes from `offset` in the dma-buf `fd` (counted from the
/// descriptor's file position: see the export's comment), known on the wire as `iova`.
pub fn reg_dmabuf_mr(
    pd_ptr: *const ibv_pd,
    offset: u64,
    len: usize,
    iova: u64,
    fd: c_int,
    access: c_int,
) -> Result<*mut ibv_mr, c_int> {
    if !crate::config::config().dmabuf {
        return Err(libc::EOPNOTSUPP);
    }
    let pd = registry::pd(pd_ptr).ok_or(libc::EINVAL)?;
    let known = ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE | ACCESS_REMOTE_READ | ACCESS_REMOTE_ATOMIC;
    // On-demand paging has no meaning for a dma-buf (its exporter moves it, not page faults).
    if access & !(known | ACCESS_OPTIONAL_RANGE) != 0 {
        return Err(libc::EINVAL);
    }
    if access & (ACCESS_REMOTE_WRITE | ACCESS_REMOTE_ATOMIC) != 0 && access & ACCESS_LOCAL_WRITE == 0 {
        return Err(libc::EINVAL);
    }
    // A bad descriptor is EBADF, before the length is looked at: NCCL's probe relies on it.
    // SAFETY: an all-zero `stat` is a valid value of the plain C struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat only looks the descriptor up; `st` is a local.
    if fd < 0 || unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(libc::EBADF);
    }
    if len == 0 {
        return Err(libc::EINVAL);
    }
    // SAFETY: as above.
    let position = unsafe { libc::lseek(fd, 0, libc::SEEK_CUR) };
    let start = u64::try_from(position).ok().and_then(|p| p.checked_add(offset)).ok_or(libc::EINVAL)?;
    let end = start.checked_add(len as u64).ok_or(libc::EINVAL)?;
    if end > st.st_size as u64 {
        return Err(libc::EINVAL);
    }
    let page = 4096u64;
    let map_start = start / page * page;
    let map_len = (end - map_start).next_multiple_of(page) as usize;
    let prot = if access & ACCESS_LOCAL_WRITE != 0 { libc::PROT_READ | libc::PROT_WRITE } else { libc::PROT_READ };
    // SAFETY: a shared mapping of a range of the descriptor checked to lie inside it.
    let map = unsafe { libc::mmap(std::ptr::null_mut(), map_len, prot, libc::MAP_SHARED, fd, map_start as i64) };
    if map == libc::MAP_FAILED {
        return Err(libc::EFAULT);
    }
    let window = Window { map: map as usize, map_len, at: (start - map_start) as usize };
    Ok(insert(pd, iova, len, access, Some(window)))
}

pub fn dereg_mr(p: *const ibv_mr) -> c_int {
    let mr = {
        let mut reg = reg_mut();
        let Some(mr) = reg.mrs.remove(&registry::key(p)) else { return libc::EINVAL };
        reg.lkeys.remove(&mr.lkey);
        reg.rkeys.remove(&mr.rkey);
        mr
    };
    // Waits for any access of the NIC under way.
    *util::write(&mr.live) = false;
    mr.pd.users.fetch_sub(1, Ordering::Relaxed);
    0
}

/// Why a key check failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyError {
    /// No live MR has the key, or it belongs to another PD.
    Key,
    /// The range is outside the MR.
    Bounds,
    /// The MR lacks the access right.
    Access,
}

/// The MR an lkey names for `[addr, addr + len)` in `pd`, needing `access` rights (0: local
/// read, always granted).
pub fn check_lkey(pd: &Arc<Pd>, lkey: u32, addr: u64, len: u64, access: c_int) -> Result<Arc<Mr>, KeyError> {
    check(registry::mr_by_lkey(lkey), pd, addr, len, access)
}

/// The MR an rkey names for `[addr, addr + len)` in `pd`, needing `access` rights.
pub fn check_rkey(pd: &Arc<Pd>, rkey: u32, addr: u64, len: u64, access: c_int) -> Result<Arc<Mr>, KeyError> {
    check(registry::mr_by_rkey(rkey), pd, addr, len, access)
}

fn check(mr: Option<Arc<Mr>>, pd: &Arc<Pd>, addr: u64, len: u64, access: c_int) -> Result<Arc<Mr>, KeyError> {
    let mr = mr.ok_or(KeyError::Key)?;
    if !Arc::ptr_eq(&mr.pd, pd) {
        return Err(KeyError::Key);
    }
    if !mr.covers(addr, len) {
        return Err(KeyError::Bounds);
    }
    if mr.access & access != access {
        return Err(KeyError::Access);
    }
    Ok(mr)
}

//! Every live object of the process, keyed by the pointer the caller holds (so a destroyed or
//! foreign pointer is refused with `EINVAL` instead of being dereferenced), plus the NIC's
//! lookups: MRs by lkey and by rkey, QPs by number.
//!
//! Lock order: the registry is only ever held alone (callers clone the `Arc` they need and
//! let go) — then a QP's lock, then an MR's `live` lock, then a CQ's lock.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::cq::Cq;
use crate::device::Ctx;
use crate::mr::{Mr, Pd};
use crate::qp::Qp;
use crate::util;

#[derive(Default)]
pub struct Registry {
    pub ctxs: HashMap<usize, Arc<Ctx>>,
    pub pds: HashMap<usize, Arc<Pd>>,
    pub mrs: HashMap<usize, Arc<Mr>>,
    pub lkeys: HashMap<u32, Arc<Mr>>,
    pub rkeys: HashMap<u32, Arc<Mr>>,
    pub cqs: HashMap<usize, Arc<Cq>>,
    pub qps: HashMap<usize, Arc<Qp>>,
    pub qpns: HashMap<u32, Arc<Qp>>,
}

static REGISTRY: LazyLock<RwLock<Registry>> = LazyLock::new(Default::default);

pub fn reg() -> RwLockReadGuard<'static, Registry> {
    util::read(&REGISTRY)
}

pub fn reg_mut() -> RwLockWriteGuard<'static, Registry> {
    util::write(&REGISTRY)
}

/// The registry key of a caller's pointer.
pub fn key<T>(p: *const T) -> usize {
    p as usize
}

pub fn ctx(p: *const crate::sys::ibv_context) -> Option<Arc<Ctx>> {
    reg().ctxs.get(&key(p)).cloned()
}

pub fn pd(p: *const crate::sys::ibv_pd) -> Option<Arc<Pd>> {
    reg().pds.get(&key(p)).cloned()
}

pub fn cq(p: *const crate::sys::ibv_cq) -> Option<Arc<Cq>> {
    reg().cqs.get(&key(p)).cloned()
}

pub fn qp(p: *const crate::sys::ibv_qp) -> Option<Arc<Qp>> {
    reg().qps.get(&key(p)).cloned()
}

pub fn qp_by_num(num: u32) -> Option<Arc<Qp>> {
    reg().qpns.get(&num).cloned()
}

pub fn mr_by_lkey(lkey: u32) -> Option<Arc<Mr>> {
    reg().lkeys.get(&lkey).cloned()
}

pub fn mr_by_rkey(rkey: u32) -> Option<Arc<Mr>> {
    reg().rkeys.get(&rkey).cloned()
}

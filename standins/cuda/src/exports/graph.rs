//! Stream capture and graphs (`capture`).

use std::ffi::{c_uint, c_ulonglong, c_void};

use super::{edge, Out};
use crate::capture;
use crate::sys::{CUresult, CUstream};

pub type CUgraph = *mut c_void;
pub type CUgraphExec = *mut c_void;
pub type CUgraphNode = *mut c_void;

#[no_mangle]
pub unsafe extern "C" fn cuStreamBeginCapture_v2(s: CUstream, mode: c_uint) -> CUresult {
    edge(|| capture::begin(s as usize, mode))
}

/// The same as `_v2` (CUDA 12's headers define the name to it).
#[no_mangle]
pub unsafe extern "C" fn cuStreamBeginCapture(s: CUstream, mode: c_uint) -> CUresult {
    edge(|| capture::begin(s as usize, mode))
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamEndCapture(s: CUstream, graph: *mut CUgraph) -> CUresult {
    edge(|| {
        // SAFETY: the caller's out-pointer.
        let out = unsafe { Out::new(graph) }?;
        match capture::end(s as usize) {
            Ok(g) => {
                out.set(g as CUgraph);
                Ok(())
            }
            Err(e) => {
                out.set(std::ptr::null_mut());
                Err(e)
            }
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamIsCapturing(s: CUstream, status: *mut c_uint) -> CUresult {
    edge(|| {
        // SAFETY: the caller's out-pointer.
        let out = unsafe { Out::new(status) }?;
        out.set(capture::status(s as usize)?);
        Ok(())
    })
}

/// The status, and the capture's id while one is under way; the graph and dependency outputs,
/// where asked for, are NULL and 0 (the stand-in hands out no node handles).
#[no_mangle]
pub unsafe extern "C" fn cuStreamGetCaptureInfo_v2(
    s: CUstream,
    status: *mut c_uint,
    id: *mut c_ulonglong,
    graph: *mut CUgraph,
    deps: *mut *const CUgraphNode,
    ndeps: *mut usize,
) -> CUresult {
    edge(|| {
        // SAFETY: the caller's out-pointer.
        let out = unsafe { Out::new(status) }?;
        let (st, capture_id) = capture::info(s as usize)?;
        out.set(st);
        // SAFETY: each optional out-pointer, where not NULL, is the caller's to write.
        unsafe {
            if !id.is_null() {
                id.write_unaligned(capture_id);
            }
            if !graph.is_null() {
                graph.write_unaligned(std::ptr::null_mut());
            }
            if !deps.is_null() {
                deps.write_unaligned(std::ptr::null());
            }
            if !ndeps.is_null() {
                ndeps.write_unaligned(0);
            }
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuThreadExchangeStreamCaptureMode(mode: *mut c_uint) -> CUresult {
    edge(|| {
        if mode.is_null() {
            return Err(CUresult::INVALID_VALUE);
        }
        // SAFETY: checked non-NULL; the caller's to read and write.
        unsafe { mode.write_unaligned(capture::exchange_mode(mode.read_unaligned())?) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiateWithFlags(
    exec: *mut CUgraphExec,
    graph: CUgraph,
    flags: c_ulonglong,
) -> CUresult {
    edge(|| {
        // SAFETY: the caller's out-pointer.
        let out = unsafe { Out::new(exec) }?;
        out.set(capture::instantiate(graph as usize, flags)? as CUgraphExec);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphLaunch(exec: CUgraphExec, s: CUstream) -> CUresult {
    edge(|| capture::launch(exec as usize, s as usize))
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphExecDestroy(exec: CUgraphExec) -> CUresult {
    edge(|| capture::destroy_exec(exec as usize))
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphDestroy(graph: CUgraph) -> CUresult {
    edge(|| capture::destroy_graph(graph as usize))
}

/// With `nodes` NULL, the node count; otherwise up to `*count` placeholder handles.
#[no_mangle]
pub unsafe extern "C" fn cuGraphGetNodes(graph: CUgraph, nodes: *mut CUgraphNode, count: *mut usize) -> CUresult {
    edge(|| {
        if count.is_null() {
            return Err(CUresult::INVALID_VALUE);
        }
        let n = capture::node_count(graph as usize)?;
        // SAFETY: `count` is non-NULL, the caller's; `nodes`, where not NULL, holds `*count`.
        unsafe {
            if !nodes.is_null() {
                let room = count.read_unaligned().min(n);
                for i in 0..room {
                    nodes.add(i).write_unaligned((graph as usize + 8 * (i + 1)) as CUgraphNode);
                }
                count.write_unaligned(room);
            } else {
                count.write_unaligned(n);
            }
        }
        Ok(())
    })
}

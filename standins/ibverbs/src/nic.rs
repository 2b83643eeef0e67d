//! The fabric: each process (node) listens on an abstract Unix socket named by its routing key
//! (`\0topoccl-ibv-standin/<pid>` on Ethernet, `\0topoccl-ibv-standin/lid/<pid % 0x2ffe>` on
//! InfiniBand) and connects lazily to the nodes it sends to, itself included.
//!
//! A connection carries requests one way and responses back: the connecting side's reader
//! thread hands responses to the engine; the accepting side's thread executes requests (the
//! responder) and writes the answers. So bytes land in a process's memory without it calling
//! verbs. All threads are detached: none keeps a process from exiting. Writes use
//! `MSG_NOSIGNAL` (a dead peer must not raise SIGPIPE in a C host).

use std::collections::HashMap;
use std::ffi::c_int;
use std::io::{self, BufReader};
use std::os::fd::AsRawFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::sync::{Arc, Mutex, OnceLock};

use crate::config::config;
use crate::device::local_key;
use crate::util::{count, fence, lock, with_rng, COUNTERS};
use crate::wire::{self, Frame};
use crate::{engine, responder};

/// The abstract socket name of a node.
pub fn socket_name(key: u32) -> String {
    if config().ib {
        format!("topoccl-ibv-standin/lid/{key}")
    } else {
        format!("topoccl-ibv-standin/{key}")
    }
}

fn address(key: u32) -> io::Result<SocketAddr> {
    SocketAddr::from_abstract_name(socket_name(key).as_bytes())
}

fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> io::Result<()> {
    std::thread::Builder::new().name(name.into()).spawn(f).map(drop)
}

/// Starts this node's NIC (listener and engine) once; the errno if it cannot.
pub fn start() -> Result<(), c_int> {
    static STARTED: OnceLock<(u32, Result<(), c_int>)> = OnceLock::new();
    let (pid, result) = *STARTED.get_or_init(|| (std::process::id(), listen()));
    if pid != std::process::id() {
        // A child forked after the NIC started has none of its threads.
        eprintln!("topoccl ibverbs stand-in: verbs used in a child forked after ibv_open_device: not emulated");
        return Err(libc::EOPNOTSUPP);
    }
    result
}

fn listen() -> Result<(), c_int> {
    let errno = |e: io::Error| e.raw_os_error().unwrap_or(libc::EIO);
    let listener = address(local_key()).and_then(|a| UnixListener::bind_addr(&a)).map_err(|e| {
        eprintln!("topoccl ibverbs stand-in: cannot listen on @{}: {e}", socket_name(local_key()));
        errno(e)
    })?;
    spawn("ibv-standin-accept", move || accept(listener)).map_err(errno)?;
    engine::start().map_err(errno)
}

fn accept(listener: UnixListener) {
    for stream in listener.incoming() {
        match stream {
            Ok(s) => {
                if let Err(e) = spawn("ibv-standin-responder", move || serve(s)) {
                    eprintln!("topoccl ibverbs stand-in: cannot start a responder thread: {e}");
                }
            }
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(10)),
        }
    }
}

/// An accepted connection: requests in, responses out.
fn serve(stream: UnixStream) {
    let Ok(read_half) = stream.try_clone() else { return };
    let mut reader = BufReader::with_capacity(1 << 16, read_half);
    loop {
        let req = match wire::read_frame(&mut reader) {
            Ok(Frame::Request(r)) => r,
            _ => return, // closed, or not a request: the connection is done
        };
        let Some(resp) = fence("responder", None, || responder::handle(&req)) else { continue };
        if with_rng(|r| r.chance(config().drop)) {
            count(&COUNTERS.dropped);
            continue;
        }
        if send_all(&stream, &wire::encode_response(&resp)).is_err() {
            return;
        }
    }
}

/// A connection to a node, for requests.
struct Conn {
    stream: Mutex<UnixStream>,
}

static CONNS: Mutex<Option<HashMap<u32, Arc<Conn>>>> = Mutex::new(None);

fn forget(key: u32, conn: &Arc<Conn>) {
    let mut g = lock(&CONNS);
    let map = g.get_or_insert_with(HashMap::new);
    if map.get(&key).is_some_and(|c| Arc::ptr_eq(c, conn)) {
        map.remove(&key);
    }
}

/// The connection to a node, made if needed; `None` if the node does not answer.
fn conn(key: u32) -> Option<Arc<Conn>> {
    if let Some(c) = lock(&CONNS).get_or_insert_with(HashMap::new).get(&key) {
        return Some(c.clone());
    }
    let stream = UnixStream::connect_addr(&address(key).ok()?).ok()?;
    let read_half = stream.try_clone().ok()?;
    let conn = Arc::new(Conn { stream: Mutex::new(stream) });
    {
        let mut g = lock(&CONNS);
        let map = g.get_or_insert_with(HashMap::new);
        if let Some(c) = map.get(&key) {
            return Some(c.clone()); // another thread connected meanwhile; ours closes
        }
        map.insert(key, conn.clone());
    }
    let mine = conn.clone();
    let reader = move || {
        let mut r = BufReader::new(read_half);
        while let Ok(Frame::Response(resp)) = wire::read_frame(&mut r) {
            fence("response", (), || engine::on_response(resp));
        }
        forget(key, &mine);
    };
    if spawn("ibv-standin-requester", reader).is_err() {
        forget(key, &conn);
        return None;
    }
    Some(conn)
}

/// Whether a node is up (connecting to it if needed).
pub fn reachable(key: u32) -> bool {
    conn(key).is_some()
}

/// Sends a request frame (in parts) to a node; false if it could not (a lost packet to the
/// requester).
pub fn send(key: u32, parts: &[&[u8]]) -> bool {
    let Some(c) = conn(key) else { return false };
    let stream = lock(&c.stream);
    let ok = parts.iter().all(|p| send_all(&stream, p).is_ok());
    drop(stream);
    if !ok {
        forget(key, &c);
    }
    ok
}

fn send_all(s: &UnixStream, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        // SAFETY: `buf` is valid for `buf.len()` bytes and the descriptor is open for as long
        // as `s` lives.
        let n = unsafe { libc::send(s.as_raw_fd(), buf.as_ptr().cast(), buf.len(), libc::MSG_NOSIGNAL) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        buf = &buf[n as usize..];
    }
    Ok(())
}

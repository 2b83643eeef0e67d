//! CUDA IPC: device buffers of ranks on one host move GPU to GPU (NVLink or PCIe peer to peer),
//! NCCL's P2P transport. It stands ahead of shared memory in the table for ranks whose devices
//! reach each other; host payloads of the same pair still go through its shared-memory frames.
//!
//! Set-up, on the control stream, both sides alike: each allocates its receive window (device
//! memory with an IPC handle) and names it; the lower rank makes a one-page shared segment for
//! the pair's signal words and names it; each opens the other's window (or, in one process,
//! uses its address) and registers the page with its device; each says whether all of that
//! worked, and if either side could not, the pair declines and goes on down the table with the
//! same streams. Then the shared-memory rings are set up on those streams as shared memory's own.
//!
//! The GPU is reached only through [`DeviceAccess`], which the core crate implements with the
//! CUDA driver; see [`IpcConnection`] for the protocol.

mod connection;
pub mod device;
mod offers;
pub mod resident;
pub mod stats;
mod wire;

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};
use crate::registration::RegistrationCache;
use crate::shm::segment::Segment;
use crate::shm::ShmTransport;
use crate::{Connected, Locality, PeerSetup, Transport};
pub use connection::IpcConnection;
use connection::{PeerWindow, Receiving};
use device::IPC_HANDLE_BYTES;
pub use device::{DeviceAccess, DeviceId, DeviceQueue, ExportedMemory, ImportedMemory, RegisteredHost};
pub use resident::{DevicePeer, ResidentLink, Word, LL_AREA_BYTES};
use resident::{Kept, ResidentParts};
pub use stats::{IpcCounts, IpcStats};
use wire::{Signals, DIRECTION_BYTES, WINDOW_ALIGN};

/// Marks a device message's descriptor among the frames of its tag.
pub const DEVICE_BIT: u32 = 1 << 29;
/// Default receive window per direction, device memory.
pub const DEFAULT_WINDOW_BYTES: usize = 8 << 20;
/// The largest window a peer may announce.
pub const MAX_WINDOW_BYTES: usize = 1 << 30;
const MAGIC: &[u8; 4] = b"TIPC";
/// v2: each side's IPC allocation holds two windows, the resident one above the other.
const VERSION: u8 = 3;
/// magic, version, ok, pid, window bytes, window address, handle, page fd, device ordinal.
const HELLO_BYTES: usize = 4 + 1 + 1 + 4 + 8 + 8 + IPC_HANDLE_BYTES + 4 + 4 + 16;
pub(crate) const PAGE_BYTES: usize = 4096;
/// Allocations whose registrations a rank keeps (the oldest go first).
const CACHED_ALLOCATIONS: usize = 256;
const _: () = assert!(2 * DIRECTION_BYTES <= PAGE_BYTES);

/// The CUDA IPC backend.
#[derive(Clone)]
pub struct IpcTransport {
    pub access: Arc<dyn DeviceAccess>,
    /// Receive window per direction, device memory (a multiple of 256 bytes; each message must
    /// fit).
    pub window_bytes: usize,
    /// The rings its frames travel in.
    pub shm: ShmTransport,
    /// This rank's registered buffers, shared by all its connections.
    registrations: Arc<Mutex<RegistrationCache>>,
    stats: Arc<IpcStats>,
}

/// What a transport's connections share.
#[derive(Clone)]
pub(crate) struct Shared {
    pub(crate) access: Arc<dyn DeviceAccess>,
    pub(crate) registrations: Arc<Mutex<RegistrationCache>>,
    pub(crate) stats: Arc<IpcStats>,
}

impl IpcTransport {
    pub fn new(access: Arc<dyn DeviceAccess>, window_bytes: usize, shm: ShmTransport) -> IpcTransport {
        IpcTransport {
            access,
            window_bytes,
            shm,
            registrations: Arc::new(Mutex::new(RegistrationCache::new(CACHED_ALLOCATIONS))),
            stats: Arc::new(IpcStats::default()),
        }
    }

    /// What its connections have done so far.
    pub fn counts(&self) -> IpcCounts {
        let cache = self.registrations.lock().map(|c| c.counts()).unwrap_or_default();
        self.stats.snapshot(cache)
    }
}

impl std::fmt::Debug for IpcTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IpcTransport")
            .field("device", &self.access.device())
            .field("window_bytes", &self.window_bytes)
            .finish()
    }
}

struct Hello {
    ok: bool,
    pid: u32,
    window_bytes: u64,
    window_addr: u64,
    handle: [u8; IPC_HANDLE_BYTES],
    page_fd: i32,
    /// The device's ordinal in its process (used when both ranks share one).
    ordinal: u32,
    /// The device's UUID (whether the two ranks share one GPU, from any processes).
    uuid: [u8; 16],
}

impl Hello {
    fn encode(&self) -> [u8; HELLO_BYTES] {
        let mut b = [0u8; HELLO_BYTES];
        b[..4].copy_from_slice(MAGIC);
        b[4] = VERSION;
        b[5] = u8::from(self.ok);
        b[6..10].copy_from_slice(&self.pid.to_le_bytes());
        b[10..18].copy_from_slice(&self.window_bytes.to_le_bytes());
        b[18..26].copy_from_slice(&self.window_addr.to_le_bytes());
        b[26..26 + IPC_HANDLE_BYTES].copy_from_slice(&self.handle);
        b[26 + IPC_HANDLE_BYTES..30 + IPC_HANDLE_BYTES].copy_from_slice(&self.page_fd.to_le_bytes());
        b[30 + IPC_HANDLE_BYTES..34 + IPC_HANDLE_BYTES].copy_from_slice(&self.ordinal.to_le_bytes());
        b[34 + IPC_HANDLE_BYTES..].copy_from_slice(&self.uuid);
        b
    }

    fn decode(b: &[u8; HELLO_BYTES], peer: &str) -> Result<Hello> {
        if &b[..4] != MAGIC {
            return Err(Error::Protocol(format!("{peer} did not start a CUDA IPC handshake")));
        }
        if b[4] != VERSION {
            return Err(Error::Protocol(format!("{peer} speaks CUDA IPC handshake v{}, this rank v{VERSION}", b[4])));
        }
        let q = |r: std::ops::Range<usize>| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[r]);
            u64::from_le_bytes(w)
        };
        let mut handle = [0u8; IPC_HANDLE_BYTES];
        handle.copy_from_slice(&b[26..26 + IPC_HANDLE_BYTES]);
        let word = |at: usize| [b[at], b[at + 1], b[at + 2], b[at + 3]];
        let h = Hello {
            ok: b[5] == 1,
            pid: u32::from_le_bytes([b[6], b[7], b[8], b[9]]),
            window_bytes: q(10..18),
            window_addr: q(18..26),
            handle,
            page_fd: i32::from_le_bytes(word(26 + IPC_HANDLE_BYTES)),
            ordinal: u32::from_le_bytes(word(30 + IPC_HANDLE_BYTES)),
            uuid: {
                let mut u = [0u8; 16];
                u.copy_from_slice(&b[34 + IPC_HANDLE_BYTES..]);
                u
            },
        };
        let w = h.window_bytes;
        if h.ok && (w < WINDOW_ALIGN as u64 || w > MAX_WINDOW_BYTES as u64 || w % WINDOW_ALIGN as u64 != 0) {
            return Err(Error::Protocol(format!("{peer} announced an IPC window of {w} bytes")));
        }
        Ok(h)
    }
}

fn hs(peer: &str, e: io::Error) -> Error {
    Error::io(format!("CUDA IPC handshake with {peer}"), e)
}

/// Says `ok` to the peer and learns its verdict: both succeeded.
fn agree(control: &mut TcpStream, peer: &str, ok: bool) -> Result<bool> {
    control.write_all(&[u8::from(ok)]).map_err(|e| hs(peer, e))?;
    let mut theirs = [0u8; 1];
    control.read_exact(&mut theirs).map_err(|e| hs(peer, e))?;
    Ok(ok && theirs[0] == 1)
}

impl IpcTransport {
    /// The window, the peer's window as reached from here and the signal page, or why not.
    #[allow(clippy::type_complexity)]
    fn handshake(
        &self,
        setup: &mut PeerSetup,
    ) -> Result<std::result::Result<(Arc<Kept<dyn ExportedMemory>>, PeerWindow, Signals, DevicePeer), String>> {
        let peer = setup.peer.clone();
        let Some(control) = setup.streams.first_mut() else {
            return Err(Error::Unsupported(format!("no control stream to {peer}")));
        };
        control.set_read_timeout(Some(setup.timeout)).map_err(|e| hs(&peer, e))?;
        // Two windows in one allocation: the connection's own, then the resident one.
        let window = self.access.alloc(2 * self.window_bytes);
        let page = if setup.creator { Some(Segment::create(PAGE_BYTES)) } else { None };
        let mine = Hello {
            ok: window.is_ok() && page.as_ref().map_or(true, |p| p.is_ok()),
            pid: std::process::id(),
            window_bytes: self.window_bytes as u64,
            window_addr: window.as_ref().map_or(0, |w| w.addr()),
            handle: window.as_ref().map_or([0; IPC_HANDLE_BYTES], |w| w.handle()),
            page_fd: page.as_ref().and_then(|p| p.as_ref().ok()).and_then(Segment::raw_fd).unwrap_or(-1),
            ordinal: self.access.device().ordinal,
            uuid: self.access.device().uuid,
        };
        control.write_all(&mine.encode()).map_err(|e| hs(&peer, e))?;
        let mut b = [0u8; HELLO_BYTES];
        control.read_exact(&mut b).map_err(|e| hs(&peer, e))?;
        let theirs = Hello::decode(&b, &peer)?;
        let (window, page) = match (window, page.transpose()) {
            (Ok(w), Ok(p)) if theirs.ok => (w, p),
            (Err(e), _) | (_, Err(e)) => return Ok(Err(format!("this rank could not set up its side: {e}"))),
            _ => return Ok(Err(format!("{peer} could not set up its side"))),
        };
        // The pieces each side needs of the other, then one verdict for both.
        let page = match page {
            Some(p) => Ok(p),
            None => Segment::open(theirs.pid, theirs.page_fd, PAGE_BYTES),
        };
        let same_process = theirs.pid == std::process::id();
        let same_device = theirs.uuid == self.access.device().uuid;
        let mapping = if same_process {
            self.access.enable_peer(theirs.ordinal).map(|()| None)
        } else {
            self.access.open(&theirs.handle).map(Some)
        };
        let registered = match &page {
            // SAFETY: the page stays mapped as long as the registration: both live in the
            // connection, which drops the registration first.
            Ok(p) => unsafe { self.access.register(p.base().as_ptr() as usize, p.len()) },
            Err(e) => Err(e.clone()),
        };
        let failed = [page.as_ref().err(), mapping.as_ref().err(), registered.as_ref().err()]
            .into_iter()
            .flatten()
            .next()
            .map(|e| e.to_string());
        if !agree(control, &peer, failed.is_none())? {
            return Ok(Err(failed.unwrap_or_else(|| format!("{peer} could not reach this rank's window"))));
        }
        // Both sides have mapped the page: its file may close now.
        let (Ok(mut page), Ok(mapping), Ok(registered)) = (page, mapping, registered) else {
            return Err(Error::Protocol("a failed IPC set-up agreed to".into()));
        };
        page.release_file();
        let page = Arc::new(page);
        let base = mapping.as_ref().map_or(theirs.window_addr, |m| m.addr());
        let rx_base = window.addr();
        let device_base = registered.device_addr();
        let (window, registered) = (Kept::new(window), Kept::new(registered));
        let mapping = mapping.map(Kept::new);
        let cap = self.window_bytes;
        let tx_cap = theirs.window_bytes as usize;
        let mut keep: Vec<Arc<dyn std::any::Any + Send + Sync>> = vec![window.clone(), registered.clone()];
        if let Some(m) = &mapping {
            keep.push(m.clone());
        }
        let resident = DevicePeer::new(ResidentParts {
            same_context: same_process && theirs.ordinal == self.access.device().ordinal,
            same_device,
            page: page.clone(),
            page_device: device_base,
            tx: usize::from(!setup.creator),
            tx_window: base + tx_cap as u64,
            rx_window: rx_base + cap as u64,
            // Both sides' windows are of their own size: the smaller one bounds both directions.
            window_bytes: cap.min(tx_cap),
            keep,
        });
        let tx = PeerWindow { mapping, base, cap: tx_cap };
        let signals = Signals { page, _registered: registered, device_base, tx: usize::from(!setup.creator) };
        Ok(Ok((window, tx, signals, resident)))
    }
}

impl Transport for IpcTransport {
    fn name(&self) -> &'static str {
        "cuda-ipc"
    }

    /// Ranks of one host, each driving a device, whose devices reach each other.
    fn can_connect(&self, me: &Locality, peer: &Locality) -> bool {
        match (me.device, peer.device) {
            (Some(a), Some(b)) => me.host == peer.host && a == self.access.device() && self.access.can_reach(&b),
            _ => false,
        }
    }

    fn connect(&self, mut setup: PeerSetup) -> Result<Connected> {
        let (rx, tx, signals, resident) = match self.handshake(&mut setup)? {
            Ok(parts) => parts,
            Err(why) => return Ok(Connected::Declined { setup, why }),
        };
        let peer = setup.peer.clone();
        let shm = match self.shm.connect_shm(setup)? {
            Ok(c) => c,
            Err((setup, why)) => return Ok(Connected::Declined { setup, why }),
        };
        let queue = self.access.queue()?;
        let shared = Shared {
            access: self.access.clone(),
            registrations: self.registrations.clone(),
            stats: self.stats.clone(),
        };
        Ok(Connected::Connection(Box::new(IpcConnection::new(
            shm,
            queue,
            tx,
            Receiving { window: rx, cap: self.window_bytes, resident: Some(Arc::new(resident)) },
            signals,
            shared,
            peer,
        ))))
    }
}

#[cfg(test)]
mod tests;

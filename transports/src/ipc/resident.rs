//! What a pair of ranks connected by CUDA IPC lends to **device-resident** calls: calls whose
//! every copy, signal and wait the caller enqueues on its own stream, so that no host thread
//! has a driver call to make once the stream waits (NCCL's invariant; the core crate's
//! `exec::resident` runs them).
//!
//! Each side exposes a second receive window (the upper half of its IPC allocation, beside the
//! one the connection's own protocol uses), and the pair's shared page holds, per direction,
//! four words past the connection's own:
//!
//! - `arrived`: written by the sender's *stream* after each copy into the receiver's window
//!   (the number of the call's messages landed so far: 1, 2, …); the receiver's stream waits
//!   on it, and sets it back to 0 once it has read the call's messages;
//! - `consumed`: 1 while the window is free (from set-up on): the receiver's stream writes 1
//!   once it has read a call's messages (after `arrived` is back at 0); the sender's stream
//!   waits for 1 before it writes into the window and sets it to 0.
//!
//!   Every value is the same at every call, whatever came before: a call captured into a
//!   CUDA graph, whose stream operations replay with the values of capture time, runs right
//!   at each replay and between uncaptured calls;
//! - `read`: the count of calls whose messages the receiver's stream has read, written (in a
//!   call's last piece) just before it sets `arrived` back: the one count a host watching the call can trust not to
//!   go back (a captured call replays an old one, which only delays that judgement);
//! - `arrived_enq`, `consumed_enq`: plain host stores of counts (messages, calls) of those
//!   writes, made by the thread that *enqueued* them. Ranks on one CUDA context share its
//!   hardware queues, where a wait queued ahead of the write releasing it would block that
//!   write for ever; a rank whose peer shares its context therefore queues a wait only once
//!   the peer's thread has queued the write (it polls these words on the host first).
//!
//! Both sides register the page with their device, so each word has a host address (for the
//! host's polls and, when a call fails, the host's release of its waits) and a device address
//! in each side's context.

use std::any::Any;
use std::sync::atomic::AtomicU32;
use std::sync::{Arc, Mutex};

use crate::shm::segment::Segment;

/// Where the resident words of direction `d` (the sender's) start in the pair's page.
pub(crate) const RESIDENT_AT: usize = 2048;
const ARRIVED: usize = 0;
const ARRIVED_ENQ: usize = 4;
const LL_ENQ: usize = 8;
const CONSUMED: usize = 64;
const CONSUMED_ENQ: usize = 68;
const READ: usize = 72;
const RESIDENT_DIRECTION_BYTES: usize = 128;

/// One word of the pair's page: its address on the host and on this side's device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Word {
    pub host: usize,
    pub device: u64,
}

impl Word {
    /// The word as the host reads and writes it.
    pub fn host(&self) -> &AtomicU32 {
        // SAFETY: an aligned word of the pair's page, which every `DevicePeer` keeps mapped
        // while it lives (the reference cannot outlive `self`, which holds the page); only
        // atomics and the devices' 32-bit stream memory operations touch it.
        unsafe { &*(self.host as *const AtomicU32) }
    }
}

/// Where one CUDA IPC pair's resident windows and words lie, as this rank sees them: plain
/// addresses, valid while the [`DevicePeer`] they came from lives.
#[derive(Debug, Clone, Copy)]
pub struct ResidentLink {
    /// The peer drives the same device from this process: it shares this rank's CUDA context
    /// and so its hardware queues (see the module documentation).
    pub same_context: bool,
    /// The peer's resident window, as this device writes it.
    pub tx_window: u64,
    /// This rank's resident window, which the peer writes.
    pub rx_window: u64,
    /// Bytes of each window.
    pub window_bytes: usize,
    /// The peer drives the same device as this rank (from this process or another).
    pub same_device: bool,
    /// The one-launch path's areas (`LL_AREA_BYTES` each, zeroed at set-up, 0 where the
    /// windows are too small to lend one): the peer's, as this device writes it, and this
    /// rank's, which the peer writes. They lie before the resident windows.
    pub ll_tx: u64,
    pub ll_rx: u64,
    /// This rank's messages of the call landed so far: this stream writes it, the peer's
    /// waits on it and resets it.
    pub arrived_out: Word,
    /// The peer's messages of the call landed so far: this stream waits on it and resets it.
    pub arrived_in: Word,
    /// Whether this rank's window at the peer is free (1): this stream waits on it and takes
    /// it (0), the peer's stream frees it.
    pub consumed_in: Word,
    /// The same for the peer's window here: this stream frees it.
    pub consumed_out: Word,
    /// Calls of the peer's messages this rank's stream has read (it writes the count before
    /// it sets `arrived_in` back): only the host reads it, for a count that never goes back.
    pub read_out: Word,
    /// Host-only counts of the writes queued so far (see the module documentation): this
    /// rank publishes `*_out_enq`, and polls `*_in_enq` before queueing a wait.
    pub arrived_out_enq: Word,
    pub arrived_in_enq: Word,
    pub consumed_out_enq: Word,
    pub consumed_in_enq: Word,
    /// Host-only counts of the one-launch kernels this rank and the peer launched so far (every
    /// such call of their communicator): this rank publishes `ll_out_enq`; a peer sharing its
    /// context waits on it, and any peer's watch names this rank while it lags.
    pub ll_out_enq: Word,
    pub ll_in_enq: Word,
}

/// Bytes of a one-launch area: a 4 KiB header (acknowledgement, readers' count), then two
/// parities of 256 KiB of lines (128 KiB of data each: 8 data bytes per 16-byte line).
pub const LL_AREA_BYTES: usize = 4096 + 2 * (256 << 10);

/// The device-resident side of one CUDA IPC pair, as this rank sees it: its addresses, and the
/// memory they lie in, kept alive.
pub struct DevicePeer {
    pub link: ResidentLink,
    /// The page, its registration, the windows' memory: freed when the connection and every
    /// user of this are gone.
    _keep: Vec<Arc<dyn Any + Send + Sync>>,
}

impl std::fmt::Debug for DevicePeer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DevicePeer").field("link", &self.link).finish_non_exhaustive()
    }
}

/// Where the pieces of one pair's resident side lie.
pub(crate) struct ResidentParts {
    pub(crate) same_context: bool,
    pub(crate) same_device: bool,
    pub(crate) page: Arc<Segment>,
    /// The device address of the page's first byte, in this side's context.
    pub(crate) page_device: u64,
    /// The direction this side sends in.
    pub(crate) tx: usize,
    pub(crate) tx_window: u64,
    pub(crate) rx_window: u64,
    pub(crate) window_bytes: usize,
    pub(crate) keep: Vec<Arc<dyn Any + Send + Sync>>,
}

impl DevicePeer {
    pub(crate) fn new(p: ResidentParts) -> DevicePeer {
        let word = |direction: usize, at: usize| {
            let off = RESIDENT_AT + direction * RESIDENT_DIRECTION_BYTES + at;
            Word { host: p.page.base().as_ptr() as usize + off, device: p.page_device + off as u64 }
        };
        let (tx, rx) = (p.tx, 1 - p.tx);
        // The window this side writes at the peer starts free (the page comes zeroed; the
        // peer's stream only ever writes 1 here, so the two sides' set-ups cannot conflict).
        word(tx, CONSUMED).host().store(1, std::sync::atomic::Ordering::Release);
        let mut keep = p.keep;
        keep.push(p.page.clone());
        // The one-launch areas come first, where the windows can spare them (half at most).
        let ll = p.window_bytes >= 2 * LL_AREA_BYTES;
        let skip = if ll { LL_AREA_BYTES } else { 0 };
        let link = ResidentLink {
            same_context: p.same_context,
            same_device: p.same_device,
            ll_tx: if ll { p.tx_window } else { 0 },
            ll_rx: if ll { p.rx_window } else { 0 },
            tx_window: p.tx_window + skip as u64,
            rx_window: p.rx_window + skip as u64,
            window_bytes: p.window_bytes - skip,
            arrived_out: word(tx, ARRIVED),
            arrived_in: word(rx, ARRIVED),
            consumed_in: word(tx, CONSUMED),
            consumed_out: word(rx, CONSUMED),
            read_out: word(rx, READ),
            arrived_out_enq: word(tx, ARRIVED_ENQ),
            arrived_in_enq: word(rx, ARRIVED_ENQ),
            consumed_out_enq: word(rx, CONSUMED_ENQ),
            consumed_in_enq: word(tx, CONSUMED_ENQ),
            ll_out_enq: word(tx, LL_ENQ),
            ll_in_enq: word(rx, LL_ENQ),
        };
        DevicePeer { link, _keep: keep }
    }
}

/// Something a [`DevicePeer`] keeps alive, behind a lock so that it may be shared between
/// threads (the boxes inside are only ever dropped, never used, through it).
pub(crate) struct Kept<T: ?Sized + Send>(pub(crate) Mutex<Box<T>>);

impl<T: ?Sized + Send> Kept<T> {
    pub(crate) fn new(b: Box<T>) -> Arc<Kept<T>> {
        Arc::new(Kept(Mutex::new(b)))
    }
}

const _: () = assert!(RESIDENT_AT + 2 * RESIDENT_DIRECTION_BYTES <= super::PAGE_BYTES);
const _: () = assert!(2 * super::wire::DIRECTION_BYTES <= RESIDENT_AT);

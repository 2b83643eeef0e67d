//! Device-resident calls: a rank's whole part of a collective put on its caller's CUDA stream
//! by the caller's own thread before the call returns — copies into the peers' windows, the
//! stream's own writes of "landed" counts, waits on the peers' counts, reduction kernels — so
//! that once the stream waits for anything of the call, nothing it needs is a driver call from
//! a host thread (NCCL's invariant; `../shared/gpu-review.md` §2 has why the host-driven path
//! breaks it). The schedule IR stays the one description of the algorithm: a rank's program is
//! lowered here ([`ResidentProgram::lower`]) into a list of [`Item`]s, in the order of
//! [`order::stream_order`], and [`emit`] puts the list on a [`DeviceStream`].
//!
//! Why this shape rather than one kernel interpreting the program (MSCCL's): every dependency
//! stays visible to CUDA's scheduler as stream order, copies run on the copy engines, and no
//! kernel holds multiprocessors while it waits for a peer, which on one GPU shared by several
//! ranks would starve the very kernels the call needs. Small calls, whose kernels are short,
//! take the other shape ([`ll`]): the same item list, lowered once more into the steps of one
//! kernel that waits inside itself.
//!
//! Peers whose stream shares this rank's CUDA context (ranks as threads on one device) also
//! share its hardware queues: a wait queued ahead of the write that releases it would block
//! that write for ever (with `CUDA_DEVICE_MAX_CONNECTIONS=1`, always). So a wait on such a peer
//! is queued only once the peer's thread has queued the write ([`Gate`]): every queue then
//! holds the writes before the waits they release.

pub(crate) mod ll;
pub(crate) mod order;
mod watch;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;
use topoccl_synth::schedule::Schedule;
use topoccl_transports::ipc::{ResidentLink, Word};

use super::layout::ChunkLayout;
use super::memory::{Memory, Span};
use super::program::{Action, Program};
use crate::error::{Error, Result};

/// Where a byte range of an item lies: one of the call's buffers, this rank's window for a
/// peer's messages, or the peer's window for this rank's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Loc {
    Buf(Span),
    Rx { peer: u32, off: usize, len: usize },
    Tx { peer: u32, off: usize, len: usize },
}

impl Loc {
    /// Its length in bytes.
    pub(crate) fn len(self) -> usize {
        match self {
            Loc::Buf(s) => s.len,
            Loc::Rx { len, .. } | Loc::Tx { len, .. } => len,
        }
    }
}

/// One piece of work on the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Item {
    Copy {
        dst: Loc,
        src: Loc,
    },
    /// `dst = a ⊕ b`, the call's operator, and the result also into `also` (a send of what was
    /// just reduced, in the same pass: the kernel's second destination).
    Reduce {
        dst: Loc,
        a: Loc,
        b: Loc,
        also: Option<Loc>,
    },
    /// The stream waits until message `index` (of this call, from 0) from `peer` has landed.
    Arrival {
        peer: u32,
        index: u32,
    },
    /// The stream says message `index` to `peer` has landed (after the copy or kernel before).
    Landed {
        peer: u32,
        index: u32,
    },
    /// The stream waits until `peer` has read this rank's earlier messages (its window is free
    /// again), and takes the window.
    Room {
        peer: u32,
    },
}

/// A rank's part of one collective as stream work.
#[derive(Debug, Default)]
pub(crate) struct ResidentProgram {
    pub items: Vec<Item>,
    /// Per peer sent to / received from: messages and window bytes.
    pub to: Vec<(u32, u32, usize)>,
    pub from: Vec<(u32, u32, usize)>,
    /// The most window bytes any rank of the call sends any one peer
    /// ([`order::Messages::peak`]).
    pub peak: usize,
}

impl ResidentProgram {
    /// Rank `me`'s `program` (its part of `schedule` on `layout`) as stream work.
    pub(crate) fn lower(
        schedule: &Schedule,
        layout: &ChunkLayout,
        program: &Program,
        me: u32,
    ) -> std::result::Result<ResidentProgram, String> {
        let order = order::stream_order(schedule)?;
        let msgs = order::messages(schedule, layout, &order, me);
        let mut items = Vec::new();
        let mut roomed: Vec<u32> = Vec::new();
        let missing = |what: &str, c: u32, s: u32| format!("rank {me}'s step {s} of channel {c}: no {what}");
        for s in order.get(me as usize).into_iter().flatten() {
            let st = program
                .channels
                .get(s.channel as usize)
                .and_then(|c| c.steps.get(s.step as usize))
                .ok_or_else(|| missing("program step", s.channel, s.step))?;
            let rx = if st.action.receives() {
                let (peer, m) = *msgs.received.get(s).ok_or_else(|| missing("message", s.channel, s.step))?;
                items.push(Item::Arrival { peer, index: m.index });
                Some(Loc::Rx { peer, off: m.offset, len: m.len })
            } else {
                None
            };
            let tx = if st.action.sends() {
                let (peer, m) = *msgs.sent.get(s).ok_or_else(|| missing("message", s.channel, s.step))?;
                Some((peer, m.index, Loc::Tx { peer, off: m.offset, len: m.len }))
            } else {
                None
            };
            let (src, dst) = (Loc::Buf(st.src), Loc::Buf(st.dst));
            let mut room = |items: &mut Vec<Item>, peer: u32| {
                if !roomed.contains(&peer) {
                    roomed.push(peer);
                    items.push(Item::Room { peer });
                }
            };
            match (st.action, rx, tx) {
                (Action::Copy, ..) => items.push(Item::Copy { dst, src }),
                (Action::Reduce, ..) => items.push(Item::Reduce { dst, a: dst, b: src, also: None }),
                (Action::Send, None, Some((peer, index, t))) => {
                    room(&mut items, peer);
                    items.push(Item::Copy { dst: t, src });
                    items.push(Item::Landed { peer, index });
                }
                (Action::Recv, Some(r), None) => items.push(Item::Copy { dst, src: r }),
                (Action::RecvReduce, Some(r), None) => items.push(Item::Reduce { dst, a: src, b: r, also: None }),
                (Action::RecvCopySend, Some(r), Some((peer, index, t))) => {
                    items.push(Item::Copy { dst, src: r });
                    room(&mut items, peer);
                    items.push(Item::Copy { dst: t, src: r });
                    items.push(Item::Landed { peer, index });
                }
                (Action::RecvReduceSend, Some(r), Some((peer, index, t))) => {
                    room(&mut items, peer);
                    items.push(Item::Reduce { dst: t, a: src, b: r, also: None });
                    items.push(Item::Landed { peer, index });
                }
                (Action::RecvReduceCopySend, Some(r), Some((peer, index, t))) => {
                    // One pass: the reduction writes the result and its send (the peer's room
                    // is waited for first, as for any write into its window).
                    room(&mut items, peer);
                    items.push(Item::Reduce { dst, a: src, b: r, also: Some(t) });
                    items.push(Item::Landed { peer, index });
                }
                _ => return Err(missing("message for its action", s.channel, s.step)),
            }
        }
        let sorted = |m: &FxHashMap<u32, (u32, usize)>| {
            let mut v: Vec<(u32, u32, usize)> = m.iter().map(|(&p, &(n, b))| (p, n, b)).collect();
            v.sort_unstable();
            v
        };
        Ok(ResidentProgram { items, to: sorted(&msgs.to), from: sorted(&msgs.from), peak: msgs.peak })
    }

    /// Whether every rank's messages of one call to any one peer fit the windows of `links`,
    /// and every peer of this rank is one. Judged on the call's largest pair, not on this
    /// rank's own messages, so that every rank judges alike (a rank whose own messages fit
    /// while a peer's do not would run the call device-resident alone, and hang).
    pub(crate) fn fits(&self, links: &[Option<ResidentLink>]) -> bool {
        let peers =
            self.to.iter().chain(&self.from).all(|&(p, _, _)| links.get(p as usize).is_some_and(Option::is_some));
        peers && links.iter().flatten().all(|l| self.peak <= l.window_bytes)
    }
}

/// Per peer, the counts of what this rank's thread queued so far (every call adds to them):
/// what the host's enqueue words carry, for the gate. The device words carry the same values
/// at every call.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Counts {
    pub sent: u32,
    pub received: u32,
    pub calls_sent: u32,
    pub calls_received: u32,
    /// One-launch kernels the communicator launched (the count both ranks publish on
    /// launching; the kernels' own pair counts live on the device, `ll`).
    pub ll_with: u32,
}

/// What a stream does for [`emit`]: the CUDA driver on a caller's stream, or (in tests) the
/// host, at once.
pub(crate) trait DeviceStream {
    /// # Safety
    /// Both ranges valid device-reachable memory until the copy has run.
    unsafe fn copy(&mut self, dst: u64, src: u64, len: usize) -> Result<()>;
    /// `dst = a ⊕ b` over `len` bytes, with the call's datatype and operator, and the result
    /// also at `dst2` unless it is 0 (apart from `a` and `b`).
    ///
    /// # Safety
    /// As for `copy`.
    unsafe fn reduce(&mut self, dst: u64, a: u64, b: u64, dst2: u64, len: usize) -> Result<()>;
    /// The stream waits until the word at device address `word` reaches `value` (wrapping).
    ///
    /// # Safety
    /// A live, device-mapped word.
    unsafe fn wait(&mut self, word: u64, value: u32) -> Result<()>;
    /// The stream writes `value` into the word, after its work before.
    ///
    /// # Safety
    /// As for `wait`.
    unsafe fn signal(&mut self, word: u64, value: u32) -> Result<()>;
}

/// Whether counter `now` has reached `value` (both wrap), as `CU_STREAM_WAIT_VALUE_GEQ` judges.
pub(crate) fn reached(now: u32, value: u32) -> bool {
    (now.wrapping_sub(value) as i32) >= 0
}

/// The host's polls before a wait on a peer sharing this context: bounded, and abortable.
pub(crate) struct Gate<'a> {
    pub deadline: Instant,
    pub abort: &'a AtomicBool,
    pub rank: u32,
}

impl Gate<'_> {
    pub(crate) fn until(&self, word: &Word, value: u32, peer: u32, what: &str) -> Result<()> {
        let begun = Instant::now();
        let mut rounds = 0u32;
        while !reached(word.host().load(Ordering::Acquire), value) {
            rounds += 1;
            if rounds % 64 == 0 {
                if self.abort.load(Ordering::Relaxed) {
                    return Err(Error::Aborted);
                }
                if Instant::now() >= self.deadline {
                    return Err(Error::Timeout {
                        rank: self.rank,
                        secs: begun.elapsed().as_secs_f64(),
                        call: "a device call".into(),
                        waiting: format!(
                            "rank {peer}, a thread of this process on the same device, to enqueue {what} (ranks on one device from one thread need a group call)"
                        ),
                    });
                }
            }
            if rounds < 256 {
                std::hint::spin_loop();
            } else if rounds < 4096 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(20));
            }
        }
        Ok(())
    }
}

/// One wait of a call: the word, the value it waits for, and whose it is (for the host's
/// report of what a stuck call waits for).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Wait {
    pub word: Word,
    pub value: u32,
    pub peer: u32,
    /// Its peer's messages arriving, else its peer reading this rank's earlier ones.
    pub arrival: bool,
    /// A word, and a count, that say the wait is over for good once the word reaches it: for
    /// an arrival of the call's last piece, this rank's "read" count of the pair, which its
    /// stream writes once it has read the call's messages (before it sets the arrival word
    /// back to 0).
    pub over: Option<(Word, u32)>,
    /// Whether it is a wait of the call's last piece (the pieces run in order, so those being
    /// over means the peer's part is done).
    pub last: bool,
}

impl Wait {
    /// The word's value now, and whether the wait is over.
    fn now(&self) -> (u32, bool) {
        let now = self.word.host().load(Ordering::Acquire);
        let over = self.over.is_some_and(|(w, v)| reached(w.host().load(Ordering::Acquire), v));
        (now, over || reached(now, self.value))
    }
}

/// The values every wait of one call waits for: stored by the host, they release a stream
/// whose call failed (a peer gone, a timeout, an abort), so that it never hangs.
#[derive(Debug, Default)]
pub(crate) struct Release(pub Vec<Wait>);

impl Release {
    pub(crate) fn release(&self) {
        for w in &self.0 {
            // The word itself, whatever `over` says: a later piece of the call waits on it anew.
            let word = w.word.host();
            if !reached(word.load(Ordering::Acquire), w.value) {
                word.store(w.value, Ordering::Release);
            }
        }
    }

    /// Each wait, with its word's value and whether it is over now.
    pub(crate) fn state(&self) -> impl Iterator<Item = (&Wait, u32, bool)> + '_ {
        self.0.iter().map(|w| {
            let (now, over) = w.now();
            (w, now, over)
        })
    }
}

/// The waits of `prog`, a piece of a call (`last`: its last), made before anything is queued:
/// per peer it receives from, all the piece's messages landed; per peer it sends to, the
/// window free.
pub(crate) fn release_of(
    prog: &ResidentProgram,
    links: &[Option<ResidentLink>],
    counts: &[Counts],
    last: bool,
) -> Result<Release> {
    let mut out = Vec::new();
    for &(p, n, _) in &prog.from {
        let (l, c) = link_of(links, counts, p)?;
        let over = last.then_some((l.read_out, c.calls_received.wrapping_add(1)));
        out.push(Wait { word: l.arrived_in, value: n, peer: p, arrival: true, over, last });
    }
    for &(p, _, _) in &prog.to {
        let (l, _) = link_of(links, counts, p)?;
        out.push(Wait { word: l.consumed_in, value: 1, peer: p, arrival: false, over: None, last });
    }
    Ok(Release(out))
}

fn link_of<'l>(
    links: &'l [Option<ResidentLink>],
    counts: &'l [Counts],
    p: u32,
) -> Result<(&'l ResidentLink, &'l Counts)> {
    match (links.get(p as usize).and_then(Option::as_ref), counts.get(p as usize)) {
        (Some(l), Some(c)) => Ok((l, c)),
        _ => Err(Error::Internal(format!("a device-resident call with rank {p}, which is no device peer"))),
    }
}

/// Puts `prog` (a piece of a call; `last`: its last) on `stream` over the buffers of `mem`, and
/// advances `counts` past it.
///
/// # Safety
/// The regions of `mem` must be valid device memory the stream's device reaches until the
/// stream has passed the call, used by nothing else meanwhile; the links' windows and words
/// must stay alive as long.
pub(crate) unsafe fn emit(
    prog: &ResidentProgram,
    mem: &Memory,
    links: &[Option<ResidentLink>],
    counts: &mut [Counts],
    stream: &mut dyn DeviceStream,
    gate: &Gate<'_>,
    last: bool,
) -> Result<()> {
    // From byte `at` of `loc` on: its address and how many bytes lie end to end there (a
    // piece's buffers are blocks apart, `Memory::segment`; windows are one run).
    let seg = |loc: Loc, at: usize, write: bool| -> Result<(u64, usize)> {
        match loc {
            Loc::Buf(s) => mem.segment(s, at, write).map(|r| (r.addr as u64, r.len)),
            Loc::Rx { peer, off, len } => {
                Ok((link_of(links, counts, peer)?.0.rx_window + (off + at) as u64, len.saturating_sub(at)))
            }
            Loc::Tx { peer, off, len } => {
                Ok((link_of(links, counts, peer)?.0.tx_window + (off + at) as u64, len.saturating_sub(at)))
            }
        }
    };
    for item in &prog.items {
        match *item {
            Item::Copy { dst, src } => {
                let n = dst.len();
                if n != src.len() {
                    return Err(Error::Internal(format!("a device copy of {} bytes into {n}", src.len())));
                }
                let mut at = 0;
                while at < n {
                    let ((d, dn), (s, sn)) = (seg(dst, at, true)?, seg(src, at, false)?);
                    let run = dn.min(sn);
                    if run == 0 {
                        return Err(Error::Internal(format!("a device copy with nothing at byte {at} of {n}")));
                    }
                    if d != s {
                        // SAFETY: runs of the call's buffers (this fn's contract, bounds-checked
                        // by `Memory::segment`) or message ranges inside the windows (`fits`).
                        unsafe { stream.copy(d, s, run)? };
                    }
                    at += run;
                }
            }
            Item::Reduce { dst, a, b, also } => {
                let n = dst.len();
                if also.is_some_and(|l| l.len() != n) {
                    return Err(Error::Internal(format!("a device reduction of {n} bytes sent as another length")));
                }
                let mut at = 0;
                while at < n {
                    let ((d, dn), (x, xn), (y, yn)) = (seg(dst, at, true)?, seg(a, at, false)?, seg(b, at, false)?);
                    let (d2, d2n) = match also {
                        Some(l) => seg(l, at, true)?,
                        None => (0, usize::MAX),
                    };
                    let run = dn.min(xn).min(yn).min(d2n);
                    if run == 0 {
                        return Err(Error::Internal(format!("a device reduction with nothing at byte {at} of {n}")));
                    }
                    // SAFETY: as for the copy; the second destination is a message range of a
                    // peer's window, apart from both operands.
                    unsafe { stream.reduce(d, x, y, d2, run)? };
                    at += run;
                }
            }
            // The device words carry the same values at every call (`topoccl_transports::ipc`'s
            // resident words); the host's gate polls the enqueued counts, which go on growing.
            Item::Arrival { peer, index } => {
                let (l, c) = link_of(links, counts, peer)?;
                if l.same_context {
                    gate.until(&l.arrived_in_enq, c.received.wrapping_add(index + 1), peer, "its message")?;
                }
                // SAFETY: a word of the pair's page, alive with the link (this fn's contract).
                unsafe { stream.wait(l.arrived_in.device, index + 1)? };
            }
            Item::Landed { peer, index } => {
                let (l, c) = link_of(links, counts, peer)?;
                // SAFETY: as above.
                unsafe { stream.signal(l.arrived_out.device, index + 1)? };
                l.arrived_out_enq.host().store(c.sent.wrapping_add(index + 1), Ordering::Release);
            }
            Item::Room { peer } => {
                let (l, c) = link_of(links, counts, peer)?;
                if l.same_context && c.calls_sent != 0 {
                    gate.until(&l.consumed_in_enq, c.calls_sent, peer, "its read of the previous call")?;
                }
                // SAFETY: as above.
                unsafe {
                    stream.wait(l.consumed_in.device, 1)?;
                    stream.signal(l.consumed_in.device, 0)?;
                }
            }
        }
    }
    for &(p, _, _) in &prog.from {
        let (l, c) = link_of(links, counts, p)?;
        // SAFETY: as above; queued after every read of the window: in a call's last piece the
        // count of calls read (for the host's watch, which reads that piece's alone), its
        // arrivals back at 0, then the window free for the peer's next call.
        unsafe {
            if last {
                stream.signal(l.read_out.device, c.calls_received.wrapping_add(1))?;
            }
            stream.signal(l.arrived_in.device, 0)?;
            stream.signal(l.consumed_out.device, 1)?;
        }
        l.consumed_out_enq.host().store(c.calls_received.wrapping_add(1), Ordering::Release);
    }
    for &(p, n, _) in &prog.to {
        if let Some(c) = counts.get_mut(p as usize) {
            c.sent = c.sent.wrapping_add(n);
            c.calls_sent = c.calls_sent.wrapping_add(1);
        }
    }
    for &(p, n, _) in &prog.from {
        if let Some(c) = counts.get_mut(p as usize) {
            c.received = c.received.wrapping_add(n);
            c.calls_received = c.calls_received.wrapping_add(1);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;

//! Windows and one-sided puts on host memory (NCCL 2.27's `ncclCommWindowRegister`, 2.29's
//! `ncclPutSignal`, `ncclSignal`, `ncclWaitSignal`).
//!
//! Registration is collective, so every rank numbers its windows alike, and a handle names a
//! window of every rank: a put through it lands in the target's window of that number. A put
//! travels on the communicator's put lane ([`topoccl::Lane::Put`], never mixed with
//! send/recv) as a descriptor (window, offset, length, signal) and then its bytes. The
//! target applies puts in arrival order when it waits for signals, writing each into its
//! window after checking the range against what it registered; that wait is also the point
//! where NCCL makes a put's data visible to the target. Signals that arrive for another index
//! are counted for later waits. A sender's put returns once its bytes are on their way
//! (transports read incoming messages ahead of the receive that takes them, so two ranks
//! putting to each other do not deadlock).

use std::collections::HashMap;

use topoccl::{Buffer, Communicator, Dtype, Lane};

use crate::error::{invalid, Error, Result};

/// Bytes of a put's descriptor.
const DESCRIPTOR_BYTES: usize = 32;
/// The window number of a signal without data.
const NO_WINDOW: u32 = u32::MAX;

/// One put as it travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Put {
    pub window: u32,
    pub signal: u32,
    pub ctx: u32,
    pub offset: u64,
    pub bytes: u64,
}

impl Put {
    fn encode(&self) -> [u8; DESCRIPTOR_BYTES] {
        let mut d = [0u8; DESCRIPTOR_BYTES];
        d[0..4].copy_from_slice(&self.window.to_le_bytes());
        d[4..8].copy_from_slice(&self.signal.to_le_bytes());
        d[8..12].copy_from_slice(&self.ctx.to_le_bytes());
        d[16..24].copy_from_slice(&self.offset.to_le_bytes());
        d[24..32].copy_from_slice(&self.bytes.to_le_bytes());
        d
    }

    fn decode(d: &[u8; DESCRIPTOR_BYTES]) -> Put {
        let u32_at = |i: usize| u32::from_le_bytes([d[i], d[i + 1], d[i + 2], d[i + 3]]);
        let u64_at = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&d[i..i + 8]);
            u64::from_le_bytes(b)
        };
        Put { window: u32_at(0), signal: u32_at(4), ctx: u32_at(8), offset: u64_at(16), bytes: u64_at(24) }
    }
}

/// A communicator's windows and the signals that arrived ahead of their waits.
#[derive(Default)]
pub struct Windows {
    /// (base address, length) by window number; `None` once deregistered.
    list: Vec<Option<(usize, usize)>>,
    /// Signals received and not yet waited for, by (peer, signal index, context).
    arrived: HashMap<(u32, u32, u32), u64>,
}

impl Windows {
    /// Registers `len` bytes at `base`: the window's number.
    pub fn register(&mut self, base: usize, len: usize) -> Result<u32> {
        let n = u32::try_from(self.list.len()).ok().filter(|n| *n != NO_WINDOW);
        let n = n.ok_or_else(|| invalid("too many windows on this communicator"))?;
        self.list.push(Some((base, len)));
        Ok(n)
    }

    pub fn deregister(&mut self, n: u32) -> Result<()> {
        match self.list.get_mut(n as usize) {
            Some(slot @ Some(_)) => {
                *slot = None;
                Ok(())
            }
            _ => Err(invalid(format!("window {n} is not registered on this communicator"))),
        }
    }

    /// The range of window `n`.
    pub fn get(&self, n: u32) -> Result<(usize, usize)> {
        self.list
            .get(n as usize)
            .copied()
            .flatten()
            .ok_or_else(|| invalid(format!("window {n} is not registered on this communicator")))
    }

    /// Where a put of `bytes` at `offset` into window `n` lands, if it fits.
    fn target(&self, n: u32, offset: u64, bytes: u64) -> Option<usize> {
        let (base, len) = self.get(n).ok()?;
        let end = offset.checked_add(bytes)?;
        (end <= len as u64).then(|| base + offset as usize)
    }
}

/// Sends one put (or a bare signal: `data` empty, `put.window` = [`NO_WINDOW`]) to `peer`.
///
/// # Safety
/// `data` must be valid for reads of `put.bytes` bytes for the call.
pub unsafe fn send(
    comm: &Communicator,
    windows: &std::sync::Mutex<Windows>,
    peer: u32,
    put: Put,
    data: Buffer,
) -> Result<()> {
    if peer == comm.rank() {
        // A put to oneself is a local copy and a signal.
        let mut w = windows.lock().unwrap_or_else(|p| p.into_inner());
        if put.bytes > 0 {
            let dst = w.target(put.window, put.offset, put.bytes).ok_or_else(|| out_of_range(peer, &put, &w))?;
            // SAFETY: the source is the caller's (this fn's contract); the destination lies
            // inside a window this rank registered (checked just above), which its owner keeps
            // valid while registered.
            unsafe { std::ptr::copy(data.addr as *const u8, dst as *mut u8, put.bytes as usize) };
        }
        *w.arrived.entry((peer, put.signal, put.ctx)).or_default() += 1;
        return Ok(());
    }
    let descriptor = put.encode();
    let mut g = comm.group_on(Lane::Put);
    // SAFETY: the descriptor lives until `end` returns, which waits for the sends; the data is
    // valid by this fn's contract.
    unsafe {
        g.send_raw(Buffer::host(descriptor.as_ptr()), Dtype::Uint8, DESCRIPTOR_BYTES, peer)?;
        if put.bytes > 0 {
            g.send_raw(data, Dtype::Uint8, put.bytes as usize, peer)?;
        }
    }
    g.end().map_err(Error::from)
}

/// Waits until `count` signals of (`signal`, `ctx`) from `peer` have arrived, applying every
/// put that arrives from `peer` meanwhile, and consumes them.
pub fn wait(
    comm: &Communicator,
    windows: &std::sync::Mutex<Windows>,
    peer: u32,
    signal: u32,
    ctx: u32,
    count: u64,
) -> Result<()> {
    let key = (peer, signal, ctx);
    loop {
        {
            let mut w = windows.lock().unwrap_or_else(|p| p.into_inner());
            let have = w.arrived.entry(key).or_default();
            if *have >= count {
                *have -= count;
                return Ok(());
            }
        }
        if peer == comm.rank() {
            return Err(invalid(format!(
                "waiting for {count} signals {signal} (context {ctx}) from this rank itself, which has sent fewer"
            )));
        }
        receive_one(comm, windows, peer)?;
    }
}

/// Takes the next put from `peer` and applies it.
fn receive_one(comm: &Communicator, windows: &std::sync::Mutex<Windows>, peer: u32) -> Result<()> {
    let mut descriptor = [0u8; DESCRIPTOR_BYTES];
    let mut g = comm.group_on(Lane::Put);
    // SAFETY: the descriptor is ours and outlives `end`, which waits for the receive.
    unsafe { g.recv_raw(Buffer::host(descriptor.as_mut_ptr()), Dtype::Uint8, DESCRIPTOR_BYTES, peer)? };
    g.end()?;
    let put = Put::decode(&descriptor);
    if put.bytes > 0 {
        let bytes = usize::try_from(put.bytes).map_err(|_| invalid(format!("rank {peer} put {} bytes", put.bytes)))?;
        let target = windows.lock().unwrap_or_else(|p| p.into_inner()).target(put.window, put.offset, put.bytes);
        let mut discard = Vec::new();
        let dst = match target {
            Some(addr) => addr,
            None => {
                // Take the bytes anyway, so the stream stays in step, then report.
                discard.resize(bytes, 0u8);
                discard.as_mut_ptr() as usize
            }
        };
        let mut g = comm.group_on(Lane::Put);
        // SAFETY: `dst` is inside a window this rank registered (checked by `target`) or our
        // scratch buffer; both outlive `end`, which waits for the receive.
        unsafe { g.recv_raw(Buffer::host(dst as *const u8), Dtype::Uint8, bytes, peer)? };
        g.end()?;
        if target.is_none() {
            let w = windows.lock().unwrap_or_else(|p| p.into_inner());
            return Err(out_of_range(peer, &put, &w));
        }
    }
    let mut w = windows.lock().unwrap_or_else(|p| p.into_inner());
    *w.arrived.entry((peer, put.signal, put.ctx)).or_default() += 1;
    Ok(())
}

fn out_of_range(peer: u32, put: &Put, w: &Windows) -> Error {
    let held = w
        .get(put.window)
        .map_or_else(|_| "is not registered here".to_string(), |(_, len)| format!("holds {len} bytes"));
    invalid(format!(
        "rank {peer} put {} bytes at offset {} of window {}, which {held}",
        put.bytes, put.offset, put.window
    ))
}

pub fn signal_only(signal: u32, ctx: u32) -> Put {
    Put { window: NO_WINDOW, signal, ctx, offset: 0, bytes: 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_round_trip_and_ranges_are_checked() {
        let p = Put { window: 3, signal: 7, ctx: 1, offset: 1 << 40, bytes: 12 };
        assert_eq!(Put::decode(&p.encode()), p);
        let mut w = Windows::default();
        assert_eq!(w.register(0x1000, 64).unwrap(), 0);
        assert_eq!(w.target(0, 60, 4), Some(0x1000 + 60));
        assert_eq!(w.target(0, 61, 4), None);
        assert_eq!(w.target(0, u64::MAX, 2), None);
        assert_eq!(w.target(1, 0, 1), None);
        w.deregister(0).unwrap();
        assert_eq!(w.target(0, 0, 1), None);
        assert!(w.deregister(0).is_err());
    }
}

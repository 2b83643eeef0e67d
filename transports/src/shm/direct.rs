//! Writing straight into the peer's memory: cross-memory attach (`process_vm_writev`), the
//! one-sided put of shared memory between processes. The receiver offers a destination (its own
//! buffer); the sender writes the payload there with one copy instead of two (through the ring
//! and out again) and signals with a frame that carries no payload.
//!
//! It needs the kernel's permission to write another process's memory (same user and ptrace
//! allowed: Docker's default seccomp profile forbids it without `CAP_SYS_PTRACE`), so both sides
//! probe it at set-up and use the ring alone where it fails.
//!
//! **Revocation.** An offer names memory the receiver owns only while its call runs. A call that
//! fails ends with the connection closing, and the receiver must not hand its buffer back while
//! a write may still land there. The two sides follow Dekker's protocol on two flags in the
//! ring's shared header: the writer raises `writing` and then reads `revoked`, and writes only if
//! it was clear; the receiver raises `revoked` and then waits while `writing` is up. With both
//! stores and loads sequentially consistent, at least one side sees the other's flag, so no
//! write starts after the receiver has stopped waiting.

use std::io::IoSlice;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use nix::sys::uio::{process_vm_writev, RemoteIoVec};
use nix::unistd::Pid;

use crate::Region;

/// Messages at least this large go straight to an offered destination (below, a system call
/// costs more than the copy it saves).
pub(crate) const DIRECT_MIN_BYTES: usize = 64 << 10;

/// How long a closing receiver waits for a write in progress (a write of one message takes
/// well under a millisecond; a peer stopped in the middle of one is given up on).
const REVOKE_WAIT: Duration = Duration::from_secs(1);

/// The flags of one direction, in the shared header of its ring.
pub(crate) struct Flags<'a> {
    pub writing: &'a AtomicU32,
    pub revoked: &'a AtomicU32,
}

/// Writes `src` into `len` bytes at `addr` of process `pid`; false if the kernel refused or
/// wrote less.
pub(crate) fn write(pid: u32, addr: usize, src: &[u8]) -> bool {
    let Ok(pid) = i32::try_from(pid) else { return false };
    let local = [IoSlice::new(src)];
    let remote = [RemoteIoVec { base: addr, len: src.len() }];
    matches!(process_vm_writev(Pid::from_raw(pid), &local, &remote), Ok(n) if n == src.len())
}

/// The writer's side: writes `src` to the peer's offered `dst` unless the peer has revoked its
/// offers; false when it did not write (revoked, or refused).
pub(crate) fn put(flags: &Flags<'_>, pid: u32, dst: Region, src: &[u8]) -> bool {
    flags.writing.store(1, Ordering::SeqCst);
    let ok = flags.revoked.load(Ordering::SeqCst) == 0 && write(pid, dst.addr, src);
    flags.writing.store(0, Ordering::SeqCst);
    ok
}

/// The receiver's side: no write lands in its offered memory once this returns.
pub(crate) fn revoke(flags: &Flags<'_>) {
    flags.revoked.store(1, Ordering::SeqCst);
    let deadline = Instant::now() + REVOKE_WAIT;
    while flags.writing.load(Ordering::SeqCst) != 0 && Instant::now() < deadline {
        std::thread::yield_now();
    }
}

/// A place in this process for the peer's probe write.
pub(crate) struct Probe(Box<[u8; 8]>);

/// What a successful probe write leaves.
pub(crate) const PROBE_MAGIC: [u8; 8] = *b"tccl-cma";

impl Probe {
    pub(crate) fn new() -> Probe {
        Probe(Box::new([0; 8]))
    }

    pub(crate) fn addr(&self) -> usize {
        self.0.as_ptr() as usize
    }

    /// Whether the peer's write arrived.
    pub(crate) fn written(&self) -> bool {
        // The peer wrote through the kernel before it said so on the control stream, which
        // this side read first: the bytes are there.
        // SAFETY: a live box of 8 bytes; the volatile read keeps the compiler from assuming
        // it still holds the zeroes it was made with.
        let got = unsafe { std::ptr::read_volatile(self.0.as_ptr().cast::<[u8; 8]>()) };
        got == PROBE_MAGIC
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_into_this_process_lands_and_revocation_stops_writers() {
        let probe = Probe::new();
        if !write(std::process::id(), probe.addr(), &PROBE_MAGIC) {
            eprintln!("skipped: process_vm_writev is not permitted here");
            return;
        }
        assert!(probe.written());
        let (writing, revoked) = (AtomicU32::new(0), AtomicU32::new(0));
        let flags = Flags { writing: &writing, revoked: &revoked };
        let mut dst = [0u8; 4];
        assert!(put(&flags, std::process::id(), Region::of_mut(&mut dst), b"abcd"));
        assert_eq!(&dst, b"abcd");
        revoke(&flags);
        assert!(!put(&flags, std::process::id(), Region::of_mut(&mut dst), b"wxyz"));
        assert_eq!(&dst, b"abcd");
    }
}

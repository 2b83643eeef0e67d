//! `SIGUSR1` asks a running job for its table of calls in flight: the handler only writes a
//! byte to a pipe (what a signal handler may do), and the watch service's thread, which polls
//! the pipe, does the rest.
//!
//! The handler is installed only where `SIGUSR1` still has its default action (which would
//! kill the process), so a program that handles the signal itself keeps its handler;
//! `TOPOCCL_DUMP_SIGNAL=off` leaves it alone entirely.

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicI32, Ordering};

use nix::libc;

/// The pipe's write end, for the handler (`-1`: none).
static WAKE_FD: AtomicI32 = AtomicI32::new(-1);

extern "C" fn on_signal(_: libc::c_int) {
    let fd = WAKE_FD.load(Ordering::Relaxed);
    if fd >= 0 {
        let byte = 1u8;
        // SAFETY: `write` is async-signal-safe; `fd` is the pipe's write end, which lives for
        // the rest of the process (it is leaked on installation), and `byte` outlives the call.
        // A full pipe (requests already pending) loses nothing worth keeping.
        unsafe { libc::write(fd, (&byte as *const u8).cast(), 1) };
    }
}

/// Installs the handler if the signal is unhandled and the user allows it; the pipe's read end
/// to poll (readable when a table is asked for).
pub(crate) fn install() -> Option<OwnedFd> {
    if crate::env::var("TOPOCCL_DUMP_SIGNAL").is_some_and(|v| matches!(v.as_str(), "off" | "none" | "0")) {
        return None;
    }
    let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_NONBLOCK | nix::fcntl::OFlag::O_CLOEXEC).ok()?;
    // SAFETY: an all-zero `sigaction` is a valid value of the plain C struct, overwritten below.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: a NULL new action only reads the current one into `old`, a valid out-pointer.
    if unsafe { libc::sigaction(libc::SIGUSR1, std::ptr::null(), &mut old) } != 0 || old.sa_sigaction != libc::SIG_DFL {
        return None;
    }
    WAKE_FD.store(write.as_raw_fd(), Ordering::Relaxed);
    std::mem::forget(write);
    // SAFETY: as above, a zeroed `sigaction` is valid; its fields are set before use.
    let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
    action.sa_sigaction = on_signal as *const () as usize;
    action.sa_flags = libc::SA_RESTART;
    // SAFETY: `action` is initialised, its handler only calls `write` (async-signal-safe), and
    // an empty mask is what `sigemptyset` writes into the struct it is given.
    let ok = unsafe {
        libc::sigemptyset(&mut action.sa_mask);
        libc::sigaction(libc::SIGUSR1, &action, std::ptr::null_mut()) == 0
    };
    ok.then_some(read)
}

/// Empties the pipe; whether anything was in it.
pub(crate) fn drain(fd: RawFd) -> bool {
    let mut buf = [0u8; 64];
    let mut any = false;
    // SAFETY: `fd` is the pipe's non-blocking read end and `buf` a writable buffer of its
    // length.
    while unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) } > 0 {
        any = true;
    }
    any
}

//! Sleeping until a connection may progress: `poll(2)` on the descriptors that matter, with a
//! timeout so that deadlines and aborts are checked even when nothing arrives.

use std::os::fd::BorrowedFd;
use std::time::Duration;

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use crate::error::{Error, Result};
use crate::WaitFd;

/// Blocks until one of `fds` is ready or `timeout` passes. Interruptions count as a wake-up.
pub fn wait(fds: &[WaitFd], timeout: Duration) -> Result<()> {
    let ms = PollTimeout::try_from(timeout.as_millis().min(i32::MAX as u128) as i32).unwrap_or(PollTimeout::MAX);
    if fds.is_empty() {
        std::thread::sleep(timeout);
        return Ok(());
    }
    let mut pfds: Vec<PollFd<'_>> = fds
        .iter()
        .map(|w| {
            let mut events = PollFlags::POLLIN;
            if w.write {
                events |= PollFlags::POLLOUT;
            }
            // SAFETY: every descriptor in `fds` belongs to a connection the caller holds for
            // the duration of this call, so it stays open while borrowed.
            let fd = unsafe { BorrowedFd::borrow_raw(w.fd) };
            PollFd::new(fd, events)
        })
        .collect();
    match poll(&mut pfds, ms) {
        Ok(_) | Err(nix::errno::Errno::EINTR) => Ok(()),
        Err(e) => Err(Error::io("poll", std::io::Error::from(e))),
    }
}

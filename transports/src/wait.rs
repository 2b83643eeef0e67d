//! Sleeping until a connection may progress: `ppoll(2)` on the descriptors that matter, with a
//! timeout so that deadlines and aborts are checked even when nothing arrives.

use std::os::fd::BorrowedFd;
use std::time::Duration;

use nix::poll::{ppoll, PollFd, PollFlags};
use nix::sys::time::TimeSpec;

use crate::error::{Error, Result};
use crate::WaitFd;

/// Blocks until one of `fds` is ready or `timeout` passes. Interruptions count as a wake-up.
/// The timeout keeps its precision below a millisecond (`ppoll(2)`): shared memory's short
/// naps must sleep, or a rank that waits on a peer sharing its core never lets it run.
pub fn wait(fds: &[WaitFd], timeout: Duration) -> Result<()> {
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
    match ppoll(&mut pfds, Some(TimeSpec::from_duration(timeout)), None) {
        Ok(_) | Err(nix::errno::Errno::EINTR) => Ok(()),
        Err(e) => Err(Error::io("ppoll", std::io::Error::from(e))),
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixStream;
    use std::time::Instant;

    use super::*;

    /// A nap shorter than a millisecond sleeps (poll(2)'s milliseconds made 500 µs a
    /// `poll(…, 0)`, which returns at once: a waiting rank then spun on its core forever).
    #[test]
    fn a_nap_below_a_millisecond_sleeps() {
        let (a, _b) = UnixStream::pair().expect("socketpair");
        let fds = [WaitFd { fd: a.as_raw_fd(), write: false }];
        let t = Instant::now();
        for _ in 0..10 {
            wait(&fds, Duration::from_micros(500)).expect("wait");
        }
        assert!(t.elapsed() >= Duration::from_millis(5), "10 naps of 500 µs took {:?}", t.elapsed());
    }

    #[test]
    fn a_ready_descriptor_wakes_at_once() {
        let (a, b) = UnixStream::pair().expect("socketpair");
        std::io::Write::write_all(&mut &b, b"x").expect("write");
        let fds = [WaitFd { fd: a.as_raw_fd(), write: false }];
        let t = Instant::now();
        wait(&fds, Duration::from_secs(10)).expect("wait");
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    }
}

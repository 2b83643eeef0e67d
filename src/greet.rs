//! Accepting connections that must introduce themselves: the rendezvous service and the data
//! listener both take connections from anyone who can reach the port, and only some are ranks
//! of this job.
//!
//! A [`Greeter`] serves every connection at once, without blocking on any: it reads each one's
//! fixed-size hello as bytes arrive, drops a connection as soon as the bytes so far differ from
//! the expected prefix (the magic and the job's secret), gives each its own short deadline, and
//! holds at most a fixed number of unauthenticated connections (the longest-waiting one goes
//! when another arrives). So idle connections (a port scanner, a health check, a second job
//! pointed at the wrong port) cannot hold up the ranks behind them, and memory per stranger is
//! one fixed-size slot.

use std::io::{ErrorKind, Read};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// How long a connection may take to send its hello. A rank sends it right after connecting.
pub(crate) const HELLO_DEADLINE: Duration = Duration::from_secs(5);
/// Unauthenticated connections held at once.
pub(crate) const MAX_UNGREETED: usize = 64;

struct Ungreeted<const N: usize> {
    stream: TcpStream,
    hello: [u8; N],
    got: usize,
    since: Instant,
}

/// Connections accepted on one listener whose `N`-byte hello has not fully arrived yet.
pub(crate) struct Greeter<const N: usize> {
    pending: Vec<Ungreeted<N>>,
    deadline: Duration,
    cap: usize,
    /// Connections dropped so far (wrong prefix, too slow, or evicted), for diagnostics.
    pub dropped: usize,
}

impl<const N: usize> Greeter<N> {
    pub(crate) fn new(deadline: Duration, cap: usize) -> Greeter<N> {
        Greeter { pending: Vec::new(), deadline, cap: cap.max(1), dropped: 0 }
    }

    /// Accepts every connection waiting on `listener` (which must be non-blocking) and reads
    /// what each pending one has sent. Connections whose hello is complete and starts with
    /// `prefix` go to `greeted` (back in blocking mode, without a read timeout); the others
    /// are kept, or dropped as described in the module documentation. Returns whether anything
    /// happened (so the caller sleeps only when nothing did).
    pub(crate) fn poll(
        &mut self,
        listener: &TcpListener,
        prefix: &[u8],
        greeted: &mut Vec<(TcpStream, [u8; N])>,
    ) -> std::io::Result<bool> {
        let mut moved = false;
        loop {
            match listener.accept() {
                Ok((stream, _)) => {
                    moved = true;
                    if stream.set_nonblocking(true).is_err() {
                        self.dropped += 1;
                        continue;
                    }
                    if self.pending.len() >= self.cap {
                        // The oldest is the likeliest stranger: a rank's hello follows its
                        // connect at once.
                        self.pending.remove(0);
                        self.dropped += 1;
                    }
                    self.pending.push(Ungreeted { stream, hello: [0; N], got: 0, since: Instant::now() });
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if matches!(e.kind(), ErrorKind::Interrupted | ErrorKind::ConnectionAborted) => continue,
                // Out of descriptors, say: the pending connections still progress.
                Err(e) if self.pending.is_empty() => return Err(e),
                Err(_) => break,
            }
        }
        let now = Instant::now();
        let mut i = 0;
        while i < self.pending.len() {
            let p = &mut self.pending[i];
            let keep = match read_some(p) {
                Ok(n) => {
                    moved |= n > 0;
                    let seen = p.got.min(prefix.len());
                    if p.hello[..seen] != prefix[..seen] {
                        false
                    } else if p.got == N {
                        let done = self.pending.swap_remove(i);
                        if done.stream.set_nonblocking(false).is_ok() {
                            greeted.push((done.stream, done.hello));
                        } else {
                            self.dropped += 1;
                        }
                        moved = true;
                        continue;
                    } else {
                        now.duration_since(p.since) < self.deadline
                    }
                }
                Err(()) => false,
            };
            if keep {
                i += 1;
            } else {
                self.pending.swap_remove(i);
                self.dropped += 1;
                moved = true;
            }
        }
        Ok(moved)
    }

    /// Connections still introducing themselves.
    #[cfg(test)]
    pub(crate) fn pending(&self) -> usize {
        self.pending.len()
    }
}

/// Reads what has arrived of `p`'s hello; `Err` once the connection is closed or broken.
fn read_some<const N: usize>(p: &mut Ungreeted<N>) -> Result<usize, ()> {
    let mut total = 0;
    while p.got < N {
        match p.stream.read(&mut p.hello[p.got..]) {
            Ok(0) => return Err(()),
            Ok(n) => {
                p.got += n;
                total += n;
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(_) => return Err(()),
        }
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn listener() -> TcpListener {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.set_nonblocking(true).unwrap();
        l
    }

    fn poll_until<const N: usize>(
        g: &mut Greeter<N>,
        l: &TcpListener,
        prefix: &[u8],
        out: &mut Vec<(TcpStream, [u8; N])>,
        done: impl Fn(&Greeter<N>, &[(TcpStream, [u8; N])]) -> bool,
    ) {
        let until = Instant::now() + Duration::from_secs(10);
        while !done(g, out) {
            assert!(Instant::now() < until, "timed out");
            if !g.poll(l, prefix, out).unwrap() {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }

    #[test]
    fn idle_and_foreign_connections_do_not_hold_up_a_rank() {
        let l = listener();
        let addr = l.local_addr().unwrap();
        let mut g = Greeter::<8>::new(Duration::from_secs(60), 16);
        // Idle strangers, a stranger with the wrong secret, one that hangs up half-way.
        let idle: Vec<_> = (0..6).map(|_| TcpStream::connect(addr).unwrap()).collect();
        TcpStream::connect(addr).unwrap().write_all(b"KEYwrong").unwrap();
        TcpStream::connect(addr).unwrap().write_all(b"KEY").unwrap();
        // A rank, sending its hello in two pieces.
        let mut rank = TcpStream::connect(addr).unwrap();
        rank.write_all(b"KEY1").unwrap();
        let mut out = Vec::new();
        let t0 = Instant::now();
        poll_until(&mut g, &l, b"KEY1", &mut out, |g, _| g.dropped >= 2);
        rank.write_all(b"rest").unwrap();
        poll_until(&mut g, &l, b"KEY1", &mut out, |_, out| !out.is_empty());
        assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
        assert_eq!(&out[0].1, b"KEY1rest");
        assert_eq!(g.pending(), 6, "the idle ones wait out their deadline");
        drop(idle);
    }

    #[test]
    fn slow_strangers_time_out_and_a_flood_is_capped() {
        let l = listener();
        let addr = l.local_addr().unwrap();
        let mut g = Greeter::<4>::new(Duration::from_millis(200), 4);
        let flood: Vec<_> = (0..10).map(|_| TcpStream::connect(addr).unwrap()).collect();
        let mut out = Vec::new();
        poll_until(&mut g, &l, b"OK", &mut out, |g, _| g.dropped >= 6);
        assert_eq!(g.pending(), 4, "at most the cap is held");
        // A rank arriving during the flood is still served.
        TcpStream::connect(addr).unwrap().write_all(b"OK!!").unwrap();
        poll_until(&mut g, &l, b"OK", &mut out, |_, out| !out.is_empty());
        poll_until(&mut g, &l, b"OK", &mut out, |g, _| g.pending() == 0);
        assert_eq!(g.dropped, 10);
        drop(flood);
    }
}

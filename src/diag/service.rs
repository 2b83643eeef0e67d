//! The process's watch service: one listening socket and one thread for every communicator in
//! the process, started with the first. It answers questions about the boards registered with
//! it (by communicator id and the job's secret), stores the verdicts peers send, and prints the
//! table of calls in flight when `SIGUSR1` arrives.
//!
//! Its connections are greeted like the rendezvous's ([`Greeter`]): served all at once, each
//! with its own short deadline, at most a fixed number held, and a request whose secret and
//! communicator match no board is answered "unknown" without touching anything.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use nix::poll::{PollFd, PollFlags, PollTimeout};

use super::protocol::{self, Kind, Request, MAX_BODY_BYTES, REQUEST_BYTES};
use super::{dump, signal, Board, Status, Verdict};
use crate::error::{Error, Result};
use crate::greet::{Greeter, HELLO_DEADLINE, MAX_UNGREETED};

/// How long a greeted connection may take to send its body and read its answer.
const IO_DEADLINE: Duration = Duration::from_millis(500);

/// Closed communicators whose last status is still answered.
const CLOSED_KEPT: usize = 64;

struct Service {
    port: u16,
    boards: Mutex<Vec<Weak<Board>>>,
    /// The last status of communicators that failed and were closed, newest last: a rank that
    /// adopted a verdict and closed must still tell it to a rank that failed later, because of
    /// that closing, and never heard it (the verdict's sender could not reach it).
    closed: Mutex<std::collections::VecDeque<Closed>>,
}

/// A closed communicator's last status, under its secret and id.
struct Closed {
    secret: [u8; 16],
    comm_id: [u8; 16],
    status: Status,
}

static SERVICE: OnceLock<std::result::Result<Arc<Service>, String>> = OnceLock::new();

fn service() -> Result<&'static Arc<Service>> {
    SERVICE
        .get_or_init(|| start().map_err(|e| e.to_string()))
        .as_ref()
        .map_err(|e| Error::Bootstrap(format!("starting the watch service: {e}")))
}

fn start() -> Result<Arc<Service>> {
    let listener = TcpListener::bind(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0))
        .map_err(|e| Error::io("opening the watch service's socket", e))?;
    listener.set_nonblocking(true).map_err(|e| Error::io("the watch service's socket", e))?;
    let port = listener.local_addr().map_err(|e| Error::io("the watch service's address", e))?.port();
    let svc = Arc::new(Service { port, boards: Mutex::new(Vec::new()), closed: Mutex::default() });
    let wake = signal::install();
    let served = svc.clone();
    std::thread::Builder::new()
        .name("topoccl-watch".into())
        .spawn(move || served.serve(listener, wake))
        .map_err(|e| Error::io("starting the watch service", e))?;
    Ok(svc)
}

/// The port of this process's watch service (started on first use).
pub(crate) fn port() -> Result<u16> {
    service().map(|s| s.port)
}

/// Makes `board` answerable until it is dropped.
pub(crate) fn register(board: &Arc<Board>) -> Result<()> {
    let svc = service()?;
    let mut boards = svc.lock();
    boards.retain(|b| b.strong_count() > 0);
    boards.push(Arc::downgrade(board));
    Ok(())
}

/// Keeps answering `status` (a failed communicator's last) after its board is gone.
pub(crate) fn remember_closed(secret: [u8; 16], comm_id: [u8; 16], status: Status) {
    if let Some(Ok(svc)) = SERVICE.get() {
        let mut closed = svc.closed.lock().unwrap_or_else(|p| p.into_inner());
        if closed.len() == CLOSED_KEPT {
            closed.pop_front();
        }
        closed.push_back(Closed { secret, comm_id, status });
    }
}

/// Every live board of this process.
pub(crate) fn boards() -> Vec<Arc<Board>> {
    match SERVICE.get() {
        Some(Ok(svc)) => svc.lock().iter().filter_map(Weak::upgrade).collect(),
        _ => Vec::new(),
    }
}

impl Service {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Weak<Board>>> {
        // A list of weak references is consistent after any panic.
        self.boards.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn find(&self, r: &Request) -> Option<Arc<Board>> {
        self.lock()
            .iter()
            .filter_map(Weak::upgrade)
            .find(|b| b.id.comm_id == r.comm_id && b.id.secret == r.secret && b.id.rank == r.to)
    }

    fn serve(&self, listener: TcpListener, wake: Option<OwnedFd>) {
        let mut greeter = Greeter::<REQUEST_BYTES>::new(HELLO_DEADLINE, MAX_UNGREETED);
        let mut greeted = Vec::new();
        loop {
            let moved = greeter.poll(&listener, protocol::MAGIC, &mut greeted).unwrap_or(false);
            for (stream, request) in greeted.drain(..) {
                // One slow or broken asker costs its own connection, never the service.
                let _ = self.answer(stream, &request);
            }
            if moved {
                continue;
            }
            let mut fds = vec![PollFd::new(listener.as_fd(), PollFlags::POLLIN)];
            if let Some(w) = &wake {
                fds.push(PollFd::new(w.as_fd(), PollFlags::POLLIN));
            }
            // Short naps: a connection's hello may arrive after its accept.
            let _ = nix::poll::poll(&mut fds, PollTimeout::from(5u8));
            if let Some(w) = &wake {
                use std::os::fd::AsRawFd;
                if signal::drain(w.as_raw_fd()) {
                    // Asking the peers takes up to an answer deadline: not on this thread,
                    // which must keep answering them.
                    let _ = std::thread::Builder::new().name("topoccl-dump".into()).spawn(dump::print_all);
                }
            }
        }
    }

    fn answer(&self, mut s: TcpStream, request: &[u8; REQUEST_BYTES]) -> std::io::Result<()> {
        s.set_read_timeout(Some(IO_DEADLINE))?;
        s.set_write_timeout(Some(IO_DEADLINE))?;
        let Ok(r) = Request::decode(request) else { return Ok(()) };
        let board = self.find(&r);
        let mut body = vec![0u8; r.body.min(MAX_BODY_BYTES)];
        s.read_exact(&mut body)?;
        let status_answer = |status: &Status| {
            let json = serde_json::to_vec(status).unwrap_or_default();
            let mut out = vec![protocol::OK];
            out.extend_from_slice(&(json.len() as u32).to_le_bytes());
            out.extend_from_slice(&json);
            out
        };
        let Some(board) = board else {
            let closed = self.closed.lock().unwrap_or_else(|p| p.into_inner());
            let last =
                closed.iter().rev().find(|c| c.secret == r.secret && c.comm_id == r.comm_id && c.status.rank == r.to);
            return match (r.kind, last) {
                (Kind::Status, Some(c)) => s.write_all(&status_answer(&c.status)),
                _ => s.write_all(&[protocol::UNKNOWN]),
            };
        };
        match r.kind {
            Kind::Status => s.write_all(&status_answer(&board.status())),
            Kind::Verdict => {
                // From the rank that found it, or passed on by one it told.
                match protocol::decode_body::<Verdict>(&body) {
                    Some(v) if (v.found_by as usize) < board.id.watch.len() => {
                        board.set_verdict(v);
                    }
                    _ => return Ok(()),
                }
                s.write_all(&[protocol::OK])
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::protocol::{ask, Answer};
    use super::super::{Identity, Verdict};
    use super::*;

    #[test]
    fn a_closed_communicator_still_tells_its_verdict() {
        let addr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port().unwrap());
        let id = |rank, comm_id| Identity {
            rank,
            secret: [7; 16],
            comm_id,
            watch: vec![addr, addr],
            answer_within: Duration::from_secs(2),
        };
        // Rank 1 adopted a verdict, then closed its communicator.
        let board = Board::new(id(1, [42; 16]));
        register(&board).unwrap();
        board.set_verdict(Verdict { culprits: vec![0, 1], text: "the link broke".into(), found_by: 0, stalled: false });
        drop(board);
        match ask(&id(0, [42; 16]), 1) {
            Answer::Status(s) => {
                assert!(!s.running);
                assert_eq!(s.verdict.map(|v| v.culprits), Some(vec![0, 1]));
            }
            other => panic!("{other}"),
        }
        // One that closed without failing is closed, as before.
        let board = Board::new(id(1, [43; 16]));
        register(&board).unwrap();
        drop(board);
        assert!(matches!(ask(&id(0, [43; 16]), 1), Answer::Closed));
    }
}

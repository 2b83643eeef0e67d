//! The watch service's wire format, and the asking side.
//!
//! A question is one fixed-size request: magic, the job's secret, the communicator's id, the
//! asking rank, the kind, the length of a body that follows (a verdict, in JSON), and the rank
//! asked (several ranks of one communicator may live in one process, behind one service). The
//! answer is a code byte, then for a status query a length and the status in JSON. Every
//! length read is bounded before anything is allocated for it.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use super::{Identity, Status, Verdict};

pub(crate) const MAGIC: &[u8; 4] = b"TCWQ";
pub(crate) const REQUEST_BYTES: usize = 4 + 16 + 16 + 4 + 1 + 4 + 4;
/// The longest status or verdict accepted (a status lists at most a few waits).
pub(crate) const MAX_BODY_BYTES: usize = 64 << 10;

/// What a request asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// "How far are you?": answered with a [`Status`].
    Status = 1,
    /// "This is why the call failed": a [`Verdict`] follows; answered with an acknowledgement.
    Verdict = 2,
}

/// The answer's code byte.
pub(crate) const OK: u8 = 0;
/// No communicator with that id (and secret) lives in the process: it was destroyed, or never
/// made.
pub(crate) const UNKNOWN: u8 = 1;

/// A decoded request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Request {
    pub secret: [u8; 16],
    pub comm_id: [u8; 16],
    pub from: u32,
    pub kind: Kind,
    pub body: usize,
    /// The rank asked.
    pub to: u32,
}

impl Request {
    pub(crate) fn encode(&self) -> [u8; REQUEST_BYTES] {
        let mut b = [0u8; REQUEST_BYTES];
        b[..4].copy_from_slice(MAGIC);
        b[4..20].copy_from_slice(&self.secret);
        b[20..36].copy_from_slice(&self.comm_id);
        b[36..40].copy_from_slice(&self.from.to_le_bytes());
        b[40] = self.kind as u8;
        b[41..45].copy_from_slice(&(self.body as u32).to_le_bytes());
        b[45..49].copy_from_slice(&self.to.to_le_bytes());
        b
    }

    /// The request in `b`, or why it is not one.
    pub(crate) fn decode(b: &[u8; REQUEST_BYTES]) -> Result<Request, &'static str> {
        if &b[..4] != MAGIC {
            return Err("not a watch request");
        }
        let word = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let kind = match b[40] {
            1 => Kind::Status,
            2 => Kind::Verdict,
            _ => return Err("unknown request kind"),
        };
        let body = word(41) as usize;
        if body > MAX_BODY_BYTES || (kind == Kind::Status && body != 0) {
            return Err("request body too long");
        }
        let mut secret = [0u8; 16];
        secret.copy_from_slice(&b[4..20]);
        let mut comm_id = [0u8; 16];
        comm_id.copy_from_slice(&b[20..36]);
        Ok(Request { secret, comm_id, from: word(36), kind, body, to: word(45) })
    }
}

/// Decodes a JSON body of at most [`MAX_BODY_BYTES`].
pub(crate) fn decode_body<T: serde::de::DeserializeOwned>(b: &[u8]) -> Option<T> {
    if b.len() > MAX_BODY_BYTES {
        return None;
    }
    serde_json::from_slice(b).ok()
}

/// What came back from asking a rank.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Answer {
    Status(Box<Status>),
    /// It took the connection but said nothing in time: stopped (SIGSTOP, a debugger) or hung.
    Silent,
    /// Nothing listens: its process is gone.
    Gone,
    /// Its process answers, but has no such communicator any more (destroyed or aborted).
    Closed,
    /// The network between the asking rank and it carries nothing: connecting found no route
    /// or no answer at all (a stopped process's kernel still accepts connections; a link down
    /// or a partition does not).
    NoRoute(String),
    /// It answered nonsense, or there is no such rank.
    Unreachable(String),
}

impl std::fmt::Display for Answer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Answer::Status(_) => f.write_str("answered"),
            Answer::Silent => f.write_str("does not answer (stopped or hung)"),
            Answer::Gone => f.write_str("is gone (its process exited or was killed)"),
            Answer::Closed => f.write_str("has closed its communicator (destroyed or aborted)"),
            Answer::NoRoute(why) => write!(f, "cannot be reached over the network ({why})"),
            Answer::Unreachable(why) => write!(f, "cannot be reached ({why})"),
        }
    }
}

fn exchange(addr: SocketAddr, request: &[u8], body: &[u8], deadline: Instant) -> std::io::Result<(TcpStream, u8)> {
    let left = || deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
    let mut s = TcpStream::connect_timeout(&addr, left()).map_err(|e| match e.kind() {
        ErrorKind::ConnectionRefused => e,
        // Not the process: the way to it.
        _ => std::io::Error::new(ErrorKind::NotConnected, e.to_string()),
    })?;
    s.set_nodelay(true)?;
    s.set_write_timeout(Some(left()))?;
    let mut all = request.to_vec();
    all.extend_from_slice(body);
    s.write_all(&all)?;
    s.set_read_timeout(Some(left()))?;
    let mut code = [0u8; 1];
    s.read_exact(&mut code)?;
    Ok((s, code[0]))
}

fn failed(e: std::io::Error) -> Answer {
    match e.kind() {
        ErrorKind::ConnectionRefused => Answer::Gone,
        ErrorKind::WouldBlock | ErrorKind::TimedOut => Answer::Silent,
        // The process died between accepting and answering.
        ErrorKind::UnexpectedEof | ErrorKind::ConnectionReset => Answer::Gone,
        ErrorKind::NotConnected => Answer::NoRoute(e.to_string()),
        _ => Answer::Unreachable(e.to_string()),
    }
}

/// Asks rank `peer` of the communicator `id` how far it is, waiting at most `id.answer_within`.
pub(crate) fn ask(id: &Identity, peer: u32) -> Answer {
    let Some(&addr) = id.watch.get(peer as usize) else {
        return Answer::Unreachable(format!("no rank {peer}"));
    };
    let deadline = Instant::now() + id.answer_within;
    let req = Request { secret: id.secret, comm_id: id.comm_id, from: id.rank, kind: Kind::Status, body: 0, to: peer };
    let read = || -> std::io::Result<Answer> {
        let (mut s, code) = exchange(addr, &req.encode(), &[], deadline)?;
        if code == UNKNOWN {
            return Ok(Answer::Closed);
        }
        let mut len = [0u8; 4];
        s.read_exact(&mut len)?;
        let len = u32::from_le_bytes(len) as usize;
        if code != OK || len > MAX_BODY_BYTES {
            return Ok(Answer::Unreachable(format!("a malformed answer (code {code}, {len} bytes)")));
        }
        let mut body = vec![0u8; len];
        s.read_exact(&mut body)?;
        Ok(match decode_body::<Status>(&body) {
            Some(st) if st.rank == peer => Answer::Status(Box::new(st)),
            Some(st) => Answer::Unreachable(format!("rank {peer}'s address answers as rank {}", st.rank)),
            None => Answer::Unreachable("an answer that does not parse".into()),
        })
    };
    read().unwrap_or_else(failed)
}

/// Tells rank `peer` the verdict; whether it acknowledged it in time.
pub(crate) fn tell(id: &Identity, peer: u32, v: &Verdict) -> bool {
    let Some(&addr) = id.watch.get(peer as usize) else { return false };
    let Ok(body) = serde_json::to_vec(v) else { return false };
    let req = Request {
        secret: id.secret,
        comm_id: id.comm_id,
        from: id.rank,
        kind: Kind::Verdict,
        body: body.len(),
        to: peer,
    };
    let deadline = Instant::now() + id.answer_within;
    matches!(exchange(addr, &req.encode(), &body, deadline), Ok((_, OK)))
}

/// Runs `f` for every rank in `ranks` on a few threads at once (a stopped rank costs one
/// answer deadline to its thread, not to everyone); the results in `ranks`' order.
pub(crate) fn for_each_rank<T: Send>(ranks: &[u32], f: impl Fn(u32) -> T + Sync) -> Vec<T> {
    const THREADS: usize = 16;
    let per = ranks.len().div_ceil(THREADS).max(1);
    std::thread::scope(|s| {
        let handles: Vec<_> =
            ranks.chunks(per).map(|chunk| s.spawn(|| chunk.iter().map(|&r| f(r)).collect::<Vec<T>>())).collect();
        // A panicking worker (none is expected) loses its answers rather than the caller.
        handles.into_iter().flat_map(|h| h.join().unwrap_or_default()).collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip_and_bad_ones_are_refused() {
        let r = Request { secret: [3; 16], comm_id: [4; 16], from: 7, kind: Kind::Verdict, body: 100, to: 2 };
        assert_eq!(Request::decode(&r.encode()), Ok(r));
        let mut b = r.encode();
        b[0] = b'X';
        assert!(Request::decode(&b).is_err());
        let mut b = r.encode();
        b[40] = 9;
        assert!(Request::decode(&b).is_err());
        let long = Request { body: MAX_BODY_BYTES + 1, ..r };
        assert!(Request::decode(&long.encode()).is_err());
        let status_with_body = Request { kind: Kind::Status, body: 1, ..r };
        assert!(Request::decode(&status_with_body.encode()).is_err());
    }
}

//! Finding out which rank a failed call was waiting on, on a channel apart from the data path.
//!
//! Each rank keeps a [`Board`]: the call it runs (or ran last), and once the call stalls, what
//! each of its channels waits for. Every process runs one small watch service
//! ([`service`]) that answers authenticated questions about its communicators' boards, on its
//! own thread and socket, so a rank whose data path is stuck (or whose progress thread is busy)
//! still answers, and a rank that does not answer is itself the answer: stopped, hung or gone.
//!
//! When a call fails for want of a peer (a timeout, a peer that closed, a broken connection),
//! the rank follows the chain of waits from itself, asking each rank on it in turn
//! ([`cause`]): "rank 3 waits for rank 2, which waits for rank 1, which does not answer". It
//! then tells every other rank what it found (a [`Verdict`]) before it closes its connections,
//! so the ranks that fail next because this one closed (its neighbours, which would otherwise
//! blame it) report the same cause. `SIGUSR1` prints a running job's table of calls in flight
//! ([`dump`]).

pub(crate) mod cause;
pub(crate) mod dump;
mod ledger;
pub(crate) mod protocol;
pub(crate) mod service;
mod signal;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::error::Error;
use crate::error::Verdict;
use crate::wire::{CallHeader, Called};

/// What a waiting channel needs from a peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Need {
    /// A message from the peer.
    Message,
    /// Room on the connection to the peer (it stopped reading).
    Room,
    /// A message from any peer (a receive from any source; `peer` is the waiting rank itself).
    AnyMessage,
}

/// One stalled channel: step `step` of `steps` waits for `need` from `peer`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Wait {
    pub peer: u32,
    pub channel: u32,
    pub step: u32,
    pub steps: u32,
    pub need: Need,
}

impl std::fmt::Display for Wait {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let need = match self.need {
            Need::Message => "a message",
            Need::Room => "room to send",
            Need::AnyMessage => "a message from any rank",
        };
        write!(f, "channel {} step {}/{}: {need}", self.channel, self.step, self.steps)
    }
}

/// The call a rank runs or ran last, as others are told of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct CallInfo {
    /// The collective's call number (identical on every rank that made the same calls);
    /// `None` for grouped send/recv.
    pub seq: Option<u32>,
    pub text: String,
}

impl CallInfo {
    fn of(header: Option<&CallHeader>) -> CallInfo {
        match header {
            Some(h) if h.called != Called::SendRecv => CallInfo { seq: Some(h.seq), text: h.describe() },
            _ => CallInfo { seq: None, text: "grouped send/recv".into() },
        }
    }
}

impl std::fmt::Display for CallInfo {
    /// `call #7: all_reduce of 1024 × float (sum)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

/// One rank's answer to "how far are you?".
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Status {
    pub rank: u32,
    pub pid: u32,
    /// Calls started so far (collectives and send/recv groups).
    pub calls: u64,
    /// The running call, or the last one.
    pub call: Option<CallInfo>,
    /// The collectives before it, newest last (at most [`RECENT_CALLS`]): what a rank called
    /// as call #k, to tell which side of a mismatch is out of step.
    pub recent: Vec<CallInfo>,
    pub running: bool,
    /// Milliseconds since the call started (running) or ended (idle).
    pub for_ms: u64,
    /// Milliseconds without progress, once the running call stalled.
    pub stalled_ms: Option<u64>,
    /// What the stalled call waits for (kept once the call failed).
    pub waits: Vec<Wait>,
    /// Why the communicator failed, if it did.
    pub error: Option<String>,
    /// Whether that failure started here (a mismatch, an abort, a bug) rather than being
    /// caused by a peer.
    pub first: bool,
    /// The peer the failure names (a peer that closed, a broken connection).
    pub blames: Option<u32>,
    pub verdict: Option<Verdict>,
}

/// What a board keeps under its lock: what a stalled or failed call found (written rarely).
struct Progress {
    stalled_since: Option<Instant>,
    waits: Vec<Wait>,
    error: Option<String>,
    first: bool,
    blames: Option<u32>,
    verdict: Option<Verdict>,
}

/// Who a board belongs to, and how to reach its peers' watch services.
#[derive(Debug, Clone)]
pub(crate) struct Identity {
    pub rank: u32,
    pub secret: [u8; 16],
    pub comm_id: [u8; 16],
    /// Every rank's watch service (this rank's too).
    pub watch: Vec<SocketAddr>,
    /// How long a rank may take to answer before it counts as stopped.
    pub answer_within: Duration,
}

/// A rank's progress, as its watch service reports it. Written by the thread that runs the
/// rank's calls (a few stores per call, without a lock: [`ledger`]; what a stalled call waits
/// for only once it stalls), read by the watch service when asked.
pub(crate) struct Board {
    pub id: Identity,
    calls: ledger::Ledger,
    /// Whether `progress` holds a stall to clear when the next call starts.
    stalled: AtomicBool,
    progress: Mutex<Progress>,
}

impl Board {
    pub(crate) fn new(id: Identity) -> Arc<Board> {
        Arc::new(Board {
            id,
            calls: ledger::Ledger::new(coarse_ms()),
            stalled: AtomicBool::new(false),
            progress: Mutex::new(Progress {
                stalled_since: None,
                waits: Vec::new(),
                error: None,
                first: false,
                blames: None,
                verdict: None,
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Progress> {
        // Every critical section leaves the progress consistent.
        self.progress.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A call starts (`None`: a send/recv group). The description is made when asked.
    pub(crate) fn begin(&self, header: Option<&CallHeader>) {
        self.calls.begin(header, coarse_ms());
        if self.stalled.load(Ordering::Relaxed) {
            self.unstalled();
        }
    }

    /// The running call ended (with `error` if it failed).
    pub(crate) fn end(&self, error: Option<&Error>) {
        self.calls.end(coarse_ms());
        let Some(e) = error else {
            if self.stalled.load(Ordering::Relaxed) {
                self.unstalled();
            }
            return;
        };
        let mut p = self.lock();
        p.stalled_since = None;
        p.error.get_or_insert_with(|| e.to_string());
        let (first, blames) = origin(e);
        p.first = first;
        p.blames = blames;
    }

    /// The running call has not moved since `since`; its channels wait for `waits`.
    pub(crate) fn stalled(&self, since: Instant, waits: Vec<Wait>) {
        let mut p = self.lock();
        p.stalled_since = Some(since);
        p.waits = waits;
        self.stalled.store(true, Ordering::Relaxed);
    }

    /// The stalled call moves again.
    pub(crate) fn unstalled(&self) {
        let mut p = self.lock();
        p.stalled_since = None;
        p.waits.clear();
        self.stalled.store(false, Ordering::Relaxed);
    }

    /// Records the cause of this rank's failure (found here, or told by a peer); the first one
    /// stays.
    pub(crate) fn set_verdict(&self, v: Verdict) -> Verdict {
        self.lock().verdict.get_or_insert(v).clone()
    }

    /// The verdict another rank sent, if one did (asked by a stalled run, off the hot path).
    pub(crate) fn told(&self) -> Option<Verdict> {
        self.verdict().filter(|v| v.found_by != self.id.rank)
    }

    pub(crate) fn verdict(&self) -> Option<Verdict> {
        self.lock().verdict.clone()
    }

    pub(crate) fn status(&self) -> Status {
        let c = self.calls.read();
        let p = self.lock();
        let now = Instant::now();
        Status {
            rank: self.id.rank,
            pid: std::process::id(),
            calls: c.calls,
            call: (c.calls > 0).then(|| CallInfo::of(c.header.as_ref())),
            recent: c.recent.iter().map(|h| CallInfo::of(Some(h))).collect(),
            running: c.running,
            for_ms: coarse_ms().saturating_sub(c.since_ms),
            stalled_ms: p.stalled_since.map(|t| now.duration_since(t).as_millis() as u64),
            waits: p.waits.clone(),
            error: p.error.clone(),
            first: p.first,
            blames: p.blames,
            verdict: p.verdict.clone(),
        }
    }
}

impl Drop for Board {
    /// A failed communicator's last status stays answerable (see `service::remember_closed`).
    fn drop(&mut self) {
        let failed = {
            let p = self.lock();
            p.error.is_some() || p.verdict.is_some()
        };
        if failed {
            service::remember_closed(self.id.secret, self.id.comm_id, self.status());
        }
    }
}

/// A verdict another rank tells this one within `patience`.
fn wait_for_told(board: &Board, patience: Duration) -> Option<Verdict> {
    let until = Instant::now() + patience;
    loop {
        if let Some(v) = board.told() {
            return Some(v);
        }
        if Instant::now() >= until {
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Milliseconds on the system's coarse monotonic clock (a few milliseconds' resolution, read
/// in a few nanoseconds): what a board stamps every call's start and end with, since peers ask
/// how long a call has run only to the millisecond, and the stamp is on every call's path.
fn coarse_ms() -> u64 {
    let mut ts = nix::libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid out-pointer; CLOCK_MONOTONIC_COARSE exists on every Linux this
    // library runs on (on failure `ts` stays zero, which only makes a reported age wrong).
    unsafe { nix::libc::clock_gettime(nix::libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    (ts.tv_sec as u64).saturating_mul(1000) + ts.tv_nsec as u64 / 1_000_000
}

/// Ranks after it (in rank order) that a rank told a verdict passes it on to.
const FORWARD_TO: u32 = 2;

/// Whether `e` started on this rank, and the peer it names.
fn origin(e: &Error) -> (bool, Option<u32>) {
    match e {
        Error::PeerFailed { peer, .. } | Error::Transport { peer, .. } => (false, Some(*peer)),
        Error::Timeout { .. } => (false, None),
        Error::Fault { cause, .. } => (false, cause.culprits.first().copied()),
        _ => (true, None),
    }
}

/// Whether a failure of a call may have been caused by another rank, so that finding out
/// which is worth asking around.
pub(crate) fn caused_by_peer(e: &Error) -> bool {
    matches!(e, Error::PeerFailed { .. } | Error::Transport { .. } | Error::Timeout { .. } | Error::Mismatch { .. })
}

/// How long a rank may take to answer a question before it counts as stopped: long enough
/// for a loaded machine, short against the call timeout it is a part of.
pub(crate) fn answer_within(timeout: Duration) -> Duration {
    (timeout / 10).clamp(Duration::from_millis(200), Duration::from_secs(2))
}

/// `e`, the failure of this rank's call, with its cause when a peer caused it: a verdict a
/// peer already sent, else the end of the chain of waits from here, which is then sent to
/// every other rank (before this rank's connections close, so that the ranks failing because
/// of that closing report the same cause).
pub(crate) fn explain(board: &Board, e: Error) -> Error {
    explain_asking(board, e, |r| protocol::ask(&board.id, r))
}

/// [`explain`], asking other ranks with `ask`.
fn explain_asking(board: &Board, e: Error, ask: impl Fn(u32) -> protocol::Answer + Sync) -> Error {
    if !caused_by_peer(&e) {
        // Started here: peers that ask see it (`Status::first`).
        return e;
    }
    let me = board.id.rank;
    let cause = match board.verdict() {
        Some(v) => {
            pass_on(board, &v);
            v
        }
        None => {
            let mine = board.status();
            let found = if matches!(e, Error::Mismatch { .. }) {
                // Which side of a mismatch is out of step: the ranks whose call differs from
                // most ranks' (asking everyone, which only a mismatch needs).
                let ranks: Vec<u32> = (0..board.id.watch.len() as u32).collect();
                let ask_all = || {
                    protocol::for_each_rank(&ranks, |r| {
                        if r == me {
                            protocol::Answer::Status(Box::new(mine.clone()))
                        } else {
                            ask(r)
                        }
                    })
                };
                let seq = mine.call.as_ref().and_then(|c| c.seq);
                let mut all = ask_all();
                // A rank that is only slower gets a vote if it gets there in a moment.
                let settle = Instant::now() + board.id.answer_within / 2;
                while cause::waits_for_behind(seq, &all) && Instant::now() < settle {
                    std::thread::sleep(Duration::from_millis(10));
                    all = ask_all();
                }
                let found = cause::odd_one_out(me, &e.to_string(), seq, &all);
                match (&e, found.culprits.is_empty()) {
                    // Every rank made the same calls: the message itself was not what its
                    // sender's call sends (corrupted on the way, or a confused sender).
                    (Error::Mismatch { peer, theirs, ours, .. }, true) => Verdict {
                        culprits: vec![*peer],
                        text: format!(
                            "rank {peer} sent {theirs} to rank {me}, which ran {ours}, though every rank made the same calls: a corrupted message or a confused sender"
                        ),
                        found_by: me,
                        stalled: false,
                    },
                    _ => found,
                }
            } else {
                let found = cause::find(me, board.id.watch.len() as u32, &mine, &ask);
                if mine.blames.is_some_and(|p| found.culprits == [p]) {
                    // Only the rank that closed on this one is named: it may have closed
                    // because another rank told it the cause, which is on its way here too.
                    wait_for_told(board, board.id.answer_within).unwrap_or(found)
                } else {
                    found
                }
            };
            let v = board.set_verdict(found);
            if v.found_by == me {
                // The culprits too: one that runs on (a mismatch's other side) must hear it
                // before it sees this rank's connections close.
                let others: Vec<u32> = (0..board.id.watch.len() as u32).filter(|r| *r != me).collect();
                protocol::for_each_rank(&others, |r| protocol::tell(&board.id, r, &v));
            } else {
                // Another rank's verdict arrived while this one searched (the first stays):
                // passed on as if it had come first, or a rank only this one can reach (the
                // finder's across a cut link) would blame this one for closing.
                pass_on(board, &v);
            }
            v
        }
    };
    Error::Fault { rank: me, cause, seen: Box::new(e) }
}

/// A verdict another rank told this one, passed on to the next few ranks before this one
/// closes, so that a rank the finder could not reach (across a cut link) hears it from a
/// neighbour rather than blaming that neighbour for closing.
fn pass_on(board: &Board, v: &Verdict) {
    let (me, n) = (board.id.rank, board.id.watch.len() as u32);
    let next: Vec<u32> =
        (1..=FORWARD_TO.min(n.saturating_sub(1))).map(|k| (me + k) % n).filter(|&r| r != v.found_by).collect();
    protocol::for_each_rank(&next, |r| protocol::tell(&board.id, r, v));
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr};

    use super::*;

    /// Rank 0 finds the cause but cannot reach rank 1 (the link between them is down); rank 2
    /// times out at the same moment and is still asking around when rank 0's verdict reaches
    /// it. Rank 2 must pass that verdict on to rank 1, as it would had it come first: else
    /// rank 1 hears from nobody and blames rank 2 for closing (seen in CI, collbench's
    /// `a_link_taken_down_mid_run_fails_every_rank_naming_the_link`).
    #[test]
    fn a_verdict_told_while_this_rank_searches_is_passed_on() {
        let addr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), service::port().unwrap());
        let id = |rank| Identity {
            rank,
            secret: [9; 16],
            comm_id: [51; 16],
            watch: vec![addr, addr, addr],
            answer_within: Duration::from_secs(2),
        };
        let (one, two) = (Board::new(id(1)), Board::new(id(2)));
        service::register(&one).unwrap();
        service::register(&two).unwrap();
        two.stalled(Instant::now(), vec![Wait { peer: 1, channel: 0, step: 3, steps: 8, need: Need::Message }]);
        let from_zero = Verdict {
            culprits: vec![0, 1],
            text: "the link between rank 0 and rank 1 is down".into(),
            found_by: 0,
            stalled: false,
        };
        let timeout = Error::Timeout { rank: 2, secs: 3.0, call: "all_reduce".into(), waiting: "rank 1".into() };
        let explained = explain_asking(&two, timeout, |r| {
            // Rank 0's verdict arrives while rank 2 asks rank 1.
            two.set_verdict(from_zero.clone());
            protocol::Answer::Status(Box::new(if r == 1 { one.status() } else { two.status() }))
        });
        match explained {
            Error::Fault { cause, .. } => assert_eq!(cause.culprits, vec![0, 1]),
            other => panic!("{other}"),
        }
        assert_eq!(one.told().map(|v| (v.culprits, v.found_by)), Some((vec![0, 1], 0)), "rank 1 was not told");
    }
}

//! The host's part of a device-resident call once it is queued: watching it end, with no
//! driver call at all. It reads words of pinned memory the stream writes (the call's
//! completion ticket, its peers' "landed" and "consumed" counts), checks the abort flag and
//! its peers' liveness, and when the call cannot end (a peer gone, a timeout, an abort) it
//! stores the values the stream waits for, so that the caller's stream goes on (with the
//! call's output undefined and the communicator broken) rather than hanging. It stores them
//! again until the stream has passed the call: the stream itself sets its words back between
//! the pieces of a call, so a wait of a later piece may need the value once more.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::super::engine::transport_error;
use super::super::job::ResidentJob;
use super::super::Executor;
use crate::diag::Board;
use crate::error::{Error, Result};

/// Polls between two looks at the clock, the abort flag and the peers.
const CHECK_EVERY: u32 = 64;

impl Executor {
    /// Waits, on the host, for a device-resident call to end; releases its stream if it fails.
    pub(crate) fn watch(&mut self, job: &ResidentJob) -> Result<()> {
        let r = self.watch_until_done(job);
        job.outstanding.end();
        if r.is_err() {
            if !job.ll_peers.is_empty() {
                // Its kernel may be spinning for a peer that will never write: let it return.
                job.binding.abort_device_calls();
            }
            // Until the stream's own end of the call (its ticket), or the timeout.
            let until = Instant::now() + self.settings.timeout.max(Duration::from_secs(1));
            job.release.release();
            while !job.binding.completed(job.ticket) && Instant::now() < until {
                std::thread::sleep(Duration::from_micros(200));
                job.release.release();
            }
            job.binding.complete_from_host(job.ticket);
        }
        r
    }

    fn watch_until_done(&mut self, job: &ResidentJob) -> Result<()> {
        if let Some(e) = &job.failed {
            return Err(e.clone());
        }
        let mut seen: Vec<u32> = job.release.state().map(|(_, now, _)| now).collect();
        let mut peers: Vec<u32> = job.release.0.iter().map(|w| w.peer).chain(job.ll_peers.iter().copied()).collect();
        peers.sort_unstable();
        peers.dedup();
        let mut moved_at = Instant::now();
        let mut rounds = 0u32;
        loop {
            if job.binding.completed(job.ticket) {
                return Ok(());
            }
            rounds = rounds.wrapping_add(1);
            if rounds % CHECK_EVERY == 0 {
                if self.abort.load(Ordering::Relaxed) {
                    return Err(Error::Aborted);
                }
                if let Some(v) = self.board.as_deref().and_then(Board::told) {
                    return Err(Error::PeerFailed { peer: v.found_by, reason: "it found the job broken".into() });
                }
                for &peer in &peers {
                    if let Some(Some(l)) = self.links.get_mut(peer as usize) {
                        // Liveness only: the pair's frames carry nothing for a resident call.
                        l.progress().map_err(transport_error(peer))?;
                        // A peer that has done its part of the call (its messages landed, this
                        // rank's read) may close: only the local work is left. The waits of the
                        // last piece tell (the stream sets its words back between pieces).
                        let done = !job.ll_peers.contains(&peer)
                            && job.release.state().all(|(w, _, done)| done || w.peer != peer || !w.last);
                        if let (Some(why), false) = (l.closed(), done) {
                            if !job.binding.completed(job.ticket) {
                                return Err(Error::PeerFailed { peer, reason: why.to_string() });
                            }
                        }
                    }
                }
                let now = Instant::now();
                for (s, (_, v, _)) in seen.iter_mut().zip(job.release.state()) {
                    if *s != v {
                        *s = v;
                        moved_at = now;
                    }
                }
                let idle = now.duration_since(moved_at);
                if idle >= self.settings.timeout {
                    return Err(Error::Timeout {
                        rank: self.rank,
                        secs: idle.as_secs_f64(),
                        call: job.header.describe(),
                        waiting: waiting_for(job),
                    });
                }
            }
            if rounds < 1024 && !self.settings.oversubscribed {
                std::hint::spin_loop();
            } else if rounds < 8192 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
    }
}

/// What a stuck call's stream waits for, in words.
fn waiting_for(job: &ResidentJob) -> String {
    if !job.ll_peers.is_empty() {
        let absent: Vec<String> = job
            .ll_launched
            .iter()
            .filter(|(_, w, n)| !super::reached(w.host().load(std::sync::atomic::Ordering::Acquire), *n))
            .map(|(p, _, _)| format!("rank {p}"))
            .collect();
        return if absent.is_empty() {
            "the device to run the call's one kernel (every rank launched its own)".into()
        } else {
            format!("{} to launch its kernel of the call (the call runs as one kernel per rank)", absent.join(", "))
        };
    }
    let stuck: Vec<String> = job
        .release
        .state()
        .filter(|(w, _, done)| !done && w.last)
        .map(|(w, now, _)| {
            if w.arrival {
                format!("rank {}'s messages ({} in the call; {now} landed)", w.peer, w.value)
            } else {
                format!("rank {} to read this rank's messages of the call before", w.peer)
            }
        })
        .collect();
    if stuck.is_empty() {
        "the device to run the call's work on its stream (every peer did its part)".into()
    } else {
        format!("the device stream waits for {}", stuck.join(", "))
    }
}

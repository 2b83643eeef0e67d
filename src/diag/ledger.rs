//! The per-call part of a rank's board: which call runs (or ran last), how many have started,
//! since when, and the collectives before it. Every call writes it twice (start, end), so it
//! takes no lock: one thread at a time writes it (the executor's runner), and readers (the
//! watch service, asked by peers) take a consistent copy under a sequence lock — the writer
//! makes the sequence odd, writes, makes it even; a reader retries while it is odd or changed.

use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, Ordering};

use crate::wire::{CallHeader, Called};

/// Collectives a ledger remembers besides the running one.
pub(crate) const RECENT_CALLS: usize = 32;

/// A call header as three words (its 24-byte wire encoding).
type Words = [AtomicU64; 3];

fn store(w: &Words, h: &CallHeader) {
    let m = h.encode();
    for (i, word) in w.iter().enumerate() {
        let mut b = [0u8; 8];
        b.copy_from_slice(&m[i * 8..i * 8 + 8]);
        word.store(u64::from_le_bytes(b), Ordering::Relaxed);
    }
}

fn load(w: &Words) -> Option<CallHeader> {
    let mut m = [0u8; topoccl_transports::META_BYTES];
    for (i, word) in w.iter().enumerate() {
        m[i * 8..i * 8 + 8].copy_from_slice(&word.load(Ordering::Relaxed).to_le_bytes());
    }
    CallHeader::decode(&m)
}

/// A consistent copy of a ledger.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Entry {
    pub calls: u64,
    pub running: bool,
    /// Coarse milliseconds at the running call's start or the last call's end.
    pub since_ms: u64,
    /// The running call, or the last one (`None` before any, and for grouped send/recv).
    pub header: Option<CallHeader>,
    /// The collectives before it, oldest first.
    pub recent: Vec<CallHeader>,
}

/// See the module documentation.
pub(crate) struct Ledger {
    seq: AtomicU32,
    calls: AtomicU64,
    running: AtomicBool,
    since_ms: AtomicU64,
    /// Whether `header` holds a collective's header.
    has_header: AtomicBool,
    header: Words,
    /// Collectives before the current one: slot `i % RECENT_CALLS` holds the `i`-th.
    recent: [Words; RECENT_CALLS],
    recent_len: AtomicU64,
}

impl Ledger {
    pub(crate) fn new(now_ms: u64) -> Ledger {
        Ledger {
            seq: AtomicU32::new(0),
            calls: AtomicU64::new(0),
            running: AtomicBool::new(false),
            since_ms: AtomicU64::new(now_ms),
            has_header: AtomicBool::new(false),
            header: Default::default(),
            recent: Default::default(),
            recent_len: AtomicU64::new(0),
        }
    }

    /// Runs `write` as one update readers see whole. Only one thread writes at a time (the
    /// board's owner), so plain loads and stores do.
    fn write(&self, write: impl FnOnce()) {
        let s = self.seq.load(Ordering::Relaxed);
        self.seq.store(s.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        write();
        self.seq.store(s.wrapping_add(2), Ordering::Release);
    }

    /// A call starts (`None`: grouped send/recv); the collective before it joins the recent ones.
    pub(crate) fn begin(&self, header: Option<&CallHeader>, now_ms: u64) {
        self.write(|| {
            if self.has_header.load(Ordering::Relaxed) {
                let n = self.recent_len.load(Ordering::Relaxed);
                for (to, from) in self.recent[n as usize % RECENT_CALLS].iter().zip(&self.header) {
                    to.store(from.load(Ordering::Relaxed), Ordering::Relaxed);
                }
                self.recent_len.store(n + 1, Ordering::Relaxed);
            }
            let h = header.filter(|h| h.called != Called::SendRecv);
            if let Some(h) = h {
                store(&self.header, h);
            }
            self.has_header.store(h.is_some(), Ordering::Relaxed);
            self.calls.store(self.calls.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
            self.running.store(true, Ordering::Relaxed);
            self.since_ms.store(now_ms, Ordering::Relaxed);
        });
    }

    /// The running call ends.
    pub(crate) fn end(&self, now_ms: u64) {
        self.write(|| {
            self.running.store(false, Ordering::Relaxed);
            self.since_ms.store(now_ms, Ordering::Relaxed);
        });
    }

    /// A consistent copy.
    pub(crate) fn read(&self) -> Entry {
        loop {
            let s = self.seq.load(Ordering::Acquire);
            if s % 2 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let n = self.recent_len.load(Ordering::Relaxed);
            let first = n.saturating_sub(RECENT_CALLS as u64);
            let entry = Entry {
                calls: self.calls.load(Ordering::Relaxed),
                running: self.running.load(Ordering::Relaxed),
                since_ms: self.since_ms.load(Ordering::Relaxed),
                header: self.has_header.load(Ordering::Relaxed).then(|| load(&self.header)).flatten(),
                recent: (first..n).filter_map(|i| load(&self.recent[i as usize % RECENT_CALLS])).collect(),
            };
            fence(Ordering::Acquire);
            if self.seq.load(Ordering::Relaxed) == s {
                return entry;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Dtype;
    use topoccl_synth::schedule::Collective;

    fn call(seq: u32) -> CallHeader {
        CallHeader {
            seq,
            called: Called::Collective(Collective::AllReduce),
            dtype: Dtype::Float32,
            op: 0,
            count: 100 + u64::from(seq),
            schedule: 7,
        }
    }

    #[test]
    fn calls_running_and_recent_ones() {
        let l = Ledger::new(5);
        assert_eq!(l.read(), Entry { calls: 0, running: false, since_ms: 5, header: None, recent: vec![] });
        l.begin(Some(&call(0)), 10);
        let e = l.read();
        assert!(e.running && e.calls == 1 && e.since_ms == 10 && e.header == Some(call(0)) && e.recent.is_empty());
        l.end(11);
        l.begin(None, 12);
        let e = l.read();
        assert_eq!((e.calls, e.header, e.recent.clone()), (2, None, vec![call(0)]));
        for s in 1..=40 {
            l.begin(Some(&call(s)), 20);
            l.end(21);
        }
        let e = l.read();
        assert_eq!(e.header, Some(call(40)));
        assert_eq!(e.recent.len(), RECENT_CALLS);
        assert_eq!(e.recent.last(), Some(&call(39)));
        assert_eq!(e.recent.first(), Some(&call(40 - RECENT_CALLS as u32)));
    }

    #[test]
    fn readers_see_whole_updates_while_one_thread_writes() {
        let l = std::sync::Arc::new(Ledger::new(0));
        let writer = {
            let l = l.clone();
            std::thread::spawn(move || {
                for s in 0..20_000u32 {
                    l.begin(Some(&call(s)), u64::from(s));
                    l.end(u64::from(s));
                }
            })
        };
        while !writer.is_finished() {
            let e = l.read();
            if let Some(h) = e.header {
                // The header and the stamp were written in one update.
                assert_eq!(h.count, 100 + u64::from(h.seq));
                assert_eq!(e.since_ms, u64::from(h.seq));
                assert_eq!(e.calls, u64::from(h.seq) + 1);
            }
        }
        writer.join().unwrap();
    }
}

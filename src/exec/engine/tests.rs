//! The engine's unit tests: connections that drip, and sends read late.

use super::*;
use crate::exec::memory::{Span, INPUT, OUTPUT};
use crate::exec::program::ProgramChannel;
use crate::ops::CpuOps;
use topoccl_transports::{Result as TransportResult, Ticket};

/// The methods of a test connection that only sends: nothing arrives, nothing closes.
macro_rules! send_only {
    () => {
        fn recv_with(&mut self, _: u32, _: &mut dyn FnMut(&Meta, Region)) -> TransportResult<bool> {
            Ok(false)
        }
        fn closed(&self) -> Option<&str> {
            None
        }
        fn wait_fds(&self, _: &mut Vec<WaitFd>) {}
        fn needs_spin(&self) -> bool {
            true
        }
        fn close(&mut self) {}
    };
}

fn config(abort: &AtomicBool, slice_bytes: usize, max_backlog: usize) -> RunConfig<'_> {
    RunConfig {
        board: None,
        rank: 0,
        dtype: Dtype::Uint8,
        op: ReduceOp::Sum,
        slice_bytes,
        max_backlog,
        timeout: Duration::from_secs(5),
        abort,
        call: None,
        oversubscribed: false,
    }
}

/// A connection that takes one queued message off its backlog per `progress` and records
/// the tags in the order they were sent.
#[derive(Default)]
struct Drip {
    queued: std::collections::VecDeque<usize>,
    sent: std::sync::Arc<std::sync::Mutex<Vec<u32>>>,
}

impl Connection for Drip {
    fn transport(&self) -> &'static str {
        "drip"
    }
    unsafe fn send(&mut self, tag: u32, _: &Meta, data: Region) -> TransportResult<Ticket> {
        self.queued.push_back(data.len);
        self.sent.lock().unwrap().push(tag);
        Ok(Ticket::DONE)
    }
    fn sent(&self, _: Ticket) -> bool {
        true
    }
    fn backlog(&self) -> usize {
        self.queued.iter().sum()
    }
    fn progress(&mut self) -> TransportResult<bool> {
        Ok(self.queued.pop_front().is_some())
    }
    send_only!();
}

#[test]
fn channels_sharing_a_connection_take_turns() {
    // Three channels each send four slices to rank 1, whose connection holds one slice at
    // a time. Channel 0 going first in every round would send all of its slices before
    // the others sent any (what starved one Blink tree's lanes behind another's).
    let slice = 8;
    let data = [0u8; 32];
    let channel = |tag| ProgramChannel {
        tag,
        steps: vec![ProgramStep {
            action: Action::Send,
            from: 0,
            to: 1,
            src: Span::new(INPUT, 0, 32),
            dst: Span::new(INPUT, 0, 0),
            len: 32,
            meta: 0,
        }],
        trails: vec![false],
        ..ProgramChannel::default()
    };
    let prog = Program { channels: (0..3).map(channel).collect(), peers: vec![1] };
    let mut mem = Memory::new();
    mem.readable(INPUT, Region::of(&data));
    let drip = Drip::default();
    let sent = drip.sent.clone();
    let mut links: Vec<Option<Box<dyn Connection>>> = vec![None, Some(Box::new(drip))];
    let abort = AtomicBool::new(false);
    let cfg = config(&abort, slice, slice);
    let res = Resources {
        mem: &mem,
        links: &mut links,
        ops: &mut CpuOps,
        written: Fence::DONE,
        forward: &mut Vec::new(),
        staging: &mut Vec::new(),
        sources: &mut [1],
    };
    // SAFETY: `data` outlives the run.
    unsafe { run(&prog, &[[0; 24]], res, &cfg) }.unwrap();
    let sent = sent.lock().unwrap().clone();
    assert_eq!(sent.len(), 12);
    // Every run of three consecutive sends has one slice of each channel.
    for turn in sent.chunks(3) {
        let mut tags = turn.to_vec();
        tags.sort_unstable();
        assert_eq!(tags, [0, 1, 2], "sends in order {sent:?}");
    }
}

/// A connection that keeps a send's payload where it lies and reads it only after a few
/// rounds of progress, as a socket that drains slowly does.
#[derive(Default)]
struct Slow {
    queued: Option<(Region, u32)>,
    delivered: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
}

impl Connection for Slow {
    fn transport(&self) -> &'static str {
        "slow"
    }
    unsafe fn send(&mut self, _: u32, _: &Meta, data: Region) -> TransportResult<Ticket> {
        self.queued = Some((data, 0));
        Ok(Ticket(1))
    }
    fn sent(&self, _: Ticket) -> bool {
        self.queued.is_none()
    }
    fn backlog(&self) -> usize {
        self.queued.map_or(0, |(r, _)| r.len)
    }
    fn progress(&mut self) -> TransportResult<bool> {
        let Some((r, rounds)) = self.queued else { return Ok(false) };
        if rounds < 5 {
            self.queued = Some((r, rounds + 1));
            return Ok(false);
        }
        // SAFETY: the engine keeps the payload valid and unchanged until `sent` is true.
        self.delivered.lock().unwrap().extend_from_slice(unsafe { r.bytes() });
        self.queued = None;
        Ok(true)
    }
    send_only!();
}

#[test]
fn a_step_does_not_overwrite_bytes_a_queued_send_still_reads() {
    // Rank 0 sends output[0..8] to rank 1, then copies input over it on the same channel.
    // Sends are eager: rank 1 must get the bytes as they were when the send was posted,
    // though the connection reads them only later.
    let input = [7u8; 8];
    let mut output = [1u8; 8];
    let out = Region::of_mut(&mut output);
    let step = |action, src, dst| ProgramStep { action, from: 0, to: 1, src, dst, len: 8, meta: 0 };
    let ch = ProgramChannel {
        tag: 0,
        steps: vec![
            step(Action::Send, Span::new(OUTPUT, 0, 8), Span::new(INPUT, 0, 0)),
            step(Action::Copy, Span::new(INPUT, 0, 8), Span::new(OUTPUT, 0, 8)),
        ],
        trails: vec![false, false],
        ..ProgramChannel::default()
    };
    let prog = Program { channels: vec![ch], peers: vec![1] };
    let mut mem = Memory::new();
    mem.readable(INPUT, Region::of(&input));
    mem.writable(OUTPUT, out);
    let slow = Slow::default();
    let delivered = slow.delivered.clone();
    let mut links: Vec<Option<Box<dyn Connection>>> = vec![None, Some(Box::new(slow))];
    let abort = AtomicBool::new(false);
    let cfg = config(&abort, 8, 64);
    let res = Resources {
        mem: &mem,
        links: &mut links,
        ops: &mut CpuOps,
        written: Fence::DONE,
        forward: &mut Vec::new(),
        staging: &mut Vec::new(),
        sources: &mut [1],
    };
    // SAFETY: both arrays outlive the run and are used through it only.
    unsafe { run(&prog, &[[0; 24]], res, &cfg) }.unwrap();
    assert_eq!(*delivered.lock().unwrap(), [1u8; 8]);
    assert_eq!(output, [7u8; 8]);
}

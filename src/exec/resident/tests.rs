//! Every built-in schedule, lowered for every rank and run as one stream per rank (a host
//! thread that runs each item as it is emitted: a wait blocks it, as it blocks a stream), must
//! finish and give the reference result, call after call over the same windows.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use topoccl_synth::generate::Request;
use topoccl_synth::registry::Registry;
use topoccl_synth::schedule::{Collective, Schedule};
use topoccl_synth::topology::resolve;
use topoccl_transports::ipc::{ResidentLink, Word};
use topoccl_transports::Region;

use super::*;
use crate::exec::memory::{INPUT, OUTPUT, SCRATCH};
use crate::exec::plan::Plan;
use crate::ops::{CpuOps, LocalOps};
use crate::types::{Dtype, ReduceOp};

/// Runs each item at once on the host; a wait spins (bounded) until its word is reached.
struct HostStream;

impl DeviceStream for HostStream {
    unsafe fn copy(&mut self, dst: u64, src: u64, len: usize) -> Result<()> {
        // SAFETY: host memory of the test, valid for `len` bytes.
        unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, len) };
        Ok(())
    }
    unsafe fn reduce(&mut self, dst: u64, a: u64, b: u64, dst2: u64, len: usize) -> Result<()> {
        let r = |x: u64| Region::host(x as usize, len);
        // SAFETY: as above.
        unsafe { CpuOps.reduce(Dtype::Uint32, ReduceOp::Sum, r(dst), r(a), r(b)) }?;
        if dst2 != 0 {
            // SAFETY: as above; the second destination is apart from the first.
            unsafe { std::ptr::copy_nonoverlapping(dst as *const u8, dst2 as *mut u8, len) };
        }
        Ok(())
    }
    unsafe fn wait(&mut self, word: u64, value: u32) -> Result<()> {
        // SAFETY: a word of the test's pages, alive for the test.
        let w = unsafe { &*(word as *const AtomicU32) };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !reached(w.load(Ordering::Acquire), value) {
            assert!(Instant::now() < deadline, "a stream waits for ever on a word at {value}");
            std::thread::yield_now();
        }
        Ok(())
    }
    unsafe fn signal(&mut self, word: u64, value: u32) -> Result<()> {
        // SAFETY: as above.
        unsafe { &*(word as *const AtomicU32) }.store(value, Ordering::Release);
        Ok(())
    }
}

const WINDOW: usize = 1 << 16;

/// Per ordered pair (a, b): a's window for b's messages, and the words of direction a → b.
struct Pairs {
    n: usize,
    windows: Vec<Vec<u8>>,
    words: Vec<AtomicU32>,
}

impl Pairs {
    fn new(n: usize) -> Pairs {
        Pairs {
            n,
            windows: (0..n * n).map(|_| vec![0u8; WINDOW]).collect(),
            // Word 1 of a direction (its window free) starts at 1, as the transport sets it up.
            words: (0..n * n * 5).map(|i| AtomicU32::new(u32::from(i % 5 == 1))).collect(),
        }
    }
    fn word(&self, from: usize, to: usize, k: usize) -> Word {
        let a = &self.words[(from * self.n + to) * 5 + k] as *const AtomicU32 as usize;
        Word { host: a, device: a as u64 }
    }
    /// `me`'s link to `p`, with `same_context` as asked (the gate is then exercised).
    fn link(&self, me: usize, p: usize, same_context: bool) -> ResidentLink {
        let window = |owner: usize, sender: usize| self.windows[owner * self.n + sender].as_ptr() as u64;
        ResidentLink {
            same_context,
            tx_window: window(p, me),
            rx_window: window(me, p),
            window_bytes: WINDOW,
            arrived_out: self.word(me, p, 0),
            arrived_in: self.word(p, me, 0),
            consumed_in: self.word(me, p, 1),
            consumed_out: self.word(p, me, 1),
            read_out: self.word(p, me, 4),
            arrived_out_enq: self.word(me, p, 2),
            arrived_in_enq: self.word(p, me, 2),
            consumed_out_enq: self.word(p, me, 3),
            consumed_in_enq: self.word(me, p, 3),
            same_device: true,
            ll_tx: 0,
            ll_rx: 0,
            ll_out_enq: self.word(me, p, 2),
            ll_in_enq: self.word(p, me, 2),
        }
    }
}

fn input(rank: usize, call: usize, n: usize) -> Vec<u32> {
    (0..n).map(|i| (rank * 1000 + i * 7 + call * 13) as u32).collect()
}

/// The expected output of `rank` for `coll` on `count` elements per block.
fn reference(coll: Collective, nranks: usize, rank: usize, call: usize, count: usize, out: &[u32]) -> Vec<u32> {
    let (inb, _) = coll.blocks(nranks as u32);
    let ins: Vec<Vec<u32>> = (0..nranks).map(|r| input(r, call, count * inb)).collect();
    let sum = |range: std::ops::Range<usize>| -> Vec<u32> {
        range.map(|i| ins.iter().fold(0u32, |s, v| s.wrapping_add(v[i]))).collect()
    };
    match coll {
        Collective::AllReduce => sum(0..count),
        Collective::Reduce { root } if root as usize == rank => sum(0..count),
        Collective::Reduce { .. } => out.to_vec(),
        Collective::Broadcast { root } => ins[root as usize].clone(),
        Collective::ReduceScatter => sum(rank * count..(rank + 1) * count),
        Collective::AllGather => ins.concat(),
        Collective::AllToAll => (0..nranks).flat_map(|r| ins[r][rank * count..(rank + 1) * count].to_vec()).collect(),
    }
}

fn run_all_ranks(s: &Schedule, count: usize, same_context: bool) {
    let n = s.nranks as usize;
    let (inb, outb) = s.collective.blocks(s.nranks);
    let pairs = Arc::new(Pairs::new(n));
    let schedule = Arc::new(s.clone());
    let abort = Arc::new(AtomicBool::new(false));
    std::thread::scope(|scope| {
        for me in 0..n {
            let (pairs, schedule, abort) = (pairs.clone(), schedule.clone(), abort.clone());
            scope.spawn(move || {
                let plan = Plan::new(me as u32, schedule.clone(), 0, 4, count);
                if plan.padded {
                    return;
                }
                let prog = ResidentProgram::lower(&schedule, &plan.layout, &plan.program, me as u32).unwrap();
                let links: Vec<Option<ResidentLink>> =
                    (0..n).map(|p| (p != me).then(|| pairs.link(me, p, same_context))).collect();
                assert!(prog.fits(&links) || prog.to.is_empty() && prog.from.is_empty());
                let mut counts = vec![Counts::default(); n];
                for call in 0..3 {
                    let src = input(me, call, count * inb);
                    let mut out = vec![u32::MAX; count * outb];
                    let mut scratch = vec![0u8; plan.scratch_bytes];
                    let mut mem = Memory::new();
                    mem.readable(INPUT, Region::of(bytemuck_u8(&src)));
                    mem.writable(OUTPUT, Region::host(out.as_mut_ptr() as usize, out.len() * 4));
                    mem.writable(SCRATCH, Region::host(scratch.as_mut_ptr() as usize, scratch.len()));
                    let gate =
                        Gate { deadline: Instant::now() + Duration::from_secs(20), abort: &abort, rank: me as u32 };
                    // SAFETY: the test's buffers and windows outlive the (synchronous) stream.
                    unsafe { emit(&prog, &mem, &links, &mut counts, &mut HostStream, &gate, true) }.unwrap();
                    let want = reference(schedule.collective, n, me, call, count, &out);
                    assert_eq!(out, want, "{} {} rank {me} call {call}", schedule.name, schedule.collective);
                }
            });
        }
    });
}

fn bytemuck_u8(v: &[u32]) -> &[u8] {
    // SAFETY: u32s viewed as their bytes.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast(), v.len() * 4) }
}

#[test]
fn every_builtin_schedule_runs_as_one_stream_per_rank_call_after_call() {
    let reg = Registry::builtin();
    for spec in ["dgx1[0,1,2,4,5]", "dgx1[0,1]", "dgx1[0,1,2,3]"] {
        let topo = resolve(spec).unwrap();
        for coll in Collective::ALL {
            for g in reg.iter().filter(|g| g.supports(coll)) {
                let Ok(s) = g.generate(&Request::new(&topo, coll).pipeline(2)) else { continue };
                // Uneven chunks, and fewer elements than chunks.
                for count in [37, 2] {
                    run_all_ranks(&s, count, false);
                }
            }
        }
    }
}

#[test]
fn peers_on_one_context_queue_each_wait_after_its_write() {
    // The gate makes each rank's thread wait until its peer has queued the write a wait needs:
    // with the host stream (which runs each item as it is queued) this still finishes.
    let topo = resolve("dgx1[0,1,2,4,5]").unwrap();
    let reg = Registry::builtin();
    for name in ["ring", "tree"] {
        let Some(g) = reg.iter().find(|g| g.name() == name) else { continue };
        let s = g.generate(&Request::new(&topo, Collective::AllReduce).pipeline(2)).unwrap();
        run_all_ranks(&s, 64, true);
    }
}

//! Every collective × datatype × operator × size × placement on one rank of a communicator,
//! checked element by element against a reference computed here: the body of the exact
//! multi-rank suites (threads over TCP and shared memory in `runtime_collectives`, processes
//! over RDMA verbs in `runtime_verbs`).
//!
//! Inputs are small integers (products of at most two 2s), so every reduction is exact in every
//! type, including f16 and bf16, and results compare exactly.
#![allow(dead_code)]

use std::fmt::Debug;

use half::{bf16, f16};
use topoccl::{Communicator, Element, ReduceOp};

pub trait Elem: Element + PartialEq + Debug {
    fn of(v: i64) -> Self;
    fn mean(sum: i64, n: i64) -> Self;
}

macro_rules! ints {
    ($($t:ty),*) => {$(impl Elem for $t {
        fn of(v: i64) -> Self { v as $t }
        fn mean(sum: i64, n: i64) -> Self { (sum / n) as $t }
    })*};
}
ints!(i8, u8, i32, u32, i64, u64);
impl Elem for f32 {
    fn of(v: i64) -> Self {
        v as f32
    }
    fn mean(sum: i64, n: i64) -> Self {
        sum as f32 / n as f32
    }
}
impl Elem for f64 {
    fn of(v: i64) -> Self {
        v as f64
    }
    fn mean(sum: i64, n: i64) -> Self {
        sum as f64 / n as f64
    }
}
impl Elem for f16 {
    fn of(v: i64) -> Self {
        f16::from_f64(v as f64)
    }
    fn mean(sum: i64, n: i64) -> Self {
        f16::from_f32(sum as f32 / n as f32)
    }
}
impl Elem for bf16 {
    fn of(v: i64) -> Self {
        bf16::from_f64(v as f64)
    }
    fn mean(sum: i64, n: i64) -> Self {
        bf16::from_f32(sum as f32 / n as f32)
    }
}

/// Rank `r`'s input value at index `i` for call `seed`.
fn value(op: ReduceOp, seed: usize, r: u32, i: usize) -> i64 {
    let x = (i * 7 + r as usize * 3 + seed) % 5;
    match op {
        ReduceOp::Prod => 1 + i64::from(x == 0),
        _ => x as i64,
    }
}

fn reduced<T: Elem>(op: ReduceOp, n: u32, v: impl Fn(u32) -> i64) -> T {
    let vals = (0..n).map(v);
    match op {
        ReduceOp::Sum => T::of(vals.sum()),
        ReduceOp::Prod => T::of(vals.product()),
        ReduceOp::Min => T::of(vals.min().unwrap_or(0)),
        ReduceOp::Max => T::of(vals.max().unwrap_or(0)),
        ReduceOp::Avg => T::mean(vals.sum(), i64::from(n)),
    }
}

const SIZES: [usize; 5] = [0, 1, 7, 1023, (1 << 20) + 3];

/// Runs every collective for type `T` on this rank and returns a description of each wrong
/// result. The large size runs one operator per (collective, type), cycling through them.
pub fn check_type<T: Elem>(comm: &mut Communicator, type_no: usize) -> Vec<String> {
    let (n, me) = (comm.nranks(), comm.rank());
    let mut wrong = Vec::new();
    let mut seed = type_no * 1000;
    let mut expect = |what: String, got: &[T], want: &dyn Fn(usize) -> T| {
        if let Some(i) = (0..got.len()).find(|&i| got[i] != want(i)) {
            wrong.push(format!("rank {me}: {what}: element {i} is {:?}, expected {:?}", got[i], want(i)));
        }
    };
    for (si, &size) in SIZES.iter().enumerate() {
        let big = si == SIZES.len() - 1;
        let ops: Vec<ReduceOp> = if big { vec![ReduceOp::ALL[type_no % 5]] } else { ReduceOp::ALL.to_vec() };
        let m = size.div_ceil(n as usize); // per-block count of blocked collectives
        let nm = m * n as usize;
        for in_place in [false, true] {
            let tag = |c: &str, op: Option<ReduceOp>| {
                format!(
                    "{c}{} {size} × {}{}",
                    if in_place { " in place" } else { "" },
                    T::DTYPE,
                    op.map(|o| format!(" {o}")).unwrap_or_default()
                )
            };
            for &op in &ops {
                seed += 1;
                let s = seed;
                // all-reduce
                let input: Vec<T> = (0..size).map(|i| T::of(value(op, s, me, i))).collect();
                let want = |i: usize| reduced::<T>(op, n, |r| value(op, s, r, i));
                let mut out = vec![T::of(9); size];
                let r = if in_place {
                    out.copy_from_slice(&input);
                    comm.all_reduce_in_place(&mut out, op)
                } else {
                    comm.all_reduce(&input, &mut out, op)
                };
                r.expect("all_reduce");
                expect(tag("all_reduce", Some(op)), &out, &want);

                // reduce-scatter: block j of rank r's input is indices j*m..
                let input: Vec<T> = (0..nm).map(|i| T::of(value(op, s, me, i))).collect();
                let base = me as usize * m;
                let want = |j: usize| reduced::<T>(op, n, |r| value(op, s, r, base + j));
                if in_place {
                    let mut buf = input.clone();
                    comm.reduce_scatter_in_place(&mut buf, op).expect("reduce_scatter");
                    expect(tag("reduce_scatter", Some(op)), &buf[base..base + m], &want);
                } else {
                    let mut out = vec![T::of(9); m];
                    comm.reduce_scatter(&input, &mut out, op).expect("reduce_scatter");
                    expect(tag("reduce_scatter", Some(op)), &out, &want);
                }

                // reduce to a root that moves from call to call
                let root = (s % n as usize) as u32;
                let input: Vec<T> = (0..size).map(|i| T::of(value(op, s, me, i))).collect();
                let want_root = |i: usize| reduced::<T>(op, n, |r| value(op, s, r, i));
                if in_place {
                    let mut buf = input.clone();
                    comm.reduce_in_place(&mut buf, op, root).expect("reduce");
                    if me == root {
                        expect(tag("reduce", Some(op)), &buf, &want_root);
                    } else {
                        expect(tag("reduce (non-root untouched)", Some(op)), &buf, &|i| input[i]);
                    }
                } else {
                    let mut out = if me == root { vec![T::of(9); size] } else { Vec::new() };
                    comm.reduce(&input, &mut out, op, root).expect("reduce");
                    expect(tag("reduce", Some(op)), &out, &want_root);
                }
            }
            seed += 1;
            let s = seed;
            let op = ReduceOp::Sum;
            // all-gather
            let want = |i: usize| T::of(value(op, s, (i / m.max(1)) as u32, i % m.max(1)));
            let mine: Vec<T> = (0..m).map(|j| T::of(value(op, s, me, j))).collect();
            let mut out = vec![T::of(9); nm];
            if in_place {
                out[me as usize * m..(me as usize + 1) * m].copy_from_slice(&mine);
                comm.all_gather_in_place(&mut out).expect("all_gather");
            } else {
                comm.all_gather(&mine, &mut out).expect("all_gather");
            }
            expect(tag("all_gather", None), &out, &want);

            // broadcast
            let root = ((s + 1) % n as usize) as u32;
            let want = |i: usize| T::of(value(op, s, root, i));
            let src: Vec<T> = if me == root { (0..size).map(want).collect() } else { Vec::new() };
            let mut out = vec![T::of(9); size];
            if in_place {
                if me == root {
                    out.copy_from_slice(&src);
                }
                comm.broadcast_in_place(&mut out, root).expect("broadcast");
            } else {
                comm.broadcast(&src, &mut out, root).expect("broadcast");
            }
            expect(tag("broadcast", None), &out, &want);

            // all-to-all: block j of rank s goes to rank j, into block s
            let send: Vec<T> = (0..nm).map(|i| T::of(value(op, s, me, i))).collect();
            let want = |i: usize| T::of(value(op, s, (i / m.max(1)) as u32, me as usize * m + i % m.max(1)));
            let mut out = vec![T::of(9); nm];
            if in_place {
                out.copy_from_slice(&send);
                comm.all_to_all_in_place(&mut out).expect("all_to_all");
            } else {
                comm.all_to_all(&send, &mut out).expect("all_to_all");
            }
            expect(tag("all_to_all", None), &out, &want);
        }
    }
    wrong
}

/// Every type's matrix on this rank: the wrong results, described.
pub fn every_type(comm: &mut Communicator) -> Vec<String> {
    let mut wrong = Vec::new();
    wrong.extend(check_type::<i8>(comm, 0));
    wrong.extend(check_type::<u8>(comm, 1));
    wrong.extend(check_type::<i32>(comm, 2));
    wrong.extend(check_type::<u32>(comm, 3));
    wrong.extend(check_type::<i64>(comm, 4));
    wrong.extend(check_type::<u64>(comm, 5));
    wrong.extend(check_type::<f16>(comm, 6));
    wrong.extend(check_type::<f32>(comm, 7));
    wrong.extend(check_type::<f64>(comm, 8));
    wrong.extend(check_type::<bf16>(comm, 9));
    wrong
}

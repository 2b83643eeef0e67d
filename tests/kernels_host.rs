//! The CUDA kernels (kernels/topoccl.cu), compiled for the CPU by `topoccl-kernels-host`, give
//! the same bytes as `CpuOps` for every datatype and operation: the GPU path and the CPU path
//! of the executor must agree, because a collective may reduce some chunks on each.
//!
//! Inputs are bit patterns chosen to break things: for the 1-byte types every pair of codes
//! (all 65 536); for the others every pair of special values (±0, subnormals, ±max, ±inf, quiet
//! and signalling NaN with payloads, integer extremes) plus random bits, neighbours (to cancel)
//! and random values. Each runs in several layouts (apart, with a second destination, in place
//! on either operand, element-aligned but not 16-byte aligned) and launch shapes (a ragged
//! grid, one thread, a 3-D grid), so both the 16-byte and the element path of every kernel run.
//! Equal means equal bytes, except that where both results are NaN their payload and sign may
//! differ (neither side promises one; the GPU gives a canonical NaN): those are counted apart.
//! `cargo test --test kernels_host -- --nocapture` prints the table.

mod kernels_host_support;

use kernels_host_support::{cpu, kernel, patterns, Buf, Layout, Table, Ty, BYTES, LAYOUTS, SHAPES, TYPES};
use topoccl::ops::LocalOps;
use topoccl::ReduceOp;
use topoccl_kernels_host::KernelArgs;

const OPS: [(ReduceOp, &str); 4] =
    [(ReduceOp::Sum, "sum"), (ReduceOp::Prod, "prod"), (ReduceOp::Min, "min"), (ReduceOp::Max, "max")];

#[test]
fn reduce_matches_cpu_ops() {
    let mut table = Table::default();
    for ty in &TYPES {
        let (a, b) = patterns::pairs(ty);
        for (op, name) in OPS {
            let k = kernel(&format!("topoccl_reduce_{name}_{}", ty.name));
            let row = format!("reduce_{name}");
            for layout in &LAYOUTS {
                // The CPU's answer, once per layout.
                let av = Buf::new(&a, layout.a_off);
                let bv = Buf::new(&b, layout.b_off);
                let want = if layout.in_place_a {
                    // SAFETY: every region is a live buffer of `a.len()` bytes.
                    unsafe { cpu().reduce(ty.dtype, op, av.region(), av.region(), bv.region()) }.unwrap();
                    av.bytes().to_vec()
                } else if layout.in_place_b {
                    // SAFETY: as above.
                    unsafe { cpu().reduce(ty.dtype, op, bv.region(), av.region(), bv.region()) }.unwrap();
                    bv.bytes().to_vec()
                } else {
                    let d = Buf::zeroed(a.len(), layout.dst_off);
                    // SAFETY: as above; `d` is apart from both operands.
                    unsafe { cpu().reduce(ty.dtype, op, d.region(), av.region(), bv.region()) }.unwrap();
                    d.bytes().to_vec()
                };
                for (grid, block) in SHAPES {
                    let av = Buf::new(&a, layout.a_off);
                    let bv = Buf::new(&b, layout.b_off);
                    let (d, d2) = (Buf::zeroed(a.len(), layout.dst_off), Buf::zeroed(a.len(), layout.dst2_off));
                    let dst = if layout.in_place_a {
                        av.addr()
                    } else if layout.in_place_b {
                        bv.addr()
                    } else {
                        d.addr()
                    };
                    let args = KernelArgs {
                        dst: dst as u64,
                        dst2: if layout.dst2 { d2.addr() as u64 } else { 0 },
                        a: av.addr() as u64,
                        b: bv.addr() as u64,
                        count: (a.len() / ty.size()) as u64,
                        scalar: 0,
                    };
                    // SAFETY: every pointer names a live buffer of `count` elements.
                    unsafe { k.launch(grid, block, &args) };
                    let got = if layout.in_place_a {
                        av.bytes()
                    } else if layout.in_place_b {
                        bv.bytes()
                    } else {
                        d.bytes()
                    };
                    let case = format!("{} {} grid {grid:?} block {block:?}", k.name, layout.name);
                    table.compare(ty, &row, &case, got, &want, &[&a, &b]);
                    if layout.dst2 {
                        table.compare(ty, &row, &format!("{case} (dst2)"), d2.bytes(), &want, &[&a, &b]);
                    }
                }
            }
        }
    }
    table.finish("reduce: kernel vs CpuOps::reduce");
}

/// The layouts a one-operand kernel runs in: out of place aligned, in place, and
/// element-aligned (with a second destination).
fn unary_layouts(ty: &Ty) -> [Layout; 3] {
    let s = ty.size();
    [
        Layout { name: "apart + dst2", dst2: true, ..LAYOUTS[0] },
        Layout { name: "in place", in_place_a: true, ..LAYOUTS[0] },
        Layout { name: "element-aligned + dst2", a_off: s, dst_off: 16 + s, dst2_off: 2 * s, dst2: true, ..LAYOUTS[0] },
    ]
}

/// Runs a one-operand kernel (scale, divide) over `data` in every layout and shape and compares
/// with `want`.
fn check_unary(table: &mut Table, ty: &Ty, op: &str, data: &[u8], scalar: u64, want: &[u8], what: &str) {
    let name = format!("topoccl_{op}_{}", ty.name);
    let k = kernel(&name);
    for layout in unary_layouts(ty) {
        for (grid, block) in &SHAPES[..2] {
            let av = Buf::new(data, layout.a_off);
            let (d, d2) = (Buf::zeroed(data.len(), layout.dst_off), Buf::zeroed(data.len(), layout.dst2_off));
            let args = KernelArgs {
                dst: if layout.in_place_a { av.addr() } else { d.addr() } as u64,
                dst2: if layout.dst2 { d2.addr() as u64 } else { 0 },
                a: av.addr() as u64,
                b: 0,
                count: (data.len() / ty.size()) as u64,
                scalar,
            };
            // SAFETY: every pointer names a live buffer of `count` elements.
            unsafe { k.launch(*grid, *block, &args) };
            let got = if layout.in_place_a { av.bytes() } else { d.bytes() };
            let case = format!("{name} {what} {} grid {grid:?} block {block:?}", layout.name);
            table.compare(ty, op, &case, got, want, &[data]);
            if layout.dst2 {
                table.compare(ty, op, &format!("{case} (dst2)"), d2.bytes(), want, &[data]);
            }
        }
    }
}

#[test]
fn scale_matches_cpu_ops() {
    let mut table = Table::default();
    for ty in &TYPES {
        let data = patterns::singles(ty);
        for s in patterns::scalars(ty) {
            let scalar = &s.to_le_bytes()[..ty.size()];
            let (src, dst) = (Buf::new(&data, 0), Buf::zeroed(data.len(), 0));
            // SAFETY: both regions are live buffers of `data.len()` bytes.
            unsafe { cpu().scale(ty.dtype, dst.region(), src.region(), scalar) }.unwrap();
            check_unary(&mut table, ty, "scale", &data, s, dst.bytes(), &format!("scalar {s:#x}"));
        }
    }
    table.finish("scale (PreMulSum): kernel vs CpuOps::scale");
}

#[test]
fn divide_matches_cpu_ops() {
    let mut table = Table::default();
    for ty in &TYPES {
        let data = patterns::singles(ty);
        for n in [1u32, 2, 3, 7, 256, (1 << 31) + 1, u32::MAX] {
            let v = Buf::new(&data, 0);
            // SAFETY: a live buffer of `data.len()` bytes.
            unsafe { cpu().divide(ty.dtype, v.region(), n) }.unwrap();
            check_unary(&mut table, ty, "divide", &data, u64::from(n), v.bytes(), &format!("n {n}"));
        }
    }
    table.finish("divide (average): kernel vs CpuOps::divide");
}

#[test]
fn copy_matches_cpu_ops() {
    let mut table = Table::default();
    let bytes = patterns::random_bytes(4099, 7);
    for len in [0, 1, 15, 16, 17, 255, 4099] {
        let src = &bytes[..len];
        for (a_off, dst_off) in [(0, 0), (1, 0), (0, 3), (5, 5), (16, 32)] {
            let (s, d) = (Buf::new(src, a_off), Buf::zeroed(len, dst_off));
            // SAFETY: both regions are live buffers of `len` bytes, apart.
            unsafe { cpu().copy(d.region(), s.region()) }.unwrap();
            let layout = Layout { name: "", a_off, dst_off, dst2_off: 16 - a_off, dst2: true, ..LAYOUTS[0] };
            let k = kernel("topoccl_copy");
            for (grid, block) in SHAPES {
                let (kd, kd2) = (Buf::zeroed(len, dst_off), Buf::zeroed(len, layout.dst2_off));
                let args = KernelArgs {
                    dst: kd.addr() as u64,
                    dst2: kd2.addr() as u64,
                    a: s.addr() as u64,
                    b: 0,
                    count: len as u64,
                    scalar: 0,
                };
                // SAFETY: every pointer names a live buffer of `len` bytes.
                unsafe { k.launch(grid, block, &args) };
                let case = format!("topoccl_copy {len} bytes at +{a_off} to +{dst_off} grid {grid:?} block {block:?}");
                table.compare(&BYTES, "copy", &case, kd.bytes(), d.bytes(), &[src]);
                table.compare(&BYTES, "copy", &format!("{case} (dst2)"), kd2.bytes(), d.bytes(), &[src]);
            }
        }
    }
    table.finish("copy: kernel vs CpuOps::copy (bytes)");
}

/// The device takes f16 and bf16 sums and products two at a time (`kernels/packs.cuh`:
/// `add.rn.f16x2`, `mul.rn.bf16x2`, ...), which round the exact result once; the element rule
/// (`CpuOps`, the host build, the device for everything else) widens to f32, computes there and
/// rounds back. That they agree is what makes the paired instructions allowed: checked here
/// against a single rounding of the exact result, for every finite f16 against a spread of
/// partners, and for random bf16 pairs (sums only where the exact sum fits an f64: exponents
/// at most 40 apart). The paired instructions themselves run on a GPU only (the lease
/// script's kernels step checks them against `CpuOps`).
#[test]
fn paired_half_arithmetic_is_the_element_rule() {
    use half::{bf16, f16};
    use topoccl::Dtype;

    /// `x` (finite, exact) rounded once to nearest even in a format of `p` significand bits,
    /// smallest normal exponent `emin` and largest finite `max`.
    fn round_once(x: f64, p: i32, emin: i32, max: f64) -> f64 {
        if x == 0.0 {
            return x;
        }
        let e = ((((x.to_bits() >> 52) & 0x7ff) as i32) - 1023).max(emin);
        let ulp = 2f64.powi(e - p + 1);
        let r = (x / ulp).round_ties_even() * ulp;
        if r.abs() > max {
            f64::INFINITY.copysign(x)
        } else {
            r
        }
    }
    /// CpuOps's `op` over the pairs, as 16-bit codes.
    fn cpu_pairs(dtype: Dtype, op: ReduceOp, a: &[u16], b: &[u16]) -> Vec<u16> {
        let (av, bv): (Vec<u8>, Vec<u8>) =
            (a.iter().flat_map(|x| x.to_le_bytes()).collect(), b.iter().flat_map(|x| x.to_le_bytes()).collect());
        let (av, bv, d) = (Buf::new(&av, 0), Buf::new(&bv, 0), Buf::zeroed(av.len(), 0));
        // SAFETY: three live buffers of the same length.
        unsafe { cpu().reduce(dtype, op, d.region(), av.region(), bv.region()) }.unwrap();
        d.bytes().chunks(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect()
    }

    // f16: every finite code against every 997th finite code (and the zeros, the smallest
    // subnormal and the largest finite).
    let finite: Vec<u16> = (0..=u16::MAX).filter(|&c| f16::from_bits(c).is_finite()).collect();
    let mut partners: Vec<u16> = finite.iter().copied().step_by(997).collect();
    partners.extend([0x0000, 0x8000, 0x0001, 0x8001, 0x7bff, 0xfbff, 0x3c00]);
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for &x in &finite {
        for &y in &partners {
            a.push(x);
            b.push(y);
        }
    }
    let mut checked = 0usize;
    for op in [ReduceOp::Sum, ReduceOp::Prod] {
        let got = cpu_pairs(Dtype::Float16, op, &a, &b);
        for i in 0..a.len() {
            let (x, y) = (f16::from_bits(a[i]).to_f64(), f16::from_bits(b[i]).to_f64());
            let exact = if op == ReduceOp::Sum { x + y } else { x * y };
            let want = f16::from_f64(round_once(exact, 11, -14, 65504.0));
            assert_eq!(got[i], want.to_bits(), "f16 {op:?} of {:#06x} and {:#06x}", a[i], b[i]);
        }
        checked += a.len();
    }

    // bf16: random finite pairs.
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        loop {
            let c = (state >> 16) as u16;
            if bf16::from_bits(c).is_finite() {
                return c;
            }
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
    };
    let (a, b): (Vec<u16>, Vec<u16>) = (0..1 << 21).map(|_| (next(), next())).unzip();
    let max = bf16::MAX.to_f64();
    for op in [ReduceOp::Sum, ReduceOp::Prod] {
        let got = cpu_pairs(Dtype::Bfloat16, op, &a, &b);
        for i in 0..a.len() {
            let (x, y) = (bf16::from_bits(a[i]).to_f64(), bf16::from_bits(b[i]).to_f64());
            let exponent = |c: u16| i32::from((c >> 7) & 0xff);
            if op == ReduceOp::Sum && (exponent(a[i]) - exponent(b[i])).abs() > 40 {
                continue;
            }
            let exact = if op == ReduceOp::Sum { x + y } else { x * y };
            let want = bf16::from_f64(round_once(exact, 8, -126, max));
            assert_eq!(got[i], want.to_bits(), "bf16 {op:?} of {:#06x} and {:#06x}", a[i], b[i]);
            checked += 1;
        }
    }
    assert!(checked > 8_000_000, "only {checked} pairs checked");
}

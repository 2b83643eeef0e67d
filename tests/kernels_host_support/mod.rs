//! What tests/kernels_host.rs needs around the comparison: the datatypes with their bit
//! layouts, buffers at chosen alignments, layouts and launch shapes, and the table of results.

pub mod patterns;

use std::collections::BTreeMap;
use std::fmt::Write as _;

use topoccl::ops::CpuOps;
use topoccl::{Dtype, Region};
use topoccl_kernels_host::{find, HostKernel};

/// How an element's bits are laid out, for telling NaN apart.
#[derive(Debug, Clone, Copy)]
pub enum Format {
    Int,
    /// IEEE-style: the largest exponent is inf (mantissa 0) or NaN.
    Ieee {
        exp: u32,
        man: u32,
    },
    /// OCP E4M3FN: no infinities, NaN only at magnitude 0x7f.
    E4m3,
}

/// One datatype: topoccl's, the kernels' suffix, its bit layout.
pub struct Ty {
    pub dtype: Dtype,
    pub name: &'static str,
    pub format: Format,
}

impl Ty {
    pub fn size(&self) -> usize {
        self.dtype.size()
    }

    pub fn is_nan(&self, bits: u64) -> bool {
        match self.format {
            Format::Int => false,
            Format::Ieee { exp, man } => {
                (bits >> man) & ((1 << exp) - 1) == (1 << exp) - 1 && bits & ((1 << man) - 1) != 0
            }
            Format::E4m3 => bits & 0x7f == 0x7f,
        }
    }
}

const fn ty(dtype: Dtype, name: &'static str, format: Format) -> Ty {
    Ty { dtype, name, format }
}

/// NCCL's 12 datatypes, in `ncclDataType_t`'s order.
pub const TYPES: [Ty; 12] = [
    ty(Dtype::Int8, "i8", Format::Int),
    ty(Dtype::Uint8, "u8", Format::Int),
    ty(Dtype::Int32, "i32", Format::Int),
    ty(Dtype::Uint32, "u32", Format::Int),
    ty(Dtype::Int64, "i64", Format::Int),
    ty(Dtype::Uint64, "u64", Format::Int),
    ty(Dtype::Float16, "f16", Format::Ieee { exp: 5, man: 10 }),
    ty(Dtype::Float32, "f32", Format::Ieee { exp: 8, man: 23 }),
    ty(Dtype::Float64, "f64", Format::Ieee { exp: 11, man: 52 }),
    ty(Dtype::Bfloat16, "bf16", Format::Ieee { exp: 8, man: 7 }),
    ty(Dtype::Float8e4m3, "f8e4m3", Format::E4m3),
    ty(Dtype::Float8e5m2, "f8e5m2", Format::Ieee { exp: 5, man: 2 }),
];

/// Plain bytes, for the copy kernel's row.
pub const BYTES: Ty = ty(Dtype::Uint8, "bytes", Format::Int);

/// Where each buffer sits relative to a 16-byte boundary, and which aliases which.
#[derive(Debug, Clone, Copy)]
pub struct Layout {
    pub name: &'static str,
    pub dst_off: usize,
    pub a_off: usize,
    pub b_off: usize,
    pub dst2_off: usize,
    pub dst2: bool,
    /// dst is exactly a (or b).
    pub in_place_a: bool,
    pub in_place_b: bool,
}

const APART: Layout = Layout {
    name: "apart, 16-aligned",
    dst_off: 0,
    a_off: 0,
    b_off: 0,
    dst2_off: 0,
    dst2: false,
    in_place_a: false,
    in_place_b: false,
};

/// Offsets are multiples of 8, so element-aligned for every type; 8 is not 16-aligned.
pub const LAYOUTS: [Layout; 6] = [
    APART,
    Layout { name: "apart + dst2", dst2: true, ..APART },
    Layout { name: "in place (dst = a)", in_place_a: true, ..APART },
    Layout { name: "in place (dst = b)", in_place_b: true, ..APART },
    Layout { name: "element-aligned + dst2", dst_off: 8, a_off: 8, b_off: 8, dst2_off: 8, dst2: true, ..APART },
    Layout { name: "in place on a, b 8 past 16", b_off: 8, in_place_a: true, ..APART },
];

/// (grid, block): a ragged 1-D grid, one thread, a 3-D grid of 3-D blocks.
pub const SHAPES: [([u32; 3], [u32; 3]); 3] = [([3, 1, 1], [37, 1, 1]), ([1, 1, 1], [1, 1, 1]), ([2, 2, 1], [5, 2, 3])];

/// Bytes at a chosen offset from a 16-byte boundary; its address never moves.
pub struct Buf {
    words: Vec<u128>,
    off: usize,
    len: usize,
}

impl Buf {
    pub fn zeroed(len: usize, off: usize) -> Buf {
        Buf { words: vec![0u128; (off + len) / 16 + 1], off, len }
    }

    pub fn new(bytes: &[u8], off: usize) -> Buf {
        let mut b = Buf::zeroed(bytes.len(), off);
        bytemuck::cast_slice_mut::<u128, u8>(&mut b.words)[off..off + bytes.len()].copy_from_slice(bytes);
        b
    }

    pub fn bytes(&self) -> &[u8] {
        &bytemuck::cast_slice::<u128, u8>(&self.words)[self.off..self.off + self.len]
    }

    pub fn addr(&self) -> usize {
        self.words.as_ptr() as usize + self.off
    }

    /// The buffer as a region: the operations write through it as the kernels do, through
    /// its address, while no Rust reference to the bytes is held.
    pub fn region(&self) -> Region {
        Region::host(self.addr(), self.len)
    }
}

pub fn cpu() -> CpuOps {
    CpuOps
}

pub fn kernel(name: &str) -> &'static HostKernel {
    find(name).unwrap_or_else(|| panic!("the host build has no kernel {name}"))
}

#[derive(Default)]
struct Row {
    cases: u64,
    elements: u64,
    both_nan: u64,
    nan_bits_differ: u64,
    mismatches: u64,
}

/// Results per (datatype, operation), with the first mismatches described.
#[derive(Default)]
pub struct Table {
    rows: BTreeMap<(usize, String), Row>,
    failures: Vec<String>,
}

fn element(bytes: &[u8], i: usize, size: usize) -> u64 {
    let mut b = [0u8; 8];
    b[..size].copy_from_slice(&bytes[i * size..(i + 1) * size]);
    u64::from_le_bytes(b)
}

impl Table {
    /// Compares `got` with `want` element by element; `inputs` only describe a mismatch.
    pub fn compare(&mut self, ty: &Ty, op: &str, case: &str, got: &[u8], want: &[u8], inputs: &[&[u8]]) {
        assert_eq!(got.len(), want.len(), "{case}");
        let order = TYPES.iter().position(|t| t.name == ty.name).unwrap_or(TYPES.len());
        let row = self.rows.entry((order, format!("{} {op}", ty.name))).or_default();
        row.cases += 1;
        let size = ty.size();
        for i in 0..got.len() / size {
            let (g, w) = (element(got, i, size), element(want, i, size));
            row.elements += 1;
            if ty.is_nan(g) && ty.is_nan(w) {
                row.both_nan += 1;
                row.nan_bits_differ += u64::from(g != w);
            } else if g != w {
                row.mismatches += 1;
                if self.failures.len() < 20 {
                    let ins: Vec<String> = inputs.iter().map(|x| format!("{:#x}", element(x, i, size))).collect();
                    self.failures.push(format!("{case}: element {i} of inputs {ins:?}: kernel {g:#x}, CpuOps {w:#x}"));
                }
            }
        }
    }

    /// Prints the table and fails on any mismatch.
    pub fn finish(self, title: &str) {
        let mut out = format!(
            "\n{title}\n{:<22} {:>6} {:>10} {:>9} {:>12} {:>10}\n",
            "type op", "cases", "elements", "both NaN", "NaN bits ≠", "mismatches"
        );
        let mut total = Row::default();
        for ((_, name), r) in &self.rows {
            let _ = writeln!(
                out,
                "{name:<22} {:>6} {:>10} {:>9} {:>12} {:>10}",
                r.cases, r.elements, r.both_nan, r.nan_bits_differ, r.mismatches
            );
            total.cases += r.cases;
            total.elements += r.elements;
            total.both_nan += r.both_nan;
            total.nan_bits_differ += r.nan_bits_differ;
            total.mismatches += r.mismatches;
        }
        let _ = writeln!(
            out,
            "{:<22} {:>6} {:>10} {:>9} {:>12} {:>10}",
            "total", total.cases, total.elements, total.both_nan, total.nan_bits_differ, total.mismatches
        );
        println!("{out}(both NaN: equal as NaN; their payload and sign are not compared)");
        assert!(self.failures.is_empty(), "{} mismatches, first ones:\n{}", total.mismatches, self.failures.join("\n"));
    }
}

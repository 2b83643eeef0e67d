//! [`CpuOps`]: the local operations on host memory, complete when they return.

use topoccl_transports::{MemSpace, Region};

use super::reduce::{divide, reduce_in_place, reduce_into};
use super::{Fence, LocalOps, Workspace};
use crate::error::{Error, Result};
use crate::types::{Dtype, ReduceOp};

/// The host's operations: the vectorised kernels of [`super::reduce`].
#[derive(Debug, Default)]
pub struct CpuOps;

fn host(r: &Region, what: &str) -> Result<()> {
    if r.space == MemSpace::Host {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!("the {what} lies in {}, which the CPU cannot reach", r.space)))
    }
}

fn same_len(a: &Region, b: &Region) -> Result<()> {
    if a.len == b.len {
        Ok(())
    } else {
        Err(Error::Internal(format!("local operation on regions of {} and {} bytes", a.len, b.len)))
    }
}

fn partly(a: &Region, b: &Region) -> Error {
    Error::Internal(format!("local operation on regions that partly overlap: {a:?} and {b:?}"))
}

/// Bytes of the repeated scalar [`CpuOps::scale`] multiplies with (a multiple of every size).
const SCALE_TILE: usize = 4096;

impl LocalOps for CpuOps {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn reaches(&self, space: MemSpace) -> bool {
        space == MemSpace::Host
    }

    unsafe fn copy(&mut self, dst: Region, src: Region) -> Result<Fence> {
        same_len(&dst, &src)?;
        if dst.len == 0 || dst.addr == src.addr {
            return Ok(Fence::DONE);
        }
        host(&dst, "destination")?;
        host(&src, "source")?;
        // SAFETY: both are host memory valid for `len` bytes (this fn's contract); `copy` is
        // memmove, correct for overlapping ranges too, and makes no references.
        unsafe { std::ptr::copy(src.addr as *const u8, dst.addr as *mut u8, dst.len) };
        Ok(Fence::DONE)
    }

    unsafe fn reduce(&mut self, dtype: Dtype, op: ReduceOp, dst: Region, a: Region, b: Region) -> Result<Fence> {
        same_len(&dst, &a)?;
        same_len(&dst, &b)?;
        if dst.len == 0 {
            return Ok(Fence::DONE);
        }
        for (r, what) in [(&dst, "destination"), (&a, "operand"), (&b, "operand")] {
            host(r, what)?;
        }
        // `dst` is exactly one operand (in place; every operator commutes) or apart from both.
        let other = if dst.addr == a.addr {
            Some(b)
        } else if dst.addr == b.addr {
            Some(a)
        } else {
            None
        };
        match other {
            Some(x) if x.overlaps(&dst) => Err(partly(&dst, &x)),
            Some(x) => {
                // SAFETY: host memory valid for `len` bytes (this fn's contract); `x` does not
                // overlap `dst`, so the shared and the mutable view are disjoint.
                let (acc, x) = unsafe { (dst.bytes_mut(), x.bytes()) };
                reduce_in_place(dtype, op, acc, x);
                Ok(Fence::DONE)
            }
            None if dst.overlaps(&a) => Err(partly(&dst, &a)),
            None if dst.overlaps(&b) => Err(partly(&dst, &b)),
            None => {
                // SAFETY: as above; `dst` is apart from both operands (which may overlap each
                // other: both are only read).
                let (d, x, y) = unsafe { (dst.bytes_mut(), a.bytes(), b.bytes()) };
                reduce_into(dtype, op, d, x, y);
                Ok(Fence::DONE)
            }
        }
    }

    unsafe fn scale(&mut self, dtype: Dtype, dst: Region, src: Region, scalar: &[u8]) -> Result<Fence> {
        let size = dtype.size();
        if scalar.len() != size || dst.len % size != 0 {
            return Err(Error::InvalidArgument(format!(
                "PreMulSum: {} bytes of data and a {}-byte scalar are not {} elements",
                dst.len,
                scalar.len(),
                dtype.name()
            )));
        }
        // SAFETY: this fn's contract covers both regions.
        unsafe { self.copy(dst, src)? };
        // The scalar repeated over a small tile, so the product kernel runs unchanged.
        let mut tile = Vec::with_capacity(SCALE_TILE);
        while tile.len() + size <= SCALE_TILE {
            tile.extend_from_slice(scalar);
        }
        // SAFETY: host memory valid for `len` bytes, checked by `copy` above.
        let data = unsafe { dst.bytes_mut() };
        for part in data.chunks_mut(tile.len()) {
            let n = part.len();
            reduce_in_place(dtype, ReduceOp::Prod, part, &tile[..n]);
        }
        Ok(Fence::DONE)
    }

    unsafe fn divide(&mut self, dtype: Dtype, data: Region, n: u32) -> Result<Fence> {
        if data.len == 0 {
            return Ok(Fence::DONE);
        }
        host(&data, "buffer")?;
        // SAFETY: host memory valid for `len` bytes, used by nothing else (this fn's contract).
        divide(dtype, unsafe { data.bytes_mut() }, n);
        Ok(Fence::DONE)
    }

    unsafe fn read(&mut self, out: &mut [u8], src: Region) -> Result<()> {
        if src.len != out.len() {
            return Err(Error::Internal(format!("reading {} bytes into {}", src.len, out.len())));
        }
        if src.len == 0 {
            return Ok(());
        }
        host(&src, "scalar")?;
        // SAFETY: host memory valid for `len` bytes (this fn's contract).
        out.copy_from_slice(unsafe { src.bytes() });
        Ok(())
    }

    fn done(&mut self, _fence: Fence) -> Result<bool> {
        Ok(true)
    }

    fn alloc(&mut self, bytes: usize) -> Result<Workspace> {
        let mut words = vec![0u64; bytes.div_ceil(8).max(1)];
        let region = Region::host(words.as_mut_ptr() as usize, bytes);
        // The Vec's heap block does not move when the Vec is boxed, so `region` stays valid
        // for as long as the workspace owns it.
        Ok(Workspace::new(region, Box::new(words)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32s(v: &[f32]) -> Vec<u8> {
        bytemuck::cast_slice(v).to_vec()
    }

    #[test]
    fn reduce_in_place_apart_and_refuses_partial_overlap() {
        let mut ops = CpuOps;
        let mut a = f32s(&[1.0, 2.0, 3.0]);
        let b = f32s(&[10.0, 20.0, 30.0]);
        let mut d = vec![0u8; 12];
        let (ra, rb, rd) = (Region::of_mut(&mut a), Region::of(&b), Region::of_mut(&mut d));
        // SAFETY: every region is a live local vector.
        unsafe {
            ops.reduce(Dtype::Float32, ReduceOp::Sum, rd, ra, rb).unwrap();
            ops.reduce(Dtype::Float32, ReduceOp::Max, ra, rb, ra).unwrap();
            assert!(ops.reduce(Dtype::Float32, ReduceOp::Sum, ra, ra, ra).is_err());
            let shifted = Region::host(ra.addr + 4, 8);
            assert!(ops.reduce(Dtype::Float32, ReduceOp::Sum, ra.sub(0, 8).unwrap(), shifted, shifted).is_err());
        }
        assert_eq!(bytemuck::cast_slice::<u8, f32>(&d), [11.0, 22.0, 33.0]);
        assert_eq!(bytemuck::cast_slice::<u8, f32>(&a), [10.0, 20.0, 30.0]);
    }

    #[test]
    fn scale_divide_copy_and_alloc() {
        let mut ops = CpuOps;
        let src: Vec<f32> = (0..3000).map(|i| i as f32).collect();
        let w = ops.alloc(12000).unwrap();
        // SAFETY: `src` and the workspace are live host memory of 12000 bytes.
        unsafe {
            ops.scale(Dtype::Float32, w.region(), Region::of(bytemuck::cast_slice(&src)), &0.5f32.to_ne_bytes())
                .unwrap();
            ops.divide(Dtype::Float32, w.region(), 2).unwrap();
            let got: &[f32] = bytemuck::cast_slice(w.region().bytes());
            assert!(got.iter().enumerate().all(|(i, x)| *x == i as f32 * 0.25));
            assert!(ops.scale(Dtype::Float64, w.region(), w.region(), &[0u8; 4]).is_err());
            let mut one = [0u8; 4];
            ops.read(&mut one, w.region().sub(4, 4).unwrap()).unwrap();
            assert_eq!(f32::from_ne_bytes(one), 0.25);
            let r = w.region();
            ops.copy(r.sub(0, 8).unwrap(), r.sub(4, 8).unwrap()).unwrap();
            assert_eq!(&bytemuck::cast_slice::<u8, f32>(r.bytes())[..2], [0.25, 0.5]);
        }
        let device = Region::new(MemSpace::Device(0), 64, 4);
        // SAFETY: the device region is refused before anything is touched.
        assert!(unsafe { ops.copy(device, device.sub(0, 4).unwrap()) }.is_ok()); // same address
                                                                                 // SAFETY: as above.
        assert!(unsafe { ops.divide(Dtype::Float32, device, 2) }.is_err());
    }
}

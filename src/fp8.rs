//! The two 8-bit float formats of NCCL 2.24 (`ncclFloat8e4m3`, `ncclFloat8e5m2`: OCP's E4M3FN
//! and E5M2, as CUDA's `__nv_fp8_e4m3`/`__nv_fp8_e5m2`), converted to and from `f32`.
//!
//! Reductions widen to `f32`, reduce, and narrow once per step, rounding to nearest even and
//! saturating to the largest finite value as NCCL's kernels do (`__NV_SATFINITE`): a sum that
//! overflows gives ±max, never an infinity; NaN stays NaN.

/// One of the two formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fp8 {
    /// 4 exponent bits (bias 7), 3 mantissa bits, no infinities; max 448.
    E4m3,
    /// 5 exponent bits (bias 15), 2 mantissa bits, IEEE-style infinities; max 57344.
    E5m2,
}

impl Fp8 {
    const fn mantissa_bits(self) -> u32 {
        match self {
            Fp8::E4m3 => 3,
            Fp8::E5m2 => 2,
        }
    }

    const fn bias(self) -> i32 {
        match self {
            Fp8::E4m3 => 7,
            Fp8::E5m2 => 15,
        }
    }

    /// The code of the largest finite magnitude.
    const fn max_code(self) -> u8 {
        match self {
            Fp8::E4m3 => 0x7e,
            Fp8::E5m2 => 0x7b,
        }
    }

    /// The code CUDA gives NaN.
    const fn nan_code(self) -> u8 {
        0x7f
    }

    /// Whether the magnitude `code` (sign cleared) is NaN (or, for E5M2, infinite: `inf`).
    fn special(self, code: u8) -> Option<f32> {
        match self {
            Fp8::E4m3 => (code == 0x7f).then_some(f32::NAN),
            Fp8::E5m2 => match code {
                0x7c => Some(f32::INFINITY),
                0x7d..=0x7f => Some(f32::NAN),
                _ => None,
            },
        }
    }

    /// The value of `code`.
    pub fn to_f32(self, code: u8) -> f32 {
        let sign = if code & 0x80 != 0 { -1.0 } else { 1.0 };
        let mag = code & 0x7f;
        if let Some(v) = self.special(mag) {
            return sign * v;
        }
        let m = self.mantissa_bits();
        let exp = i32::from(mag >> m);
        let frac = f32::from(mag & ((1 << m) - 1));
        let scale = (1u32 << m) as f32;
        let v = if exp == 0 {
            frac / scale * 2f32.powi(1 - self.bias())
        } else {
            (1.0 + frac / scale) * 2f32.powi(exp - self.bias())
        };
        sign * v
    }

    /// `x` rounded to nearest even, saturated to the largest finite value.
    pub fn from_f32(self, x: f32) -> u8 {
        let sign = if x.is_sign_negative() { 0x80u8 } else { 0 };
        if x.is_nan() {
            return sign | self.nan_code();
        }
        let a = x.abs();
        let m = self.mantissa_bits();
        let min_normal_exp = 1 - self.bias();
        let code = if a < 2f32.powi(min_normal_exp) {
            // Subnormal (or zero): a multiple of the smallest step, rounded half to even. The
            // division is by a power of two, so exact; a result of 2^m is the smallest normal.
            let q = f64::from(a) / 2f64.powi(min_normal_exp - m as i32);
            round_half_even(q).min(f64::from(u8::MAX)) as u32
        } else if a.is_infinite() {
            u32::from(self.max_code())
        } else {
            // Normal: keep the top `m` mantissa bits of the f32, rounding half to even; a carry
            // out of the mantissa moves into the exponent, as it should.
            let bits = a.to_bits();
            let shift = 23 - m;
            let mut r = bits >> shift;
            let rem = bits & ((1 << shift) - 1);
            let half = 1 << (shift - 1);
            if rem > half || (rem == half && r & 1 == 1) {
                r += 1;
            }
            let exp32 = (r >> m) as i32;
            // At least 1 (the value is normal here); a result past the largest finite code
            // saturates below.
            let exp8 = (exp32 - 127 + self.bias()) as u32;
            (exp8 << m) | (r & ((1 << m) - 1))
        };
        sign | code.min(u32::from(self.max_code())) as u8
    }
}

fn round_half_even(q: f64) -> f64 {
    let f = q.floor();
    let d = q - f;
    if d > 0.5 || (d == 0.5 && f % 2.0 != 0.0) {
        f + 1.0
    } else {
        f
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_round_trips() {
        for f in [Fp8::E4m3, Fp8::E5m2] {
            for code in 0..=255u8 {
                let v = f.to_f32(code);
                if v.is_nan() {
                    assert!(f.to_f32(f.from_f32(v)).is_nan());
                } else if v.is_infinite() {
                    assert_eq!(f.from_f32(v) & 0x7f, f.max_code(), "{f:?} inf saturates");
                } else {
                    assert_eq!(f.from_f32(v), code, "{f:?} {code:#x} = {v}");
                }
            }
        }
    }

    #[test]
    fn known_values_rounding_and_saturation() {
        assert_eq!(Fp8::E4m3.to_f32(0x7e), 448.0);
        assert_eq!(Fp8::E5m2.to_f32(0x7b), 57344.0);
        assert_eq!(Fp8::E4m3.to_f32(0x01), 2f32.powi(-9));
        assert_eq!(Fp8::E5m2.to_f32(0x01), 2f32.powi(-16));
        assert_eq!(Fp8::E4m3.from_f32(1000.0), 0x7e);
        assert_eq!(Fp8::E4m3.from_f32(-1000.0), 0xfe);
        assert_eq!(Fp8::E5m2.from_f32(f32::INFINITY), 0x7b);
        // 17 lies halfway between 16 and 18 (E4M3's step there is 2): even mantissa wins.
        assert_eq!(Fp8::E4m3.to_f32(Fp8::E4m3.from_f32(17.0)), 16.0);
        assert_eq!(Fp8::E4m3.to_f32(Fp8::E4m3.from_f32(19.0)), 20.0);
        assert_eq!(Fp8::E4m3.to_f32(Fp8::E4m3.from_f32(3.0)), 3.0);
        // Rounding up out of the subnormals lands on the smallest normal.
        assert_eq!(Fp8::E4m3.from_f32(2f32.powi(-6) * 0.999), 0x08);
        assert_eq!(Fp8::E4m3.from_f32(-0.0), 0x80);
    }
}

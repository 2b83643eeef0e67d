//! Input bit patterns that break arithmetic: special values of each format, every code of the
//! 1-byte types, random bits, and near neighbours (whose sums cancel).

use super::{Format, Ty};

/// splitmix64: a fixed, seedable stream (the tests must not vary from run to run).
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

fn mask(ty: &Ty) -> u64 {
    u64::MAX >> (64 - 8 * ty.size())
}

/// The values most likely to be mishandled, as bit patterns.
pub fn specials(ty: &Ty) -> Vec<u64> {
    let (m, sign) = (mask(ty), 1u64 << (8 * ty.size() - 1));
    let (exp, man) = match ty.format {
        Format::Int => {
            let v = [0, 1, 2, 3, 7, 100, m, m - 1, sign, sign - 1, sign + 1, sign >> 1, 0x5555_5555_5555_5555 & m];
            return v.to_vec();
        }
        Format::Ieee { exp, man } => (exp, man),
        Format::E4m3 => (4, 3),
    };
    let inf = ((1u64 << exp) - 1) << man;
    let bias = (1u64 << (exp - 1)) - 1;
    let one = bias << man;
    let positive = [
        0,                          // +0
        1,                          // smallest subnormal
        (1 << man) - 1,             // largest subnormal
        1 << man,                   // smallest normal
        inf - 1,                    // largest finite (E4M3: 240; its 448 is below)
        inf,                        // inf (E4M3: 256)
        inf | (1 << (man - 1)),     // quiet NaN
        inf | 1,                    // signalling NaN
        inf | ((1 << man) - 1),     // NaN with every payload bit (E4M3: its NaN)
        inf | (1 << (man - 1)) | 2, // quiet NaN with a payload
        one,                        // 1
        one | 1,                    // 1 + ulp
        (bias - 1) << man,          // 0.5
        (bias + 1) << man | 1,      // 2 + ulp
        inf - (1 << man),           // the top binade's first value
    ];
    positive.iter().flat_map(|&v| [v & m, (v | sign) & m]).collect()
}

fn to_bytes(ty: &Ty, values: &[u64]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()[..ty.size()].to_vec()).collect()
}

/// One element: a special (a quarter of the time) or random bits.
fn one(ty: &Ty, rng: &mut Rng, sp: &[u64]) -> u64 {
    let r = rng.next();
    if r % 4 == 0 {
        sp[(r >> 8) as usize % sp.len()]
    } else {
        rng.next() & mask(ty)
    }
}

/// Operand pairs: every pair of codes for 1-byte types; otherwise every pair of specials,
/// then random operands with a second operand that is random, special, or a near neighbour
/// of the first with either sign (so sums cancel and round at every exponent). The count is
/// odd, never a multiple of a 16-byte vector.
pub fn pairs(ty: &Ty) -> (Vec<u8>, Vec<u8>) {
    let (mut a, mut b) = (Vec::new(), Vec::new());
    if ty.size() == 1 {
        for x in 0..=255u64 {
            for y in 0..=255u64 {
                a.push(x);
                b.push(y);
            }
        }
        // One more so the length is not a multiple of 16.
        a.push(0x7f);
        b.push(0x80);
    } else {
        let sp = specials(ty);
        for x in &sp {
            for y in &sp {
                a.push(*x);
                b.push(*y);
            }
        }
        let mut rng = Rng::new(ty.dtype as u64 + 1);
        let sign = 1u64 << (8 * ty.size() - 1);
        while a.len() < 6001 || a.len() % 2 == 0 {
            let x = one(ty, &mut rng, &sp);
            let y = match rng.next() % 4 {
                0 => one(ty, &mut rng, &sp),
                1 => x ^ (rng.next() & 0xfff & mask(ty)),
                2 => (x ^ sign ^ (rng.next() & 0xff)) & mask(ty),
                _ => rng.next() & mask(ty),
            };
            a.push(x);
            b.push(y);
        }
    }
    (to_bytes(ty, &a), to_bytes(ty, &b))
}

/// Single operands (scale, divide): every code for 1-byte types, else specials and random.
pub fn singles(ty: &Ty) -> Vec<u8> {
    if ty.size() == 1 {
        return (0..=255u8).chain([0x7f]).collect();
    }
    let sp = specials(ty);
    let mut rng = Rng::new(ty.dtype as u64 + 100);
    let mut v = sp.clone();
    while v.len() < 1001 {
        v.push(one(ty, &mut rng, &sp));
    }
    to_bytes(ty, &v)
}

/// Scalars for scale: every code for 1-byte types, else specials and a few random values.
pub fn scalars(ty: &Ty) -> Vec<u64> {
    if ty.size() == 1 {
        return (0..=255).collect();
    }
    let mut rng = Rng::new(ty.dtype as u64 + 200);
    let mut v = specials(ty);
    v.extend((0..8).map(|_| rng.next() & mask(ty)));
    v
}

pub fn random_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut rng = Rng::new(seed);
    (0..n).map(|_| rng.next() as u8).collect()
}

//! Shared generators of the integration tests: seeded corpora rich in exact
//! ties, signed zeros, subnormals and overflow, built from a proptest-chosen
//! seed so that large cases stay cheap to generate.

#![allow(dead_code)]

use topk_core::Neighbor;

/// splitmix64: tiny, seeded, good enough to spread test values.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// Uniform in [-1, 1).
    pub fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// How the values of one row (or query) are drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Uniform floats in [-1, 1).
    Uniform,
    /// Integers in -3..=3, zeros of either sign: many exactly equal scores.
    SmallInt,
    /// A copy of an earlier row (a uniform row when there is none).
    Duplicate,
    /// Every value the same.
    Constant,
    /// All zeros, some of them `-0.0` (cosine scores `-inf`).
    Zero,
    /// Subnormal values mixed with small normal ones.
    Subnormal,
    /// Values up to 1e30: products overflow to infinities and NaN scores.
    Huge,
}

pub const KINDS: [Kind; 7] = [
    Kind::Uniform,
    Kind::SmallInt,
    Kind::Duplicate,
    Kind::Constant,
    Kind::Zero,
    Kind::Subnormal,
    Kind::Huge,
];

/// The kinds whose bit is set in `mask` (bit i ↔ `KINDS[i]`); uniform when none.
pub fn palette(mask: u8) -> Vec<Kind> {
    let p: Vec<Kind> = KINDS
        .iter()
        .enumerate()
        .filter(|(i, _)| mask & (1 << i) != 0)
        .map(|(_, &k)| k)
        .collect();
    if p.is_empty() {
        vec![Kind::Uniform]
    } else {
        p
    }
}

fn value(rng: &mut Rng, kind: Kind) -> f32 {
    match kind {
        Kind::Uniform | Kind::Duplicate => rng.unit(),
        Kind::SmallInt => {
            let v = rng.below(7) as f32 - 3.0;
            if v == 0.0 && rng.below(2) == 0 {
                -0.0
            } else {
                v
            }
        }
        Kind::Constant | Kind::Zero => unreachable!("whole-row kinds"),
        Kind::Subnormal => match rng.below(4) {
            0 => f32::from_bits(1 + rng.below(0x007F_FFFF) as u32),
            1 => -f32::from_bits(1 + rng.below(0x007F_FFFF) as u32),
            2 => rng.unit() * 1e-30,
            _ => rng.unit(),
        },
        Kind::Huge => rng.unit() * 10f32.powi(rng.below(31) as i32),
    }
}

/// One vector of `d` values of `kind`; `earlier` holds the rows made so far.
pub fn vector(rng: &mut Rng, kind: Kind, d: usize, earlier: &[f32]) -> Vec<f32> {
    match kind {
        Kind::Duplicate if !earlier.is_empty() => {
            let i = rng.below(earlier.len() / d);
            earlier[i * d..(i + 1) * d].to_vec()
        }
        Kind::Constant => {
            let c = [1.0, -0.5, 0.25, 3.0][rng.below(4)];
            vec![c; d]
        }
        Kind::Zero => (0..d)
            .map(|_| if rng.below(2) == 0 { 0.0 } else { -0.0 })
            .collect(),
        k => (0..d).map(|_| value(rng, k)).collect(),
    }
}

/// One vector whose kind is drawn from `kinds`.
pub fn vector_of(rng: &mut Rng, kinds: &[Kind], d: usize, earlier: &[f32]) -> Vec<f32> {
    let kind = kinds[rng.below(kinds.len())];
    vector(rng, kind, d, earlier)
}

/// A row-major `n × d` corpus whose rows draw their kind from `kinds`.
pub fn corpus(seed: u64, n: usize, d: usize, kinds: &[Kind]) -> Vec<f32> {
    let mut rng = Rng::new(seed);
    let mut data = Vec::with_capacity(n * d);
    for _ in 0..n {
        let kind = kinds[rng.below(kinds.len())];
        let row = vector(&mut rng, kind, d, &data);
        data.extend_from_slice(&row);
    }
    data
}

/// `q` queries for a corpus: fresh vectors of the palette, copies of corpus
/// rows (exact best matches, ties among duplicates) and zero vectors.
pub fn queries(seed: u64, q: usize, d: usize, kinds: &[Kind], corpus: &[f32]) -> Vec<f32> {
    let mut rng = Rng::new(seed ^ 0x5151_5151);
    let mut out = Vec::with_capacity(q * d);
    for _ in 0..q {
        let v = match rng.below(4) {
            0 => vector(&mut rng, Kind::Duplicate, d, corpus),
            1 if rng.below(4) == 0 => vector(&mut rng, Kind::Zero, d, corpus),
            _ => {
                let kind = kinds[rng.below(kinds.len())];
                vector(&mut rng, kind, d, corpus)
            }
        };
        out.extend_from_slice(&v);
    }
    out
}

/// Compares two result lists bit for bit, describing the first difference.
pub fn bitwise_diff(got: &[Neighbor], want: &[Neighbor]) -> Option<String> {
    if got.len() != want.len() {
        return Some(format!("{} results, expected {}", got.len(), want.len()));
    }
    got.iter()
        .zip(want)
        .enumerate()
        .find(|(_, (g, w))| g.index != w.index || g.score.to_bits() != w.score.to_bits())
        .map(|(rank, (g, w))| {
            format!(
                "rank {rank}: got row {} score {:e} ({:#010x}), expected row {} score {:e} ({:#010x})",
                g.index,
                g.score,
                g.score.to_bits(),
                w.index,
                w.score,
                w.score.to_bits()
            )
        })
}

//! Seeded corpora rich in exact ties, signed zeros, subnormals and overflow,
//! and the bit-for-bit comparison of two result lists.
//!
//! Every generator is a pure function of its seed, so a failing case is
//! reproduced from the seed its message prints.

use topk_core::Neighbor;

/// splitmix64: tiny, seeded, good enough to spread test values.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n` ≥ 1).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }

    /// Uniform in [-1, 1).
    pub fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// How the values of one row (or query) are drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// Uniform floats in [-1, 1).
    Uniform,
    /// Integers in -3..=3, zeros of either sign: many exactly equal scores.
    SmallInt,
    /// A copy of an earlier row (a uniform row when there is none): shuffled duplicates.
    Duplicate,
    /// Every value the same.
    Constant,
    /// All zeros, some of them `-0.0` (cosine scores `-inf`).
    Zero,
    /// Subnormal values mixed with small normal ones.
    Subnormal,
    /// Values up to the overflow rule's limit (a squared norm near 2^100,
    /// `docs/CONTRACTS.md §4`): the largest scores the contracts allow.
    Huge,
    /// Values up to 1e30, beyond the overflow rule: products overflow to
    /// infinities and NaN scores. Every backend rejects such a corpus; only
    /// kernel-level tests, below the input rules, use it. Not in [`KINDS`].
    Overflow,
}

/// Every [`Kind`] a backend accepts, in the order of the bits of [`palette`].
pub const KINDS: [Kind; 7] = [
    Kind::Uniform,
    Kind::SmallInt,
    Kind::Duplicate,
    Kind::Constant,
    Kind::Zero,
    Kind::Subnormal,
    Kind::Huge,
];

/// The kinds whose bit is set in `mask` (bit i ↔ `KINDS[i]`, bit 7 ↔
/// [`Kind::Overflow`]); uniform when none.
pub fn palette(mask: u8) -> Vec<Kind> {
    let p: Vec<Kind> = KINDS
        .iter()
        .enumerate()
        .filter(|(i, _)| mask & (1 << i) != 0)
        .map(|(_, &k)| k)
        .chain((mask & 0x80 != 0).then_some(Kind::Overflow))
        .collect();
    if p.is_empty() {
        vec![Kind::Uniform]
    } else {
        p
    }
}

/// One value of a per-value kind in a vector of `d` values (the whole-row
/// kinds draw uniform values).
fn value(rng: &mut Rng, kind: Kind, d: usize) -> f32 {
    match kind {
        Kind::Uniform | Kind::Duplicate | Kind::Constant | Kind::Zero => rng.unit(),
        Kind::SmallInt => {
            let v = rng.below(7) as f32 - 3.0;
            if v == 0.0 && rng.below(2) == 0 {
                -0.0
            } else {
                v
            }
        }
        Kind::Subnormal => match rng.below(4) {
            0 => f32::from_bits(1 + rng.below(0x007F_FFFF) as u32),
            1 => -f32::from_bits(1 + rng.below(0x007F_FFFF) as u32),
            2 => rng.unit() * 1e-30,
            _ => rng.unit(),
        },
        Kind::Overflow => rng.unit() * 10f32.powi(rng.below(31) as i32),
        Kind::Huge => {
            // |v| < 2^50 / sqrt(d), so that d · max² stays within 2^100.
            let limit = (1u64 << 50) as f32 / (d.max(1) as f32).sqrt();
            rng.unit() * limit * 10f32.powi(-(rng.below(4) as i32))
        }
    }
}

/// One vector of `d` values of `kind`; `earlier` holds the rows made so far.
pub fn vector(rng: &mut Rng, kind: Kind, d: usize, earlier: &[f32]) -> Vec<f32> {
    match kind {
        Kind::Duplicate if !earlier.is_empty() && d > 0 => {
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
        k => (0..d).map(|_| value(rng, k, d)).collect(),
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
            _ => vector_of(&mut rng, kinds, d, corpus),
        };
        out.extend_from_slice(&v);
    }
    out
}

/// A corpus of `distinct` random rows repeated in shuffled order until it has
/// `n` rows: every score is tied `n / distinct` ways.
pub fn shuffled_duplicates(seed: u64, n: usize, d: usize, distinct: usize) -> Vec<f32> {
    let mut rng = Rng::new(seed);
    let base = corpus(seed, distinct.clamp(1, n.max(1)), d, &[Kind::SmallInt]);
    let rows = base.len() / d.max(1);
    let mut data = Vec::with_capacity(n * d);
    for _ in 0..n {
        let i = rng.below(rows);
        data.extend_from_slice(&base[i * d..(i + 1) * d]);
    }
    data
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generators_are_pure_functions_of_the_seed() {
        let kinds = palette(0x7f);
        assert_eq!(corpus(3, 50, 9, &kinds), corpus(3, 50, 9, &kinds));
        let c = corpus(3, 50, 9, &kinds);
        assert_eq!(queries(4, 5, 9, &kinds, &c), queries(4, 5, 9, &kinds, &c));
        assert_eq!(c.len(), 50 * 9);
    }

    #[test]
    fn kinds_produce_what_they_promise() {
        let mut rng = Rng::new(1);
        let z = vector(&mut rng, Kind::Zero, 64, &[]);
        assert!(z.iter().all(|v| *v == 0.0) && z.iter().any(|v| v.is_sign_negative()));
        let s = corpus(2, 40, 16, &[Kind::Subnormal]);
        assert!(s.iter().any(|v| v.is_subnormal()));
        let h = corpus(2, 40, 16, &[Kind::Huge]);
        assert!(h.iter().any(|v| v.abs() > 1e13));
        for row in h.chunks_exact(16) {
            assert!(topk_core::validate::corpus(row, 16).is_ok(), "{row:?}");
        }
        let d = shuffled_duplicates(5, 30, 4, 3);
        let mut rows: Vec<&[f32]> = d.chunks_exact(4).collect();
        rows.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
        rows.dedup();
        assert!(rows.len() <= 3, "{} distinct rows", rows.len());
    }

    #[test]
    fn bitwise_diff_sees_the_sign_of_zero() {
        let a = [Neighbor::new(0, 0.0)];
        let b = [Neighbor::new(0, -0.0)];
        assert_eq!(bitwise_diff(&a, &a), None);
        assert!(bitwise_diff(&a, &b).is_some_and(|m| m.contains("rank 0")));
        assert!(bitwise_diff(&a, &[]).is_some_and(|m| m.contains("expected 0")));
    }
}

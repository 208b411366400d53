//! The certified bounds of one approximate dot product per metric, the
//! norms they are built from, and the cut that turns a block's bound at a
//! threshold into one compare on the approximate dot (the parent module's
//! docs give the derivation).

use std::cmp::Ordering;

use rayon::prelude::*;
use topk_core::order::{ordered_bits, score_from_ordered_bits};

/// Absolute term of every width (subnormal results).
const ABS: f32 = f32::from_bits(27 << 23); // 2^-100: biased exponent 127 - 100

/// `C_D = (D + 64) · 2^-22`, the relative width.
pub(super) fn width_factor(dim: usize) -> f32 {
    (dim as f32 + 64.0) * (1.0 / 4_194_304.0)
}

/// Rounds `v ≥ 0` up to an `f32`, after a relative margin of `2^-30` for
/// the `f64` sum's own error (at most `D · 2^-53 ≤ 2^-37`).
fn up(v: f64) -> f32 {
    let v = v * (1.0 + 1.0 / (1u64 << 30) as f64);
    let f = v as f32;
    if f64::from(f) < v {
        f.next_up()
    } else {
        f
    }
}

/// `Σ x_d²` in `f64`, where every square is exact.
fn sq64(x: &[f32]) -> f64 {
    let mut acc = [0.0_f64; 8];
    let chunks = x.chunks_exact(8);
    let tail = chunks.remainder();
    for c in chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            let v = f64::from(v);
            *a += v * v;
        }
    }
    let mut s: f64 = acc.iter().sum();
    for &v in tail {
        s += f64::from(v) * f64::from(v);
    }
    s
}

/// Upward norms and squared norms of row-major vectors, for the widths.
#[derive(Debug, Clone, Default)]
pub(crate) struct BoundNorms {
    /// `‖x‖`, rounded up.
    pub(super) norm: Vec<f32>,
    /// `‖x‖²`, rounded up.
    pub(super) sq: Vec<f32>,
}

impl BoundNorms {
    /// Appends the norms of `more` (the next rows).
    pub(crate) fn extend(&mut self, more: BoundNorms) {
        self.norm.extend(more.norm);
        self.sq.extend(more.sq);
    }

    /// The norms of every `dim`-long vector of `data`.
    pub(crate) fn of(data: &[f32], dim: usize) -> BoundNorms {
        let (norm, sq) = data
            .par_chunks(dim * 256)
            .flat_map_iter(|block| {
                block.chunks_exact(dim).map(|x| {
                    let s = sq64(x);
                    (up(s.sqrt()), up(s))
                })
            })
            .unzip();
        BoundNorms { norm, sq }
    }
}

/// The bounds of one metric: per query parameters `(a, b)` and per row the
/// slices of one row block.
pub(super) trait Bounds: Sync {
    /// An upper bound of `hi` over every row of the block whose approximate
    /// dot is at most `s`, from the block's extreme norms, valid against the
    /// threshold `t` (> `-inf`): a value below `t` proves no such row reaches
    /// `t`. It is non-decreasing in `s` (rounding is monotone). `None` where
    /// the metric has no such bound at this `t` (each row is then tested).
    fn block_hi(&self, a: f32, b: f32, t: f32, s: f32) -> Option<f32>;
    /// About the largest `s` whose [`Bounds::block_hi`] is below `t`; the
    /// cut is found from here and checked (see [`cut`]).
    fn cut_estimate(&self, a: f32, b: f32, t: f32) -> f32;
    /// Both bounds of block row `i` for approximate dot `s`.
    fn lo_hi(&self, a: f32, b: f32, s: f32, i: usize) -> (f32, f32);
}

/// A cut for threshold `t`: every row of the block whose approximate dot is
/// at most the cut has an upper bound below `t`, because the block's bound at
/// the cut, checked here, is below `t` and the bound is non-decreasing.
/// `None` where no cut is known (every row is then tested): `t` is `-inf`,
/// the metric has no block bound at this `t`, or no candidate checks out.
pub(super) fn cut<B: Bounds>(bounds: &B, a: f32, b: f32, t: f32) -> Option<f32> {
    if t.is_nan() || t == f32::NEG_INFINITY {
        return None;
    }
    let floor = ordered_bits(f32::NEG_INFINITY);
    let mut c = bounds.cut_estimate(a, b, t);
    let mut step = 1_u32;
    // The estimate is within a few units in the last place; the steps down
    // double, so a cut is found in a few checks or none in 32.
    for _ in 0..32 {
        if c.is_nan() {
            return None;
        }
        if !reaches(bounds.block_hi(a, b, t, c)?, t) {
            return Some(c);
        }
        c = score_from_ordered_bits(ordered_bits(c).saturating_sub(step).max(floor));
        step = step.saturating_mul(2);
    }
    None
}

/// dot: `a = C_D·qb`.
pub(super) struct DotBounds<'a> {
    xb: &'a [f32],
    /// The largest of `xb`.
    xb_max: f32,
}

impl<'a> DotBounds<'a> {
    pub(super) fn new(xb: &'a [f32]) -> Self {
        let xb_max = xb.iter().fold(0.0_f32, |m, &v| m.max(v));
        DotBounds { xb, xb_max }
    }
}

impl Bounds for DotBounds<'_> {
    #[inline(always)]
    fn block_hi(&self, a: f32, _b: f32, _t: f32, s: f32) -> Option<f32> {
        // fl(s + fl(fl(a·xb) + ABS)) grows with s and xb.
        Some(s + (a * self.xb_max + ABS))
    }

    #[inline(always)]
    fn cut_estimate(&self, a: f32, _b: f32, t: f32) -> f32 {
        t - (a * self.xb_max + ABS)
    }

    #[inline(always)]
    fn lo_hi(&self, a: f32, _b: f32, s: f32, i: usize) -> (f32, f32) {
        let w = a * self.xb[i] + ABS;
        (s - w, s + w)
    }
}

/// l2: `a = qq`.
pub(super) struct L2Bounds<'a> {
    xx: &'a [f32],
    c: f32,
    /// The smallest and largest of `xx`.
    xx_min: f32,
    xx_max: f32,
}

impl<'a> L2Bounds<'a> {
    pub(super) fn new(xx: &'a [f32], c: f32) -> Self {
        let (xx_min, xx_max) = xx.iter().fold((f32::INFINITY, 0.0_f32), |(lo, hi), &v| {
            (lo.min(v), hi.max(v))
        });
        L2Bounds {
            xx,
            c,
            xx_min,
            xx_max,
        }
    }
}

impl Bounds for L2Bounds<'_> {
    #[inline(always)]
    fn block_hi(&self, a: f32, _b: f32, _t: f32, s: f32) -> Option<f32> {
        // fl(fl(2s − e) + fl(c·e + ABS)) with e = fl(a + xx): the first term
        // grows with s and falls with e, the second grows with e.
        let v = 2.0 * s - (a + self.xx_min);
        Some(v + (self.c * (a + self.xx_max) + ABS))
    }

    #[inline(always)]
    fn cut_estimate(&self, a: f32, _b: f32, t: f32) -> f32 {
        (t - (self.c * (a + self.xx_max) + ABS) + (a + self.xx_min)) * 0.5
    }

    #[inline(always)]
    fn lo_hi(&self, a: f32, _b: f32, s: f32, i: usize) -> (f32, f32) {
        let e = a + self.xx[i];
        let v = 2.0 * s - e;
        let w = self.c * e + ABS;
        (v - w, v + w)
    }
}

/// cosine: `a = C_D·qb`, `b = qn` (the canonical query norm).
pub(super) struct CosineBounds<'a> {
    xb: &'a [f32],
    rn: &'a [f32],
    /// The largest of `xb`.
    xb_max: f32,
    /// The smallest positive of `rn` (`+inf` when none is).
    rn_min: f32,
}

impl<'a> CosineBounds<'a> {
    pub(super) fn new(xb: &'a [f32], rn: &'a [f32]) -> Self {
        let xb_max = xb.iter().fold(0.0_f32, |m, &v| m.max(v));
        let rn_min = rn
            .iter()
            .filter(|&&v| v > 0.0)
            .fold(f32::INFINITY, |m, &v| m.min(v));
        CosineBounds {
            xb,
            rn,
            xb_max,
            rn_min,
        }
    }
}

impl Bounds for CosineBounds<'_> {
    #[inline(always)]
    fn block_hi(&self, a: f32, b: f32, t: f32, s: f32) -> Option<f32> {
        // Against t > 0 only. A row with den = 0 scores -inf. Otherwise its
        // hi = fl(n / den) with n = fl(s + w) ≤ N = fl(s + fl(a·xb_max + ABS)):
        // where n ≤ 0, hi ≤ 0 < t; where n > 0, hi ≤ fl(N / den_min) with
        // den_min = fl(b·rn_min) > 0, the division falling with den and
        // rising with n. Both cases are below t once fl(N / den_min) is.
        let den_min = b * self.rn_min;
        if t.is_nan() || t <= 0.0 || den_min.is_nan() || den_min <= 0.0 || den_min.is_infinite() {
            return None;
        }
        Some((s + (a * self.xb_max + ABS)) / den_min)
    }

    #[inline(always)]
    fn cut_estimate(&self, a: f32, b: f32, t: f32) -> f32 {
        t * (b * self.rn_min) - (a * self.xb_max + ABS)
    }

    #[inline(always)]
    fn lo_hi(&self, a: f32, b: f32, s: f32, i: usize) -> (f32, f32) {
        // The same product as `cosine_from_parts`, so `den` has the score's bits.
        let den = b * self.rn[i];
        if den == 0.0 {
            return (f32::NEG_INFINITY, f32::NEG_INFINITY);
        }
        let w = a * self.xb[i] + ABS;
        ((s - w) / den, (s + w) / den)
    }
}

/// Whether an upper bound `hi` reaches the threshold `t`: `hi ≥ t`, and also
/// a NaN (which the overflow rule excludes), so that no row is ever dropped
/// for want of a comparison.
#[inline(always)]
pub(super) fn reaches(hi: f32, t: f32) -> bool {
    hi.partial_cmp(&t) != Some(Ordering::Less)
}

//! The certified bounds of one approximate dot product per metric, the
//! norms they are built from, and the cut that turns a block's bound at a
//! threshold into one compare on the approximate dot (the parent module's
//! docs give the derivation).

use std::cmp::Ordering;

use rayon::prelude::*;
use topk_core::order::{ordered_bits, score_from_ordered_bits};

use crate::corpus::CorpusRef;

/// Absolute term of every width (subnormal results).
const ABS: f32 = f32::from_bits(27 << 23); // 2^-100: biased exponent 127 - 100

/// `C_D = (D + 64) · 2^-22`, the relative width.
pub(super) fn width_factor(dim: usize) -> f32 {
    (dim as f32 + 64.0) * (1.0 / 4_194_304.0)
}

/// What the bounds know about one query: `a` and `b` per metric (see
/// [`Bounds`]), and the factors `a1`, `a2` of the int8 product's error
/// (zero for the f32 product).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(super) struct QueryBound {
    pub(super) a: f32,
    pub(super) b: f32,
    pub(super) a1: f32,
    pub(super) a2: f32,
}

impl QueryBound {
    /// A query of the f32 product.
    pub(super) fn new(a: f32, b: f32) -> QueryBound {
        QueryBound {
            a,
            b,
            ..QueryBound::default()
        }
    }
}

/// The per-row factors of the int8 product's error over one row block: the
/// approximate dot of row `i` is off the exact one by at most
/// `a1·u1[i] + a2·u2[i]` (docs/CONTRACTS.md §2.1, "The int8 product").
#[derive(Debug, Clone, Copy)]
pub(super) struct Int8Rows<'a> {
    u1: &'a [f32],
    u2: &'a [f32],
    u1_max: f32,
    u2_max: f32,
}

impl<'a> Int8Rows<'a> {
    pub(super) fn new(u1: &'a [f32], u2: &'a [f32]) -> Self {
        let max = |v: &[f32]| v.iter().fold(0.0_f32, |m, &x| m.max(x));
        Int8Rows {
            u1,
            u2,
            u1_max: max(u1),
            u2_max: max(u2),
        }
    }

    /// The error term of row `i` (every factor is non-negative, so each
    /// rounding of it is monotone in the factors).
    #[inline(always)]
    fn at(&self, q: &QueryBound, i: usize) -> f32 {
        q.a1 * self.u1[i] + q.a2 * self.u2[i]
    }

    /// The term at the block's largest factors: at least every row's.
    #[inline(always)]
    fn max(&self, q: &QueryBound) -> f32 {
        q.a1 * self.u1_max + q.a2 * self.u2_max
    }
}

/// The int8 error term of row `i`, zero without one.
#[inline(always)]
fn extra(int8: &Option<Int8Rows<'_>>, q: &QueryBound, i: usize) -> f32 {
    int8.as_ref().map_or(0.0, |e| e.at(q, i))
}

/// The int8 error term at a block's largest factors, zero without one.
#[inline(always)]
fn extra_max(int8: &Option<Int8Rows<'_>>, q: &QueryBound) -> f32 {
    int8.as_ref().map_or(0.0, |e| e.max(q))
}

/// Rounds `v ≥ 0` up to an `f32`, after a relative margin of `2^-30` for
/// the `f64` sum's own error (at most `D · 2^-53 ≤ 2^-37`).
pub(super) fn up(v: f64) -> f32 {
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
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct BoundNorms {
    /// `‖x‖`, rounded up.
    pub(super) norm: Vec<f32>,
    /// `‖x‖²`, rounded up.
    pub(super) sq: Vec<f32>,
}

impl BoundNorms {
    /// The norms of rows `first..` of `corpus`.
    pub(crate) fn of_corpus(corpus: CorpusRef<'_>, first: usize) -> BoundNorms {
        let mut all = BoundNorms::default();
        let first = first.min(corpus.len());
        corpus.for_each_chunk(first..corpus.len(), |_, rows| {
            all.extend(BoundNorms::of(rows, corpus.dim()));
        });
        all
    }

    /// Vectors covered.
    pub(crate) fn len(&self) -> usize {
        self.norm.len()
    }

    /// Keeps the first `n` vectors' norms.
    pub(crate) fn truncate(&mut self, n: usize) {
        self.norm.truncate(n);
        self.sq.truncate(n);
    }

    /// Replaces vector `i`'s norms by those of `one` (one vector's).
    pub(crate) fn set(&mut self, i: usize, one: BoundNorms) {
        if let (Some(n), Some(q), Some(&n1), Some(&q1)) = (
            self.norm.get_mut(i),
            self.sq.get_mut(i),
            one.norm.first(),
            one.sq.first(),
        ) {
            *n = n1;
            *q = q1;
        }
    }

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

/// The bounds of one metric: per query a [`QueryBound`] and per row the
/// slices of one row block.
pub(super) trait Bounds: Sync {
    /// An upper bound of `hi` over every row of the block whose approximate
    /// dot is at most `s`, from the block's extreme norms, valid against the
    /// threshold `t` (> `-inf`): a value below `t` proves no such row reaches
    /// `t`. It is non-decreasing in `s` (rounding is monotone). `None` where
    /// the metric has no such bound at this `t` (each row is then tested).
    fn block_hi(&self, q: &QueryBound, t: f32, s: f32) -> Option<f32>;
    /// About the largest `s` whose [`Bounds::block_hi`] is below `t`; the
    /// cut is found from here and checked (see [`cut`]).
    fn cut_estimate(&self, q: &QueryBound, t: f32) -> f32;
    /// The upper bound of block row `i` for approximate dot `s` (the
    /// selection needs no lower bound: `T` comes from canonical scores).
    fn hi(&self, q: &QueryBound, s: f32, i: usize) -> f32;
}

/// A cut for threshold `t`: every row of the block whose approximate dot is
/// at most the cut has an upper bound below `t`, because the block's bound at
/// the cut, checked here, is below `t` and the bound is non-decreasing.
/// `None` where no cut is known (every row is then tested): `t` is `-inf`,
/// the metric has no block bound at this `t`, or no candidate checks out.
pub(super) fn cut<B: Bounds>(bounds: &B, q: &QueryBound, t: f32) -> Option<f32> {
    if t.is_nan() || t == f32::NEG_INFINITY {
        return None;
    }
    let floor = ordered_bits(f32::NEG_INFINITY);
    let mut c = bounds.cut_estimate(q, t);
    let mut step = 1_u32;
    // The estimate is within a few units in the last place; the steps down
    // double, so a cut is found in a few checks or none in 32.
    for _ in 0..32 {
        if c.is_nan() {
            return None;
        }
        if !reaches(bounds.block_hi(q, t, c)?, t) {
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
    int8: Option<Int8Rows<'a>>,
}

impl<'a> DotBounds<'a> {
    pub(super) fn new(xb: &'a [f32]) -> Self {
        let xb_max = xb.iter().fold(0.0_f32, |m, &v| m.max(v));
        DotBounds {
            xb,
            xb_max,
            int8: None,
        }
    }

    /// The same bounds around the int8 product's approximate dots.
    pub(super) fn with_int8(self, int8: Option<Int8Rows<'a>>) -> Self {
        DotBounds { int8, ..self }
    }
}

impl Bounds for DotBounds<'_> {
    #[inline(always)]
    fn block_hi(&self, q: &QueryBound, _t: f32, s: f32) -> Option<f32> {
        // fl(s + fl(fl(fl(a·xb) + ABS) + e)) grows with s, xb and e ≥ 0.
        Some(s + ((q.a * self.xb_max + ABS) + extra_max(&self.int8, q)))
    }

    #[inline(always)]
    fn cut_estimate(&self, q: &QueryBound, t: f32) -> f32 {
        t - ((q.a * self.xb_max + ABS) + extra_max(&self.int8, q))
    }

    #[inline(always)]
    fn hi(&self, q: &QueryBound, s: f32, i: usize) -> f32 {
        let w = (q.a * self.xb[i] + ABS) + extra(&self.int8, q, i);
        s + w
    }
}

/// l2: `a = qq`.
pub(super) struct L2Bounds<'a> {
    xx: &'a [f32],
    c: f32,
    /// The smallest and largest of `xx`.
    xx_min: f32,
    xx_max: f32,
    int8: Option<Int8Rows<'a>>,
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
            int8: None,
        }
    }

    /// The same bounds around the int8 product's approximate dots.
    pub(super) fn with_int8(self, int8: Option<Int8Rows<'a>>) -> Self {
        L2Bounds { int8, ..self }
    }
}

impl Bounds for L2Bounds<'_> {
    #[inline(always)]
    fn block_hi(&self, q: &QueryBound, _t: f32, s: f32) -> Option<f32> {
        // fl(fl(2s − e) + fl(fl(c·e + ABS) + 2x)) with e = fl(a + xx) and x
        // the int8 term: the first grows with s and falls with e, the second
        // grows with e and x (2s is off the exact 2 q·x by twice the dot's).
        let a = q.a;
        let v = 2.0 * s - (a + self.xx_min);
        Some(v + ((self.c * (a + self.xx_max) + ABS) + 2.0 * extra_max(&self.int8, q)))
    }

    #[inline(always)]
    fn cut_estimate(&self, q: &QueryBound, t: f32) -> f32 {
        let a = q.a;
        let w = (self.c * (a + self.xx_max) + ABS) + 2.0 * extra_max(&self.int8, q);
        (t - w + (a + self.xx_min)) * 0.5
    }

    #[inline(always)]
    fn hi(&self, q: &QueryBound, s: f32, i: usize) -> f32 {
        let e = q.a + self.xx[i];
        let v = 2.0 * s - e;
        let w = (self.c * e + ABS) + 2.0 * extra(&self.int8, q, i);
        v + w
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
    int8: Option<Int8Rows<'a>>,
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
            int8: None,
        }
    }

    /// The same bounds around the int8 product's approximate dots.
    pub(super) fn with_int8(self, int8: Option<Int8Rows<'a>>) -> Self {
        CosineBounds { int8, ..self }
    }
}

impl Bounds for CosineBounds<'_> {
    #[inline(always)]
    fn block_hi(&self, q: &QueryBound, t: f32, s: f32) -> Option<f32> {
        // Against t > 0 only. A row with den = 0 scores -inf. Otherwise its
        // hi = fl(n / den) with n = fl(s + w) ≤ N = fl(s + fl(a·xb_max + ABS)):
        // where n ≤ 0, hi ≤ 0 < t; where n > 0, hi ≤ fl(N / den_min) with
        // den_min = fl(b·rn_min) > 0, the division falling with den and
        // rising with n. Both cases are below t once fl(N / den_min) is.
        // (With the int8 term, w and N carry it as the dot's do.)
        let den_min = q.b * self.rn_min;
        if t.is_nan() || t <= 0.0 || den_min.is_nan() || den_min <= 0.0 || den_min.is_infinite() {
            return None;
        }
        Some((s + ((q.a * self.xb_max + ABS) + extra_max(&self.int8, q))) / den_min)
    }

    #[inline(always)]
    fn cut_estimate(&self, q: &QueryBound, t: f32) -> f32 {
        t * (q.b * self.rn_min) - ((q.a * self.xb_max + ABS) + extra_max(&self.int8, q))
    }

    #[inline(always)]
    fn hi(&self, q: &QueryBound, s: f32, i: usize) -> f32 {
        // The same product as `cosine_from_parts`, so `den` has the score's bits.
        let den = q.b * self.rn[i];
        if den == 0.0 {
            return f32::NEG_INFINITY;
        }
        let w = (q.a * self.xb[i] + ABS) + extra(&self.int8, q, i);
        (s + w) / den
    }
}

/// Whether an upper bound `hi` reaches the threshold `t`: `hi ≥ t`, and also
/// a NaN (which the overflow rule excludes), so that no row is ever dropped
/// for want of a comparison.
#[inline(always)]
pub(super) fn reaches(hi: f32, t: f32) -> bool {
    hi.partial_cmp(&t) != Some(Ordering::Less)
}

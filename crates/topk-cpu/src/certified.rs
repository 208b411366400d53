//! Exact batches through a fast GEMM: certified bounds from approximate dot
//! products, then canonical scores for the rows the bounds cannot rule out
//! (docs/CONTRACTS.md §2.1).
//!
//! # The GEMM
//!
//! `faer`'s matrix product, single-threaded (`Par::Seq`; rayon splits the
//! corpus into row blocks around it), without default features. Measured
//! side by side in one process on this project's 2-core AVX-512 VM, best of
//! 15, for f32 `(Q × D) · (D × B)` blocks (Q = 256–1000, D = 384 and 1024,
//! B = 256–2048): `faer` (0.22) 91–148 GFLOP/s per core, `matrixmultiply` 49–67
//! (AVX2/FMA kernels), the `gemm` crate 45–60 in a separate run (its AVX-512
//! kernels need a nightly compiler); `faer`'s kernels use AVX-512 on a
//! stable compiler and dispatch at run time. Its summation order is unknown
//! and may change between versions: the bounds below hold for every order of
//! a classical product (each output a sum of its D products).
//!
//! # The bound
//!
//! `u = 2^-24`. For any evaluation of `Σ_d q_d x_d` by roundings to nearest
//! (multiplications, additions and fused multiply-adds in any tree), each
//! product passes through at most `D` roundings, so the result `s̃` satisfies
//! `|s̃ − q·x| ≤ γ_D Σ|q_d x_d| + D·2^-149` with `γ_D = Du / (1 − Du)` (the
//! absolute term covers subnormal results). The GEMM is one such evaluation;
//! the canonical dot `s_c` (§2: `⌈D/32⌉` FMAs per lane, 5 butterfly additions)
//! is another, with `γ_{⌈D/32⌉+5}`. By Cauchy–Schwarz `Σ|q_d x_d| ≤ ‖q‖‖x‖`,
//! so for `D ≤ 2^16` (`Du ≤ 2^-8`)
//!
//! `|s̃ − s_c| ≤ 1.004 (D + D/32 + 6) u ‖q‖‖x‖ + 2^-132`.
//!
//! The width used is `w = C_D ‖q‖‖x‖ + 2^-100` with `C_D = (D + 64)·2^-22 =
//! 4 (D + 64) u`, more than three times the bound. The slack (at least
//! `2.9 (D + 64) u ‖q‖‖x‖`) absorbs the roundings of evaluating the bounds
//! themselves in `f32` (a handful of operations, each off by at most `u`
//! times a quantity below `1.1 ‖q‖‖x‖`) and the error of the norms, which
//! are summed in `f64` (squares of `f32` are exact there, so subnormal rows
//! keep their true norm) and rounded up to `f32`. The overflow rule (§4.1)
//! keeps every quantity finite: `‖q‖‖x‖ ≤ 2^100`.
//!
//! Per metric, with `qb`, `xb` those upward norms and `qq`, `xx` the upward
//! squared norms:
//!
//! - **dot**: `lo = s̃ − w`, `hi = s̃ + w`, `w = C_D·qb·xb + 2^-100`.
//! - **l2** (score `−sqdist`): `v = 2 s̃ − (qq + xx)` approximates the score.
//!   Its error is at most `2 γ_D ‖q‖‖x‖ ≤ γ_D (qq + xx)` plus the roundings of
//!   `v`; the canonical squared distance sums `fl(x_d − q_d)² =
//!   (x_d − q_d)²(1 + δ)²`, non-negative terms, so its error is at most
//!   `γ_{⌈D/32⌉+7} ‖q − x‖² ≤ 2 γ_{⌈D/32⌉+7} (qq + xx)`. In all
//!   `(1.08 D + 22) u (qq + xx)`, so `w = C_D (qq + xx) + 2^-100` and
//!   `lo = v − w`, `hi = v + w`.
//! - **cosine** (score `fl(s_c / den)`, `den = fl(qn·rn)` of the canonical
//!   norms, `-inf` when `den = 0`): with the dot's `w`, `s_c` lies in
//!   `[fl(s̃ − w), fl(s̃ + w)]` (the slack covers those two roundings), and a
//!   correctly rounded division by `den > 0` is monotone, so `lo =
//!   fl(fl(s̃ − w) / den) ≤ score ≤ fl(fl(s̃ + w) / den) = hi`. With `den = 0`
//!   both bounds are `-inf`, the score itself.
//!
//! # Selection
//!
//! Per query, `T` is the K-th largest lower bound seen (`-inf` until K rows
//! are seen). K rows score at least their lower bounds, so the K-th best
//! canonical score is at least `T`, and every row of the exact answer (ties
//! at the K-th score included) has an upper bound of at least `T`. Rows with
//! `hi ≥ T` are kept as candidates (a `T` that only grows prunes them on the
//! way), scored canonically with the SIMD kernels and selected with the §3
//! comparator: the oracle's bytes. The corpus is split into pieces that run
//! in parallel, each with its own K lower bounds; any piece's `T` is a lower
//! bound of the K-th best score, so the pieces share the largest (one
//! atomic per query, read and raised once per query and block): a piece
//! that starts late prunes with the `T` of those before it instead of
//! offering its first rows until it holds K of its own. Which rows are
//! scored canonically then depends on timing, the answer does not: every
//! row of the exact answer reaches any such `T`. A query whose candidates
//! outgrow a cap (near-tie corpora: thousands of equal rows) is searched
//! again on the exact path; correctness never depends on the bound being
//! tight.
//!
//! Most rows never reach the per-row bounds: a row block's bound at a given
//! approximate dot (its extreme norms, [`Bounds::block_hi`]) turns `T` into
//! a cut on `s̃`, and one vector compare per 64 rows keeps those above it
//! (docs/CONTRACTS.md §2.1, "The cut").

use std::cmp::Ordering;
use std::sync::atomic::{AtomicU32, Ordering as Atomic};

use rayon::prelude::*;
use topk_core::order::{ordered_bits, score_from_ordered_bits};
use topk_core::{Metric, Retriever, TopKBy};

use crate::batch::Batch;
use crate::kernels::gemm::gemm_nt;
use crate::kernels::Kernels;
use crate::retriever::CpuRetriever;
use crate::select::Selector;

/// Fewest queries for which a batch takes the GEMM path: below it the
/// tiled canonical scan is as fast.
pub(crate) const MIN_QUERIES: usize = 16;
/// Largest dimension the bound is derived for (`D u ≤ 2^-8`).
pub(crate) const MAX_DIM: usize = 1 << 16;
/// Absolute term of every width (subnormal results).
const ABS: f32 = f32::from_bits(27 << 23); // 2^-100: biased exponent 127 - 100
/// Rows per GEMM block.
const BLOCK_ROWS: usize = 512;
/// Queries per GEMM call.
const QUERY_BLOCK: usize = 512;
/// Rows tested against a cut by one vector compare (the bits of a `u64`).
const GROUP: usize = 64;
/// Candidates a query may keep beyond `2K` before it falls back.
const CAP_EXTRA: usize = 4096;

/// `C_D = (D + 64) · 2^-22`, the relative width.
fn width_factor(dim: usize) -> f32 {
    (dim as f32 + 64.0) * (1.0 / 4_194_304.0)
}

/// The candidate cap of a query for `k`.
pub(crate) fn default_cap(k: usize) -> usize {
    k.saturating_mul(2).saturating_add(CAP_EXTRA)
}

/// Whether a batch of `queries` at this shape takes the GEMM path.
pub(crate) fn applies(queries: usize, n: usize, dim: usize, k: usize) -> bool {
    queries >= MIN_QUERIES && dim <= MAX_DIM && k.saturating_mul(4) <= n
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
    norm: Vec<f32>,
    /// `‖x‖²`, rounded up.
    sq: Vec<f32>,
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
trait Bounds: Sync {
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
fn cut<B: Bounds>(bounds: &B, a: f32, b: f32, t: f32) -> Option<f32> {
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
struct DotBounds<'a> {
    xb: &'a [f32],
    /// The largest of `xb`.
    xb_max: f32,
}

impl<'a> DotBounds<'a> {
    fn new(xb: &'a [f32]) -> Self {
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
struct L2Bounds<'a> {
    xx: &'a [f32],
    c: f32,
    /// The smallest and largest of `xx`.
    xx_min: f32,
    xx_max: f32,
}

impl<'a> L2Bounds<'a> {
    fn new(xx: &'a [f32], c: f32) -> Self {
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
struct CosineBounds<'a> {
    xb: &'a [f32],
    rn: &'a [f32],
    /// The largest of `xb`.
    xb_max: f32,
    /// The smallest positive of `rn` (`+inf` when none is).
    rn_min: f32,
}

impl<'a> CosineBounds<'a> {
    fn new(xb: &'a [f32], rn: &'a [f32]) -> Self {
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

/// What the bound pass knows about one query.
#[derive(Debug, Clone)]
struct QueryState {
    /// The K largest lower bounds seen, as [`ordered_bits`].
    lows: TopKBy<u32>,
    /// The K-th largest lower bound seen; `-inf` until K are held.
    t: f32,
    /// `(row, upper bound)` of every row whose upper bound reached `t`.
    cands: Vec<(u32, f32)>,
    /// Candidate count that triggers the next pruning.
    prune_at: usize,
    /// Most candidates kept after a pruning.
    cap: usize,
    /// The candidates outgrew `cap`: this query runs on the exact path.
    overflow: bool,
}

impl QueryState {
    fn new(k: usize, cap: usize) -> QueryState {
        QueryState {
            lows: TopKBy::new(k),
            t: f32::NEG_INFINITY,
            cands: Vec::new(),
            prune_at: Self::next_prune(k, cap, 0),
            cap,
            overflow: false,
        }
    }

    fn next_prune(k: usize, cap: usize, len: usize) -> usize {
        len.saturating_mul(2)
            .max(k.saturating_mul(2).saturating_add(256))
            .min(cap.saturating_add(1))
    }

    /// Raises `t` to the threshold `bits` (as [`ordered_bits`]) where that
    /// is higher: another piece's K-th lower bound, or this piece's own.
    #[inline]
    fn raise(&mut self, bits: u32) {
        if bits > ordered_bits(self.t) {
            self.t = score_from_ordered_bits(bits);
        }
    }

    #[inline]
    fn offer(&mut self, row: u32, lo: f32, hi: f32) {
        let key = ordered_bits(lo);
        // `t` is at least this piece's K-th lower bound, so a key above `t`
        // is above that too; a key at or below `t` cannot raise `t`, and the
        // K largest keys decide `t` only where all of them are above it.
        if key > ordered_bits(self.t) {
            self.lows.push_key(key);
            if let Some(t) = self.lows.threshold() {
                self.raise(t);
            }
        }
        self.cands.push((row, hi));
        if self.cands.len() >= self.prune_at {
            self.prune();
        }
    }

    /// Drops the candidates whose upper bound fell below `t`.
    fn prune(&mut self) {
        let t = self.t;
        self.cands.retain(|&(_, hi)| reaches(hi, t));
        if self.cands.len() > self.cap {
            self.overflow = true;
            self.cands = Vec::new();
        } else {
            self.prune_at = Self::next_prune(self.lows.k(), self.cap, self.cands.len());
        }
    }

    /// Folds in the state of the same query over other rows.
    fn merge(mut self, mut other: QueryState) -> QueryState {
        self.overflow |= other.overflow;
        self.raise(ordered_bits(other.t));
        if self.overflow {
            self.cands = Vec::new();
            return self;
        }
        for key in other.lows.drain_sorted_keys() {
            if self.lows.threshold().is_some_and(|t| key <= t) {
                break;
            }
            self.lows.push_key(key);
        }
        if let Some(t) = self.lows.threshold() {
            self.raise(t);
        }
        if other.cands.len() > self.cands.len() {
            std::mem::swap(&mut self.cands, &mut other.cands);
        }
        self.cands.extend_from_slice(&other.cands);
        self.prune();
        self
    }
}

/// One parallel piece: a state per query, its GEMM buffer and the block of
/// rows widened from half-width storage.
struct Piece {
    states: Vec<QueryState>,
    buf: Vec<f32>,
    wide: Vec<f32>,
}

/// What a certified batch did (tests read it; searches log it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Stats {
    /// Queries answered by the exact path after their candidates overflowed.
    pub(crate) fallbacks: usize,
    /// Rows scored canonically over all other queries.
    pub(crate) rescored: usize,
}

impl CpuRetriever {
    /// One selector per query of a validated batch, by certified bounds and
    /// canonical rescoring; a query with more than `cap` candidates is
    /// searched on the exact path instead.
    pub(crate) fn select_certified(
        &self,
        batch: &Batch<'_>,
        k: usize,
        cap: usize,
    ) -> (Vec<Selector>, Stats) {
        let dim = self.dim();
        let rows = self.bound_norms();
        let queries = BoundNorms::of(batch.data(), dim);
        let c = width_factor(dim);
        let params: Vec<(f32, f32)> = (0..batch.len())
            .map(|j| match self.metric() {
                Metric::Dot => (c * queries.norm[j], 0.0),
                Metric::L2 => (queries.sq[j], 0.0),
                Metric::Cosine => (c * queries.norm[j], batch.norm(j)),
            })
            .collect();
        // The largest `T` any piece has reached, per query.
        let shared: Vec<AtomicU32> = (0..batch.len())
            .map(|_| AtomicU32::new(ordered_bits(f32::NEG_INFINITY)))
            .collect();
        let states = self.install(|| {
            let n = self.len();
            let blocks = n.div_ceil(BLOCK_ROWS);
            let min_len = (blocks / (4 * rayon::current_num_threads())).max(1);
            let fresh = || Piece {
                states: vec![QueryState::new(k, cap); batch.len()],
                buf: Vec::new(),
                wide: Vec::new(),
            };
            (0..blocks)
                .into_par_iter()
                .with_min_len(min_len)
                .fold(fresh, |mut piece, b| {
                    let range = b * BLOCK_ROWS..((b + 1) * BLOCK_ROWS).min(n);
                    self.bound_block(batch, &params, &shared, rows, c, range, &mut piece);
                    piece
                })
                .map(|p| p.states)
                .reduce(
                    || vec![QueryState::new(k, cap); batch.len()],
                    |a, b| a.into_iter().zip(b).map(|(x, y)| x.merge(y)).collect(),
                )
        });
        let sels: Vec<(Selector, usize, bool)> = self.install(|| {
            states
                .into_par_iter()
                .enumerate()
                .map(|(j, st)| {
                    let (q, qn) = (batch.query(j), batch.norm(j));
                    if st.overflow {
                        return (self.select(q, qn, k), 0, true);
                    }
                    let mut sel = Selector::new(k);
                    let mut scored = 0;
                    for &(row, hi) in &st.cands {
                        if reaches(hi, st.t) {
                            sel.offer(row, self.score_one(q, qn, row));
                            scored += 1;
                        }
                    }
                    (sel, scored, false)
                })
                .collect()
        });
        let mut stats = Stats::default();
        let sels = sels
            .into_iter()
            .map(|(sel, scored, fell_back)| {
                stats.rescored += scored;
                stats.fallbacks += usize::from(fell_back);
                sel
            })
            .collect();
        tracing::debug!(
            queries = batch.len(),
            k,
            rescored = stats.rescored,
            fallbacks = stats.fallbacks,
            "certified batch"
        );
        (sels, stats)
    }

    /// Bounds every pair of (rows `range`, batch query) and offers the rows
    /// that can still reach each query's top K (`shared`: the queries'
    /// largest `T` over every piece).
    #[allow(clippy::too_many_arguments)]
    fn bound_block(
        &self,
        batch: &Batch<'_>,
        params: &[(f32, f32)],
        shared: &[AtomicU32],
        rows: &BoundNorms,
        c: f32,
        range: std::ops::Range<usize>,
        piece: &mut Piece,
    ) {
        let dim = self.dim();
        let nr = range.len();
        let block = self.corpus.rows(range.clone(), &mut piece.wide);
        let mut q0 = 0;
        while q0 < batch.len() {
            let q1 = (q0 + QUERY_BLOCK).min(batch.len());
            let m = q1 - q0;
            piece.buf.resize(m * nr, 0.0);
            let qdata = &batch.data()[q0 * dim..q1 * dim];
            gemm_nt(qdata, block, m, nr, dim, &mut piece.buf);
            let (buf, states) = (&piece.buf, &mut piece.states[q0..q1]);
            let row0 = range.start;
            let params = &params[q0..q1];
            let shared = &shared[q0..q1];
            match self.metric() {
                Metric::Dot => scan(
                    self.kernels,
                    &DotBounds::new(&rows.norm[range.clone()]),
                    buf,
                    nr,
                    row0,
                    params,
                    shared,
                    states,
                ),
                Metric::L2 => scan(
                    self.kernels,
                    &L2Bounds::new(&rows.sq[range.clone()], c),
                    buf,
                    nr,
                    row0,
                    params,
                    shared,
                    states,
                ),
                Metric::Cosine => scan(
                    self.kernels,
                    &CosineBounds::new(&rows.norm[range.clone()], self.corpus.norms(range.clone())),
                    buf,
                    nr,
                    row0,
                    params,
                    shared,
                    states,
                ),
            }
            q0 = q1;
        }
    }
}

/// Whether an upper bound `hi` reaches the threshold `t`: `hi ≥ t`, and also
/// a NaN (which the overflow rule excludes), so that no row is ever dropped
/// for want of a comparison.
#[inline(always)]
fn reaches(hi: f32, t: f32) -> bool {
    hi.partial_cmp(&t) != Some(Ordering::Less)
}

/// Offers the rows of one GEMM block (`buf[j * nr + i]` for query `j`, block
/// row `i`, corpus row `row0 + i`) whose upper bound reaches each query's `t`,
/// which starts from the largest any piece has published in `shared` and is
/// published there after the block.
///
/// Rows go 64 at a time: one vector compare against the [`cut`] of the
/// current `t` leaves only the rows whose approximate dot is above it, and
/// those are bounded one by one (a cut of an older, lower `t` only lets more
/// rows through to that test).
#[allow(clippy::too_many_arguments)]
fn scan<B: Bounds>(
    kernels: Kernels,
    bounds: &B,
    buf: &[f32],
    nr: usize,
    row0: usize,
    params: &[(f32, f32)],
    shared: &[AtomicU32],
    states: &mut [QueryState],
) {
    for (((srow, &(a, b)), st), top) in buf
        .chunks_exact(nr)
        .zip(params)
        .zip(states.iter_mut())
        .zip(shared)
    {
        if st.overflow {
            continue;
        }
        // Relaxed: any value read is some piece's valid `T`.
        st.raise(top.load(Atomic::Relaxed));
        let mut cut_t = st.t;
        let mut cut_at = cut(bounds, a, b, cut_t);
        'groups: for (gi, group) in srow.chunks(GROUP).enumerate() {
            if ordered_bits(st.t) != ordered_bits(cut_t) {
                cut_t = st.t;
                cut_at = cut(bounds, a, b, cut_t);
            }
            let mut mask = match cut_at {
                Some(c) => kernels.above(group, c),
                None => u64::MAX >> (64 - group.len()),
            };
            while mask != 0 {
                let o = mask.trailing_zeros() as usize;
                mask &= mask - 1;
                let i = gi * GROUP + o;
                let (lo, hi) = bounds.lo_hi(a, b, group[o], i);
                if reaches(hi, st.t) {
                    // Row indices fit u32: validated at ingest (§4).
                    st.offer((row0 + i) as u32, lo, hi);
                    if st.overflow {
                        break 'groups;
                    }
                }
            }
        }
        top.fetch_max(ordered_bits(st.t), Atomic::Relaxed);
    }
}

#[cfg(test)]
#[path = "certified_tests.rs"]
mod tests;

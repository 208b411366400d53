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
//! Where the CPU has AVX-512 VNNI and `D ≤` [`INT8_MAX_DIM`], the product is
//! instead an exact integer one over 8-bit codes ([`BatchGemm::Int8`],
//! `quant.rs`, `kernels/int8.rs`): four times the multiply-adds per
//! instruction, at the price of a wider width that adds the quantization's
//! error bound (docs/CONTRACTS.md §2.1, "The int8 product"). Queries whose
//! candidates outgrow the cap under it are bounded again with the f32
//! product.
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
//! again: through the f32 product after the int8 one, on the exact path
//! after the f32 one; correctness never depends on the bound being tight.
//! The surviving candidates are scored row block by row block, so that a
//! row kept by many queries is read from memory once.
//!
//! Most rows never reach the per-row bounds: a row block's bound at a given
//! approximate dot (its extreme norms, [`Bounds::block_hi`]) turns `T` into
//! a cut on `s̃`, and one vector compare per 64 rows keeps those above it
//! (docs/CONTRACTS.md §2.1, "The cut").

use std::sync::atomic::{AtomicU32, Ordering as Atomic};

use rayon::prelude::*;
use topk_core::order::{ordered_bits, score_from_ordered_bits};
use topk_core::{Metric, Retriever, TopKBy};

use crate::batch::Batch;
use crate::kernels::gemm::gemm_nt;
use crate::kernels::Kernels;
use crate::retriever::CpuRetriever;
use crate::select::Selector;

mod bounds;
mod quant;
pub(crate) use bounds::BoundNorms;
use bounds::{
    cut, reaches, width_factor, Bounds, CosineBounds, DotBounds, Int8Rows, L2Bounds, QueryBound,
};
pub(crate) use quant::CorpusCodes;
use quant::{QueryCodes, RowCodes};

/// Largest dimension for which batches take the int8 product by default.
pub const INT8_MAX_DIM: usize = 1024;

/// The approximate product behind a certified batch's bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BatchGemm {
    /// `faer`'s f32 matrix product; runs everywhere.
    F32,
    /// Queries and rows quantized to 8 bits (each vector's largest
    /// magnitude mapped to 127) and multiplied exactly in integers by AVX-512 VNNI (four times the
    /// multiply-adds of an f32 FMA), with a wider certified width. Vectors
    /// whose largest magnitude is outside `[2^-60, 2^61)` take the f32
    /// product instead.
    Int8,
}

impl BatchGemm {
    /// Every product, the everywhere one first.
    pub const ALL: [BatchGemm; 2] = [BatchGemm::F32, BatchGemm::Int8];

    /// Lowercase name ("f32", "int8").
    pub fn as_str(self) -> &'static str {
        match self {
            BatchGemm::F32 => "f32",
            BatchGemm::Int8 => "int8",
        }
    }

    /// Whether this CPU runs the product.
    pub fn is_available(self) -> bool {
        match self {
            BatchGemm::F32 => true,
            BatchGemm::Int8 => crate::kernels::int8::available(),
        }
    }

    /// The products this CPU runs.
    pub fn available() -> Vec<BatchGemm> {
        BatchGemm::ALL
            .into_iter()
            .filter(|g| g.is_available())
            .collect()
    }

    /// The product a batch of `dim`-long vectors takes by default: int8
    /// where this CPU runs it and `dim ≤` [`INT8_MAX_DIM`], f32 otherwise.
    ///
    /// The int8 width grows like `√D` against the spread of the scores.
    /// Measured with `cargo xtask cpu-compare` on Gaussian rows, Q = 1,000,
    /// the int8 product took 0.3–0.8× the f32 product's time at D = 384
    /// and 1024 (at 1M × 1024, K = 100, about one query in eight outgrew the
    /// cap and was rerun through the f32 product); larger D is not measured.
    pub fn for_dim(dim: usize) -> BatchGemm {
        if dim <= INT8_MAX_DIM && BatchGemm::Int8.is_available() {
            BatchGemm::Int8
        } else {
            BatchGemm::F32
        }
    }
}

impl std::fmt::Display for BatchGemm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Fewest queries for which a batch takes the GEMM path: below it the
/// tiled canonical scan is as fast.
pub(crate) const MIN_QUERIES: usize = 16;
/// Largest dimension the bound is derived for (`D u ≤ 2^-8`).
pub(crate) const MAX_DIM: usize = 1 << 16;
/// Rows per GEMM block.
const BLOCK_ROWS: usize = 512;
/// Queries per GEMM call.
const QUERY_BLOCK: usize = 512;
/// Rows tested against a cut by one vector compare (the bits of a `u64`).
const GROUP: usize = 64;
/// Bytes of corpus rows per block of the canonical rescoring (fits L2).
const RESCORE_BLOCK_BYTES: usize = 256 * 1024;
/// Candidates a query may keep beyond `2K` before it falls back.
const CAP_EXTRA: usize = 4096;

/// The candidate cap of a query for `k`.
pub(crate) fn default_cap(k: usize) -> usize {
    k.saturating_mul(2).saturating_add(CAP_EXTRA)
}

/// Whether a batch of `queries` at this shape takes the GEMM path.
pub(crate) fn applies(queries: usize, n: usize, dim: usize, k: usize) -> bool {
    queries >= MIN_QUERIES && dim <= MAX_DIM && k.saturating_mul(4) <= n
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
    /// Queries answered by an exact scan after their candidates overflowed.
    pub(crate) fallbacks: usize,
    /// Queries bounded again with the f32 product after their candidates
    /// overflowed under the int8 product.
    pub(crate) reruns: usize,
    /// Rows scored canonically over all other queries.
    pub(crate) rescored: usize,
}

impl CpuRetriever {
    /// One selector per query of a validated batch, by certified bounds and
    /// canonical rescoring. A query with more than `cap` candidates under the
    /// int8 product is bounded again with the f32 product (its narrower
    /// width keeps fewer rows); one that outgrows `cap` there is searched on
    /// the exact path.
    pub(crate) fn select_certified(
        &self,
        batch: &Batch<'_>,
        k: usize,
        cap: usize,
    ) -> (Vec<Selector>, Stats) {
        self.certified_with(batch, k, cap, self.batch_gemm())
    }

    /// [`Self::select_certified`] with the product `gemm`.
    fn certified_with(
        &self,
        batch: &Batch<'_>,
        k: usize,
        cap: usize,
        gemm: BatchGemm,
    ) -> (Vec<Selector>, Stats) {
        let dim = self.dim();
        let rows = self.bound_norms();
        let queries = BoundNorms::of(batch.data(), dim);
        let c = width_factor(dim);
        let codes = match gemm {
            BatchGemm::Int8 => self
                .install(|| QueryCodes::of(batch.data(), dim))
                .map(|q| (q, self.corpus_codes())),
            BatchGemm::F32 => None,
        };
        let params: Vec<QueryBound> = (0..batch.len())
            .map(|j| {
                let mut p = match self.metric() {
                    Metric::Dot => QueryBound::new(c * queries.norm[j], 0.0),
                    Metric::L2 => QueryBound::new(queries.sq[j], 0.0),
                    Metric::Cosine => QueryBound::new(c * queries.norm[j], batch.norm(j)),
                };
                if let Some((codes, _)) = &codes {
                    (p.a1, p.a2) = codes.factors[j];
                }
                p
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
                    let codes = codes
                        .as_ref()
                        .and_then(|(q, rows)| Some((q, rows.block(b)?)));
                    self.bound_block(batch, codes, &params, &shared, rows, c, range, &mut piece);
                    piece
                })
                .map(|p| p.states)
                .reduce(
                    || vec![QueryState::new(k, cap); batch.len()],
                    |a, b| a.into_iter().zip(b).map(|(x, y)| x.merge(y)).collect(),
                )
        });
        // Under the int8 product an overflowing query is bounded again with
        // the f32 product, all such queries in one batch (the tiled exact
        // scan where they are too few for the GEMM path).
        let rerun = codes.is_some();
        let (mut sels, mut stats) = self.install(|| self.rescore(batch, k, &states, !rerun));
        let again: Vec<usize> = if rerun {
            (0..states.len()).filter(|&j| states[j].overflow).collect()
        } else {
            Vec::new()
        };
        if !again.is_empty() {
            let sub = batch.subset(&again);
            let (redone, sub_stats) = if sub.len() >= MIN_QUERIES {
                self.certified_with(&sub, k, cap, BatchGemm::F32)
            } else {
                let exact = Stats {
                    fallbacks: sub.len(),
                    ..Stats::default()
                };
                (self.select_batch(&sub, k), exact)
            };
            for (&j, sel) in again.iter().zip(redone) {
                sels[j] = sel;
            }
            stats.reruns = again.len();
            stats.fallbacks = sub_stats.fallbacks;
            stats.rescored += sub_stats.rescored;
        }
        tracing::debug!(
            queries = batch.len(),
            k,
            gemm = gemm.as_str(),
            rescored = stats.rescored,
            reruns = stats.reruns,
            fallbacks = stats.fallbacks,
            "certified batch"
        );
        (sels, stats)
    }

    /// One selector per query from the bound pass's `states`: the canonical
    /// scores of every candidate that still reaches its query's `T`. A query
    /// whose candidates overflowed is searched on the exact path where
    /// `exact_overflow` holds, and left empty (for the caller to redo)
    /// otherwise.
    ///
    /// The candidates are scored row block by row block rather than query by
    /// query: a block's rows are read from memory once and stay in cache for
    /// every query that kept one of them (a query keeps rows scattered over
    /// the whole corpus, so scoring query by query reads each kept row once
    /// per query). The scores do not depend on that order, and a selector's
    /// answer does not depend on the order of its offers (§3).
    fn rescore(
        &self,
        batch: &Batch<'_>,
        k: usize,
        states: &[QueryState],
        exact_overflow: bool,
    ) -> (Vec<Selector>, Stats) {
        // Every query's surviving candidates, query after query.
        let kept: Vec<Vec<u32>> = states
            .par_iter()
            .map(|st| {
                st.cands
                    .iter()
                    .filter(|&&(_, hi)| reaches(hi, st.t))
                    .map(|&(row, _)| row)
                    .collect()
            })
            .collect();
        let mut offsets = Vec::with_capacity(kept.len() + 1);
        offsets.push(0_usize);
        for rows in &kept {
            offsets.push(offsets.last().copied().unwrap_or(0) + rows.len());
        }
        let total = offsets.last().copied().unwrap_or(0);
        let mut rows = Vec::with_capacity(total);
        let mut query = Vec::with_capacity(total);
        for (j, r) in kept.iter().enumerate() {
            rows.extend_from_slice(r);
            // Query indices fit u32: a batch's size is validated (§4).
            query.extend(std::iter::repeat_n(j as u32, r.len()));
        }
        drop(kept);
        // The candidates grouped by row block (a counting sort, stable, so
        // each block's candidates stay in query order).
        let block_rows = (RESCORE_BLOCK_BYTES / (self.dim() * 4)).max(1);
        let buckets = self.len().div_ceil(block_rows);
        let mut start = vec![0_usize; buckets + 1];
        for &r in &rows {
            start[r as usize / block_rows + 1] += 1;
        }
        for b in 0..buckets {
            start[b + 1] += start[b];
        }
        let mut next = start.clone();
        let mut order = vec![0_usize; total];
        for (p, &r) in rows.iter().enumerate() {
            let b = r as usize / block_rows;
            order[next[b]] = p;
            next[b] += 1;
        }
        let norms: Vec<f32> = (0..batch.len()).map(|j| batch.norm(j)).collect();
        let scores: Vec<AtomicU32> = (0..total).map(|_| AtomicU32::new(0)).collect();
        (0..buckets).into_par_iter().for_each(|b| {
            for &p in &order[start[b]..start[b + 1]] {
                let j = query[p] as usize;
                let s = self.score_one(batch.query(j), norms[j], rows[p]);
                // Relaxed: read after the parallel loop has joined.
                scores[p].store(s.to_bits(), Atomic::Relaxed);
            }
        });
        let sels: Vec<Selector> = states
            .par_iter()
            .enumerate()
            .map(|(j, st)| {
                if st.overflow && exact_overflow {
                    return self.select(batch.query(j), norms[j], k);
                }
                let mut sel = Selector::new(k);
                for p in offsets[j]..offsets[j + 1] {
                    sel.offer(rows[p], f32::from_bits(scores[p].load(Atomic::Relaxed)));
                }
                sel
            })
            .collect();
        let overflowed = states.iter().filter(|st| st.overflow).count();
        let stats = Stats {
            fallbacks: if exact_overflow { overflowed } else { 0 },
            rescored: total,
            reruns: 0,
        };
        (sels, stats)
    }

    /// Bounds every pair of (rows `range`, batch query) and offers the rows
    /// that can still reach each query's top K (`shared`: the queries'
    /// largest `T` over every piece). With `codes` (the batch's and the
    /// block's), the approximate dots come from the int8 product.
    #[allow(clippy::too_many_arguments)]
    fn bound_block(
        &self,
        batch: &Batch<'_>,
        codes: Option<(&QueryCodes, &RowCodes)>,
        params: &[QueryBound],
        shared: &[AtomicU32],
        rows: &BoundNorms,
        c: f32,
        range: std::ops::Range<usize>,
        piece: &mut Piece,
    ) {
        let dim = self.dim();
        let nr = range.len();
        // The int8 product reads the quantized block only.
        let block = match codes {
            Some(_) => &[][..],
            None => self.corpus.rows(range.clone(), &mut piece.wide),
        };
        let int8 = codes.map(|(_, rows)| Int8Rows::new(&rows.u1, &rows.u2));
        let mut q0 = 0;
        while q0 < batch.len() {
            let q1 = (q0 + QUERY_BLOCK).min(batch.len());
            let m = q1 - q0;
            piece.buf.resize(m * nr, 0.0);
            match codes {
                Some((queries, rows)) => rows.product(queries, q0, m, &mut piece.buf),
                None => {
                    let qdata = &batch.data()[q0 * dim..q1 * dim];
                    gemm_nt(qdata, block, m, nr, dim, &mut piece.buf);
                }
            }
            let (buf, states) = (&piece.buf, &mut piece.states[q0..q1]);
            let row0 = range.start;
            let params = &params[q0..q1];
            let shared = &shared[q0..q1];
            match self.metric() {
                Metric::Dot => scan(
                    self.kernels,
                    &DotBounds::new(&rows.norm[range.clone()]).with_int8(int8),
                    buf,
                    nr,
                    row0,
                    params,
                    shared,
                    states,
                ),
                Metric::L2 => scan(
                    self.kernels,
                    &L2Bounds::new(&rows.sq[range.clone()], c).with_int8(int8),
                    buf,
                    nr,
                    row0,
                    params,
                    shared,
                    states,
                ),
                Metric::Cosine => scan(
                    self.kernels,
                    &CosineBounds::new(&rows.norm[range.clone()], self.corpus.norms(range.clone()))
                        .with_int8(int8),
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
    params: &[QueryBound],
    shared: &[AtomicU32],
    states: &mut [QueryState],
) {
    for (((srow, p), st), top) in buf
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
        let mut cut_at = cut(bounds, p, cut_t);
        'groups: for (gi, group) in srow.chunks(GROUP).enumerate() {
            if ordered_bits(st.t) != ordered_bits(cut_t) {
                cut_t = st.t;
                cut_at = cut(bounds, p, cut_t);
            }
            let mut mask = match cut_at {
                Some(c) => kernels.above(group, c),
                None => u64::MAX >> (64 - group.len()),
            };
            while mask != 0 {
                let o = mask.trailing_zeros() as usize;
                mask &= mask - 1;
                let i = gi * GROUP + o;
                let (lo, hi) = bounds.lo_hi(p, group[o], i);
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

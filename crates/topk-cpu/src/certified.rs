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
//! error bound (docs/CONTRACTS.md §2.1, "The int8 product").
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
//! Per query, `T` is the K-th best canonical score among the rows scored
//! so far (`-inf` until K are scored): the K-th best score of the whole
//! corpus is at least `T`, so a row whose upper bound is below `T` scores
//! below K rows already held and cannot be in the answer. Every other row
//! (`hi ≥ T`, ties at the K-th score included) is scored canonically with
//! the SIMD kernels as soon as its bound is known and offered to the
//! query's selector (the §3 comparator), which raises `T`. The corpus is
//! split into pieces that run in parallel, each with its own selector per
//! query; any piece's `T` is a lower bound of the K-th best score, so the
//! pieces share the largest (one atomic per query, read and raised once per
//! query and block), and a piece that starts late prunes with the `T` of
//! those before it. The pieces' selectors are merged at the end. Which rows
//! are scored canonically then depends on timing, the answer does not: the
//! selection over any set of rows that holds the exact answer is the
//! oracle's bytes. A near-tie corpus (thousands of equal rows) has every row
//! scored; correctness never depends on the bound being tight.
//!
//! Most rows never reach the per-row bounds: a row block's bound at a given
//! approximate dot (its extreme norms, [`Bounds::block_hi`]) turns `T` into
//! a cut on `s̃`, and one vector compare per 64 rows keeps those above it
//! (docs/CONTRACTS.md §2.1, "The cut").

use std::sync::atomic::{AtomicU32, Ordering as Atomic};
use std::sync::{Mutex, PoisonError};

use rayon::prelude::*;
use topk_core::order::{ordered_bits, score_from_ordered_bits};
use topk_core::{Metric, Result};

use crate::batch::Batch;
use crate::corpus::CorpusRef;
use crate::error::CpuError;
use crate::kernels::gemm::gemm_nt;
use crate::kernels::Kernels;
use crate::retriever::CpuRetriever;
use crate::select::Selector;

mod bounds;
mod quant;
mod rows;
use bounds::{
    cut, reaches, width_factor, BoundNorms, Bounds, CosineBounds, DotBounds, Int8Rows, L2Bounds,
    QueryBound,
};
use quant::{CorpusCodes, QueryCodes, RowCodes};
pub use rows::{select_certified, CertifiedRows};

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

    /// `self`, or [`CpuError::BatchGemmUnavailable`] when this CPU does not
    /// run it.
    pub(crate) fn check(self) -> Result<BatchGemm> {
        if self.is_available() {
            return Ok(self);
        }
        let available = BatchGemm::available()
            .iter()
            .map(|g| g.as_str())
            .collect::<Vec<_>>()
            .join(", ");
        Err(CpuError::BatchGemmUnavailable {
            gemm: self,
            available,
        }
        .into())
    }

    /// Whether `queries` queries for the top `k` of `n` rows of `dim`
    /// values take the certified path with this product, where it is faster
    /// than a plain scan (see [`MIN_QUERIES`] and [`MIN_INT8_VALUES`]): the
    /// same bytes either way.
    pub fn pays(self, queries: usize, n: usize, dim: usize, k: usize) -> bool {
        applies(queries, n, dim, k, self)
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
    /// On the `cargo xtask cpu-compare` corpus (Gaussian rows, 100k rows,
    /// Q = 1,000, K = 8 and 100) the int8 batch took 0.32–0.54× the f32
    /// batch's time at D = 384 and 1024 (`b4c4540`); larger D is not
    /// measured.
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
pub const MIN_QUERIES: usize = 16;
/// Largest dimension the bound is derived for (`D u ≤ 2^-8`).
pub(crate) const MAX_DIM: usize = 1 << 16;
/// Rows per GEMM block.
const BLOCK_ROWS: usize = 512;
/// Queries per GEMM call.
const QUERY_BLOCK: usize = 512;
/// Rows tested against a cut by one vector compare (the bits of a `u64`).
const GROUP: usize = 64;
/// Fewest corpus values (`N × D`) for which fewer than [`MIN_QUERIES`]
/// queries (a single one included) take the int8 path. Its codes are a
/// quarter of the f32 rows' bytes; below this the corpus sits in the caches
/// and the path's fixed costs (quantizing the queries, the shared selection)
/// outweigh that. Measured on this project's 2-core AVX-512 VM (Gaussian and
/// MiniLM rows, see bench/gpu/NOTES.md): the int8 single query is faster from
/// about 2^17 values at D = 384 and 2^20 at D = 32–64.
pub const MIN_INT8_VALUES: usize = 1 << 20;
/// Whether a batch of `queries` at this shape takes the certified path with
/// the product `gemm`: every batch of [`MIN_QUERIES`] or more, and smaller
/// ones (single queries too) over [`MIN_INT8_VALUES`] corpus values or more
/// when the product is int8.
pub(crate) fn applies(queries: usize, n: usize, dim: usize, k: usize, gemm: BatchGemm) -> bool {
    let wide = queries >= MIN_QUERIES
        || (gemm == BatchGemm::Int8 && n.saturating_mul(dim) >= MIN_INT8_VALUES);
    wide && queries > 0 && dim <= MAX_DIM && k.saturating_mul(4) <= n
}

/// The selection a certified search fills for each query: topk-cpu's
/// row-keyed one (ties by the smaller row, §3), or a caller's (an index's,
/// ties by the smaller external id). The bound pass needs only the K-th
/// best score held, whatever the tie order: a row whose upper bound is
/// below it scores below K rows already held under any order of ties.
pub trait CertifiedPick: Send {
    /// Offers row `row` with its canonical score.
    fn offer(&mut self, row: u32, score: f32);
    /// The K-th best score held once K rows are held, `None` before.
    fn kth_score(&self) -> Option<f32>;
}

impl CertifiedPick for Selector {
    fn offer(&mut self, row: u32, score: f32) {
        Selector::offer(self, row, score);
    }

    fn kth_score(&self) -> Option<f32> {
        // NaN until K rows are held.
        let kth = self.threshold_score();
        (!kth.is_nan()).then_some(kth)
    }
}

/// What the bound pass knows about one query, shared by every piece: the
/// best K rows scored so far and the threshold `T` they give.
#[derive(Debug)]
struct QueryState<P> {
    /// The K-th best score in `sel` as [`ordered_bits`] (`-inf` until K
    /// rows are held): read without the lock, raised under it.
    t: AtomicU32,
    /// The best K rows scored so far.
    sel: Mutex<P>,
}

impl<P: CertifiedPick> QueryState<P> {
    fn new(pick: P) -> QueryState<P> {
        QueryState {
            t: AtomicU32::new(ordered_bits(f32::NEG_INFINITY)),
            sel: Mutex::new(pick),
        }
    }

    /// The current threshold.
    #[inline]
    fn t(&self) -> f32 {
        // Relaxed: any value read is a K-th best score of rows already
        // scored, a valid lower bound of the final one.
        score_from_ordered_bits(self.t.load(Atomic::Relaxed))
    }

    /// Offers canonically scored rows and raises `T` to the K-th best score
    /// once K rows are held.
    fn offer(&self, found: &[(u32, f32)]) {
        // A panic elsewhere cannot leave a selection half-updated in a way
        // that matters here: its keys are plain values.
        let mut sel = self.sel.lock().unwrap_or_else(PoisonError::into_inner);
        for &(row, score) in found {
            sel.offer(row, score);
        }
        if let Some(kth) = sel.kth_score() {
            self.t.fetch_max(ordered_bits(kth), Atomic::Relaxed);
        }
    }

    fn into_pick(self) -> P {
        self.sel
            .into_inner()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// One parallel piece's buffers: the GEMM's output, the block of rows
/// widened from half-width storage, one query's scored rows of a block,
/// and how many rows it scored.
#[derive(Default)]
struct Piece {
    buf: Vec<f32>,
    wide: Vec<f32>,
    found: Vec<(u32, f32)>,
    scored: usize,
}

/// What a certified batch did (tests read it; searches log it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Stats {
    /// Rows scored canonically over all queries.
    pub(crate) rescored: usize,
}

/// What a certified search reads: the corpus, its state, the kernels that
/// score the rows kept.
#[derive(Clone, Copy)]
pub(crate) struct Engine<'a> {
    pub(crate) corpus: CorpusRef<'a>,
    pub(crate) kernels: Kernels,
    pub(crate) norms: &'a BoundNorms,
    /// The corpus codes where the product is int8.
    pub(crate) codes: Option<&'a CorpusCodes>,
}

impl Engine<'_> {
    /// One selection per query of a validated batch, by certified bounds
    /// and canonical scores of the admitted rows they cannot rule out.
    pub(crate) fn select<P: CertifiedPick>(
        &self,
        batch: &Batch<'_>,
        k: usize,
        admit: impl Fn(usize, u32) -> bool + Sync,
        pick: impl Fn() -> P,
    ) -> (Vec<P>, Stats) {
        let dim = self.corpus.dim();
        let rows = self.norms;
        let queries = BoundNorms::of(batch.data(), dim);
        let c = width_factor(dim);
        let codes = self
            .codes
            .and_then(|rows| Some((QueryCodes::of(batch.data(), dim)?, rows)));
        let params: Vec<QueryBound> = (0..batch.len())
            .map(|j| {
                let mut p = match self.corpus.metric() {
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
        let states: Vec<QueryState<P>> =
            (0..batch.len()).map(|_| QueryState::new(pick())).collect();
        let n = self.corpus.len();
        let blocks = n.div_ceil(BLOCK_ROWS);
        let min_len = (blocks / (4 * rayon::current_num_threads())).max(1);
        let scored = (0..blocks)
            .into_par_iter()
            .with_min_len(min_len)
            .fold(Piece::default, |mut piece, b| {
                let range = b * BLOCK_ROWS..((b + 1) * BLOCK_ROWS).min(n);
                let codes = codes
                    .as_ref()
                    .and_then(|(q, rows)| Some((q, rows.block(b)?)));
                let shared = (&params[..], &states[..], rows, c);
                self.bound_block(batch, codes, shared, &admit, range, &mut piece);
                piece
            })
            .map(|p| p.scored)
            .sum::<usize>();
        let stats = Stats { rescored: scored };
        tracing::debug!(
            queries = batch.len(),
            k,
            gemm = if codes.is_some() { "int8" } else { "f32" },
            rescored = stats.rescored,
            "certified batch"
        );
        let picks = states.into_iter().map(QueryState::into_pick).collect();
        (picks, stats)
    }

    /// Bounds every pair of (rows `range`, batch query) and scores
    /// canonically the admitted rows that can still reach each query's top
    /// K (`states`; `params`, `rows` and `c` as for the bounds). With
    /// `codes` (the batch's and the block's), the approximate dots come
    /// from the int8 product.
    #[allow(clippy::type_complexity)]
    fn bound_block<P: CertifiedPick>(
        &self,
        batch: &Batch<'_>,
        codes: Option<(&QueryCodes, &RowCodes)>,
        (params, states, rows, c): (&[QueryBound], &[QueryState<P>], &BoundNorms, f32),
        admit: &(impl Fn(usize, u32) -> bool + Sync),
        range: std::ops::Range<usize>,
        piece: &mut Piece,
    ) {
        let dim = self.corpus.dim();
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
            let blk = Block {
                buf: &piece.buf,
                nr,
                row0: range.start,
                q0,
            };
            let (params, states) = (&params[q0..q1], &states[q0..q1]);
            let score = |j: usize, row: u32| {
                if admit(j, row) {
                    Some(
                        self.corpus
                            .score(self.kernels, batch.query(j), batch.norm(j), row),
                    )
                } else {
                    None
                }
            };
            let found = &mut piece.found;
            let kernels = self.kernels;
            piece.scored += match self.corpus.metric() {
                Metric::Dot => scan(
                    kernels,
                    &DotBounds::new(&rows.norm[range.clone()]).with_int8(int8),
                    &blk,
                    params,
                    states,
                    found,
                    score,
                ),
                Metric::L2 => scan(
                    kernels,
                    &L2Bounds::new(&rows.sq[range.clone()], c).with_int8(int8),
                    &blk,
                    params,
                    states,
                    found,
                    score,
                ),
                Metric::Cosine => scan(
                    kernels,
                    &CosineBounds::new(&rows.norm[range.clone()], self.corpus.norms(range.clone()))
                        .with_int8(int8),
                    &blk,
                    params,
                    states,
                    found,
                    score,
                ),
            };
            q0 = q1;
        }
    }
}

impl CpuRetriever {
    /// One selector per query of a validated batch, on the certified path
    /// (building the row state on first use).
    pub(crate) fn select_certified(&self, batch: &Batch<'_>, k: usize) -> (Vec<Selector>, Stats) {
        let engine = self
            .certified_rows()
            .engine(self.corpus.view(), self.kernels);
        self.install(|| engine.select(batch, k, |_, _| true, || Selector::new(k)))
    }
}

/// One GEMM block's approximate dots: `buf[j * nr + i]` for batch query
/// `q0 + j` and block row `i`, corpus row `row0 + i`.
struct Block<'a> {
    buf: &'a [f32],
    nr: usize,
    row0: usize,
    q0: usize,
}

/// Scores canonically (`score(query, row)`, the query's index in the batch;
/// `None` for a row the caller does not admit) the rows of one GEMM block
/// whose upper bound reaches each query's `T`,
/// and offers them to the query's shared selection (through `found`, after
/// each group of rows that had some, which raises `T`); returns how many
/// rows it scored.
///
/// Rows go 64 at a time: one vector compare against the [`cut`] of `T`
/// leaves only the rows whose approximate dot is above it, and those are
/// bounded one by one (a cut of an older, lower `T` only lets more rows
/// through to that test).
fn scan<B: Bounds, P: CertifiedPick>(
    kernels: Kernels,
    bounds: &B,
    blk: &Block<'_>,
    params: &[QueryBound],
    states: &[QueryState<P>],
    found: &mut Vec<(u32, f32)>,
    score: impl Fn(usize, u32) -> Option<f32>,
) -> usize {
    let mut scored = 0;
    for (j, ((srow, p), st)) in blk
        .buf
        .chunks_exact(blk.nr)
        .zip(params)
        .zip(states)
        .enumerate()
    {
        let mut t = st.t();
        let mut cut_at = cut(bounds, p, t);
        for (gi, group) in srow.chunks(GROUP).enumerate() {
            let mut mask = match cut_at {
                Some(c) => kernels.above(group, c),
                None => u64::MAX >> (64 - group.len()),
            };
            if mask == 0 {
                continue;
            }
            found.clear();
            while mask != 0 {
                let o = mask.trailing_zeros() as usize;
                mask &= mask - 1;
                let i = gi * GROUP + o;
                let hi = bounds.hi(p, group[o], i);
                if reaches(hi, t) {
                    // Row indices fit u32: validated at ingest (§4).
                    let row = (blk.row0 + i) as u32;
                    if let Some(s) = score(blk.q0 + j, row) {
                        found.push((row, s));
                    }
                }
            }
            if !found.is_empty() {
                scored += found.len();
                st.offer(found);
                let now = st.t();
                if ordered_bits(now) != ordered_bits(t) {
                    t = now;
                    cut_at = cut(bounds, p, t);
                }
            }
        }
    }
    scored
}

#[cfg(test)]
#[path = "certified_tests.rs"]
mod tests;

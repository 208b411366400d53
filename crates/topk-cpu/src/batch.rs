//! The batch path of [`CpuRetriever`]: row blocks sized for the L2 cache are
//! scored against every query of the batch before the next block is read, so
//! a batch streams the corpus from memory once instead of once per query.
//!
//! Within a block, register tiles of a few rows × up to four queries share
//! their loads (see [`crate::kernels`]), and either a few rows or one query
//! tile stay in L1 while the other side streams past; each parallel task keeps one
//! [`Selector`] per query, and the tasks' selectors are merged per query with
//! the same comparator.
//!
//! Batches of at least [`crate::certified::MIN_QUERIES`] queries (of dimension at
//! most [`crate::certified::MAX_DIM`], with `4K ≤ N`) take the certified GEMM path
//! of [`crate::certified`] instead, and so do smaller ones over
//! [`crate::certified::MIN_INT8_VALUES`] corpus values (`N × D`) or more when the
//! product is int8 and the row state exists
//! ([`CpuRetriever::prepare_certified`]); both return the oracle's bytes.

use std::borrow::Cow;
use std::cmp::Ordering;
use std::ops::Range;

use ndarray::ArrayView2;
use rayon::prelude::*;
use topk_core::{validate, Metric, Neighbor, Result, Retriever};

use crate::kernels::{finish, Kernels, TileOut, MAX_TILE_ROWS, TILE_QUERIES};
use crate::retriever::CpuRetriever;
use crate::select::Selector;

/// Bytes of corpus rows per block: half of a 512 KiB L2, leaving room for a
/// block of queries and the selectors.
const BLOCK_BYTES: usize = 256 << 10;
/// Bytes of rows kept in a 32 KiB L1 data cache beside one query tile.
const L1_ROW_BYTES: usize = 16 << 10;
/// Bytes of queries streamed past those rows from L2 beside the row block.
const L2_QUERY_BYTES: usize = 160 << 10;

/// A validated batch in row-major order, with cosine norms.
pub(crate) struct Batch<'q> {
    data: Cow<'q, [f32]>,
    dim: usize,
    norms: Vec<f32>,
}

impl<'q> Batch<'q> {
    /// A validated batch (any layout) in row-major order, with its cosine
    /// norms from `kernels`.
    pub(crate) fn new(queries: ArrayView2<'q, f32>, metric: Metric, kernels: Kernels) -> Batch<'q> {
        let dim = queries.ncols();
        let data = match queries.to_slice() {
            Some(s) => Cow::Borrowed(s),
            None => Cow::Owned(queries.iter().copied().collect()),
        };
        let norms = if metric == Metric::Cosine {
            data.chunks_exact(dim).map(|q| kernels.norm(q)).collect()
        } else {
            Vec::new()
        };
        Batch { data, dim, norms }
    }

    /// Number of queries.
    pub(crate) fn len(&self) -> usize {
        self.data.len() / self.dim
    }

    /// Every query, row-major.
    pub(crate) fn data(&self) -> &[f32] {
        &self.data
    }

    /// Query `i`.
    pub(crate) fn query(&self, i: usize) -> &[f32] {
        &self.data[i * self.dim..(i + 1) * self.dim]
    }

    /// The canonical norm of query `i` for cosine (0 otherwise).
    pub(crate) fn norm(&self, i: usize) -> f32 {
        self.norms.get(i).copied().unwrap_or(0.0)
    }
}

/// A block of corpus rows as `f32`, named by their corpus row numbers.
struct Block<'a> {
    rows: &'a [f32],
    first: usize,
    dim: usize,
}

impl Block<'_> {
    /// Corpus row `i` (inside the block).
    #[inline]
    fn row(&self, i: usize) -> &[f32] {
        let j = i - self.first;
        &self.rows[j * self.dim..(j + 1) * self.dim]
    }
}

impl CpuRetriever {
    /// Searches every row of a `Q × D` batch (any layout) and writes result `i`
    /// into `out[i]`; `out` ends with exactly Q entries, each holding
    /// `min(k, N)` neighbours best first, and the inner vectors' capacity is
    /// reused. The whole batch is validated before any search runs.
    ///
    /// Results are identical to `Q` calls of [`Retriever::search_into`].
    pub fn search_batch_into(
        &self,
        queries: ArrayView2<'_, f32>,
        k: usize,
        out: &mut Vec<Vec<Neighbor>>,
    ) -> Result<()> {
        validate::queries(queries, self.dim())?;
        let k = validate::k(k, self.len())?;
        let nq = queries.nrows();
        out.resize_with(nq, Vec::new);
        if nq == 0 {
            return Ok(());
        }
        let batch = self.prepare_batch(queries);
        let sels = if self.takes_certified(nq, k) {
            self.select_certified(&batch, k).0
        } else {
            self.select_batch(&batch, k)
        };
        for (i, (sel, o)) in sels.into_iter().zip(out.iter_mut()).enumerate() {
            let (q, qn) = (batch.query(i), batch.norm(i));
            sel.finish(o, |row| self.score_one(q, qn, row));
        }
        Ok(())
    }

    /// A validated batch (any layout) in row-major order, with its cosine norms.
    pub(crate) fn prepare_batch<'q>(&self, queries: ArrayView2<'q, f32>) -> Batch<'q> {
        Batch::new(queries, self.metric(), self.kernels)
    }

    /// One selector per query, over the whole corpus.
    fn select_batch(&self, batch: &Batch<'_>, k: usize) -> Vec<Selector> {
        let n = self.len();
        let tile_rows = self.kernels.tile_rows(self.metric());
        let block_rows = (BLOCK_BYTES / (4 * self.dim())).max(1).div_ceil(tile_rows) * tile_rows;
        let fresh = || vec![Selector::new(k); batch.len()];
        self.install(|| {
            let blocks = n.div_ceil(block_rows);
            // Few, long runs of blocks per thread: every fold piece starts
            // with empty selectors that must fill up again.
            let min_len = (blocks / (4 * rayon::current_num_threads())).max(1);
            (0..blocks)
                .into_par_iter()
                .with_min_len(min_len)
                .fold(fresh, |mut sels, b| {
                    let range = b * block_rows..((b + 1) * block_rows).min(n);
                    self.scan_block(batch, range, tile_rows, &mut sels);
                    sels
                })
                .reduce(fresh, |a, b| {
                    a.into_iter().zip(b).map(|(x, y)| x.merge(y)).collect()
                })
        })
    }

    /// Offers every pair of (rows `range`, batch query) to that query's selector.
    ///
    /// Two cache plans, picked by the row length: when several row tiles fit
    /// in L1 next to a query tile, a small group of rows stays in L1 while the
    /// queries of an L2-sized block stream past it; otherwise one query tile
    /// stays in L1 while the block's rows stream from L2.
    fn scan_block(
        &self,
        batch: &Batch<'_>,
        range: Range<usize>,
        tile_rows: usize,
        sels: &mut [Selector],
    ) {
        let row_bytes = 4 * self.dim();
        let l1_rows = L1_ROW_BYTES / row_bytes / tile_rows * tile_rows;
        let (group_rows, query_block) = if l1_rows > TILE_QUERIES {
            let qb = (L2_QUERY_BYTES / row_bytes).max(TILE_QUERIES);
            (l1_rows, qb / TILE_QUERIES * TILE_QUERIES)
        } else {
            (range.len(), batch.len())
        };
        // A half-width block is widened once for all of its query blocks.
        let mut wide = Vec::new();
        let block = Block {
            rows: self.corpus.rows(range.clone(), &mut wide),
            first: range.start,
            dim: self.dim(),
        };
        let mut q0 = 0;
        while q0 < batch.len() {
            let q1 = (q0 + query_block).min(batch.len());
            let mut g0 = range.start;
            while g0 < range.end {
                let g1 = (g0 + group_rows).min(range.end);
                self.scan_group(batch, &block, q0..q1, g0..g1, tile_rows, sels);
                g0 = g1;
            }
            q0 = q1;
        }
    }

    /// Every tile of (rows `rows`) × (queries `queries`), query tiles outside.
    fn scan_group(
        &self,
        batch: &Batch<'_>,
        block: &Block<'_>,
        queries: Range<usize>,
        rows: Range<usize>,
        tile_rows: usize,
        sels: &mut [Selector],
    ) {
        let metric = self.metric();
        let sq = metric == Metric::L2;
        let mut raw: TileOut = [[0.0; TILE_QUERIES]; MAX_TILE_ROWS];
        let mut q0 = queries.start;
        while q0 < queries.end {
            let nq = TILE_QUERIES.min(queries.end - q0);
            let mut qs: [&[f32]; TILE_QUERIES] = [batch.query(q0); TILE_QUERIES];
            for (j, q) in qs.iter_mut().enumerate().take(nq) {
                *q = batch.query(q0 + j);
            }
            // Local copies of the tile's query norms and thresholds let one
            // comparison of four scores reject a whole row of the tile; lanes
            // past the batch compare against +inf and never ask for work.
            let mut qnorm = [0.0_f32; TILE_QUERIES];
            let mut thr = [f32::INFINITY; TILE_QUERIES];
            for jq in 0..nq {
                qnorm[jq] = batch.norm(q0 + jq);
                thr[jq] = sels[q0 + jq].threshold_score();
            }
            let mut r0 = rows.start;
            while r0 < rows.end {
                let nr = tile_rows.min(rows.end - r0);
                // A short tile repeats its last row; those results are ignored.
                let mut tile: [&[f32]; MAX_TILE_ROWS] = [block.row(r0); MAX_TILE_ROWS];
                for (j, r) in tile.iter_mut().enumerate().take(tile_rows) {
                    *r = block.row(r0 + j.min(nr - 1));
                }
                self.kernels
                    .tile(sq, &tile[..tile_rows], &qs[..nq], &mut raw);
                for (j, raw_row) in raw.iter().enumerate().take(nr) {
                    let i = r0 + j;
                    let row_norm = self.corpus.norm(i);
                    let mut s = [0.0_f32; TILE_QUERIES];
                    let mut wanted = false;
                    for jq in 0..TILE_QUERIES {
                        s[jq] = finish(metric, raw_row[jq], qnorm[jq], row_norm);
                        wanted |= s[jq].partial_cmp(&thr[jq]) != Some(Ordering::Less);
                    }
                    if !wanted {
                        continue;
                    }
                    for jq in 0..nq {
                        let sel = &mut sels[q0 + jq];
                        sel.offer(i as u32, s[jq]);
                        thr[jq] = sel.threshold_score();
                    }
                }
                r0 += nr;
            }
            q0 += nq;
        }
    }
}

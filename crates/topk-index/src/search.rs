//! Exact search of an [`Index`], with or without a filter (docs/CONTRACTS.md §10).
//!
//! The `cpu` backend streams the stored rows in blocks of 64 through topk-cpu's
//! canonical SIMD kernels and offers only the rows its mask allows (the live
//! rows, or the allowed live rows of a dense filter); a block with no allowed
//! row is skipped unscored. A sparse filter instead gathers its rows and scores
//! only those. Batches of 16 queries or more, and single queries over 2^20
//! stored values or more where the CPU runs the int8 product, take topk-cpu's
//! certified path instead (docs/CONTRACTS.md §2.1) under the same mask: bounds
//! from a fast product rule rows out, the rest are scored canonically, and
//! the selection is this module's, by external id. Filters given per query
//! join it too (`crate::certified`), 256 queries at a time, each query under its
//! own bitset, those with sparse filters gathering their rows instead. The
//! `oracle` backend scores every live allowed row with the scalar reference
//! and sorts. Both select under [`topk_core::hit_key`].

use std::borrow::Cow;

use ndarray::{ArrayView1, ArrayView2};
use rayon::prelude::*;
use topk_core::{cmp_hit, hit_key, validate, Error as CoreError, Hit, HitTopK, Metric};

use crate::error::IndexError;
use crate::filter::{Filter, FilterSpec};
use crate::index::{FilterResolution, Index};
use crate::options::IndexBackend;

/// A filter allowing at most this fraction of the live rows is searched by
/// gathering its rows and scoring only those; a larger one by streaming every
/// row in blocks of 64 and masking the others (a block with no allowed row is
/// skipped unscored).
///
/// Measured with `examples/filter_sweep.rs` (K = 100, one query, random
/// filters) on a 2-core x86-64 machine: at N = 200k, D = 128 the gather took
/// 0.17x / 0.31x / 0.97x the time of an unfiltered search at 10 / 20 / 50 %
/// against 0.98x / 0.86x / 1.15x for the masked scan; at N = 500k, D = 16
/// 0.70x / 1.47x / 2.52x against 1.10x / 1.86x / 2.91x. The gather won at every
/// fraction up to 50 %; 25 % keeps a margin for machines with more cores,
/// where a streamed scan scales better than scattered reads. The choice is
/// made on the allowed live rows, after the filter is resolved to rows (see
/// [`MERGE_FRACTION`]); results are the same bytes on either side.
pub const SPARSE_FRACTION: f64 = 0.25;

/// A filter of at least this fraction of the live rows is resolved to rows by
/// one merge of its sorted ids with the id-sorted live rows (`O(F + N)`, no
/// hashing); a smaller one by a hash lookup per filter id (`O(F)` scattered
/// reads). Both give the same rows, so the same bytes.
///
/// Measured with `examples/filter_sweep.rs` at N = 200k (table in the crate
/// documentation): lookups cost about 15 ns an id, the merge a fixed pass
/// over the rows plus little per id, and a run of ids shared by both sides is
/// one slice comparison. Lookups won up to 20 % at D = 16 and D = 128; at 50 %
/// the two were within noise (1.98x / 2.02x of an unfiltered search at
/// D = 16); from 90 % the merge won clearly (1.20x against 3.05x at 100 %).
pub const MERGE_FRACTION: f64 = 0.5;

/// The stored rows a `cpu` search may offer.
pub(crate) enum Allowed {
    /// Every live row (no filter).
    Live,
    /// These rows only, gathered (a sparse filter).
    Rows(Vec<usize>),
    /// The rows whose bit is set (a dense filter).
    Mask(Vec<u64>),
}

/// A query row as a slice: borrowed where its values are contiguous,
/// copied otherwise.
pub(crate) fn query_values(row: ArrayView1<'_, f32>) -> Cow<'_, [f32]> {
    match row.to_slice() {
        Some(s) => Cow::Borrowed(s),
        None => Cow::Owned(row.to_vec()),
    }
}

/// Rows scored per kernel call: one word of a row bitset.
pub(crate) const BLOCK: usize = 64;
/// Values (about 1 MiB) scored per parallel task.
const TASK_VALUES: usize = 1 << 18;

/// A bounded selection of hits with an exact early reject: a score below the
/// worst kept score cannot enter (scores are never NaN, §4.1).
#[derive(Debug, Clone)]
pub(crate) struct Selector {
    pub(crate) top: HitTopK,
    threshold_key: u128,
    threshold_score: f32,
}

impl Selector {
    pub(crate) fn new(k: usize) -> Self {
        Selector {
            top: HitTopK::new(k),
            threshold_key: 0,
            threshold_score: f32::NEG_INFINITY,
        }
    }

    #[inline]
    pub(crate) fn offer(&mut self, id: u64, score: f32) {
        if score < self.threshold_score {
            return;
        }
        self.offer_key(hit_key(score, id));
    }

    #[inline]
    fn offer_key(&mut self, key: u128) {
        if key <= self.threshold_key {
            return;
        }
        self.top.push_key(key);
        if let Some(t) = self.top.threshold() {
            self.threshold_key = t;
            self.threshold_score = Hit::from_key(t).score;
        }
    }

    fn merge(mut self, mut other: Selector) -> Selector {
        if other.top.len() > self.top.len() {
            std::mem::swap(&mut self, &mut other);
        }
        for key in other.top.drain_sorted_keys() {
            self.offer_key(key);
        }
        self
    }
}

impl Index {
    /// The exact top `min(k, M)` hits of `query` among the `M` live rows the
    /// filter allows (every live row without one), best first.
    pub fn search(
        &self,
        query: &[f32],
        k: usize,
        filter: Option<&Filter>,
    ) -> Result<Vec<Hit>, IndexError> {
        validate::query(query, self.dim)?;
        check_k(k)?;
        if self.backend == IndexBackend::Cuda {
            let spec = filter.map_or(FilterSpec::None, FilterSpec::Shared);
            let mut found = self.device_search(query, k, spec)?;
            return Ok(found.pop().unwrap_or_default());
        }
        Ok(self.search_valid(query, k, filter))
    }

    /// [`Index::search`] for every row of `queries` (a `Q × D` view of any
    /// layout), under no filter, one shared filter, or one filter per query.
    /// The whole batch is checked before any of it is searched.
    pub fn search_batch(
        &self,
        queries: ArrayView2<'_, f32>,
        k: usize,
        filter: FilterSpec<'_>,
    ) -> Result<Vec<Vec<Hit>>, IndexError> {
        let filters_fit = match filter {
            FilterSpec::PerQuery(fs) => fs.len() == queries.nrows(),
            _ => true,
        };
        if self.backend == IndexBackend::Cuda && filters_fit {
            // The values are checked on the device as the engine stages them;
            // a batch it refuses gets the host check's error, the one every
            // backend gives, as does any other failure of a batch at fault.
            return validate::queries_checked_by(
                queries,
                self.dim,
                k,
                |flat| {
                    check_k(k)?;
                    self.device_search(flat, k, filter)
                },
                |_| true,
            );
        }
        validate::queries(queries, self.dim)?;
        check_k(k)?;
        if let FilterSpec::PerQuery(fs) = filter {
            if !filters_fit {
                return Err(IndexError::FilterCount {
                    filters: fs.len(),
                    queries: queries.nrows(),
                });
            }
        }
        if self.backend == IndexBackend::Hnsw {
            return Ok(self.graph_search_batch(queries, k, filter));
        }
        // A shared filter is resolved to rows once for the whole batch.
        let shared = match (self.backend, filter) {
            (IndexBackend::Cpu, FilterSpec::Shared(f)) => Some(self.allowed(Some(f))),
            _ => None,
        };
        if self.backend == IndexBackend::Cpu {
            if let FilterSpec::PerQuery(fs) = filter {
                if let Some(found) = self.certified_per_query(queries, k, fs) {
                    return Ok(found);
                }
            }
            let whole = match (&shared, filter) {
                (Some(allowed), _) => Some(allowed),
                (None, FilterSpec::None) => Some(&Allowed::Live),
                _ => None,
            };
            if let Some(found) = whole.and_then(|a| self.certified_search(queries, k, a)) {
                return Ok(found);
            }
        }
        Ok((0..queries.nrows())
            .into_par_iter()
            .map(|i| {
                let q = query_values(queries.row(i));
                match &shared {
                    Some(allowed) => self.cpu_search(&q, k, allowed),
                    None => self.search_valid(&q, k, filter.of(i)),
                }
            })
            .collect())
    }

    /// Searches a checked query with `k ≥ 1`.
    fn search_valid(&self, query: &[f32], k: usize, filter: Option<&Filter>) -> Vec<Hit> {
        match self.backend {
            IndexBackend::Oracle => self.oracle_search(query, k, filter),
            IndexBackend::Cpu => self.cpu_search(query, k, &self.allowed(filter)),
            IndexBackend::Hnsw => self.graph_search(query, k, filter),
            // Searches of a `cuda` index go to the device before this; the
            // host scan returns the same bytes.
            IndexBackend::Cuda => self.cpu_search(query, k, &self.allowed(filter)),
        }
    }

    /// The `cpu` backend's exact search of a checked query with `k ≥ 1`.
    pub(crate) fn exact_search(
        &self,
        query: &[f32],
        k: usize,
        filter: Option<&Filter>,
    ) -> Vec<Hit> {
        self.cpu_search(query, k, &self.allowed(filter))
    }

    /// Every live allowed row scored by the scalar reference, then sorted.
    fn oracle_search(&self, query: &[f32], k: usize, filter: Option<&Filter>) -> Vec<Hit> {
        let mut all: Vec<Hit> = (0..self.ids.len())
            .filter(|&r| self.is_live(r) && filter.is_none_or(|f| f.contains(self.ids[r])))
            .map(|r| Hit::new(self.ids[r], self.metric.score_scalar(query, &self.row(r))))
            .collect();
        all.sort_unstable_by(cmp_hit);
        all.truncate(k);
        all
    }

    /// Resolves a filter to the stored rows a `cpu` search may offer: a
    /// list to gather when it is sparse, a bitset to mask with otherwise.
    pub(crate) fn allowed(&self, filter: Option<&Filter>) -> Allowed {
        let Some(f) = filter else {
            return Allowed::Live;
        };
        let merge = match self.resolution {
            FilterResolution::Auto => f.len() as f64 >= MERGE_FRACTION * self.len() as f64,
            FilterResolution::Lookup => false,
            FilterResolution::Merge => true,
        };
        let sparse = |rows: usize| rows as f64 <= SPARSE_FRACTION * self.len() as f64;
        if merge {
            let mask = self.merge_mask(f.ids());
            let count: usize = mask.iter().map(|w| w.count_ones() as usize).sum();
            if !sparse(count) {
                return Allowed::Mask(mask);
            }
            let mut rows = Vec::with_capacity(count);
            for (b, &word) in mask.iter().enumerate() {
                let mut bits = word;
                while bits != 0 {
                    rows.push(b * BLOCK + bits.trailing_zeros() as usize);
                    bits &= bits - 1;
                }
            }
            return Allowed::Rows(rows);
        }
        let rows: Vec<usize> = f
            .ids()
            .iter()
            .filter_map(|id| self.rows_of.get(id).copied())
            .collect();
        if sparse(rows.len()) {
            return Allowed::Rows(rows);
        }
        let mut mask = vec![0u64; self.live.len()];
        for &r in &rows {
            mask[r / 64] |= 1 << (r % 64);
        }
        Allowed::Mask(mask)
    }

    /// The bitset of the live rows whose id is in `ids` (ascending, each
    /// once): one merge of `ids` with the id-sorted rows, then a binary
    /// search of `ids` for each row appended since they were sorted.
    fn merge_mask(&self, ids: &[u64]) -> Vec<u64> {
        let mut mask = vec![0u64; self.live.len()];
        let (sorted, rows) = (&self.by_id[..], &self.by_id_rows[..]);
        let (mut i, mut j) = (0, 0);
        while i < ids.len() && j < sorted.len() {
            // A run of ids the filter and the sorted rows share, the whole
            // of a dense filter's merge, is one vectorised comparison.
            let run = RUN.min(ids.len() - i).min(sorted.len() - j);
            if ids[i..i + run] == sorted[j..j + run] {
                set_rows(&mut mask, &rows[j..j + run]);
                i += run;
                j += run;
                continue;
            }
            // Otherwise step one id at a time to the end of this run.
            let end = j + run;
            while j < end && i < ids.len() {
                let (x, y) = (ids[i], sorted[j]);
                if x < y {
                    i += 1;
                } else {
                    if x == y {
                        mask[rows[j] / 64] |= 1 << (rows[j] % 64);
                        i += 1;
                    }
                    j += 1;
                }
            }
        }
        for r in self.sorted_upto..self.ids.len() {
            if ids.binary_search(&self.ids[r]).is_ok() {
                mask[r / 64] |= 1 << (r % 64);
            }
        }
        // Entries of rows removed since the sort are dropped here.
        for (m, &l) in mask.iter_mut().zip(&self.live) {
            *m &= l;
        }
        mask
    }

    pub(crate) fn cpu_search(&self, query: &[f32], k: usize, allowed: &Allowed) -> Vec<Hit> {
        let one = ArrayView2::from_shape((1, query.len()), query).ok();
        if let Some(mut found) = one.and_then(|q| self.certified_search(q, k, allowed)) {
            return found.pop().unwrap_or_default();
        }
        let qn = self.query_norm(query);
        let mut sel = match allowed {
            Allowed::Live => self.scan_masked(query, qn, k, &self.live),
            Allowed::Rows(rows) => self.scan_gathered(query, qn, k, rows),
            Allowed::Mask(mask) => self.scan_masked(query, qn, k, mask),
        };
        self.drain(&mut sel, query, qn)
    }

    /// The hits `sel` kept, best first, each with its score's exact bits
    /// (its key folds `-0.0` into `+0.0`).
    pub(crate) fn drain(&self, sel: &mut Selector, query: &[f32], qn: f32) -> Vec<Hit> {
        sel.top.drain_hits(|id| {
            let r = self.rows_of.get(&id).copied().unwrap_or_default();
            self.score_one(query, qn, r)
        })
    }

    /// The query's canonical norm for cosine (not needed, so 0, otherwise).
    pub(crate) fn query_norm(&self, query: &[f32]) -> f32 {
        if self.metric == Metric::Cosine {
            self.kernels.norm(query)
        } else {
            0.0
        }
    }

    /// The canonical score of stored row `r` on the SIMD path.
    #[inline]
    pub(crate) fn score_one(&self, query: &[f32], qn: f32, r: usize) -> f32 {
        let norm = self.norms.get(r).copied().unwrap_or(0.0);
        self.kernels
            .score_stored_row(self.metric, query, qn, &self.data, r, norm)
    }

    /// Offers every stored row whose bit is set in `mask`.
    fn scan_masked(&self, query: &[f32], qn: f32, k: usize, mask: &[u64]) -> Selector {
        let blocks = mask.len();
        let task_blocks = (TASK_VALUES / (self.dim * BLOCK)).max(1);
        let scan = |range: std::ops::Range<usize>, sel: &mut Selector| {
            let mut scores = [0.0_f32; BLOCK];
            let mut wide = Vec::new();
            for b in range {
                let word = mask[b];
                if word == 0 {
                    continue;
                }
                let start = b * BLOCK;
                let end = (start + BLOCK).min(self.ids.len());
                let scores = &mut scores[..end - start];
                let norms = if self.norms.is_empty() {
                    &[][..]
                } else {
                    &self.norms[start..end]
                };
                self.kernels.score_stored(
                    self.metric,
                    query,
                    qn,
                    &self.data,
                    start..end,
                    norms,
                    scores,
                    &mut wide,
                );
                let mut bits = word;
                while bits != 0 {
                    let j = bits.trailing_zeros() as usize;
                    bits &= bits - 1;
                    sel.offer(self.ids[start + j], scores[j]);
                }
            }
        };
        // At most the rows there are can be kept: a K far above N reserves
        // no more than N.
        select_parallel(blocks, task_blocks, k.min(blocks * BLOCK).max(1), scan)
    }

    /// Offers the stored rows `rows` only.
    fn scan_gathered(&self, query: &[f32], qn: f32, k: usize, rows: &[usize]) -> Selector {
        let task_rows = (TASK_VALUES / self.dim).max(BLOCK);
        let scan = |range: std::ops::Range<usize>, sel: &mut Selector| {
            for &r in &rows[range] {
                sel.offer(self.ids[r], self.score_one(query, qn, r));
            }
        };
        select_parallel(rows.len(), task_rows, k.min(rows.len()).max(1), scan)
    }
}

/// Ids compared at once when merging a filter with the id-sorted rows.
const RUN: usize = 64;

/// Sets the bits of `rows` in `mask`, gathering consecutive bits of one word
/// in a register (rows stored in id order fill whole words).
fn set_rows(mask: &mut [u64], rows: &[usize]) {
    let mut word = usize::MAX;
    let mut bits = 0u64;
    for &r in rows {
        if r / 64 != word {
            if let Some(m) = mask.get_mut(word) {
                *m |= bits;
            }
            word = r / 64;
            bits = 0;
        }
        bits |= 1 << (r % 64);
    }
    if let Some(m) = mask.get_mut(word) {
        *m |= bits;
    }
}

/// Runs `scan` over `0..n` in tasks of `task` items, in parallel when there is
/// more than one task, and merges the selections.
fn select_parallel(
    n: usize,
    task: usize,
    k: usize,
    scan: impl Fn(std::ops::Range<usize>, &mut Selector) + Sync,
) -> Selector {
    if n <= task {
        let mut sel = Selector::new(k);
        scan(0..n, &mut sel);
        return sel;
    }
    let tasks = n.div_ceil(task);
    (0..tasks)
        .into_par_iter()
        .fold(
            || Selector::new(k),
            |mut sel, t| {
                scan(t * task..((t + 1) * task).min(n), &mut sel);
                sel
            },
        )
        .reduce(|| Selector::new(k), Selector::merge)
}

fn check_k(k: usize) -> Result<(), IndexError> {
    if k == 0 {
        return Err(CoreError::ZeroK.into());
    }
    Ok(())
}

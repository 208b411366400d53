//! The `cpu` backend's certified path (docs/CONTRACTS.md §10): topk-cpu's
//! certified engine over the index's stored rows, under the live bits or a
//! filter's bitset, selecting by external id; and the row state it keeps
//! beside the rows, following every change of them.

use std::sync::OnceLock;

use ndarray::{ArrayView2, Axis};
use rayon::prelude::*;
use topk_core::Hit;
use topk_cpu::{select_certified, BatchGemm, CertifiedPick, CertifiedRows, CorpusRef, MIN_QUERIES};

use crate::filter::Filter;
use crate::index::Index;
use crate::options::IndexBackend;
use crate::search::{query_values, Allowed, Selector, BLOCK};

/// Queries with filters of their own searched together on the certified
/// path: their row bitsets (`N/8` bytes each) are held at once.
const PER_QUERY_CHUNK: usize = 256;

/// A [`Selector`] fed by row for topk-cpu's certified path: each row is
/// offered under its external id.
struct IdPick<'a> {
    sel: Selector,
    ids: &'a [u64],
}

impl CertifiedPick for IdPick<'_> {
    fn offer(&mut self, row: u32, score: f32) {
        // Rows come from the stored rows, so the index holds their ids.
        if let Some(&id) = self.ids.get(row as usize) {
            self.sel.offer(id, score);
        }
    }

    fn kth_score(&self) -> Option<f32> {
        self.sel.top.threshold().map(|t| Hit::from_key(t).score)
    }
}

impl Index {
    /// Rows stored, tombstoned ones included (until the next compaction).
    pub fn stored_rows(&self) -> usize {
        self.ids.len()
    }

    /// Stored rows the `cpu` backend's certified-path state covers (every
    /// stored row once a search has built it; it then follows every change),
    /// `None` before (docs/CONTRACTS.md §2.1).
    pub fn certified_coverage(&self) -> Option<usize> {
        self.certified.get().map(CertifiedRows::len)
    }

    /// The exact top `min(k, M)` hits of every checked query (`k ≥ 1`) over
    /// the `M` rows `allowed` lets through, on topk-cpu's certified path;
    /// `None` where that path does not pay (few queries over few values, a
    /// sparse filter, which gathers its rows instead) and the scan answers:
    /// the same bytes either way.
    pub(crate) fn certified_search(
        &self,
        queries: ArrayView2<'_, f32>,
        k: usize,
        allowed: &Allowed,
    ) -> Option<Vec<Vec<Hit>>> {
        let mask = self.mask_of(allowed)?;
        self.certified_masked(queries, k, |_| mask)
    }

    /// The row bitset of a resolved filter; `None` for a sparse one.
    fn mask_of<'a>(&'a self, allowed: &'a Allowed) -> Option<&'a [u64]> {
        match allowed {
            Allowed::Live => Some(&self.live),
            Allowed::Mask(mask) => Some(mask),
            Allowed::Rows(_) => None,
        }
    }

    /// Per-query filters on the certified path, `PER_QUERY_CHUNK` queries
    /// at a time: each query's filter is resolved to rows (as the scan
    /// does), the queries with dense filters are searched together, each
    /// under its own bitset, and those with sparse filters gather their
    /// rows. `None` where the batch is too small for the path to pay.
    pub(crate) fn certified_per_query(
        &self,
        queries: ArrayView2<'_, f32>,
        k: usize,
        filters: &[Filter],
    ) -> Option<Vec<Vec<Hit>>> {
        let (nq, stored) = (queries.nrows(), self.ids.len());
        let gemm = BatchGemm::for_dim(self.dim);
        if !gemm.pays(nq, stored, self.dim, k.min(stored)) {
            return None;
        }
        let mut out: Vec<Vec<Hit>> = vec![Vec::new(); nq];
        for c0 in (0..nq).step_by(PER_QUERY_CHUNK) {
            let c1 = (c0 + PER_QUERY_CHUNK).min(nq);
            let allowed: Vec<Allowed> = filters[c0..c1]
                .par_iter()
                .map(|f| self.allowed(Some(f)))
                .collect();
            let (dense, masks): (Vec<usize>, Vec<&[u64]>) = (0..c1 - c0)
                .filter_map(|j| self.mask_of(&allowed[j]).map(|m| (j, m)))
                .unzip();
            let mut done = vec![false; c1 - c0];
            // `certified_masked` declines where the dense queries are too
            // few for the path to pay.
            if !dense.is_empty() {
                let rows: Vec<usize> = dense.iter().map(|&j| c0 + j).collect();
                let sub = queries.select(Axis(0), &rows);
                if let Some(found) = self.certified_masked(sub.view(), k, |j| masks[j]) {
                    for (&j, hits) in dense.iter().zip(found) {
                        out[c0 + j] = hits;
                        done[j] = true;
                    }
                }
            }
            let rest: Vec<(usize, Vec<Hit>)> = (0..c1 - c0)
                .into_par_iter()
                .filter(|&j| !done[j])
                .map(|j| {
                    let q = query_values(queries.row(c0 + j));
                    (j, self.cpu_search(&q, k, &allowed[j]))
                })
                .collect();
            for (j, hits) in rest {
                out[c0 + j] = hits;
            }
        }
        Some(out)
    }

    /// [`Index::certified_search`] with query `j`'s rows given by the bitset
    /// `mask_of(j)`.
    fn certified_masked<'m>(
        &self,
        queries: ArrayView2<'_, f32>,
        k: usize,
        mask_of: impl Fn(usize) -> &'m [u64] + Sync,
    ) -> Option<Vec<Vec<Hit>>> {
        let stored = self.ids.len();
        let k = k.min(stored);
        if !BatchGemm::for_dim(self.dim).pays(queries.nrows(), stored, self.dim, k) {
            return None;
        }
        let corpus = CorpusRef::new(&self.data, self.metric, &self.norms).ok()?;
        // Small batches use the state but never build it (memory grows
        // only where batches run or where asked for).
        let rows = match self.certified.get() {
            Some(rows) => rows,
            None if queries.nrows() >= MIN_QUERIES => self.certified_rows(corpus)?,
            None => return None,
        };
        let admit = |j: usize, row: u32| {
            let r = row as usize;
            mask_of(j)
                .get(r / BLOCK)
                .is_some_and(|w| w >> (r % BLOCK) & 1 == 1)
        };
        let pick = || IdPick {
            sel: Selector::new(k),
            ids: &self.ids,
        };
        let picks = match select_certified(corpus, rows, self.kernels, queries, k, admit, pick) {
            Ok(p) => p,
            Err(e) => {
                // Not reachable for checked queries and a state kept with
                // the rows; the scan gives the same bytes.
                tracing::warn!(error = %e, "certified search declined; scanning");
                return None;
            }
        };
        Some(
            picks
                .into_iter()
                .zip(queries.rows())
                .map(|(mut p, row)| {
                    let q = query_values(row);
                    self.drain(&mut p.sel, &q, self.query_norm(&q))
                })
                .collect(),
        )
    }

    /// Builds the `cpu` backend's certified-path state of the stored rows
    /// now (upward norms and, where the CPU runs the int8 product, int8
    /// codes: a quarter of the bytes of f32 rows). The first batch of 16 or
    /// more queries builds it anyway; single queries and smaller batches
    /// over 2^20 stored values use it once it exists but never build it
    /// (docs/CONTRACTS.md §10). Every change of the rows keeps it up to
    /// date from then on. Results are the same bytes either way. Does
    /// nothing on the other backends.
    pub fn prepare_certified(&self) {
        // The other backends never take the path: nothing to hold for them.
        if self.backend != IndexBackend::Cpu {
            return;
        }
        if let Ok(corpus) = CorpusRef::new(&self.data, self.metric, &self.norms) {
            self.certified_rows(corpus);
        }
    }

    /// The certified state of the stored rows, built on first use.
    fn certified_rows(&self, corpus: CorpusRef<'_>) -> Option<&CertifiedRows> {
        if let Some(rows) = self.certified.get() {
            return Some(rows);
        }
        let built = CertifiedRows::build(corpus, BatchGemm::for_dim(self.dim)).ok()?;
        Some(self.certified.get_or_init(|| built))
    }

    /// Brings the certified state up to date after the stored rows from
    /// `first` on changed, were appended or were dropped.
    pub(crate) fn rows_changed_from(&mut self, first: usize) {
        self.update_state(|state, corpus| state.update_from(corpus, first));
    }

    /// Brings the certified state of stored rows `rows` up to date after
    /// their values changed.
    pub(crate) fn rows_changed(&mut self, rows: &[usize]) {
        self.update_state(|state, corpus| state.refresh_rows(corpus, rows));
    }

    /// Runs `f` on the certified state, where one is built, and the rows as
    /// they are now.
    fn update_state(&mut self, f: impl FnOnce(&mut CertifiedRows, CorpusRef<'_>)) {
        match CorpusRef::new(&self.data, self.metric, &self.norms) {
            Ok(corpus) => {
                if let Some(state) = self.certified.get_mut() {
                    f(state, corpus);
                }
            }
            // Never: the norms number the rows. A state that cannot follow
            // is dropped (the next batch builds it again).
            Err(_) => self.certified = OnceLock::new(),
        }
    }
}

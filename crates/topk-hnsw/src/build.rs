//! Index construction (Malkov & Yashunin, Algorithms 1 and 4).
//!
//! Each node is inserted by descending greedily to its own level, then, on
//! every layer from there down to 0, running an `ef_construction` beam search,
//! keeping `m` neighbours chosen by the diversity heuristic, and linking both
//! ways; a neighbour whose list overflows is re-pruned with the same heuristic.
//!
//! # Determinism
//!
//! Node levels are drawn up front from the seeded generator, in insertion
//! order, so they never depend on scheduling. A **sequential build is
//! deterministic**: the same corpus, metric, parameters and seed give the same
//! graph, bit for bit (and the same saved file). A **parallel build** inserts
//! nodes from several threads, pulling ids from a shared counter as hnswlib
//! does; which neighbours a node sees depends on timing, so its graph varies
//! from run to run. Its recall is that of the sequential build within noise
//! (tested), and the graph is always well formed: each list is written under
//! its node's lock, and readers copy lists whose every slot holds a valid id.

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use crate::error::{HnswError, Result};
use crate::graph::{Layout, Links};
use crate::params::{draw_levels, HnswParams};
use crate::search::{greedy, search_layer, All, Cand, CpuScorer, Scorer, ScratchPool};
use crate::vectors::Vectors;

/// Hands out a scorer whose query is a corpus row (the node being inserted).
pub(crate) trait ScorerSource: Sync {
    /// The scorer type.
    type Scorer<'s>: Scorer
    where
        Self: 's;
    /// A scorer for row `row` as the query.
    fn for_row(&self, row: u32) -> Result<Self::Scorer<'_>>;
}

impl ScorerSource for Vectors {
    type Scorer<'s> = CpuScorer<'s>;

    fn for_row(&self, row: u32) -> Result<CpuScorer<'_>> {
        Ok(CpuScorer {
            vectors: self,
            query: self.row_query(row),
        })
    }
}

/// A finished graph.
#[derive(Debug, Clone)]
pub(crate) struct Graph {
    pub(crate) links: Links<u32>,
    pub(crate) entry: u32,
    pub(crate) max_level: usize,
}

/// How the nodes are inserted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Sequential,
    Parallel,
}

struct Builder<'v, Src> {
    vectors: &'v Vectors,
    source: &'v Src,
    params: HnswParams,
    links: Links<AtomicU32>,
    /// One lock per node: serialises writers of that node's lists.
    locks: Vec<Mutex<()>>,
    /// Entry point and top layer. Held for a whole insertion when the new
    /// node becomes the top, so no other insertion starts from a stale top.
    top: Mutex<(u32, usize)>,
    pool: ScratchPool,
}

/// Rows between two calls of a build's progress callback: often enough for a
/// progress bar to move, rarely enough that the call costs nothing next to
/// the insertions.
pub(crate) const PROGRESS_EVERY: usize = 1024;

/// A build's progress callback: called with the rows inserted so far.
pub(crate) type Progress<'p> = Option<&'p (dyn Fn(usize) + Sync)>;

/// Builds the graph over `vectors`, scoring layer searches through `source`,
/// calling `progress` (if any) with the rows inserted so far every
/// [`PROGRESS_EVERY`] rows and once at the end. The callback only observes:
/// the graph does not depend on it.
pub(crate) fn build<Src: ScorerSource>(
    vectors: &Vectors,
    source: &Src,
    params: HnswParams,
    mode: Mode,
    progress: Progress<'_>,
) -> Result<Graph> {
    let n = vectors.len();
    let started = Instant::now();
    let levels = draw_levels(n, &params);
    let layout = Layout::new(params.m, params.m0(), levels);
    let top = (0u32, layout.level(0));
    let b = Builder {
        vectors,
        source,
        params,
        links: Links::empty(layout),
        locks: (0..n).map(|_| Mutex::new(())).collect(),
        top: Mutex::new(top),
        pool: ScratchPool::new(n),
    };
    match mode {
        Mode::Sequential => {
            for i in 1..n {
                b.insert(i as u32)?;
                // Row 0 is the entry point: i + 1 rows are in the graph.
                if let Some(report) = progress.filter(|_| (i + 1) % PROGRESS_EVERY == 0) {
                    report(i + 1);
                }
            }
        }
        Mode::Parallel => b.insert_parallel(progress)?,
    }
    if let Some(report) = progress {
        report(n);
    }
    let (entry, max_level) = *lock(&b.top);
    let graph = Graph {
        links: b.links.freeze(),
        entry,
        max_level,
    };
    tracing::info!(
        n,
        dim = vectors.dim(),
        m = params.m,
        ef_construction = params.ef_construction,
        ?mode,
        max_level,
        secs = started.elapsed().as_secs_f64(),
        "hnsw graph built"
    );
    Ok(graph)
}

/// The neighbour-selection heuristic (Algorithm 4): walking candidates
/// best first, keep one only if it is closer to the base node than to
/// every neighbour already kept, so links spread across directions
/// instead of crowding into one cluster. `cands` is sorted best first by
/// score against the base node.
pub(crate) fn select_neighbours(vectors: &Vectors, cands: &[Cand], m: usize, out: &mut Vec<Cand>) {
    out.clear();
    if cands.len() < m {
        out.extend_from_slice(cands);
        return;
    }
    for &e in cands {
        if out.len() >= m {
            break;
        }
        let to_base = e.score();
        let diverse = out.iter().all(|r| {
            // Kept on ties and NaN, as in hnswlib (`dist(e, r) < dist(e, q)` rejects).
            vectors.pair(e.id(), r.id()).partial_cmp(&to_base) != Some(std::cmp::Ordering::Greater)
        });
        if diverse {
            out.push(e);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding a node lock leaves at worst a shorter list, which
    // is still a valid list; the build itself reports the panic.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl<Src: ScorerSource> Builder<'_, Src> {
    fn insert_parallel(&self, progress: Progress<'_>) -> Result<()> {
        let n = self.vectors.len();
        let next = AtomicUsize::new(1);
        // Rows in the graph, the entry point (row 0) included.
        let done = AtomicUsize::new(1);
        let failure: Mutex<Option<HnswError>> = Mutex::new(None);
        let workers = rayon::current_num_threads().max(1);
        rayon::scope(|s| {
            for _ in 0..workers {
                s.spawn(|_| loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        break;
                    }
                    if let Err(e) = self.insert(i as u32) {
                        lock(&failure).get_or_insert(e);
                        // Make the other workers stop at their next pull.
                        next.store(n, Ordering::Relaxed);
                        break;
                    }
                    if let Some(report) = progress {
                        let rows = done.fetch_add(1, Ordering::Relaxed) + 1;
                        if rows % PROGRESS_EVERY == 0 {
                            report(rows);
                        }
                    }
                });
            }
        });
        match failure.into_inner().unwrap_or_else(|p| p.into_inner()) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn insert(&self, q: u32) -> Result<()> {
        let level = self.links.layout.level(q);
        let top = lock(&self.top);
        let (entry, max_level) = *top;
        let top_guard = if level > max_level {
            Some(top)
        } else {
            drop(top);
            None
        };

        let mut scorer = self.source.for_row(q)?;
        let mut sc = self.pool.take();
        let mut cur = Cand::new(entry, scorer.score_one(entry)?);
        if max_level > level {
            cur = greedy(
                &self.links,
                &mut scorer,
                &mut sc,
                cur,
                max_level,
                level + 1,
                &All,
            )?;
        }
        let mut selected = Vec::with_capacity(self.params.m);
        let mut ids = Vec::with_capacity(self.params.m0() + 1);
        for lc in (0..=level.min(max_level)).rev() {
            search_layer(
                &self.links,
                &mut scorer,
                &mut sc,
                cur,
                self.params.ef_construction,
                lc,
                &All,
            )?;
            sc.sort_results();
            self.select(&sc.sorted, self.params.m, &mut selected);
            ids.clear();
            ids.extend(selected.iter().map(|c| c.id()));
            {
                let _g = lock(&self.locks[q as usize]);
                self.links.set(q, lc, &ids);
            }
            for &e in &ids {
                self.connect(e, q, lc);
            }
            // The best node found is the next layer's entry (as in hnswlib).
            if let Some(&best) = sc.sorted.first() {
                cur = best;
            }
        }
        self.pool.put(sc);
        if let Some(mut top) = top_guard {
            *top = (q, level);
        }
        Ok(())
    }

    fn select(&self, cands: &[Cand], m: usize, out: &mut Vec<Cand>) {
        select_neighbours(self.vectors, cands, m, out);
    }

    /// Adds the link `e → q` on `level`, re-pruning `e`'s list with the
    /// heuristic when it is full.
    fn connect(&self, e: u32, q: u32, level: usize) {
        let cap = self.links.layout.cap(level);
        let _g = lock(&self.locks[e as usize]);
        let mut ids = Vec::with_capacity(cap + 1);
        self.links.neighbours_into(e, level, &mut ids);
        if ids.contains(&q) {
            return;
        }
        if ids.len() < cap {
            ids.push(q);
            self.links.set(e, level, &ids);
            return;
        }
        let base = self.vectors.row_query(e);
        let mut cands: Vec<Cand> = ids
            .iter()
            .chain(std::iter::once(&q))
            .map(|&x| Cand::new(x, self.vectors.score(base, x)))
            .collect();
        cands.sort_unstable_by_key(|c| std::cmp::Reverse(c.key));
        let mut kept = Vec::with_capacity(cap);
        self.select(&cands, cap, &mut kept);
        ids.clear();
        ids.extend(kept.iter().map(|c| c.id()));
        self.links.set(e, level, &ids);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use topk_core::{Metric, Retriever};

    use crate::{Hnsw, HnswParams};

    fn rows(n: usize, dim: usize) -> Vec<f32> {
        (0..n * dim)
            .map(|i| ((i as f32) * 0.618).sin() + ((i / dim) as f32 * 0.1).cos())
            .collect()
    }

    #[test]
    fn progress_observes_a_sequential_build_without_changing_it() {
        let (n, dim) = (2 * super::PROGRESS_EVERY + 7, 3);
        let params = HnswParams {
            parallel: false,
            ..HnswParams::default()
        };
        let plain = Hnsw::from_rowmajor(rows(n, dim), dim, Metric::L2, params).unwrap();
        let seen = Mutex::new(Vec::new());
        let report = |r: usize| seen.lock().unwrap().push(r);
        let watched =
            Hnsw::from_rowmajor_with_progress(rows(n, dim), dim, Metric::L2, params, &report)
                .unwrap();
        assert_eq!(plain.to_bytes(), watched.to_bytes());
        let every = super::PROGRESS_EVERY;
        assert_eq!(seen.into_inner().unwrap(), vec![every, 2 * every, n]);
    }

    #[test]
    fn progress_of_a_parallel_build_ends_at_every_row() {
        let (n, dim) = (super::PROGRESS_EVERY + 300, 3);
        let params = HnswParams {
            parallel: true,
            ..HnswParams::default()
        };
        let seen = Mutex::new(Vec::new());
        let report = |r: usize| seen.lock().unwrap().push(r);
        let index =
            Hnsw::from_rowmajor_with_progress(rows(n, dim), dim, Metric::L2, params, &report)
                .unwrap();
        assert_eq!(index.len(), n);
        let seen = seen.into_inner().unwrap();
        assert_eq!(seen.last(), Some(&n));
        assert!(seen.contains(&super::PROGRESS_EVERY), "{seen:?}");
    }
}

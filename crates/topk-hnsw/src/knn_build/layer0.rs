//! Layer 0 of the kNN build (steps 2 and 3 of the parent module's docs): the
//! exact candidates from the source, checked and pruned with the heuristic,
//! then the reverse links. The upper layers reuse the checks and the reverse
//! links.

use std::borrow::Cow;
use std::cmp::Reverse;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use rayon::prelude::*;
use topk_core::Neighbor;

use super::{candidate_count, KnnSource, Nodes, EARLY_NODES};
use crate::build::{select_neighbours, Progress};
use crate::error::{HnswError, Result};
use crate::search::Cand;
use crate::vectors::Vectors;

/// The final lists (corpus ids, best first) of one layer's nodes (layer 0:
/// all of them), capacity `cap`, from their exact top-`c` among all the
/// layer's other nodes, `c` from [`candidate_count`].
pub(super) fn layer_lists(
    vectors: &Vectors,
    source: &dyn KnnSource,
    nodes: Nodes<'_>,
    cap: usize,
    want: usize,
    batch_rows: usize,
    progress: Progress<'_>,
) -> Result<Vec<Vec<u32>>> {
    let count = nodes.len();
    if source.rows() != count {
        return Err(HnswError::KnnSource {
            what: format!(
                "a layer source holds {} rows, the layer has {count}",
                source.rows()
            ),
        });
    }
    let c = candidate_count(want, cap).min(count.saturating_sub(1));
    if c == 0 {
        return Ok(vec![Vec::new(); count]);
    }
    if count <= cap {
        // Every node fits in every list: link each to all the others, best
        // first (the insertion build does the same for its first nodes).
        return Ok((0..count)
            .into_par_iter()
            .map(|local| {
                let me = nodes.global(local);
                let q = vectors.row_query(me);
                let mut all: Vec<Cand> = (0..count)
                    .filter(|&j| j != local)
                    .map(|j| Cand::new(nodes.global(j), vectors.score(q, nodes.global(j))))
                    .collect();
                all.sort_unstable_by_key(|c| Reverse(c.key));
                all.iter().map(|c| c.id()).collect()
            })
            .collect());
    }
    let k = (c + 1).min(count);
    let early = if matches!(nodes, Nodes::All(_)) {
        EARLY_NODES
    } else {
        0
    };
    let dim = vectors.dim();
    let mut forward: Vec<Vec<Cand>> = vec![Vec::new(); count];
    let mut pending: Option<(usize, Vec<Vec<Neighbor>>)> = None;
    let mut done = 0usize;
    let batches = (0..count).step_by(batch_rows);
    // One step past the last batch prunes its answers.
    for start in batches.map(Some).chain(std::iter::once(None)) {
        let fetch = || -> Result<Option<(usize, Vec<Vec<Neighbor>>)>> {
            let Some(start) = start else {
                return Ok(None);
            };
            let end = (start + batch_rows).min(count);
            let queries: Cow<'_, [f32]> = match nodes {
                Nodes::All(_) => Cow::Borrowed(&vectors.data()[start * dim..end * dim]),
                Nodes::Some(ids) => Cow::Owned(
                    ids[start..end]
                        .iter()
                        .flat_map(|&i| vectors.row(i).iter().copied())
                        .collect(),
                ),
            };
            let res = source.knn_batch(&queries, k)?;
            Ok(Some((start, res)))
        };
        let prune =
            |batch: Option<(usize, Vec<Vec<Neighbor>>)>, out: &mut [Vec<Cand>]| -> Result<()> {
                let Some((start, res)) = batch else {
                    return Ok(());
                };
                res.par_iter()
                    .zip(out[start..start + res.len()].par_iter_mut())
                    .enumerate()
                    .try_for_each_init(Vec::new, |cands, (j, (hits, kept))| {
                        let local = start + j;
                        candidates(vectors, nodes, local, hits, k, c, cands)?;
                        if local < early {
                            with_predecessors(vectors, nodes, local, c, cands);
                        }
                        select_neighbours(vectors, cands, cap, kept);
                        Ok(())
                    })
            };
        let (fetched, pruned) = rayon::join(fetch, || prune(pending.take(), &mut forward));
        pruned?;
        pending = fetched?;
        if let Some((start, res)) = &pending {
            let expected = (start + batch_rows).min(count) - start;
            if res.len() != expected {
                return Err(HnswError::KnnSource {
                    what: format!("{} answers to a batch of {expected} queries", res.len()),
                });
            }
            let tenth = |rows: usize| rows * 10 / count;
            if tenth(done + expected) > tenth(done) {
                tracing::info!(rows = done + expected, of = count, "exact kNN candidates");
            }
            done += expected;
            if let Some(report) = progress {
                report(done);
            }
        }
    }
    Ok(with_reverse_links(vectors, nodes, forward, cap))
}

/// Adds to `cands` (node `local`'s nearest rows, best first) its `c`
/// nearest predecessors `0..local`, dropping duplicates: the far-reaching
/// links an early node gets in an insertion build.
fn with_predecessors(
    vectors: &Vectors,
    nodes: Nodes<'_>,
    local: usize,
    c: usize,
    cands: &mut Vec<Cand>,
) {
    let q = vectors.row_query(nodes.global(local));
    let mut pred: Vec<Cand> = (0..local)
        .map(|p| {
            let id = nodes.global(p);
            Cand::new(id, vectors.score(q, id))
        })
        .collect();
    pred.sort_unstable_by_key(|c| Reverse(c.key));
    pred.truncate(c);
    cands.extend(pred);
    // A row in both lists appears twice: keep one, then order best first.
    cands.sort_unstable_by_key(|c| (c.id(), Reverse(c.key)));
    cands.dedup_by_key(|c| c.id());
    cands.sort_unstable_by_key(|c| Reverse(c.key));
}

/// Checks one query's answer and turns it into its candidates: the layer's
/// other nodes, as corpus ids, best first, at most `c`.
pub(super) fn candidates(
    vectors: &Vectors,
    nodes: Nodes<'_>,
    local: usize,
    hits: &[Neighbor],
    k: usize,
    c: usize,
    out: &mut Vec<Cand>,
) -> Result<()> {
    let bad = |what: String| Err(HnswError::KnnSource { what });
    if hits.len() != k {
        return bad(format!(
            "query row {} got {} neighbours, asked for {k}",
            nodes.global(local),
            hits.len()
        ));
    }
    let count = nodes.len();
    let me = nodes.global(local);
    out.clear();
    let mut prev: Option<u64> = None;
    for h in hits {
        if h.index as usize >= count {
            return bad(format!(
                "query row {me} got row {} of a {count}-row source",
                h.index
            ));
        }
        let key = h.key();
        if prev.is_some_and(|p| p <= key) {
            return bad(format!(
                "query row {me}: neighbour {} (score {}) is out of the §3 order",
                h.index, h.score
            ));
        }
        prev = Some(key);
        if h.index as usize != local && out.len() < c {
            out.push(Cand::new(nodes.global(h.index as usize), h.score));
        }
    }
    // The best row's score must be the canonical score of that row here: a
    // source over other rows of the same shape fails this at once.
    if let Some(first) = hits.first() {
        let id = nodes.global(first.index as usize);
        let want = vectors.score(vectors.row_query(me), id);
        if want.to_bits() != first.score.to_bits() {
            return bad(format!(
                "query row {me} vs row {id}: the source scores {}, the canonical score is {want}",
                first.score
            ));
        }
    }
    Ok(())
}

/// Adds `v → u` for every kept `u → v` and re-prunes lists past `cap`.
pub(super) fn with_reverse_links(
    vectors: &Vectors,
    nodes: Nodes<'_>,
    forward: Vec<Vec<Cand>>,
    cap: usize,
) -> Vec<Vec<u32>> {
    let count = nodes.len();
    // In-link lists of every node, in one flat array (CSR): counted, placed,
    // then filled from all threads in any order (sorted afterwards).
    let indeg: Vec<AtomicUsize> = (0..count).map(|_| AtomicUsize::new(0)).collect();
    forward.par_iter().for_each(|kept| {
        for c in kept {
            if let Some(v) = nodes.local(c.id()) {
                indeg[v].fetch_add(1, Ordering::Relaxed);
            }
        }
    });
    let mut offsets = Vec::with_capacity(count + 1);
    let mut total = 0usize;
    offsets.push(0);
    for d in &indeg {
        total += d.load(Ordering::Relaxed);
        offsets.push(total);
    }
    let cursor: Vec<AtomicUsize> = offsets[..count]
        .iter()
        .map(|&o| AtomicUsize::new(o))
        .collect();
    let inlinks: Vec<AtomicU64> = (0..total).map(|_| AtomicU64::new(0)).collect();
    forward.par_iter().enumerate().for_each(|(u, kept)| {
        let from = u64::from(nodes.global(u));
        for c in kept {
            if let Some(v) = nodes.local(c.id()) {
                let at = cursor[v].fetch_add(1, Ordering::Relaxed);
                // Scores are symmetric (vectors.rs), so s(u, v) is v's score for u.
                inlinks[at].store(
                    (from << 32) | u64::from(c.score().to_bits()),
                    Ordering::Relaxed,
                );
            }
        }
    });
    forward
        .into_par_iter()
        .enumerate()
        .map_init(Vec::new, |kept, (v, mut list)| {
            list.extend(inlinks[offsets[v]..offsets[v + 1]].iter().map(|slot| {
                let packed = slot.load(Ordering::Relaxed);
                Cand::new((packed >> 32) as u32, f32::from_bits(packed as u32))
            }));
            // A link present both ways appears twice: keep one (the best key
            // of that id), then order best first.
            list.sort_unstable_by_key(|c| (c.id(), Reverse(c.key)));
            list.dedup_by_key(|c| c.id());
            list.sort_unstable_by_key(|c| Reverse(c.key));
            if list.len() > cap {
                select_neighbours(vectors, &list, cap, kept);
                kept.iter().map(|c| c.id()).collect()
            } else {
                list.iter().map(|c| c.id()).collect()
            }
        })
        .collect()
}

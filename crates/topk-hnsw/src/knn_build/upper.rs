//! The upper layers of the kNN build (step 4 of the parent module's docs)
//! and the long links on layer 0 (step 5): the lifted layer-1 links and the
//! reachability repair from the entry.

use std::cmp::Reverse;
use std::sync::atomic::AtomicU32;

use rayon::prelude::*;

use super::layer0::{candidates, with_reverse_links};
use super::{candidate_count, KnnSource, Nodes, Schedule};
use crate::build::select_neighbours;
use crate::error::{HnswError, Result};
use crate::graph::Links;
use crate::params::HnswParams;
use crate::search::{search_layer, All, Cand, CpuScorer, Scorer, Scratch};
use crate::vectors::Vectors;

/// Passes of [`connect_from_entry`] at most. A pass replaces a link only
/// when the `ef_construction` nearest reachable nodes all have full lists,
/// which the heuristic's short lists make rare.
const MAX_BRIDGE_PASSES: usize = 4;

/// Makes every node of a layer reachable from the entry (step 5 of the
/// module docs); returns the links added.
pub(super) fn connect_from_entry(
    vectors: &Vectors,
    links: &Links<AtomicU32>,
    nodes: Nodes<'_>,
    level: usize,
    entry: u32,
    params: &HnswParams,
) -> Result<usize> {
    let n = vectors.len();
    let cap = links.layout.cap(level);
    let mut reached = vec![false; n];
    let mut stack = Vec::new();
    let mut nbr = Vec::with_capacity(cap);
    let mut mark = |from: u32, reached: &mut [bool]| {
        reached[from as usize] = true;
        stack.push(from);
        while let Some(x) = stack.pop() {
            links.neighbours_into(x, level, &mut nbr);
            for &e in &nbr {
                if !std::mem::replace(&mut reached[e as usize], true) {
                    stack.push(e);
                }
            }
        }
    };
    let mut sc = Scratch::new(n);
    let mut ids = Vec::with_capacity(cap + 1);
    let mut added = 0usize;
    // A pass that replaces no link leaves every node reached; one that does
    // may have cut something off, so the next pass looks again.
    for _ in 0..MAX_BRIDGE_PASSES {
        reached.fill(false);
        mark(entry, &mut reached);
        let mut replaced = false;
        for local in 0..nodes.len() {
            let u = nodes.global(local);
            if reached[u as usize] {
                continue;
            }
            let mut scorer = CpuScorer {
                vectors,
                query: vectors.row_query(u),
            };
            let start = Cand::new(entry, scorer.score_one(entry)?);
            // Only reached nodes are reachable from the entry, so the beam
            // holds reached nodes only.
            search_layer(
                links,
                &mut scorer,
                &mut sc,
                start,
                params.ef_construction,
                level,
                &All,
            )?;
            sc.sort_results();
            let room = sc.sorted.iter().find(|c| {
                links.neighbours_into(c.id(), level, &mut ids);
                ids.len() < cap
            });
            let Some(&r) = room.or(sc.sorted.first()) else {
                continue;
            };
            links.neighbours_into(r.id(), level, &mut ids);
            if ids.len() >= cap {
                // Every candidate is full: the bridge replaces r's last link.
                ids.pop();
                replaced = true;
            }
            ids.push(u);
            links.set(r.id(), level, &ids);
            links.neighbours_into(u, level, &mut ids);
            if ids.len() < cap && !ids.contains(&r.id()) {
                ids.push(r.id());
                links.set(u, level, &ids);
            }
            added += 1;
            mark(u, &mut reached);
        }
        if !replaced {
            break;
        }
    }
    if added > 0 {
        tracing::debug!(level, added, "bridged the parts of a kNN layer");
    }
    Ok(added)
}

/// Writes layer 0, appending to each upper node's list its layer-1 links
/// while there is room.
pub(super) fn lift_upper_links(links: &Links<AtomicU32>, lists: Vec<Vec<u32>>) {
    let cap = links.layout.m0;
    lists
        .into_par_iter()
        .enumerate()
        .for_each_init(Vec::new, |up, (node, mut list)| {
            let node = node as u32;
            if links.layout.level(node) >= 1 {
                links.neighbours_into(node, 1, up);
                for &e in up.iter() {
                    if list.len() >= cap {
                        break;
                    }
                    if !list.contains(&e) {
                        list.push(e);
                    }
                }
            }
            links.set(node, 0, &list);
        });
}

pub(super) fn write_layer(
    links: &Links<AtomicU32>,
    nodes: Nodes<'_>,
    level: usize,
    lists: &[Vec<u32>],
) {
    // Each node's block is written by one task only.
    lists
        .par_iter()
        .enumerate()
        .for_each(|(local, ids)| links.set(nodes.global(local), level, ids));
}

/// Each block of an upper layer's later nodes is this fraction of the
/// nodes before it: the block's nodes search those through a source and
/// score their predecessors inside the block on the host.
const BLOCK_DIVISOR: usize = 8;

/// The final lists (corpus ids, best first) of an upper layer's nodes `ids`
/// (increasing), capacity `cap`: each node takes its exact top-`c` among
/// the nodes *before* it, pruned with the heuristic, and the kept links then
/// get their reverse links as on layer 0. Node `i` thus links as an insertion
/// in id order with an exact beam would; the first nodes, which see only a
/// few predecessors, keep the far-reaching links that make the layer
/// navigable. Later nodes go in blocks of about `1/BLOCK_DIVISOR` of the
/// nodes before them: the block's queries run against a source over those
/// nodes, and the predecessors inside the block are scored on the host.
/// The candidates are exact either way, so the blocks do not change the
/// graph.
pub(super) fn prefix_lists(
    vectors: &Vectors,
    knn: &dyn KnnSource,
    ids: &[u32],
    cap: usize,
    want: usize,
    schedule: Schedule,
) -> Result<Vec<Vec<u32>>> {
    let Schedule {
        batch_rows,
        host_prefix,
    } = schedule;
    let count = ids.len();
    let nodes = Nodes::Some(ids);
    let c = candidate_count(want, cap);
    let gather = |part: &[u32]| -> Vec<f32> {
        part.iter()
            .flat_map(|&i| vectors.row(i).iter().copied())
            .collect()
    };
    // Node `local`'s candidates among the predecessors `from..local`, merged
    // into `cands` (sorted best first), keeping the best `c`.
    let add_scored = |local: usize, from: usize, cands: &mut Vec<Cand>| {
        let q = vectors.row_query(ids[local]);
        cands.extend(
            ids[from..local]
                .iter()
                .map(|&p| Cand::new(p, vectors.score(q, p))),
        );
        cands.sort_unstable_by_key(|c| Reverse(c.key));
        cands.truncate(c);
    };
    let mut forward: Vec<Vec<Cand>> = vec![Vec::new(); count];
    let first = count.min(host_prefix.max(1));
    forward[..first]
        .par_iter_mut()
        .enumerate()
        .for_each_init(Vec::new, |cands, (local, kept)| {
            cands.clear();
            add_scored(local, 0, cands);
            select_neighbours(vectors, cands, cap, kept);
        });
    let mut prefix = first;
    while prefix < count {
        let end = (prefix + (prefix / BLOCK_DIVISOR).max(1)).min(count);
        let k = c.min(prefix);
        let sub = knn.sub_source(gather(&ids[..prefix]), vectors.dim(), vectors.metric())?;
        if sub.rows() != prefix {
            return Err(HnswError::KnnSource {
                what: format!("a source over {prefix} rows holds {}", sub.rows()),
            });
        }
        for start in (prefix..end).step_by(batch_rows) {
            let stop = (start + batch_rows).min(end);
            let res = sub.knn_batch(&gather(&ids[start..stop]), k)?;
            if res.len() != stop - start {
                return Err(HnswError::KnnSource {
                    what: format!(
                        "{} answers to a batch of {} queries",
                        res.len(),
                        stop - start
                    ),
                });
            }
            res.par_iter()
                .zip(forward[start..stop].par_iter_mut())
                .enumerate()
                .try_for_each_init(Vec::new, |cands, (j, (hits, kept))| {
                    let local = start + j;
                    candidates(vectors, nodes, local, hits, k, c, cands)?;
                    add_scored(local, prefix, cands);
                    select_neighbours(vectors, cands, cap, kept);
                    Ok::<(), HnswError>(())
                })?;
        }
        prefix = end;
    }
    Ok(with_reverse_links(vectors, nodes, forward, cap))
}

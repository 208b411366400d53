//! Changing a built index: inserting rows, marking rows deleted, reusing
//! deleted slots, and searching under an allow-list of slots.
//!
//! # Deletion
//!
//! [`Hnsw::mark_deleted`] only marks the slot: its node keeps its links, so
//! walks still pass through it (removing nodes from a proximity graph without
//! repair disconnects it), but it never enters a result.
//!
//! # Insertion and slot reuse
//!
//! [`Hnsw::insert`] takes the most recently deleted slot when there is one,
//! else appends a slot. A new slot's level is the next draw of the index's
//! seeded level stream (the one the build drew its levels from, continued),
//! and the node is linked as the build links one (beam search with
//! `ef_construction` on each of its layers, the diversity heuristic, links
//! both ways with re-pruning). A reused slot keeps its level: levels are
//! drawn independently of the rows, so the old level is as good a draw as a
//! new one, and the node's list storage and the entry point stay valid. Its
//! old links are repaired first, as FreshDiskANN consolidates deletions:
//!
//! 1. for every layer `l` of the slot and every neighbour `e` of its old list
//!    that links back to it, `e`'s list becomes the heuristic's choice among
//!    `e`'s other neighbours and the slot's other old neighbours (the two-hop
//!    paths through the old node are kept as direct links);
//! 2. the slot's lists are cleared, its row replaced, and it is linked like a
//!    new node, with itself excluded from its own walks.
//!
//! A one-directional link `x → slot` from a node that is not in the slot's
//! old lists is not found (the graph keeps no reverse lists; hnswlib's
//! `replace_deleted` has the same limit). It stays a valid link to the new
//! row, is followed like any other, and goes when `x`'s list is next pruned.
//!
//! Everything here is sequential and seeded: the same build and the same
//! sequence of inserts and deletions give the same graph, byte for byte.
//!
//! # Filtered search
//!
//! [`Hnsw::search_filtered`] walks the graph with the filter applied inside
//! the beam search (disallowed and deleted nodes are expanded but never
//! admitted to the beam), and scores the allowed live rows exactly instead
//! when they are at most few that scoring them costs less than the walk
//! would (see [`DEFAULT_FILTER_WALK_COST`]).

use topk_core::{validate, Error, Neighbor};

use crate::build::select_neighbours;
use crate::error::{HnswError, Result};
use crate::filter::SlotFilter;
use crate::graph::Links;
use crate::index::Hnsw;
#[cfg(doc)]
use crate::index::DEFAULT_FILTER_WALK_COST;
use crate::params::{check_ef, draw_level, HnswParams};
use crate::search::{greedy, search_layer, AllBut, Cand, CpuScorer, Scorer, ScratchPool};
use crate::vectors::Vectors;

impl Hnsw {
    /// Inserts `row` and returns its slot: the most recently deleted slot
    /// when one is free, else a new slot `len()`.
    ///
    /// The row is checked by the input rules of `docs/CONTRACTS.md §4`
    /// (dimension, finiteness, the overflow rule); errors name the slot the
    /// row would have taken, and leave the index unchanged.
    pub fn insert(&mut self, row: &[f32]) -> Result<u32> {
        let dim = self.vectors.dim();
        let n = self.vectors.len();
        let slot = match self.free.last() {
            Some(&s) => s,
            None if n >= validate::MAX_ROWS => {
                return Err(Error::TooManyRows {
                    n: n + 1,
                    max: validate::MAX_ROWS,
                }
                .into())
            }
            None => n as u32,
        };
        if row.len() != dim {
            return Err(Error::DimensionMismatch {
                what: format!("row inserted at slot {slot}"),
                expected: dim,
                got: row.len(),
            }
            .into());
        }
        validate::corpus(row, dim).map_err(|e| at_slot(e, slot))?;
        if self.free.pop().is_some() {
            self.reuse(slot, row)?;
            self.deleted.remove(slot);
            self.deleted_count -= 1;
        } else {
            self.append(row)?;
        }
        self.stamp = crate::index::fresh_stamp();
        Ok(slot)
    }

    /// Marks `slot` deleted: it leaves every later result at once and its
    /// slot is reused by a later [`Hnsw::insert`]. Returns whether it was
    /// live (deleting a deleted slot changes nothing).
    pub fn mark_deleted(&mut self, slot: u32) -> Result<bool> {
        self.check_slot(slot)?;
        if self.deleted.contains(slot) {
            return Ok(false);
        }
        self.deleted.insert(slot);
        self.deleted_count += 1;
        self.free.push(slot);
        Ok(true)
    }

    /// Whether `slot` is marked deleted.
    pub fn is_deleted(&self, slot: u32) -> Result<bool> {
        self.check_slot(slot)?;
        Ok(self.deleted.contains(slot))
    }

    /// Rows a search can return: slots not marked deleted.
    pub fn live_len(&self) -> usize {
        self.vectors.len() - self.deleted_count
    }

    /// Deleted slots, in the order [`Hnsw::insert`] reuses them (last first).
    pub fn free_slots(&self) -> &[u32] {
        &self.free
    }

    /// The walk-cost factor `c` that decides when a search scores its
    /// allowed rows exactly: when they number at most `sqrt(c · ef · N)`
    /// (see [`DEFAULT_FILTER_WALK_COST`]).
    pub fn filter_walk_cost(&self) -> f64 {
        self.walk_cost
    }

    /// Sets [`Hnsw::filter_walk_cost`]: `0` walks whenever the walk can
    /// run (something is allowed and `max(ef, K)` is below the slots),
    /// `f64::INFINITY` always scores exactly. Not stored in the
    /// index file.
    pub fn set_filter_walk_cost(&mut self, c: f64) -> Result<()> {
        if c.is_nan() || c < 0.0 {
            return Err(HnswError::InvalidValue {
                name: "filter_walk_cost",
                value: c,
                reason: "must be at least 0 (infinity: always exact)",
            });
        }
        self.walk_cost = c;
        Ok(())
    }

    /// The `min(k, allowed)` best rows among the live slots in `filter`,
    /// searched with the default `ef`, best first.
    pub fn search_filtered(
        &self,
        query: &[f32],
        k: usize,
        filter: &SlotFilter,
    ) -> Result<Vec<Neighbor>> {
        let mut out = Vec::new();
        self.search_filtered_with_ef(query, k, self.params.ef_search, filter, &mut out)?;
        Ok(out)
    }

    /// Writes the `min(k, allowed)` best rows among the live slots in
    /// `filter` into `out`, best first: a walk with beam width `max(ef, k)`
    /// that admits only allowed rows, or the exact answer when the allowed
    /// rows are few enough ([`DEFAULT_FILTER_WALK_COST`]). Slots of `filter`
    /// the index does not have are ignored; an empty filter returns nothing.
    pub fn search_filtered_with_ef(
        &self,
        query: &[f32],
        k: usize,
        ef: usize,
        filter: &SlotFilter,
        out: &mut Vec<Neighbor>,
    ) -> Result<()> {
        validate::query(query, self.vectors.dim())?;
        validate::k(k, self.vectors.len())?;
        check_ef(ef)?;
        self.search_one(query, k, ef, 1, Some(filter), out)
    }

    fn check_slot(&self, slot: u32) -> Result<()> {
        let len = self.vectors.len();
        if slot as usize >= len {
            return Err(HnswError::SlotOutOfRange {
                slot: u64::from(slot),
                len,
            });
        }
        Ok(())
    }

    /// Appends a node for `row` on the next level of the seeded stream.
    fn append(&mut self, row: &[f32]) -> Result<()> {
        let slot = self.vectors.len() as u32;
        let level = draw_level(&mut self.rng, &self.params);
        self.vectors.push(row);
        self.graph.links.push_node(level);
        self.pool.set_len(self.vectors.len());
        let level = usize::from(level);
        let start = (self.graph.entry, self.graph.max_level);
        link_node(
            &mut self.graph.links,
            &self.vectors,
            &self.pool,
            &self.params,
            slot,
            level,
            start,
        )?;
        if level > self.graph.max_level {
            self.graph.entry = slot;
            self.graph.max_level = level;
        }
        Ok(())
    }

    /// Puts `row` into the deleted slot `p`, repairing its old links first
    /// (see the module docs).
    fn reuse(&mut self, p: u32, row: &[f32]) -> Result<()> {
        let links = &mut self.graph.links;
        let level = links.layout.level(p);
        for l in 0..=level {
            let old = links.neighbours(p, l).to_vec();
            for &e in &old {
                if links.neighbours(e, l).contains(&p) {
                    bypass(links, &self.vectors, e, p, &old, l);
                }
            }
        }
        // A walk for the new row starts at the entry, or, when the slot is
        // the entry, at its highest old neighbour (its level stays the top).
        let start = if self.graph.entry != p {
            Some((self.graph.entry, self.graph.max_level))
        } else {
            (0..=level)
                .rev()
                .find_map(|l| links.neighbours(p, l).first().map(|&s| (s, l)))
        };
        for l in 0..=level {
            links.set(p, l, &[]);
        }
        self.vectors.replace(p, row);
        match start {
            Some(start) => link_node(
                links,
                &self.vectors,
                &self.pool,
                &self.params,
                p,
                level,
                start,
            ),
            // A one-node index: nothing to link to.
            None => Ok(()),
        }
    }
}

/// Re-chooses `e`'s list on `level` without `p`, from `e`'s other neighbours
/// and `p`'s other old neighbours `p_old`.
fn bypass(links: &mut Links<u32>, vectors: &Vectors, e: u32, p: u32, p_old: &[u32], level: usize) {
    let mut ids: Vec<u32> = links
        .neighbours(e, level)
        .iter()
        .copied()
        .filter(|&x| x != p)
        .collect();
    for &x in p_old {
        if x != e && !ids.contains(&x) {
            ids.push(x);
        }
    }
    let base = vectors.row_query(e);
    let mut cands: Vec<Cand> = ids
        .iter()
        .map(|&x| Cand::new(x, vectors.score(base, x)))
        .collect();
    cands.sort_unstable_by_key(|c| std::cmp::Reverse(c.key));
    let mut kept = Vec::with_capacity(links.layout.cap(level));
    select_neighbours(vectors, &cands, links.layout.cap(level), &mut kept);
    ids.clear();
    ids.extend(kept.iter().map(|c| c.id()));
    links.set(e, level, &ids);
}

/// Links node `q` (row already in `vectors`, lists empty) on layers
/// `0..=level`, walking from `start = (node, its top layer to search)`, as
/// the build inserts a node; `q` itself is never its own neighbour.
fn link_node(
    links: &mut Links<u32>,
    vectors: &Vectors,
    pool: &ScratchPool,
    params: &HnswParams,
    q: u32,
    level: usize,
    start: (u32, usize),
) -> Result<()> {
    let (s, top) = start;
    let not_q = AllBut(q);
    let mut scorer = CpuScorer {
        vectors,
        query: vectors.row_query(q),
    };
    let mut sc = pool.take();
    let mut cur = Cand::new(s, scorer.score_one(s)?);
    if top > level {
        cur = greedy(links, &mut scorer, &mut sc, cur, top, level + 1, &not_q)?;
    }
    let mut selected = Vec::with_capacity(params.m);
    let mut ids = Vec::with_capacity(params.m0() + 1);
    for lc in (0..=level.min(top)).rev() {
        search_layer(
            links,
            &mut scorer,
            &mut sc,
            cur,
            params.ef_construction,
            lc,
            &not_q,
        )?;
        sc.sort_results();
        select_neighbours(vectors, &sc.sorted, params.m, &mut selected);
        ids.clear();
        ids.extend(selected.iter().map(|c| c.id()));
        links.set(q, lc, &ids);
        for &e in &ids {
            connect(links, vectors, e, q, lc);
        }
        if let Some(&best) = sc.sorted.first() {
            cur = best;
        }
    }
    pool.put(sc);
    Ok(())
}

/// Adds the link `e → q` on `level`, re-pruning `e`'s list with the
/// heuristic when it is full (the build's rule).
fn connect(links: &mut Links<u32>, vectors: &Vectors, e: u32, q: u32, level: usize) {
    let cap = links.layout.cap(level);
    let current = links.neighbours(e, level);
    if current.contains(&q) {
        return;
    }
    let mut ids = current.to_vec();
    if ids.len() < cap {
        ids.push(q);
        links.set(e, level, &ids);
        return;
    }
    let base = vectors.row_query(e);
    let mut cands: Vec<Cand> = ids
        .iter()
        .chain(std::iter::once(&q))
        .map(|&x| Cand::new(x, vectors.score(base, x)))
        .collect();
    cands.sort_unstable_by_key(|c| std::cmp::Reverse(c.key));
    let mut kept = Vec::with_capacity(cap);
    select_neighbours(vectors, &cands, cap, &mut kept);
    ids.clear();
    ids.extend(kept.iter().map(|c| c.id()));
    links.set(e, level, &ids);
}

/// Names the slot an inserted row would take in its input error
/// (`validate::corpus` saw it as row 0 of a one-row corpus).
fn at_slot(e: Error, slot: u32) -> HnswError {
    e.at_row(slot as usize).into()
}

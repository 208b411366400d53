//! The `hnsw` backend of [`Index`] (docs/CONTRACTS.md §10): a topk-hnsw graph
//! kept beside the stored rows and changed with them.
//!
//! **Slots.** The graph numbers its nodes by slot (`u32`), independently of
//! the Index's stored rows: [`HnswGraph`] maps each slot to its id and each
//! live id to its slot. Compaction moves the stored rows and never touches the
//! graph, so it needs no remapping.
//!
//! **Changes.** `add` inserts each new row into the graph (reusing the most
//! recently deleted slot when one is free); `remove` marks the id's slot
//! deleted (never returned, still walked through); `upsert` of a present id
//! marks its slot deleted and inserts the new vector, which takes that same
//! slot back (topk-hnsw re-links a reused slot around its old neighbours), so
//! the id keeps its slot. The graph never shrinks: it has as many slots as the
//! index ever had live rows at once.
//!
//! **Storage.** The graph holds its own copy of the rows (topk-hnsw owns the
//! vectors it walks), and deleted slots keep their vector for navigation; an
//! `hnsw` index therefore holds the live rows twice in memory and in its file.
//! The graph section of a file is written and read whole (the rows are
//! streamed block by block; the graph is not), so saving or opening needs
//! room for one more copy of the graph for a moment.
//!
//! **Search.** A result's score is the canonical score of the stored vector
//! (§2) and results are in the §3 order (`cmp_hit`, smaller id first on equal
//! scores). When the allowed rows (the live rows, or the live rows a filter
//! allows) are few, `A ≤ sqrt(c · max(ef, K) · S)` with `S` graph slots and
//! `c` = [`topk_hnsw::DEFAULT_FILTER_WALK_COST`], or when `max(ef, K) ≥ S`,
//! the search is the `cpu` backend's exact search over them: the same bytes
//! as every exact backend. Otherwise the graph is walked with the filter
//! applied inside the beam, and returns `min(K, A)` hits.
//!
//! **Failure.** A graph that cannot be built or changed (only the slot limit
//! of 2^32 − 1 rows can cause it once the rows passed the checks) is dropped
//! with an error in the log; the index then answers exactly and builds a new
//! graph at its next change.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use ndarray::ArrayView2;
use rayon::prelude::*;
use topk_core::{cmp_hit, Hit, Neighbor, Retriever};
use topk_hnsw::{Hnsw, HnswError, SlotFilter};

use crate::error::IndexError;
use crate::filter::{Filter, FilterSpec};
use crate::index::{IdMap, Index};
use crate::options::IndexBackend;
use crate::search::query_values;

/// The id a deleted slot carries in an index file's graph section.
pub(crate) const FREE_SLOT: u64 = u64::MAX;

/// A callback told the number of rows inserted so far while an `hnsw` graph
/// is built (every 1,024 rows and once at the end), from the building
/// threads. Set it with [`crate::IndexOptions::progress`].
#[derive(Clone)]
pub struct ProgressHook(Arc<dyn Fn(usize) + Send + Sync>);

impl ProgressHook {
    /// A hook calling `f` with the rows inserted so far.
    pub fn new(f: impl Fn(usize) + Send + Sync + 'static) -> Self {
        ProgressHook(Arc::new(f))
    }

    /// Reports `rows` inserted so far.
    pub fn report(&self, rows: usize) {
        (self.0)(rows);
    }
}

impl fmt::Debug for ProgressHook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ProgressHook")
    }
}

/// The graph of an `hnsw` index and the ids of its slots.
#[derive(Debug, Clone)]
pub(crate) struct HnswGraph {
    pub(crate) hnsw: Hnsw,
    /// The id of each slot; [`FREE_SLOT`] for a deleted one.
    pub(crate) slot_ids: Vec<u64>,
    /// The slot of each live id.
    pub(crate) slot_of: IdMap<u32>,
}

impl HnswGraph {
    /// Records that `slot` now holds `id`.
    fn place(&mut self, slot: u32, id: u64) {
        let s = slot as usize;
        if s == self.slot_ids.len() {
            self.slot_ids.push(id);
        } else if let Some(entry) = self.slot_ids.get_mut(s) {
            *entry = id;
        }
        self.slot_of.insert(id, slot);
    }

    /// The slots of the live ids `filter` allows.
    fn slots(&self, filter: &Filter) -> SlotFilter {
        filter
            .ids()
            .iter()
            .filter_map(|id| self.slot_of.get(id).copied())
            .collect()
    }
}

/// Checks an exact-switch factor as [`Hnsw::set_filter_walk_cost`] does.
pub(crate) fn check_walk_cost(c: f64) -> Result<(), IndexError> {
    if c.is_nan() || c < 0.0 {
        return Err(HnswError::InvalidValue {
            name: "filter_walk_cost",
            value: c,
            reason: "must be at least 0 (infinity: always exact)",
        }
        .into());
    }
    Ok(())
}

/// How one search of the graph runs.
enum Plan {
    /// Nothing is allowed.
    Empty,
    /// The exact search of the `cpu` backend.
    Exact,
    /// A walk of the graph, restricted to these slots when filtered.
    Walk(Option<SlotFilter>),
}

impl Index {
    /// The beam width of `hnsw` searches (`IndexOptions.hnsw.ef_search`;
    /// values below K are raised to K). Exact backends ignore it.
    pub fn ef(&self) -> usize {
        self.options.hnsw.ef_search
    }

    /// Sets the beam width of `hnsw` searches; 0 is an error naming it.
    pub fn set_ef(&mut self, ef: usize) -> Result<(), IndexError> {
        let params = topk_hnsw::HnswParams {
            ef_search: ef,
            ..self.options.hnsw
        };
        params.validate()?;
        self.options.hnsw = params;
        if let Some(g) = &mut self.graph {
            g.hnsw.set_ef(ef)?;
        }
        Ok(())
    }

    /// Sets the `hnsw` backend's exact-switch factor `c`: a search allowing
    /// at most `sqrt(c · max(ef, K) · slots)` rows is exact. `0` always
    /// walks (unless nothing is allowed), `f64::INFINITY` always scores
    /// exactly; a negative or NaN `c` is an error naming it.
    pub fn set_filter_walk_cost(&mut self, c: f64) -> Result<(), IndexError> {
        if let Some(g) = &mut self.graph {
            g.hnsw.set_filter_walk_cost(c)?;
        } else {
            check_walk_cost(c)?;
        }
        self.options.filter_walk_cost = Some(c);
        Ok(())
    }

    /// Whether this index holds an HNSW graph (an `hnsw` index that has
    /// held rows; the graph stays when every row is removed).
    pub fn has_graph(&self) -> bool {
        self.graph.is_some()
    }

    /// Builds the graph of an `hnsw` index over the live rows when it has
    /// none, and drops the graph of an index on another backend.
    pub(crate) fn sync_graph(&mut self) {
        if self.backend != IndexBackend::Hnsw {
            self.graph = None;
        } else if self.graph.is_none() && !self.is_empty() {
            if let Err(e) = self.build_graph() {
                tracing::error!(error = %e, "the hnsw graph could not be built; searches are exact");
            }
        }
    }

    /// Builds a graph over every live row with `IndexOptions.hnsw`, reporting
    /// to `IndexOptions.progress` (or to the log at each tenth without one).
    pub(crate) fn build_graph(&mut self) -> Result<(), IndexError> {
        self.graph = None;
        let live: Vec<usize> = (0..self.ids.len()).filter(|&r| self.is_live(r)).collect();
        if live.is_empty() {
            return Ok(());
        }
        let mut data = Vec::with_capacity(live.len() * self.dim);
        for &r in &live {
            data.extend_from_slice(&self.row(r));
        }
        let n = live.len();
        let started = Instant::now();
        tracing::info!(rows = n, params = ?self.options.hnsw, "building the hnsw graph");
        let tenths = AtomicUsize::new(0);
        let hook = self.options.progress.clone();
        let report = |rows: usize| match &hook {
            Some(h) => h.report(rows),
            None => {
                let tenth = rows * 10 / n;
                if tenth > tenths.fetch_max(tenth, Ordering::Relaxed) && tenth < 10 {
                    tracing::info!(rows, of = n, "building the hnsw graph");
                }
            }
        };
        let mut hnsw = Hnsw::from_rowmajor_with_progress(
            data,
            self.dim,
            self.metric,
            self.options.hnsw,
            &report,
        )?;
        if let Some(c) = self.options.filter_walk_cost {
            hnsw.set_filter_walk_cost(c)?;
        }
        let slot_ids: Vec<u64> = live.iter().map(|&r| self.ids[r]).collect();
        let slot_of = slot_ids
            .iter()
            .enumerate()
            .map(|(s, &id)| (id, s as u32))
            .collect();
        tracing::info!(
            rows = n,
            s = started.elapsed().as_secs_f64(),
            "hnsw graph built"
        );
        self.graph = Some(Box::new(HnswGraph {
            hnsw,
            slot_ids,
            slot_of,
        }));
        Ok(())
    }

    /// Puts the stored rows `start..` (just appended, live) into the graph.
    pub(crate) fn graph_appended(&mut self, start: usize) {
        if self.backend != IndexBackend::Hnsw {
            return;
        }
        let Some(mut g) = self.graph.take() else {
            self.sync_graph();
            return;
        };
        for r in start..self.ids.len() {
            match g.hnsw.insert(&self.row(r)) {
                Ok(slot) => g.place(slot, self.ids[r]),
                Err(e) => return self.graph_failed(&e),
            }
        }
        self.graph = Some(g);
    }

    /// Replaces the graph's vector of the live id `id` by `row`.
    pub(crate) fn graph_replaced(&mut self, id: u64, row: &[f32]) {
        let Some(g) = &mut self.graph else { return };
        let Some(&slot) = g.slot_of.get(&id) else {
            return;
        };
        let changed = g.hnsw.mark_deleted(slot).and_then(|_| g.hnsw.insert(row));
        match changed {
            Ok(new) => {
                if new != slot {
                    if let Some(entry) = g.slot_ids.get_mut(slot as usize) {
                        *entry = FREE_SLOT;
                    }
                }
                g.place(new, id);
            }
            Err(e) => self.graph_failed(&e),
        }
    }

    /// Takes the id `id` (just removed) out of the graph's results.
    pub(crate) fn graph_removed(&mut self, id: u64) {
        let Some(g) = &mut self.graph else { return };
        let Some(slot) = g.slot_of.remove(&id) else {
            return;
        };
        if let Some(entry) = g.slot_ids.get_mut(slot as usize) {
            *entry = FREE_SLOT;
        }
        if let Err(e) = g.hnsw.mark_deleted(slot) {
            self.graph_failed(&e);
        }
    }

    fn graph_failed(&mut self, e: &HnswError) {
        tracing::error!(error = %e, "the hnsw graph could not follow a change and is dropped; searches are exact until the next change rebuilds it");
        self.graph = None;
    }

    /// How a search of `k` hits under `filter` runs on this index's graph.
    fn plan(&self, g: &HnswGraph, k: usize, filter: Option<&Filter>) -> Plan {
        let (allowed, slots) = match filter {
            None => (self.len(), None),
            Some(f) => {
                let slots = g.slots(f);
                (slots.count(), Some(slots))
            }
        };
        if allowed == 0 {
            return Plan::Empty;
        }
        // The rule of Hnsw's own switch (docs/CONTRACTS.md §9), decided here
        // so that the exact answer is the cpu backend's, ties by id included.
        let n = g.hnsw.len();
        let ef = self.ef().max(k);
        let c = g.hnsw.filter_walk_cost();
        let (a, e, nodes) = (allowed as f64, ef as f64, n as f64);
        let switches = allowed < n || c == f64::INFINITY;
        if ef >= n || (switches && a * a <= c * e * nodes) {
            return Plan::Exact;
        }
        Plan::Walk(slots)
    }

    /// An `hnsw` search of a checked query with `k ≥ 1`.
    pub(crate) fn graph_search(
        &self,
        query: &[f32],
        k: usize,
        filter: Option<&Filter>,
    ) -> Vec<Hit> {
        let Some(g) = &self.graph else {
            return self.exact_search(query, k, filter);
        };
        let plan = self.plan(g, k, filter);
        self.run_plan(g, query, k, filter, &plan)
    }

    fn run_plan(
        &self,
        g: &HnswGraph,
        query: &[f32],
        k: usize,
        filter: Option<&Filter>,
        plan: &Plan,
    ) -> Vec<Hit> {
        let mut out: Vec<Neighbor> = Vec::new();
        let walked = match plan {
            Plan::Empty => return Vec::new(),
            Plan::Exact => return self.exact_search(query, k, filter),
            Plan::Walk(None) => g.hnsw.search_with_ef(query, k, self.ef(), &mut out),
            Plan::Walk(Some(slots)) => {
                g.hnsw
                    .search_filtered_with_ef(query, k, self.ef(), slots, &mut out)
            }
        };
        if let Err(e) = walked {
            // The query and k were checked against the same dimension; a
            // failure here is a bug, answered exactly rather than wrongly.
            tracing::error!(error = %e, "hnsw search failed; answering exactly");
            return self.exact_search(query, k, filter);
        }
        let mut hits: Vec<Hit> = out
            .iter()
            .filter_map(|nb| {
                g.slot_ids
                    .get(nb.index as usize)
                    .map(|&id| Hit::new(id, nb.score))
            })
            .collect();
        hits.sort_unstable_by(cmp_hit);
        hits
    }

    /// An `hnsw` batch search of checked queries with `k ≥ 1`; a shared
    /// filter is resolved to slots once.
    pub(crate) fn graph_search_batch(
        &self,
        queries: ArrayView2<'_, f32>,
        k: usize,
        filter: FilterSpec<'_>,
    ) -> Vec<Vec<Hit>> {
        let shared = match (&self.graph, filter) {
            (Some(g), FilterSpec::Shared(f)) => Some((g, self.plan(g, k, Some(f)))),
            _ => None,
        };
        (0..queries.nrows())
            .into_par_iter()
            .map(|i| {
                let q = query_values(queries.row(i));
                match &shared {
                    Some((g, plan)) => self.run_plan(g, &q, k, filter.of(i), plan),
                    None => self.graph_search(&q, k, filter.of(i)),
                }
            })
            .collect()
    }

    /// The body of an index file's graph section, in two parts: the slot
    /// count `S` (`u64`) and the id of each slot (`S × u64`, [`FREE_SLOT`]
    /// for a deleted one), then the graph as `Hnsw::to_bytes` writes it.
    /// `None` without a graph.
    pub(crate) fn graph_section(&self) -> Option<(Vec<u8>, Vec<u8>)> {
        let g = self.graph.as_ref()?;
        let mut slots = Vec::with_capacity(8 + 8 * g.slot_ids.len());
        slots.extend_from_slice(&(g.slot_ids.len() as u64).to_le_bytes());
        for id in &g.slot_ids {
            slots.extend_from_slice(&id.to_le_bytes());
        }
        Some((slots, g.hnsw.to_bytes()))
    }

    /// Restores the graph from a graph section that starts at byte `at` of
    /// the file, checking it against the rows already read: every live slot
    /// holds a distinct id of the index with the same vector bits, and every
    /// live row has a slot. A failed check names its offset (`Err((offset,
    /// reason))`).
    pub(crate) fn restore_graph(&mut self, body: &[u8], at: u64) -> Result<(), (u64, String)> {
        let u64_at = |o: usize| -> Option<u64> {
            let mut b = [0u8; 8];
            b.copy_from_slice(body.get(o..o + 8)?);
            Some(u64::from_le_bytes(b))
        };
        let slots =
            u64_at(0).ok_or((at, "the graph section is shorter than 8 bytes".to_owned()))?;
        let ids_end = slots
            .checked_mul(8)
            .and_then(|b| b.checked_add(8))
            .filter(|&e| e <= body.len() as u64)
            .ok_or((
                at,
                format!(
                    "{slots} slot ids do not fit the graph section of {} bytes",
                    body.len()
                ),
            ))? as usize;
        let graph_at = at + ids_end as u64;
        let mut hnsw = Hnsw::from_bytes(&body[ids_end..]).map_err(|e| (graph_at, e.to_string()))?;
        if let Some(c) = self.options.filter_walk_cost {
            // The factor was checked when the options were.
            hnsw.set_filter_walk_cost(c)
                .map_err(|e| (graph_at, e.to_string()))?;
        }
        if hnsw.len() as u64 != slots {
            return Err((
                at,
                format!("{slots} slot ids for a graph of {} slots", hnsw.len()),
            ));
        }
        if hnsw.dim() != self.dim || hnsw.metric() != self.metric {
            return Err((
                graph_at,
                format!(
                    "a graph of D = {}, metric {} in an index of D = {}, metric {}",
                    hnsw.dim(),
                    hnsw.metric(),
                    self.dim,
                    self.metric
                ),
            ));
        }
        let d = self.dim;
        let mut slot_ids = Vec::with_capacity(slots as usize);
        let mut slot_of = IdMap::default();
        for s in 0..slots as usize {
            let id_at = at + 8 + 8 * s as u64;
            let id = u64_at(8 + 8 * s).ok_or((id_at, "slot id missing".to_owned()))?;
            let deleted = hnsw
                .is_deleted(s as u32)
                .map_err(|e| (id_at, e.to_string()))?;
            if deleted != (id == FREE_SLOT) {
                return Err((
                    id_at,
                    format!(
                        "slot {s} has id {id} but is {}deleted in the graph",
                        if deleted { "" } else { "not " }
                    ),
                ));
            }
            slot_ids.push(id);
            if deleted {
                continue;
            }
            let Some(&r) = self.rows_of.get(&id) else {
                return Err((
                    id_at,
                    format!("slot {s} holds id {id}, which the index does not"),
                ));
            };
            if slot_of.insert(id, s as u32).is_some() {
                return Err((id_at, format!("id {id} has two slots")));
            }
            let same = hnsw.vectors()[s * d..(s + 1) * d]
                .iter()
                .zip(self.row(r).iter())
                .all(|(a, b)| a.to_bits() == b.to_bits());
            if !same {
                return Err((
                    id_at,
                    format!("the graph's vector of id {id} (slot {s}) differs from the index's"),
                ));
            }
        }
        if slot_of.len() != self.len() {
            return Err((
                at,
                format!(
                    "the graph has {} live slots for {} index rows",
                    slot_of.len(),
                    self.len()
                ),
            ));
        }
        self.options.hnsw = hnsw.params();
        self.graph = Some(Box::new(HnswGraph {
            hnsw,
            slot_ids,
            slot_of,
        }));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::Array2;
    use topk_core::Metric;

    fn rows(n: usize, d: usize, seed: u64) -> Array2<f32> {
        let mut rng = topk_hnsw::SplitMix64::new(seed);
        Array2::from_shape_fn((n, d), |_| {
            (rng.next_u64() >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        })
    }

    #[test]
    fn upsert_keeps_the_slot_and_remove_frees_it() -> Result<(), IndexError> {
        let data = rows(300, 8, 1);
        let mut ix = Index::from_rows(data.view(), Metric::Dot, IndexBackend::Hnsw)?;
        let g = ix.graph.as_ref().map(|g| g.slot_of[&7]);
        ix.upsert(&[7], data.slice(ndarray::s![8..9, ..]))?;
        assert_eq!(ix.graph.as_ref().map(|g| g.slot_of[&7]), g);
        assert_eq!(ix.remove(&[7, 8]), 2);
        let graph = ix
            .graph
            .as_ref()
            .map(|g| (g.slot_of.len(), g.hnsw.live_len()));
        assert_eq!(graph, Some((298, 298)));
        ix.add(&[1000], data.slice(ndarray::s![0..1, ..]))?;
        let graph = ix
            .graph
            .as_ref()
            .map(|g| (g.hnsw.len(), g.slot_ids[g.slot_of[&1000] as usize]));
        assert_eq!(graph, Some((300, 1000)));
        Ok(())
    }

    #[test]
    fn switching_backends_builds_and_drops_the_graph() -> Result<(), IndexError> {
        let data = rows(50, 4, 2);
        let ix = Index::from_rows(data.view(), Metric::L2, IndexBackend::Cpu)?;
        assert!(!ix.has_graph());
        let ix = ix.with_backend(IndexBackend::Hnsw);
        assert!(ix.has_graph());
        let ix = ix.with_backend(IndexBackend::Oracle);
        assert!(!ix.has_graph());
        Ok(())
    }

    #[test]
    fn ef_zero_is_refused_by_name() -> Result<(), IndexError> {
        let mut ix = Index::new(4, Metric::Dot, IndexBackend::Hnsw)?;
        let err = ix.set_ef(0).expect_err("ef = 0");
        assert!(err.to_string().contains("ef"), "{err}");
        ix.set_ef(32)?;
        assert_eq!(ix.ef(), 32);
        Ok(())
    }
}

//! The two walks of HNSW: greedy descent through the upper layers and the
//! `ef`-wide beam search of one layer (Malkov & Yashunin, Algorithms 2 and 5).
//!
//! Both walks expand a node by first collecting its unvisited neighbours and
//! then scoring them in one call to a [`Scorer`] (the CPU scorer loops over
//! the batch with prefetching). Everything that decides the walk (visited
//! set, candidate order, admission to the beam) is decided on canonical
//! scores and the §3 ranking key, so any two scorers that return the same
//! bits walk the same path and build the same graph. The GPU graph search
//! (`kernels/walk.cu`) restates `search_layer` without an unbounded heap
//! and expands the same nodes in the same order (docs/CONTRACTS.md §13).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Mutex;

use topk_core::{rank_key, Neighbor};

use crate::error::Result;
use crate::graph::{Links, Slot};
use crate::vectors::{Query, Vectors};

/// A scored node: its §3 ranking key (which also encodes the id) and the
/// exact score bits, which the key canonicalises for `-0.0` and NaN.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Cand {
    pub(crate) key: u64,
    score_bits: u32,
}

impl Cand {
    #[inline]
    pub(crate) fn new(id: u32, score: f32) -> Self {
        Cand {
            key: rank_key(score, id),
            score_bits: score.to_bits(),
        }
    }

    #[inline]
    pub(crate) fn id(self) -> u32 {
        id_of_key(self.key)
    }

    #[inline]
    pub(crate) fn score(self) -> f32 {
        f32::from_bits(self.score_bits)
    }

    pub(crate) fn neighbor(self) -> Neighbor {
        Neighbor::new(self.id(), self.score())
    }
}

/// The id a §3 ranking key encodes (`rank_key`'s low half).
#[inline]
pub(crate) fn id_of_key(key: u64) -> u32 {
    u32::MAX - key as u32
}

/// Scores a batch of corpus rows against the query of one walk.
pub(crate) trait Scorer {
    /// Writes the score of row `ids[j]` to `out[j]` for every `j`
    /// (`out.len() == ids.len()`).
    fn score_ids(&mut self, ids: &[u32], out: &mut [f32]) -> Result<()>;

    /// The score of one row (the entry point of a walk).
    fn score_one(&mut self, id: u32) -> Result<f32> {
        let mut s = [0.0_f32];
        self.score_ids(&[id], &mut s)?;
        Ok(s[0])
    }
}

/// The CPU scorer: canonical SIMD kernels on host-resident rows.
pub(crate) struct CpuScorer<'a> {
    pub(crate) vectors: &'a Vectors,
    pub(crate) query: Query<'a>,
}

impl Scorer for CpuScorer<'_> {
    #[inline]
    fn score_ids(&mut self, ids: &[u32], out: &mut [f32]) -> Result<()> {
        self.vectors.score_ids(self.query, ids, out);
        Ok(())
    }
}

/// Which nodes a walk may return. Every node navigates (its links are
/// followed); only allowed nodes enter the beam that becomes the result.
pub(crate) trait Allow {
    /// Whether `id` may be returned.
    fn allows(&self, id: u32) -> bool;

    /// The allowed nodes of `0..n`, in increasing order.
    fn slots(&self, n: usize) -> Vec<u32> {
        (0..n as u32).filter(|&i| self.allows(i)).collect()
    }
}

/// Every node is allowed (the unfiltered walk; the check compiles away).
pub(crate) struct All;

impl Allow for All {
    #[inline(always)]
    fn allows(&self, _: u32) -> bool {
        true
    }
}

/// Every node but one (the slot being re-inserted, whose lists are empty).
pub(crate) struct AllBut(pub(crate) u32);

impl Allow for AllBut {
    #[inline]
    fn allows(&self, id: u32) -> bool {
        id != self.0
    }
}

/// Per-walk working memory, reused across searches so that a search
/// allocates nothing once warm.
#[derive(Debug)]
pub(crate) struct Scratch {
    /// `visited[i] == epoch` marks node `i` as seen in the current walk;
    /// bumping the epoch clears the set in O(1).
    visited: Vec<u32>,
    epoch: u32,
    /// Nodes to expand, best first.
    candidates: BinaryHeap<Cand>,
    /// The beam: the best `ef` nodes seen, worst on top.
    pub(crate) results: BinaryHeap<Reverse<Cand>>,
    nbr: Vec<u32>,
    ids: Vec<u32>,
    scores: Vec<f32>,
    /// Results sorted best first, for callers.
    pub(crate) sorted: Vec<Cand>,
}

impl Scratch {
    pub(crate) fn new(n: usize) -> Self {
        Scratch {
            visited: vec![0; n],
            epoch: 0,
            candidates: BinaryHeap::new(),
            results: BinaryHeap::new(),
            nbr: Vec::new(),
            ids: Vec::new(),
            scores: Vec::new(),
            sorted: Vec::new(),
        }
    }

    /// Grows the visited set to cover `n` nodes (after insertions).
    fn cover(&mut self, n: usize) {
        if self.visited.len() < n {
            // Tag 0 is never a live epoch, so the new nodes read as unseen.
            self.visited.resize(n, 0);
        }
    }

    fn new_epoch(&mut self) {
        self.epoch = self.epoch.wrapping_add(1);
        if self.epoch == 0 {
            // After 2^32 walks the tags repeat; clear once and start over.
            self.visited.fill(0);
            self.epoch = 1;
        }
    }

    /// Whether `id` was seen in the current walk.
    pub(crate) fn seen(&self, id: u32) -> bool {
        self.visited[id as usize] == self.epoch
    }

    /// Moves the beam into `sorted`, best first.
    pub(crate) fn sort_results(&mut self) {
        self.sorted.clear();
        self.sorted.extend(self.results.drain().map(|r| r.0));
        self.sorted
            .sort_unstable_by_key(|c| std::cmp::Reverse(c.key));
    }
}

/// A pool of [`Scratch`] so that `&self` searches from many threads each get
/// their own without allocating per query.
#[derive(Debug)]
pub(crate) struct ScratchPool {
    n: usize,
    free: Mutex<Vec<Scratch>>,
}

impl ScratchPool {
    pub(crate) fn new(n: usize) -> Self {
        ScratchPool {
            n,
            free: Mutex::new(Vec::new()),
        }
    }

    pub(crate) fn take(&self) -> Scratch {
        // A poisoned pool only means another search panicked; its scratch
        // holds no invariant a new walk relies on (every walk starts a new epoch).
        let popped = self.free.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let mut s = popped.unwrap_or_else(|| Scratch::new(self.n));
        s.cover(self.n);
        s
    }

    /// Sets the node count that scratches handed out from now on cover.
    pub(crate) fn set_len(&mut self, n: usize) {
        self.n = n;
    }

    pub(crate) fn put(&self, s: Scratch) {
        self.free.lock().unwrap_or_else(|p| p.into_inner()).push(s);
    }
}

/// Greedy descent: on each layer from `top` down to `bottom` (inclusive),
/// move to the best allowed neighbour while it beats the current node.
pub(crate) fn greedy<S: Slot, F: Scorer, A: Allow>(
    links: &Links<S>,
    scorer: &mut F,
    sc: &mut Scratch,
    mut cur: Cand,
    top: usize,
    bottom: usize,
    allow: &A,
) -> Result<Cand> {
    for level in (bottom..=top).rev() {
        loop {
            links.neighbours_into(cur.id(), level, &mut sc.nbr);
            if sc.nbr.is_empty() {
                break;
            }
            sc.scores.clear();
            sc.scores.resize(sc.nbr.len(), 0.0);
            scorer.score_ids(&sc.nbr, &mut sc.scores)?;
            let best = sc
                .nbr
                .iter()
                .zip(&sc.scores)
                .filter(|(&id, _)| allow.allows(id))
                .map(|(&id, &s)| Cand::new(id, s))
                .max_by_key(|c| c.key);
            match best {
                Some(b) if b.key > cur.key => cur = b,
                _ => break,
            }
        }
    }
    Ok(cur)
}

/// Beam search of one layer from `start` with width `ef`; leaves the beam
/// (the best `ef` allowed nodes reached) in `sc.results`.
///
/// Disallowed nodes are scored and expanded like any other (they keep the
/// graph navigable) but never enter the beam; while the beam holds fewer
/// than `ef` nodes every reached node is expanded, so a selective `allow`
/// widens the walk until it has found `ef` allowed nodes or run out of
/// graph (hnswlib's filtered search works the same way).
pub(crate) fn search_layer<S: Slot, F: Scorer, A: Allow>(
    links: &Links<S>,
    scorer: &mut F,
    sc: &mut Scratch,
    start: Cand,
    ef: usize,
    level: usize,
    allow: &A,
) -> Result<()> {
    search_layer_wide(links, scorer, sc, start, ef, 1, level, allow)
}

/// [`search_layer`] expanding up to `width` candidates per step: the
/// `width` best candidates still above the beam's cut (as it stood when the
/// step began) are taken together, their unseen neighbours scored in one
/// call and admitted as one expansion's would be. Width 1 is
/// `search_layer`'s walk; the GPU walk does the same steps
/// (`kernels/walk.cu`), so any width gives the same answer on both.
#[allow(clippy::too_many_arguments)]
pub(crate) fn search_layer_wide<S: Slot, F: Scorer, A: Allow>(
    links: &Links<S>,
    scorer: &mut F,
    sc: &mut Scratch,
    start: Cand,
    ef: usize,
    width: usize,
    level: usize,
    allow: &A,
) -> Result<()> {
    sc.new_epoch();
    let Scratch {
        visited,
        epoch,
        candidates,
        results,
        nbr,
        ids,
        scores,
        ..
    } = sc;
    let epoch = *epoch;
    candidates.clear();
    results.clear();
    visited[start.id() as usize] = epoch;
    candidates.push(start);
    if allow.allows(start.id()) {
        results.push(Reverse(start));
    }

    let width = width.max(1);
    let mut ended = false;
    while !ended {
        // The step's nodes: the best candidates above the cut, at most `width`.
        ids.clear();
        let mut taken = 0;
        while taken < width {
            let Some(c) = candidates.pop() else {
                ended = taken == 0;
                break;
            };
            if results.len() >= ef {
                if let Some(Reverse(worst)) = results.peek() {
                    if c.key < worst.key {
                        // Every later candidate ranks lower still.
                        ended = taken == 0;
                        candidates.clear();
                        break;
                    }
                }
            }
            taken += 1;
            links.neighbours_into(c.id(), level, nbr);
            for &e in nbr.iter() {
                let tag = &mut visited[e as usize];
                if *tag != epoch {
                    *tag = epoch;
                    ids.push(e);
                }
            }
        }
        if ids.is_empty() {
            continue;
        }
        scores.clear();
        scores.resize(ids.len(), 0.0);
        scorer.score_ids(ids, scores)?;
        for (&e, &s) in ids.iter().zip(scores.iter()) {
            let cand = Cand::new(e, s);
            let admit = results.len() < ef
                || results
                    .peek()
                    .is_some_and(|Reverse(worst)| cand.key > worst.key);
            if admit {
                candidates.push(cand);
                if allow.allows(e) {
                    results.push(Reverse(cand));
                    if results.len() > ef {
                        results.pop();
                    }
                }
            }
        }
    }
    Ok(())
}

//! A bounded best-K selector over [`rank_key`]s, shared by every CPU-side
//! selection and merge (CPU blocks, HNSW result lists, per-tile GPU merges).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::order::{rank_key, Neighbor};

/// Keeps the best `k` of a stream of keys, a larger key ranking first.
///
/// The one bounded selection of the workspace, generic over the key: [`TopK`]
/// selects [`rank_key`]s (`u64`, docs/CONTRACTS.md §3) and
/// [`crate::HitTopK`] selects [`crate::hit::hit_key`]s (`u128`,
/// docs/CONTRACTS.md §10). A min-heap: the worst kept key sits on top, so a
/// candidate is admitted with one comparison. `reset` keeps the allocation.
#[derive(Debug, Clone)]
pub struct TopKBy<K: Ord> {
    k: usize,
    heap: BinaryHeap<Reverse<K>>,
}

impl<K: Ord + Copy> TopKBy<K> {
    /// A selector that keeps at most `k` keys.
    pub fn new(k: usize) -> Self {
        TopKBy {
            k,
            heap: BinaryHeap::with_capacity(k.saturating_add(1).min(1 << 20)),
        }
    }

    /// How many keys it keeps at most.
    pub fn k(&self) -> usize {
        self.k
    }

    /// Number of keys held now.
    pub fn len(&self) -> usize {
        self.heap.len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }

    /// Forgets every key and sets a new bound, keeping the allocation.
    pub fn reset(&mut self, k: usize) {
        self.heap.clear();
        self.k = k;
    }

    /// The worst kept key once `k` are held (a candidate must exceed it),
    /// `None` before.
    #[inline]
    pub fn threshold(&self) -> Option<K> {
        if self.heap.len() < self.k {
            None
        } else {
            self.heap.peek().map(|r| r.0)
        }
    }

    /// Offers a key.
    #[inline]
    pub fn push_key(&mut self, key: K) {
        if self.heap.len() < self.k {
            self.heap.push(Reverse(key));
        } else if let Some(mut top) = self.heap.peek_mut() {
            if key > top.0 {
                *top = Reverse(key);
            }
        }
    }

    /// The kept keys, best (largest) first, leaving the selector empty.
    pub fn drain_sorted_keys(&mut self) -> Vec<K> {
        let mut keys: Vec<K> = self.heap.drain().map(|r| r.0).collect();
        keys.sort_unstable_by(|a, b| b.cmp(a));
        keys
    }
}

/// Keeps the best `k` of a stream of candidates under the §3 order.
///
/// A [`TopKBy`] of [`rank_key`]s. [`TopK::threshold`] exposes the worst kept
/// key so hot loops can reject most candidates before calling [`TopK::push`].
/// `clear` keeps the allocation for reuse across queries.
#[derive(Debug, Clone)]
pub struct TopK {
    keys: TopKBy<u64>,
}

impl TopK {
    /// A selector that keeps at most `k` candidates.
    pub fn new(k: usize) -> Self {
        TopK {
            keys: TopKBy::new(k),
        }
    }

    /// How many candidates it keeps at most.
    pub fn k(&self) -> usize {
        self.keys.k()
    }

    /// Number of candidates held now.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Forgets every candidate and sets a new bound, keeping the allocation.
    pub fn reset(&mut self, k: usize) {
        self.keys.reset(k);
    }

    /// The key a candidate must exceed to be admitted: the worst kept key once
    /// `k` are held, 0 before (every real key is larger than 0 unless its score is NaN
    /// and its index is `u32::MAX`).
    #[inline]
    pub fn threshold(&self) -> Option<u64> {
        self.keys.threshold()
    }

    /// Offers a candidate by key.
    #[inline]
    pub fn push_key(&mut self, key: u64) {
        self.keys.push_key(key);
    }

    /// Offers a candidate.
    #[inline]
    pub fn push(&mut self, index: u32, score: f32) {
        self.push_key(rank_key(score, index));
    }

    /// The kept keys, best first, leaving the selector empty.
    pub fn drain_sorted_keys(&mut self) -> Vec<u64> {
        self.keys.drain_sorted_keys()
    }

    /// Writes the kept candidates into `out`, best first, resolving each key's
    /// score through `score_of(index)` so the caller's exact bits survive
    /// (keys canonicalise `-0.0` and NaN). Leaves the selector empty.
    pub fn drain_into(&mut self, out: &mut Vec<Neighbor>, score_of: impl Fn(u32) -> f32) {
        out.clear();
        out.extend(self.drain_sorted_keys().into_iter().map(Neighbor::from_key));
        for n in out.iter_mut() {
            n.score = score_of(n.index);
        }
    }

    /// The kept candidates, best first, with scores rebuilt from their keys.
    pub fn into_sorted_vec(mut self) -> Vec<Neighbor> {
        self.drain_sorted_keys()
            .into_iter()
            .map(Neighbor::from_key)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::order::cmp_rank;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn keeps_exactly_the_best_k(
            scores in prop::collection::vec(prop_oneof![(-3i32..3).prop_map(|v| v as f32), any::<f32>()], 0..200),
            k in 1usize..50,
        ) {
            let mut sel = TopK::new(k);
            for (i, &s) in scores.iter().enumerate() {
                sel.push(i as u32, s);
            }
            let got: Vec<u64> = sel.drain_sorted_keys();
            let mut all: Vec<Neighbor> = scores.iter().enumerate().map(|(i, &s)| Neighbor::new(i as u32, s)).collect();
            all.sort_by(cmp_rank);
            let want: Vec<u64> = all.iter().take(k).map(|n| n.key()).collect();
            prop_assert_eq!(got, want);
        }
    }
}

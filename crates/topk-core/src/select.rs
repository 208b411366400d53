//! A bounded best-K selector over [`rank_key`]s, shared by every CPU-side
//! selection and merge (CPU blocks, HNSW result lists, per-tile GPU merges).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::order::{rank_key, Neighbor};

/// Keeps the best `k` of a stream of candidates under the §3 order.
///
/// A min-heap of keys: the worst kept candidate sits on top, so a candidate is
/// admitted with one integer comparison. [`TopK::threshold`] exposes that
/// key so hot loops can reject most candidates before calling [`TopK::push`].
/// `clear` keeps the allocation for reuse across queries.
#[derive(Debug, Clone)]
pub struct TopK {
    k: usize,
    heap: BinaryHeap<Reverse<u64>>,
}

impl TopK {
    /// A selector that keeps at most `k` candidates.
    pub fn new(k: usize) -> Self {
        TopK {
            k,
            heap: BinaryHeap::with_capacity(k.saturating_add(1).min(1 << 20)),
        }
    }

    /// How many candidates it keeps at most.
    pub fn k(&self) -> usize {
        self.k
    }

    /// Number of candidates held now.
    pub fn len(&self) -> usize {
        self.heap.len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }

    /// Forgets every candidate and sets a new bound, keeping the allocation.
    pub fn reset(&mut self, k: usize) {
        self.heap.clear();
        self.k = k;
    }

    /// The key a candidate must exceed to be admitted: the worst kept key once
    /// `k` are held, 0 before (every real key is larger than 0 unless its score is NaN
    /// and its index is `u32::MAX`).
    #[inline]
    pub fn threshold(&self) -> Option<u64> {
        if self.heap.len() < self.k {
            None
        } else {
            self.heap.peek().map(|r| r.0)
        }
    }

    /// Offers a candidate by key.
    #[inline]
    pub fn push_key(&mut self, key: u64) {
        if self.heap.len() < self.k {
            self.heap.push(Reverse(key));
        } else if let Some(mut top) = self.heap.peek_mut() {
            if key > top.0 {
                *top = Reverse(key);
            }
        }
    }

    /// Offers a candidate.
    #[inline]
    pub fn push(&mut self, index: u32, score: f32) {
        self.push_key(rank_key(score, index));
    }

    /// The kept keys, best first, leaving the selector empty.
    pub fn drain_sorted_keys(&mut self) -> Vec<u64> {
        let mut keys: Vec<u64> = self.heap.drain().map(|r| r.0).collect();
        keys.sort_unstable_by(|a, b| b.cmp(a));
        keys
    }

    /// Writes the kept candidates into `out`, best first, resolving each key's
    /// score through `score_of(index)` so the caller's exact bits survive
    /// (keys canonicalise `-0.0` and NaN). Leaves the selector empty.
    pub fn drain_into(&mut self, out: &mut Vec<Neighbor>, score_of: impl Fn(u32) -> f32) {
        out.clear();
        out.extend(self.heap.drain().map(|r| Neighbor::from_key(r.0)));
        out.sort_unstable_by(crate::order::cmp_rank);
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

//! Results named by external ids, and their ordering (docs/CONTRACTS.md §10).
//!
//! Best first: higher score; on equal score (IEEE equality, so `-0.0 == +0.0`)
//! the smaller id. As for row indices (§3) the order is defined once, by
//! [`hit_key`]: a 128-bit integer whose natural order is the ranking (larger
//! key = better). [`cmp_hit`] compares keys, and [`HitTopK`] selects by them,
//! so the comparator and the selection cannot drift apart.

use std::cmp::Ordering;

use crate::order::{ordered_bits, score_from_ordered_bits};
use crate::select::TopKBy;

/// The largest external id, `2^63 - 1`: every id fits a signed 64-bit
/// integer, leaving `-1` free to mean "no result" in other languages.
pub const MAX_ID: u64 = (1 << 63) - 1;

/// One search result of an index: a row's external id and its score.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
#[repr(C)]
pub struct Hit {
    /// The row's external id, at most [`MAX_ID`].
    pub id: u64,
    /// Score (higher is better); for L2 the negated squared distance.
    pub score: f32,
}

impl Hit {
    /// A hit from its parts.
    pub const fn new(id: u64, score: f32) -> Self {
        Hit { id, score }
    }

    /// This hit's [`hit_key`].
    #[inline]
    pub fn key(self) -> u128 {
        hit_key(self.score, self.id)
    }

    /// The hit a key encodes. As with [`crate::Neighbor::from_key`], `-0.0`
    /// comes back as `+0.0` and a NaN as the default NaN: keep the original
    /// score where its exact bits matter.
    #[inline]
    pub fn from_key(key: u128) -> Self {
        Hit {
            id: u64::MAX - (key as u64),
            score: score_from_ordered_bits((key >> 64) as u32),
        }
    }
}

/// The total ranking key of a hit:
/// `(ordered_bits(score) << 64) | (u64::MAX - id)`. A larger key ranks first.
#[inline]
pub fn hit_key(score: f32, id: u64) -> u128 {
    (u128::from(ordered_bits(score)) << 64) | u128::from(u64::MAX - id)
}

/// The comparator of hits: `Less` means `a` ranks before `b`.
/// `v.sort_by(cmp_hit)` sorts best first.
#[inline]
pub fn cmp_hit(a: &Hit, b: &Hit) -> Ordering {
    b.key().cmp(&a.key())
}

/// The bounded selector of hits: a [`TopKBy`] of [`hit_key`]s.
pub type HitTopK = TopKBy<u128>;

impl TopKBy<u128> {
    /// Offers a hit.
    #[inline]
    pub fn push_hit(&mut self, id: u64, score: f32) {
        self.push_key(hit_key(score, id));
    }

    /// The kept hits, best first, leaving the selector empty. `score_of(id)`
    /// supplies each score's exact bits (a key folds `-0.0` into `+0.0`).
    pub fn drain_hits(&mut self, mut score_of: impl FnMut(u64) -> f32) -> Vec<Hit> {
        self.drain_sorted_keys()
            .into_iter()
            .map(|key| {
                let id = Hit::from_key(key).id;
                Hit::new(id, score_of(id))
            })
            .collect()
    }
}

/// Why a list of ids cannot be stored: the first problem in list order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdProblem {
    /// `ids[position]` is above [`MAX_ID`].
    TooLarge {
        /// The id.
        id: u64,
        /// Its position in the list.
        position: usize,
    },
    /// `ids[second]` repeats `ids[first]`.
    Repeated {
        /// The id.
        id: u64,
        /// Its first position.
        first: usize,
        /// Its second position.
        second: usize,
    },
}

/// Checks that every id is at most [`MAX_ID`] and appears once, position by
/// position: the id rule of every store of ids (docs/CONTRACTS.md §10).
pub fn check_ids(ids: &[u64]) -> Result<(), IdProblem> {
    let mut first_at: std::collections::HashMap<u64, usize> =
        std::collections::HashMap::with_capacity(ids.len());
    for (position, &id) in ids.iter().enumerate() {
        if id > MAX_ID {
            return Err(IdProblem::TooLarge { id, position });
        }
        if let Some(first) = first_at.insert(id, position) {
            return Err(IdProblem::Repeated {
                id,
                first,
                second: position,
            });
        }
    }
    Ok(())
}

/// The best `k` hits of several result lists, best first: how the shards of
/// an index are merged (docs/CONTRACTS.md §12). Each list holds the top hits
/// of one disjoint part of a corpus under one query; the lists hold distinct
/// ids (a sharded index places every id on one shard). Because every part
/// ranks by the same total key ([`hit_key`]), the first `k` hits of the
/// union of the parts' top-`k` lists are the top `k` of the whole corpus,
/// with the same bytes: the hits are copied, never rescored.
///
/// A list already best first (what a search returns) is merged in one pass;
/// a list out of order is sorted first, so any input gives the same answer.
pub fn merge_hits(lists: &[&[Hit]], k: usize) -> Vec<Hit> {
    let mut sorted: Vec<std::borrow::Cow<'_, [Hit]>> = lists
        .iter()
        .map(|&list| {
            if list.windows(2).all(|w| w[0].key() >= w[1].key()) {
                std::borrow::Cow::Borrowed(list)
            } else {
                let mut owned = list.to_vec();
                owned.sort_by(cmp_hit);
                std::borrow::Cow::Owned(owned)
            }
        })
        .collect();
    sorted.retain(|list| !list.is_empty());
    let total: usize = sorted.iter().map(|list| list.len()).sum();
    let mut out = Vec::with_capacity(k.min(total));
    let mut heads = vec![0usize; sorted.len()];
    while out.len() < k {
        // A linear scan of the heads: shard counts are small, and a heap
        // would cost more than it saves below a few dozen lists.
        let mut best: Option<(usize, u128)> = None;
        for (s, list) in sorted.iter().enumerate() {
            if let Some(hit) = list.get(heads[s]) {
                let key = hit.key();
                if best.is_none_or(|(_, b)| key > b) {
                    best = Some((s, key));
                }
            }
        }
        let Some((s, _)) = best else { break };
        out.push(sorted[s][heads[s]]);
        heads[s] += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Finite scores with many exact ties and both zeros (§4.1: no NaN).
    fn any_score() -> impl Strategy<Value = f32> {
        prop_oneof![
            any::<f32>().prop_filter("finite or infinite, never NaN", |s| !s.is_nan()),
            Just(0.0),
            Just(-0.0),
            Just(f32::INFINITY),
            Just(f32::NEG_INFINITY),
            (-3i32..3).prop_map(|v| v as f32),
        ]
    }

    fn any_id() -> impl Strategy<Value = u64> {
        prop_oneof![0u64..8, 0..=MAX_ID, Just(MAX_ID), Just(0)]
    }

    fn any_hit() -> impl Strategy<Value = Hit> {
        (any_id(), any_score()).prop_map(|(id, s)| Hit::new(id, s))
    }

    /// The ordering written from its English definition.
    fn by_definition(a: &Hit, b: &Hit) -> Ordering {
        if a.score > b.score {
            Ordering::Less
        } else if a.score < b.score {
            Ordering::Greater
        } else {
            a.id.cmp(&b.id)
        }
    }

    proptest! {
        #[test]
        fn key_order_is_the_definition(a in any_hit(), b in any_hit()) {
            prop_assert_eq!(cmp_hit(&a, &b), by_definition(&a, &b));
            prop_assert_eq!(b.key().cmp(&a.key()), by_definition(&a, &b));
        }

        #[test]
        fn keys_round_trip(h in any_hit()) {
            let back = Hit::from_key(h.key());
            prop_assert_eq!(back.id, h.id);
            prop_assert_eq!(back.score, h.score);
        }

        #[test]
        fn selection_equals_a_full_sort(
            scores in prop::collection::vec((-2i32..2).prop_map(|v| v as f32), 0..150),
            // Distinct ids spread over the whole id range, shuffled.
            ids in Just((0..150u64).map(|i| i * (MAX_ID / 149)).collect::<Vec<u64>>()).prop_shuffle(),
            k in 1usize..40,
        ) {
            let mut sel = HitTopK::new(k);
            for (&s, &id) in scores.iter().zip(&ids) {
                sel.push_hit(id, s);
            }
            let score_of = |id: u64| {
                let at = ids.iter().position(|&i| i == id).unwrap_or(0);
                scores[at]
            };
            let got = sel.drain_hits(score_of);
            let mut all: Vec<Hit> = scores.iter().zip(&ids).map(|(&s, &id)| Hit::new(id, s)).collect();
            all.sort_by(cmp_hit);
            all.truncate(k);
            prop_assert_eq!(got, all);
        }
    }

    #[test]
    fn negative_zero_ties_with_positive_zero_and_keeps_its_bits() {
        let mut sel = HitTopK::new(2);
        sel.push_hit(7, -0.0);
        sel.push_hit(3, 0.0);
        sel.push_hit(9, -0.0);
        let got = sel.drain_hits(|id| if id == 3 { 0.0 } else { -0.0 });
        assert_eq!(got.iter().map(|h| h.id).collect::<Vec<_>>(), [3, 7]);
        assert_eq!(got[1].score.to_bits(), (-0.0_f32).to_bits());
    }

    #[test]
    fn smaller_id_wins_ties_across_the_whole_range() {
        let mut v = vec![
            Hit::new(MAX_ID, 1.0),
            Hit::new(0, 1.0),
            Hit::new(1 << 40, 2.0),
        ];
        v.sort_by(cmp_hit);
        assert_eq!(
            v,
            vec![
                Hit::new(1 << 40, 2.0),
                Hit::new(0, 1.0),
                Hit::new(MAX_ID, 1.0)
            ]
        );
    }

    proptest! {
        #[test]
        fn merging_parts_equals_selecting_the_whole(
            scores in prop::collection::vec((-3i32..3).prop_map(|v| v as f32 * 0.5), 0..200),
            ids in Just((0..200u64).map(|i| i * (MAX_ID / 199)).collect::<Vec<u64>>()).prop_shuffle(),
            parts in 1usize..6,
            k in 1usize..50,
            sort_parts in any::<bool>(),
        ) {
            let all: Vec<Hit> = scores.iter().zip(&ids).map(|(&s, &id)| Hit::new(id, s)).collect();
            let mut whole = all.clone();
            whole.sort_by(cmp_hit);
            whole.truncate(k);
            // Each part is a disjoint share of the rows; its own top k is
            // what a shard would return (or, unsorted, what a caller might pass).
            let mut lists: Vec<Vec<Hit>> = vec![Vec::new(); parts];
            for (i, h) in all.iter().enumerate() {
                lists[i % parts].push(*h);
            }
            for list in &mut lists {
                if sort_parts {
                    list.sort_by(cmp_hit);
                    list.truncate(k);
                }
            }
            let views: Vec<&[Hit]> = lists.iter().map(Vec::as_slice).collect();
            let merged = merge_hits(&views, k);
            prop_assert_eq!(merged.len(), whole.len());
            for (m, w) in merged.iter().zip(&whole) {
                prop_assert_eq!(m.id, w.id);
                prop_assert_eq!(m.score.to_bits(), w.score.to_bits());
            }
        }
    }

    #[test]
    fn ids_are_checked_position_by_position() {
        assert_eq!(check_ids(&[3, 0, MAX_ID]), Ok(()));
        assert_eq!(
            check_ids(&[1, MAX_ID + 1, 1]),
            Err(IdProblem::TooLarge {
                id: MAX_ID + 1,
                position: 1
            })
        );
        assert_eq!(
            check_ids(&[7, 2, 7, 7]),
            Err(IdProblem::Repeated {
                id: 7,
                first: 0,
                second: 2
            })
        );
    }

    #[test]
    fn merge_keeps_negative_zero_bits_and_handles_empty_lists() {
        let a = [Hit::new(4, -0.0), Hit::new(9, -1.0)];
        let b = [Hit::new(2, 0.0)];
        let got = merge_hits(&[&a, &[], &b], 2);
        assert_eq!(got.iter().map(|h| h.id).collect::<Vec<_>>(), [2, 4]);
        assert_eq!(got[1].score.to_bits(), (-0.0_f32).to_bits());
        assert!(merge_hits(&[], 3).is_empty());
        assert_eq!(merge_hits(&[&a], 10).len(), 2);
    }
}

//! The one ordering of results (docs/CONTRACTS.md §3).
//!
//! Best first: higher score; on equal score (IEEE equality, so `-0.0 == +0.0`)
//! the smaller row index; a NaN score below every number. The order is defined
//! once, by [`rank_key`]: a 64-bit integer whose natural order is the ranking
//! (larger key = better). [`cmp_rank`] compares keys, so the comparator and the
//! key used by GPU selection cannot drift apart, and the order is total.

use std::cmp::Ordering;

/// One search result: a corpus row and its score under the retriever's metric.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
#[repr(C)]
pub struct Neighbor {
    /// Row index in the corpus.
    pub index: u32,
    /// Score (higher is better); for L2 the negated squared distance.
    pub score: f32,
}

impl Neighbor {
    /// A neighbour from its parts.
    pub const fn new(index: u32, score: f32) -> Self {
        Neighbor { index, score }
    }

    /// This neighbour's [`rank_key`].
    #[inline]
    pub fn key(self) -> u64 {
        rank_key(self.score, self.index)
    }

    /// The neighbour a key encodes. Scores come back canonicalised: `-0.0`
    /// returns as `+0.0` and every NaN as the default NaN; for the bitwise
    /// comparisons of the test suites keep the original [`Neighbor`] instead.
    #[inline]
    pub fn from_key(key: u64) -> Self {
        Neighbor {
            index: u32::MAX - (key as u32),
            score: score_from_ordered_bits((key >> 32) as u32),
        }
    }
}

/// Maps a score to a `u32` whose unsigned order is the score order:
/// monotone on numbers, `-0.0` and `+0.0` to the same value, NaN to 0 (below
/// `-inf`, which maps to `0x007F_FFFF`).
#[inline]
pub fn ordered_bits(score: f32) -> u32 {
    if score.is_nan() {
        return 0;
    }
    // `+ 0.0` turns -0.0 into +0.0 and leaves every other number unchanged.
    let bits = (score + 0.0).to_bits();
    if bits & 0x8000_0000 != 0 {
        !bits
    } else {
        bits | 0x8000_0000
    }
}

/// Inverse of [`ordered_bits`] on the values it produces.
#[inline]
pub fn score_from_ordered_bits(bits: u32) -> f32 {
    if bits == 0 {
        f32::NAN
    } else if bits & 0x8000_0000 != 0 {
        f32::from_bits(bits & 0x7FFF_FFFF)
    } else {
        f32::from_bits(!bits)
    }
}

/// The total ranking key: `(ordered_bits(score) << 32) | (u32::MAX - index)`.
/// A larger key ranks first.
#[inline]
pub fn rank_key(score: f32, index: u32) -> u64 {
    (u64::from(ordered_bits(score)) << 32) | u64::from(u32::MAX - index)
}

/// The comparator of results: `Less` means `a` ranks before `b`.
/// `v.sort_by(cmp_rank)` sorts best first.
#[inline]
pub fn cmp_rank(a: &Neighbor, b: &Neighbor) -> Ordering {
    b.key().cmp(&a.key())
}

/// Sorts results best first.
pub fn sort_best_first(v: &mut [Neighbor]) {
    v.sort_unstable_by(cmp_rank);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn any_score() -> impl Strategy<Value = f32> {
        prop_oneof![
            any::<f32>(),
            Just(0.0),
            Just(-0.0),
            Just(f32::NAN),
            Just(-f32::NAN),
            Just(f32::INFINITY),
            Just(f32::NEG_INFINITY),
            (-4i32..4).prop_map(|v| v as f32),
            Just(f32::MIN_POSITIVE / 8.0),
        ]
    }

    fn any_neighbor() -> impl Strategy<Value = Neighbor> {
        (prop_oneof![0u32..8, any::<u32>()], any_score()).prop_map(|(i, s)| Neighbor::new(i, s))
    }

    /// The ordering written from its English definition, for comparison.
    fn by_definition(a: &Neighbor, b: &Neighbor) -> Ordering {
        match (a.score.is_nan(), b.score.is_nan()) {
            (true, false) => return Ordering::Greater,
            (false, true) => return Ordering::Less,
            (true, true) => return a.index.cmp(&b.index),
            (false, false) => {}
        }
        if a.score > b.score {
            Ordering::Less
        } else if a.score < b.score {
            Ordering::Greater
        } else {
            a.index.cmp(&b.index)
        }
    }

    proptest! {
        #[test]
        fn comparator_matches_the_definition(a in any_neighbor(), b in any_neighbor()) {
            prop_assert_eq!(cmp_rank(&a, &b), by_definition(&a, &b));
        }

        #[test]
        fn comparator_is_a_strict_weak_order(a in any_neighbor(), b in any_neighbor(), c in any_neighbor()) {
            // irreflexive, antisymmetric, transitive, and incomparability only for equal (score, index).
            prop_assert_eq!(cmp_rank(&a, &a), Ordering::Equal);
            prop_assert_eq!(cmp_rank(&a, &b), cmp_rank(&b, &a).reverse());
            if cmp_rank(&a, &b) == Ordering::Less && cmp_rank(&b, &c) == Ordering::Less {
                prop_assert_eq!(cmp_rank(&a, &c), Ordering::Less);
            }
            if cmp_rank(&a, &b) == Ordering::Equal {
                prop_assert_eq!(a.index, b.index);
                prop_assert!(a.score == b.score || (a.score.is_nan() && b.score.is_nan()));
            }
        }

        #[test]
        fn key_order_is_score_order(a in any_score(), b in any_score()) {
            let (ka, kb) = (ordered_bits(a), ordered_bits(b));
            if a.is_nan() || b.is_nan() {
                prop_assert_eq!(ka.cmp(&kb), b.is_nan().cmp(&a.is_nan()));
            } else {
                prop_assert_eq!(ka.cmp(&kb), a.partial_cmp(&b).unwrap());
            }
        }

        #[test]
        fn keys_round_trip(n in any_neighbor()) {
            let back = Neighbor::from_key(n.key());
            prop_assert_eq!(back.index, n.index);
            if n.score.is_nan() {
                prop_assert!(back.score.is_nan());
            } else {
                prop_assert!(back.score == n.score);
            }
        }
    }

    #[test]
    fn negative_zero_ties_with_positive_zero() {
        let a = Neighbor::new(3, -0.0);
        let b = Neighbor::new(5, 0.0);
        assert_eq!(ordered_bits(-0.0), ordered_bits(0.0));
        assert_eq!(cmp_rank(&a, &b), Ordering::Less);
        assert_eq!(cmp_rank(&b, &Neighbor::new(2, -0.0)), Ordering::Greater);
    }

    #[test]
    fn nan_ranks_last() {
        let mut v = vec![
            Neighbor::new(0, f32::NAN),
            Neighbor::new(1, f32::NEG_INFINITY),
            Neighbor::new(2, -f32::NAN),
            Neighbor::new(3, -1e30),
        ];
        sort_best_first(&mut v);
        let idx: Vec<u32> = v.iter().map(|n| n.index).collect();
        assert_eq!(idx, vec![3, 1, 0, 2]);
    }

    #[test]
    fn smaller_index_wins_ties() {
        let mut v = vec![
            Neighbor::new(9, 1.0),
            Neighbor::new(2, 1.0),
            Neighbor::new(5, 2.0),
        ];
        sort_best_first(&mut v);
        assert_eq!(
            v,
            vec![
                Neighbor::new(5, 2.0),
                Neighbor::new(2, 1.0),
                Neighbor::new(9, 1.0)
            ]
        );
    }
}

//! Bounded selection with a cheap early reject in front of [`TopK`].
//!
//! Most candidates of a large scan lose to the current K-th best; comparing
//! the raw score with the K-th best score rejects them before a key is built.
//! The reject is exact: a candidate whose key beats the threshold key has a
//! score that is not below the threshold score (a NaN on either side never
//! rejects), so the kept set is the one [`TopK`] alone would keep.

use topk_core::{rank_key, Neighbor, TopK};

/// The best `k` of a stream of `(index, score)` candidates.
#[derive(Debug, Clone)]
pub(crate) struct Selector {
    top: TopK,
    /// Key of the worst kept candidate once `k` are held, else 0.
    threshold_key: u64,
    /// Its score; NaN (which rejects nothing) until `k` are held.
    threshold_score: f32,
}

impl Selector {
    pub(crate) fn new(k: usize) -> Self {
        Selector {
            top: TopK::new(k),
            threshold_key: 0,
            threshold_score: f32::NAN,
        }
    }

    /// A score below this cannot be admitted (NaN until `k` are held, which
    /// rejects nothing).
    #[inline]
    pub(crate) fn threshold_score(&self) -> f32 {
        self.threshold_score
    }

    /// Offers one candidate.
    #[inline]
    pub(crate) fn offer(&mut self, index: u32, score: f32) {
        if score < self.threshold_score {
            return;
        }
        self.offer_key(rank_key(score, index));
    }

    #[inline]
    fn offer_key(&mut self, key: u64) {
        if key <= self.threshold_key {
            return;
        }
        self.top.push_key(key);
        if let Some(t) = self.top.threshold() {
            self.threshold_key = t;
            self.threshold_score = Neighbor::from_key(t).score;
        }
    }

    /// Folds another selector's candidates into this one (same comparator).
    pub(crate) fn merge(mut self, mut other: Selector) -> Selector {
        if other.top.len() > self.top.len() {
            std::mem::swap(&mut self, &mut other);
        }
        for key in other.top.drain_sorted_keys() {
            self.offer_key(key);
        }
        self
    }

    /// Writes the kept candidates best first; `score_of(index)` supplies the
    /// exact score bits (a key folds `-0.0` into `+0.0`).
    pub(crate) fn finish(mut self, out: &mut Vec<Neighbor>, score_of: impl Fn(u32) -> f32) {
        self.top.drain_into(out, score_of);
    }
}

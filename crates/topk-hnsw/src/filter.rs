//! A set of node slots as a bitset: the allow-list of a filtered search, and
//! the index's own deletion marks.

/// A set of slots (`u32` row numbers of an [`crate::Hnsw`]), one bit each.
///
/// Used as the allow-list of [`crate::Hnsw::search_filtered`]: a filtered
/// search returns only slots in the set that are not deleted. Slots the
/// index does not have are ignored, so a filter may be built before rows are
/// inserted or name rows that were never there. It takes one bit for every
/// slot up to the largest it holds (slot 2^32 - 1: 512 MiB), so build it
/// from slots of the index (as `topk_index::Index` does from ids), not from
/// arbitrary numbers.
///
/// ```
/// use topk_hnsw::SlotFilter;
///
/// let mut f: SlotFilter = [3u32, 70, 3].into_iter().collect();
/// f.insert(5);
/// assert!(f.contains(70) && f.contains(5) && !f.contains(4));
/// assert_eq!(f.count(), 3);
/// assert_eq!(f.iter().collect::<Vec<_>>(), vec![3, 5, 70]);
/// ```
#[derive(Debug, Clone, Default)]
pub struct SlotFilter {
    words: Vec<u64>,
}

/// Two filters are equal when they hold the same slots, whatever room
/// their storage kept (removals and `from_fn` leave zero words behind).
impl PartialEq for SlotFilter {
    fn eq(&self, other: &Self) -> bool {
        let (short, long) = if self.words.len() <= other.words.len() {
            (&self.words, &other.words)
        } else {
            (&other.words, &self.words)
        };
        long[..short.len()] == short[..] && long[short.len()..].iter().all(|&w| w == 0)
    }
}

impl Eq for SlotFilter {}

impl SlotFilter {
    /// The empty set (a filter that allows nothing).
    pub fn new() -> Self {
        Self::default()
    }

    /// Slots `0..n`.
    pub fn all(n: usize) -> Self {
        let mut words = vec![u64::MAX; n / 64];
        if n % 64 != 0 {
            words.push((1u64 << (n % 64)) - 1);
        }
        SlotFilter { words }
    }

    /// The slots of `0..n` for which `allow` is true.
    pub fn from_fn(n: usize, mut allow: impl FnMut(u32) -> bool) -> Self {
        let mut f = SlotFilter {
            words: vec![0; n.div_ceil(64)],
        };
        for slot in 0..n as u32 {
            if allow(slot) {
                f.insert(slot);
            }
        }
        f
    }

    /// Adds `slot`.
    pub fn insert(&mut self, slot: u32) {
        let w = slot as usize / 64;
        if w >= self.words.len() {
            self.words.resize(w + 1, 0);
        }
        self.words[w] |= 1 << (slot % 64);
    }

    /// Removes `slot`; returns whether it was present.
    pub fn remove(&mut self, slot: u32) -> bool {
        let w = slot as usize / 64;
        let bit = 1u64 << (slot % 64);
        match self.words.get_mut(w) {
            Some(word) if *word & bit != 0 => {
                *word &= !bit;
                true
            }
            _ => false,
        }
    }

    /// Whether `slot` is in the set.
    #[inline]
    pub fn contains(&self, slot: u32) -> bool {
        self.words
            .get(slot as usize / 64)
            .is_some_and(|w| w & (1 << (slot % 64)) != 0)
    }

    /// Number of slots in the set.
    pub fn count(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.words.iter().all(|&w| w == 0)
    }

    /// The slots in increasing order.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.words.iter().enumerate().flat_map(|(i, &w)| {
            let mut rest = w;
            std::iter::from_fn(move || {
                if rest == 0 {
                    return None;
                }
                let b = rest.trailing_zeros();
                rest &= rest - 1;
                Some(i as u32 * 64 + b)
            })
        })
    }

    /// The device walk's allow-list: one bit per slot below `n` (bit
    /// `s % 32` of word `s / 32`), set for the slots of `keep` (every slot
    /// when `None`) that are not in `minus`; word by word, not slot by slot.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn allow_bits(n: usize, keep: Option<&SlotFilter>, minus: &SlotFilter) -> Vec<u32> {
        let word = |f: &SlotFilter, i: usize| f.words.get(i).copied().unwrap_or(0);
        let mut bits = Vec::with_capacity(n.div_ceil(64) * 2);
        for i in 0..n.div_ceil(64) {
            let mut w = keep.map_or(u64::MAX, |f| word(f, i)) & !word(minus, i);
            if i == n / 64 {
                w &= (1u64 << (n % 64)) - 1;
            }
            bits.extend([w as u32, (w >> 32) as u32]);
        }
        bits.truncate(n.div_ceil(32));
        bits
    }

    /// Number of slots below `n` in `self` and not in `minus`.
    pub(crate) fn count_below_minus(&self, n: usize, minus: &SlotFilter) -> usize {
        let full = n / 64;
        let mut count = 0usize;
        for (i, &w) in self.words.iter().enumerate().take(n.div_ceil(64)) {
            let mut w = w & !minus.words.get(i).copied().unwrap_or(0);
            if i == full {
                w &= (1u64 << (n % 64)) - 1;
            }
            count += w.count_ones() as usize;
        }
        count
    }
}

impl FromIterator<u32> for SlotFilter {
    fn from_iter<I: IntoIterator<Item = u32>>(iter: I) -> Self {
        let mut f = SlotFilter::new();
        for slot in iter {
            f.insert(slot);
        }
        f
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_and_from_fn_hold_exactly_their_slots() {
        for n in [0usize, 1, 63, 64, 65, 130] {
            let a = SlotFilter::all(n);
            assert_eq!(a.count(), n);
            assert_eq!(
                a.iter().collect::<Vec<_>>(),
                (0..n as u32).collect::<Vec<_>>()
            );
            assert!(!a.contains(n as u32));
            let even = SlotFilter::from_fn(n, |s| s % 2 == 0);
            assert_eq!(even.count(), n.div_ceil(2));
            assert_eq!(even, (0..n as u32).step_by(2).collect());
        }
    }

    #[test]
    fn equal_sets_are_equal_whatever_their_storage() {
        assert_eq!(SlotFilter::new(), SlotFilter::from_fn(64, |_| false));
        assert_eq!(SlotFilter::from_fn(200, |_| false), SlotFilter::new());
        let mut a: SlotFilter = [1u32, 200].into_iter().collect();
        a.remove(200);
        let b: SlotFilter = [1u32].into_iter().collect();
        assert_eq!(a, b);
        assert_eq!(b, a);
        assert_ne!(a, SlotFilter::new());
        a.insert(130);
        assert_ne!(a, b);
    }

    #[test]
    fn allow_bits_are_the_kept_slots_minus_the_removed_ones() {
        for n in [1usize, 31, 32, 33, 63, 64, 65, 130, 200] {
            let keep = SlotFilter::from_fn(n + 70, |s| s % 3 != 1);
            let minus = SlotFilter::from_fn(n + 5, |s| s % 5 == 0);
            for k in [None, Some(&keep)] {
                let bits = SlotFilter::allow_bits(n, k, &minus);
                assert_eq!(bits.len(), n.div_ceil(32), "n {n}");
                for s in 0..bits.len() as u32 * 32 {
                    let want =
                        (s as usize) < n && k.is_none_or(|f| f.contains(s)) && !minus.contains(s);
                    let got = bits[(s / 32) as usize] >> (s % 32) & 1 == 1;
                    assert_eq!(got, want, "n {n}, slot {s}, filter {}", k.is_some());
                }
            }
        }
    }

    #[test]
    fn remove_reports_presence_and_counts_subtract() {
        let mut f: SlotFilter = [1u32, 64, 200].into_iter().collect();
        assert!(f.remove(64));
        assert!(!f.remove(64));
        assert!(!f.remove(10_000));
        assert_eq!(f.iter().collect::<Vec<_>>(), vec![1, 200]);
        let minus: SlotFilter = [1u32].into_iter().collect();
        assert_eq!(f.count_below_minus(300, &minus), 1);
        assert_eq!(f.count_below_minus(200, &SlotFilter::new()), 1);
        assert_eq!(f.count_below_minus(201, &SlotFilter::new()), 2);
        assert_eq!(f.count_below_minus(0, &SlotFilter::new()), 0);
        assert!(SlotFilter::new().is_empty() && !f.is_empty());
    }
}

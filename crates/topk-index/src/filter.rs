//! Allow-lists of ids for filtered search (docs/CONTRACTS.md §10).

/// An allow-list of ids: a filtered search returns only rows whose id it
/// holds. Ids the index does not hold are ignored. Kept sorted and without
/// repeats, so building one costs a sort and a lookup a binary search.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Filter {
    ids: Vec<u64>,
}

impl Filter {
    /// A filter allowing exactly `ids` (repeats are fine).
    pub fn new(ids: impl IntoIterator<Item = u64>) -> Self {
        let mut ids: Vec<u64> = ids.into_iter().collect();
        ids.sort_unstable();
        ids.dedup();
        Filter { ids }
    }

    /// The allowed ids, ascending, each once.
    pub fn ids(&self) -> &[u64] {
        &self.ids
    }

    /// Number of distinct allowed ids.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether the filter allows nothing.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Whether `id` is allowed.
    pub fn contains(&self, id: u64) -> bool {
        self.ids.binary_search(&id).is_ok()
    }
}

impl FromIterator<u64> for Filter {
    fn from_iter<I: IntoIterator<Item = u64>>(iter: I) -> Self {
        Filter::new(iter)
    }
}

/// The filters of a batch search.
#[derive(Debug, Clone, Copy, Default)]
pub enum FilterSpec<'a> {
    /// Every query searches every live row.
    #[default]
    None,
    /// One filter for every query of the batch.
    Shared(&'a Filter),
    /// One filter per query, in query order.
    PerQuery(&'a [Filter]),
}

impl<'a> FilterSpec<'a> {
    /// The filter of query `i` (the caller has checked a per-query list's length).
    pub(crate) fn of(self, i: usize) -> Option<&'a Filter> {
        match self {
            FilterSpec::None => None,
            FilterSpec::Shared(f) => Some(f),
            FilterSpec::PerQuery(fs) => fs.get(i),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sorts_and_deduplicates() {
        let f = Filter::new([5, 1, 5, 3]);
        assert_eq!(f.ids(), &[1, 3, 5]);
        assert_eq!(f.len(), 3);
        assert!(f.contains(3));
        assert!(!f.contains(2));
        assert!(Filter::default().is_empty());
    }
}

//! The allow-lists of the mutable resident corpus, defined in every build.

/// An allowed set of at most this fraction of the stored rows is scored as
/// a list of rows; a larger one by scoring every row under a bitset.
pub const GATHER_FRACTION: f64 = 0.25;

/// Which rows a search may return.
#[derive(Debug, Clone, Copy)]
pub enum IdFilter<'a> {
    /// Every live row.
    All,
    /// The live rows among these ids, for every query of the call. Ids
    /// absent from the corpus are ignored; the list needs no order.
    Shared(&'a [u64]),
    /// One list per query, as [`IdFilter::Shared`].
    PerQuery(&'a [&'a [u64]]),
}

//! `Index`: the stored rows, their ids and tombstones, and every mutation.
//! Searching lives in [`crate::search`], files in [`crate::file`].

use std::borrow::Cow;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::OnceLock;

use ndarray::ArrayView2;
use rayon::slice::ParallelSliceMut;
use topk_core::{validate, Dtype, IdProblem, Metric, RowStore, MAX_ID};
use topk_cpu::{CertifiedRows, Kernels};

use crate::error::IndexError;
use crate::options::{IndexBackend, IndexOptions};

/// Tombstones may reach this fraction of the stored rows before an automatic
/// compaction: a scan then spends at most a quarter of its reads on dead rows
/// (docs/CONTRACTS.md §10).
pub const COMPACT_FRACTION: f64 = 0.25;

/// A corpus that changes over time, searched exactly (docs/CONTRACTS.md §10).
///
/// Rows carry external ids (`u64`, at most [`MAX_ID`]). Mutations take
/// `&mut self` and are all or nothing; searches take `&self`, and an `Index`
/// is `Send + Sync`, so many threads may search one index behind an `Arc`
/// (or an `RwLock` when it also changes). A result depends only on the
/// (id, vector) pairs present, never on the history that led there.
#[derive(Debug, Clone)]
pub struct Index {
    pub(crate) dim: usize,
    pub(crate) metric: Metric,
    pub(crate) backend: IndexBackend,
    pub(crate) kernels: Kernels,
    /// Stored rows, row-major, tombstoned ones included, at the index's
    /// storage type (docs/CONTRACTS.md §14).
    pub(crate) data: RowStore,
    /// Id of each stored row.
    pub(crate) ids: Vec<u64>,
    /// Canonical norm of each stored row for cosine; empty otherwise.
    pub(crate) norms: Vec<f32>,
    /// One bit per stored row: set while the row is live.
    pub(crate) live: Vec<u64>,
    /// Stored row of each live id.
    pub(crate) rows_of: IdMap<usize>,
    /// The largest live id (kept up to date, so that automatic ids cost no
    /// scan of the ids per add).
    pub(crate) largest: Option<u64>,
    /// Tombstoned rows.
    pub(crate) dead: usize,
    /// The ids of the rows below `sorted_upto` that were live when last
    /// sorted, ascending by id: a dense filter is resolved to rows by one
    /// merge with it instead of a hash lookup per filter id. Entries of rows
    /// removed since stay (the live bits drop them); rows appended since
    /// (`sorted_upto..`) are merged in once they reach [`UNSORTED_FRACTION`]
    /// of it.
    pub(crate) by_id: Vec<u64>,
    /// The stored row of each entry of `by_id`.
    pub(crate) by_id_rows: Vec<usize>,
    /// Stored rows below this are covered by `by_id`.
    pub(crate) sorted_upto: usize,
    /// How filters are resolved to rows.
    pub(crate) resolution: FilterResolution,
    /// What the non-host backends were built with.
    pub(crate) options: IndexOptions,
    /// The graph of the `hnsw` backend (`crate::graph`); `None` on the
    /// others and while an `hnsw` index is empty.
    pub(crate) graph: Option<Box<crate::graph::HnswGraph>>,
    /// The device mirror of the `cuda` backend (empty on the others).
    pub(crate) device: crate::device::DeviceCell,
    /// The `cpu` backend's certified-path state of the stored rows (upward
    /// norms, int8 codes; docs/CONTRACTS.md §2.1): built by the first search
    /// that takes that path, then kept up to date by every change of the
    /// rows, so a search never waits for rows that did not change.
    pub(crate) certified: OnceLock<CertifiedRows>,
}

/// Rows appended since `by_id` was last sorted are merged into it once they
/// exceed this fraction of it, so an append costs amortized `O(log n)` and a
/// dense filter binary-searches at most this fraction of the rows.
pub(crate) const UNSORTED_FRACTION: f64 = 0.125;

/// How a filtered `cpu` search turns filter ids into stored rows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum FilterResolution {
    /// A hash lookup per filter id below [`crate::MERGE_FRACTION`] of the
    /// live rows, one merge with the id-sorted rows at or above it.
    #[default]
    Auto,
    /// Always a hash lookup per filter id.
    Lookup,
    /// Always one merge with the id-sorted rows.
    Merge,
}

/// The ids and rows of one mutation, checked and row-major. The rows are
/// the values as stored, widened: the given values for `f32` storage, the
/// rounded ones otherwise, so the norms, the device mirror and the graph
/// all see what searches score.
struct Checked<'a> {
    ids: &'a [u64],
    rows: Cow<'a, [f32]>,
}

impl Index {
    /// An empty index of `dim`-value rows.
    pub fn new(dim: usize, metric: Metric, backend: IndexBackend) -> Result<Index, IndexError> {
        validate::dim(dim)?;
        Ok(Index {
            dim,
            metric,
            backend,
            kernels: Kernels::best(),
            data: RowStore::empty(dim, Dtype::F32)?,
            ids: Vec::new(),
            norms: Vec::new(),
            live: Vec::new(),
            rows_of: IdMap::default(),
            largest: None,
            dead: 0,
            by_id: Vec::new(),
            by_id_rows: Vec::new(),
            sorted_upto: 0,
            resolution: FilterResolution::Auto,
            options: IndexOptions::default(),
            graph: None,
            device: crate::device::DeviceCell::default(),
            certified: OnceLock::new(),
        })
    }

    /// An empty index of `dim`-value rows on `backend`, built with `options`.
    pub fn with_options(
        dim: usize,
        metric: Metric,
        backend: IndexBackend,
        options: &IndexOptions,
    ) -> Result<Index, IndexError> {
        let mut index = Index::new(dim, metric, backend)?;
        options.check()?;
        index.data = RowStore::empty(dim, options.dtype)?;
        index.options = options.clone();
        index.sync_device()?;
        Ok(index)
    }

    /// The options this index was built with.
    pub fn options(&self) -> &IndexOptions {
        &self.options
    }

    /// An index of `rows` with the default ids `0..N-1`.
    pub fn from_rows(
        rows: ArrayView2<'_, f32>,
        metric: Metric,
        backend: IndexBackend,
    ) -> Result<Index, IndexError> {
        // D first: ids are only made for rows that exist.
        validate::dim(rows.ncols())?;
        let ids: Vec<u64> = (0..rows.nrows() as u64).collect();
        Index::with_ids(&ids, rows, metric, backend)
    }

    /// An index of `rows` whose row `i` has id `ids[i]`.
    pub fn with_ids(
        ids: &[u64],
        rows: ArrayView2<'_, f32>,
        metric: Metric,
        backend: IndexBackend,
    ) -> Result<Index, IndexError> {
        let mut index = Index::new(rows.ncols(), metric, backend)?;
        index.add(ids, rows)?;
        Ok(index)
    }

    /// The same index searched by another backend (no copy of the rows is made
    /// beyond the move).
    /// Switching to `hnsw` builds the graph over the live rows (with
    /// [`IndexOptions::progress`]); switching away drops it.
    pub fn with_backend(mut self, backend: IndexBackend) -> Index {
        self.backend = backend;
        self.sync_graph();
        // The `cuda` mirror is uploaded at the first search (or by
        // `Index::sync_device`).
        self.device = crate::device::DeviceCell::default();
        self
    }

    /// The same index resolving filters by `resolution` (results are the
    /// same bytes under every resolution; only the time differs).
    pub fn with_filter_resolution(mut self, resolution: FilterResolution) -> Index {
        self.resolution = resolution;
        self
    }

    /// How this index resolves filters to rows.
    pub fn filter_resolution(&self) -> FilterResolution {
        self.resolution
    }

    /// Number of live rows.
    pub fn len(&self) -> usize {
        self.rows_of.len()
    }

    /// Whether no row is live.
    pub fn is_empty(&self) -> bool {
        self.rows_of.is_empty()
    }

    /// Values per row.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// The metric searches score with.
    pub fn metric(&self) -> Metric {
        self.metric
    }

    /// The backend searches run on.
    pub fn backend(&self) -> IndexBackend {
        self.backend
    }

    /// Rows removed but still stored, until the next compaction.
    pub fn tombstones(&self) -> usize {
        self.dead
    }

    /// Whether `id` is live in the index.
    pub fn contains(&self, id: u64) -> bool {
        self.rows_of.contains_key(&id)
    }

    /// The vector of `id`, when live: the stored values, widened to `f32`
    /// (borrowed for `f32` storage).
    pub fn get(&self, id: u64) -> Option<Cow<'_, [f32]>> {
        self.rows_of.get(&id).map(|&r| self.row(r))
    }

    /// How the rows are stored.
    pub fn dtype(&self) -> Dtype {
        self.data.dtype()
    }

    /// Bytes the stored rows take (tombstoned rows included).
    pub fn stored_bytes(&self) -> usize {
        self.data.bytes()
    }

    /// The live ids, ascending.
    pub fn ids(&self) -> Vec<u64> {
        let mut ids: Vec<u64> = self.rows_of.keys().copied().collect();
        ids.sort_unstable();
        ids
    }

    /// Adds rows under new ids, all or nothing: an id already present, given
    /// twice, or above [`MAX_ID`], a count of ids other than the count of rows,
    /// rows of the wrong width or breaking docs/CONTRACTS.md §4 are errors that
    /// leave the index unchanged.
    pub fn add(&mut self, ids: &[u64], rows: ArrayView2<'_, f32>) -> Result<(), IndexError> {
        let checked = self.check(ids, rows)?;
        if let Some((position, &id)) = ids
            .iter()
            .enumerate()
            .find(|(_, id)| self.rows_of.contains_key(id))
        {
            return Err(IndexError::IdExists { id, position });
        }
        self.device_add(checked.ids, &checked.rows)?;
        self.append(&checked);
        Ok(())
    }

    /// The largest live id, `None` when empty.
    pub fn largest_id(&self) -> Option<u64> {
        self.largest
    }

    /// Adds rows under the ids that follow the largest id present (`0, 1, …`
    /// in an empty index) and returns the first new id (with no rows, the id
    /// the next row would take: `MAX_ID + 1` once `MAX_ID` is present, when
    /// any further row is refused with `IdsExhausted`).
    pub fn add_auto(&mut self, rows: ArrayView2<'_, f32>) -> Result<u64, IndexError> {
        // The shape first: ids are only made for rows that exist.
        if rows.ncols() != self.dim {
            return Err(IndexError::DimensionMismatch {
                expected: self.dim,
                got: rows.ncols(),
            });
        }
        let ids: Vec<u64> = auto_ids(self.largest_id(), rows.nrows())?.collect();
        self.add(&ids, rows)?;
        Ok(ids
            .first()
            .copied()
            .unwrap_or_else(|| self.largest_id().map_or(0, |l| l + 1)))
    }

    /// Replaces the vector of every present id and adds the others, all or
    /// nothing (the checks of [`Index::add`], except that a present id is
    /// expected).
    pub fn upsert(&mut self, ids: &[u64], rows: ArrayView2<'_, f32>) -> Result<(), IndexError> {
        let checked = self.check(ids, rows)?;
        self.device_upsert(checked.ids, &checked.rows)?;
        let d = self.dim;
        let mut fresh_ids = Vec::new();
        let mut fresh_rows = Vec::new();
        let mut replaced = Vec::new();
        for (&id, row) in checked.ids.iter().zip(checked.rows.chunks_exact(d)) {
            match self.rows_of.get(&id) {
                Some(&r) => {
                    self.data.set_row_checked(r, row);
                    if self.metric == Metric::Cosine {
                        self.norms[r] = self.kernels.norm(row);
                    }
                    replaced.push(r);
                    self.graph_replaced(id, row);
                }
                None => {
                    fresh_ids.push(id);
                    fresh_rows.extend_from_slice(row);
                }
            }
        }
        self.rows_changed(&replaced);
        self.append(&Checked {
            ids: &fresh_ids,
            rows: Cow::Owned(fresh_rows),
        });
        Ok(())
    }

    /// Removes the rows of `ids` from every later result and returns how many
    /// were present (absent ids, and repeats, are ignored). Compacts when the
    /// tombstones reach [`COMPACT_FRACTION`] of the stored rows.
    pub fn remove(&mut self, ids: &[u64]) -> usize {
        let mut removed = 0;
        for id in ids {
            if let Some(r) = self.rows_of.remove(id) {
                self.live[r / 64] &= !(1 << (r % 64));
                self.graph_removed(*id);
                removed += 1;
            }
        }
        if removed > 0 {
            self.device_remove(ids);
            if self.largest.is_some_and(|l| !self.rows_of.contains_key(&l)) {
                self.largest = self.rows_of.keys().max().copied();
            }
        }
        self.dead += removed;
        if self.dead > 0 && self.dead as f64 >= COMPACT_FRACTION * self.ids.len() as f64 {
            self.compact();
        }
        removed
    }

    /// Drops every tombstoned row now. Changes no result.
    pub fn compact(&mut self) {
        if self.dead == 0 {
            return;
        }
        self.device_compact();
        let stored = self.ids.len();
        let cosine = self.metric == Metric::Cosine;
        let mut w = 0;
        let mut first_moved = None;
        for r in 0..stored {
            if !self.is_live(r) {
                continue;
            }
            if w != r {
                first_moved.get_or_insert(w);
                self.data.copy_row(r, w);
                self.ids[w] = self.ids[r];
                if cosine {
                    self.norms[w] = self.norms[r];
                }
            }
            w += 1;
        }
        self.data.truncate(w);
        self.ids.truncate(w);
        self.norms.truncate(if cosine { w } else { 0 });
        self.live = full_bitset(w);
        self.rows_changed_from(first_moved.unwrap_or(w));
        self.rows_of = self
            .ids
            .iter()
            .enumerate()
            .map(|(r, &id)| (id, r))
            .collect();
        self.sort_by_id();
        tracing::debug!(dropped = self.dead, rows = w, "index compacted");
        self.dead = 0;
    }

    /// Row `r` of the store as `f32` (borrowed for `f32` storage).
    #[inline]
    pub(crate) fn row(&self, r: usize) -> Cow<'_, [f32]> {
        self.data.row(r)
    }

    /// Whether stored row `r` is live.
    #[inline]
    pub(crate) fn is_live(&self, r: usize) -> bool {
        self.live[r / 64] & (1 << (r % 64)) != 0
    }

    /// Checks what every mutation checks, before anything changes.
    fn check<'a>(
        &self,
        ids: &'a [u64],
        rows: ArrayView2<'a, f32>,
    ) -> Result<Checked<'a>, IndexError> {
        check_rows(self.dim, ids, rows)?;
        let rows = match rows.to_slice() {
            Some(s) => Cow::Borrowed(s),
            None => Cow::Owned(rows.iter().copied().collect()),
        };
        let rows = match check_stored(self.dim, self.data.dtype(), &rows)? {
            Some(stored) => Cow::Owned(stored),
            None => rows,
        };
        Ok(Checked { ids, rows })
    }

    /// Appends checked rows as live rows.
    fn append(&mut self, c: &Checked<'_>) {
        let start = self.ids.len();
        self.data.push_checked(&c.rows);
        self.ids.extend_from_slice(c.ids);
        if self.metric == Metric::Cosine {
            let k = self.kernels;
            self.norms
                .extend(c.rows.chunks_exact(self.dim).map(|r| k.norm(r)));
        }
        self.rows_changed_from(start);
        let stored = self.ids.len();
        self.live.resize(stored.div_ceil(64), 0);
        for r in start..stored {
            self.live[r / 64] |= 1 << (r % 64);
        }
        self.rows_of
            .extend(c.ids.iter().enumerate().map(|(j, &id)| (id, start + j)));
        self.largest = self.largest.max(c.ids.iter().max().copied());
        let unsorted = stored - self.sorted_upto;
        if unsorted as f64 > UNSORTED_FRACTION * self.by_id.len() as f64 {
            self.merge_unsorted();
        }
        self.graph_appended(start);
    }

    /// Rebuilds `by_id` from every live row.
    pub(crate) fn sort_by_id(&mut self) {
        let mut by_id: Vec<(u64, usize)> = (0..self.ids.len())
            .filter(|&r| self.is_live(r))
            .map(|r| (self.ids[r], r))
            .collect();
        by_id.par_sort_unstable();
        (self.by_id, self.by_id_rows) = by_id.into_iter().unzip();
        self.sorted_upto = self.ids.len();
    }

    /// Sorts the live rows appended since `by_id` was last sorted and merges
    /// them in, dropping the entries of rows removed since.
    fn merge_unsorted(&mut self) {
        let mut fresh: Vec<(u64, usize)> = (self.sorted_upto..self.ids.len())
            .filter(|&r| self.is_live(r))
            .map(|r| (self.ids[r], r))
            .collect();
        fresh.sort_unstable();
        let old_ids = std::mem::take(&mut self.by_id);
        let old_rows = std::mem::take(&mut self.by_id_rows);
        let mut merged = Vec::with_capacity(old_ids.len() + fresh.len());
        let mut old = old_ids
            .into_iter()
            .zip(old_rows)
            .filter(|&(_, r)| self.is_live(r))
            .peekable();
        let mut fresh = fresh.into_iter().peekable();
        loop {
            let next = match (old.peek(), fresh.peek()) {
                (Some(a), Some(b)) if a <= b => old.next(),
                (Some(_), Some(_)) | (None, Some(_)) => fresh.next(),
                (Some(_), None) => old.next(),
                (None, None) => break,
            };
            merged.extend(next);
        }
        (self.by_id, self.by_id_rows) = merged.into_iter().unzip();
        self.sorted_upto = self.ids.len();
    }
}

/// A map keyed by id under [`IdHasher`].
pub(crate) type IdMap<V> = HashMap<u64, V, BuildHasherDefault<IdHasher>>;

/// The hash of an id for the id → row map: one multiply and a fold, where
/// the default SipHash costs several times more. A filtered search looks up
/// every id of its filter, so this hash is on the search path.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        // The id's high half is folded in first, so that ids differing only
        // there (tenant << 40, say) still differ in the product's low bits;
        // the product's high half is then folded over the low bits the
        // table indexes with.
        let h = (self.0 ^ (self.0 >> 32)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        h ^ (h >> 29)
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x100_0000_01B3);
        }
    }

    fn write_u64(&mut self, id: u64) {
        self.0 ^= id;
    }
}

/// A bitset of `n` set bits.
pub(crate) fn full_bitset(n: usize) -> Vec<u64> {
    let mut bits = vec![u64::MAX; n / 64];
    if !n.is_multiple_of(64) {
        bits.push((1u64 << (n % 64)) - 1);
    }
    bits
}

/// The ids `add_auto` gives `rows` new rows after the largest id present
/// (`0, 1, …` when there is none); [`IndexError::IdsExhausted`] when they
/// would pass [`MAX_ID`].
pub fn auto_ids(largest: Option<u64>, rows: usize) -> Result<std::ops::Range<u64>, IndexError> {
    let first = largest.map_or(0, |l| l + 1);
    let n = rows as u64;
    if n > 0 && (first > MAX_ID || MAX_ID - first < n - 1) {
        return Err(IndexError::IdsExhausted {
            largest: first.saturating_sub(1),
            rows,
        });
    }
    Ok(first..first + n)
}

/// The rules of docs/CONTRACTS.md §14 for rows stored as `dtype`: the
/// values as stored (an f16 overflow, a norm that rounding pushed over the
/// limit), checked before anything is stored. Returns the stored values
/// widened back to `f32`, or `None` for `f32` storage (nothing to check
/// beyond [`check_rows`]). Errors name rows counted in `rows`.
pub fn check_stored(
    dim: usize,
    dtype: Dtype,
    rows: &[f32],
) -> Result<Option<Vec<f32>>, IndexError> {
    if dtype == Dtype::F32 {
        return Ok(None);
    }
    let mut stored = RowStore::empty(dim, dtype)?;
    stored.push_rows(rows)?;
    Ok(Some(stored.to_f32()))
}

/// The checks of [`Index::add`] and [`Index::upsert`] that need no index:
/// `rows` is `N × dim`, one id per row, every id at most [`MAX_ID`] and given
/// once, and the rows keep docs/CONTRACTS.md §4. A caller that splits one
/// call across several indexes (the shards of `topk-shard`) checks the whole
/// call with this first, so the error names positions in the caller's call.
pub fn check_rows(dim: usize, ids: &[u64], rows: ArrayView2<'_, f32>) -> Result<(), IndexError> {
    if rows.ncols() != dim {
        return Err(IndexError::DimensionMismatch {
            expected: dim,
            got: rows.ncols(),
        });
    }
    if ids.len() != rows.nrows() {
        return Err(IndexError::CountMismatch {
            ids: ids.len(),
            rows: rows.nrows(),
        });
    }
    topk_core::check_ids(ids).map_err(|problem| match problem {
        IdProblem::TooLarge { id, position } => IndexError::IdTooLarge {
            id,
            position,
            max: MAX_ID,
        },
        IdProblem::Repeated { id, first, second } => {
            IndexError::DuplicateInCall { id, first, second }
        }
    })?;
    if rows.nrows() > 0 {
        validate::corpus_view(rows)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::hash::{BuildHasher, BuildHasherDefault};

    use super::IdHasher;

    /// Ids that differ only in their high bits (k << 40) land in as many
    /// table slots (the hash's low bits) as random ids would.
    #[test]
    fn ids_differing_in_high_bits_spread_over_the_table() {
        let build = BuildHasherDefault::<IdHasher>::default();
        for shift in [0, 20, 32, 40, 52] {
            let slots: HashSet<u64> = (0..4096_u64)
                .map(|k| build.hash_one(k << shift) & 0xFFF)
                .collect();
            // 4096 random keys fill about 4096 (1 - 1/e) = 2589 of 4096 slots.
            assert!(slots.len() > 2300, "k << {shift}: {} slots", slots.len());
        }
    }
}

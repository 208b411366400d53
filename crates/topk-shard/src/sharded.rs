//! [`ShardedIndex`]: N [`Index`]es behind one `Index`-like interface
//! (docs/CONTRACTS.md §12).

use ndarray::{s, Array2, ArrayView2, Axis};
use rayon::prelude::*;
use topk_core::{merge_hits, validate, Dtype, Error as CoreError, Hit, Metric, MAX_ID};
use topk_index::{
    auto_ids, check_rows, check_stored, Filter, FilterSpec, Index, IndexBackend, IndexError,
    IndexOptions,
};

use crate::error::ShardError;
use crate::placement::shard_of;

/// How one shard is built: its backend and that backend's options (for a
/// `cuda` shard, [`IndexOptions::cuda`] names its device ordinal).
#[derive(Debug, Clone)]
pub struct ShardSpec {
    /// The shard's backend.
    pub backend: IndexBackend,
    /// Its options.
    pub options: IndexOptions,
}

impl ShardSpec {
    /// A shard on `backend` with default options.
    pub fn new(backend: IndexBackend) -> Self {
        ShardSpec {
            backend,
            options: IndexOptions::default(),
        }
    }

    /// The same shard with `options`.
    pub fn options(mut self, options: IndexOptions) -> Self {
        self.options = options;
        self
    }

    /// A `cuda` shard on device `ordinal`, other options default.
    pub fn cuda(ordinal: usize) -> Self {
        let mut config = topk_cuda::CudaConfig::default();
        config.device = ordinal;
        ShardSpec::new(IndexBackend::Cuda).options(IndexOptions::default().cuda(config))
    }
}

/// A corpus split over N [`Index`] shards by id ([`shard_of`]), searched in
/// parallel and merged with topk-core's comparator ([`merge_hits`]).
///
/// With exact shards (`cpu`, `oracle`, `cuda`, in any mix) every search
/// returns the bytes one [`Index`] over the union of the shards returns: the
/// same ids in the same order with the same score bits, whatever the shard
/// count, the backends or the history (docs/CONTRACTS.md §12). Mutations
/// are all or nothing across the shards. `hnsw` shards are merged the same
/// way; their results are approximate, as on one `hnsw` index.
#[derive(Debug)]
pub struct ShardedIndex {
    pub(crate) dim: usize,
    pub(crate) metric: Metric,
    pub(crate) shards: Vec<Index>,
}

/// The rows of one call that go to one shard.
struct Part {
    /// Positions in the call.
    at: Vec<usize>,
    ids: Vec<u64>,
    rows: Array2<f32>,
}

impl ShardedIndex {
    /// An empty set of `specs.len()` shards of `dim`-value rows.
    pub fn new(dim: usize, metric: Metric, specs: &[ShardSpec]) -> Result<Self, ShardError> {
        if specs.is_empty() {
            return Err(ShardError::NoShards);
        }
        let shards = specs
            .iter()
            .enumerate()
            .map(|(shard, spec)| {
                Index::with_options(dim, metric, spec.backend, &spec.options)
                    .map_err(|source| at_shard(shard, source))
            })
            .collect::<Result<Vec<_>, _>>()?;
        same_storage(&shards)?;
        Ok(ShardedIndex {
            dim,
            metric,
            shards,
        })
    }

    /// `n` shards on the same backend with the same options.
    pub fn uniform(
        dim: usize,
        metric: Metric,
        n: usize,
        spec: &ShardSpec,
    ) -> Result<Self, ShardError> {
        ShardedIndex::new(dim, metric, &vec![spec.clone(); n])
    }

    /// A set from existing indexes, shard `i` being `shards[i]`: every one
    /// must have the same dimension and metric and hold only the ids that
    /// [`shard_of`] places on it.
    pub fn from_shards(shards: Vec<Index>) -> Result<Self, ShardError> {
        let first = shards.first().ok_or(ShardError::NoShards)?;
        let (dim, metric) = (first.dim(), first.metric());
        let n = shards.len();
        for (shard, index) in shards.iter().enumerate() {
            check_shard(shard, index, dim, metric, n)?;
        }
        same_storage(&shards)?;
        Ok(ShardedIndex {
            dim,
            metric,
            shards,
        })
    }

    /// The shards, in placement order.
    pub fn shards(&self) -> &[Index] {
        &self.shards
    }

    /// The shards, given back.
    pub fn into_shards(self) -> Vec<Index> {
        self.shards
    }

    /// Live rows over all shards.
    pub fn len(&self) -> usize {
        self.shards.iter().map(Index::len).sum()
    }

    /// Whether no shard holds a live row.
    pub fn is_empty(&self) -> bool {
        self.shards.iter().all(Index::is_empty)
    }

    /// Vector dimension.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Similarity metric.
    pub fn metric(&self) -> Metric {
        self.metric
    }

    /// Whether `id` is live.
    pub fn contains(&self, id: u64) -> bool {
        self.shard_for(id)
            .is_some_and(|s| self.shards[s].contains(id))
    }

    /// The stored vector of `id`, widened to `f32` (borrowed for `f32` storage).
    pub fn get(&self, id: u64) -> Option<std::borrow::Cow<'_, [f32]>> {
        self.shard_for(id).and_then(|s| self.shards[s].get(id))
    }

    /// Every live id, ascending.
    pub fn ids(&self) -> Vec<u64> {
        let mut ids: Vec<u64> = self.shards.iter().flat_map(Index::ids).collect();
        ids.sort_unstable();
        ids
    }

    /// The shard that holds (or would hold) `id`; `None` above [`MAX_ID`].
    pub fn shard_for(&self, id: u64) -> Option<usize> {
        (id <= MAX_ID).then(|| shard_of(id, self.shards.len()))
    }

    /// Adds rows under new ids, all or nothing across the shards (the rules
    /// and errors of [`Index::add`], positions counted in this call).
    pub fn add(&mut self, ids: &[u64], rows: ArrayView2<'_, f32>) -> Result<(), ShardError> {
        self.check_call(ids, rows)?;
        if let Some((position, &id)) = ids.iter().enumerate().find(|(_, &id)| self.contains(id)) {
            return Err(IndexError::IdExists { id, position }.into());
        }
        self.apply(ids, rows, false)
    }

    /// Adds rows under the ids that follow the largest id of the whole set
    /// (`0, 1, …` when empty) and returns the first new id (with no rows, the id
    /// the next row would take: `MAX_ID + 1` once `MAX_ID` is present, when
    /// any further row is refused with `IdsExhausted`).
    pub fn add_auto(&mut self, rows: ArrayView2<'_, f32>) -> Result<u64, ShardError> {
        // The shape first: ids are only made for rows that exist.
        if rows.ncols() != self.dim {
            return Err(IndexError::DimensionMismatch {
                expected: self.dim,
                got: rows.ncols(),
            }
            .into());
        }
        let largest = self.shards.iter().filter_map(Index::largest_id).max();
        let ids: Vec<u64> = auto_ids(largest, rows.nrows())?.collect();
        self.add(&ids, rows)?;
        Ok(ids
            .first()
            .copied()
            .unwrap_or_else(|| largest.map_or(0, |l| l + 1)))
    }

    /// Replaces the vector of every present id and adds the others, all or
    /// nothing across the shards (the rules of [`Index::upsert`]).
    pub fn upsert(&mut self, ids: &[u64], rows: ArrayView2<'_, f32>) -> Result<(), ShardError> {
        self.check_call(ids, rows)?;
        self.apply(ids, rows, true)
    }

    /// Every input rule of a whole add or upsert, the shards' storage type
    /// included (docs/CONTRACTS.md §12, §14), before any shard changes:
    /// errors name positions in this call.
    fn check_call(&self, ids: &[u64], rows: ArrayView2<'_, f32>) -> Result<(), ShardError> {
        check_rows(self.dim, ids, rows)?;
        let dtype = self.shards.first().map_or(Dtype::F32, Index::dtype);
        if dtype != Dtype::F32 && rows.nrows() > 0 {
            let owned;
            let flat = match rows.to_slice() {
                Some(flat) => flat,
                None => {
                    owned = rows.iter().copied().collect::<Vec<f32>>();
                    &owned
                }
            };
            check_stored(self.dim, dtype, flat)?;
        }
        Ok(())
    }

    /// Removes `ids` from every later result; returns how many were live
    /// (absent ids and repeats are ignored).
    pub fn remove(&mut self, ids: &[u64]) -> usize {
        let n = self.shards.len();
        let mut per: Vec<Vec<u64>> = vec![Vec::new(); n];
        for &id in ids.iter().filter(|&&id| id <= MAX_ID) {
            per[shard_of(id, n)].push(id);
        }
        self.shards
            .par_iter_mut()
            .zip(&per)
            .map(|(shard, ids)| if ids.is_empty() { 0 } else { shard.remove(ids) })
            .sum()
    }

    /// Drops every shard's tombstoned rows now. Changes no result.
    pub fn compact(&mut self) {
        self.shards.par_iter_mut().for_each(Index::compact);
    }

    /// The exact top `min(k, M)` hits of `query` among the `M` live rows of
    /// the whole set that the filter allows, best first: the bytes of one
    /// [`Index`] over the union (exact shards).
    pub fn search(
        &self,
        query: &[f32],
        k: usize,
        filter: Option<&Filter>,
    ) -> Result<Vec<Hit>, ShardError> {
        validate::query(query, self.dim).map_err(IndexError::from)?;
        check_k(k)?;
        let lists = self.fan_out(|shard| shard.search(query, k, filter))?;
        let views: Vec<&[Hit]> = lists.iter().map(Vec::as_slice).collect();
        Ok(merge_hits(&views, k))
    }

    /// [`ShardedIndex::search`] for every row of `queries`, under no filter,
    /// one shared filter or one filter per query. Each shard searches the
    /// whole batch; the merge is per query.
    pub fn search_batch(
        &self,
        queries: ArrayView2<'_, f32>,
        k: usize,
        filter: FilterSpec<'_>,
    ) -> Result<Vec<Vec<Hit>>, ShardError> {
        validate::queries(queries, self.dim).map_err(IndexError::from)?;
        check_k(k)?;
        if let FilterSpec::PerQuery(fs) = filter {
            if fs.len() != queries.nrows() {
                return Err(IndexError::FilterCount {
                    filters: fs.len(),
                    queries: queries.nrows(),
                }
                .into());
            }
        }
        let lists = self.fan_out(|shard| shard.search_batch(queries, k, filter))?;
        Ok((0..queries.nrows())
            .into_par_iter()
            .map(|q| {
                let views: Vec<&[Hit]> = lists.iter().map(|l| l[q].as_slice()).collect();
                merge_hits(&views, k)
            })
            .collect())
    }

    /// Runs `search` on every shard in parallel; the first error (in shard
    /// order) names its shard.
    fn fan_out<T: Send>(
        &self,
        search: impl Fn(&Index) -> Result<T, IndexError> + Sync,
    ) -> Result<Vec<T>, ShardError> {
        let mut results: Vec<Option<Result<T, IndexError>>> =
            self.shards.iter().map(|_| None).collect();
        if let (Some((first, rest)), Some((shard0, others))) =
            (results.split_first_mut(), self.shards.split_first())
        {
            // The calling thread searches shard 0 while the pool's threads
            // take the others: one wake-up less on the latency path.
            let search = &search;
            rayon::in_place_scope(|scope| {
                for (slot, shard) in rest.iter_mut().zip(others) {
                    scope.spawn(move |_| *slot = Some(search(shard)));
                }
                *first = Some(search(shard0));
            });
        }
        results
            .into_iter()
            .enumerate()
            .map(|(i, r)| match r {
                Some(r) => r.map_err(|source| at_shard(i, source)),
                None => Err(ShardError::NoShards),
            })
            .collect()
    }

    /// One call's rows grouped by shard (`None` for a shard they skip).
    fn split(&self, ids: &[u64], rows: ArrayView2<'_, f32>) -> Vec<Option<Part>> {
        let n = self.shards.len();
        let mut at: Vec<Vec<usize>> = vec![Vec::new(); n];
        for (position, &id) in ids.iter().enumerate() {
            at[shard_of(id, n)].push(position);
        }
        at.into_iter()
            .map(|at| {
                (!at.is_empty()).then(|| Part {
                    ids: at.iter().map(|&p| ids[p]).collect(),
                    rows: rows.select(Axis(0), &at),
                    at,
                })
            })
            .collect()
    }

    /// Adds (or upserts) checked rows, a block of [`BLOCK_ROWS`] at a time
    /// so that the rows grouped by shard never cost more than a block's
    /// copy. If a shard fails, every shard is put back as it was before the
    /// call (the ids the call introduced removed, the vectors it replaced
    /// written back) and the failure is returned, its positions counted in
    /// the caller's call.
    fn apply(
        &mut self,
        ids: &[u64],
        rows: ArrayView2<'_, f32>,
        upsert: bool,
    ) -> Result<(), ShardError> {
        let n = self.shards.len();
        let mut fresh: Vec<Vec<u64>> = vec![Vec::new(); n];
        let mut replaced: Vec<Vec<(u64, Vec<f32>)>> = vec![Vec::new(); n];
        let mut start = 0;
        while start < ids.len() {
            let end = (start + BLOCK_ROWS).min(ids.len());
            let parts = self.split(&ids[start..end], rows.slice(s![start..end, ..]));
            for (s, part) in parts.iter().enumerate() {
                let Some(part) = part else { continue };
                if !upsert {
                    fresh[s].extend_from_slice(&part.ids);
                    continue;
                }
                for &id in &part.ids {
                    match self.shards[s].get(id) {
                        Some(old) => replaced[s].push((id, old.to_vec())),
                        None => fresh[s].push(id),
                    }
                }
            }
            let results: Vec<Result<(), IndexError>> = self
                .shards
                .par_iter_mut()
                .zip(&parts)
                .map(|(shard, part)| match part {
                    Some(p) if upsert => shard.upsert(&p.ids, p.rows.view()),
                    Some(p) => shard.add(&p.ids, p.rows.view()),
                    None => Ok(()),
                })
                .collect();
            if let Some(failed) = results.iter().position(Result::is_err) {
                // A shard's failed call changed nothing on it; undoing its
                // block's entries is then a no-op (absent ids are ignored).
                let undone = self.undo(&fresh, &replaced);
                let at: Vec<usize> = parts[failed]
                    .as_ref()
                    .map_or_else(Vec::new, |p| p.at.iter().map(|&a| a + start).collect());
                return match results.into_iter().nth(failed) {
                    Some(Err(e)) => Err(failure(failed, to_call_positions(e, &at), undone)),
                    _ => Ok(()),
                };
            }
            start = end;
        }
        Ok(())
    }

    /// Removes the ids `fresh` introduced and writes back the vectors
    /// `replaced` held, shard by shard. Returns the first shard whose
    /// vectors could not be written back (a GPU shard out of memory, say),
    /// with its error.
    fn undo(
        &mut self,
        fresh: &[Vec<u64>],
        replaced: &[Vec<(u64, Vec<f32>)>],
    ) -> Option<(usize, IndexError)> {
        let dim = self.dim;
        let failed: Vec<Option<IndexError>> = self
            .shards
            .par_iter_mut()
            .enumerate()
            .map(|(s, shard)| {
                shard.remove(&fresh[s]);
                if replaced[s].is_empty() {
                    return None;
                }
                let ids: Vec<u64> = replaced[s].iter().map(|(id, _)| *id).collect();
                let flat: Vec<f32> = replaced[s].iter().flat_map(|(_, v)| v.iter().copied()).collect();
                // The shape holds by construction: each vector has `dim` values.
                let rows = ArrayView2::from_shape((ids.len(), dim), &flat).ok()?;
                let e = shard.upsert(&ids, rows).err()?;
                tracing::error!(shard = s, error = %e, "could not restore the vectors an upsert replaced");
                Some(e)
            })
            .collect();
        failed
            .into_iter()
            .enumerate()
            .find_map(|(s, e)| e.map(|e| (s, e)))
    }
}

/// Rows of one call grouped by shard at a time (1 GiB of rows at D = 1024).
const BLOCK_ROWS: usize = 1 << 18;

/// A shard's error, with the row positions it names mapped back to the call.
fn to_call_positions(error: IndexError, at: &[usize]) -> IndexError {
    let call = |p: usize| at.get(p).copied().unwrap_or(p);
    match error {
        IndexError::IdExists { id, position } => IndexError::IdExists {
            id,
            position: call(position),
        },
        other => other,
    }
}

/// The error of a call that failed on `shard`: the shard's own, or, where
/// putting the shards back failed too (`undone`), one that says which shard
/// keeps the call's vectors.
fn failure(shard: usize, source: IndexError, undone: Option<(usize, IndexError)>) -> ShardError {
    match undone {
        None => at_shard(shard, source),
        Some((restored, restore_error)) => ShardError::RollbackFailed {
            shard,
            source,
            restored,
            restore_error: Box::new(restore_error),
        },
    }
}

pub(crate) fn at_shard(shard: usize, source: IndexError) -> ShardError {
    ShardError::Shard { shard, source }
}

fn check_k(k: usize) -> Result<(), ShardError> {
    if k == 0 {
        return Err(IndexError::from(CoreError::ZeroK).into());
    }
    Ok(())
}

/// Every shard stores its rows as shard 0 does: a result must not depend on
/// which shard holds a row (docs/CONTRACTS.md §12, §14).
pub(crate) fn same_storage(shards: &[Index]) -> Result<(), ShardError> {
    let Some(first) = shards.first() else {
        return Ok(());
    };
    match shards.iter().position(|s| s.dtype() != first.dtype()) {
        Some(shard) => Err(ShardError::ShardMismatch {
            shard,
            what: "storage type",
            found: shards[shard].dtype().to_string(),
            expected: first.dtype().to_string(),
        }),
        None => Ok(()),
    }
}

/// Shard `shard` of `n` agrees with the set and holds only its own ids.
pub(crate) fn check_shard(
    shard: usize,
    index: &Index,
    dim: usize,
    metric: Metric,
    n: usize,
) -> Result<(), ShardError> {
    if index.dim() != dim {
        return Err(ShardError::ShardMismatch {
            shard,
            what: "dimension",
            found: index.dim().to_string(),
            expected: dim.to_string(),
        });
    }
    if index.metric() != metric {
        return Err(ShardError::ShardMismatch {
            shard,
            what: "metric",
            found: index.metric().to_string(),
            expected: metric.to_string(),
        });
    }
    if let Some(id) = index.ids().into_iter().find(|&id| shard_of(id, n) != shard) {
        return Err(ShardError::Misplaced {
            shard,
            id,
            expected: shard_of(id, n),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_rollback_names_the_shard_that_keeps_the_call() {
        let plain = failure(2, CoreError::ZeroK.into(), None);
        assert!(
            matches!(plain, ShardError::Shard { shard: 2, .. }),
            "{plain}"
        );
        let restore_error = IndexError::Cuda {
            reason: "out of device memory".into(),
        };
        let e = failure(2, CoreError::ZeroK.into(), Some((0, restore_error)));
        let text = e.to_string();
        assert!(text.starts_with("shard 2: "), "{text}");
        assert!(text.contains("putting shard 0 back then failed"), "{text}");
        assert!(text.contains("out of device memory"), "{text}");
        assert!(matches!(
            e,
            ShardError::RollbackFailed {
                shard: 2,
                restored: 0,
                ..
            }
        ));
    }
}

//! [`CudaResident`]: the plugin's mutable resident corpus, with this
//! crate's error type; rows of a mutation checked here, where the errors can
//! be typed.

use topk_core::{validate, Dtype, Hit, Metric};

use crate::abi::{self, metric_code, PluginConfig};
use crate::ffi::{self, CallError, Queries};
use crate::{call_error, plugin, result_buffers, CudaConfig, EngineErrorKind, IdFilter, LoadError};

/// A mutable GPU-resident corpus inside the plugin
/// (`topk_cuda::ResidentCorpus`, docs/CONTRACTS.md §10): rows with external
/// ids, added, upserted and removed on the device, searched exactly with or
/// without allow-lists. Mutations take `&mut self`; searches `&self`, from
/// any number of threads.
#[derive(Debug)]
pub struct CudaResident {
    inner: ffi::Resident,
    dim: usize,
    metric: Metric,
    live: usize,
}

impl CudaResident {
    /// An empty corpus of `dim`-value rows with device room for `capacity`
    /// rows before its first growth.
    ///
    /// Errors: `dim` out of range ([`LoadError::Input`]), then whatever keeps
    /// the plugin from loading, then the engine's own.
    pub fn open(
        dim: usize,
        metric: Metric,
        capacity: usize,
        config: &CudaConfig,
    ) -> Result<CudaResident, LoadError> {
        Self::open_as(dim, Dtype::F32, metric, capacity, config)
    }

    /// [`Self::open`] for rows stored as `dtype` on the device
    /// (docs/CONTRACTS.md §14): added rows are rounded once to it.
    pub fn open_as(
        dim: usize,
        dtype: Dtype,
        metric: Metric,
        capacity: usize,
        config: &CudaConfig,
    ) -> Result<CudaResident, LoadError> {
        validate::dim(dim)?;
        let p = plugin()?;
        let inner = p
            .resident_open(
                dim,
                metric_code(metric),
                capacity,
                &PluginConfig::from_config(config).with_dtype(dtype),
            )
            .map_err(|e| call_error(p.path(), e))?;
        Ok(CudaResident {
            inner,
            dim,
            metric,
            live: 0,
        })
    }

    fn fail(&self, e: CallError) -> LoadError {
        call_error(self.inner.plugin().path(), e)
    }

    fn mutate(&mut self, op: u32, ids: &[u64], rows: &[f32]) -> Result<usize, LoadError> {
        let out = self
            .inner
            .mutate(op, ids, rows, self.dim)
            .map_err(|e| self.fail(e));
        // Whatever happened, the counts are the plugin's.
        self.live = self.inner.info().map_err(|e| self.fail(e))?.live;
        out
    }

    /// Adds rows under new ids, all or nothing (`topk_cuda::ResidentCorpus::add`).
    pub fn add(&mut self, ids: &[u64], rows: &[f32]) -> Result<(), LoadError> {
        self.mutate_rows(abi::MUTATE_ADD, ids, rows)
    }

    /// Replaces the rows of live ids and adds the others, all or nothing.
    pub fn upsert(&mut self, ids: &[u64], rows: &[f32]) -> Result<(), LoadError> {
        self.mutate_rows(abi::MUTATE_UPSERT, ids, rows)
    }

    /// An add or upsert. The engine checks the rows' values; only when it
    /// refuses them are they checked here too, to type its error (the rows
    /// are not read an extra time on the way in).
    fn mutate_rows(&mut self, op: u32, ids: &[u64], rows: &[f32]) -> Result<(), LoadError> {
        if ids.len().checked_mul(self.dim) != Some(rows.len()) {
            return check_rows(ids, rows, self.dim);
        }
        match self.mutate(op, ids, rows) {
            Ok(_) => Ok(()),
            Err(
                e @ LoadError::Engine {
                    kind: EngineErrorKind::InvalidInput,
                    ..
                },
            ) => check_rows(ids, rows, self.dim).and(Err(e)),
            Err(e) => Err(e),
        }
    }

    /// Removes ids; returns how many were live.
    pub fn remove(&mut self, ids: &[u64]) -> Result<usize, LoadError> {
        self.mutate(abi::MUTATE_REMOVE, ids, &[])
    }

    /// Drops removed rows from the device (changes no result).
    pub fn compact(&mut self) -> Result<(), LoadError> {
        self.mutate(abi::MUTATE_COMPACT, &[], &[]).map(|_| ())
    }

    /// Live rows.
    pub fn len(&self) -> usize {
        self.live
    }

    /// Whether no row is live.
    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// Values per row.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// The metric searches score with.
    pub fn metric(&self) -> Metric {
        self.metric
    }

    /// Rows the device buffers hold before the next growth, and rows stored
    /// (removed ones included).
    pub fn capacity_and_stored(&self) -> Result<(usize, usize), LoadError> {
        let info = self.inner.info().map_err(|e| self.fail(e))?;
        Ok((info.capacity, info.stored))
    }

    /// The exact top-`k` allowed live rows of each row-major query: at most
    /// `min(k, allowed)` hits each, by descending score, equal scores by
    /// ascending id.
    pub fn search(
        &self,
        queries: &[f32],
        k: usize,
        filter: IdFilter<'_>,
    ) -> Result<Vec<Vec<Hit>>, LoadError> {
        let nq = validate::queries_rowmajor(queries, self.dim)?;
        self.search_on(Queries::Host(queries), nq, k, filter)
    }

    /// As [`Self::search`], for `nq` queries of D floats already in device
    /// memory at `queries` (an address of this process's CUDA context, as
    /// torch's `data_ptr()` gives), read on the device with no copy through
    /// the host, after the work queued on the raw CUDA stream `stream` (0:
    /// the default stream). The driver checks that the address lies in a
    /// device allocation long enough for the queries, and the engine checks
    /// their values by docs/CONTRACTS.md §4; the memory must stay allocated
    /// and unchanged for the call (freed memory would be read as garbage or
    /// fault the device, never host memory).
    pub fn search_device(
        &self,
        queries: u64,
        nq: usize,
        k: usize,
        filter: IdFilter<'_>,
        stream: u64,
    ) -> Result<Vec<Vec<Hit>>, LoadError> {
        self.search_on(
            Queries::Device {
                address: queries,
                stream,
            },
            nq,
            k,
            filter,
        )
    }

    fn search_on(
        &self,
        source: Queries<'_>,
        nq: usize,
        k: usize,
        filter: IdFilter<'_>,
    ) -> Result<Vec<Vec<Hit>>, LoadError> {
        let d = self.dim;
        if k == 0 {
            return Err(topk_core::Error::ZeroK.into());
        }
        if let IdFilter::PerQuery(lists) = filter {
            if lists.len() != nq {
                return Err(topk_core::Error::InvalidParameter {
                    name: "filter",
                    value: format!("{} lists", lists.len()),
                    reason: format!("one allow-list per query is needed: {nq} queries"),
                }
                .into());
            }
        }
        if nq == 0 {
            return Ok(Vec::new());
        }
        let stride = k.min(self.live);
        // Before the filter is flattened: an `nq` past memory (a count of
        // values given for a count of queries) is an error, never an abort.
        let (mut ids, mut scores, mut counts) = result_buffers::<u64>(nq, stride, k)?;
        let (flat, offsets): (Vec<u64>, Vec<usize>);
        let wire = match filter {
            IdFilter::All => (abi::FILTER_NONE, &[][..], &[][..]),
            IdFilter::Shared(ids) => {
                offsets = vec![0, ids.len()];
                (abi::FILTER_SHARED, ids, &offsets[..])
            }
            IdFilter::PerQuery(lists) => {
                let mut o = Vec::with_capacity(nq + 1);
                o.push(0);
                let mut f = Vec::with_capacity(lists.iter().map(|l| l.len()).sum());
                for l in lists {
                    f.extend_from_slice(l);
                    o.push(f.len());
                }
                (flat, offsets) = (f, o);
                (abi::FILTER_PER_QUERY, &flat[..], &offsets[..])
            }
        };
        self.inner
            .search(
                source,
                d,
                k,
                wire,
                stride,
                &mut ids,
                &mut scores,
                &mut counts,
            )
            .map_err(|e| self.fail(e))?;
        Ok(counts
            .iter()
            .enumerate()
            .map(|(i, &c)| {
                let at = i * stride;
                let c = c.min(stride);
                ids[at..at + c]
                    .iter()
                    .zip(&scores[at..at + c])
                    .map(|(&id, &s)| Hit::new(id, s))
                    .collect()
            })
            .collect())
    }
}

/// The rows of an add or upsert by the input rules, with this crate's typed
/// errors: one row of `dim` values per id, every value finite, every
/// squared norm in range (docs/CONTRACTS.md §4).
fn check_rows(ids: &[u64], rows: &[f32], dim: usize) -> Result<(), LoadError> {
    if ids.len().checked_mul(dim) != Some(rows.len()) {
        return Err(topk_core::Error::InvalidParameter {
            name: "rows",
            value: format!("{} values", rows.len()),
            reason: format!("{} ids need as many rows of D = {dim}", ids.len()),
        }
        .into());
    }
    if !rows.is_empty() {
        validate::corpus_values(rows, dim)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_of_a_mutation_are_checked_with_typed_errors() {
        assert!(check_rows(&[1, 2], &[0.5; 6], 3).is_ok());
        assert!(check_rows(&[], &[], 3).is_ok());
        let e = check_rows(&[1, 2], &[0.5; 5], 3).expect_err("ragged");
        assert!(matches!(e, LoadError::Input(_)), "{e:?}");
        assert!(
            e.to_string().contains("2 ids need as many rows of D = 3"),
            "{e}"
        );
        let e = check_rows(&[1], &[0.5, f32::NAN, 0.5], 3).expect_err("NaN");
        assert!(
            matches!(e, LoadError::Input(topk_core::Error::NonFinite { .. })),
            "{e:?}"
        );
        let e = check_rows(&[1], &[2f32.powi(51), 0.0, 0.0], 3).expect_err("norm");
        assert!(
            matches!(e, LoadError::Input(topk_core::Error::NormTooLarge { .. })),
            "{e:?}"
        );
    }
}

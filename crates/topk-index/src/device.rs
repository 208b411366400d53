//! The `cuda` backend of [`Index`]: the live rows mirrored on the GPU by a
//! `topk_cuda::ResidentCorpus` (through topk-cuda-loader, so that nothing
//! here links the NVIDIA driver), mutated with the host rows and searched
//! there (docs/CONTRACTS.md §10).
//!
//! The host keeps every row as well: it is what `save` writes, what `get`
//! reads, and what the mirror is rebuilt from. A mutation changes the device
//! first and the host rows only once the device has taken it, so a device
//! refusal (out of memory, say) leaves both as they were. A device failure
//! that may have stopped part way (a driver fault in an add or upsert) or
//! that came after the host changed (a removal or compaction that the
//! driver refused) marks the mirror failed: searches then say so, and
//! [`Index::sync_device`] uploads the host rows again.

use std::sync::OnceLock;

use topk_core::Hit;
use topk_cuda_loader::{CudaResident, EngineErrorKind, IdFilter, LoadError};

use crate::error::IndexError;
use crate::filter::FilterSpec;
use crate::index::Index;
use crate::options::IndexBackend;

/// Rows per add call when the mirror is built from the host rows: bounds
/// the temporary copy of rows in id order to about 64 MiB at D = 1024.
const UPLOAD_ROWS: usize = 16_384;

/// The device mirror of an `Index`: built on first need, or failed with the
/// reason a mutation left it failed. A clone of an `Index` starts with an
/// empty cell and uploads its own mirror when first searched.
#[derive(Default)]
pub(crate) struct DeviceCell(OnceLock<Result<CudaResident, String>>);

impl Clone for DeviceCell {
    fn clone(&self) -> Self {
        DeviceCell::default()
    }
}

impl std::fmt::Debug for DeviceCell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0.get() {
            None => f.write_str("DeviceCell(not uploaded)"),
            Some(Ok(r)) => write!(f, "DeviceCell({} rows)", r.len()),
            Some(Err(e)) => write!(f, "DeviceCell(failed: {e})"),
        }
    }
}

impl DeviceCell {
    /// The mirror, when built and healthy.
    fn ready_mut(&mut self) -> Option<&mut CudaResident> {
        match self.0.get_mut() {
            Some(Ok(r)) => Some(r),
            _ => None,
        }
    }

    /// The error of an add or upsert the device refused. Running out of
    /// memory and refused input change nothing there (docs/CONTRACTS.md
    /// §10), so the mirror stays; any other failure may have stopped part
    /// way, so the mirror is marked failed.
    fn refused(&mut self, op: &str, e: LoadError) -> IndexError {
        let reason = e.to_string();
        if !leaves_device_unchanged(&e) {
            self.fail(op, &reason);
        }
        IndexError::Cuda { reason }
    }

    /// Marks the mirror failed.
    fn fail(&mut self, op: &str, e: impl std::fmt::Display) {
        tracing::error!(op, error = %e, "the cuda mirror failed; searches fail until Index::sync_device");
        self.0 = OnceLock::new();
        let _ = self.0.set(Err(format!("{op} on the device failed: {e}")));
    }
}

/// Whether a failed add or upsert left the device rows as they were: the
/// engine's mutations are all or nothing for memory and input
/// (docs/CONTRACTS.md §10), not for a driver fault between their steps.
fn leaves_device_unchanged(e: &LoadError) -> bool {
    matches!(
        e,
        LoadError::Input(_)
            | LoadError::Engine {
                kind: EngineErrorKind::OutOfMemory
                    | EngineErrorKind::InvalidInput
                    | EngineErrorKind::InvalidOption,
                ..
            }
    )
}

impl Index {
    /// Uploads the live rows to a fresh device mirror (the `cuda` backend),
    /// replacing any mirror there was, failed or not. Errors: no CUDA backend
    /// here (the message says what is missing), or the device's own.
    pub fn sync_device(&mut self) -> Result<(), IndexError> {
        self.device = DeviceCell::default();
        if self.backend != IndexBackend::Cuda {
            return Ok(());
        }
        let built = self.upload_mirror();
        let outcome = built
            .as_ref()
            .map(|_| ())
            .map_err(|e| IndexError::Cuda { reason: e.clone() });
        let _ = self.device.0.set(built);
        outcome
    }

    /// A new mirror holding the live rows.
    fn upload_mirror(&self) -> Result<CudaResident, String> {
        let live = self.len();
        let capacity = self.options.capacity.max(live).max(1);
        // The device stores the rows as the index does (half the bytes for
        // f16 / bf16): the widened rows below round back to the same bits.
        let mut r = CudaResident::open_as(
            self.dim,
            self.data.dtype(),
            self.metric,
            capacity,
            &self.options.cuda,
        )
        .map_err(|e| e.to_string())?;
        let rows: Vec<usize> = (0..self.ids.len()).filter(|&r| self.is_live(r)).collect();
        let mut values = Vec::with_capacity(UPLOAD_ROWS.min(rows.len()) * self.dim);
        for part in rows.chunks(UPLOAD_ROWS) {
            values.clear();
            let ids: Vec<u64> = part.iter().map(|&row| self.ids[row]).collect();
            for &row in part {
                values.extend_from_slice(&self.row(row));
            }
            r.add(&ids, &values).map_err(|e| e.to_string())?;
        }
        tracing::debug!(rows = live, capacity, "index rows uploaded to the device");
        Ok(r)
    }

    /// The mirror, built now if it was not (a clone, or an index switched
    /// to `cuda`). A build that fails is not kept: the next search tries
    /// again (the device may have freed memory since); only a mirror that
    /// failed under a mutation waits for [`Index::sync_device`].
    fn mirror(&self) -> Result<&CudaResident, IndexError> {
        let failed = |reason: &String| IndexError::Cuda {
            reason: reason.clone(),
        };
        if let Some(built) = self.device.0.get() {
            return built.as_ref().map_err(failed);
        }
        let r = self.upload_mirror().map_err(|e| failed(&e))?;
        // Another search of this `&Index` may have built one meanwhile:
        // either mirror holds the same rows, and the first one set is kept.
        let _ = self.device.0.set(Ok(r));
        match self.device.0.get() {
            Some(built) => built.as_ref().map_err(failed),
            None => Err(IndexError::Cuda {
                reason: "the device mirror was built but not kept".to_owned(),
            }),
        }
    }

    /// Adds checked rows on the device before the host takes them.
    pub(crate) fn device_add(&mut self, ids: &[u64], rows: &[f32]) -> Result<(), IndexError> {
        match self.device.ready_mut() {
            Some(r) => match r.add(ids, rows) {
                Ok(()) => Ok(()),
                Err(e) => Err(self.device.refused("add", e)),
            },
            None => Ok(()),
        }
    }

    /// Upserts checked rows on the device before the host takes them.
    pub(crate) fn device_upsert(&mut self, ids: &[u64], rows: &[f32]) -> Result<(), IndexError> {
        match self.device.ready_mut() {
            Some(r) => match r.upsert(ids, rows) {
                Ok(()) => Ok(()),
                Err(e) => Err(self.device.refused("upsert", e)),
            },
            None => Ok(()),
        }
    }

    /// Removes ids on the device (the host has removed them).
    pub(crate) fn device_remove(&mut self, ids: &[u64]) {
        if let Some(r) = self.device.ready_mut() {
            if let Err(e) = r.remove(ids) {
                self.device.fail("remove", e);
            }
        }
    }

    /// Compacts the device rows with the host's. A compaction the device
    /// refused for memory changed nothing there, and device rows are found
    /// by id, so the mirror with its removed rows still stored stays right
    /// (it compacts at a later call); any other failure marks it failed.
    pub(crate) fn device_compact(&mut self) {
        if let Some(r) = self.device.ready_mut() {
            if let Err(e) = r.compact() {
                if leaves_device_unchanged(&e) {
                    tracing::warn!(error = %e, "device compaction refused; removed rows stay stored there until the next one");
                } else {
                    self.device.fail("compact", e);
                }
            }
        }
    }

    /// [`Index::search_batch`] of `nq` queries of D floats already in GPU
    /// memory at the device address `queries` (as torch's `data_ptr()` or
    /// `__cuda_array_interface__` gives), read there with no copy through
    /// the host, after the work queued on the raw CUDA stream `stream` (0:
    /// the default stream). Only the `cuda` backend takes device queries.
    /// The driver checks that the address lies in a device allocation long
    /// enough for the queries and the device checks their values
    /// (docs/CONTRACTS.md §4); the memory must stay allocated and unchanged
    /// during the call. Hits come back to the host.
    pub fn search_device(
        &self,
        queries: u64,
        nq: usize,
        k: usize,
        filter: FilterSpec<'_>,
        stream: u64,
    ) -> Result<Vec<Vec<Hit>>, IndexError> {
        if self.backend != IndexBackend::Cuda {
            return Err(IndexError::DeviceQueries {
                backend: self.backend.as_str(),
            });
        }
        if k == 0 {
            return Err(topk_core::Error::ZeroK.into());
        }
        if let FilterSpec::PerQuery(fs) = filter {
            if fs.len() != nq {
                return Err(IndexError::FilterCount {
                    filters: fs.len(),
                    queries: nq,
                });
            }
        }
        let r = self.mirror()?;
        let lists: Vec<&[u64]>;
        let spec = match filter {
            FilterSpec::None => IdFilter::All,
            FilterSpec::Shared(f) => IdFilter::Shared(f.ids()),
            FilterSpec::PerQuery(fs) => {
                lists = fs.iter().map(|f| f.ids()).collect();
                IdFilter::PerQuery(&lists)
            }
        };
        r.search_device(queries, nq, k, spec, stream)
            .map_err(|e| match e {
                topk_cuda_loader::LoadError::Engine {
                    kind: topk_cuda_loader::EngineErrorKind::InvalidInput,
                    message,
                } => IndexError::DeviceInput { reason: message },
                other => IndexError::Cuda {
                    reason: other.to_string(),
                },
            })
    }

    /// A checked batch searched on the device.
    pub(crate) fn device_search(
        &self,
        queries: &[f32],
        k: usize,
        filter: FilterSpec<'_>,
    ) -> Result<Vec<Vec<Hit>>, IndexError> {
        let r = self.mirror()?;
        let lists: Vec<&[u64]>;
        let spec = match filter {
            FilterSpec::None => IdFilter::All,
            FilterSpec::Shared(f) => IdFilter::Shared(f.ids()),
            FilterSpec::PerQuery(fs) => {
                lists = fs.iter().map(|f| f.ids()).collect();
                IdFilter::PerQuery(&lists)
            }
        };
        r.search(queries, k, spec).map_err(|e| IndexError::Cuda {
            reason: e.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn engine(kind: EngineErrorKind) -> LoadError {
        LoadError::Engine {
            kind,
            message: format!("{kind}"),
        }
    }

    #[test]
    fn only_memory_and_input_refusals_keep_the_mirror() {
        assert!(leaves_device_unchanged(&engine(
            EngineErrorKind::OutOfMemory
        )));
        assert!(leaves_device_unchanged(&engine(
            EngineErrorKind::InvalidInput
        )));
        assert!(leaves_device_unchanged(&LoadError::Input(
            topk_core::Error::ZeroK
        )));
        for kind in [
            EngineErrorKind::Driver,
            EngineErrorKind::Panic,
            EngineErrorKind::Other,
            EngineErrorKind::BadArgument,
        ] {
            assert!(!leaves_device_unchanged(&engine(kind)), "{kind}");
        }
    }
}

//! The f16 copy of an engine's f32 rows that its Hopper bounds multiply
//! (`Tuning::shadow_bounds`, docs/CONTRACTS.md §5): when an engine keeps
//! one, its room, and its remaking after rows change.

use std::sync::Mutex;

use cust::memory::DeviceBuffer;
use topk_core::Dtype;

use crate::driver::{alloc, DevSlice, RowBuf};
use crate::engine::Engine;
use crate::error::{CudaError, DriverResult};
use crate::launch::{self, Queue};
use crate::plan::Planner;
use crate::slot::Slot;
use crate::CudaConfig;

/// The f16 copy of an engine's f32 rows that its Hopper bounds multiply
/// (`Tuning::shadow_bounds`, docs/CONTRACTS.md §5): each row scaled by a
/// power of two and rounded, and each row's inverse scale.
pub(crate) struct Shadow {
    rows: RowBuf,
    rinv: DeviceBuffer<f32>,
    /// Whether the copy matches the rows in use. Rows that change mark it
    /// stale (they take `&mut` of the engine, so no search is in flight);
    /// the next filtered chunk makes it again under this lock and waits
    /// for it, so no search reads a copy being written.
    fresh: Mutex<bool>,
}

impl Shadow {
    /// Device bytes of the copy of `capacity` rows of `d` values.
    pub(crate) fn bytes(capacity: usize, d: usize) -> usize {
        capacity * (2 * d + 4)
    }

    /// Room for the copy of `capacity` rows of `d` values, stale.
    pub(crate) fn alloc(capacity: usize, d: usize) -> Result<Self, CudaError> {
        Ok(Shadow {
            rows: RowBuf::alloc("f16 copy of the rows", Dtype::F16, capacity * d)?,
            rinv: alloc::<f32>("row scales of the f16 copy", capacity)?,
            fresh: Mutex::new(false),
        })
    }

    /// Marks the copy stale: rows changed.
    pub(crate) fn stale(&mut self) {
        *self.fresh.get_mut().unwrap_or_else(|p| p.into_inner()) = false;
    }
}

impl Engine {
    /// Whether an engine of `d` values a row stored as `dtype` asks for the
    /// f16 copy of its rows: f32 rows, D % 8 == 0 (the f16 products' step),
    /// D at least `shadow_min_dim`, `shadow_bounds` and `wgmma_bounds` on.
    /// It keeps one where, besides, the device runs the f16 Hopper bounds,
    /// filtered batches can run, and the copy fits.
    pub(crate) fn shadow_wanted(d: usize, dtype: Dtype, config: &CudaConfig) -> bool {
        let t = &config.tuning;
        dtype == Dtype::F32
            && d % 8 == 0
            && d >= t.shadow_min_dim
            && t.shadow_bounds
            && t.wgmma_bounds
    }

    /// Room for the f16 copy of `capacity` rows where this engine keeps
    /// one: `None` where it does not, or where the copy's memory is not
    /// there (the TF32 bounds serve; nothing else changes).
    pub(crate) fn shadow_for(&self, capacity: usize) -> Result<Option<Shadow>, CudaError> {
        if !(Self::shadow_wanted(self.dim(), self.dtype(), &self.config)
            && self.kernels.shadows()
            && Planner::filter_fits(capacity, self.dim(), &self.config))
        {
            return Ok(None);
        }
        match Shadow::alloc(capacity, self.dim()) {
            Ok(s) => Ok(Some(s)),
            Err(e @ CudaError::OutOfMemory { .. }) => {
                tracing::warn!("topk-cuda: no f16 copy of the rows, TF32 bounds: {e}");
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// The f16 copy of the rows in use for a filtered chunk on `slot`,
    /// made first (and waited for) where rows changed since it was last
    /// made; `None` where the engine keeps none.
    pub(crate) fn shadow_rows(
        &self,
        slot: &Slot,
    ) -> Result<Option<launch::ShadowRows<'_>>, CudaError> {
        let Some(sh) = &self.shadow else {
            return Ok(None);
        };
        let d = self.dim();
        let copy = launch::ShadowRows {
            rows: sh
                .rows
                .view()
                .range("f16 copy of the rows", 0, self.n * d)?,
            rinv: DevSlice::of(&sh.rinv).range("row scales of the f16 copy", 0, self.n)?,
        };
        let mut fresh = sh.fresh.lock().unwrap_or_else(|p| p.into_inner());
        if !*fresh {
            if self.n > 0 {
                let rows = self.corpus.view().range("corpus", 0, self.n * d)?;
                self.kernels.rows16(
                    Queue::Stream(slot.stream.as_inner()),
                    rows,
                    self.n as u32,
                    d as u32,
                    copy,
                )?;
                slot.stream
                    .synchronize()
                    .op("cuStreamSynchronize (f16 copy of the rows)")?;
            }
            *fresh = true;
        }
        Ok(Some(copy))
    }
}

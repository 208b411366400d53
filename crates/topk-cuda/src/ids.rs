//! Canonical scores of listed rows per query: the HNSW crate's batched
//! distances, through the corpus already on the device.

use topk_core::{validate, Metric};

use crate::driver::DevSlice;
use crate::engine::Engine;
use crate::error::{CudaError, DriverResult};
use crate::launch::{self, Queue};
use crate::slot::BATCH_CHUNK;

impl Engine {
    /// Canonical scores of listed rows per query (the graph index's batched
    /// distance step).
    pub(crate) fn score_ids(
        &self,
        queries: &[f32],
        ids: &[u32],
        offsets: &[usize],
        out: &mut [f32],
    ) -> Result<(), CudaError> {
        let d = self.dim();
        if queries.len() % d != 0 {
            return Err(CudaError::Input(topk_core::Error::DimensionMismatch {
                what: format!("score_ids queries ({} values)", queries.len()),
                expected: d,
                got: queries.len() % d,
            }));
        }
        let nq = queries.len() / d;
        for (i, q) in queries.chunks(d).enumerate() {
            validate::query_at(q, d, i)?;
        }
        let max_queries = self.config.max_batch.min(BATCH_CHUNK);
        if nq > max_queries {
            return Err(CudaError::OverCapacity {
                what: "queries",
                got: nq,
                max: max_queries,
            });
        }
        let max_gather = self.config.tuning.max_gather;
        if ids.len() > max_gather {
            return Err(CudaError::OverCapacity {
                what: "ids",
                got: ids.len(),
                max: max_gather,
            });
        }
        if offsets.len() != nq + 1
            || offsets.first() != Some(&0)
            || offsets.last() != Some(&ids.len())
            || offsets.windows(2).any(|w| w[0] > w[1])
        {
            return Err(CudaError::BadOffsets {
                reason: format!(
                    "offsets must have {} non-decreasing entries from 0 to {} (got {:?})",
                    nq + 1,
                    ids.len(),
                    offsets
                ),
            });
        }
        if out.len() != ids.len() {
            return Err(CudaError::BadOffsets {
                reason: format!("out has {} slots for {} ids", out.len(), ids.len()),
            });
        }
        if let Some((position, &id)) = ids
            .iter()
            .enumerate()
            .find(|(_, &id)| id as usize >= self.len())
        {
            return Err(CudaError::RowIdOutOfRange {
                id,
                position,
                n: self.len(),
            });
        }
        if ids.is_empty() {
            return Ok(());
        }
        let mut slot = self.slot()?;
        let slot = &mut *slot;
        Self::stage_queries(slot, queries)?;
        let count = ids.len();
        slot.ids_host.as_mut_slice()[..count].copy_from_slice(ids);
        let owner = &mut slot.owner_host.as_mut_slice()[..count];
        for (q, w) in offsets.windows(2).enumerate() {
            owner[w[0]..w[1]].fill(q as u32);
        }
        let s = Queue::Stream(slot.stream.as_inner());
        let ids_dev = DevSlice::of(&slot.ids).range("gather ids", 0, count)?;
        let owner_dev = DevSlice::of(&slot.owner).range("gather owners", 0, count)?;
        launch::h2d(s, ids_dev, &slot.ids_host, 0, count)?;
        launch::h2d(s, owner_dev, &slot.owner_host, 0, count)?;
        let qview = slot.queries_at(d, 0, nq)?;
        if self.metric() == Metric::Cosine {
            self.kernels
                .norms(s, qview, nq as u32, d as u32, DevSlice::of(&slot.qnorm))?;
        }
        let ops = self.operands(slot, qview, nq);
        let scores_dev = DevSlice::of(&slot.id_scores).range("gather scores", 0, count)?;
        self.kernels
            .score_ids(s, self.metric(), &ops, ids_dev, owner_dev, scores_dev)?;
        launch::d2h(s, &mut slot.id_scores_host, scores_dev)?;
        slot.stream.synchronize().op("cuStreamSynchronize")?;
        out.copy_from_slice(&slot.id_scores_host.as_slice()[..count]);
        Ok(())
    }
}

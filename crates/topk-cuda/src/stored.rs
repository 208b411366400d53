//! The rows an engine starts with, and their upload to the device as the
//! corpus stores them (docs/CONTRACTS.md §14).

use topk_core::{validate, Dtype};

use crate::driver::RowBuf;
use crate::error::CudaError;
use crate::launch;

/// The rows an engine starts with: f32 values, or the bits of a half-width
/// store's values.
#[derive(Clone, Copy)]
pub(crate) enum Source<'a> {
    F32(&'a [f32]),
    Bits16(&'a [u16], Dtype),
}

impl Source<'_> {
    /// The storage type of the rows.
    pub(crate) fn dtype(&self) -> Dtype {
        match self {
            Source::F32(_) => Dtype::F32,
            Source::Bits16(_, dtype) => *dtype,
        }
    }

    /// The device rows of `capacity` rows of `d` values, the first of them
    /// these. Small f32 corpora were checked by the caller; a large one is
    /// checked here, part by part, as it streams to the device. Half-width
    /// rows were checked as they were stored.
    pub(crate) fn upload(self, capacity: usize, d: usize) -> Result<RowBuf, CudaError> {
        let buf = RowBuf::alloc("corpus", self.dtype(), capacity * d)?;
        let started = std::time::Instant::now();
        let bytes = match self {
            Source::F32(flat) if std::mem::size_of_val(flat) >= launch::STAGED_MIN_BYTES => {
                let check = |part: &[f32]| validate::corpus_values(part, d).is_ok();
                let dst = buf.view().as_f32("corpus")?;
                if !launch::h2d_staged(dst, flat, d, &check)? {
                    // The whole corpus checked again names the first bad row.
                    validate::corpus_values(flat, d)?;
                }
                std::mem::size_of_val(flat)
            }
            Source::F32(flat) => {
                launch::h2d_sync(buf.view().as_f32("corpus")?, flat)?;
                std::mem::size_of_val(flat)
            }
            Source::Bits16(bits, _) => {
                launch::h2d_upload(buf.view().as_bits16("corpus")?, bits)?;
                std::mem::size_of_val(bits)
            }
        };
        let secs = started.elapsed().as_secs_f64();
        tracing::debug!(
            bytes,
            secs,
            gb_per_s = bytes as f64 / secs.max(1e-9) / 1e9,
            "corpus uploaded"
        );
        Ok(buf)
    }
}

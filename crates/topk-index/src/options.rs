//! The backend an [`crate::Index`] searches on and the options it is built
//! with.

use std::fmt;

use topk_core::Dtype;

use crate::error::IndexError;

/// Which engine answers an [`Index`]'s searches. The exact ones (`cpu`,
/// `oracle`, `cuda`) return the same bytes; `hnsw` is approximate except
/// under very selective filters (docs/CONTRACTS.md §10).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum IndexBackend {
    /// The canonical SIMD kernels of topk-cpu on rayon's threads; sparse
    /// filters gather, dense ones mask.
    #[default]
    Cpu,
    /// The scalar reference: every live allowed row scored with
    /// [`Metric::score_scalar`], then sorted with [`topk_core::cmp_hit`].
    Oracle,
    /// Approximate: an HNSW graph (topk-hnsw, built with
    /// [`IndexOptions::hnsw`]) kept beside the rows, walked with the filter
    /// applied inside the beam; exact when few rows are allowed (see
    /// `crate::graph` and docs/CONTRACTS.md §10).
    Hnsw,
    /// The exact engine on the GPU: the live rows mirrored in device memory
    /// (topk-cuda's resident corpus, loaded at run time), mutated and
    /// searched there, bit-identical to `cpu` (see `crate::device`).
    Cuda,
}

impl IndexBackend {
    /// Every backend.
    pub const ALL: [IndexBackend; 4] = [
        IndexBackend::Cpu,
        IndexBackend::Oracle,
        IndexBackend::Hnsw,
        IndexBackend::Cuda,
    ];

    /// Lowercase name ("cpu", "oracle", "hnsw", "cuda").
    pub fn as_str(self) -> &'static str {
        match self {
            IndexBackend::Cpu => "cpu",
            IndexBackend::Oracle => "oracle",
            IndexBackend::Hnsw => "hnsw",
            IndexBackend::Cuda => "cuda",
        }
    }
}

impl fmt::Display for IndexBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What backends other than the host scans need, given at construction
/// ([`Index::with_options`]) and kept by `save` where it shapes results.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct IndexOptions {
    /// Rows to reserve room for (device backends allocate this many rows up
    /// front and grow past it by doubling); 0 sizes for the first add.
    pub capacity: usize,
    /// Graph parameters of the `hnsw` backend.
    pub hnsw: topk_hnsw::HnswParams,
    /// Device and limits of the `cuda` backend.
    pub cuda: topk_cuda::CudaConfig,
    /// Told the progress of an `hnsw` graph build (the log is told without it).
    pub progress: Option<crate::graph::ProgressHook>,
    /// The `hnsw` backend's exact-switch factor `c` (searches allowing at
    /// most `sqrt(c · max(ef, K) · slots)` rows are exact); `None` is
    /// [`topk_hnsw::DEFAULT_FILTER_WALK_COST`], `Some(0.0)` walks unless
    /// `max(ef, K)` reaches the slots (then the search is exact).
    pub filter_walk_cost: Option<f64>,
    /// How the rows are stored (docs/CONTRACTS.md §14): `f32`, or `f16` /
    /// `bf16` at half the bytes, each value rounded once as it is added;
    /// searches are exact over the stored values. Kept by `save`.
    pub dtype: Dtype,
}

impl IndexOptions {
    /// Reserves room for `rows` rows.
    pub fn capacity(mut self, rows: usize) -> Self {
        self.capacity = rows;
        self
    }

    /// Uses `params` for the `hnsw` backend.
    pub fn hnsw(mut self, params: topk_hnsw::HnswParams) -> Self {
        self.hnsw = params;
        self
    }

    /// Uses `config` for the `cuda` backend.
    pub fn cuda(mut self, config: topk_cuda::CudaConfig) -> Self {
        self.cuda = config;
        self
    }

    /// Sets the `hnsw` backend's exact-switch factor (see
    /// [`IndexOptions::filter_walk_cost`]).
    pub fn filter_walk_cost(mut self, c: f64) -> Self {
        self.filter_walk_cost = Some(c);
        self
    }

    /// Stores the rows as `dtype`.
    pub fn dtype(mut self, dtype: Dtype) -> Self {
        self.dtype = dtype;
        self
    }

    /// Reports the progress of `hnsw` graph builds to `hook`.
    pub fn progress(mut self, hook: crate::graph::ProgressHook) -> Self {
        self.progress = Some(hook);
        self
    }

    /// Checks the `hnsw` parameters and the exact-switch factor, whatever the
    /// backend: an index may switch to `hnsw` later
    /// ([`Index::with_backend`]), and a bad value must not wait until then.
    pub(crate) fn check(&self) -> Result<(), IndexError> {
        self.hnsw.validate()?;
        if let Some(c) = self.filter_walk_cost {
            crate::graph::check_walk_cost(c)?;
        }
        Ok(())
    }
}

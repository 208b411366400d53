//! The errors of the CPU backends that topk-core's contract errors do not
//! cover; they travel through [`topk_core::Error::Backend`] as backend "cpu".

use crate::kernels::Path;

/// A failure specific to the CPU backends.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CpuError {
    // ---- kernels --------------------------------------------------------
    /// A kernel path was forced that this CPU cannot run.
    #[error("kernel path {path} is not available on this CPU (available: {available})")]
    PathUnavailable {
        /// The path asked for.
        path: Path,
        /// The paths this CPU runs, comma separated.
        available: String,
    },

    /// A batch product was forced that this CPU cannot run.
    #[error("batch product {gemm} is not available on this CPU (available: {available})")]
    BatchGemmUnavailable {
        /// The product asked for.
        gemm: crate::BatchGemm,
        /// The products this CPU runs, comma separated.
        available: String,
    },

    // ---- borrowed corpora --------------------------------------------------
    /// A borrowed cosine corpus whose norms do not number its rows.
    #[error("{norms} cosine row norms for {rows} stored rows: give one per row")]
    NormCount {
        /// Norms given.
        norms: usize,
        /// Rows stored.
        rows: usize,
    },

    /// A certified search whose row state does not cover the corpus's rows
    /// (it was built for another corpus, or not updated with it).
    #[error("certified row state covers {covered} rows, the corpus has {rows}: update it with the corpus")]
    StaleRows {
        /// Rows the state covers.
        covered: usize,
        /// Rows the corpus holds.
        rows: usize,
    },

    /// A certified search whose row state was built for rows of another
    /// width or metric than the corpus's.
    #[error("certified row state was built for D = {state_dim} under {state_metric}, the corpus has D = {dim} under {metric}: build it for this corpus")]
    ForeignRows {
        /// Values per row of the corpus the state was built for.
        state_dim: usize,
        /// That corpus's metric.
        state_metric: topk_core::Metric,
        /// Values per row of the corpus searched.
        dim: usize,
        /// Its metric.
        metric: topk_core::Metric,
    },

    // ---- threads ----------------------------------------------------------
    /// A thread count outside `1..`.
    #[error("invalid thread count {threads}: use at least 1")]
    ZeroThreads {
        /// The count given.
        threads: usize,
    },
    /// The dedicated thread pool could not be started.
    #[error("could not start a pool of {threads} threads: {source}")]
    ThreadPool {
        /// Threads asked for.
        threads: usize,
        /// rayon's reason.
        #[source]
        source: rayon::ThreadPoolBuildError,
    },
}

impl From<CpuError> for topk_core::Error {
    fn from(e: CpuError) -> Self {
        topk_core::Error::backend("cpu", e)
    }
}

//! Exact top-K retrieval on the CPU, bit-identical to the canonical score.
//!
//! | item | what it is for |
//! | --- | --- |
//! | [`Oracle`] | the reference: scalar canonical scores for every row, then the comparator |
//! | [`CpuRetriever`] | the fast path: rayon over row blocks, runtime-chosen SIMD, cache-blocked batches, certified GEMM bounds for batches of 16 or more queries (and int8 bounds for single queries over 2^20 values) |
//! | [`CertifiedRows`], [`select_certified`] | that certified path over a corpus held elsewhere ([`CorpusRef`]: an index's rows), with a row filter and the caller's selection |
//! | [`kernels`] | the canonical primitives on AVX-512 / AVX2 / scalar, reused by other backends |
//! | [`CpuError`] | failures specific to this crate (a forced kernel path, a thread pool) |
//!
//! Both retrievers return the same bytes (indices and score bits) for every
//! query; the property tests of this crate check exactly that. Both store
//! the corpus as f32, f16 or bf16 (`with_dtype`, `from_store`,
//! docs/CONTRACTS.md §14) and search the stored values exactly, widening
//! them block by block as they scan.
//!
//! ```
//! use ndarray::array;
//! use topk_core::{Metric, Neighbor, Retriever};
//! use topk_cpu::{CpuRetriever, Oracle};
//!
//! let corpus = array![[1.0_f32, 0.0], [0.0, 1.0], [0.6, 0.8]];
//! let fast = CpuRetriever::new(corpus.view(), Metric::Dot)?;
//! let oracle = Oracle::new(corpus.view(), Metric::Dot)?;
//! let hits = fast.search(&[0.0, 2.0], 2)?;
//! assert_eq!(hits, vec![Neighbor::new(1, 2.0), Neighbor::new(2, 1.6)]);
//! assert_eq!(hits, oracle.search(&[0.0, 2.0], 2)?);
//! # Ok::<(), topk_core::Error>(())
//! ```

mod batch;
mod certified;
mod corpus;
mod error;
pub mod kernels;
mod oracle;
mod retriever;
mod select;

pub use certified::{
    select_certified, BatchGemm, CertifiedPick, CertifiedRows, INT8_MAX_DIM, MIN_INT8_VALUES,
    MIN_QUERIES,
};
pub use corpus::CorpusRef;
pub use error::CpuError;
pub use kernels::{Kernels, Path};
pub use oracle::Oracle;
pub use retriever::CpuRetriever;

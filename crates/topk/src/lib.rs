//! Exact top-K vector retrieval: the crate to depend on.
//!
//! topk answers one question: the K rows of a corpus most similar to a query,
//! exactly, with the same bytes (indices and score bits) on every exact
//! backend. This crate is the front door: it re-exports the contracts of
//! `topk-core`, names every backend once in [`Backend`], and builds any of
//! them with [`open`], returning a `Box<dyn Retriever>` that generic code
//! holds.
//!
//! | item | what it is for |
//! | --- | --- |
//! | [`Backend`] | `cpu`, `oracle`, `cuda`, `hnsw`: parse, print, [`Backend::compiled`], [`Backend::available`] |
//! | [`open`] | build a backend from a [`Corpus`] (owned rows move in), a [`Metric`] and [`Options`] |
//! | [`Retriever`] | `search`, `search_into`, `search_batch` on whatever was opened |
//! | [`Error`] | why [`open`] failed: an input rule, an unavailable backend, a backend's own error |
//! | [`Index`] | a corpus that changes: external ids ([`Hit`]), add / upsert / remove, [`Filter`]ed search, save / open (docs/CONTRACTS.md §10) |
//! | [`ShardedIndex`] | one corpus over N [`Index`] shards (CPU, one GPU each, or mixed), merged by [`merge_hits`] into the bytes of one index (docs/CONTRACTS.md §12) |
//! | [`core`], [`cpu`], [`hnsw`], [`index`], [`shard`] | the backend crates, for what the front door does not cover |
//!
//! ```
//! use ndarray::array;
//! use topk::{Backend, Metric, Neighbor, Options};
//!
//! let corpus = array![[1.0_f32, 0.0], [0.0, 1.0], [0.6, 0.8]];
//! let cpu = topk::open(Backend::Cpu, corpus.view(), Metric::Dot, &Options::new())?;
//! let hits = cpu.search(&[0.0, 2.0], 2)?;
//! assert_eq!(hits, vec![Neighbor::new(1, 2.0), Neighbor::new(2, 1.6)]);
//! // The owned corpus moves into the backend; exact backends agree to the bit.
//! let oracle = topk::open(Backend::Oracle, corpus, Metric::Dot, &Options::new())?;
//! assert_eq!(hits, oracle.search(&[0.0, 2.0], 2)?);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! The `cuda` feature adds the GPU engine, loaded at run time so that a
//! binary built with it still starts (and serves the host backends) on a
//! machine without the NVIDIA driver; [`Backend::available`] says why the
//! engine cannot run. The `clap` feature implements `clap::ValueEnum` for
//! [`Backend`].

mod backend;
mod cuda;
mod open;

pub use backend::{Backend, ParseBackendError, Unavailable};
pub use open::{open, BuildProgress, Corpus, Error, Options};

pub use topk_core::merge_hits;
pub use topk_core::{
    canon_dot, canon_norm, canon_sqdist, cmp_rank, cosine_from_parts, rank_key, validate, Dtype,
    Error as CoreError, Located, Metric, Neighbor, Retriever, RowStore, TopK,
};
pub use topk_cpu::{CpuRetriever, Oracle};
pub use topk_cuda::CudaConfig;
pub use topk_cuda_loader::LoadError as CudaLoadError;
pub use topk_hnsw::{Hnsw, HnswError, HnswParams};
pub use topk_index::{
    cmp_hit, Filter, FilterSpec, Hit, Index, IndexBackend, IndexError, IndexOptions, MAX_ID,
};
pub use topk_shard::{shard_of, Manifest, ShardEntry, ShardError, ShardSpec, ShardedIndex};

/// The contracts every backend keeps (`topk-core`).
pub use topk_core as core;
/// The exact CPU backends and their kernels (`topk-cpu`).
pub use topk_cpu as cpu;
/// The HNSW graph index: persistence, recall, synthetic corpora (`topk-hnsw`).
pub use topk_hnsw as hnsw;
/// The lifecycle index over the exact CPU backends (`topk-index`).
pub use topk_index as index;
/// Sharded indexes: placement, merge, manifests (`topk-shard`).
pub use topk_shard as shard;

/// The README's Rust example, compiled and run as a doc-test so it cannot rot.
#[doc = include_str!("../../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

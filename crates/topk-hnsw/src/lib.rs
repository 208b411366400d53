//! HNSW (Hierarchical Navigable Small World) graph index for topk.
//!
//! An approximate index: a layered proximity graph (Malkov & Yashunin) that
//! answers a query by scoring a few hundred to a few thousand rows instead of
//! all of them. It keeps topk's contracts where they apply: scores are the
//! canonical score of docs/CONTRACTS.md §2 (a returned neighbour's score has exactly
//! the bits the exact backends give that row), results are ordered by the §3
//! comparator, inputs follow the §4 rules, and [`Hnsw`] implements
//! [`topk_core::Retriever`] so generic code can swap it in.
//!
//! | item | what it is for |
//! | --- | --- |
//! | [`Hnsw`] | build (deterministic or parallel), search with a per-call `ef`, save/load |
//! | [`Hnsw::insert`], [`Hnsw::mark_deleted`] | add a row (reusing a deleted slot), take one out of every result |
//! | [`Hnsw::search_filtered`], [`SlotFilter`] | search only the live slots of an allow-list |
//! | [`HnswParams`] | `m`, `ef_construction`, default `ef`, seed; valid ranges |
//! | [`recall_at_k`] | recall against exact ground truth (oracle or `.ivecs`) |
//! | [`HnswError`] | every failure, with the offending value |
//! | [`synth`] | seeded Gaussian-cluster corpora for tests and benchmarks |
//!
//! ```
//! use topk_core::{Metric, Retriever};
//! use topk_hnsw::{Hnsw, HnswParams};
//!
//! let dim = 8;
//! let data = topk_hnsw::synth::gaussian_clusters(500, dim, 10, 0.3, 1);
//! let index = Hnsw::build(&data, dim, Metric::L2, HnswParams::default())?;
//! let hits = index.search(&data[3 * dim..4 * dim], 5)?;
//! assert_eq!(hits.len(), 5);
//! assert_eq!(hits[0].index, 3); // a row is its own nearest neighbour
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Rows are slots `0..len()`. Deleting marks a slot (it still routes walks);
//! inserting fills the most recently deleted slot or appends one:
//!
//! ```
//! use topk_core::{Metric, Retriever};
//! use topk_hnsw::{Hnsw, HnswParams, SlotFilter};
//!
//! let dim = 8;
//! let data = topk_hnsw::synth::gaussian_clusters(500, dim, 10, 0.3, 1);
//! let mut index = Hnsw::build(&data, dim, Metric::L2, HnswParams::default())?;
//! assert!(index.mark_deleted(3)?);
//! assert!(index.search(&data[3 * dim..4 * dim], 5)?.iter().all(|h| h.index != 3));
//! assert_eq!(index.insert(&data[3 * dim..4 * dim])?, 3); // slot 3 reused
//! let even = SlotFilter::from_fn(index.len(), |s| s % 2 == 0);
//! let hits = index.search_filtered(&data[..dim], 5, &even)?;
//! assert!(hits.iter().all(|h| h.index % 2 == 0));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! With the `cuda` feature, `Hnsw::upload_graph` + `Hnsw::search_graph_gpu`
//! run every query's whole walk on the GPU, one block per query and one
//! launch per batch, with the CPU walk's answers bit for bit
//! (docs/CONTRACTS.md §13); `Hnsw::build_batched_gpu` builds the graph on
//! the GPU by batched insertion ([`Hnsw::build_batched`]'s index, byte for
//! byte), and `Hnsw::build_knn_gpu` from the exact GPU engine's kNN graph.
//!
//! `ef` below `k` is raised to `k`; `ef = 0`, `m < 2` and
//! `ef_construction = 0` are [`HnswError::InvalidParameter`].

mod batch_build;
mod build;
mod error;
mod filter;
#[cfg(feature = "cuda")]
mod gpu;
#[cfg(feature = "cuda")]
mod gpu_build;
#[cfg(feature = "cuda")]
mod gpu_walk;
mod graph;
mod index;
mod knn_build;
mod lifecycle;
mod params;
mod persist;
mod recall;
mod search;
pub mod synth;
mod vectors;

pub use batch_build::BatchSchedule;
pub use error::{HnswError, Result};
pub use filter::SlotFilter;
#[cfg(feature = "cuda")]
pub use gpu_build::GPU_LAYER_MIN_ROWS;
#[cfg(feature = "cuda")]
pub use gpu_walk::{GpuGraph, GpuWalkCounts};
pub use index::{GraphStats, Hnsw, DEFAULT_FILTER_WALK_COST};
pub use knn_build::{KnnSource, EARLY_NODES, KNN_BATCH_ROWS, MAX_KNN_CANDIDATES};
pub use params::{HnswParams, SplitMix64, MAX_LEVEL, MAX_M, MAX_WALK_WIDTH};
pub use persist::{FORMAT_VERSION, MAGIC};
pub use recall::recall_at_k;

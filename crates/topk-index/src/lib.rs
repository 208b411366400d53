//! The lifecycle index of topk (docs/CONTRACTS.md §10): a corpus whose rows
//! carry external ids and change over time, searched exactly.
//!
//! | item | what it is for |
//! | --- | --- |
//! | [`Index`] | `add` / `add_auto` / `upsert` / `remove` / `compact`, `search` / `search_batch` / `search_device`, `save` / `open`, `sync_device` |
//! | [`FilterResolution`] | how filter ids become rows: hash lookups, a merge with the id-sorted rows, or by size |
//! | [`IndexBackend`] | `cpu` (SIMD kernels, gathered or masked filters, certified bounds for batches and large single queries), `oracle` (the scalar reference), `cuda` (the rows mirrored on the GPU, the same bytes as `cpu`) or `hnsw` (an approximate graph, exact under very selective filters) |
//! | [`ProgressHook`] | told the progress of an `hnsw` graph build |
//! | [`Filter`], [`FilterSpec`] | allow-lists of ids: none, one per batch, one per query |
//! | [`IndexError`] | every failure, naming the offending id, row, value or file offset |
//! | [`IndexOptions::dtype`] | rows stored as f32, f16 or bf16 (docs/CONTRACTS.md §14): rounded once as added, searched exactly as stored, kept by the file |
//!
//! A result depends only on the (id, vector) pairs present and the filter:
//! never on insertion order, removals, compaction or the backend. Equal
//! scores rank by the smaller id.
//!
//! **Filter cost.** A `cpu` search resolves a filter to stored rows by a hash
//! lookup per id when it holds fewer than [`MERGE_FRACTION`] of the live
//! rows, and otherwise by one merge of its sorted ids with an id-sorted copy
//! of the live row ids, kept up to date by the mutations (rows appended
//! since the last sort, at most an eighth of it, are binary-searched).
//! [`FilterResolution`] forces either way. Time of a search
//! (K = 100, one query, random filters) as a multiple of an unfiltered
//! search of the same index, measured on a shared 2-core x86-64 machine
//! (single runs: about ±15 % run to run), N = 200k:
//!
//! | allowed | D = 16 lookup | D = 16 auto | D = 128 lookup | D = 128 auto |
//! | ---: | ---: | ---: | ---: | ---: |
//! | 100 % | 3.05 | 1.17 | 1.77 | 1.13 |
//! | 99 % | 2.55 | 1.22 | 1.33 | 1.24 |
//! | 90 % | 3.00 | 1.78 | 1.62 | 1.29 |
//! | 50 % | 1.98 | 1.97 | 1.40 | 1.29 |
//! | 10 % | 0.64 | 0.58 | 0.23 | 0.18 |
//! | 1 % | 0.07 | 0.06 | 0.03 | 0.03 |
//!
//! "lookup" is the hash path for every filter (`FilterResolution::Lookup`),
//! "auto" the default; below 50 % both take the same path. Unfiltered: 2.08 ms
//! at D = 16, 6.07 ms at D = 128. Command:
//! `cargo run --release -p topk-index --example filter_sweep -- 200000 16 30`
//! and `-- 200000 128 20`.
//!
//! ```
//! use ndarray::array;
//! use topk_core::{Hit, Metric};
//! use topk_index::{Filter, Index, IndexBackend};
//!
//! let rows = array![[1.0_f32, 0.0], [0.0, 1.0], [0.6, 0.8]];
//! let mut index = Index::with_ids(&[10, 20, 30], rows.view(), Metric::Dot, IndexBackend::Cpu)?;
//! assert_eq!(index.search(&[0.0, 2.0], 2, None)?, vec![Hit::new(20, 2.0), Hit::new(30, 1.6)]);
//! assert_eq!(index.remove(&[20, 99]), 1);
//! let only = Filter::new([10, 30]);
//! assert_eq!(index.search(&[0.0, 2.0], 5, Some(&only))?, vec![Hit::new(30, 1.6), Hit::new(10, 0.0)]);
//! # Ok::<(), topk_index::IndexError>(())
//! ```

mod certified;
mod device;
mod error;
mod file;
mod filter;
mod graph;
mod index;
mod options;
mod search;

pub use error::IndexError;
pub use file::{FileInfo, MAGIC, VERSION};
pub use filter::{Filter, FilterSpec};
pub use graph::ProgressHook;
pub use index::{auto_ids, check_rows, check_stored, FilterResolution, Index, COMPACT_FRACTION};
pub use options::{IndexBackend, IndexOptions};
pub use search::{MERGE_FRACTION, SPARSE_FRACTION};
pub use topk_core::{cmp_hit, Hit, MAX_ID};

// Searches take `&self` from many threads; mutations need `&mut self`. A
// field that broke either bound would fail to compile here.
const _: fn() = || {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Index>();
    send_sync::<Filter>();
    send_sync::<IndexError>();
};

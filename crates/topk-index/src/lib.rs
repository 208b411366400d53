//! The lifecycle index of topk (docs/CONTRACTS.md §10): a corpus whose rows
//! carry external ids and change over time, searched exactly.
//!
//! | item | what it is for |
//! | --- | --- |
//! | [`Index`] | `add` / `add_auto` / `upsert` / `remove` / `compact`, `search` / `search_batch`, `save` / `open` |
//! | [`IndexBackend`] | `cpu` (SIMD kernels, gathered or masked filters) or `oracle` (the scalar reference) |
//! | [`Filter`], [`FilterSpec`] | allow-lists of ids: none, one per batch, one per query |
//! | [`IndexError`] | every failure, naming the offending id, row, value or file offset |
//!
//! A result depends only on the (id, vector) pairs present and the filter:
//! never on insertion order, removals, compaction or the backend. Equal
//! scores rank by the smaller id.
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

mod error;
mod file;
mod filter;
mod index;
mod search;

pub use error::IndexError;
pub use file::{MAGIC, VERSION};
pub use filter::{Filter, FilterSpec};
pub use index::{Index, IndexBackend, COMPACT_FRACTION};
pub use search::SPARSE_FRACTION;
pub use topk_core::{cmp_hit, Hit, MAX_ID};

// Searches take `&self` from many threads; mutations need `&mut self`. A
// field that broke either bound would fail to compile here.
const _: fn() = || {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Index>();
    send_sync::<Filter>();
    send_sync::<IndexError>();
};

//! Sharded topk indexes (docs/CONTRACTS.md §12): a corpus split over N
//! [`topk_index::Index`] shards of any backends (one `cuda` engine per
//! device ordinal, CPU shards, or a mix), searched in parallel and merged
//! with topk-core's comparator into the bytes one index over the union
//! returns.
//!
//! | item | what it is for |
//! | --- | --- |
//! | [`ShardedIndex`] | `add` / `add_auto` / `upsert` / `remove` / `compact`, `search` / `search_batch` with filters, `save` / `open` |
//! | [`ShardSpec`] | one shard's backend and options ([`ShardSpec::cuda`] for a device ordinal) |
//! | [`shard_of`] | the placement rule: which shard holds an id |
//! | [`Manifest`] | the `manifest.json` of a saved set, naming one index file per shard |
//! | [`ShardError`] | every failure, naming the shard, file or value |
//!
//! ```
//! use ndarray::array;
//! use topk_core::{Hit, Metric};
//! use topk_index::{Index, IndexBackend};
//! use topk_shard::{ShardSpec, ShardedIndex};
//!
//! let rows = array![[1.0_f32, 0.0], [0.0, 1.0], [0.6, 0.8], [0.0, 1.0]];
//! let ids = [10, 20, 30, 5];
//! let mut set = ShardedIndex::uniform(2, Metric::Dot, 3, &ShardSpec::new(IndexBackend::Cpu))?;
//! set.add(&ids, rows.view())?;
//! let one = Index::with_ids(&ids, rows.view(), Metric::Dot, IndexBackend::Cpu)?;
//! // Equal scores rank by the smaller id, on every shard and in the merge.
//! let hits = set.search(&[0.0, 2.0], 3, None)?;
//! assert_eq!(hits, vec![Hit::new(5, 2.0), Hit::new(20, 2.0), Hit::new(30, 1.6)]);
//! assert_eq!(hits, one.search(&[0.0, 2.0], 3, None)?);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
mod error;
mod files;
mod manifest;
mod placement;
mod sharded;

pub use error::ShardError;
pub use files::{next_generation, SaveLock, SAVE_LOCK};
pub use manifest::{Manifest, ShardEntry, FORMAT, MANIFEST_FILE, MANIFEST_VERSION};
pub use placement::{shard_of, PLACEMENT};
pub use sharded::{ShardSpec, ShardedIndex};

// Searches take `&self` from many threads, as for one `Index`.
const _: fn() = || {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<ShardedIndex>();
    send_sync::<ShardError>();
};

//! Why a sharded index operation failed.

use std::path::PathBuf;

use topk_index::IndexError;

/// Every failure of a [`crate::ShardedIndex`] or a [`crate::Manifest`],
/// naming the shard, the file or the value.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ShardError {
    /// A set needs at least one shard.
    #[error("a sharded index needs at least one shard, got 0")]
    NoShards,
    /// Shards disagree on the dimension, the metric or the storage type, or
    /// disagree with the set.
    #[error("shard {shard} has {what} {found}, the set has {expected}")]
    ShardMismatch {
        /// The shard.
        shard: usize,
        /// "dimension", "metric" or "storage type".
        what: &'static str,
        /// The shard's value.
        found: String,
        /// The set's value.
        expected: String,
    },
    /// A shard holds an id that the placement rule puts elsewhere.
    #[error("shard {shard} holds id {id}, which the placement rule puts on shard {expected}")]
    Misplaced {
        /// The shard holding it.
        shard: usize,
        /// The id.
        id: u64,
        /// Where `shard_of` puts it.
        expected: usize,
    },
    /// A shard's own operation failed (its error names the value).
    #[error("shard {shard}: {source}")]
    Shard {
        /// The shard.
        shard: usize,
        /// Its error.
        #[source]
        source: IndexError,
    },
    /// A shard failed, and putting another shard back as it was before the
    /// call failed too: that shard keeps this call's vectors for the ids
    /// it replaced (the ids the call added are removed).
    #[error("shard {shard}: {source}; putting shard {restored} back then failed, so it keeps this call's vectors for the ids it replaced: {restore_error}")]
    RollbackFailed {
        /// The shard whose failure ended the call.
        shard: usize,
        /// Its error.
        #[source]
        source: IndexError,
        /// The shard that could not be put back.
        restored: usize,
        /// Why.
        restore_error: Box<IndexError>,
    },
    /// An input rule of the whole call (checked before any shard changes).
    #[error(transparent)]
    Index(#[from] IndexError),
    /// A manifest could not be read, written or understood.
    #[error("manifest {path}: {reason}")]
    Manifest {
        /// The manifest file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A file operation on the set's folder failed.
    #[error("could not {op} {path}: {source}")]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// What was being done.
        op: &'static str,
        /// The system's reason.
        #[source]
        source: std::io::Error,
    },
}

//! Every way an index mutation, search, save or open can fail, each naming
//! the offending value (docs/CONTRACTS.md §10).

use std::path::PathBuf;

/// A failure of [`crate::Index`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IndexError {
    // ---- input rules ----------------------------------------------------
    /// A query, a row or K breaks an input rule of docs/CONTRACTS.md §4
    /// (a row's position is its position in the call).
    #[error(transparent)]
    Input(#[from] topk_core::Error),
    /// Rows of the wrong width were given to a mutation.
    #[error("dimension mismatch: rows of {got} values were given, the index has D = {expected}")]
    DimensionMismatch {
        /// The index's dimension.
        expected: usize,
        /// Values per given row.
        got: usize,
    },
    /// A mutation got a different number of ids and rows.
    #[error("{ids} ids for {rows} rows: give exactly one id per row")]
    CountMismatch {
        /// Ids given.
        ids: usize,
        /// Rows given.
        rows: usize,
    },

    // ---- ids ------------------------------------------------------------
    /// An id above [`topk_core::MAX_ID`].
    #[error("id {id} at position {position} is above the largest id {max} (2^63 - 1)")]
    IdTooLarge {
        /// The id given.
        id: u64,
        /// Its position in the call.
        position: usize,
        /// [`topk_core::MAX_ID`].
        max: u64,
    },
    /// The same id twice in one call.
    #[error("id {id} is given twice in one call, at positions {first} and {second}")]
    DuplicateInCall {
        /// The repeated id.
        id: u64,
        /// Its first position.
        first: usize,
        /// Its second position.
        second: usize,
    },
    /// `add` of an id the index already holds.
    #[error("id {id} at position {position} is already in the index (use upsert to replace it)")]
    IdExists {
        /// The id given.
        id: u64,
        /// Its position in the call.
        position: usize,
    },
    /// `add_auto` would need ids above [`topk_core::MAX_ID`].
    #[error("no room for {rows} more ids after the largest id {largest}: ids stop at 2^63 - 1")]
    IdsExhausted {
        /// The largest id present.
        largest: u64,
        /// Rows to be added.
        rows: usize,
    },

    // ---- the hnsw backend -------------------------------------------------
    /// The graph of the `hnsw` backend refused its parameters or a change.
    #[error("hnsw backend: {0}")]
    Graph(#[from] topk_hnsw::HnswError),
    /// Queries in device memory were given to a backend other than `cuda`.
    #[error("queries in GPU memory need the cuda backend; this index searches on `{backend}` (copy them to the host, or open the index on cuda)")]
    DeviceQueries {
        /// The index's backend.
        backend: &'static str,
    },
    /// The `cuda` backend refused an input only it can check (queries in GPU
    /// memory with a non-finite value or an overflowing norm, an address
    /// outside device memory).
    #[error("cuda backend: {reason}")]
    DeviceInput {
        /// What the engine reported.
        reason: String,
    },
    /// The `cuda` backend could not start, or its device failed.
    #[error("cuda backend: {reason}")]
    Cuda {
        /// What the loader or the device reported.
        reason: String,
    },

    // ---- filters ----------------------------------------------------------
    /// A per-query filter list whose length is not the number of queries.
    #[error("{filters} filters for {queries} queries: give one filter per query")]
    FilterCount {
        /// Filters given.
        filters: usize,
        /// Queries given.
        queries: usize,
    },

    // ---- files ------------------------------------------------------------
    /// The operating system refused a file operation.
    #[error("{}: cannot {op}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What was being done ("create", "read", "rename", ...).
        op: &'static str,
        /// The system's reason.
        #[source]
        source: std::io::Error,
    },
    /// The file does not start with the index magic.
    #[error("{}: not a topk index file: found {found} at offset 0, expected \"TOPKIDX1\"", path.display())]
    BadMagic {
        /// The file.
        path: PathBuf,
        /// The first bytes found, escaped.
        found: String,
    },
    /// A format version this build cannot read.
    #[error("{}: format version {version} at offset 8 is not supported (this build reads versions 1 to {supported})", path.display())]
    UnsupportedVersion {
        /// The file.
        path: PathBuf,
        /// The version found.
        version: u32,
        /// The newest version this build reads (it reads every one from 1).
        supported: u32,
    },
    /// The file ends before what its header declares.
    #[error("{}: truncated: the file ends at offset {len}, {expected} bytes were expected", path.display())]
    Truncated {
        /// The file.
        path: PathBuf,
        /// The file's length: the offset where it ends.
        len: u64,
        /// The length the header declares (or the header's length).
        expected: u64,
    },
    /// Bytes after the declared end of the file.
    #[error("{}: {extra} unexpected bytes after the end of the index at offset {end}", path.display())]
    TrailingBytes {
        /// The file.
        path: PathBuf,
        /// Where the index should end.
        end: u64,
        /// Bytes past it.
        extra: u64,
    },
    /// A checksum disagrees with the bytes it covers.
    #[error("{}: checksum mismatch over bytes {start}..{end}: the file is corrupt", path.display())]
    Checksum {
        /// The file.
        path: PathBuf,
        /// First byte the checksum covers.
        start: u64,
        /// One past its last byte.
        end: u64,
    },
    /// A field that passed its checksum holds an impossible value.
    #[error("{}: corrupt at offset {offset}: {reason}", path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// Byte offset of the bad value.
        offset: u64,
        /// What is wrong with it.
        reason: String,
    },
}

//! The error type of the HNSW crate: bad parameters, rejected inputs, index
//! files that cannot be trusted, and distance backends that failed.

use std::path::PathBuf;

/// Everything that can go wrong when building, searching, saving or loading an index.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HnswError {
    // ---- parameters and inputs --------------------------------------------
    /// A build or search parameter outside its documented range.
    #[error("invalid HNSW parameter {name} = {value}: {reason}")]
    InvalidParameter {
        /// Parameter name (`m`, `ef_construction`, `ef`, ...).
        name: &'static str,
        /// The value given.
        value: u64,
        /// The valid range.
        reason: &'static str,
    },
    /// A slot number the index does not have.
    #[error("slot {slot} is out of range: the index has {len} slots (0..{len})")]
    SlotOutOfRange {
        /// The slot given.
        slot: u64,
        /// Slots the index has.
        len: usize,
    },
    /// A real-valued setting outside its range (or NaN).
    #[error("invalid {name} = {value}: {reason}")]
    InvalidValue {
        /// Setting name.
        name: &'static str,
        /// The value given.
        value: f64,
        /// The valid range.
        reason: &'static str,
    },
    /// The corpus or a query broke an input rule of topk-core (shape, finiteness, K).
    #[error(transparent)]
    Input(#[from] topk_core::Error),

    // ---- recall tooling -------------------------------------------------
    /// Results and ground truth cover different numbers of queries.
    #[error("recall: {results} result lists but {truth} ground-truth rows")]
    RecallShape {
        /// Result lists given.
        results: usize,
        /// Ground-truth rows given.
        truth: usize,
    },
    /// A ground-truth row has fewer than `k` ids.
    #[error("recall@{k}: ground truth of query {query} has only {have} ids")]
    TruthTooShort {
        /// The query.
        query: usize,
        /// Ids in its ground-truth row.
        have: usize,
        /// The k asked for.
        k: usize,
    },

    // ---- index files ------------------------------------------------------
    /// The file could not be opened, read or written.
    #[error("index file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// An index file's bytes break a rule of the format ([`Hnsw::load`]
    /// names the file; [`Hnsw::from_bytes`] returns the rule alone).
    ///
    /// [`Hnsw::load`]: crate::Hnsw::load
    /// [`Hnsw::from_bytes`]: crate::Hnsw::from_bytes
    #[error("index file {path}: {source}")]
    File {
        /// The file.
        path: PathBuf,
        /// The rule it breaks (`BadMagic`, `Truncated`, `ChecksumMismatch`, …).
        #[source]
        source: Box<HnswError>,
    },
    /// The file does not start with the index magic.
    #[error("not a topk HNSW index file: magic bytes {found:02x?}, expected {expected:02x?}")]
    BadMagic {
        /// The first bytes of the file.
        found: Vec<u8>,
        /// The magic of an index file.
        expected: &'static [u8],
    },
    /// The file was written by an unknown format version.
    #[error(
        "index file format version {found} is not supported (this build reads versions 1 to {supported})"
    )]
    UnsupportedVersion {
        /// Version in the file.
        found: u32,
        /// Newest version this build reads (the one it writes).
        supported: u32,
    },
    /// The file is shorter than its header says.
    #[error("index file truncated: {got} bytes, the header declares {expected}")]
    Truncated {
        /// Bytes the header (or the fixed header layout) requires.
        expected: u64,
        /// Bytes present.
        got: u64,
    },
    /// The file is longer than its header says.
    #[error("index file has {extra} trailing bytes after the declared {expected}-byte index")]
    TrailingBytes {
        /// Bytes the header declares.
        expected: u64,
        /// Bytes beyond that.
        extra: u64,
    },
    /// A stored checksum does not match the bytes it covers.
    #[error(
        "index file {part} checksum mismatch: stored {stored:#010x}, computed {computed:#010x}"
    )]
    ChecksumMismatch {
        /// `"header"` or `"payload"`.
        part: &'static str,
        /// CRC-32 stored in the file.
        stored: u32,
        /// CRC-32 of the bytes read.
        computed: u32,
    },
    /// The checksums match but the content breaks an invariant of the index.
    #[error("index file is inconsistent: {what}")]
    Corrupt {
        /// Which invariant, with the offending values.
        what: String,
    },

    // ---- distance backends ------------------------------------------------
    /// An exact kNN source ([`crate::KnnSource`]) returned an answer that
    /// cannot be the exact top-k of this corpus.
    #[error("exact kNN source: {what}")]
    KnnSource {
        /// What was wrong, with the offending values.
        what: String,
    },
    /// A graph uploaded with `Hnsw::upload_graph` was searched through an
    /// index it was not uploaded from, or after the index changed.
    #[error("the GPU graph was uploaded from another index or before an insertion: upload it again (and rebuild the engine if rows changed)")]
    GpuGraphStale,
    /// The GPU engine does not hold this index's corpus.
    #[error("GPU engine does not match the index: engine {engine}, index {index}")]
    GpuMismatch {
        /// What the engine holds or computed.
        engine: String,
        /// What the index expects.
        index: String,
    },
    /// The GPU engine failed (device, driver, memory or input errors).
    #[error("GPU: {source}")]
    Gpu {
        /// The GPU backend's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync + 'static>,
    },
}

impl From<HnswError> for topk_core::Error {
    /// Input errors keep their topk-core variant so generic callers can match
    /// on them; everything else travels as a `hnsw` backend error.
    fn from(e: HnswError) -> Self {
        match e {
            HnswError::Input(inner) => inner,
            other => topk_core::Error::backend("hnsw", other),
        }
    }
}

/// Result alias of this crate.
pub type Result<T, E = HnswError> = std::result::Result<T, E>;

//! The error type of the benchmark harness: every rejected flag or failed
//! step names the value or file it is about.

use std::path::PathBuf;

/// Result alias of the harness.
pub type Result<T, E = BenchError> = std::result::Result<T, E>;

/// Everything that can stop a benchmark run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BenchError {
    /// A flag outside its valid range.
    #[error("invalid --{flag} {value}: {reason}")]
    InvalidFlag {
        /// The flag's name, without dashes.
        flag: &'static str,
        /// The value given, as text.
        value: String,
        /// What the valid range is.
        reason: String,
    },
    /// A backend name the harness does not know.
    #[error(transparent)]
    UnknownBackend(#[from] topk::ParseBackendError),
    /// A backend could not be built over the corpus.
    #[error(transparent)]
    Open(#[from] topk::Error),
    /// The GPU path was asked for in a build without it.
    #[error("backend `cuda`: this build has no CUDA support; rebuild with --features cuda")]
    NoCuda,
    /// A backend this build does not include.
    #[error("backend `{backend}` is not available in this build: {reason}")]
    BackendUnavailable {
        /// The backend asked for.
        backend: &'static str,
        /// Why it is missing.
        reason: String,
    },
    /// The GPU engine failed (device, driver, memory).
    #[error("cuda: {0}")]
    Cuda(#[from] topk_cuda::CudaError),
    /// A contract error from a backend or the input rules.
    #[error(transparent)]
    Topk(#[from] topk_core::Error),
    /// An `Index` operation failed.
    #[error("index: {0}")]
    Index(#[from] topk::IndexError),
    /// A sharded index operation failed.
    #[error("sharded index: {0}")]
    Shard(#[from] topk::ShardError),
    /// Two paths that must return the same bytes did not.
    #[error("results differ: {0}")]
    Mismatch(String),
    /// Reading or writing a data file failed.
    #[error("{path}: {source}")]
    Data {
        /// The file.
        path: PathBuf,
        /// What went wrong, from topk-io.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync + 'static>,
    },
    /// Corpus and queries disagree on the dimension.
    #[error("the corpus has D = {corpus} but the queries have D = {queries}")]
    DimensionMismatch {
        /// Columns of the corpus.
        corpus: usize,
        /// Columns of the queries.
        queries: usize,
    },
    /// A file-system operation on a results file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A results line could not be parsed.
    #[error("{path}, line {line}: {source}")]
    BadRecord {
        /// The file holding the line.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// The parse error.
        #[source]
        source: serde_json::Error,
    },
    /// A results folder holds nothing to plot or tabulate.
    #[error("{path}: no usable results ({what})")]
    NoResults {
        /// The folder or file.
        path: PathBuf,
        /// What was looked for.
        what: String,
    },
    /// Drawing a plot failed.
    #[error("plot {path}: {message}")]
    Plot {
        /// The image being drawn.
        path: PathBuf,
        /// The drawing backend's message.
        message: String,
    },
    /// A README lacks the markers the table goes between.
    #[error("{path}: markers `{start}` … `{end}` not found (or out of order)")]
    MissingMarkers {
        /// The README.
        path: PathBuf,
        /// The start marker.
        start: &'static str,
        /// The end marker.
        end: &'static str,
    },
}

impl BenchError {
    /// An I/O error on `path`.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        BenchError::Io {
            path: path.into(),
            source,
        }
    }

    /// A data-file error on `path`.
    pub fn data<E>(path: impl Into<PathBuf>, source: E) -> Self
    where
        E: std::error::Error + Send + Sync + 'static,
    {
        BenchError::Data {
            path: path.into(),
            source: Box::new(source),
        }
    }

    /// A rejected flag.
    pub fn flag(flag: &'static str, value: impl ToString, reason: impl Into<String>) -> Self {
        BenchError::InvalidFlag {
            flag,
            value: value.to_string(),
            reason: reason.into(),
        }
    }
}

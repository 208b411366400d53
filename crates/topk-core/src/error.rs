//! The error type of the contracts: every rejected input names its value.

use std::fmt;

/// Result alias used across topk.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Where a rejected value sits: a corpus row or a query.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Located {
    /// Row `i` of the corpus.
    Row(usize),
    /// Query `i` of a batch (0 for a single query).
    Query(usize),
}

impl fmt::Display for Located {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Located::Row(i) => write!(f, "corpus row {i}"),
            Located::Query(i) => write!(f, "query {i}"),
        }
    }
}

/// Everything that can go wrong when building or querying a retriever.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    // ---- shape of the input -------------------------------------------
    /// The corpus has no rows.
    #[error("empty corpus: a retriever needs at least one row (got N = 0)")]
    EmptyCorpus,
    /// The dimension is zero.
    #[error("invalid dimension D = 0: vectors need at least one value")]
    ZeroDimension,
    /// A flat buffer's length is not a multiple of the dimension.
    #[error("corpus buffer of {len} values is not a whole number of rows of D = {dim}")]
    RaggedCorpus {
        /// Values in the buffer.
        len: usize,
        /// The declared dimension.
        dim: usize,
    },
    /// More rows than a `u32` index can name.
    #[error("corpus of N = {n} rows exceeds the limit of {max} rows (indices are u32)")]
    TooManyRows {
        /// Rows given.
        n: usize,
        /// Largest supported N.
        max: usize,
    },
    /// A query (or a batch) has the wrong number of columns.
    #[error("dimension mismatch: {what} has {got} values, the corpus has D = {expected}")]
    DimensionMismatch {
        /// What was checked ("query 3", "queries").
        what: String,
        /// The corpus dimension.
        expected: usize,
        /// What was given.
        got: usize,
    },
    /// A NaN or infinite value in the corpus or a query.
    #[error("non-finite value {value} at {at}, column {column}: inputs must be finite")]
    NonFinite {
        /// Row or query holding the value.
        at: Located,
        /// Column of the value.
        column: usize,
        /// The value itself (NaN, inf or -inf).
        value: f32,
    },

    /// A corpus row or query whose squared Euclidean norm exceeds
    /// [`crate::validate::MAX_SQUARED_NORM`]: some score against it could
    /// overflow to infinity or NaN (docs/CONTRACTS.md §4, the overflow rule).
    #[error(
        "{at} has squared norm {squared_norm:e} (largest magnitude {largest:e} at column {column}), \
         above the limit 2^100 = {max:e}: scores against it could overflow; scale the vectors down"
    )]
    NormTooLarge {
        /// Row or query at fault.
        at: Located,
        /// Its squared norm, summed in `f64`.
        squared_norm: f64,
        /// Its value of largest magnitude.
        largest: f32,
        /// Column of that value.
        column: usize,
        /// The limit, [`crate::validate::MAX_SQUARED_NORM`].
        max: f64,
    },
    /// More values per vector than the overflow rule covers.
    #[error("invalid dimension D = {dim}: at most {max} values per vector are supported")]
    DimensionTooLarge {
        /// The dimension given.
        dim: usize,
        /// Largest supported D, [`crate::validate::MAX_DIM`].
        max: usize,
    },

    /// A finite value too large for the corpus's storage type: it would be
    /// stored as an infinity (docs/CONTRACTS.md §14).
    #[error(
        "value {value:e} at {at}, column {column} does not fit {dtype} storage \
         (largest finite {dtype} is {max:e}): scale the vectors down or store f32"
    )]
    NotRepresentable {
        /// Row holding the value.
        at: Located,
        /// Column of the value.
        column: usize,
        /// The value given.
        value: f32,
        /// The storage type ("f16", "bf16").
        dtype: crate::Dtype,
        /// The largest finite value of that type.
        max: f32,
    },

    // ---- search parameters ---------------------------------------------
    /// K = 0 was asked for.
    #[error("invalid K = 0: ask for at least one neighbour")]
    ZeroK,
    /// A parameter outside its documented range.
    #[error("invalid {name} = {value}: {reason}")]
    InvalidParameter {
        /// Parameter name.
        name: &'static str,
        /// The value given, as text.
        value: String,
        /// What the valid range is.
        reason: String,
    },

    // ---- backends -------------------------------------------------------
    /// A backend-specific failure (device, driver, index file).
    #[error("{backend} backend: {source}")]
    Backend {
        /// Which backend failed ("cuda", "hnsw", ...).
        backend: &'static str,
        /// The backend's own typed error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync + 'static>,
    },
}

impl Error {
    /// The same error naming corpus row `r`: for an error found checking one
    /// row on its own (as row 0), reported where the row will stand.
    /// Errors that name no row are returned as they are.
    pub fn at_row(self, r: usize) -> Error {
        let here = Located::Row(r);
        match self {
            Error::NonFinite { column, value, .. } => Error::NonFinite {
                at: here,
                column,
                value,
            },
            Error::NormTooLarge {
                squared_norm,
                largest,
                column,
                max,
                ..
            } => Error::NormTooLarge {
                at: here,
                squared_norm,
                largest,
                column,
                max,
            },
            Error::NotRepresentable {
                column,
                value,
                dtype,
                max,
                ..
            } => Error::NotRepresentable {
                at: here,
                column,
                value,
                dtype,
                max,
            },
            other => other,
        }
    }

    /// Wraps a backend's typed error so it can travel through [`crate::Retriever`].
    pub fn backend<E>(backend: &'static str, source: E) -> Self
    where
        E: std::error::Error + Send + Sync + 'static,
    {
        Error::Backend {
            backend,
            source: Box::new(source),
        }
    }
}

//! The crate's one error type: every driver status, missing device and
//! rejected input becomes a variant that carries the values involved.

/// Everything that can go wrong in the GPU backend.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CudaError {
    // ---- availability ------------------------------------------------------
    /// The crate was built without the `cuda` feature.
    #[error("this build has no CUDA support; rebuild with `--features cuda`")]
    NotCompiled,
    /// The driver could not be initialised (no NVIDIA driver, or no device).
    #[error("no CUDA-capable device or driver: cuInit failed ({reason}); install the NVIDIA driver or run on a machine with a GPU")]
    NoDriver {
        /// The driver's own description of the failure.
        reason: String,
    },
    /// The requested device ordinal does not exist.
    #[error(
        "no CUDA-capable device with ordinal {requested}: the driver reports {available} device(s)"
    )]
    NoDevice {
        /// The ordinal asked for (`CudaConfig::device`).
        requested: usize,
        /// How many devices the driver sees.
        available: usize,
    },

    // ---- resources ---------------------------------------------------------
    /// The engine's buffers do not fit in device memory.
    #[error("out of device memory allocating {what}: {requested} bytes requested, {available} bytes available")]
    OutOfMemory {
        /// The buffer (or the whole engine) being allocated.
        what: &'static str,
        /// Bytes requested.
        requested: usize,
        /// Bytes free on the device when asked.
        available: usize,
    },
    /// A driver call failed.
    #[error("CUDA driver call `{op}` failed: {reason}")]
    Driver {
        /// The operation (driver entry point or engine step).
        op: &'static str,
        /// The driver's description of the status.
        reason: String,
    },
    /// The embedded PTX failed to load (e.g. a driver older than its ISA).
    #[error("loading the PTX module `{module}` failed: {reason} (the driver must support PTX ISA 9.0, CUDA 13.0)")]
    ModuleLoad {
        /// Which kernel module.
        module: &'static str,
        /// The driver's description of the status.
        reason: String,
    },

    // ---- inputs ------------------------------------------------------------
    /// An input broke the rules of docs/CONTRACTS.md §4 (shape, finiteness, K).
    #[error(transparent)]
    Input(#[from] topk_core::Error),
    /// An option outside its range.
    #[error("invalid option {name} = {value}: {reason}")]
    InvalidOption {
        /// Option name.
        name: &'static str,
        /// The value given.
        value: usize,
        /// The valid range.
        reason: &'static str,
    },
    /// A device-resident query of the wrong length.
    #[error("device query has {got} values, the corpus has D = {expected}")]
    DeviceQueryLength {
        /// Values in the device slice.
        got: usize,
        /// The corpus dimension.
        expected: usize,
    },
    /// A device-resident batch whose length is not a whole number of queries.
    #[error(
        "device batch of {got} values is not a whole number of queries of D = {expected} values"
    )]
    DeviceBatchLength {
        /// Values in the device slice.
        got: usize,
        /// The corpus dimension.
        expected: usize,
    },
    /// A row id given to `score_ids` is outside the corpus.
    #[error("row id {id} at position {position} is out of range for a corpus of N = {n} rows")]
    RowIdOutOfRange {
        /// The offending id.
        id: u32,
        /// Where it sits in the id list.
        position: usize,
        /// Corpus rows.
        n: usize,
    },
    /// More ids or queries than the engine's `score_ids` capacity.
    #[error("{what} = {got} exceeds the capacity of {max} fixed at construction")]
    OverCapacity {
        /// What overflowed ("ids", "queries").
        what: &'static str,
        /// Given.
        got: usize,
        /// Capacity.
        max: usize,
    },
    /// A device buffer handed to a kernel launch is shorter than the launch
    /// needs (an engine invariant broken; never the caller's input).
    #[error("device buffer {what} holds {len} elements, the launch needs {needed}")]
    DeviceBufferTooSmall {
        /// The buffer.
        what: &'static str,
        /// Elements the launch reads or writes.
        needed: usize,
        /// Elements the buffer holds.
        len: usize,
    },
    // ---- the mutable resident corpus --------------------------------------
    /// An added id is already live.
    #[error("id {id} (position {position} of the call) is already in the index; use upsert to replace it")]
    IdPresent {
        /// The id.
        id: u64,
        /// Its position in the call.
        position: usize,
    },
    /// One call names an id twice.
    #[error("id {id} appears twice in one call (positions {first} and {second})")]
    DuplicateId {
        /// The id.
        id: u64,
        /// Its first position.
        first: usize,
        /// Its second position.
        second: usize,
    },
    /// An id above the largest allowed (2^63 - 1, docs/CONTRACTS.md §10).
    #[error("id {id} (position {position}) is above the largest id {max}")]
    IdTooLarge {
        /// The id.
        id: u64,
        /// Its position in the call.
        position: usize,
        /// The largest id.
        max: u64,
    },
    /// A call gives a number of ids other than its number of rows, or of
    /// per-query filters other than its number of queries.
    #[error("{what}: {got} given for {expected}")]
    CountMismatch {
        /// What was counted ("ids for rows", "filters for queries").
        what: &'static str,
        /// How many were given.
        got: usize,
        /// How many were needed.
        expected: usize,
    },
    /// A device address given as input that the driver does not know as
    /// device memory of this process, or too short for what it must hold.
    #[error("device pointer {ptr:#x}: {reason}")]
    BadDevicePointer {
        /// The address.
        ptr: u64,
        /// What is wrong with it.
        reason: String,
    },
    /// Queries on the device break docs/CONTRACTS.md §4 (checked there).
    #[error("device query {query} has a non-finite value or a squared norm above 2^100 (docs/CONTRACTS.md §4)")]
    BadDeviceQuery {
        /// The first query at fault.
        query: usize,
    },
    /// `score_ids` offsets do not describe the id list.
    #[error("score_ids: {reason}")]
    BadOffsets {
        /// What is inconsistent, with values.
        reason: String,
    },
    /// A graph given to [`crate::CudaRetriever::upload_graph`] is not a
    /// well-formed layered graph over the engine's rows.
    #[error("graph: {reason}")]
    BadGraph {
        /// What is wrong, with the node, layer and values.
        reason: String,
    },
}

#[cfg(feature = "cuda")]
impl CudaError {
    /// Wraps a driver status for the operation `op`.
    pub(crate) fn driver(op: &'static str, e: cust::error::CudaError) -> Self {
        CudaError::Driver {
            op,
            reason: format!("{e} ({e:?})"),
        }
    }

    /// The error of a failed allocation of `requested` bytes for `what` by
    /// the driver call `op`: out of memory names the bytes (and the device
    /// memory free then), anything else is the driver's.
    pub(crate) fn allocation(
        what: &'static str,
        requested: usize,
        op: &'static str,
        e: cust::error::CudaError,
    ) -> Self {
        match e {
            cust::error::CudaError::OutOfMemory => CudaError::OutOfMemory {
                what,
                requested,
                available: crate::driver::free_memory().unwrap_or(0),
            },
            other => CudaError::driver(op, other),
        }
    }
}

/// One place turns a driver status into a [`CudaError`].
#[cfg(feature = "cuda")]
pub(crate) trait DriverResult<T> {
    /// Names the failed operation.
    fn op(self, op: &'static str) -> Result<T, CudaError>;
}

#[cfg(feature = "cuda")]
impl<T> DriverResult<T> for Result<T, cust::error::CudaError> {
    fn op(self, op: &'static str) -> Result<T, CudaError> {
        self.map_err(|e| CudaError::driver(op, e))
    }
}

impl From<CudaError> for topk_core::Error {
    fn from(e: CudaError) -> Self {
        match e {
            CudaError::Input(inner) => inner,
            other => topk_core::Error::backend("cuda", other),
        }
    }
}

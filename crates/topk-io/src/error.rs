//! The error type of topk-io: every failure names the file and, where the
//! file's contents are at fault, the byte offset and row.

use std::io;
use std::path::{Path, PathBuf};

/// Result alias of topk-io.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong reading or writing a topk file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    // ---- the file as a whole ---------------------------------------------
    /// The operating system refused an operation (open, map, read, write).
    #[error("{}: cannot {op}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What was attempted ("open", "memory-map", "create", "write").
        op: &'static str,
        /// The operating system's error.
        #[source]
        source: io::Error,
    },
    /// The path names a directory, a FIFO, a device or another non-regular
    /// file (found before opening it, so a FIFO never blocks).
    #[error("{}: {kind}, not a regular file", path.display())]
    NotAFile {
        /// The path given.
        path: PathBuf,
        /// What it is instead: `is a directory`, `is a FIFO`, `is a character device`, ...
        kind: &'static str,
    },
    /// Memory for the file's values could not be allocated.
    #[error("{}: cannot allocate {bytes} bytes for its values", path.display())]
    OutOfMemory {
        /// The file.
        path: PathBuf,
        /// The allocation that failed, in bytes.
        bytes: u64,
    },
    /// The file has no bytes at all.
    #[error("{}: the file is empty (0 bytes)", path.display())]
    Empty {
        /// The file.
        path: PathBuf,
    },
    /// The extension names no format this operation handles.
    #[error("{}: cannot tell the format from the file name; expected {expected}", path.display())]
    UnknownFormat {
        /// The file.
        path: PathBuf,
        /// The extensions that would have been understood.
        expected: &'static str,
    },

    // ---- .npy headers ----------------------------------------------------
    /// The `.npy` header is missing, cut short or unparsable.
    #[error("{}: bad .npy header at byte {offset}: {reason}", path.display())]
    NpyHeader {
        /// The file.
        path: PathBuf,
        /// Byte offset of the faulty part of the header.
        offset: u64,
        /// What is wrong with it.
        reason: String,
    },
    /// The element type stored in the file is not the one asked for.
    #[error("{}: the file holds {found}, expected {expected}", path.display())]
    Dtype {
        /// The file.
        path: PathBuf,
        /// What the reader accepts (e.g. `float32 ('<f4')`).
        expected: String,
        /// What the file declares (e.g. `'<f8'`).
        found: String,
    },
    /// A `.npy` array stored in column-major order.
    #[error(
        "{}: the array is stored in Fortran (column-major) order; \
         save it in C order (numpy.ascontiguousarray) and retry",
        path.display()
    )]
    FortranOrder {
        /// The file.
        path: PathBuf,
    },
    /// A `.npy` array that is not two-dimensional.
    #[error("{}: expected a 2-D array (rows x columns), found shape {shape:?}", path.display())]
    Ndim {
        /// The file.
        path: PathBuf,
        /// The shape the header declares.
        shape: Vec<usize>,
    },
    /// A declared shape whose size in bytes does not fit in memory addresses.
    #[error("{}: the declared shape {shape:?} is too large to address", path.display())]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// The shape (rows, columns) declared.
        shape: Vec<usize>,
    },

    // ---- the data --------------------------------------------------------
    /// The file ends before the row that starts at `offset` is complete.
    #[error(
        "{}: truncated: row {row} starts at byte {offset} and needs the file to reach \
         byte {needed}, but the file has {len} bytes",
        path.display()
    )]
    Truncated {
        /// The file.
        path: PathBuf,
        /// The first incomplete row.
        row: usize,
        /// Byte offset where that row starts.
        offset: u64,
        /// Length the file would need to hold that row.
        needed: u64,
        /// Length it has.
        len: u64,
    },
    /// Bytes after the last row the header accounts for.
    #[error("{}: {extra} unexpected bytes after the data, starting at byte {offset}", path.display())]
    TrailingBytes {
        /// The file.
        path: PathBuf,
        /// Where the surplus starts.
        offset: u64,
        /// How many bytes are surplus.
        extra: u64,
    },
    /// The first row of a `.?vecs` file declares a dimension below 1.
    #[error(
        "{}: row 0 declares dimension {found} (at byte 0); a dimension must be at least 1",
        path.display()
    )]
    BadDimension {
        /// The file.
        path: PathBuf,
        /// The declared value.
        found: i32,
    },
    /// A row of a `.?vecs` file declares another dimension than row 0.
    #[error(
        "{}: row {row} (at byte {offset}) declares dimension {found}, but row 0 declares {expected}",
        path.display()
    )]
    RowDimension {
        /// The file.
        path: PathBuf,
        /// The offending row.
        row: usize,
        /// Byte offset of its dimension field.
        offset: u64,
        /// Row 0's dimension.
        expected: usize,
        /// This row's dimension field.
        found: i32,
    },
    /// The data does not start on a boundary its element type needs.
    #[error("{}: the data at byte {offset} is not aligned for {dtype}", path.display())]
    Misaligned {
        /// The file.
        path: PathBuf,
        /// Byte offset of the data.
        offset: u64,
        /// The element type.
        dtype: &'static str,
    },
    /// A value that cannot be converted to the type asked for.
    #[error(
        "{}: value {value} at row {row}, column {column} does not fit in {target}",
        path.display()
    )]
    OutOfRange {
        /// The file.
        path: PathBuf,
        /// Row of the value.
        row: usize,
        /// Column of the value.
        column: usize,
        /// The value.
        value: i64,
        /// The target type.
        target: &'static str,
    },
    /// A line of a `.jsonl` result file that is not a result record.
    #[error("{}: line {line}: {reason}", path.display())]
    Jsonl {
        /// The file.
        path: PathBuf,
        /// Line number, starting at 1.
        line: usize,
        /// What is wrong with it.
        reason: String,
    },

    /// Two files that belong together disagree on their shape.
    #[error(
        "{}: shape {found:?} does not match shape {expected:?} of {}",
        path.display(),
        other.display()
    )]
    ShapeMismatch {
        /// The file.
        path: PathBuf,
        /// Its shape.
        found: Vec<usize>,
        /// The companion file.
        other: PathBuf,
        /// The companion's shape.
        expected: Vec<usize>,
    },

    // ---- writing ---------------------------------------------------------
    /// Data that the target format cannot represent.
    #[error("{}: cannot write: {reason}", path.display())]
    Unwritable {
        /// The file.
        path: PathBuf,
        /// Why not.
        reason: String,
    },
}

impl Error {
    /// The file the error is about.
    pub fn path(&self) -> &Path {
        match self {
            Error::Io { path, .. }
            | Error::NotAFile { path, .. }
            | Error::OutOfMemory { path, .. }
            | Error::Empty { path }
            | Error::UnknownFormat { path, .. }
            | Error::NpyHeader { path, .. }
            | Error::Dtype { path, .. }
            | Error::FortranOrder { path }
            | Error::Ndim { path, .. }
            | Error::TooLarge { path, .. }
            | Error::Truncated { path, .. }
            | Error::TrailingBytes { path, .. }
            | Error::BadDimension { path, .. }
            | Error::RowDimension { path, .. }
            | Error::Misaligned { path, .. }
            | Error::OutOfRange { path, .. }
            | Error::Jsonl { path, .. }
            | Error::ShapeMismatch { path, .. }
            | Error::Unwritable { path, .. } => path,
        }
    }

    /// A closure for `map_err` that wraps an I/O error with the file and operation.
    pub(crate) fn io<'p>(path: &'p Path, op: &'static str) -> impl FnOnce(io::Error) -> Error + 'p {
        move |source| Error::Io {
            path: path.to_owned(),
            op,
            source,
        }
    }
}

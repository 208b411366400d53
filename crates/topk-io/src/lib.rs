//! File formats of topk: corpora, queries, ground truth and results on disk.
//!
//! Every file topk reads or writes goes through this crate, so that the demo,
//! the benchmark harness and the HNSW index reject a bad file the same way:
//! with a typed [`Error`] naming the file and, where the contents are at
//! fault, the byte offset and row.
//!
//! | item | what it does |
//! | --- | --- |
//! | [`read_matrix`] / [`write_matrix`] | `f32` rows from/to `.npy`, `.fvecs` (and `.bvecs`, widened), by extension |
//! | [`read_ids`] | row ids (ground truth) from `.ivecs` or an integer `.npy` |
//! | [`read_row_ids`] | an index's row ids, every value of an integer `.npy` of any shape or `.ivecs`, as `u64` |
//! | [`Mapped`], [`MappedMatrix`] | a file as an `ArrayView2` without reading it into memory |
//! | [`npy`] functions | `.npy` of `f32`, `i32`, `u32` in C order |
//! | [`vecs`] functions | `.fvecs`, `.ivecs`, `.bvecs`, every row's dimension checked |
//! | [`results`] | search results as `.jsonl` or a pair of `.npy` matrices |
//! | [`synth`] | seeded Gaussian rows, row `i` a function of `(seed, i)` |
//! | [`open_regular_file`], [`create_temp_beside`], [`sync_folder_of`] | the same input and output rules for other crates' files (index files) |
//!
//! The owned readers read a file straight into the final array (one copy,
//! from the page cache into the array; no mapping alive beside it), so a
//! corpus costs its own size in memory. [`Mapped`] views a file in place.
//! Inputs are checked to be regular files before they are opened (a FIFO
//! never blocks), and every writer is atomic: a temporary file in the same
//! folder, flushed to disk, renamed into place.
//!
//! ```
//! use ndarray::array;
//! use topk_io::{read_matrix, write_matrix, Error};
//!
//! let dir = tempfile::tempdir().unwrap();
//! let path = dir.path().join("rows.fvecs");
//! let rows = array![[1.0_f32, 2.0], [3.0, 4.0]];
//! write_matrix(&path, rows.view())?;
//! assert_eq!(read_matrix(&path)?, rows);
//!
//! // A row whose dimension field disagrees with row 0 is named, with its offset.
//! let mut bytes = std::fs::read(&path).unwrap();
//! bytes[12] = 3;
//! std::fs::write(&path, &bytes).unwrap();
//! let e = read_matrix(&path).unwrap_err();
//! assert!(matches!(e, Error::RowDimension { row: 1, offset: 12, found: 3, .. }));
//! # Ok::<_, Error>(())
//! ```

// The mapped views reinterpret little-endian file bytes in place.
#[cfg(not(target_endian = "little"))]
compile_error!("topk-io maps little-endian files directly and needs a little-endian target");

mod element;
mod error;
mod format;
mod fsutil;
mod map;
pub mod memory;
pub mod npy;
pub mod results;
pub mod synth;
pub mod vecs;

use std::path::Path;

use ndarray::{Array2, ArrayView2};

pub use element::Element;
pub use error::{Error, Result};
pub use format::Format;
pub use fsutil::{create_temp_beside, open_regular_file, sync_folder_of, write_whole};
pub use map::{Mapped, MappedMatrix};
pub use npy::{
    npy_info, read_npy, read_npy_f32, read_npy_i32, read_npy_u32, write_npy, write_npy_f32,
    write_npy_i32, write_npy_u32, NpyInfo,
};
pub use results::{read_results, scores_path, write_results, ResultFiles};
pub use vecs::{
    read_bvecs, read_bvecs_f32, read_fvecs, read_ivecs, read_vecs, write_bvecs, write_fvecs,
    write_ivecs, write_vecs,
};

/// Reads an `f32` matrix from `.npy` (float32, C order), `.fvecs`, or
/// `.bvecs` (bytes widened to `f32`), chosen by extension.
pub fn read_matrix(path: impl AsRef<Path>) -> Result<Array2<f32>> {
    let path = path.as_ref();
    let started = std::time::Instant::now();
    let m = match Format::require(path, ".npy, .fvecs or .bvecs")? {
        Format::Npy => read_npy_f32(path)?,
        Format::Fvecs => read_fvecs(path)?,
        Format::Bvecs => read_bvecs_f32(path)?,
        Format::Ivecs => {
            return Err(Error::Dtype {
                path: path.to_owned(),
                expected: "float32 rows (.npy, .fvecs) or uint8 rows (.bvecs)".to_owned(),
                found: "int32 (.ivecs)".to_owned(),
            })
        }
    };
    tracing::debug!(
        path = %path.display(), rows = m.nrows(), dim = m.ncols(),
        elapsed_ms = started.elapsed().as_secs_f64() * 1e3, "read matrix"
    );
    Ok(m)
}

/// Writes an `f32` matrix as `.npy` or `.fvecs`, chosen by extension.
pub fn write_matrix(path: impl AsRef<Path>, rows: ArrayView2<'_, f32>) -> Result<()> {
    let path = path.as_ref();
    match Format::require(path, ".npy or .fvecs")? {
        Format::Npy => write_npy_f32(path, rows),
        Format::Fvecs => write_fvecs(path, rows),
        Format::Ivecs | Format::Bvecs => Err(Error::UnknownFormat {
            path: path.to_owned(),
            expected: ".npy or .fvecs (f32 rows)",
        }),
    }
}

/// Reads row ids (e.g. ground-truth neighbours) as `u32` from `.ivecs` or from
/// a `.npy` of `int32`, `uint32` or `int64`; a negative or too large id is an
/// error naming its row and column.
pub fn read_ids(path: impl AsRef<Path>) -> Result<Array2<u32>> {
    let path = path.as_ref();
    match Format::require(path, ".ivecs or .npy")? {
        Format::Ivecs => ids_from(path, Mapped::<i32>::open_vecs(path)?.view()),
        Format::Npy => match npy_info(path)?.descr.as_str() {
            "<u4" => read_npy_u32(path),
            "<i8" => ids_from(path, Mapped::<i64>::open_npy(path)?.view()),
            // Anything else, int32 included, is checked (and reported) as int32.
            _ => ids_from(path, Mapped::<i32>::open_npy(path)?.view()),
        },
        f @ (Format::Fvecs | Format::Bvecs) => Err(Error::Dtype {
            path: path.to_owned(),
            expected: "integer ids (.ivecs, or .npy of int32, uint32 or int64)".to_owned(),
            found: format!("{} ({f})", vecs::dtype_name(f)),
        }),
    }
}

/// Reads the ids of an index's rows: every value of `.ivecs`, or of a `.npy`
/// of `int32`, `uint32`, `int64` or `uint64` of any shape (`np.arange(n)`
/// saves shape `(n,)`), in row-major order, as `u64`. A negative id is an
/// error naming its position; the index checks the upper bound
/// (`topk_core::MAX_ID`).
pub fn read_row_ids(path: impl AsRef<Path>) -> Result<Vec<u64>> {
    let path = path.as_ref();
    match Format::require(path, ".ivecs or .npy")? {
        Format::Ivecs => row_ids_from(path, Mapped::<i32>::open_vecs(path)?.view()),
        Format::Npy => match npy_info(path)?.descr.as_str() {
            "<u4" => Ok(Mapped::<u32>::open_npy_column(path)?
                .view()
                .iter()
                .map(|&v| u64::from(v))
                .collect()),
            "<u8" => Ok(Mapped::<u64>::open_npy_column(path)?
                .view()
                .iter()
                .copied()
                .collect()),
            "<i8" => row_ids_from(path, Mapped::<i64>::open_npy_column(path)?.view()),
            // Anything else, int32 included, is checked (and reported) as int32.
            _ => row_ids_from(path, Mapped::<i32>::open_npy_column(path)?.view()),
        },
        f @ (Format::Fvecs | Format::Bvecs) => Err(Error::Dtype {
            path: path.to_owned(),
            expected: "integer ids (.ivecs, or .npy of int32, uint32, int64 or uint64)".to_owned(),
            found: format!("{} ({f})", vecs::dtype_name(f)),
        }),
    }
}

/// Every value of `view` in row-major order as an id of type `O` (`target`
/// in messages); a value outside `O` is an error naming its row and column.
fn ids_as<T, O>(path: &Path, view: ArrayView2<'_, T>, target: &'static str) -> Result<Vec<O>>
where
    T: Copy + Into<i64>,
    O: TryFrom<i64>,
{
    let mut out = Vec::new();
    memory::reserve(&mut out, view.len()).map_err(|bytes| Error::OutOfMemory {
        path: path.to_owned(),
        bytes,
    })?;
    for ((row, column), &v) in view.indexed_iter() {
        let value: i64 = v.into();
        out.push(O::try_from(value).map_err(|_| Error::OutOfRange {
            path: path.to_owned(),
            row,
            column,
            value,
            target,
        })?);
    }
    Ok(out)
}

fn row_ids_from<T: Copy + Into<i64>>(path: &Path, view: ArrayView2<'_, T>) -> Result<Vec<u64>> {
    ids_as(path, view, "u64")
}

fn ids_from<T: Copy + Into<i64>>(path: &Path, view: ArrayView2<'_, T>) -> Result<Array2<u32>> {
    let ids = ids_as(path, view, "u32")?;
    Array2::from_shape_vec(view.dim(), ids).map_err(|_| Error::TooLarge {
        path: path.to_owned(),
        shape: vec![view.nrows(), view.ncols()],
    })
}

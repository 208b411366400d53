//! The `.fvecs` / `.ivecs` / `.bvecs` formats of the ANN benchmark corpora.
//!
//! A file is a sequence of rows; each row is a little-endian `i32` dimension
//! followed by that many values (`f32`, `i32` or `u8`). The format carries the
//! dimension in every row, so a reader that only looks at the first one
//! silently misreads a file whose rows disagree; here every row's field is
//! checked against row 0's, and a mismatch names the row and its byte offset.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use ndarray::{Array2, ArrayView2};

use crate::element::Element;
use crate::error::{Error, Result};
use crate::format::Format;
use crate::map::{Layout, Mapped};

/// Bytes of the per-row dimension field.
const FIELD: usize = 4;

/// The element type a `.?vecs` format holds, for messages.
pub(crate) fn dtype_name(format: Format) -> &'static str {
    match format {
        Format::Fvecs => "float32",
        Format::Ivecs => "int32",
        Format::Bvecs => "uint8",
        Format::Npy => "a numpy array",
    }
}

/// Scans every row of a mapped `.?vecs` file of `T`.
pub(crate) fn layout<T: Element>(path: &Path, bytes: &[u8]) -> Result<Layout> {
    let size = size_of::<T>();
    // The strided view steps over the field in whole elements.
    debug_assert_eq!(FIELD % size, 0, "a .?vecs element must divide 4 bytes");
    let len = bytes.len();
    let field_at = |offset: usize| -> Option<i32> {
        let b = bytes.get(offset..offset + FIELD)?;
        Some(i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let truncated = |row: usize, offset: usize, needed: usize| Error::Truncated {
        path: path.to_owned(),
        row,
        offset: offset as u64,
        needed: needed as u64,
        len: len as u64,
    };

    let first = field_at(0).ok_or_else(|| truncated(0, 0, FIELD))?;
    let dim = usize::try_from(first)
        .ok()
        .filter(|&d| d >= 1)
        .ok_or_else(|| Error::BadDimension {
            path: path.to_owned(),
            found: first,
        })?;
    // At most 4 + (2^31 - 1) * 4 bytes: only a 32-bit target can overflow.
    let row_bytes = dim
        .checked_mul(size)
        .and_then(|b| b.checked_add(FIELD))
        .ok_or_else(|| Error::TooLarge {
            path: path.to_owned(),
            shape: vec![1, dim],
        })?;

    let mut rows = 0;
    let mut offset = 0;
    while offset < len {
        let found = field_at(offset).ok_or_else(|| truncated(rows, offset, offset + FIELD))?;
        if found != first {
            return Err(Error::RowDimension {
                path: path.to_owned(),
                row: rows,
                offset: offset as u64,
                expected: dim,
                found,
            });
        }
        if len - offset < row_bytes {
            return Err(truncated(rows, offset, offset.saturating_add(row_bytes)));
        }
        offset += row_bytes;
        rows += 1;
    }
    Layout::checked::<T>(path, bytes, rows, dim, FIELD, row_bytes / size)
}

/// Reads a `.?vecs` file of `T` into an owned `rows × dim` array.
pub fn read_vecs<T: Element>(path: impl AsRef<Path>) -> Result<Array2<T>> {
    Ok(Mapped::<T>::open_vecs(path)?.to_array())
}

/// Reads an `.fvecs` file.
pub fn read_fvecs(path: impl AsRef<Path>) -> Result<Array2<f32>> {
    read_vecs(path)
}

/// Reads an `.ivecs` file.
pub fn read_ivecs(path: impl AsRef<Path>) -> Result<Array2<i32>> {
    read_vecs(path)
}

/// Reads a `.bvecs` file.
pub fn read_bvecs(path: impl AsRef<Path>) -> Result<Array2<u8>> {
    read_vecs(path)
}

/// Writes the rows of `array` in the `.?vecs` format of `T` (whatever the
/// file's extension), streaming one row at a time.
///
/// The format cannot hold zero rows (such a file is empty and reads as an
/// error), rows of dimension 0, or more than `i32::MAX` values per row.
pub fn write_vecs<T: Element>(path: impl AsRef<Path>, array: ArrayView2<'_, T>) -> Result<()> {
    let path = path.as_ref();
    let (rows, dim) = array.dim();
    let unwritable = |reason: String| Error::Unwritable {
        path: path.to_owned(),
        reason,
    };
    if T::VECS.is_none() {
        return Err(unwritable(format!(
            "no .?vecs format holds {} values",
            T::NAME
        )));
    }
    if rows == 0 {
        return Err(unwritable(
            "0 rows: an empty .?vecs file cannot be read back".to_owned(),
        ));
    }
    let field = i32::try_from(dim).ok().filter(|&d| d >= 1).ok_or_else(|| {
        unwritable(format!(
            "dimension {dim} does not fit the per-row field (1 ..= {})",
            i32::MAX
        ))
    })?;
    let file = File::create(path).map_err(Error::io(path, "create"))?;
    let mut out = BufWriter::new(file);
    let mut buf = Vec::with_capacity(FIELD + dim * size_of::<T>());
    for row in array.outer_iter() {
        buf.clear();
        buf.extend_from_slice(&field.to_le_bytes());
        for &v in row.iter() {
            v.put_le(&mut buf);
        }
        out.write_all(&buf).map_err(Error::io(path, "write"))?;
    }
    out.flush().map_err(Error::io(path, "write"))?;
    tracing::debug!(path = %path.display(), rows, dim, dtype = T::NAME, "wrote .?vecs");
    Ok(())
}

/// Writes an `.fvecs` file.
pub fn write_fvecs(path: impl AsRef<Path>, array: ArrayView2<'_, f32>) -> Result<()> {
    write_vecs(path, array)
}

/// Writes an `.ivecs` file.
pub fn write_ivecs(path: impl AsRef<Path>, array: ArrayView2<'_, i32>) -> Result<()> {
    write_vecs(path, array)
}

/// Writes a `.bvecs` file.
pub fn write_bvecs(path: impl AsRef<Path>, array: ArrayView2<'_, u8>) -> Result<()> {
    write_vecs(path, array)
}

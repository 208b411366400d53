//! The `.fvecs` / `.ivecs` / `.bvecs` formats of the ANN benchmark corpora.
//!
//! A file is a sequence of rows; each row is a little-endian `i32` dimension
//! followed by that many values (`f32`, `i32` or `u8`). The format carries the
//! dimension in every row, so a reader that only looks at the first one
//! silently misreads a file whose rows disagree; here every row's field is
//! checked against row 0's, and a mismatch names the row and its byte offset.

use std::fs::File;
use std::io::{BufReader, Read, Write};
use std::path::Path;

use ndarray::{Array2, ArrayView2};

use crate::element::{alloc_zeroed, as_bytes_mut, Element};
use crate::error::{Error, Result};
use crate::format::Format;
use crate::fsutil::{open_regular, AtomicFile};
use crate::map::Layout;

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
///
/// The rows are read from the file one at a time, straight into the array's
/// buffer (no mapping, no intermediate copy), every dimension field checked.
pub fn read_vecs<T: Element>(path: impl AsRef<Path>) -> Result<Array2<T>> {
    let path = path.as_ref();
    let mut plan = Plan::open::<T>(path)?;
    let mut data = alloc_zeroed::<T>(path, plan.rows * plan.dim)?;
    if plan.dim > 0 {
        for row in data.chunks_exact_mut(plan.dim) {
            plan.row(as_bytes_mut(row))?;
        }
    }
    plan.finish(data)
}

/// Reads a `.bvecs` file with every byte widened to `f32`, one row at a time
/// (the bytes are never held as a whole).
pub fn read_bvecs_f32(path: impl AsRef<Path>) -> Result<Array2<f32>> {
    let path = path.as_ref();
    let mut plan = Plan::open::<u8>(path)?;
    let mut data = alloc_zeroed::<f32>(path, plan.rows * plan.dim)?;
    // The row buffer only once a complete row is known to exist: the first
    // row's header alone may declare a dimension of 2^31 in an 8-byte file.
    let mut bytes = if plan.rows > 0 {
        vec![0u8; plan.dim]
    } else {
        Vec::new()
    };
    if plan.dim > 0 {
        for row in data.chunks_exact_mut(plan.dim) {
            plan.row(&mut bytes)?;
            for (v, &b) in row.iter_mut().zip(&bytes) {
                *v = f32::from(b);
            }
        }
    }
    plan.finish(data)
}

/// A `.?vecs` file being read row by row, with the checks of [`layout`] done
/// as the rows go by (same errors, same offsets).
struct Plan<'p> {
    path: &'p Path,
    input: BufReader<File>,
    len: u64,
    dim: usize,
    first: i32,
    rows: usize,
    row_bytes: u64,
    next: usize,
}

impl<'p> Plan<'p> {
    fn open<T: Element>(path: &'p Path) -> Result<Plan<'p>> {
        let (file, len) = open_regular(path)?;
        if len == 0 {
            return Err(Error::Empty {
                path: path.to_owned(),
            });
        }
        let mut input = BufReader::with_capacity(1 << 20, file);
        let truncated = |needed: u64| Error::Truncated {
            path: path.to_owned(),
            row: 0,
            offset: 0,
            needed,
            len,
        };
        if len < FIELD as u64 {
            return Err(truncated(FIELD as u64));
        }
        let mut field = [0u8; FIELD];
        input
            .read_exact(&mut field)
            .map_err(Error::io(path, "read"))?;
        let first = i32::from_le_bytes(field);
        let dim = usize::try_from(first)
            .ok()
            .filter(|&d| d >= 1)
            .ok_or_else(|| Error::BadDimension {
                path: path.to_owned(),
                found: first,
            })?;
        let row_bytes = dim
            .checked_mul(size_of::<T>())
            .and_then(|b| b.checked_add(FIELD))
            .ok_or_else(|| Error::TooLarge {
                path: path.to_owned(),
                shape: vec![1, dim],
            })? as u64;
        let rows = usize::try_from(len / row_bytes).map_err(|_| Error::TooLarge {
            path: path.to_owned(),
            shape: vec![usize::MAX, dim],
        })?;
        Ok(Plan {
            path,
            input,
            len,
            dim,
            first,
            rows,
            row_bytes,
            next: 0,
        })
    }

    /// Byte offset of row `row`'s dimension field.
    fn offset(&self, row: usize) -> u64 {
        row as u64 * self.row_bytes
    }

    /// Reads the values of the next complete row into `values`, checking its field.
    fn row(&mut self, values: &mut [u8]) -> Result<()> {
        let row = self.next;
        if row > 0 {
            let mut field = [0u8; FIELD];
            self.input
                .read_exact(&mut field)
                .map_err(Error::io(self.path, "read"))?;
            self.check_field(row, i32::from_le_bytes(field))?;
        }
        self.input
            .read_exact(values)
            .map_err(Error::io(self.path, "read"))?;
        self.next += 1;
        Ok(())
    }

    fn check_field(&self, row: usize, found: i32) -> Result<()> {
        if found != self.first {
            return Err(Error::RowDimension {
                path: self.path.to_owned(),
                row,
                offset: self.offset(row),
                expected: self.dim,
                found,
            });
        }
        Ok(())
    }

    /// After the complete rows: a partial row at the end is an error.
    fn finish<T>(mut self, data: Vec<T>) -> Result<Array2<T>> {
        let rows = self.rows;
        let offset = self.offset(rows);
        let rest = self.len - offset;
        if rest > 0 {
            let truncated = |needed: u64| Error::Truncated {
                path: self.path.to_owned(),
                row: rows,
                offset,
                needed,
                len: self.len,
            };
            if rest < FIELD as u64 {
                return Err(truncated(offset + FIELD as u64));
            }
            let mut field = [0u8; FIELD];
            if rows == 0 {
                // Row 0's field was read by `open`; it matches by definition.
                field = self.first.to_le_bytes();
            } else {
                self.input
                    .read_exact(&mut field)
                    .map_err(Error::io(self.path, "read"))?;
            }
            self.check_field(rows, i32::from_le_bytes(field))?;
            return Err(truncated(offset + self.row_bytes));
        }
        Array2::from_shape_vec((rows, self.dim), data).map_err(|_| Error::TooLarge {
            path: self.path.to_owned(),
            shape: vec![rows, self.dim],
        })
    }
}

/// Reads an `.fvecs` file.
pub fn read_fvecs(path: impl AsRef<Path>) -> Result<Array2<f32>> {
    read_vecs(path)
}

/// Reads an `.ivecs` file.
pub fn read_ivecs(path: impl AsRef<Path>) -> Result<Array2<i32>> {
    read_vecs(path)
}

/// Reads a `.bvecs` file (bytes; [`read_bvecs_f32`] widens them as it reads).
pub fn read_bvecs(path: impl AsRef<Path>) -> Result<Array2<u8>> {
    read_vecs(path)
}

/// Writes the rows of `array` in the `.?vecs` format of `T` (whatever the
/// file's extension), streaming one row at a time.
///
/// The file appears complete or not at all (temporary file, fsync, rename).
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
    let mut file = AtomicFile::create(path)?;
    let out = file.writer();
    let mut buf = Vec::with_capacity(FIELD + dim * size_of::<T>());
    for row in array.outer_iter() {
        buf.clear();
        buf.extend_from_slice(&field.to_le_bytes());
        for &v in row.iter() {
            v.put_le(&mut buf);
        }
        out.write_all(&buf).map_err(Error::io(path, "write"))?;
    }
    file.commit()?;
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

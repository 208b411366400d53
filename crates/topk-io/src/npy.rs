//! numpy `.npy` files: header checks with byte offsets, zero-copy views,
//! owned reads and writes.
//!
//! The header is parsed by `ndarray-npy`; this module adds what a corpus
//! loader needs on top: one error per way a file can disagree with what was
//! asked for (dtype, order, rank, length), each naming the file and where.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;

use ndarray::{Array2, ArrayView2};
use ndarray_npy::npy::header::{Header, ParseHeaderError, ReadHeaderError};
use ndarray_npy::{WriteNpyError, WriteNpyExt};
use py_literal::Value as PyValue;

use crate::element::{alloc_zeroed, as_bytes_mut, describe, Element};
use crate::error::{Error, Result};
use crate::fsutil::{open_regular, AtomicFile};
use crate::map::Layout;

/// What a `.npy` header declares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NpyInfo {
    /// numpy's type descriptor, e.g. `<f4`; a structured dtype in Python syntax.
    pub descr: String,
    /// Whether the data is stored column-major.
    pub fortran_order: bool,
    /// The array's shape.
    pub shape: Vec<usize>,
    /// Byte offset where the data starts.
    pub data_offset: usize,
}

/// Reads only the header of a `.npy` file.
pub fn npy_info(path: impl AsRef<Path>) -> Result<NpyInfo> {
    let path = path.as_ref();
    let (mut file, len) = open_nonempty(path)?;
    let header = read_header_bytes(path, &mut file, len)?;
    parse_header(path, &header)
}

/// Reads a 2-D `.npy` array of `T` in C order into memory.
///
/// The values are read from the file straight into the array's buffer (no
/// mapping, no intermediate copy), so the peak memory is the array itself.
/// The data may start at any offset: numpy aligns it to 64 bytes, other
/// writers may not.
pub fn read_npy<T: Element>(path: impl AsRef<Path>) -> Result<Array2<T>> {
    let path = path.as_ref();
    let (mut file, len) = open_nonempty(path)?;
    let header = read_header_bytes(path, &mut file, len)?;
    let info = parse_header(path, &header)?;
    let too_large = || Error::TooLarge {
        path: path.to_owned(),
        shape: info.shape.clone(),
    };
    let len = usize::try_from(len).map_err(|_| too_large())?;
    let (rows, dim) = shape::<T>(path, &info, len)?;
    let mut data = alloc_zeroed::<T>(path, rows * dim)?;
    file.seek(SeekFrom::Start(info.data_offset as u64))
        .map_err(Error::io(path, "read"))?;
    file.read_exact(as_bytes_mut(&mut data))
        .map_err(Error::io(path, "read"))?;
    Array2::from_shape_vec((rows, dim), data).map_err(|_| too_large())
}

/// Opens a regular, non-empty file; returns it with its length.
fn open_nonempty(path: &Path) -> Result<(File, u64)> {
    let (file, len) = open_regular(path)?;
    if len == 0 {
        return Err(Error::Empty {
            path: path.to_owned(),
        });
    }
    Ok((file, len))
}

/// The header's length (magic, version, length field and dictionary) as
/// its length field declares it, for a file that starts like an `.npy` of a
/// known version; `None` otherwise (left to the parser to describe).
fn declared_header_len(bytes: &[u8]) -> Option<u64> {
    if bytes.len() < 8 || &bytes[..6] != b"\x93NUMPY" {
        return None;
    }
    match bytes[6] {
        1 => Some(10 + u64::from(u16::from_le_bytes([*bytes.get(8)?, *bytes.get(9)?]))),
        2 | 3 => Some(
            12 + u64::from(u32::from_le_bytes([
                *bytes.get(8)?,
                *bytes.get(9)?,
                *bytes.get(10)?,
                *bytes.get(11)?,
            ])),
        ),
        _ => None,
    }
}

/// The bytes of the header (magic, version, length field and dictionary),
/// read from the start of the file: at most the file's length.
fn read_header_bytes(path: &Path, file: &mut File, len: u64) -> Result<Vec<u8>> {
    let mut fixed = [0u8; 12];
    let fixed_len = usize::try_from(len.min(12)).unwrap_or(12);
    file.read_exact(&mut fixed[..fixed_len])
        .map_err(Error::io(path, "read"))?;
    // Version 1 has a 2-byte dictionary length at byte 8, later ones 4 bytes;
    // a file that is no .npy at all is left to `parse_header` to describe.
    let total = match fixed[6] {
        1 => 10 + u64::from(u16::from_le_bytes([fixed[8], fixed[9]])),
        2 | 3 => {
            12 + u64::from(u32::from_le_bytes([
                fixed[8], fixed[9], fixed[10], fixed[11],
            ]))
        }
        _ => 12,
    }
    .min(len);
    let total = usize::try_from(total).map_err(|_| Error::TooLarge {
        path: path.to_owned(),
        shape: Vec::new(),
    })?;
    let mut header = Vec::new();
    header
        .try_reserve_exact(total)
        .map_err(|_| Error::OutOfMemory {
            path: path.to_owned(),
            bytes: total as u64,
        })?;
    header.extend_from_slice(&fixed[..fixed_len.min(total)]);
    header.resize(total, 0);
    if total > fixed_len {
        file.read_exact(&mut header[fixed_len..])
            .map_err(Error::io(path, "read"))?;
    }
    Ok(header)
}

/// Reads a 2-D `float32` `.npy` array in C order.
pub fn read_npy_f32(path: impl AsRef<Path>) -> Result<Array2<f32>> {
    read_npy(path)
}

/// Reads a 2-D `int32` `.npy` array in C order.
pub fn read_npy_i32(path: impl AsRef<Path>) -> Result<Array2<i32>> {
    read_npy(path)
}

/// Reads a 2-D `uint32` `.npy` array in C order.
pub fn read_npy_u32(path: impl AsRef<Path>) -> Result<Array2<u32>> {
    read_npy(path)
}

/// Writes a 2-D array as `.npy` in C order, whatever the view's memory layout.
///
/// The file appears complete or not at all: it is written under a temporary
/// name in the same folder, flushed to disk and renamed into place.
pub fn write_npy<T: Element>(path: impl AsRef<Path>, array: ArrayView2<'_, T>) -> Result<()> {
    let path = path.as_ref();
    let mut file = AtomicFile::create(path)?;
    write_npy_to(file.writer(), path, array)?;
    file.commit()?;
    tracing::debug!(path = %path.display(), shape = ?array.dim(), dtype = T::NAME, "wrote .npy");
    Ok(())
}

/// Writes the `.npy` bytes of `array` (C order) to `out`; errors name `path`.
pub(crate) fn write_npy_to<T: Element, W: Write>(
    out: W,
    path: &Path,
    array: ArrayView2<'_, T>,
) -> Result<()> {
    // ndarray-npy would store a transposed view with fortran_order = True,
    // which our own readers reject; C order keeps every file readable by them.
    let standard = array.as_standard_layout();
    standard.write_npy(out).map_err(|e| match e {
        WriteNpyError::Io(source) => Error::Io {
            path: path.to_owned(),
            op: "write",
            source,
        },
        other => Error::Unwritable {
            path: path.to_owned(),
            reason: other.to_string(),
        },
    })
}

/// Writes a `float32` `.npy` file.
pub fn write_npy_f32(path: impl AsRef<Path>, array: ArrayView2<'_, f32>) -> Result<()> {
    write_npy(path, array)
}

/// Writes a `uint32` `.npy` file.
pub fn write_npy_u32(path: impl AsRef<Path>, array: ArrayView2<'_, u32>) -> Result<()> {
    write_npy(path, array)
}

/// Writes an `int32` `.npy` file.
pub fn write_npy_i32(path: impl AsRef<Path>, array: ArrayView2<'_, i32>) -> Result<()> {
    write_npy(path, array)
}

/// Parses and checks the header of a mapped `.npy` file.
pub(crate) fn parse_header(path: &Path, bytes: &[u8]) -> Result<NpyInfo> {
    // ndarray-npy allocates the length its header declares before reading
    // it: a 12-byte file declaring 4 GiB would allocate 4 GiB. The declared
    // length is checked against the bytes first.
    if let Some(declared) = declared_header_len(bytes) {
        if declared > bytes.len() as u64 {
            return Err(Error::NpyHeader {
                path: path.to_owned(),
                offset: bytes.len() as u64,
                reason: format!(
                    "the file ends at byte {} inside the header, which declares {declared} bytes",
                    bytes.len()
                ),
            });
        }
    }
    let mut rest = bytes;
    let header = Header::from_reader(&mut rest).map_err(|e| header_error(path, bytes, e))?;
    let data_offset = bytes.len() - rest.len();
    let descr = match &header.type_descriptor {
        PyValue::String(s) => s.clone(),
        other => other.to_string(),
    };
    Ok(NpyInfo {
        descr,
        fortran_order: header.layout.is_fortran(),
        shape: header.shape,
        data_offset,
    })
}

/// Checks that a mapped `.npy` file holds a complete 2-D C-order array of
/// `T` whose data is aligned for `T` in the mapping.
pub(crate) fn layout<T: Element>(path: &Path, bytes: &[u8], column: bool) -> Result<Layout> {
    let mut info = parse_header(path, bytes)?;
    if column {
        info = as_column(path, info)?;
    }
    let (rows, dim) = shape::<T>(path, &info, bytes.len())?;
    Layout::checked::<T>(path, bytes, rows, dim, info.data_offset, dim)
}

/// The header of an array of any number of axes seen as one column in
/// row-major order, shape `(count, 1)`: ids saved as `np.arange(n)` have
/// shape `(n,)`, a scalar has shape `()` and one value.
pub(crate) fn as_column(path: &Path, mut info: NpyInfo) -> Result<NpyInfo> {
    let count = info
        .shape
        .iter()
        .try_fold(1usize, |a, &b| a.checked_mul(b))
        .ok_or_else(|| Error::TooLarge {
            path: path.to_owned(),
            shape: info.shape.clone(),
        })?;
    if info.fortran_order && info.shape.iter().filter(|&&s| s > 1).count() > 1 {
        // Column-major values would come in another order than row-major.
        return Err(Error::FortranOrder {
            path: path.to_owned(),
        });
    }
    info.shape = vec![count, 1];
    info.fortran_order = false;
    Ok(info)
}

/// Checks that a `.npy` file of `len` bytes with this header holds a
/// complete 2-D C-order array of `T`; returns `(rows, dim)`.
pub(crate) fn shape<T: Element>(path: &Path, info: &NpyInfo, len: usize) -> Result<(usize, usize)> {
    if !T::NPY_DESCRS.contains(&info.descr.as_str()) {
        return Err(Error::Dtype {
            path: path.to_owned(),
            expected: describe::<T>(),
            found: describe_descr(&info.descr),
        });
    }
    let [rows, dim] = info.shape[..] else {
        return Err(Error::Ndim {
            path: path.to_owned(),
            shape: info.shape.clone(),
        });
    };
    if info.fortran_order && rows > 1 && dim > 1 {
        // With one row or one column both orders are the same bytes.
        return Err(Error::FortranOrder {
            path: path.to_owned(),
        });
    }
    let too_large = || Error::TooLarge {
        path: path.to_owned(),
        shape: vec![rows, dim],
    };
    // ndarray needs every axis length (not just the byte count) to fit in isize.
    if rows > isize::MAX as usize || dim > isize::MAX as usize {
        return Err(too_large());
    }
    let row_bytes = dim.checked_mul(size_of::<T>()).ok_or_else(too_large)?;
    let end = rows
        .checked_mul(row_bytes)
        .and_then(|b| b.checked_add(info.data_offset))
        .filter(|&e| e <= isize::MAX as usize)
        .ok_or_else(too_large)?;
    check_extent(path, len, info.data_offset, row_bytes, end)?;
    Ok((rows, dim))
}

/// Compares the file length with where the data should end.
fn check_extent(
    path: &Path,
    len: usize,
    data_offset: usize,
    row_bytes: usize,
    end: usize,
) -> Result<()> {
    if end > len {
        // `row_bytes > 0` here: with empty rows `end == data_offset <= len`.
        let row = (len - data_offset) / row_bytes;
        let offset = data_offset + row * row_bytes;
        return Err(Error::Truncated {
            path: path.to_owned(),
            row,
            offset: offset as u64,
            needed: (offset + row_bytes) as u64,
            len: len as u64,
        });
    }
    if end < len {
        return Err(Error::TrailingBytes {
            path: path.to_owned(),
            offset: end as u64,
            extra: (len - end) as u64,
        });
    }
    Ok(())
}

/// Turns ndarray-npy's header error into ours, with the offset of the part at fault.
fn header_error(path: &Path, bytes: &[u8], e: ReadHeaderError) -> Error {
    let (offset, reason) = match e {
        ReadHeaderError::Io(io) if io.kind() == std::io::ErrorKind::UnexpectedEof => (
            bytes.len() as u64,
            format!("the file ends at byte {} inside the header", bytes.len()),
        ),
        ReadHeaderError::Io(io) => (0, io.to_string()),
        ReadHeaderError::Parse(p) => {
            let offset = match p {
                ParseHeaderError::MagicString => 0,
                ParseHeaderError::Version { .. } => 6,
                ParseHeaderError::HeaderLengthOverflow(_) => 8,
                // The dictionary follows a 2-byte length in version 1, 4 bytes after.
                _ if bytes.get(6) == Some(&1) => 10,
                _ => 12,
            };
            let reason = match p {
                ParseHeaderError::MagicString => {
                    "not an .npy file: it does not start with \\x93NUMPY".to_owned()
                }
                other => other.to_string(),
            };
            (offset, reason)
        }
    };
    Error::NpyHeader {
        path: path.to_owned(),
        offset,
        reason,
    }
}

/// `float64 ('<f8')` for the descriptors people meet; the raw text otherwise.
fn describe_descr(descr: &str) -> String {
    let name = match descr.trim_start_matches(['<', '>', '|', '=']) {
        "f2" => "float16",
        "f4" => "float32",
        "f8" => "float64",
        "i1" => "int8",
        "i2" => "int16",
        "i4" => "int32",
        "i8" => "int64",
        "u1" => "uint8",
        "u2" => "uint16",
        "u4" => "uint32",
        "u8" => "uint64",
        "b1" => "bool",
        _ => return format!("dtype {descr}"),
    };
    if descr.starts_with('>') {
        format!("big-endian {name} ('{descr}')")
    } else {
        format!("{name} ('{descr}')")
    }
}

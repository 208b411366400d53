//! Memory-mapped matrices: a `.npy` or `.?vecs` file seen as an
//! `ArrayView2` without copying it into memory first.
//!
//! Every check (header, dtype, per-row dimensions, length, alignment) runs in
//! [`Mapped::open`], so that a view can be handed out afterwards without
//! re-validating and without a fallible accessor. A `.npy` file whose data is
//! not aligned for its element type in the mapping is copied into memory.

use std::marker::PhantomData;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use ndarray::{Array2, ArrayView2, Axis, ShapeBuilder};

use crate::element::{alloc_zeroed, as_bytes_mut, describe, Element};
use crate::error::{Error, Result};
use crate::format::Format;
use crate::fsutil::open_regular;
use crate::{npy, vecs};

/// Where the rows of a validated file lie in its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Layout {
    /// Number of rows.
    rows: usize,
    /// Values per row.
    dim: usize,
    /// Byte offset of the first value of row 0.
    offset: usize,
    /// Distance between the starts of consecutive rows, in elements.
    stride: usize,
}

impl Layout {
    /// A layout whose every element is known to lie inside `bytes`; checks the
    /// alignment of the first value for `T`.
    ///
    /// The caller has established that `offset + ((rows - 1) * stride + dim) *
    /// size_of::<T>() <= bytes.len()` (or `rows * dim == 0` and `offset <= bytes.len()`).
    pub(crate) fn checked<T: Element>(
        path: &Path,
        bytes: &[u8],
        rows: usize,
        dim: usize,
        offset: usize,
        stride: usize,
    ) -> Result<Layout> {
        let start = bytes.as_ptr() as usize + offset;
        if start % align_of::<T>() != 0 {
            return Err(Error::Misaligned {
                path: path.to_owned(),
                offset: offset as u64,
                dtype: T::NAME,
            });
        }
        Ok(Layout {
            rows,
            dim,
            offset,
            stride,
        })
    }
}

/// Opens `path` read-only and maps it, rejecting non-regular files (before
/// opening them: a FIFO would block) and empty files.
pub(crate) fn map_file(path: &Path) -> Result<Mmap> {
    let (file, len) = open_regular(path)?;
    if len == 0 {
        return Err(Error::Empty {
            path: path.to_owned(),
        });
    }
    // SAFETY: the mapping is read-only and we never hand out `&mut`. The one
    // hazard is another process truncating or rewriting the file while it is
    // mapped, which the public `Mapped::open` documents as the caller's duty
    // (the same contract every mmap-based reader has).
    let map = unsafe { Mmap::map(&file) }.map_err(Error::io(path, "memory-map"))?;
    Ok(map)
}

/// A read-only, memory-mapped `rows × dim` matrix of `T` from a `.npy` file
/// (C order) or a `.?vecs` file.
///
/// Opening checks the whole file (for `.?vecs`, the dimension field of every
/// row); afterwards [`Mapped::view`] and [`Mapped::row`] cost nothing and the
/// operating system pages data in as it is touched, so a corpus larger than
/// memory can be scanned.
///
/// The file must not be truncated or modified by another process while the
/// map is alive: the bytes would change under the view (and a truncation
/// raises `SIGBUS` on access).
///
/// ```no_run
/// use topk_io::MappedMatrix;
///
/// let m = MappedMatrix::open("corpus.fvecs")?;
/// println!("{} rows of D = {}", m.rows(), m.dim());
/// let first: &[f32] = m.row(0).unwrap_or_default();
/// let view = m.view(); // ArrayView2<f32>, rows strided over the dimension fields
/// # let _ = (first, view);
/// # Ok::<_, topk_io::Error>(())
/// ```
pub struct Mapped<T: Element> {
    path: PathBuf,
    format: Format,
    storage: Storage<T>,
    layout: Layout,
    _elem: PhantomData<T>,
}

/// Where the values of a [`Mapped`] live.
enum Storage<T> {
    /// The file's mapping; the layout's offset is a byte offset into it.
    Map(Mmap),
    /// A copy of a `.npy` file's values whose data offset is not aligned for
    /// `T` in the mapping; the layout's offset is 0.
    Copy(Vec<T>),
}

/// A memory-mapped `f32` matrix (`.npy` float32 or `.fvecs`).
pub type MappedMatrix = Mapped<f32>;

impl<T: Element> std::fmt::Debug for Mapped<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mapped")
            .field("path", &self.path)
            .field("format", &self.format)
            .field("dtype", &T::NAME)
            .field("rows", &self.layout.rows)
            .field("dim", &self.layout.dim)
            .finish()
    }
}

impl<T: Element> Mapped<T> {
    /// Maps a `.npy` file, or the `.?vecs` format holding `T`, by extension.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        match Format::require(path, ".npy, .fvecs, .ivecs or .bvecs")? {
            Format::Npy => Self::open_npy(path),
            f if Some(f) == T::VECS => Self::open_vecs(path),
            f => Err(Error::Dtype {
                path: path.to_owned(),
                expected: describe::<T>(),
                found: format!("{} ({f})", vecs::dtype_name(f)),
            }),
        }
    }

    /// Maps a `.npy` file whatever its extension.
    ///
    /// A file whose data does not start on a boundary `T` needs (numpy aligns
    /// to 64 bytes, other writers may not) is copied into memory instead.
    pub fn open_npy(path: impl AsRef<Path>) -> Result<Self> {
        Self::open_npy_as(path.as_ref(), false)
    }

    /// Maps a `.npy` file of any number of axes as one column of its values
    /// in row-major order (shape `(count, 1)`), as [`Mapped::open_npy`] does
    /// otherwise: ids saved by `np.save("ids.npy", np.arange(n))`.
    pub fn open_npy_column(path: impl AsRef<Path>) -> Result<Self> {
        Self::open_npy_as(path.as_ref(), true)
    }

    fn open_npy_as(path: &Path, column: bool) -> Result<Self> {
        let map = map_file(path)?;
        match npy::layout::<T>(path, &map, column) {
            Ok(layout) => Ok(Self::new(path, Format::Npy, Storage::Map(map), layout)),
            Err(Error::Misaligned { .. }) => {
                let mut info = npy::parse_header(path, &map)?;
                if column {
                    info = npy::as_column(path, info)?;
                }
                let (rows, dim) = npy::shape::<T>(path, &info, map.len())?;
                let mut values = alloc_zeroed::<T>(path, rows * dim)?;
                let bytes = as_bytes_mut(&mut values);
                let start = info.data_offset;
                // `shape` checked that the data ends exactly at the file's end.
                bytes.copy_from_slice(&map[start..start + bytes.len()]);
                tracing::debug!(path = %path.display(), offset = start, "unaligned .npy data copied");
                let layout = Layout {
                    rows,
                    dim,
                    offset: 0,
                    stride: dim,
                };
                Ok(Self::new(path, Format::Npy, Storage::Copy(values), layout))
            }
            Err(e) => Err(e),
        }
    }

    /// Maps a `.?vecs` file of `T` whatever its extension (`.fvecs` for `f32`,
    /// `.ivecs` for `i32`, `.bvecs` for `u8`), checking every row's dimension.
    pub fn open_vecs(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let Some(format) = T::VECS else {
            return Err(Error::UnknownFormat {
                path: path.to_owned(),
                expected: "a .npy file (no .?vecs format holds this element type)",
            });
        };
        let map = map_file(path)?;
        let layout = vecs::layout::<T>(path, &map)?;
        Ok(Self::new(path, format, Storage::Map(map), layout))
    }

    fn new(path: &Path, format: Format, storage: Storage<T>, layout: Layout) -> Self {
        tracing::debug!(
            path = %path.display(), %format, rows = layout.rows, dim = layout.dim,
            dtype = T::NAME, "mapped"
        );
        Mapped {
            path: path.to_owned(),
            format,
            storage,
            layout,
            _elem: PhantomData,
        }
    }

    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.layout.rows
    }

    /// Values per row.
    pub fn dim(&self) -> usize {
        self.layout.dim
    }

    /// The file this maps.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file's format.
    pub fn format(&self) -> Format {
        self.format
    }

    /// The whole matrix, without copying. Standard (C) layout for `.npy`;
    /// for `.?vecs` the rows are strided over the per-row dimension fields.
    pub fn view(&self) -> ArrayView2<'_, T> {
        let Layout {
            rows,
            dim,
            offset,
            stride,
        } = self.layout;
        let base = match &self.storage {
            Storage::Map(map) => map.as_ptr().wrapping_add(offset).cast::<T>(),
            Storage::Copy(values) => values.as_ptr(),
        };
        // ndarray gives empty arrays zero strides; others would trip its
        // checks when the view is copied into an owned array.
        let strides = if rows == 0 || dim == 0 {
            (0, 0)
        } else {
            (stride, 1)
        };
        // SAFETY: `open_*` established, before building `layout`, that
        // 1. every element `base + i * stride + j` (i < rows, j < dim) lies
        //    inside the map (npy: the file length equals header + rows*dim
        //    values; vecs: every row's field and values were scanned), and
        //    `offset <= map.len()` when the matrix is empty; a copy holds
        //    exactly `rows * dim` values with stride `dim`;
        // 2. `base` is aligned for `T` (`Layout::checked`, or a `Vec<T>`);
        // 3. `T` is a sealed plain number type, valid for every bit pattern;
        // 4. strides are non-negative and the byte extent fits in `isize`
        //    because it is inside one mapping.
        // The map is never mutated through us and lives as long as `&self`.
        unsafe { ArrayView2::from_shape_ptr((rows, dim).strides(strides), base) }
    }

    /// Row `i` as a slice, or `None` past the last row.
    pub fn row(&self, i: usize) -> Option<&[T]> {
        if i >= self.layout.rows {
            return None;
        }
        // Rows are contiguous in both formats, so `to_slice` always succeeds.
        self.view().index_axis_move(Axis(0), i).to_slice()
    }

    /// Copies the matrix into an owned C-order array (one pass over the file).
    pub fn to_array(&self) -> Array2<T> {
        self.view().as_standard_layout().into_owned()
    }
}

//! The file formats topk knows, recognised by extension.

use std::fmt;
use std::path::Path;

use crate::error::{Error, Result};

/// A file format, as named by a file's extension (case-insensitive).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    /// numpy's `.npy`: a header describing dtype, order and shape, then the data.
    Npy,
    /// `.fvecs`: rows of a little-endian `i32` dimension followed by that many `f32`.
    Fvecs,
    /// `.ivecs`: rows of a little-endian `i32` dimension followed by that many `i32`.
    Ivecs,
    /// `.bvecs`: rows of a little-endian `i32` dimension followed by that many `u8`.
    Bvecs,
}

impl Format {
    /// The format a path's extension names, or `None`.
    pub fn of(path: &Path) -> Option<Format> {
        // A non-UTF-8 extension cannot be one of ours; `to_str` failing is just "unknown".
        let ext = path.extension()?.to_str()?.to_ascii_lowercase();
        match ext.as_str() {
            "npy" => Some(Format::Npy),
            "fvecs" => Some(Format::Fvecs),
            "ivecs" => Some(Format::Ivecs),
            "bvecs" => Some(Format::Bvecs),
            _ => None,
        }
    }

    /// Like [`Format::of`], but an unknown extension is an error listing `expected`.
    pub(crate) fn require(path: &Path, expected: &'static str) -> Result<Format> {
        Format::of(path).ok_or_else(|| {
            // A directory usually has no extension; saying so is more useful.
            if path.is_dir() {
                Error::NotAFile {
                    path: path.to_owned(),
                    kind: "is a directory",
                }
            } else {
                Error::UnknownFormat {
                    path: path.to_owned(),
                    expected,
                }
            }
        })
    }

    /// The extension, without the dot.
    pub fn extension(self) -> &'static str {
        match self {
            Format::Npy => "npy",
            Format::Fvecs => "fvecs",
            Format::Ivecs => "ivecs",
            Format::Bvecs => "bvecs",
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, ".{}", self.extension())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extensions_are_case_insensitive() {
        assert_eq!(Format::of(Path::new("a/b.NPY")), Some(Format::Npy));
        assert_eq!(Format::of(Path::new("x.fvecs")), Some(Format::Fvecs));
        assert_eq!(Format::of(Path::new("x.Ivecs")), Some(Format::Ivecs));
        assert_eq!(Format::of(Path::new("x.bvecs")), Some(Format::Bvecs));
        assert_eq!(Format::of(Path::new("x.csv")), None);
        assert_eq!(Format::of(Path::new("npy")), None);
    }

    #[cfg(unix)]
    #[test]
    fn non_utf8_extension_is_unknown_not_a_panic() {
        use std::ffi::OsStr;
        use std::os::unix::ffi::OsStrExt;
        let p = Path::new(OsStr::from_bytes(b"data.\xff\xfe"));
        assert_eq!(Format::of(p), None);
        let e = Format::require(p, ".npy").unwrap_err();
        assert!(matches!(e, Error::UnknownFormat { .. }));
        // A non-UTF-8 stem with a known extension is still recognised.
        let p = Path::new(OsStr::from_bytes(b"\xff\xfe.npy"));
        assert_eq!(Format::of(p), Some(Format::Npy));
    }
}

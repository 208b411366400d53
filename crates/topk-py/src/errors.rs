//! [`topk::IndexError`] as the exception classes of `topk/errors.py`, which
//! derive from the builtins a caller catches anyway: bad input is a
//! `ValueError`, a file problem an `OSError`, a backend failure a
//! `RuntimeError`. The classes live in Python (a class with two bases is one
//! line there); they are looked up once and cached.

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;
use topk::IndexError;

static INVALID_INPUT: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static INDEX_FILE: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static DEVICE: PyOnceLock<Py<PyType>> = PyOnceLock::new();

/// Which `topk.errors` class an error is raised as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `InvalidInputError` (`ValueError`).
    InvalidInput,
    /// `IndexFileError` (`OSError`).
    IndexFile,
    /// `DeviceError` (`RuntimeError`).
    Device,
}

fn class<'py>(py: Python<'py>, kind: Kind) -> PyResult<&'py Bound<'py, PyType>> {
    let (cell, name) = match kind {
        Kind::InvalidInput => (&INVALID_INPUT, "InvalidInputError"),
        Kind::IndexFile => (&INDEX_FILE, "IndexFileError"),
        Kind::Device => (&DEVICE, "DeviceError"),
    };
    cell.import(py, "topk.errors", name)
}

/// An exception of class `kind` carrying `message`.
pub(crate) fn new_err(py: Python<'_>, kind: Kind, message: impl Into<String>) -> PyErr {
    match class(py, kind) {
        Ok(cls) => PyErr::from_type(cls.clone(), message.into()),
        Err(e) => e,
    }
}

/// The class an index error is raised as: the `hnsw` graph refusing its
/// parameters or a change is bad input; the `cuda` backend's failures, and
/// variants added later until they are named here, are `DeviceError`.
fn kind_of(e: &IndexError) -> Kind {
    match e {
        IndexError::Input(_)
        | IndexError::DimensionMismatch { .. }
        | IndexError::CountMismatch { .. }
        | IndexError::IdTooLarge { .. }
        | IndexError::DuplicateInCall { .. }
        | IndexError::IdExists { .. }
        | IndexError::IdsExhausted { .. }
        | IndexError::FilterCount { .. }
        | IndexError::DeviceQueries { .. }
        | IndexError::DeviceInput { .. }
        | IndexError::Graph(_) => Kind::InvalidInput,
        IndexError::Io { .. }
        | IndexError::BadMagic { .. }
        | IndexError::UnsupportedVersion { .. }
        | IndexError::Truncated { .. }
        | IndexError::TrailingBytes { .. }
        | IndexError::Checksum { .. }
        | IndexError::Corrupt { .. } => Kind::IndexFile,
        _ => Kind::Device,
    }
}

/// The file a file error is about, and the system's errno when it has one.
fn file_of(e: &IndexError) -> Option<(&std::path::Path, Option<i32>)> {
    match e {
        IndexError::Io { path, source, .. } => Some((path, source.raw_os_error())),
        IndexError::BadMagic { path, .. }
        | IndexError::UnsupportedVersion { path, .. }
        | IndexError::Truncated { path, .. }
        | IndexError::TrailingBytes { path, .. }
        | IndexError::Checksum { path, .. }
        | IndexError::Corrupt { path, .. } => Some((path, None)),
        _ => None,
    }
}

/// `e` as its Python exception, with the Rust message (and, for a file,
/// `filename` and `errno` set).
pub(crate) fn index_err(py: Python<'_>, e: IndexError) -> PyErr {
    let kind = kind_of(&e);
    let message = e.to_string();
    let Some((path, errno)) = file_of(&e) else {
        return new_err(py, kind, message);
    };
    let build = || -> PyResult<PyErr> {
        let value = class(py, kind)?.call1((message.clone(),))?;
        value.setattr("filename", path.to_string_lossy().into_owned())?;
        value.setattr("errno", errno)?;
        Ok(PyErr::from_value(value))
    };
    build().unwrap_or_else(|e| e)
}

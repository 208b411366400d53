//! The Python package of topk, compiled as `topk._topk` and re-exported by
//! the pure-Python `topk/__init__.py`.
//!
//! | item | what it is for |
//! | --- | --- |
//! | `Index` ([`index`]) | the lifecycle [`topk::Index`] behind an `RwLock`: add / upsert / remove, search, save / open, the GIL released meanwhile |
//! | `backends()` | each index backend's name and whether it can run here (or why not) |
//! | [`convert`] | numpy in (float32 C-contiguous read in place, the rest through `topk._inputs`), numpy out |
//! | [`errors`] | [`topk::IndexError`] as the `topk.errors` classes (`ValueError`, `OSError`, `RuntimeError` subclasses) |
//! | [`options`] | `Index(..., **options)` onto [`topk::IndexOptions`] |
//! | [`shard`] | `merge`, `shard_of` and the set manifest, for sharded indexes (`topk.ray`) |
//!
//! The rules the package keeps are docs/CONTRACTS.md §10 (the lifecycle
//! index) plus the Python conventions in the README's Python section.

use std::str::FromStr;

use pyo3::prelude::*;
use pyo3::types::PyDict;

mod convert;
mod errors;
mod index;
mod options;
mod shard;

/// `{name: True | "<why it cannot run here>"}` for every backend an `Index`
/// accepts, in the order of [`topk::IndexBackend::ALL`].
#[pyfunction]
fn backends(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let out = PyDict::new(py);
    for backend in topk::IndexBackend::ALL {
        let name = backend.as_str();
        match availability(backend) {
            Ok(()) => out.set_item(name, true)?,
            Err(why) => out.set_item(name, why)?,
        }
    }
    Ok(out)
}

/// Whether `backend` can run on this machine and build: the retriever with
/// the same name answers ([`topk::Backend::available`]); an index backend no
/// retriever names needs nothing beyond the host.
pub(crate) fn availability(backend: topk::IndexBackend) -> Result<(), String> {
    match topk::Backend::from_str(backend.as_str()) {
        Ok(b) => b.available().map_err(|why| why.to_string()),
        Err(_) => Ok(()),
    }
}

/// The extension module `topk._topk`.
#[pymodule]
fn _topk(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<index::PyIndex>()?;
    m.add_function(wrap_pyfunction!(backends, m)?)?;
    m.add("MAX_ID", topk::MAX_ID)?;
    shard::register(m)?;
    Ok(())
}

//! The keyword options of `topk.Index(...)`, mapped onto
//! [`topk::IndexOptions`]: `capacity`; the `hnsw` backend's `m`,
//! `ef_construction`, `ef` (alias `ef_search`), `seed`, `parallel`; the
//! `cuda` backend's `device`, `max_k`, `max_batch`, `streams`. Every option
//! is accepted by every backend (one that does not use it ignores it), so a
//! configuration can switch backends unchanged. An unknown name is a
//! `TypeError` naming it, as for any Python call.

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use topk::{CudaConfig, HnswParams, IndexOptions};

use crate::errors::{new_err, Kind};

/// Every option name, for the error of an unknown one.
pub(crate) const NAMES: [&str; 11] = [
    "capacity",
    "m",
    "ef_construction",
    "ef",
    "ef_search",
    "seed",
    "parallel",
    "device",
    "max_k",
    "max_batch",
    "streams",
];

/// A non-negative integer option: a value that is not an integer at all
/// (`1.5`, `"8"`, a bool) is a `TypeError`, an integer out of range an
/// `InvalidInputError`.
fn count(py: Python<'_>, name: &str, value: &Bound<'_, PyAny>) -> PyResult<usize> {
    let shown = || {
        value
            .repr()
            .map(|r| r.to_string())
            .unwrap_or_else(|_| "?".to_owned())
    };
    if value.is_instance_of::<pyo3::types::PyBool>() {
        return Err(PyTypeError::new_err(format!(
            "option {name} must be an integer, got a bool ({value})"
        )));
    }
    // operator.index: ints and numpy integers, never a float or a string.
    let int = py
        .import("operator")?
        .call_method1("index", (value,))
        .map_err(|_| {
            let kind = value
                .get_type()
                .name()
                .map(|n| n.to_string())
                .unwrap_or_else(|_| "?".to_owned());
            PyTypeError::new_err(format!(
                "option {name} must be an integer, got {} ({kind})",
                shown()
            ))
        })?;
    int.extract::<usize>().map_err(|_| {
        new_err(
            py,
            Kind::InvalidInput,
            format!(
                "option {name} must be a non-negative integer, got {}",
                shown()
            ),
        )
    })
}

/// `options` (the `**options` of `Index(...)`) as [`IndexOptions`].
pub(crate) fn parse(py: Python<'_>, options: Option<&Bound<'_, PyDict>>) -> PyResult<IndexOptions> {
    let mut capacity = 0;
    let mut hnsw = HnswParams::default();
    let mut cuda = CudaConfig::default();
    if let Some(options) = options {
        for (key, value) in options.iter() {
            let name: String = key.extract()?;
            match name.as_str() {
                "capacity" => capacity = count(py, &name, &value)?,
                "m" => hnsw.m = count(py, &name, &value)?,
                "ef_construction" => hnsw.ef_construction = count(py, &name, &value)?,
                "ef" | "ef_search" => hnsw.ef_search = count(py, &name, &value)?,
                "seed" => hnsw.seed = count(py, &name, &value)? as u64,
                "parallel" => {
                    hnsw.parallel = value.extract::<bool>().map_err(|_| {
                        PyTypeError::new_err(format!("option parallel must be a bool, got {value}"))
                    })?
                }
                "device" => cuda.device = count(py, &name, &value)?,
                "max_k" => cuda.max_k = count(py, &name, &value)?,
                "max_batch" => cuda.max_batch = count(py, &name, &value)?,
                "streams" => cuda.streams = count(py, &name, &value)?,
                _ => {
                    return Err(PyTypeError::new_err(format!(
                        "Index() got an unknown option {name:?}; the options are {}",
                        NAMES.join(", ")
                    )))
                }
            }
        }
    }
    Ok(IndexOptions::default()
        .capacity(capacity)
        .hnsw(hnsw)
        .cuda(cuda))
}

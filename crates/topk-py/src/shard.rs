//! What a sharded index needs from Rust, for `topk.ray` and for any caller
//! that shards by hand: `merge` (per-shard `(scores, ids)` results merged
//! with [`topk::merge_hits`], the one merge of the project), `shard_of` (the
//! placement rule, [`topk::shard_of`], over an id array) and the set
//! manifest ([`topk::Manifest`]) read, written and used to delete stale
//! shard files, so a set saved from Python opens in Rust and back
//! (docs/CONTRACTS.md §12).

use std::collections::HashMap;
use std::path::PathBuf;
use std::str::FromStr;

use numpy::ndarray::Array1;
use numpy::{PyArray, PyArrayDyn, PyArrayMethods, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use topk::{Hit, Manifest, Metric, ShardEntry, ShardError};

use crate::convert::{Ids, Results};
use crate::errors::{index_err, new_err, Kind};

/// An `InvalidInputError` carrying `message`.
fn invalid(py: Python<'_>, message: impl Into<String>) -> PyErr {
    new_err(py, Kind::InvalidInput, message)
}

/// One shard's `(scores, ids)` as read from Python: the values row-major,
/// with the shape they came in.
struct Part {
    scores: Vec<f32>,
    ids: Vec<i64>,
    /// `(queries, k)`; a 1-D result is one query.
    shape: (usize, usize),
    single: bool,
}

/// `results[i]`, an `(scores, ids)` pair of float32 and int64 arrays of one
/// shape (1-D or 2-D).
fn part(py: Python<'_>, i: usize, item: &Bound<'_, PyAny>) -> PyResult<Part> {
    let (scores, ids): (Bound<'_, PyAny>, Bound<'_, PyAny>) = item.extract().map_err(|_| {
        invalid(
            py,
            format!("results[{i}] must be a (scores, ids) pair as Index.search returns"),
        )
    })?;
    let scores = scores.cast::<PyArrayDyn<f32>>().map_err(|_| {
        invalid(
            py,
            format!("results[{i}]: scores must be a float32 numpy array as Index.search returns"),
        )
    })?;
    let ids = ids.cast::<PyArrayDyn<i64>>().map_err(|_| {
        invalid(
            py,
            format!("results[{i}]: ids must be an int64 numpy array as Index.search returns"),
        )
    })?;
    if scores.shape() != ids.shape() {
        return Err(invalid(
            py,
            format!(
                "results[{i}]: scores have shape {:?} but ids have shape {:?}",
                scores.shape(),
                ids.shape()
            ),
        ));
    }
    let (shape, single) = match *scores.shape() {
        [k] => ((1, k), true),
        [q, k] => ((q, k), false),
        ref other => {
            return Err(invalid(
                py,
                format!("results[{i}]: scores and ids must be 1-D or 2-D, got shape {other:?}"),
            ))
        }
    };
    // Read in logical (row-major) order, whatever the layout.
    let scores = scores.try_readonly()?.as_array().iter().copied().collect();
    let ids = ids.try_readonly()?.as_array().iter().copied().collect();
    Ok(Part {
        scores,
        ids,
        shape,
        single,
    })
}

/// The best `k` of several shards' results of the same queries, in the shape
/// and convention of `Index.search` (see the stub `topk/_topk.pyi`).
#[pyfunction]
#[pyo3(signature = (results, k, metric))]
fn merge(py: Python<'_>, results: &Bound<'_, PyAny>, k: i64, metric: &str) -> PyResult<Py<PyAny>> {
    let metric = Metric::from_str(metric).map_err(|e| index_err(py, e.into()))?;
    let k = match crate::convert::k_arg(py, k)? {
        0 => return Err(invalid(py, "k must be at least 1, got k = 0")),
        k => k,
    };
    let mut parts = Vec::new();
    for (i, item) in results.try_iter()?.enumerate() {
        parts.push(part(py, i, &item?)?);
    }
    let Some(first) = parts.first() else {
        return Err(invalid(py, "merge needs at least one (scores, ids) result"));
    };
    let (queries, single) = (first.shape.0, first.single);
    for (i, p) in parts.iter().enumerate() {
        if p.single != single || p.shape.0 != queries {
            let shown = |p: &Part| {
                if p.single {
                    format!("one query (1-D, {} values)", p.shape.1)
                } else {
                    format!("{} queries (2-D)", p.shape.0)
                }
            };
            return Err(invalid(
                py,
                format!(
                    "results[{i}] holds {} but results[0] holds {}: every shard must answer the same queries",
                    shown(p),
                    shown(first)
                ),
            ));
        }
    }
    let l2 = metric == Metric::L2;
    // Hits are built and merged without the GIL: the parts are owned copies.
    let merged = py.detach(|| -> Result<Results, String> {
        let lists = shard_hits(&parts, queries, l2)?;
        let mut out = Results::with_room(queries, k)?;
        for (q, per_shard) in lists.iter().enumerate() {
            // Every input hit, not only the merged top k: a repeat anywhere
            // means the shards do not hold distinct ids.
            let mut seen = HashMap::with_capacity(per_shard.iter().map(Vec::len).sum());
            for (shard, hits) in per_shard.iter().enumerate() {
                for h in hits {
                    if let Some(first) = seen.insert(h.id, shard) {
                        return Err(if first == shard {
                            format!(
                                "id {} is twice in shard {shard}'s result for query {q}",
                                h.id
                            )
                        } else {
                            format!(
                                "id {} is in the results of shards {first} and {shard} for \
                                 query {q}: shards must hold distinct ids",
                                h.id
                            )
                        });
                    }
                }
            }
            let views: Vec<&[Hit]> = per_shard.iter().map(Vec::as_slice).collect();
            out.push(&topk::merge_hits(&views, k), l2);
        }
        Ok(out)
    });
    merged.map_err(|m| invalid(py, m))?.into_py(py, single)
}

/// Per query, each shard's hits as the Rust side scores them (L2 back to
/// the negated squared distance); `-1` ids are padding and are dropped. A
/// negative id other than `-1` or a NaN score is an error naming it.
fn shard_hits(parts: &[Part], queries: usize, l2: bool) -> Result<Vec<Vec<Vec<Hit>>>, String> {
    let mut lists = Vec::with_capacity(queries);
    for q in 0..queries {
        let mut per_shard = Vec::with_capacity(parts.len());
        for (i, p) in parts.iter().enumerate() {
            let width = p.shape.1;
            let mut hits = Vec::with_capacity(width);
            for j in q * width..(q + 1) * width {
                let (id, score) = (p.ids[j], p.scores[j]);
                if id == -1 {
                    continue;
                }
                let Ok(id) = u64::try_from(id) else {
                    return Err(format!(
                        "results[{i}]: id {id} is negative (only -1, the padding, may be)"
                    ));
                };
                if score.is_nan() {
                    return Err(format!("results[{i}]: the score of id {id} is NaN"));
                }
                hits.push(Hit::new(id, if l2 { -score } else { score }));
            }
            per_shard.push(hits);
        }
        lists.push(per_shard);
    }
    Ok(lists)
}

/// The shard of each id among `shards`, as int64 (the placement rule
/// [`topk::shard::PLACEMENT`]).
#[pyfunction]
fn shard_of<'py>(
    py: Python<'py>,
    ids: &Bound<'py, PyAny>,
    shards: i64,
) -> PyResult<Bound<'py, PyAny>> {
    let n = usize::try_from(shards)
        .ok()
        .filter(|&n| n >= 1)
        .ok_or_else(|| {
            invalid(
                py,
                format!("shards must be at least 1, got shards = {shards}"),
            )
        })?;
    let ids = Ids::new(py, ids, "ids")?.to_u64(py, "ids")?;
    let out: Array1<i64> =
        py.detach(|| ids.iter().map(|&id| topk::shard_of(id, n) as i64).collect());
    Ok(PyArray::from_owned_array(py, out).into_any())
}

/// A [`ShardError`] as its Python exception: file and manifest problems are
/// `IndexFileError` (with `filename`, and `errno` when the system refused),
/// a shard's own error keeps its class, a shard that could not be put back
/// after another failed is a `DeviceError`, the rest is bad input.
fn shard_err(py: Python<'_>, e: ShardError) -> PyErr {
    let message = e.to_string();
    let (path, errno) = match e {
        ShardError::Io { path, source, .. } => (path, source.raw_os_error()),
        ShardError::Manifest { path, .. } => (path, None),
        ShardError::Index(e) | ShardError::Shard { source: e, .. } => return index_err(py, e),
        ShardError::ShardMismatch { .. } | ShardError::Misplaced { .. } => {
            return new_err(py, Kind::IndexFile, message)
        }
        // Only a device refuses to put a shard back.
        ShardError::RollbackFailed { .. } => return new_err(py, Kind::Device, message),
        _ => return invalid(py, message),
    };
    let build = || -> PyResult<PyErr> {
        let cls = py.import("topk.errors")?.getattr("IndexFileError")?;
        let value = cls.call1((message.clone(),))?;
        value.setattr("filename", path.to_string_lossy().into_owned())?;
        value.setattr("errno", errno)?;
        Ok(PyErr::from_value(value))
    };
    build().unwrap_or_else(|e| e)
}

/// `manifest` as a dict of its fields (`shards` a list of dicts).
fn manifest_dict<'py>(py: Python<'py>, m: &Manifest) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("format", &m.format)?;
    d.set_item("version", m.version)?;
    d.set_item("placement", &m.placement)?;
    d.set_item("dim", m.dim)?;
    d.set_item("metric", &m.metric)?;
    d.set_item("generation", m.generation)?;
    let shards = PyList::empty(py);
    for s in &m.shards {
        let e = PyDict::new(py);
        e.set_item("file", &s.file)?;
        e.set_item("rows", s.rows)?;
        e.set_item("backend", &s.backend)?;
        shards.append(e)?;
    }
    d.set_item("shards", shards)?;
    Ok(d)
}

/// `d[key]`, named in the error when missing or of the wrong type.
fn field<'py, T: FromPyObjectOwned<'py>>(
    py: Python<'py>,
    d: &Bound<'py, PyDict>,
    key: &str,
) -> PyResult<T> {
    let value = d
        .get_item(key)?
        .ok_or_else(|| invalid(py, format!("manifest dict has no {key:?}")))?;
    value.extract::<T>().map_err(|_| {
        invalid(
            py,
            format!("manifest dict: {key:?} has the wrong type ({value})"),
        )
    })
}

/// A [`Manifest`] from `d` (`dim`, `metric`, `generation`, `shards`); the
/// format, version and placement rule are always this build's.
fn manifest_of(py: Python<'_>, d: &Bound<'_, PyDict>) -> PyResult<Manifest> {
    let dim: usize = field(py, d, "dim")?;
    let metric: String = field(py, d, "metric")?;
    let metric = Metric::from_str(&metric).map_err(|e| index_err(py, e.into()))?;
    let generation: u64 = field(py, d, "generation")?;
    let list: Bound<'_, PyList> = field(py, d, "shards")?;
    let mut shards = Vec::with_capacity(list.len());
    for item in list.iter() {
        let e = item
            .cast::<PyDict>()
            .map_err(|_| invalid(py, "manifest dict: every shard must be a dict"))?;
        shards.push(ShardEntry {
            file: field(py, e, "file")?,
            rows: field(py, e, "rows")?,
            backend: field(py, e, "backend")?,
        });
    }
    Ok(Manifest::new(dim, metric, generation, shards))
}

/// Reads and checks the manifest of the set in the folder `path`.
#[pyfunction]
fn _read_manifest(py: Python<'_>, path: PathBuf) -> PyResult<Bound<'_, PyDict>> {
    let m = py
        .detach(|| Manifest::read(&path))
        .map_err(|e| shard_err(py, e))?;
    manifest_dict(py, &m)
}

/// Writes `manifest` into the folder `path` atomically; returns whether
/// the folder was synced after (only then may older files go).
#[pyfunction]
fn _write_manifest(py: Python<'_>, path: PathBuf, manifest: &Bound<'_, PyDict>) -> PyResult<bool> {
    let m = manifest_of(py, manifest)?;
    py.detach(|| m.write(&path)).map_err(|e| shard_err(py, e))
}

/// Deletes the shard files in the folder `path` that `manifest` does not
/// name; returns how many.
#[pyfunction]
fn _remove_stale(py: Python<'_>, path: PathBuf, manifest: &Bound<'_, PyDict>) -> PyResult<usize> {
    let m = manifest_of(py, manifest)?;
    py.detach(|| m.remove_stale(&path))
        .map_err(|e| shard_err(py, e))
}

/// The file name of shard `shard` in generation `generation`.
#[pyfunction]
fn _shard_file_name(generation: u64, shard: usize) -> String {
    Manifest::shard_file_name(generation, shard)
}

/// The generation the next save into the folder `path` writes (one past
/// its manifest's and every shard file's there).
#[pyfunction]
fn _next_generation(py: Python<'_>, path: PathBuf) -> PyResult<u64> {
    py.detach(|| topk::shard::next_generation(&path))
        .map_err(|e| shard_err(py, e))
}

/// The save lock of a set's folder ([`topk::shard::SaveLock`], the one the
/// Rust `ShardedIndex::save` takes), as a context manager: `with
/// _SaveLock(folder):` waits for it, holds it and releases it.
#[pyclass(module = "topk._topk", name = "_SaveLock")]
struct SaveLockPy {
    folder: PathBuf,
    held: Option<topk::shard::SaveLock>,
}

#[pymethods]
impl SaveLockPy {
    #[new]
    fn new(folder: PathBuf) -> Self {
        Self { folder, held: None }
    }

    fn __enter__(mut slf: PyRefMut<'_, Self>) -> PyResult<PyRefMut<'_, Self>> {
        let py = slf.py();
        if slf.held.is_none() {
            let folder = slf.folder.clone();
            // Waiting on another process's save must not hold the GIL.
            let lock = py
                .detach(|| topk::shard::SaveLock::acquire(&folder))
                .map_err(|e| shard_err(py, e))?;
            slf.held = Some(lock);
        }
        Ok(slf)
    }

    fn __exit__(
        &mut self,
        _kind: &Bound<'_, PyAny>,
        _value: &Bound<'_, PyAny>,
        _traceback: &Bound<'_, PyAny>,
    ) -> bool {
        self.held = None;
        false
    }
}

/// Registers the functions of this module in `_topk`.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(merge, m)?)?;
    m.add_function(wrap_pyfunction!(shard_of, m)?)?;
    m.add_function(wrap_pyfunction!(_read_manifest, m)?)?;
    m.add_function(wrap_pyfunction!(_write_manifest, m)?)?;
    m.add_function(wrap_pyfunction!(_remove_stale, m)?)?;
    m.add_function(wrap_pyfunction!(_shard_file_name, m)?)?;
    m.add_function(wrap_pyfunction!(_next_generation, m)?)?;
    m.add_class::<SaveLockPy>()?;
    m.add("PLACEMENT", topk::shard::PLACEMENT)?;
    m.add("MANIFEST_FILE", topk::shard::MANIFEST_FILE)?;
    Ok(())
}

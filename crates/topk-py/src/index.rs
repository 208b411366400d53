//! `topk.Index`: the lifecycle [`topk::Index`] (docs/CONTRACTS.md §10) for
//! Python.
//!
//! The index sits behind an `RwLock`: searches share it, mutations take it
//! alone, so one `Index` may be used from many Python threads. Every method
//! that does work (add, upsert, remove, search, save, open) releases the GIL
//! first and takes the lock after, so a thread waiting for the lock never
//! holds the GIL that the thread holding the lock may need next.
//!
//! While the GIL is released the extension reads the caller's numpy arrays
//! in place; as with any numpy extension, an array must not be written by
//! another thread during the call that reads it.

use std::path::PathBuf;
use std::str::FromStr;
use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use ndarray::ArrayView2;
use numpy::ndarray::Array1;
use numpy::PyArray;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use topk::{Dtype, Filter, FilterSpec, Index, IndexBackend, IndexError, Metric};

use crate::convert::{inputs, k_arg, FilterArgs, Filters, Floats, Ids, Results};
use crate::errors::{index_err, new_err, Kind};
use crate::{availability, options};

/// An exact top-K index whose rows carry int64 ids (see the stub
/// `topk/_topk.pyi` for the full Python documentation).
#[pyclass(module = "topk", name = "Index", frozen)]
pub(crate) struct PyIndex {
    inner: RwLock<Index>,
    /// What never changes after construction, read without the lock (a
    /// thread waiting for the lock while holding the GIL would stall every
    /// Python thread until a long write ends).
    fixed: Fixed,
}

/// An index's properties that no call changes.
struct Fixed {
    dim: usize,
    metric: Metric,
    backend: IndexBackend,
    dtype: Dtype,
}

impl PyIndex {
    fn from_index(index: Index) -> PyIndex {
        let fixed = Fixed {
            dim: index.dim(),
            metric: index.metric(),
            backend: index.backend(),
            dtype: index.dtype(),
        };
        PyIndex {
            inner: RwLock::new(index),
            fixed,
        }
    }
}

/// Why a call failed while the GIL was released.
enum Failure {
    Index(IndexError),
    Memory(String),
}

impl Failure {
    fn into_py(self, py: Python<'_>) -> PyErr {
        match self {
            Failure::Index(e) => index_err(py, e),
            Failure::Memory(m) => new_err(py, Kind::InvalidInput, m),
        }
    }
}

/// The backend named `name` (any case), among [`IndexBackend::ALL`], checked
/// to run on this machine.
fn parse_backend(py: Python<'_>, name: &str) -> PyResult<IndexBackend> {
    let lower = name.to_ascii_lowercase();
    let Some(backend) = IndexBackend::ALL.into_iter().find(|b| b.as_str() == lower) else {
        let known: Vec<&str> = IndexBackend::ALL.iter().map(|b| b.as_str()).collect();
        return Err(new_err(
            py,
            Kind::InvalidInput,
            format!(
                "unknown backend {name:?}: an Index runs on {}",
                known.join(", ")
            ),
        ));
    };
    availability(backend).map_err(|why| {
        new_err(
            py,
            Kind::Device,
            format!("backend {:?} cannot run here: {why}", backend.as_str()),
        )
    })?;
    Ok(backend)
}

/// The numpy-style name of a storage type.
fn dtype_name(dtype: Dtype) -> &'static str {
    match dtype {
        Dtype::F32 => "float32",
        Dtype::F16 => "float16",
        Dtype::Bf16 => "bfloat16",
    }
}

/// A `dtype=` argument: a name ("float32", "f16", "bfloat16", ...), a numpy
/// dtype (its `name`) or a numpy scalar type such as `np.float16` (its
/// `__name__`).
fn parse_dtype(py: Python<'_>, obj: &Bound<'_, PyAny>) -> PyResult<Dtype> {
    let name: String = if let Ok(s) = obj.extract::<String>() {
        s
    } else if let Ok(n) = obj.getattr("name").and_then(|n| n.extract::<String>()) {
        n
    } else if let Ok(n) = obj.getattr("__name__").and_then(|n| n.extract::<String>()) {
        n
    } else {
        obj.str()?.to_string()
    };
    Dtype::from_str(&name).map_err(|_| {
        new_err(
            py,
            Kind::InvalidInput,
            format!("unknown dtype {name:?}: rows are stored as float32, float16 or bfloat16"),
        )
    })
}

/// A rows argument as a `rows × D` view.
fn rows_view<'a>(rows: &'a Floats<'_>) -> PyResult<ArrayView2<'a, f32>> {
    ArrayView2::from_shape(rows.shape(), rows.values()?)
        .map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))
}

impl PyIndex {
    fn read(&self) -> RwLockReadGuard<'_, Index> {
        // A panic while holding the lock cannot leave the index half
        // changed (mutations are all or nothing), so a poisoned lock is used.
        self.inner.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> RwLockWriteGuard<'_, Index> {
        self.inner.write().unwrap_or_else(PoisonError::into_inner)
    }

    fn backend_name(&self) -> &'static str {
        self.fixed.backend.as_str()
    }
}

#[pymethods]
impl PyIndex {
    #[new]
    #[pyo3(signature = (dim, metric = "cosine", backend = "cpu", dtype = None, **options))]
    fn new(
        py: Python<'_>,
        dim: i64,
        metric: &str,
        backend: &str,
        dtype: Option<&Bound<'_, PyAny>>,
        options: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<PyIndex> {
        let mut options = options::parse(py, options)?;
        if let Some(dtype) = dtype {
            options = options.dtype(parse_dtype(py, dtype)?);
        }
        let metric = Metric::from_str(metric).map_err(|e| index_err(py, e.into()))?;
        let backend = parse_backend(py, backend)?;
        let dim = usize::try_from(dim).map_err(|_| {
            new_err(
                py,
                Kind::InvalidInput,
                format!("dim must be at least 1, got dim = {dim}"),
            )
        })?;
        // A `cuda` index sets up its device here (context, buffers for
        // `capacity` rows): other threads run meanwhile.
        let index = py
            .detach(|| Index::with_options(dim, metric, backend, &options))
            .map_err(|e| index_err(py, e))?;
        Ok(PyIndex::from_index(index))
    }

    /// Opens a file written by `save`, for `backend`; by default `hnsw`
    /// when the file holds a graph, else `cpu`.
    #[staticmethod]
    #[pyo3(signature = (path, backend = None))]
    fn open(py: Python<'_>, path: PathBuf, backend: Option<&str>) -> PyResult<PyIndex> {
        let backend = match backend {
            Some(name) => Some(parse_backend(py, name)?),
            None => None,
        };
        let index = py
            .detach(|| {
                let backend = match backend {
                    Some(b) => b,
                    None if Index::file_info(&path)?.graph => IndexBackend::Hnsw,
                    None => IndexBackend::default(),
                };
                Index::open(&path, backend)
            })
            .map_err(|e| index_err(py, e))?;
        Ok(PyIndex::from_index(index))
    }

    /// Adds rows under new ids (default: those after the largest id) and
    /// returns their ids.
    #[pyo3(signature = (vectors, ids = None))]
    fn add<'py>(
        &self,
        py: Python<'py>,
        vectors: &Bound<'py, PyAny>,
        ids: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let rows = Floats::new(py, vectors, "vectors", self.backend_name())?;
        let view = rows_view(&rows)?;
        match ids.filter(|i| !i.is_none()) {
            None => {
                let n = view.nrows() as u64;
                let first = py
                    .detach(|| self.write().add_auto(view))
                    .map_err(|e| index_err(py, e))?;
                // `first + n - 1` is at most 2^63 - 1 (add_auto checked it);
                // `first + n` may be 2^63, so no range ends there.
                let assigned: Array1<i64> = (0..n).map(|i| (first + i) as i64).collect();
                Ok(PyArray::from_owned_array(py, assigned).into_any())
            }
            Some(ids_obj) => {
                let ids = Ids::new(py, ids_obj, "ids")?;
                let wanted = ids.to_u64(py, "ids")?;
                py.detach(|| self.write().add(&wanted, view))
                    .map_err(|e| index_err(py, e))?;
                let assigned: Array1<i64> = ids.values()?.iter().copied().collect();
                Ok(PyArray::from_owned_array(py, assigned).into_any())
            }
        }
    }

    /// Replaces the vectors of present ids and adds the others.
    fn upsert(
        &self,
        py: Python<'_>,
        vectors: &Bound<'_, PyAny>,
        ids: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let rows = Floats::new(py, vectors, "vectors", self.backend_name())?;
        let view = rows_view(&rows)?;
        let ids = Ids::new(py, ids, "ids")?.to_u64(py, "ids")?;
        py.detach(|| self.write().upsert(&ids, view))
            .map_err(|e| index_err(py, e))
    }

    /// Removes the rows of `ids` and returns how many were present (absent
    /// and negative ids are ignored).
    fn remove(&self, py: Python<'_>, ids: &Bound<'_, PyAny>) -> PyResult<usize> {
        let ids = Ids::lookup(py, ids, "ids")?;
        let ids: Vec<u64> = ids
            .values()?
            .iter()
            .filter_map(|&id| u64::try_from(id).ok())
            .collect();
        Ok(py.detach(|| self.write().remove(&ids)))
    }

    /// The `k` best rows of each query: `(scores, ids)`.
    #[pyo3(signature = (queries, k, filter = None))]
    fn search(
        slf: &Bound<'_, PyIndex>,
        queries: &Bound<'_, PyAny>,
        k: i64,
        filter: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        let py = slf.py();
        let Some(q) = Floats::in_place(queries) else {
            return inputs(py)?
                .call_method1("search_other", (slf, queries, k, filter))
                .map(Bound::unbind);
        };
        let this = slf.get();
        let k = k_arg(py, k)?;
        let single = q.is_single();
        let (nq, _) = q.shape();
        let filter_args = FilterArgs::new(py, filter, nq)?;
        let filter_ids = filter_args.slices()?;
        let values = q.values()?;
        let view = rows_view(&q)?;
        let results = py.detach(|| -> Result<Results, Failure> {
            let mut out = Results::with_room(nq, k).map_err(Failure::Memory)?;
            let filters = filter_ids.build();
            let index = this.read();
            let l2 = index.metric() == Metric::L2;
            if single {
                let filter: Option<&Filter> = match &filters {
                    Filters::None => None,
                    Filters::Shared(f) => Some(f),
                    Filters::PerQuery(fs) => match fs.as_slice() {
                        [f] => Some(f),
                        _ => {
                            return Err(Failure::Index(IndexError::FilterCount {
                                filters: fs.len(),
                                queries: 1,
                            }))
                        }
                    },
                };
                let hits = index.search(values, k, filter).map_err(Failure::Index)?;
                out.push(&hits, l2);
            } else {
                let hits = index
                    .search_batch(view, k, filters.spec())
                    .map_err(Failure::Index)?;
                for h in &hits {
                    out.push(h, l2);
                }
            }
            Ok(out)
        });
        results.map_err(|f| f.into_py(py))?.into_py(py, single)
    }

    /// Searches `nq` row-major float32 queries that live in GPU memory at the
    /// device address `ptr` (a contiguous CUDA tensor's `data_ptr()`), read
    /// there after the work queued on the raw CUDA stream `stream`: the
    /// `cuda` backend's `Index::search_device`, the queries never crossing
    /// to the host. Returns host `(scores, ids)` arrays of shape `(nq, k)`;
    /// `topk._inputs._search_cuda_tensor` moves them to the query's device.
    #[pyo3(signature = (ptr, nq, k, filter, stream))]
    fn _search_device(
        &self,
        py: Python<'_>,
        ptr: u64,
        nq: usize,
        k: i64,
        filter: Option<&Bound<'_, PyAny>>,
        stream: u64,
    ) -> PyResult<Py<PyAny>> {
        let k = k_arg(py, k)?;
        let filter_args = FilterArgs::new(py, filter, nq)?;
        let filter_ids = filter_args.slices()?;
        let results = py.detach(|| -> Result<Results, Failure> {
            let mut out = Results::with_room(nq, k).map_err(Failure::Memory)?;
            let filters = filter_ids.build();
            let index = self.read();
            let l2 = index.metric() == Metric::L2;
            let hits = index
                .search_device(ptr, nq, k, filters.spec(), stream)
                .map_err(Failure::Index)?;
            for h in &hits {
                out.push(h, l2);
            }
            Ok(out)
        });
        results.map_err(|f| f.into_py(py))?.into_py(py, false)
    }

    /// Nanoseconds of each of `repeats` calls of the Rust `Index::search`
    /// for one float32 query, timed inside the extension: the baseline the
    /// Python call's overhead is measured against (crates/topk-py/bench/python_overhead.py).
    fn _time_rust_search(
        &self,
        py: Python<'_>,
        query: &Bound<'_, PyAny>,
        k: usize,
        repeats: usize,
    ) -> PyResult<Vec<u64>> {
        let q = Floats::new(py, query, "query", self.backend_name())?;
        let values = q.values()?;
        py.detach(|| {
            let index = self.read();
            let mut out = Vec::with_capacity(repeats);
            for _ in 0..repeats {
                let start = std::time::Instant::now();
                let hits = index.search(values, k, None)?;
                out.push(start.elapsed().as_nanos() as u64);
                std::hint::black_box(hits);
            }
            Ok(out)
        })
        .map_err(|e| index_err(py, e))
    }

    /// Nanoseconds of each of `repeats` calls of the Rust
    /// `Index::search_device` for `nq` queries at the device address `ptr`
    /// on CUDA stream `stream`, timed inside the extension: the baseline of
    /// crates/topk-py/bench/gpu_queries.py.
    fn _time_rust_search_device(
        &self,
        py: Python<'_>,
        ptr: u64,
        nq: usize,
        k: usize,
        stream: u64,
        repeats: usize,
    ) -> PyResult<Vec<u64>> {
        py.detach(|| {
            let index = self.read();
            let mut out = Vec::with_capacity(repeats);
            for _ in 0..repeats {
                let start = std::time::Instant::now();
                let hits = index.search_device(ptr, nq, k, FilterSpec::None, stream)?;
                out.push(start.elapsed().as_nanos() as u64);
                std::hint::black_box(hits);
            }
            Ok(out)
        })
        .map_err(|e| index_err(py, e))
    }

    /// Saves the index to `path` atomically.
    fn save(&self, py: Python<'_>, path: PathBuf) -> PyResult<()> {
        py.detach(|| self.read().save(&path))
            .map_err(|e| index_err(py, e))
    }

    /// Drops removed rows now (changes no result).
    fn compact(&self, py: Python<'_>) {
        py.detach(|| self.write().compact());
    }

    /// Builds the `cpu` backend's certified-path state now (int8 codes, a
    /// quarter of the bytes of f32 rows), so that single queries over 2^20
    /// stored values take the int8 path from the first one; the first batch
    /// of 16 or more queries builds it anyway (changes no result).
    fn prepare_certified(&self, py: Python<'_>) {
        py.detach(|| self.read().prepare_certified());
    }

    /// Stored rows the certified-path state covers, ``None`` before it is
    /// built.
    #[getter]
    fn certified_coverage(&self, py: Python<'_>) -> Option<usize> {
        py.detach(|| self.read().certified_coverage())
    }

    /// The live ids, ascending, as int64.
    fn ids<'py>(&self, py: Python<'py>) -> Bound<'py, PyAny> {
        let ids: Array1<i64> = py
            .detach(|| self.read().ids())
            .into_iter()
            .map(|id| id as i64)
            .collect();
        PyArray::from_owned_array(py, ids).into_any()
    }

    /// The vector stored under `id` (a copy), or None; as for `in`, any
    /// integer may be asked (a negative one, or one past 2^63 - 1, is not
    /// an id), anything else is a `TypeError`.
    fn get<'py>(
        &self,
        py: Python<'py>,
        id: &Bound<'py, PyAny>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let id = match id.extract::<u64>() {
            Ok(id) => id,
            Err(e) if e.is_instance_of::<pyo3::exceptions::PyOverflowError>(py) => return Ok(None),
            Err(e) => return Err(e),
        };
        let row = py.detach(|| self.read().get(id).map(std::borrow::Cow::into_owned));
        Ok(row.map(|row| PyArray::from_owned_array(py, Array1::from_vec(row)).into_any()))
    }

    /// Whether `id` is live; any integer may be asked (a negative one, or
    /// one past 2^63 - 1, is not an id, so it is not in the index); anything
    /// else is a `TypeError`.
    fn __contains__(&self, py: Python<'_>, id: &Bound<'_, PyAny>) -> PyResult<bool> {
        match id.extract::<u64>() {
            Ok(id) => Ok(py.detach(|| self.read().contains(id))),
            Err(e) if e.is_instance_of::<pyo3::exceptions::PyOverflowError>(py) => Ok(false),
            Err(e) => Err(e),
        }
    }

    fn __len__(&self, py: Python<'_>) -> usize {
        py.detach(|| self.read().len())
    }

    /// Values per row.
    #[getter]
    fn dim(&self) -> usize {
        self.fixed.dim
    }

    /// "dot", "cosine" or "l2".
    #[getter]
    fn metric(&self) -> &'static str {
        self.fixed.metric.as_str()
    }

    /// The backend searches run on ("cpu", "oracle", ...).
    #[getter]
    fn backend(&self) -> &'static str {
        self.backend_name()
    }

    /// How the rows are stored: "float32", "float16" or "bfloat16".
    #[getter]
    fn dtype(&self) -> &'static str {
        dtype_name(self.fixed.dtype)
    }

    /// Bytes the stored rows take.
    #[getter]
    fn nbytes(&self, py: Python<'_>) -> usize {
        py.detach(|| self.read().stored_bytes())
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        let len = py.detach(|| self.read().len());
        let f = &self.fixed;
        // The storage type is shown when it is not the default.
        let dtype = match f.dtype {
            Dtype::F32 => String::new(),
            d => format!(", dtype={:?}", dtype_name(d)),
        };
        format!(
            "topk.Index(dim={}, metric={:?}, backend={:?}{dtype}, len={len})",
            f.dim,
            f.metric.as_str(),
            f.backend.as_str(),
        )
    }
}

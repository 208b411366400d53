//! Arrays in and out. A float32 C-contiguous numpy array of rows or queries,
//! and an int64 C-contiguous numpy array of ids, are read in place; anything
//! else is handed to `topk._inputs` (pure Python), which converts it with one
//! copy, refuses it with a `TypeError` naming its dtype, or, for a CUDA
//! tensor, says which backend it needs.

use numpy::ndarray::{Array1, Array2};
use numpy::{
    PyArray, PyArray1, PyArrayDyn, PyArrayMethods, PyReadonlyArray1, PyReadonlyArrayDyn,
    PyUntypedArrayMethods,
};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyModule;
use topk::{Filter, FilterSpec, Hit};

use crate::errors::{new_err, Kind};

static INPUTS: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

/// A Python `k` as a `usize`; a negative `k` is an `InvalidInputError`
/// (`k = 0` is left to the index, whose error names it).
pub(crate) fn k_arg(py: Python<'_>, k: i64) -> PyResult<usize> {
    usize::try_from(k).map_err(|_| {
        crate::errors::new_err(
            py,
            crate::errors::Kind::InvalidInput,
            format!("k must be at least 1, got k = {k}"),
        )
    })
}

/// The pure-Python module `topk._inputs`.
pub(crate) fn inputs(py: Python<'_>) -> PyResult<&Bound<'_, PyModule>> {
    INPUTS
        .get_or_try_init(py, || py.import("topk._inputs").map(Bound::unbind))
        .map(|m| m.bind(py))
}

/// Whether an array's data starts on its element type's boundary (a view
/// at an odd byte offset does not, and cannot be read as a slice).
fn aligned<T>(data: *mut T) -> bool {
    data.cast::<u8>().align_offset(std::mem::align_of::<T>()) == 0
}

/// A float32 C-contiguous numpy array of one or two dimensions, borrowed
/// read-only for as long as this lives.
pub(crate) struct Floats<'py> {
    array: PyReadonlyArrayDyn<'py, f32>,
}

impl<'py> Floats<'py> {
    /// `obj` itself when it is float32, C-contiguous and 1- or 2-D; `None`
    /// when it needs converting.
    pub(crate) fn in_place(obj: &Bound<'py, PyAny>) -> Option<Floats<'py>> {
        let array = obj.cast::<PyArrayDyn<f32>>().ok()?;
        if !array.is_c_contiguous() || !(1..=2).contains(&array.ndim()) || !aligned(array.data()) {
            return None;
        }
        array.try_readonly().ok().map(|array| Floats { array })
    }

    /// `obj` read in place when it can be, otherwise converted once by
    /// `topk._inputs.host_float32` (named `name` in its errors).
    pub(crate) fn new(
        py: Python<'py>,
        obj: &Bound<'py, PyAny>,
        name: &str,
        backend: &str,
    ) -> PyResult<Floats<'py>> {
        if let Some(f) = Floats::in_place(obj) {
            return Ok(f);
        }
        let converted = inputs(py)?.call_method1("host_float32", (obj, name, backend))?;
        Floats::in_place(&converted).ok_or_else(|| {
            new_err(
                py,
                Kind::InvalidInput,
                format!(
                    "{name} must be one row of D values or a 2-D array of rows, got shape {:?}",
                    converted
                        .getattr("shape")
                        .map(|s| s.to_string())
                        .unwrap_or_default()
                ),
            )
        })
    }

    /// Whether the array is one vector (1-D).
    pub(crate) fn is_single(&self) -> bool {
        self.array.ndim() == 1
    }

    /// `(rows, values per row)`: a 1-D array is one row.
    pub(crate) fn shape(&self) -> (usize, usize) {
        let shape = self.array.shape();
        match *shape {
            [d] => (1, d),
            [n, d] => (n, d),
            _ => (0, 0),
        }
    }

    /// The values, row-major.
    pub(crate) fn values(&self) -> PyResult<&[f32]> {
        self.array
            .as_slice()
            .map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))
    }
}

/// An int64 C-contiguous 1-D numpy array of ids, borrowed read-only.
pub(crate) struct Ids<'py> {
    array: PyReadonlyArray1<'py, i64>,
}

impl<'py> Ids<'py> {
    fn in_place(obj: &Bound<'py, PyAny>) -> Option<Ids<'py>> {
        let array = obj.cast::<PyArray1<i64>>().ok()?;
        if !array.is_c_contiguous() || !aligned(array.data()) {
            return None;
        }
        array.try_readonly().ok().map(|array| Ids { array })
    }

    /// `obj` read in place when it can be, otherwise converted by
    /// `topk._inputs.ids_int64` (named `name` in its errors).
    pub(crate) fn new(py: Python<'py>, obj: &Bound<'py, PyAny>, name: &str) -> PyResult<Ids<'py>> {
        Ids::convert(py, obj, name, false)
    }

    /// Ids to find, not to store (`remove`, a filter): as [`Ids::new`], but
    /// an id no index can hold (above 2^63 - 1) is dropped, not refused.
    pub(crate) fn lookup(
        py: Python<'py>,
        obj: &Bound<'py, PyAny>,
        name: &str,
    ) -> PyResult<Ids<'py>> {
        Ids::convert(py, obj, name, true)
    }

    fn convert(
        py: Python<'py>,
        obj: &Bound<'py, PyAny>,
        name: &str,
        lookup: bool,
    ) -> PyResult<Ids<'py>> {
        if let Some(ids) = Ids::in_place(obj) {
            return Ok(ids);
        }
        let converted = inputs(py)?.call_method1("ids_int64", (obj, name, lookup))?;
        Ids::in_place(&converted).ok_or_else(|| {
            new_err(
                py,
                Kind::InvalidInput,
                format!("{name} must be a 1-D array of int64 ids"),
            )
        })
    }

    /// The ids as given.
    pub(crate) fn values(&self) -> PyResult<&[i64]> {
        self.array
            .as_slice()
            .map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))
    }

    /// The ids as index ids; a negative one is an error naming it and its
    /// position (ids are `0..=2^63 - 1`).
    pub(crate) fn to_u64(&self, py: Python<'_>, name: &str) -> PyResult<Vec<u64>> {
        let values = self.values()?;
        let mut out = Vec::with_capacity(values.len());
        for (position, &id) in values.iter().enumerate() {
            match u64::try_from(id) {
                Ok(id) => out.push(id),
                Err(_) => {
                    return Err(new_err(
                        py,
                        Kind::InvalidInput,
                        format!(
                        "{name}: id {id} at position {position} is negative: ids are 0..=2^63 - 1"
                    ),
                    ))
                }
            }
        }
        Ok(out)
    }
}

/// The filter argument of a search as the id arrays it names, borrowed
/// while the GIL is held; [`FilterArgs::slices`] hands their values to code
/// that runs without it, where [`FilterSlices::build`] sorts them.
pub(crate) struct FilterArgs<'py> {
    per_query: bool,
    arrays: Vec<Ids<'py>>,
}

impl<'py> FilterArgs<'py> {
    /// `obj` (None, an id array or list shared by the batch, or a list of
    /// `queries` id arrays).
    pub(crate) fn new(
        py: Python<'py>,
        obj: Option<&Bound<'py, PyAny>>,
        queries: usize,
    ) -> PyResult<FilterArgs<'py>> {
        let Some(obj) = obj.filter(|o| !o.is_none()) else {
            return Ok(FilterArgs {
                per_query: false,
                arrays: Vec::new(),
            });
        };
        if let Some(ids) = Ids::in_place(obj) {
            return Ok(FilterArgs {
                per_query: false,
                arrays: vec![ids],
            });
        }
        let (how, value): (String, Bound<'py, PyAny>) = inputs(py)?
            .call_method1("filter_spec", (obj, queries))?
            .extract()?;
        if how == "shared" {
            return Ok(FilterArgs {
                per_query: false,
                arrays: vec![Ids::lookup(py, &value, "filter")?],
            });
        }
        let mut arrays = Vec::with_capacity(queries);
        for (i, item) in value.try_iter()?.enumerate() {
            arrays.push(Ids::lookup(py, &item?, &format!("filter[{i}]"))?);
        }
        Ok(FilterArgs {
            per_query: true,
            arrays,
        })
    }

    /// The ids of each array, to be read without the GIL.
    pub(crate) fn slices(&self) -> PyResult<FilterSlices<'_>> {
        let values = self
            .arrays
            .iter()
            .map(Ids::values)
            .collect::<PyResult<Vec<_>>>()?;
        Ok(match (self.per_query, values.as_slice()) {
            (true, _) => FilterSlices::PerQuery(values),
            (false, [one]) => FilterSlices::Shared(one),
            (false, _) => FilterSlices::None,
        })
    }
}

/// The ids of a search's filter argument.
pub(crate) enum FilterSlices<'a> {
    /// No filter.
    None,
    /// One allow-list for every query.
    Shared(&'a [i64]),
    /// One allow-list per query.
    PerQuery(Vec<&'a [i64]>),
}

impl FilterSlices<'_> {
    /// The filters (sorted and deduplicated: run it without the GIL). The
    /// negative ids are dropped: a filter ignores them as it ignores ids the
    /// index does not hold, so `-1` padding from a result can be passed back.
    pub(crate) fn build(&self) -> Filters {
        let filter = |ids: &[i64]| Filter::new(ids.iter().filter_map(|&id| u64::try_from(id).ok()));
        match self {
            FilterSlices::None => Filters::None,
            FilterSlices::Shared(ids) => Filters::Shared(filter(ids)),
            FilterSlices::PerQuery(all) => {
                Filters::PerQuery(all.iter().map(|ids| filter(ids)).collect())
            }
        }
    }
}

/// The filter argument of a search, resolved.
pub(crate) enum Filters {
    /// No filter.
    None,
    /// One allow-list for every query.
    Shared(Filter),
    /// One allow-list per query.
    PerQuery(Vec<Filter>),
}

impl Filters {
    /// As a [`FilterSpec`] for a batch search.
    pub(crate) fn spec(&self) -> FilterSpec<'_> {
        match self {
            Filters::None => FilterSpec::None,
            Filters::Shared(f) => FilterSpec::Shared(f),
            Filters::PerQuery(fs) => FilterSpec::PerQuery(fs),
        }
    }
}

/// The result arrays of a search, filled without the GIL: `queries × k`
/// scores and ids, padded with `-inf` (`+inf` as an L2 distance) and `-1`.
pub(crate) struct Results {
    scores: Vec<f32>,
    ids: Vec<i64>,
    queries: usize,
    k: usize,
}

impl Results {
    /// Room for `queries × k` results, or an error when that much memory
    /// cannot be had (an absurd K fails cleanly instead of aborting).
    pub(crate) fn with_room(queries: usize, k: usize) -> Result<Results, String> {
        let too_big =
            || format!("k = {k} for {queries} queries asks for more result memory than can be had");
        let n = queries.checked_mul(k).ok_or_else(too_big)?;
        let mut scores = Vec::new();
        let mut ids = Vec::new();
        scores.try_reserve_exact(n).map_err(|_| too_big())?;
        ids.try_reserve_exact(n).map_err(|_| too_big())?;
        Ok(Results {
            scores,
            ids,
            queries,
            k,
        })
    }

    /// Appends one query's hits, padded to `k`. For L2 the score (the
    /// negated squared distance) is negated back into the squared distance.
    pub(crate) fn push(&mut self, hits: &[Hit], l2: bool) {
        for hit in hits.iter().take(self.k) {
            self.scores.push(if l2 { -hit.score } else { hit.score });
            // Ids are at most 2^63 - 1, so they fit an i64.
            self.ids.push(hit.id as i64);
        }
        let pad = self.k.saturating_sub(hits.len());
        let empty = if l2 { f32::INFINITY } else { f32::NEG_INFINITY };
        self.scores.extend(std::iter::repeat_n(empty, pad));
        self.ids.extend(std::iter::repeat_n(-1, pad));
    }

    /// `(scores, ids)` as numpy arrays of shape `(k,)` when `single`, else
    /// `(queries, k)`; the vectors move into the arrays uncopied.
    pub(crate) fn into_py(self, py: Python<'_>, single: bool) -> PyResult<Py<PyAny>> {
        if single {
            let scores = PyArray::from_owned_array(py, Array1::from_vec(self.scores));
            let ids = PyArray::from_owned_array(py, Array1::from_vec(self.ids));
            return Ok((scores, ids).into_pyobject(py)?.into_any().unbind());
        }
        let shape = (self.queries, self.k);
        let bad = |e: numpy::ndarray::ShapeError| {
            pyo3::exceptions::PyRuntimeError::new_err(e.to_string())
        };
        let scores = Array2::from_shape_vec(shape, self.scores).map_err(bad)?;
        let ids = Array2::from_shape_vec(shape, self.ids).map_err(bad)?;
        let scores = PyArray::from_owned_array(py, scores);
        let ids = PyArray::from_owned_array(py, ids);
        Ok((scores, ids).into_pyobject(py)?.into_any().unbind())
    }
}

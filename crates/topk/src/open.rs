//! One way to build any backend: a corpus, a metric, options.

use std::borrow::Cow;
use std::sync::Arc;

use ndarray::{Array2, ArrayView2};
use topk_core::{Dtype, Metric, Retriever, RowStore};
use topk_cpu::{CpuRetriever, Oracle};
use topk_cuda_loader::LoadError;
use topk_hnsw::{Hnsw, HnswError, HnswParams};

use crate::backend::{Backend, Unavailable};
use crate::{CoreError, CudaConfig};

/// The rows a backend is built over.
///
/// An owned row-major corpus moves into a host backend (no second copy of
/// a large corpus); an owned array of another layout, and a view, are
/// copied once. Build one with `.into()` from an
/// [`Array2`], an [`ArrayView2`], a `&Array2` or a `(Vec<f32>, dim)` pair of
/// row-major values.
#[derive(Debug)]
pub enum Corpus<'a> {
    /// A borrowed `N × D` view of any layout.
    View(ArrayView2<'a, f32>),
    /// An owned `N × D` array of any layout.
    Owned(Array2<f32>),
    /// `data.len() / dim` rows of `dim` values, row-major.
    RowMajor {
        /// The values, row after row.
        data: Vec<f32>,
        /// Values per row, D.
        dim: usize,
    },
}

impl<'a> From<ArrayView2<'a, f32>> for Corpus<'a> {
    fn from(view: ArrayView2<'a, f32>) -> Self {
        Corpus::View(view)
    }
}

impl<'a> From<&'a Array2<f32>> for Corpus<'a> {
    fn from(array: &'a Array2<f32>) -> Self {
        Corpus::View(array.view())
    }
}

impl From<Array2<f32>> for Corpus<'_> {
    fn from(array: Array2<f32>) -> Self {
        Corpus::Owned(array)
    }
}

impl From<(Vec<f32>, usize)> for Corpus<'_> {
    fn from((data, dim): (Vec<f32>, usize)) -> Self {
        Corpus::RowMajor { data, dim }
    }
}

impl Corpus<'_> {
    /// The row-major values and D, borrowed when they already are one run.
    fn rowmajor(&self) -> (Cow<'_, [f32]>, usize) {
        match self {
            Corpus::View(v) => (standard(*v), v.ncols()),
            Corpus::Owned(a) => (standard(a.view()), a.ncols()),
            Corpus::RowMajor { data, dim } => (Cow::Borrowed(data), *dim),
        }
    }

    /// The docs/CONTRACTS.md §4 rules of a corpus, checked in place (no
    /// copy, whatever the layout).
    fn check(&self) -> Result<(), CoreError> {
        match self {
            Corpus::View(v) => topk_core::validate::corpus_view(*v).map(|_| ()),
            Corpus::Owned(a) => topk_core::validate::corpus_view(a.view()).map(|_| ()),
            Corpus::RowMajor { data, dim } => topk_core::validate::corpus(data, *dim).map(|_| ()),
        }
    }
}

/// The values of `v` in row-major order, borrowed when they already are.
fn standard<'a>(v: ArrayView2<'a, f32>) -> Cow<'a, [f32]> {
    match v.to_slice() {
        Some(s) => Cow::Borrowed(s),
        None => Cow::Owned(v.iter().copied().collect()),
    }
}

/// The row-major values of `a`, reusing its buffer when it already is one.
fn into_rowmajor(a: Array2<f32>) -> Vec<f32> {
    let len = a.len();
    if !a.is_standard_layout() {
        return a.iter().copied().collect();
    }
    let (mut data, offset) = a.into_raw_vec_and_offset();
    let offset = offset.unwrap_or(0);
    if offset == 0 && data.len() == len {
        return data;
    }
    // A standard-layout array over part of its buffer: its values are one run.
    data.truncate(offset + len);
    data.drain(..offset);
    data
}

/// What the backends take beyond the corpus and the metric.
///
/// ```
/// use topk::{HnswParams, Options};
///
/// let opts = Options::new().hnsw(HnswParams { m: 8, ..HnswParams::default() });
/// assert_eq!(opts.hnsw.m, 8);
/// ```
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct Options {
    /// Device and limits of the `cuda` backend: `device`, `max_k`,
    /// `max_batch` and `streams` reach the engine through its plugin; the
    /// hidden `tuning` fields do not (the engine keeps its defaults).
    pub cuda: CudaConfig,
    /// Graph parameters of the `hnsw` backend (its build is parallel unless
    /// [`HnswParams::parallel`] is false).
    pub hnsw: HnswParams,
    /// Told how many rows the `hnsw` backend's graph holds while it is
    /// built; the other backends do not call it.
    pub progress: Option<BuildProgress>,
    /// How the corpus is stored (docs/CONTRACTS.md §14): `f32` as given, or
    /// `f16` / `bf16`, each value rounded once to the nearest of the type.
    /// Every backend then searches the rounded values: `cpu`, `oracle` and
    /// `cuda` (on the device) hold them at half the bytes; `hnsw` holds them
    /// widened to `f32` (the same answers, not yet the smaller footprint).
    pub dtype: Dtype,
    /// Builds the `cpu` backend's certified-path state at open
    /// ([`CpuRetriever::prepare_certified`]: int8 codes, a quarter of the
    /// bytes of f32 rows, where the CPU runs the int8 product), so that
    /// single queries over 2^20 values or more take the int8 path from the
    /// first one. Off by default: the first batch of 16 or more queries
    /// builds it, and memory grows only then. The answers are the same
    /// bytes either way; the other backends ignore it.
    pub prepare_certified: bool,
}

/// A callback told the rows inserted so far while a long build runs (about
/// every 1,024 rows and with `N` at the end), from the building threads: a
/// parallel build's threads race, so a count may arrive after a larger one
/// and `N` may come twice. It only observes: the build does the same work
/// with or without it (a sequential build gives the same graph; a parallel
/// one, as always, need not, docs/CONTRACTS.md §9).
///
/// ```
/// use std::sync::atomic::{AtomicUsize, Ordering};
/// use std::sync::Arc;
/// use topk::{Backend, BuildProgress, Metric, Options};
///
/// let rows = Arc::new(AtomicUsize::new(0));
/// let seen = Arc::clone(&rows);
/// let opts = Options::new().progress(BuildProgress::new(move |r| seen.store(r, Ordering::Relaxed)));
/// let corpus = ndarray::Array2::from_shape_fn((50, 4), |(i, j)| (i * 4 + j) as f32);
/// let index = topk::open(Backend::Hnsw, corpus, Metric::L2, &opts)?;
/// assert_eq!(rows.load(Ordering::Relaxed), 50);
/// # let _ = index;
/// # Ok::<_, topk::Error>(())
/// ```
#[derive(Clone)]
pub struct BuildProgress(Arc<dyn Fn(usize) + Send + Sync>);

impl BuildProgress {
    /// Wraps `report`, called with the rows built so far.
    pub fn new(report: impl Fn(usize) + Send + Sync + 'static) -> Self {
        BuildProgress(Arc::new(report))
    }
}

impl std::fmt::Debug for BuildProgress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BuildProgress(..)")
    }
}

impl Options {
    /// The defaults of every backend.
    pub fn new() -> Self {
        Self::default()
    }

    /// Uses `config` for the `cuda` backend.
    pub fn cuda(mut self, config: CudaConfig) -> Self {
        self.cuda = config;
        self
    }

    /// Uses `params` for the `hnsw` backend.
    pub fn hnsw(mut self, params: HnswParams) -> Self {
        self.hnsw = params;
        self
    }

    /// Stores the corpus as `dtype`.
    pub fn dtype(mut self, dtype: Dtype) -> Self {
        self.dtype = dtype;
        self
    }

    /// Builds the `cpu` backend's certified-path state at open (see
    /// [`Options::prepare_certified`]).
    pub fn prepare_certified(mut self, on: bool) -> Self {
        self.prepare_certified = on;
        self
    }

    /// Reports the progress of a long build to `progress`.
    pub fn progress(mut self, progress: BuildProgress) -> Self {
        self.progress = Some(progress);
        self
    }
}

/// Everything [`open`] can fail with.
///
/// A corpus that breaks an input rule (`docs/CONTRACTS.md §4`) is
/// [`Error::Core`] whichever backend was asked for.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The corpus broke an input rule (no rows, D = 0, a non-finite value,
    /// ...), or a search through [`Retriever`] failed (`?` on its result).
    #[error(transparent)]
    Core(CoreError),
    /// The backend cannot run in this build or on this machine.
    #[error(transparent)]
    Unavailable(#[from] Unavailable),
    /// The HNSW index could not be built (a parameter out of range).
    #[error(transparent)]
    Hnsw(HnswError),
    /// The GPU engine failed (device memory, a limit out of range, a driver
    /// call).
    #[error(transparent)]
    Cuda(LoadError),
}

impl From<CoreError> for Error {
    fn from(e: CoreError) -> Self {
        Error::Core(e)
    }
}

impl From<HnswError> for Error {
    fn from(e: HnswError) -> Self {
        match e {
            HnswError::Input(e) => Error::Core(e),
            e => Error::Hnsw(e),
        }
    }
}

/// Builds `backend` over `corpus` under `metric`.
///
/// The corpus is validated (`docs/CONTRACTS.md §4`) and, for the host
/// backends, moves in when owned; the `cuda` backend uploads it to the device
/// and keeps no host copy.
///
/// Errors: [`Error::Core`] for a corpus that breaks an input rule,
/// [`Error::Unavailable`] for a backend this build or machine lacks,
/// [`Error::Hnsw`] / [`Error::Cuda`] for a backend's own failure.
pub fn open<'a>(
    backend: Backend,
    corpus: impl Into<Corpus<'a>>,
    metric: Metric,
    options: &Options,
) -> Result<Box<dyn Retriever>, Error> {
    let corpus = corpus.into();
    if options.dtype != Dtype::F32 {
        return open_stored(backend, corpus, metric, options);
    }
    Ok(match backend {
        Backend::Cpu => Box::new(prepared(
            match corpus {
                Corpus::View(v) => CpuRetriever::new(v, metric)?,
                Corpus::Owned(a) => {
                    let dim = a.ncols();
                    CpuRetriever::from_rowmajor(into_rowmajor(a), dim, metric)?
                }
                Corpus::RowMajor { data, dim } => CpuRetriever::from_rowmajor(data, dim, metric)?,
            },
            options,
        )),
        Backend::Oracle => Box::new(match corpus {
            Corpus::View(v) => Oracle::new(v, metric)?,
            Corpus::Owned(a) => {
                let dim = a.ncols();
                Oracle::from_rowmajor(into_rowmajor(a), dim, metric)?
            }
            Corpus::RowMajor { data, dim } => Oracle::from_rowmajor(data, dim, metric)?,
        }),
        Backend::Hnsw => {
            let params = options.hnsw;
            match &options.progress {
                Some(progress) => {
                    let (data, dim) = match corpus {
                        Corpus::View(v) => {
                            // Checked before the copy, as `Hnsw::new` does.
                            topk_core::validate::corpus_view(v)?;
                            (standard(v).into_owned(), v.ncols())
                        }
                        Corpus::Owned(a) => {
                            let dim = a.ncols();
                            (into_rowmajor(a), dim)
                        }
                        Corpus::RowMajor { data, dim } => (data, dim),
                    };
                    Box::new(Hnsw::from_rowmajor_with_progress(
                        data,
                        dim,
                        metric,
                        params,
                        &*progress.0,
                    )?)
                }
                None => Box::new(match corpus {
                    Corpus::View(v) => Hnsw::new(v, metric, params)?,
                    Corpus::Owned(a) => {
                        let dim = a.ncols();
                        Hnsw::from_rowmajor(into_rowmajor(a), dim, metric, params)?
                    }
                    Corpus::RowMajor { data, dim } => {
                        Hnsw::from_rowmajor(data, dim, metric, params)?
                    }
                }),
            }
        }
        Backend::Cuda => {
            // The input rules come first whichever backend and build: a
            // build without `cuda` checks the corpus before saying so (a
            // build with it checks it in the loader, before the plugin).
            if !Backend::Cuda.compiled() {
                corpus.check()?;
            }
            let (data, dim) = corpus.rowmajor();
            crate::cuda::open(&data, dim, metric, &options.cuda)?
        }
    })
}

/// `cpu` with its certified-path state built when the options ask for it.
fn prepared(cpu: CpuRetriever, options: &Options) -> CpuRetriever {
    if options.prepare_certified {
        cpu.prepare_certified();
    }
    cpu
}

/// [`open`] for a half-width `options.dtype`: the corpus is rounded and
/// checked once, as stored; the host exact backends keep the store, the
/// others the widened values.
fn open_stored(
    backend: Backend,
    corpus: Corpus<'_>,
    metric: Metric,
    options: &Options,
) -> Result<Box<dyn Retriever>, Error> {
    let dtype = options.dtype;
    let store = match corpus {
        Corpus::View(v) => {
            let mut store = RowStore::empty(v.ncols(), dtype)?;
            topk_core::validate::corpus_shape(v.len(), v.ncols())?;
            store.push_rows(&standard(v))?;
            store
        }
        Corpus::Owned(a) => {
            let dim = a.ncols();
            RowStore::from_f32(into_rowmajor(a), dim, dtype)?
        }
        Corpus::RowMajor { data, dim } => RowStore::from_f32(data, dim, dtype)?,
    };
    let dim = store.dim();
    Ok(match backend {
        Backend::Cpu => Box::new(prepared(CpuRetriever::from_store(store, metric)?, options)),
        Backend::Oracle => Box::new(Oracle::from_store(store, metric)?),
        Backend::Hnsw => {
            // Before the rows are widened (a second copy).
            options.hnsw.validate()?;
            let data = store.to_f32();
            drop(store);
            let params = options.hnsw;
            Box::new(match &options.progress {
                Some(p) => Hnsw::from_rowmajor_with_progress(data, dim, metric, params, &*p.0)?,
                None => Hnsw::from_rowmajor(data, dim, metric, params)?,
            })
        }
        Backend::Cuda => crate::cuda::open_store(&store, metric, &options.cuda)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::{array, s};

    #[test]
    fn rowmajor_of_any_layout() {
        let a = array![[1.0_f32, 2.0, 3.0], [4.0, 5.0, 6.0]];
        assert_eq!(into_rowmajor(a.clone()), vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        assert_eq!(
            into_rowmajor(a.t().to_owned()),
            vec![1.0, 4.0, 2.0, 5.0, 3.0, 6.0]
        );
        let mut b = a.clone();
        b.slice_collapse(s![1.., ..]);
        assert_eq!(into_rowmajor(b), vec![4.0, 5.0, 6.0]);
        let t = Corpus::from(a.t());
        let (data, dim) = t.rowmajor();
        assert_eq!((&*data, dim), (&[1.0, 4.0, 2.0, 5.0, 3.0, 6.0][..], 2));
        assert!(matches!(Corpus::from(&a).rowmajor().0, Cow::Borrowed(_)));
    }

    #[test]
    fn every_corpus_form_opens_the_same_index() {
        let a = array![[1.0_f32, 0.0], [0.0, 1.0], [0.6, 0.8]];
        let forms: [Corpus<'_>; 4] = [
            a.view().into(),
            (&a).into(),
            a.clone().into(),
            (a.iter().copied().collect::<Vec<f32>>(), 2).into(),
        ];
        for corpus in forms {
            let r = open(Backend::Cpu, corpus, Metric::Dot, &Options::new()).unwrap();
            assert_eq!((r.len(), r.dim(), r.backend()), (3, 2, "cpu"));
            assert_eq!(r.search(&[0.0, 2.0], 1).unwrap()[0].index, 1);
        }
    }

    #[test]
    fn input_rules_are_input_errors_on_every_host_backend() {
        for b in [Backend::Cpu, Backend::Oracle, Backend::Hnsw] {
            let e = open(b, Array2::<f32>::zeros((0, 3)), Metric::L2, &Options::new());
            assert!(matches!(e, Err(Error::Core(CoreError::EmptyCorpus))), "{b}");
            let e = open(b, (vec![1.0; 7], 3), Metric::L2, &Options::new());
            assert!(
                matches!(
                    e,
                    Err(Error::Core(CoreError::RaggedCorpus { len: 7, dim: 3 }))
                ),
                "{b}"
            );
        }
    }

    /// The corpus's rules come before the backend's own checks, in every
    /// form of the corpus, with or without progress reports, at every
    /// storage type.
    #[test]
    fn corpus_rules_come_before_hnsw_parameters_and_a_missing_backend() {
        let bad = Options::new().hnsw(HnswParams::with_m(1));
        let reported = bad.clone().progress(BuildProgress::new(|_| {}));
        let nan = array![[1.0_f32, f32::NAN], [0.0, 1.0]];
        for opts in [&bad, &reported, &bad.clone().dtype(Dtype::F16)] {
            let forms: [Corpus<'_>; 4] = [
                nan.view().into(),
                nan.clone().into(),
                nan.t().to_owned().reversed_axes().into(),
                (nan.iter().copied().collect::<Vec<f32>>(), 2).into(),
            ];
            for corpus in forms {
                let e = open(Backend::Hnsw, corpus, Metric::L2, opts);
                assert!(
                    matches!(e, Err(Error::Core(CoreError::NonFinite { .. }))),
                    "{:?}",
                    e.err()
                );
            }
        }
        if !Backend::Cuda.compiled() {
            let e = open(
                Backend::Cuda,
                Array2::<f32>::zeros((0, 3)),
                Metric::L2,
                &Options::new(),
            );
            assert!(
                matches!(e, Err(Error::Core(CoreError::EmptyCorpus))),
                "{:?}",
                e.err()
            );
            let e = open(Backend::Cuda, nan.view(), Metric::L2, &Options::new());
            assert!(
                matches!(e, Err(Error::Core(CoreError::NonFinite { .. }))),
                "{:?}",
                e.err()
            );
        }
    }

    #[test]
    fn hnsw_parameters_are_checked() {
        let opts = Options::new().hnsw(HnswParams::with_m(1));
        let Err(e) = open(Backend::Hnsw, (vec![1.0; 8], 2), Metric::Dot, &opts) else {
            panic!("m = 1 was accepted");
        };
        assert!(matches!(e, Error::Hnsw(_)), "{e}");
        assert!(e.to_string().contains("m = 1"), "{e}");
    }

    #[test]
    #[cfg(not(feature = "cuda"))]
    fn cuda_without_the_feature_says_how_to_get_it() {
        let Err(e) = open(
            Backend::Cuda,
            (vec![1.0; 4], 2),
            Metric::Dot,
            &Options::new(),
        ) else {
            panic!("a build without the cuda feature opened a cuda backend");
        };
        assert!(matches!(e, Error::Unavailable(_)), "{e}");
        assert!(e.to_string().contains("--features cuda"), "{e}");
    }
}

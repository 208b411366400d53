//! The CUDA backend of topk, loaded at run time.
//!
//! The GPU engine ([`topk_cuda`] with its `cuda` feature) links the NVIDIA
//! driver's `libcuda.so.1`. A program that linked it directly would not start
//! at all on a machine without the driver, whatever backend it was asked to
//! use. So the engine is built as a separate library,
//! `libtopk_cuda_plugin.so` (crates/topk-cuda-plugin), behind the small C ABI
//! of [`abi`], and this crate, which links no CUDA at all, opens it with
//! `libloading` the first time a CUDA backend is asked for. Where the driver
//! is missing, that is an ordinary error ([`LoadError::DriverMissing`], which
//! names `libcuda.so.1`) and every other backend keeps working.
//!
//! The plugin is looked for (see [`plugin_path`]) at `$TOPK_CUDA_PLUGIN` when
//! set, else next to the running executable, in its parent folder, and in
//! `../lib`. Build it with `cargo build --release -p topk-cuda-plugin
//! --features cuda`.
//!
//! ```no_run
//! use topk_core::{Metric, Retriever};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let (n, d) = (1_000, 64);
//! let corpus: Vec<f32> = (0..n * d).map(|i| (i % 17) as f32).collect();
//! let config = topk_cuda_loader::CudaConfig::default();
//! match topk_cuda_loader::open_rowmajor(&corpus, d, Metric::Dot, &config) {
//!     Ok(gpu) => println!("best row: {}", gpu.search(&corpus[..d], 1)?[0].index),
//!     Err(e) => eprintln!("no CUDA backend here: {e}"),
//! }
//! # Ok(()) }
//! ```
//!
//! Inputs are checked here, by the rules of docs/CONTRACTS.md §4 (the same
//! `topk_core::validate` calls as every backend), before anything crosses
//! into the plugin, so a bad query gets the same typed error on every backend.

pub mod abi;
mod error;
mod ffi;
mod locate;
mod resident;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use ndarray::ArrayView2;
use topk_core::{validate, Metric, Neighbor, Retriever, RowStore};

pub use error::{EngineErrorKind, LoadError};
pub use resident::CudaResident;

use abi::{metric_code, metric_from_code, PluginConfig, Status};
use ffi::{CallError, Handle, Plugin};

/// The engine limits a CUDA backend is opened with (the engine's own type;
/// only its `device`, `max_k`, `max_batch` and `streams` reach the plugin,
/// everything else keeps the engine's defaults).
pub use topk_cuda::CudaConfig;
/// Which rows a [`CudaResident`] search may return.
pub use topk_cuda::IdFilter;

/// What the driver reports about a device, and which plugin asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceSummary {
    /// The plugin file that answered.
    pub plugin: PathBuf,
    /// CUDA device ordinal.
    pub device: usize,
    /// Marketing name, e.g. "NVIDIA H200".
    pub name: String,
    /// Driver API version, e.g. "13.0".
    pub driver_version: String,
    /// Device memory in bytes.
    pub total_memory: u64,
    /// Compute capability (major, minor).
    pub compute_capability: (i32, i32),
    /// Streaming multiprocessors.
    pub multiprocessors: u32,
}

/// Plugins loaded so far, by path; never unloaded (engines and the CUDA
/// driver's state live in them).
static LOADED: Mutex<Option<HashMap<PathBuf, Arc<Plugin>>>> = Mutex::new(None);

/// The plugin file a CUDA backend would load now, or where it was looked for.
pub fn plugin_path() -> Result<PathBuf, LoadError> {
    locate::find()
}

/// Finds and loads the plugin (once per path).
fn plugin() -> Result<Arc<Plugin>, LoadError> {
    let path = locate::find()?;
    let mut loaded = LOADED
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let map = loaded.get_or_insert_with(HashMap::new);
    if let Some(p) = map.get(&path) {
        return Ok(Arc::clone(p));
    }
    let p = Arc::new(Plugin::load(&path)?);
    tracing::debug!(plugin = %path.display(), "loaded the CUDA plugin");
    map.insert(path, Arc::clone(&p));
    Ok(p)
}

/// The error of a failed plugin call.
fn call_error(path: &Path, (status, message): CallError) -> LoadError {
    let kind = match status {
        Status::NotCompiled => {
            return LoadError::WithoutCuda {
                path: path.to_owned(),
            }
        }
        Status::NoDriver => EngineErrorKind::NoDriver,
        Status::NoDevice => EngineErrorKind::NoDevice,
        Status::OutOfMemory => EngineErrorKind::OutOfMemory,
        Status::InvalidInput => EngineErrorKind::InvalidInput,
        Status::InvalidOption => EngineErrorKind::InvalidOption,
        Status::Driver => EngineErrorKind::Driver,
        Status::Panic => EngineErrorKind::Panic,
        Status::BadArgument => EngineErrorKind::BadArgument,
        Status::Ok | Status::Other | Status::Unknown(_) => EngineErrorKind::Other,
    };
    let message = if message.is_empty() {
        format!("the CUDA plugin failed with status {}", status.code())
    } else {
        message
    };
    LoadError::Engine { kind, message }
}

/// Whether a CUDA backend can run here: loads the plugin and asks the driver
/// about device 0. The error says what is missing (the plugin file, the
/// NVIDIA driver, a device, or a plugin built with CUDA).
pub fn available() -> Result<DeviceSummary, LoadError> {
    available_device(CudaConfig::default().device)
}

/// As [`available`], for device ordinal `device`.
pub fn available_device(device: usize) -> Result<DeviceSummary, LoadError> {
    let p = plugin()?;
    let raw = p
        .device_summary(device)
        .map_err(|e| call_error(p.path(), e))?;
    Ok(DeviceSummary {
        plugin: p.path().to_owned(),
        device,
        name: abi::field_text(&raw.name, raw.name_len),
        driver_version: abi::field_text(&raw.driver_version, raw.driver_version_len),
        total_memory: raw.total_memory,
        compute_capability: (raw.compute_major, raw.compute_minor),
        multiprocessors: raw.multiprocessors,
    })
}

/// Uploads a row-major corpus of `data.len() / dim` rows to the GPU through
/// the plugin.
///
/// Errors: the input rules of docs/CONTRACTS.md §4 ([`LoadError::Input`]),
/// then whatever keeps the plugin from loading, then the engine's own
/// (no device, out of memory, a configuration value out of range).
pub fn open_rowmajor(
    data: &[f32],
    dim: usize,
    metric: Metric,
    config: &CudaConfig,
) -> Result<CudaPlugin, LoadError> {
    // A large corpus's values are checked by the engine as they stream to
    // the device (topk_cuda::STAGED_UPLOAD_MIN_BYTES); should it refuse
    // them, the same check here turns the refusal into the typed error.
    let large = std::mem::size_of_val(data) >= topk_cuda::STAGED_UPLOAD_MIN_BYTES;
    let n = if large {
        validate::corpus_shape(data.len(), dim)?
    } else {
        validate::corpus(data, dim)?
    };
    let p = match plugin() {
        Ok(p) => p,
        Err(e) => {
            // The input rules come first, whatever else is missing.
            if large {
                validate::corpus_values(data, dim)?;
            }
            return Err(e);
        }
    };
    let handle = match p.open(
        data,
        dim,
        metric_code(metric),
        &PluginConfig::from_config(config),
    ) {
        Ok(h) => h,
        Err(e) => {
            if large {
                validate::corpus_values(data, dim)?;
            }
            return Err(call_error(p.path(), e));
        }
    };
    finish_open(&p, handle, n, dim, metric)
}

/// The plugin's new engine after checking that it holds what was asked.
fn finish_open(
    p: &Arc<Plugin>,
    handle: Handle,
    n: usize,
    dim: usize,
    metric: Metric,
) -> Result<CudaPlugin, LoadError> {
    let reported = (
        handle.len(),
        handle.dim(),
        metric_from_code(handle.metric()),
    );
    if reported != (n, dim, Some(metric)) {
        return Err(LoadError::Engine {
            kind: EngineErrorKind::BadArgument,
            message: format!(
                "the CUDA plugin {} opened N = {}, D = {}, metric code {} for N = {n}, D = {dim}, {metric}",
                p.path().display(),
                reported.0,
                reported.1,
                handle.metric()
            ),
        });
    }
    let device_name = handle.device_name().map_err(|e| call_error(p.path(), e))?;
    Ok(CudaPlugin {
        handle,
        n,
        dim,
        metric,
        device_name,
    })
}

/// Uploads the rows of `store` to the GPU through the plugin, held on the
/// device as they are stored (docs/CONTRACTS.md §14): an `f16` / `bf16`
/// store takes half the device memory and every search reads half the
/// bytes. The store's rows were checked as they were stored.
///
/// Errors: whatever keeps the plugin from loading, then the engine's own.
pub fn open_store(
    store: &RowStore,
    metric: Metric,
    config: &CudaConfig,
) -> Result<CudaPlugin, LoadError> {
    let dim = store.dim();
    if let Some(flat) = store.as_f32() {
        return open_rowmajor(flat, dim, metric, config);
    }
    let bits = store.as_bits16().unwrap_or_default();
    let p = plugin()?;
    let raw = PluginConfig::from_config(config).with_dtype(store.dtype());
    let handle = p
        .open(bits, dim, metric_code(metric), &raw)
        .map_err(|e| call_error(p.path(), e))?;
    finish_open(&p, handle, store.len(), dim, metric)
}

/// As [`open_rowmajor`], from an `N × D` view of any layout (copied once to
/// row-major order when it is not already).
pub fn open(
    corpus: ArrayView2<'_, f32>,
    metric: Metric,
    config: &CudaConfig,
) -> Result<CudaPlugin, LoadError> {
    let dim = corpus.ncols();
    match corpus.as_slice() {
        Some(flat) => open_rowmajor(flat, dim, metric, config),
        None => {
            validate::corpus_view(corpus)?;
            let flat: Vec<f32> = corpus.iter().copied().collect();
            open_rowmajor(&flat, dim, metric, config)
        }
    }
}

/// A GPU-resident corpus inside the plugin: a [`Retriever`] like any other,
/// returning the bytes of the CPU oracle.
#[derive(Debug)]
pub struct CudaPlugin {
    handle: Handle,
    n: usize,
    dim: usize,
    metric: Metric,
    device_name: String,
}

impl CudaPlugin {
    /// The device the corpus lives on, e.g. "NVIDIA H200".
    pub fn device_name(&self) -> &str {
        &self.device_name
    }

    /// The plugin file the engine runs in.
    pub fn plugin_path(&self) -> &Path {
        self.handle.plugin().path()
    }

    fn fail(&self, e: CallError) -> LoadError {
        call_error(self.plugin_path(), e)
    }

    /// One host query, with this crate's error type.
    pub fn search_host(
        &self,
        query: &[f32],
        k: usize,
        out: &mut Vec<Neighbor>,
    ) -> Result<(), LoadError> {
        validate::query(query, self.dim)?;
        let kk = validate::k(k, self.n)?;
        let mut indices = vec![0u32; kk];
        let mut scores = vec![0f32; kk];
        let got = self
            .handle
            .search(query, k, &mut indices, &mut scores)
            .map_err(|e| self.fail(e))?;
        out.clear();
        out.extend(
            indices[..got]
                .iter()
                .zip(&scores[..got])
                .map(|(&i, &s)| Neighbor::new(i, s)),
        );
        Ok(())
    }

    /// A batch of row-major queries (`queries.len() / D` of them), searched
    /// by the engine's batch path, with this crate's error type. The engine
    /// checks the values on the device as it stages them; a batch it refuses
    /// is checked here for the typed error (the first query at fault, its
    /// column and value).
    pub fn search_batch_rowmajor(
        &self,
        queries: &[f32],
        k: usize,
    ) -> Result<Vec<Vec<Neighbor>>, LoadError> {
        let d = self.dim;
        if d == 0 || queries.len() % d != 0 || k == 0 {
            validate::queries_rowmajor(queries, d)?;
        }
        let kk = validate::k(k, self.n)?;
        let nq = queries.len() / d;
        if nq == 0 {
            return Ok(Vec::new());
        }
        let (mut indices, mut scores, mut counts) = result_buffers::<u32>(nq, kk, k)?;
        self.handle
            .search_batch(queries, d, k, kk, &mut indices, &mut scores, &mut counts)
            .map_err(|e| match self.fail(e) {
                e @ LoadError::Engine {
                    kind: EngineErrorKind::InvalidInput,
                    ..
                } => validate::queries_rowmajor(queries, d)
                    .err()
                    .map_or(e, LoadError::from),
                e => e,
            })?;
        Ok(counts
            .iter()
            .enumerate()
            .map(|(i, &c)| {
                let at = i * kk;
                let c = c.min(kk);
                indices[at..at + c]
                    .iter()
                    .zip(&scores[at..at + c])
                    .map(|(&i, &s)| Neighbor::new(i, s))
                    .collect()
            })
            .collect())
    }
}

impl Retriever for CudaPlugin {
    fn backend(&self) -> &'static str {
        "cuda"
    }
    fn len(&self) -> usize {
        self.n
    }
    fn dim(&self) -> usize {
        self.dim
    }
    fn metric(&self) -> Metric {
        self.metric
    }
    fn search_into(
        &self,
        query: &[f32],
        k: usize,
        out: &mut Vec<Neighbor>,
    ) -> topk_core::Result<()> {
        Ok(self.search_host(query, k, out)?)
    }
    fn search_batch(
        &self,
        queries: ArrayView2<'_, f32>,
        k: usize,
    ) -> topk_core::Result<Vec<Vec<Neighbor>>> {
        // The engine checks the values on the device as it stages them.
        Ok(validate::queries_checked_by(
            queries,
            self.dim,
            k,
            |flat| self.search_batch_rowmajor(flat, k),
            |e| matches!(e, LoadError::Input(_)),
        )?)
    }
}

/// Zeroed result buffers for `nq` queries of `stride` results each (ids of
/// type `I`, scores, counts), or an error naming `k` when they do not fit
/// in memory: reserved, never allocated blindly.
#[allow(clippy::type_complexity)]
fn result_buffers<I: Copy + Default>(
    nq: usize,
    stride: usize,
    k: usize,
) -> Result<(Vec<I>, Vec<f32>, Vec<usize>), LoadError> {
    let too_big = || {
        LoadError::Input(topk_core::Error::InvalidParameter {
            name: "k",
            value: k.to_string(),
            reason: format!("{nq} queries × {stride} results do not fit in memory"),
        })
    };
    let room = nq.checked_mul(stride).ok_or_else(too_big)?;
    let (mut ids, mut scores, mut counts) = (Vec::new(), Vec::new(), Vec::new());
    ids.try_reserve_exact(room).map_err(|_| too_big())?;
    scores.try_reserve_exact(room).map_err(|_| too_big())?;
    counts.try_reserve_exact(nq).map_err(|_| too_big())?;
    ids.resize(room, I::default());
    scores.resize(room, 0.0);
    counts.resize(nq, 0);
    Ok((ids, scores, counts))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plugin_without_cuda_is_its_own_error() {
        let e = call_error(Path::new("/p.so"), (Status::NotCompiled, "x".to_owned()));
        assert!(matches!(e, LoadError::WithoutCuda { .. }), "{e}");
        assert!(e.to_string().contains(abi::BUILD_COMMAND), "{e}");
    }

    #[test]
    fn engine_errors_keep_the_engine_text() {
        let text = "out of device memory allocating corpus: 10 bytes requested, 5 bytes available";
        let e = call_error(Path::new("/p.so"), (Status::OutOfMemory, text.to_owned()));
        assert!(
            matches!(
                &e,
                LoadError::Engine {
                    kind: EngineErrorKind::OutOfMemory,
                    ..
                }
            ),
            "{e}"
        );
        assert_eq!(e.to_string(), text);
        let e = call_error(Path::new("/p.so"), (Status::Unknown(77), String::new()));
        assert!(e.to_string().contains("status 77"), "{e}");
    }

    #[test]
    fn bad_corpora_are_refused_before_any_plugin_is_looked_for() {
        let config = CudaConfig::default();
        let e = open_rowmajor(&[], 4, Metric::Dot, &config).err();
        assert!(
            matches!(e, Some(LoadError::Input(topk_core::Error::EmptyCorpus))),
            "{e:?}"
        );
        let e = open_rowmajor(&[1.0, f32::NAN], 2, Metric::L2, &config).err();
        assert!(
            matches!(
                e,
                Some(LoadError::Input(topk_core::Error::NonFinite {
                    column: 1,
                    ..
                }))
            ),
            "{e:?}"
        );
        // A corpus large enough to be checked as it streams to the device
        // is checked here too when no plugin or device is there to do it.
        let d = 1024;
        let n = topk_cuda::STAGED_UPLOAD_MIN_BYTES / 4 / d + 1;
        let mut big = vec![0.5_f32; n * d];
        big[(n - 1) * d + 3] = f32::INFINITY;
        let e = open_rowmajor(&big, d, Metric::Dot, &config).err();
        assert!(
            matches!(
                e,
                Some(LoadError::Input(topk_core::Error::NonFinite {
                    column: 3,
                    ..
                }))
            ),
            "{e:?}"
        );
    }

    #[test]
    fn result_buffers_past_memory_are_an_error_naming_k() {
        let (ids, scores, counts) = result_buffers::<u64>(3, 2, 2).expect("small");
        assert_eq!((ids.len(), scores.len(), counts.len()), (6, 6, 3));
        for (nq, stride) in [(usize::MAX / 4, 0), (usize::MAX / 4, 3), (1 << 40, 1 << 10)] {
            let e = result_buffers::<u64>(nq, stride, 7).expect_err("too big");
            assert!(e.to_string().contains("do not fit in memory"), "{e}");
            assert!(e.to_string().contains('7'), "{e}");
        }
    }
}

//! `libtopk_cuda_plugin.so`: the GPU engine of [`topk_cuda`] as a library
//! that programs load at run time through `topk-cuda-loader`, so that only
//! this file, never the program, depends on the NVIDIA driver's
//! `libcuda.so.1`.
//!
//! The C ABI it exports is defined in `topk_cuda_loader::abi` (names,
//! signatures, structs, status codes, version); the `ffi` module implements
//! it and checks every entry point against those types when it compiles.
//! This file is the safe half: engine calls on Rust values, and the mapping of
//! engine errors to status codes with the engine's own message.
//!
//! Without the `cuda` feature the plugin still builds (no CUDA toolchain
//! needed), and every entry point answers [`Status::NotCompiled`] with
//! "plugin built without CUDA".

mod ffi;

use ndarray::ArrayView2;
use topk_core::{Dtype, Hit, Neighbor, RowStore};
use topk_cuda::{CudaError, CudaRetriever, IdFilter, ResidentCorpus};
use topk_cuda_loader::abi::{
    self, metric_code, metric_from_code, DeviceSummaryRaw, PluginConfig, ResidentInfoRaw, Status,
};

/// Whether this build has the engine.
const COMPILED: bool = cfg!(feature = "cuda");

/// A failed call: what the loader receives as status code and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Failure {
    status: Status,
    message: String,
}

impl Failure {
    fn bad(message: impl Into<String>) -> Self {
        Failure {
            status: Status::BadArgument,
            message: message.into(),
        }
    }

    fn not_compiled() -> Self {
        Failure {
            status: Status::NotCompiled,
            message: format!(
                "plugin built without CUDA: rebuild it with `{}`",
                abi::BUILD_COMMAND
            ),
        }
    }

    fn panic(payload: &(dyn std::any::Any + Send)) -> Self {
        let what = payload
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic without a message".to_owned());
        Failure {
            status: Status::Panic,
            message: format!("the CUDA plugin panicked: {what}"),
        }
    }
}

impl From<CudaError> for Failure {
    fn from(e: CudaError) -> Self {
        if matches!(e, CudaError::NotCompiled) {
            return Failure::not_compiled();
        }
        let status = match &e {
            CudaError::NoDriver { .. } => Status::NoDriver,
            CudaError::NoDevice { .. } => Status::NoDevice,
            CudaError::OutOfMemory { .. } => Status::OutOfMemory,
            CudaError::Input(_)
            | CudaError::BadDeviceQuery { .. }
            | CudaError::BadDevicePointer { .. }
            | CudaError::IdPresent { .. }
            | CudaError::DuplicateId { .. }
            | CudaError::IdTooLarge { .. }
            | CudaError::CountMismatch { .. } => Status::InvalidInput,
            CudaError::InvalidOption { .. } => Status::InvalidOption,
            CudaError::Driver { .. } | CudaError::ModuleLoad { .. } => Status::Driver,
            _ => Status::Other,
        };
        Failure {
            status,
            message: e.to_string(),
        }
    }
}

/// What the driver reports about `device`.
fn device_summary(device: usize) -> Result<DeviceSummaryRaw, Failure> {
    if !COMPILED {
        return Err(Failure::not_compiled());
    }
    let info = topk_cuda::device_info(device)?;
    let mut raw = DeviceSummaryRaw::default();
    raw.name_len = abi::fill_field(&mut raw.name, &info.name);
    raw.driver_version_len = abi::fill_field(&mut raw.driver_version, &info.driver_version);
    raw.total_memory = info.total_memory as u64;
    (raw.compute_major, raw.compute_minor) = info.compute_capability;
    raw.multiprocessors = info.multiprocessors;
    Ok(raw)
}

/// The rows an open call passes: f32 values, or the bit patterns of a
/// half-width store.
enum OpenRows<'a> {
    F32(&'a [f32]),
    Bits16(&'a [u16]),
}

/// Uploads `n × dim` row-major `rows` (`n * dim` values) stored as
/// `config.dtype`.
fn open(
    rows: OpenRows<'_>,
    n: usize,
    dim: usize,
    metric: u32,
    config: PluginConfig,
) -> Result<CudaRetriever, Failure> {
    if !COMPILED {
        return Err(Failure::not_compiled());
    }
    let metric = metric_from_code(metric)
        .ok_or_else(|| Failure::bad(format!("unknown metric code {metric}")))?;
    match rows {
        OpenRows::F32(rows) => {
            let view = ArrayView2::from_shape((n, dim), rows).map_err(|e| {
                Failure::bad(format!("{n} × {dim} rows over {} values: {e}", rows.len()))
            })?;
            Ok(CudaRetriever::new(view, metric, config.to_config())?)
        }
        OpenRows::Bits16(bits) => {
            let dtype = storage_type(config)?;
            let mut store = RowStore::empty(dim, dtype).map_err(CudaError::from)?;
            let bytes: Vec<u8> = bits.iter().flat_map(|b| b.to_le_bytes()).collect();
            store.extend_le_bytes(&bytes);
            // The bits cross an ABI: checked again as a stored corpus.
            store.check().map_err(CudaError::from)?;
            Ok(CudaRetriever::from_store(
                &store,
                metric,
                config.to_config(),
            )?)
        }
    }
}

/// The storage type of `config`, or an error naming an unknown code.
fn storage_type(config: PluginConfig) -> Result<Dtype, Failure> {
    config
        .dtype()
        .ok_or_else(|| Failure::bad(format!("unknown storage type code {}", config.dtype)))
}

/// Copies `hits` into the caller's buffers.
fn write_hits(hits: &[Neighbor], indices: &mut [u32], scores: &mut [f32]) -> Result<(), Failure> {
    if hits.len() > indices.len() || hits.len() > scores.len() {
        return Err(Failure::bad(format!(
            "{} results do not fit in buffers of {} and {} entries",
            hits.len(),
            indices.len(),
            scores.len()
        )));
    }
    for (h, (i, s)) in hits.iter().zip(indices.iter_mut().zip(scores.iter_mut())) {
        *i = h.index;
        *s = h.score;
    }
    Ok(())
}

/// One query into the caller's buffers; returns the results written.
fn search(
    engine: &CudaRetriever,
    query: &[f32],
    k: usize,
    indices: &mut [u32],
    scores: &mut [f32],
) -> Result<usize, Failure> {
    if !COMPILED {
        return Err(Failure::not_compiled());
    }
    let mut hits = Vec::with_capacity(indices.len());
    engine.search_host(query, k, &mut hits)?;
    write_hits(&hits, indices, scores)?;
    Ok(hits.len())
}

/// `counts.len()` row-major queries; query `i`'s results at `i * stride`.
fn search_batch(
    engine: &CudaRetriever,
    queries: &[f32],
    k: usize,
    stride: usize,
    indices: &mut [u32],
    scores: &mut [f32],
    counts: &mut [usize],
) -> Result<(), Failure> {
    if !COMPILED {
        return Err(Failure::not_compiled());
    }
    let results = engine.search_batch_rowmajor(queries, k)?;
    if results.len() != counts.len() {
        return Err(Failure::bad(format!(
            "{} queries answered, {} expected",
            results.len(),
            counts.len()
        )));
    }
    let rows = indices
        .chunks_mut(stride.max(1))
        .zip(scores.chunks_mut(stride.max(1)));
    for ((hits, count), (idx, sc)) in results.iter().zip(counts.iter_mut()).zip(rows) {
        write_hits(hits, idx, sc)?;
        *count = hits.len();
    }
    Ok(())
}

/// An empty mutable resident corpus.
fn resident_open(
    dim: usize,
    metric: u32,
    capacity: usize,
    config: PluginConfig,
) -> Result<ResidentCorpus, Failure> {
    if !COMPILED {
        return Err(Failure::not_compiled());
    }
    let metric = metric_from_code(metric)
        .ok_or_else(|| Failure::bad(format!("unknown metric code {metric}")))?;
    Ok(ResidentCorpus::with_dtype(
        dim,
        storage_type(config)?,
        metric,
        config.to_config(),
        capacity,
    )?)
}

/// One mutation; returns the ids a removal found live (0 otherwise).
fn resident_mutate(
    corpus: &mut ResidentCorpus,
    op: u32,
    ids: &[u64],
    rows: &[f32],
) -> Result<usize, Failure> {
    match op {
        abi::MUTATE_ADD => corpus.add(ids, rows).map(|()| 0),
        abi::MUTATE_UPSERT => corpus.upsert(ids, rows).map(|()| 0),
        abi::MUTATE_REMOVE => corpus.remove(ids),
        abi::MUTATE_COMPACT => corpus.compact().map(|()| 0),
        other => return Err(Failure::bad(format!("unknown mutation {other}"))),
    }
    .map_err(Failure::from)
}

/// A search's allow-lists as the ABI passes them.
struct Filter<'a> {
    mode: u32,
    ids: &'a [u64],
    offsets: &'a [usize],
}

impl<'a> Filter<'a> {
    /// The list `offsets[i]..offsets[i + 1]` of `ids`, checked.
    fn list(&self, i: usize) -> Result<&'a [u64], Failure> {
        let (a, b) = (self.offsets[i], self.offsets[i + 1]);
        self.ids.get(a..b).ok_or_else(|| {
            Failure::bad(format!(
                "filter offsets {a}..{b} outside the {} filter ids",
                self.ids.len()
            ))
        })
    }
}

/// A search's allow-lists, borrowed from the ABI's buffers.
enum Spec<'a> {
    All,
    Shared(&'a [u64]),
    PerQuery(Vec<&'a [u64]>),
}

impl Spec<'_> {
    fn as_filter(&self) -> IdFilter<'_> {
        match self {
            Spec::All => IdFilter::All,
            Spec::Shared(ids) => IdFilter::Shared(ids),
            Spec::PerQuery(lists) => IdFilter::PerQuery(lists),
        }
    }
}

/// The allow-lists of `nq` queries as the ABI passed them.
fn filter_spec<'a>(filter: &Filter<'a>, nq: usize) -> Result<Spec<'a>, Failure> {
    Ok(match filter.mode {
        abi::FILTER_SHARED => Spec::Shared(filter.list(0)?),
        abi::FILTER_PER_QUERY => Spec::PerQuery(
            (0..nq)
                .map(|i| filter.list(i))
                .collect::<Result<Vec<_>, _>>()?,
        ),
        _ => Spec::All,
    })
}

/// Each query's hits into the caller's buffers at `i * stride`.
fn write_results(
    results: &[Vec<Hit>],
    stride: usize,
    ids: &mut [u64],
    scores: &mut [f32],
    counts: &mut [usize],
) -> Result<(), Failure> {
    let rows = ids
        .chunks_mut(stride.max(1))
        .zip(scores.chunks_mut(stride.max(1)));
    for ((hits, count), (id_row, score_row)) in results.iter().zip(counts.iter_mut()).zip(rows) {
        write_id_hits(hits, id_row, score_row)?;
        *count = hits.len();
    }
    Ok(())
}

/// Copies id hits into the caller's buffers.
fn write_id_hits(hits: &[Hit], ids: &mut [u64], scores: &mut [f32]) -> Result<(), Failure> {
    if hits.len() > ids.len() || hits.len() > scores.len() {
        return Err(Failure::bad(format!(
            "{} results do not fit in buffers of {} and {} entries",
            hits.len(),
            ids.len(),
            scores.len()
        )));
    }
    for (h, (i, s)) in hits.iter().zip(ids.iter_mut().zip(scores.iter_mut())) {
        *i = h.id;
        *s = h.score;
    }
    Ok(())
}

/// The counts of a resident corpus.
fn resident_info(corpus: &ResidentCorpus) -> ResidentInfoRaw {
    ResidentInfoRaw {
        live: corpus.len(),
        stored: corpus.stored(),
        capacity: corpus.capacity(),
        dim: corpus.dim(),
        metric: metric_code(corpus.metric()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_errors_keep_their_text_and_get_their_status() {
        let e = CudaError::NoDevice {
            requested: 3,
            available: 1,
        };
        let text = e.to_string();
        let f = Failure::from(e);
        assert_eq!(f.status, Status::NoDevice);
        assert_eq!(f.message, text);
        let f = Failure::from(CudaError::Input(topk_core::Error::ZeroK));
        assert_eq!(f.status, Status::InvalidInput);
        let f = Failure::from(CudaError::NotCompiled);
        assert_eq!(f.status, Status::NotCompiled);
        assert!(
            f.message.contains("plugin built without CUDA"),
            "{}",
            f.message
        );
    }

    #[test]
    fn hits_that_do_not_fit_are_refused() {
        let hits = [Neighbor::new(4, 1.5), Neighbor::new(2, -0.0)];
        let (mut i, mut s) = ([0u32; 2], [0f32; 2]);
        assert_eq!(write_hits(&hits, &mut i, &mut s), Ok(()));
        assert_eq!(
            (i, s[0], s[1].to_bits()),
            ([4, 2], 1.5, (-0.0f32).to_bits())
        );
        let (mut i, mut s) = ([0u32; 1], [0f32; 2]);
        assert_eq!(
            write_hits(&hits, &mut i, &mut s).map_err(|f| f.status),
            Err(Status::BadArgument)
        );
    }

    #[test]
    fn an_unknown_metric_code_is_a_bad_argument_or_not_compiled() {
        let config = PluginConfig::from_config(&topk_cuda_loader::CudaConfig::default());
        let f = open(OpenRows::F32(&[1.0, 2.0]), 1, 2, 9, config)
            .err()
            .map(|f| f.status);
        let expected = if COMPILED {
            Status::BadArgument
        } else {
            Status::NotCompiled
        };
        assert_eq!(f, Some(expected));
    }

    #[test]
    fn an_unknown_storage_code_is_a_bad_argument_or_not_compiled() {
        let config = PluginConfig {
            dtype: 7,
            ..PluginConfig::from_config(&topk_cuda_loader::CudaConfig::default())
        };
        let f = open(OpenRows::Bits16(&[0x3c00, 0]), 1, 2, 0, config).err();
        let f = f.expect("no engine for an unknown storage type");
        if COMPILED {
            assert_eq!(f.status, Status::BadArgument);
            assert!(f.message.contains("storage type code 7"), "{}", f.message);
        } else {
            assert_eq!(f.status, Status::NotCompiled);
        }
    }

    #[test]
    #[cfg(not(feature = "cuda"))]
    fn without_cuda_every_entry_says_so() {
        let config = PluginConfig::from_config(&topk_cuda_loader::CudaConfig::default());
        for f in [
            device_summary(0).err(),
            open(OpenRows::F32(&[1.0, 2.0]), 1, 2, 0, config).err(),
            open(
                OpenRows::Bits16(&[0x3c00, 0]),
                1,
                2,
                0,
                config.with_dtype(Dtype::F16),
            )
            .err(),
        ] {
            let f = f.expect("a build without CUDA has no engine");
            assert_eq!(f.status, Status::NotCompiled);
            assert!(
                f.message.contains("plugin built without CUDA"),
                "{}",
                f.message
            );
            assert!(f.message.contains(abi::BUILD_COMMAND), "{}", f.message);
        }
    }
}

//! The GPU-side timed paths of docs/CONTRACTS.md §6, through topk-cuda:
//!
//! - `resident`: the engine's own `search_into` / `search_batch` (query
//!   host→device, score, select, results device→host, synchronised);
//! - `device`: the query is already on the device (`search_device`), only the
//!   K results come back — the agent-pipeline case. Like an embedding model
//!   writing each query into its output buffer, every trial's query is
//!   written into one reused device buffer before the trial (untimed);
//!   the search itself reads it in place. A batch is the pool's first Q
//!   queries, copied to the device once (`upload_batch`, untimed) and
//!   searched there (`search_device_batch`) in every trial;
//! - `cpu_roundtrip`: the query starts on the device, goes device→host, the
//!   CPU backend scores and selects with the same comparator, and the results
//!   go host→device (`topk_cuda::RoundTrip`), all inside the timed call.
//!
//! topk-cuda has the same surface with and without its `cuda` feature (the
//! engine cannot be built without it), so this module has no conditional
//! code; a build without CUDA is refused up front with a message that says
//! how to get it.

use ndarray::ArrayView2;
use topk_core::{Metric, Neighbor, Retriever};
use topk_cuda::{CudaConfig, CudaRetriever, DeviceBatch, DeviceQuery, RoundTrip, MAX_DEVICE_K};

use crate::error::{BenchError, Result};
use crate::run::{HostSearch, Searcher};

/// Bytes copied to measure the device-to-device bandwidth (1 GiB each way:
/// far beyond the L2 cache, small enough for any device that holds a corpus).
pub const D2D_BYTES: usize = 1 << 30;

/// The GPU engine of one corpus.
#[derive(Debug)]
pub struct Gpu {
    engine: CudaRetriever,
}

fn no_cuda_build() -> Result<()> {
    if cfg!(feature = "cuda") {
        Ok(())
    } else {
        Err(BenchError::NoCuda)
    }
}

impl Gpu {
    /// Uploads the corpus with buffers for K up to `max_k` (the device fast
    /// path goes to 2,048; beyond, the engine finishes on the host) and
    /// batches up to `max_batch`.
    pub fn new(
        corpus: ArrayView2<'_, f32>,
        metric: Metric,
        max_k: usize,
        max_batch: usize,
    ) -> Result<Gpu> {
        no_cuda_build()?;
        let mut opts = CudaConfig::default();
        opts.max_k = max_k.clamp(1, MAX_DEVICE_K);
        opts.max_batch = max_batch.max(1);
        Ok(Gpu {
            engine: CudaRetriever::new(corpus, metric, opts)?,
        })
    }

    /// Device-to-device copy bandwidth of device 0, bytes/s, read + write counted.
    pub fn d2d_bandwidth() -> Result<f64> {
        no_cuda_build()?;
        Ok(topk_cuda::measure_d2d_bandwidth(0, D2D_BYTES)?)
    }

    /// Device 0's description for `environment.json` (`None` when unavailable).
    pub fn device_json() -> Option<serde_json::Value> {
        let info = topk_cuda::device_info(0).ok()?;
        Some(serde_json::json!({
            "name": info.name,
            "driver_version": info.driver_version,
            "total_memory_bytes": info.total_memory,
            "compute_capability": format!("{}.{}", info.compute_capability.0, info.compute_capability.1),
            "multiprocessors": info.multiprocessors,
        }))
    }

    /// The engine, as a retriever.
    pub fn retriever(&self) -> &CudaRetriever {
        &self.engine
    }

    /// The GPU-resident path with host queries.
    pub fn resident(&self) -> HostSearch<'_> {
        HostSearch::new(&self.engine)
    }

    /// The device-query path: one device buffer, into which each trial's
    /// query of the pool is written before the trial (untimed); each call
    /// searches it.
    pub fn device(&self, pool: ArrayView2<'_, f32>) -> Result<DeviceSearch<'_>> {
        let rows: Vec<Vec<f32>> = pool.outer_iter().map(|r| r.to_vec()).collect();
        let first = rows.first().ok_or_else(|| {
            BenchError::flag("query-pool", 0, "the device path needs at least one query")
        })?;
        Ok(DeviceSearch {
            gpu: &self.engine,
            work: self.engine.upload_query(first)?,
            pool: rows,
            batches: Vec::new(),
        })
    }

    /// The CPU round-trip baseline with `cpu` answering on the host; queries
    /// of the pool are uploaded once, before any timing.
    pub fn roundtrip<'a>(
        &'a self,
        cpu: &'a dyn Retriever,
        pool: ArrayView2<'_, f32>,
        max_k: usize,
    ) -> Result<RoundTripSearch<'a>> {
        Ok(RoundTripSearch {
            trip: RoundTrip::new(&self.engine, max_k.min(self.engine.len()).max(1))?,
            cpu,
            queries: upload(&self.engine, pool)?,
        })
    }
}

fn upload(gpu: &CudaRetriever, pool: ArrayView2<'_, f32>) -> Result<Vec<DeviceQuery>> {
    pool.outer_iter()
        .map(|row| Ok(gpu.upload_query(&row.to_vec())?))
        .collect()
}

/// The device-query and round-trip paths time one query per call.
fn single(rows: usize) -> Result<()> {
    if rows != 1 {
        return Err(BenchError::flag(
            "batch",
            rows,
            "the device-query and round-trip paths time single queries",
        ));
    }
    Ok(())
}

/// Query `first` of a query pool.
fn pool_item<T>(pool: &[T], first: usize) -> Result<&T> {
    pool.get(first).ok_or_else(|| {
        BenchError::flag(
            "query-pool",
            pool.len(),
            format!("query {first} is not in the pool"),
        )
    })
}

/// The `device` path: queries already resident on the GPU, in one reused
/// buffer; batches each in a device buffer of their own.
pub struct DeviceSearch<'a> {
    gpu: &'a CudaRetriever,
    /// The query pool on the host, written into `work` before each trial.
    pool: Vec<Vec<f32>>,
    work: DeviceQuery,
    /// The batches uploaded so far, one a size (a batch is always the
    /// pool's first Q queries); the gate's call uploads each, untimed.
    batches: Vec<DeviceBatch>,
}

impl Searcher for DeviceSearch<'_> {
    fn prepare(&mut self, first: usize) -> Result<()> {
        let q = pool_item(&self.pool, first)?;
        self.gpu.overwrite_query(&mut self.work, q)?;
        Ok(())
    }

    fn answer(
        &mut self,
        _first: usize,
        queries: ArrayView2<'_, f32>,
        k: usize,
        out: &mut Vec<Vec<Neighbor>>,
    ) -> Result<()> {
        if queries.nrows() > 1 {
            let q = queries.nrows();
            let at = match self.batches.iter().position(|b| b.len() == q) {
                Some(at) => at,
                None => {
                    let values: Vec<f32> = queries.iter().copied().collect();
                    self.batches.push(self.gpu.upload_batch(&values)?);
                    self.batches.len() - 1
                }
            };
            *out = self.gpu.search_device_batch(&self.batches[at], k)?;
            return Ok(());
        }
        out.resize_with(1, Vec::new);
        self.gpu.search_device(&self.work, k, &mut out[0])?;
        Ok(())
    }
}

/// The `cpu_roundtrip` path.
pub struct RoundTripSearch<'a> {
    trip: RoundTrip,
    cpu: &'a dyn Retriever,
    queries: Vec<DeviceQuery>,
}

impl Searcher for RoundTripSearch<'_> {
    fn answer(
        &mut self,
        first: usize,
        queries: ArrayView2<'_, f32>,
        k: usize,
        out: &mut Vec<Vec<Neighbor>>,
    ) -> Result<()> {
        single(queries.nrows())?;
        let q = pool_item(&self.queries, first)?;
        out.resize_with(1, Vec::new);
        self.trip.run(q, self.cpu, k, &mut out[0])?;
        Ok(())
    }
}

#[cfg(all(test, not(feature = "cuda")))]
mod tests {
    use super::*;

    #[test]
    fn without_cuda_every_entry_point_says_how_to_get_it() {
        let corpus = ndarray::Array2::<f32>::ones((4, 3));
        let e = Gpu::new(corpus.view(), Metric::Dot, 8, 1).unwrap_err();
        assert!(
            e.to_string().contains("rebuild with --features cuda"),
            "{e}"
        );
        assert!(Gpu::d2d_bandwidth().is_err());
        assert!(Gpu::device_json().is_none());
    }
}

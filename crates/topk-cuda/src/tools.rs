//! Device-side helpers around the engine: queries resident on the device, the
//! benchmark's CPU round-trip baseline, the device-to-device bandwidth that
//! sets the HBM floor, and the device description of the environment record.

use std::sync::Arc;

use cust::event::{Event, EventFlags};
use cust::memory::LockedBuffer;
use cust::stream::{Stream, StreamFlags};
use topk_core::{Neighbor, Retriever};

use crate::device::{self, Ctx, DevNeighbor, OwnedDevice};
use crate::driver::DevSlice;
use crate::engine::Engine;
use crate::error::{CudaError, DriverResult};
use crate::launch::{self, Queue};
use crate::{CudaRetriever, DeviceInfo};

/// Refuses device memory held on `device` for `engine`'s corpus on another
/// device (`name` and `reason` say which kind of memory).
fn same_device(
    engine: &Engine,
    device: usize,
    name: &'static str,
    reason: &'static str,
) -> Result<(), CudaError> {
    if device == engine.config().device {
        Ok(())
    } else {
        Err(CudaError::InvalidOption {
            name,
            value: device,
            reason,
        })
    }
}

/// A query resident in device memory (see [`CudaRetriever::upload_query`]).
pub struct DeviceQuery {
    buf: OwnedDevice<f32>,
    device: usize,
}

impl std::fmt::Debug for DeviceQuery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceQuery")
            .field("len", &self.buf.buf.len())
            .field("device", &self.device)
            .finish()
    }
}

impl DeviceQuery {
    pub(crate) fn upload(engine: &Engine, query: &[f32]) -> Result<Self, CudaError> {
        Ok(DeviceQuery {
            buf: OwnedDevice::from_slice(engine.ctx(), query)?,
            device: engine.config().device,
        })
    }

    pub(crate) fn search(
        &self,
        engine: &Engine,
        k: usize,
        out: &mut Vec<Neighbor>,
    ) -> Result<(), CudaError> {
        same_device(
            engine,
            self.device,
            "device of the query",
            "the query lives on another device than the corpus",
        )?;
        engine.search_device(&self.buf.buf, None, k, out)
    }

    /// Replaces the values in place, in the same device buffer (validated by
    /// the caller). A search with a buffer it has seen before replays the
    /// graph built for that buffer.
    pub(crate) fn overwrite(&mut self, query: &[f32]) -> Result<(), CudaError> {
        use cust::memory::CopyDestination;
        self.buf.make_current()?;
        self.buf.buf.copy_from(query).op("cuMemcpyHtoD (query)")
    }

    /// Values in the query (D).
    pub fn len(&self) -> usize {
        self.buf.buf.len()
    }

    /// Always false: a query has D ≥ 1 values.
    pub fn is_empty(&self) -> bool {
        self.buf.buf.is_empty()
    }

    /// The device slice, to hand to other CUDA code.
    pub fn as_slice(&self) -> &cust::memory::DeviceSlice<f32> {
        &self.buf.buf
    }
}

/// Row-major queries resident in device memory (see
/// [`CudaRetriever::upload_batch`]): a batch searched where it lies, as an
/// embedding model's output would be.
pub struct DeviceBatch {
    buf: OwnedDevice<f32>,
    device: usize,
    queries: usize,
}

impl std::fmt::Debug for DeviceBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceBatch")
            .field("queries", &self.queries)
            .field("values", &self.buf.buf.len())
            .field("device", &self.device)
            .finish()
    }
}

impl DeviceBatch {
    /// Copies `queries` (row-major, `nq` of them, checked by the caller).
    pub(crate) fn upload(engine: &Engine, queries: &[f32], nq: usize) -> Result<Self, CudaError> {
        Ok(DeviceBatch {
            buf: OwnedDevice::from_slice(engine.ctx(), queries)?,
            device: engine.config().device,
            queries: nq,
        })
    }

    pub(crate) fn search(
        &self,
        engine: &Engine,
        k: usize,
    ) -> Result<Vec<Vec<Neighbor>>, CudaError> {
        same_device(
            engine,
            self.device,
            "device of the batch",
            "the batch lives on another device than the corpus",
        )?;
        engine.search_batch_device(self.buf.view(), 0, k)
    }

    /// How many queries it holds.
    pub fn len(&self) -> usize {
        self.queries
    }

    /// Whether it holds no query.
    pub fn is_empty(&self) -> bool {
        self.queries == 0
    }

    /// The device slice (`len() × D` values), to hand to other CUDA code.
    pub fn as_slice(&self) -> &cust::memory::DeviceSlice<f32> {
        &self.buf.buf
    }
}

/// The CPU round-trip baseline of docs/CONTRACTS.md §6: a query that starts on the
/// device is copied to the host, searched there by any [`Retriever`], and the
/// results copied back to the device, as a pipeline without a GPU engine must.
/// Buffers are pinned and allocated once.
pub struct RoundTrip {
    stream: Stream,
    q_host: LockedBuffer<f32>,
    res_host: LockedBuffer<DevNeighbor>,
    res_dev: OwnedDevice<DevNeighbor>,
    scratch: Vec<Neighbor>,
    ctx: Arc<Ctx>,
}

impl std::fmt::Debug for RoundTrip {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RoundTrip")
            .field("dim", &self.q_host.len())
            .field("max_k", &self.res_host.len())
            .finish()
    }
}

impl RoundTrip {
    /// Buffers for queries of `gpu`'s dimension and up to `max_k` results.
    pub fn new(gpu: &CudaRetriever, max_k: usize) -> Result<Self, CudaError> {
        let ctx = Arc::clone(gpu.engine().ctx());
        ctx.make_current()?;
        let max_k = max_k.max(1);
        Ok(RoundTrip {
            stream: Stream::new(StreamFlags::NON_BLOCKING, None).op("cuStreamCreate")?,
            q_host: LockedBuffer::new(&0.0f32, gpu.engine().dim()).op("cuMemAllocHost")?,
            res_host: LockedBuffer::new(&DevNeighbor::default(), max_k).op("cuMemAllocHost")?,
            res_dev: OwnedDevice::zeroed(&ctx, "round-trip results", max_k)?,
            scratch: Vec::with_capacity(max_k),
            ctx,
        })
    }

    /// Device query → host, `cpu.search_into`, results → device, synchronised.
    /// `out` receives the results the device now holds.
    pub fn run(
        &mut self,
        query: &DeviceQuery,
        cpu: &dyn Retriever,
        k: usize,
        out: &mut Vec<Neighbor>,
    ) -> Result<(), CudaError> {
        self.ctx.make_current()?;
        let d = self.q_host.len();
        if query.len() != d {
            return Err(CudaError::DeviceQueryLength {
                got: query.len(),
                expected: d,
            });
        }
        let s = self.stream.as_inner();
        // Read on the host after the stream is synchronised.
        launch::d2h(
            Queue::Stream(s),
            &mut self.q_host,
            DevSlice::of(query.as_slice()),
        )?;
        self.stream.synchronize().op("cuStreamSynchronize")?;
        cpu.search_into(self.q_host.as_slice(), k, &mut self.scratch)?;
        let m = self.scratch.len();
        if m > self.res_host.len() {
            return Err(CudaError::OverCapacity {
                what: "round-trip results",
                got: m,
                max: self.res_host.len(),
            });
        }
        for (dst, src) in self.res_host.as_mut_slice().iter_mut().zip(&self.scratch) {
            *dst = DevNeighbor::from(*src);
        }
        // Synchronised before res_host is written again.
        launch::h2d(Queue::Stream(s), self.res_dev.view(), &self.res_host, 0, m)?;
        self.stream.synchronize().op("cuStreamSynchronize")?;
        out.clear();
        out.extend_from_slice(&self.scratch);
        Ok(())
    }
}

impl Drop for RoundTrip {
    fn drop(&mut self) {
        if let Err(e) = self.ctx.make_current() {
            tracing::warn!("topk-cuda: could not make the context current to free: {e}");
        }
    }
}

/// Name, driver version, memory and multiprocessors of device `device`.
pub fn device_info(device: usize) -> Result<DeviceInfo, CudaError> {
    let (_ctx, dev) = device::open(device)?;
    device::info_of(dev)
}

/// Device-to-device copy bandwidth of `device` in bytes per second, counting
/// bytes read plus bytes written (the convention of the HBM floor in
/// docs/CONTRACTS.md §6): the median of 10 timed copies of `bytes` after 3 warm-ups.
pub fn measure_d2d_bandwidth(device: usize, bytes: usize) -> Result<f64, CudaError> {
    let (ctx, _dev) = device::open(device)?;
    let words = bytes.div_ceil(4).max(1);
    let src = OwnedDevice::<u32>::zeroed(&ctx, "bandwidth source", words)?;
    let dst = OwnedDevice::<u32>::zeroed(&ctx, "bandwidth destination", words)?;
    let stream = Stream::new(StreamFlags::NON_BLOCKING, None).op("cuStreamCreate")?;
    let (start, stop) = (
        Event::new(EventFlags::DEFAULT).op("cuEventCreate")?,
        Event::new(EventFlags::DEFAULT).op("cuEventCreate")?,
    );
    let copy = || launch::d2d(stream.as_inner(), dst.view(), src.view());
    for _ in 0..3 {
        copy()?;
    }
    let mut times = Vec::with_capacity(10);
    for _ in 0..10 {
        start.record(&stream).op("cuEventRecord")?;
        copy()?;
        stop.record(&stream).op("cuEventRecord")?;
        stop.synchronize().op("cuEventSynchronize")?;
        let ms = stop.elapsed_time_f32(&start).op("cuEventElapsedTime")?;
        times.push(f64::from(ms) / 1e3);
    }
    times.sort_by(f64::total_cmp);
    let median = times[times.len() / 2];
    Ok(2.0 * (words * 4) as f64 / median)
}

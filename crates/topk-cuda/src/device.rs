//! The device side the engine stands on: the primary context, the device's
//! description, the element types the kernels write, and device and pinned
//! buffers allocated with a typed out-of-memory error.

use std::sync::Arc;

use cust::context::{Context, CurrentContext};
use cust::device::{Device, DeviceAttribute};
use cust::memory::{DeviceBuffer, DeviceCopy, LockedBuffer};

use crate::driver::{self, DevSlice};
use crate::error::{CudaError, DriverResult};
use crate::DeviceInfo;

/// One result as the kernels write it; the layout of [`topk_core::Neighbor`].
#[derive(Clone, Copy, Debug, Default, rustacuda_derive::DeviceCopy)]
#[repr(C)]
pub(crate) struct DevNeighbor {
    pub(crate) index: u32,
    pub(crate) score: f32,
}

impl DevNeighbor {
    pub(crate) fn new(index: u32, score: f32) -> Self {
        DevNeighbor { index, score }
    }
}

impl From<topk_core::Neighbor> for DevNeighbor {
    fn from(n: topk_core::Neighbor) -> Self {
        DevNeighbor::new(n.index, n.score)
    }
}

/// A query's level-1 threshold bin and the rows above and in it
/// (`TopkThreshold`).
#[derive(Clone, Copy, Debug, Default, rustacuda_derive::DeviceCopy)]
#[repr(C)]
pub(crate) struct DevThreshold {
    bucket: u32,
    above: u32,
    in_bucket: u32,
    pad: u32,
}

/// The primary context, shared by the engine and every object holding
/// device memory of it, so that frees run with the context current.
pub(crate) struct Ctx {
    ctx: Context,
}

impl Ctx {
    pub(crate) fn make_current(&self) -> Result<(), CudaError> {
        CurrentContext::set_current(&self.ctx).op("cuCtxSetCurrent")
    }
}

/// Initialises the driver and retains the primary context of `device`.
pub(crate) fn open(device: usize) -> Result<(Arc<Ctx>, Device), CudaError> {
    cust::init(cust::CudaFlags::empty()).map_err(|e| CudaError::NoDriver {
        reason: format!("{e} ({e:?})"),
    })?;
    let available = Device::num_devices().op("cuDeviceGetCount")? as usize;
    if device >= available {
        return Err(CudaError::NoDevice {
            requested: device,
            available,
        });
    }
    let dev = Device::get_device(device as u32).op("cuDeviceGet")?;
    let ctx = Context::new(dev).op("cuDevicePrimaryCtxRetain")?;
    Ok((Arc::new(Ctx { ctx }), dev))
}

/// Name, driver and memory of `dev`.
pub(crate) fn info_of(dev: Device) -> Result<DeviceInfo, CudaError> {
    let driver = driver::driver_version()?;
    let major = dev
        .get_attribute(DeviceAttribute::ComputeCapabilityMajor)
        .op("cuDeviceGetAttribute")?;
    let minor = dev
        .get_attribute(DeviceAttribute::ComputeCapabilityMinor)
        .op("cuDeviceGetAttribute")?;
    Ok(DeviceInfo {
        name: dev.name().op("cuDeviceGetName")?,
        driver_version: format!("{}.{}", driver / 1000, (driver % 1000) / 10),
        total_memory: dev.total_memory().op("cuDeviceTotalMem")?,
        compute_capability: (major, minor),
        multiprocessors: dev
            .get_attribute(DeviceAttribute::MultiprocessorCount)
            .op("cuDeviceGetAttribute")? as u32,
    })
}

/// A pinned host buffer of `len` (at least 1) default values.
pub(crate) fn pinned<T: DeviceCopy + Default>(len: usize) -> Result<LockedBuffer<T>, CudaError> {
    #[cfg(test)]
    driver::faults::fail_here("pinned host buffer", len * std::mem::size_of::<T>())?;
    let requested = len.max(1) * std::mem::size_of::<T>();
    LockedBuffer::new(&T::default(), len.max(1))
        .map_err(|e| CudaError::allocation("pinned host buffer", requested, "cuMemAllocHost", e))
}

/// A device buffer holding a copy of `data`, naming `what` in an
/// out-of-memory error.
pub(crate) fn upload<T: DeviceCopy>(
    what: &'static str,
    data: &[T],
) -> Result<DeviceBuffer<T>, CudaError> {
    #[cfg(test)]
    driver::faults::fail_here(what, std::mem::size_of_val(data))?;
    DeviceBuffer::from_slice(data)
        .map_err(|e| CudaError::allocation(what, std::mem::size_of_val(data), "cuMemcpyHtoD", e))
}

/// A device buffer that frees itself with its context current.
pub(crate) struct OwnedDevice<T: DeviceCopy> {
    pub(crate) buf: DeviceBuffer<T>,
    ctx: Arc<Ctx>,
}

impl<T: DeviceCopy> OwnedDevice<T> {
    pub(crate) fn from_slice(ctx: &Arc<Ctx>, data: &[T]) -> Result<Self, CudaError> {
        ctx.make_current()?;
        Ok(OwnedDevice {
            buf: upload("device copy", data)?,
            ctx: Arc::clone(ctx),
        })
    }

    /// Makes the buffer's context current on this thread.
    pub(crate) fn make_current(&self) -> Result<(), CudaError> {
        self.ctx.make_current()
    }

    pub(crate) fn zeroed(
        ctx: &Arc<Ctx>,
        what: &'static str,
        len: usize,
    ) -> Result<Self, CudaError> {
        ctx.make_current()?;
        let buf = driver::alloc::<T>(what, len)?;
        crate::launch::zero_sync(DevSlice::of(&buf))?;
        Ok(OwnedDevice {
            buf,
            ctx: Arc::clone(ctx),
        })
    }

    /// The whole buffer as a view.
    pub(crate) fn view(&self) -> DevSlice<'_, T> {
        DevSlice::of(&self.buf)
    }
}

impl<T: DeviceCopy> Drop for OwnedDevice<T> {
    fn drop(&mut self) {
        if let Err(e) = self.ctx.make_current() {
            tracing::warn!("topk-cuda: could not make the context current to free: {e}");
        }
    }
}

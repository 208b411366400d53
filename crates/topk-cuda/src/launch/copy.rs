//! Asynchronous copies between page-locked host buffers and device views,
//! and zeroing, on a stream or as graph nodes.
//!
//! The host side is always a pinned buffer owned by the caller's slot (or
//! helper), which outlives every copy queued on it: slots synchronise their
//! stream before a buffer is dropped or read, and a graph lives no longer
//! than the slot whose buffers it copies.

use std::ffi::c_void;

use cust::memory::{DeviceCopy, LockedBuffer};
use cust::sys as cu;

use super::graph::Mem;
use super::Queue;
use crate::driver::{check, DevSlice};
use crate::error::CudaError;

/// Host → device copy of `len` elements of `src` from `start` into `dst`,
/// on `q`.
pub(crate) fn h2d<T: DeviceCopy>(
    q: Queue<'_>,
    dst: DevSlice<'_, T>,
    src: &LockedBuffer<T>,
    start: usize,
    len: usize,
) -> Result<(), CudaError> {
    dst.need("copy destination", len)?;
    let host = src.as_slice().get(start..start.saturating_add(len)).ok_or(
        CudaError::DeviceBufferTooSmall {
            what: "pinned copy source",
            needed: start.saturating_add(len),
            len: src.len(),
        },
    )?;
    let (from, bytes) = (host.as_ptr() as *const c_void, std::mem::size_of_val(host));
    match q {
        // SAFETY: `host` is pinned memory of `bytes`, alive until the stream
        // reaches the copy (module doc); `dst` holds at least `len` elements.
        Queue::Stream(stream) => check("cuMemcpyHtoDAsync", unsafe {
            cu::cuMemcpyHtoDAsync_v2(dst.ptr(), from, bytes, stream)
        }),
        // SAFETY: as above, for as long as the graph lives.
        Queue::Graph(g) => unsafe {
            g.copy(
                Mem::Device(dst.ptr()),
                Mem::Host(from as *mut c_void),
                bytes,
            )
        },
    }
}

/// Device → host copy of all of `src` into the start of `dst`, on `q`; the
/// host reads `dst` only after the stream has reached the copy.
pub(crate) fn d2h<T: DeviceCopy>(
    q: Queue<'_>,
    dst: &mut LockedBuffer<T>,
    src: DevSlice<'_, T>,
) -> Result<(), CudaError> {
    if dst.len() < src.len() {
        return Err(CudaError::DeviceBufferTooSmall {
            what: "pinned copy destination",
            needed: src.len(),
            len: dst.len(),
        });
    }
    let (to, bytes) = (dst.as_mut_ptr() as *mut c_void, src.bytes());
    match q {
        // SAFETY: `dst` is pinned memory of at least `bytes`, alive and not
        // read by the host until the stream reaches the copy (module doc).
        Queue::Stream(stream) => check("cuMemcpyDtoHAsync", unsafe {
            cu::cuMemcpyDtoHAsync_v2(to, src.ptr(), bytes, stream)
        }),
        // SAFETY: as above, for as long as the graph lives.
        Queue::Graph(g) => unsafe { g.copy(Mem::Host(to), Mem::Device(src.ptr()), bytes) },
    }
}

/// Device → device copy of all of `src` into the start of `dst` on
/// `stream`; the two must not overlap.
pub(crate) fn d2d<T: DeviceCopy>(
    stream: cu::CUstream,
    dst: DevSlice<'_, T>,
    src: DevSlice<'_, T>,
) -> Result<(), CudaError> {
    dst.need("copy destination", src.len())?;
    let (d0, s0, bytes) = (dst.ptr(), src.ptr(), src.bytes() as u64);
    if d0 < s0 + bytes && s0 < d0 + bytes {
        return Err(CudaError::InvalidOption {
            name: "device copy",
            value: bytes as usize,
            reason: "source and destination overlap",
        });
    }
    // SAFETY: both ranges lie in their views and do not overlap.
    check("cuMemcpyDtoDAsync", unsafe {
        cu::cuMemcpyDtoDAsync_v2(d0, s0, src.bytes(), stream)
    })
}

/// Sets every word of `dst` to zero on `stream`.
pub(crate) fn zero32(stream: cu::CUstream, dst: DevSlice<'_, u32>) -> Result<(), CudaError> {
    // SAFETY: the range is exactly the view.
    check("cuMemsetD32Async", unsafe {
        cu::cuMemsetD32Async(dst.ptr(), 0, dst.len(), stream)
    })
}

/// Sets every element of `dst` to -inf, asynchronously on `stream` (the
/// lower bounds of the Hopper listing's empty room, which no selection
/// picks before a finite bound).
pub(crate) fn fill_neg_inf(stream: cu::CUstream, dst: DevSlice<'_, f32>) -> Result<(), CudaError> {
    // SAFETY: the range is exactly the view.
    check("cuMemsetD32Async", unsafe {
        cu::cuMemsetD32Async(dst.ptr(), f32::NEG_INFINITY.to_bits(), dst.len(), stream)
    })
}

/// Sets every byte of `dst` to zero, synchronously.
pub(crate) fn zero_sync<T>(dst: DevSlice<'_, T>) -> Result<(), CudaError> {
    // SAFETY: the range is exactly the view.
    check("cuMemsetD8", unsafe {
        cu::cuMemsetD8_v2(dst.ptr(), 0, dst.bytes())
    })
}

/// Host → device copy of `src` (pageable memory) into the start of `dst`,
/// synchronously: the rows a mutation of the resident corpus uploads.
pub(crate) fn h2d_sync<T: DeviceCopy>(dst: DevSlice<'_, T>, src: &[T]) -> Result<(), CudaError> {
    dst.need("copy destination", src.len())?;
    if src.is_empty() {
        return Ok(());
    }
    // SAFETY: `src` is `size_of_val(src)` readable bytes for the whole call
    // (the copy is synchronous) and `dst` holds at least `src.len()` elements.
    check("cuMemcpyHtoD", unsafe {
        cu::cuMemcpyHtoD_v2(
            dst.ptr(),
            src.as_ptr() as *const c_void,
            std::mem::size_of_val(src),
        )
    })
}

/// Bytes of one pinned staging buffer of [`h2d_staged`]: large enough that
/// a copy runs at the link's rate, small enough that pinning three costs a
/// few milliseconds.
pub(crate) const STAGE_BYTES: usize = 64 << 20;
/// Pinned staging buffers of [`h2d_staged`]: one being filled, one in
/// flight, one spare so that a slow fill never idles the link.
const STAGES: usize = 3;
/// Uploads smaller than this go straight from pageable memory.
pub(crate) const STAGED_MIN_BYTES: usize = crate::config::STAGED_UPLOAD_MIN_BYTES;

/// Host → device copy of `src` (pageable memory) into the start of `dst`,
/// streamed through pinned staging buffers: while the copy engine moves one
/// buffer, the host's threads check and fill the next, so the upload runs
/// at the link's rate rather than the driver's pageable rate.
///
/// `src` is cut into parts of whole `unit`-element groups (rows); each part
/// is offered to `check` just before it is copied. The first part it
/// refuses (in order) stops the upload: `Ok(false)` is returned once the
/// copies in flight have finished, and `dst` holds a prefix of `src`.
/// `Ok(true)`: all of `src` is on the device.
pub(crate) fn h2d_staged<T: DeviceCopy + Default + Send + Sync>(
    dst: DevSlice<'_, T>,
    src: &[T],
    unit: usize,
    check: &(dyn Fn(&[T]) -> bool + Sync),
) -> Result<bool, CudaError> {
    use cust::event::{Event, EventFlags};
    use cust::stream::{Stream, StreamFlags};
    use rayon::prelude::*;

    dst.need("copy destination", src.len())?;
    if src.is_empty() {
        return Ok(true);
    }
    let unit = unit.max(1);
    let per_stage = (STAGE_BYTES / std::mem::size_of::<T>().max(1) / unit).max(1) * unit;
    let chunk = per_stage.min(src.len());
    let threads = rayon::current_num_threads().max(1);
    // Each thread checks and copies a run of whole groups.
    let piece = (chunk / unit).div_ceil(threads).max(1) * unit;
    let stages = STAGES.min(src.len().div_ceil(chunk));
    let mut buffers = Vec::with_capacity(stages);
    for _ in 0..stages {
        buffers.push(crate::device::pinned::<T>(chunk)?);
    }
    let stream = Stream::new(StreamFlags::NON_BLOCKING, None)
        .map_err(|e| CudaError::driver("cuStreamCreate", e))?;
    let mut copied: Vec<Option<Event>> = (0..stages).map(|_| None).collect();
    let finish = |stream: &Stream| {
        stream
            .synchronize()
            .map_err(|e| CudaError::driver("cuStreamSynchronize (staged upload)", e))
    };
    for (c, part) in src.chunks(chunk).enumerate() {
        let b = c % stages;
        if let Some(ev) = copied[b].take() {
            ev.synchronize()
                .map_err(|e| CudaError::driver("cuEventSynchronize", e))?;
        }
        let stage = &mut buffers[b].as_mut_slice()[..part.len()];
        let ok = stage
            .par_chunks_mut(piece)
            .zip(part.par_chunks(piece))
            .map(|(to, from)| {
                let fine = check(from);
                if fine {
                    to.copy_from_slice(from);
                }
                fine
            })
            .collect::<Vec<bool>>()
            .into_iter()
            .all(|fine| fine);
        if !ok {
            finish(&stream)?;
            return Ok(false);
        }
        let at = dst.range("copy destination", c * chunk, part.len())?;
        let queued = h2d(
            Queue::Stream(stream.as_inner()),
            at,
            &buffers[b],
            0,
            part.len(),
        );
        if let Err(e) = queued {
            finish(&stream)?;
            return Err(e);
        }
        let ev = Event::new(EventFlags::DISABLE_TIMING)
            .map_err(|e| CudaError::driver("cuEventCreate", e))?;
        ev.record(&stream)
            .map_err(|e| CudaError::driver("cuEventRecord", e))?;
        copied[b] = Some(ev);
    }
    // The buffers outlive every copy queued on them: the stream is drained
    // before they drop.
    finish(&stream)?;
    Ok(true)
}

/// Host → device copy of `src` into the start of `dst`: staged through
/// pinned buffers when large ([`h2d_staged`], nothing checked), straight
/// from pageable memory otherwise.
pub(crate) fn h2d_upload<T: DeviceCopy + Default + Send + Sync>(
    dst: DevSlice<'_, T>,
    src: &[T],
) -> Result<(), CudaError> {
    if std::mem::size_of_val(src) >= STAGED_MIN_BYTES {
        h2d_staged(dst, src, 1, &|_| true).map(|_| ())
    } else {
        h2d_sync(dst, src)
    }
}

/// Device → device copy of all of `src` into the start of `dst`,
/// synchronously; the two must not overlap.
pub(crate) fn d2d_sync<T: DeviceCopy>(
    dst: DevSlice<'_, T>,
    src: DevSlice<'_, T>,
) -> Result<(), CudaError> {
    dst.need("copy destination", src.len())?;
    let (d0, s0, bytes) = (dst.ptr(), src.ptr(), src.bytes() as u64);
    if d0 < s0 + bytes && s0 < d0 + bytes {
        return Err(CudaError::InvalidOption {
            name: "device copy",
            value: bytes as usize,
            reason: "source and destination overlap",
        });
    }
    if bytes == 0 {
        return Ok(());
    }
    // SAFETY: both ranges lie in their views and do not overlap.
    check("cuMemcpyDtoD", unsafe {
        cu::cuMemcpyDtoD_v2(d0, s0, src.bytes())
    })
}

/// Sets every byte of `dst` to zero on `stream`.
pub(crate) fn zero_async<T>(stream: cu::CUstream, dst: DevSlice<'_, T>) -> Result<(), CudaError> {
    // SAFETY: the range is exactly the view.
    check("cuMemsetD8Async", unsafe {
        cu::cuMemsetD8Async(dst.ptr(), 0, dst.bytes(), stream)
    })
}

/// Device → device copy of `height` rows of `width` elements, from rows of
/// `src_pitch` elements at `src` to rows of `dst_pitch` elements at `dst`,
/// on `stream`: a batch's scores of one piece of a list into their columns.
pub(crate) fn d2d_2d<T: DeviceCopy>(
    stream: cu::CUstream,
    dst: DevSlice<'_, T>,
    dst_pitch: usize,
    src: DevSlice<'_, T>,
    src_pitch: usize,
    width: usize,
    height: usize,
) -> Result<(), CudaError> {
    if height == 0 || width == 0 {
        return Ok(());
    }
    if width > dst_pitch || width > src_pitch {
        return Err(CudaError::InvalidOption {
            name: "2-D copy width",
            value: width,
            reason: "wider than a row of its source or destination",
        });
    }
    let last = (height - 1) * dst_pitch + width;
    dst.need("2-D copy destination", last)?;
    src.need("2-D copy source", (height - 1) * src_pitch + width)?;
    let size = std::mem::size_of::<T>();
    let copy = cu::CUDA_MEMCPY2D {
        srcXInBytes: 0,
        srcY: 0,
        srcMemoryType: cu::CUmemorytype::CU_MEMORYTYPE_DEVICE,
        srcHost: std::ptr::null(),
        srcDevice: src.ptr(),
        srcArray: std::ptr::null_mut(),
        srcPitch: src_pitch * size,
        dstXInBytes: 0,
        dstY: 0,
        dstMemoryType: cu::CUmemorytype::CU_MEMORYTYPE_DEVICE,
        dstHost: std::ptr::null_mut(),
        dstDevice: dst.ptr(),
        dstArray: std::ptr::null_mut(),
        dstPitch: dst_pitch * size,
        WidthInBytes: width * size,
        Height: height,
    };
    // SAFETY: both extents were checked against their views above; the
    // descriptor lives for the call, which copies it.
    check("cuMemcpy2DAsync", unsafe {
        cu::cuMemcpy2DAsync_v2(&copy, stream)
    })
}

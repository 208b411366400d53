//! The raw driver calls the engine makes outside kernel launches: statuses
//! turned into typed errors, free memory, device attributes, uninitialised
//! allocations, the device address of mapped host memory, stream queries and
//! the volatile read of a result header the device writes into host memory.
//! With `launch`, the only module of the crate with `unsafe`.

use std::ffi::c_void;
use std::marker::PhantomData;

use cust::device::Device;
use cust::memory::{DeviceBuffer, DeviceCopy, DeviceSlice, LockedBuffer};
use cust::stream::Stream;
use cust::sys as cu;

use topk_core::Dtype;

use crate::device::DevNeighbor;
use crate::error::CudaError;

/// A raw device address.
pub(crate) type DPtr = cu::CUdeviceptr;

/// Turns a raw driver status into a typed error naming the operation.
pub(crate) fn check(op: &'static str, status: cu::CUresult) -> Result<(), CudaError> {
    if status == cu::CUresult::CUDA_SUCCESS {
        Ok(())
    } else if status == cu::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
        Err(CudaError::OutOfMemory {
            what: op,
            requested: 0,
            available: free_memory().unwrap_or(0),
        })
    } else {
        Err(CudaError::Driver {
            op,
            reason: format!("{status:?}"),
        })
    }
}

/// Free device memory of the current context, in bytes.
pub(crate) fn free_memory() -> Result<usize, CudaError> {
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: both pointers are valid for writes of one usize.
    let status = unsafe { cu::cuMemGetInfo_v2(&mut free, &mut total) };
    if status == cu::CUresult::CUDA_SUCCESS {
        Ok(free)
    } else {
        Err(CudaError::Driver {
            op: "cuMemGetInfo",
            reason: format!("{status:?}"),
        })
    }
}

/// The driver API version, e.g. 13000 for 13.0.
pub(crate) fn driver_version() -> Result<i32, CudaError> {
    let mut driver = 0i32;
    // SAFETY: `driver` is valid for one i32 write.
    check("cuDriverGetVersion", unsafe {
        cu::cuDriverGetVersion(&mut driver)
    })?;
    Ok(driver)
}

/// A device attribute the engine asks about by its raw id.
pub(crate) type DeviceAttr = cu::CUdevice_attribute;

/// Whether a yes/no attribute of `dev` is set.
pub(crate) fn device_flag(dev: Device, attr: DeviceAttr) -> Result<bool, CudaError> {
    let mut v = 0i32;
    // SAFETY: `v` is valid for one i32 write; `dev` is a live device.
    check("cuDeviceGetAttribute", unsafe {
        cu::cuDeviceGetAttribute(&mut v, attr, dev.as_raw())
    })?;
    Ok(v != 0)
}

/// Allocates `len` (at least 1) elements, naming the buffer in an
/// out-of-memory error. The contents are unspecified until written.
pub(crate) fn alloc<T: DeviceCopy>(
    what: &'static str,
    len: usize,
) -> Result<DeviceBuffer<T>, CudaError> {
    let len = len.max(1);
    #[cfg(test)]
    faults::fail_here(what, len * std::mem::size_of::<T>())?;
    // SAFETY: `DeviceCopy` types are plain bytes for which any bit pattern
    // is a value, and device memory is only read by kernels and copies,
    // never as a Rust reference; every buffer is written by a copy or a
    // kernel before it is read (the counters and histograms are zeroed
    // explicitly after allocation).
    unsafe { DeviceBuffer::uninitialized(len) }
        .map_err(|e| CudaError::allocation(what, len * std::mem::size_of::<T>(), "cuMemAlloc", e))
}

/// Allocation failures on demand, for the tests that check that running
/// out of memory part way through a mutation changes nothing
/// (docs/CONTRACTS.md §10). Every device and pinned host allocation of the
/// crate asks [`faults::fail_here`] first.
#[cfg(test)]
pub(crate) mod faults {
    use std::cell::Cell;

    use crate::error::CudaError;

    thread_local! {
        /// Allocations this thread still makes before one fails (`None`:
        /// none fails).
        static LEFT: Cell<Option<usize>> = const { Cell::new(None) };
        /// Allocations made on this thread since [`fail_after`].
        static MADE: Cell<usize> = const { Cell::new(0) };
    }

    /// The allocation after the next `n` on this thread fails (`Some(0)`:
    /// the next one), once; `None` makes none fail. Resets the count.
    pub(crate) fn fail_after(n: Option<usize>) {
        LEFT.set(n);
        MADE.set(0);
    }

    /// Allocations made on this thread since [`fail_after`].
    pub(crate) fn made() -> usize {
        MADE.get()
    }

    /// An out-of-memory error where this allocation is the one to fail.
    pub(crate) fn fail_here(what: &'static str, requested: usize) -> Result<(), CudaError> {
        MADE.set(MADE.get() + 1);
        match LEFT.get() {
            Some(0) => {
                LEFT.set(None);
                Err(CudaError::OutOfMemory {
                    what,
                    requested,
                    available: 0,
                })
            }
            Some(n) => {
                LEFT.set(Some(n - 1));
                Ok(())
            }
            None => Ok(()),
        }
    }
}

/// A view of `len` elements of `T` in device memory (or in host memory
/// mapped into the device's address space) at a device address: what the
/// launch wrappers take, each checking the lengths its kernel needs.
#[derive(Debug)]
pub(crate) struct DevSlice<'a, T> {
    ptr: DPtr,
    len: usize,
    _buffer: PhantomData<&'a [T]>,
}

impl<T> Clone for DevSlice<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for DevSlice<'_, T> {}

impl<'a, T: DeviceCopy> DevSlice<'a, T> {
    /// The whole of a device buffer.
    pub(crate) fn of(buf: &'a DeviceSlice<T>) -> Self {
        DevSlice {
            ptr: buf.as_device_ptr().as_raw(),
            len: buf.len(),
            _buffer: PhantomData,
        }
    }
}

impl<'a, T> DevSlice<'a, T> {
    /// The device address of the first element.
    pub(crate) fn ptr(&self) -> DPtr {
        self.ptr
    }

    /// Elements in view.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Bytes in view.
    pub(crate) fn bytes(&self) -> usize {
        self.len * std::mem::size_of::<T>()
    }

    /// The elements from `start` on; an error naming `what` past the end.
    pub(crate) fn skip(self, what: &'static str, start: usize) -> Result<Self, CudaError> {
        self.range(what, start, self.len.saturating_sub(start))
    }

    /// `len` elements from `start`; an error naming `what` past the end.
    pub(crate) fn range(
        self,
        what: &'static str,
        start: usize,
        len: usize,
    ) -> Result<Self, CudaError> {
        within(what, start, len, self.len)?;
        Ok(DevSlice {
            ptr: self.ptr + (start * std::mem::size_of::<T>()) as DPtr,
            len,
            _buffer: PhantomData,
        })
    }

    /// Checks that the view holds at least `needed` elements.
    pub(crate) fn need(&self, what: &'static str, needed: usize) -> Result<(), CudaError> {
        within(what, 0, needed, self.len)
    }
}

impl<'a> DevSlice<'a, f32> {
    /// The same memory as 32-bit words (a score buffer's room lent to
    /// row indices and counters).
    pub(crate) fn words(self) -> DevSlice<'a, u32> {
        DevSlice {
            ptr: self.ptr,
            len: self.len,
            _buffer: PhantomData,
        }
    }
}

impl<'a> DevSlice<'a, crate::device::DevNeighbor> {
    /// The same memory as 32-bit words (an index, then a score's bits).
    pub(crate) fn words(self) -> DevSlice<'a, u32> {
        DevSlice {
            ptr: self.ptr,
            len: self.len * 2,
            _buffer: PhantomData,
        }
    }
}

/// Checks that `len` elements from `start` lie within a view of `total`;
/// an error naming `what` (and the end needed) past it.
fn within(what: &'static str, start: usize, len: usize, total: usize) -> Result<(), CudaError> {
    match start.checked_add(len) {
        Some(end) if end <= total => Ok(()),
        _ => Err(CudaError::DeviceBufferTooSmall {
            what,
            needed: start.saturating_add(len),
            len: total,
        }),
    }
}

/// Corpus rows in device memory as they are stored ([`Dtype`]): `u16`
/// words for a half type, pairs of them for `f32` (cuMemAlloc aligns every
/// buffer to 256 bytes, so a row view is as aligned as an `f32` one).
pub(crate) struct RowBuf {
    buf: DeviceBuffer<u16>,
    dtype: Dtype,
}

impl RowBuf {
    /// Room for `values` stored values, unspecified until written.
    pub(crate) fn alloc(
        what: &'static str,
        dtype: Dtype,
        values: usize,
    ) -> Result<Self, CudaError> {
        let words = values.max(1) * (dtype.bytes() / 2);
        Ok(RowBuf {
            buf: alloc::<u16>(what, words)?,
            dtype,
        })
    }

    /// The storage type.
    pub(crate) fn dtype(&self) -> Dtype {
        self.dtype
    }

    /// The whole buffer.
    pub(crate) fn view(&self) -> Rows<'_> {
        Rows {
            ptr: self.buf.as_device_ptr().as_raw(),
            len: self.buf.len() / (self.dtype.bytes() / 2),
            width: self.dtype.bytes(),
            _buffer: PhantomData,
        }
    }
}

/// A view of `len` stored values of `width` bytes each in device memory:
/// [`DevSlice`] for corpus rows, whose width is the corpus's storage type.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rows<'a> {
    ptr: DPtr,
    len: usize,
    width: usize,
    _buffer: PhantomData<&'a [u16]>,
}

impl<'a> Rows<'a> {
    /// `f32` rows viewed as stored rows.
    pub(crate) fn of_f32(s: DevSlice<'a, f32>) -> Self {
        Rows {
            ptr: s.ptr(),
            len: s.len(),
            width: 4,
            _buffer: PhantomData,
        }
    }

    /// The view as `f32` values; an error naming `what` for other widths.
    pub(crate) fn as_f32(self, what: &'static str) -> Result<DevSlice<'a, f32>, CudaError> {
        self.typed(what, 4)
    }

    /// The view as the 16-bit words it occupies, whatever the width (for
    /// copies).
    pub(crate) fn as_words(self) -> DevSlice<'a, u16> {
        DevSlice {
            ptr: self.ptr,
            len: self.len * self.width / 2,
            _buffer: PhantomData,
        }
    }

    /// The view as the bits of 16-bit values; an error naming `what` for
    /// other widths.
    pub(crate) fn as_bits16(self, what: &'static str) -> Result<DevSlice<'a, u16>, CudaError> {
        self.typed(what, 2)
    }

    fn typed<T>(self, what: &'static str, width: usize) -> Result<DevSlice<'a, T>, CudaError> {
        if self.width != width {
            return Err(CudaError::CountMismatch {
                what,
                got: self.width,
                expected: width,
            });
        }
        Ok(DevSlice {
            ptr: self.ptr,
            len: self.len,
            _buffer: PhantomData,
        })
    }

    /// The device address of the first value.
    pub(crate) fn ptr(&self) -> DPtr {
        self.ptr
    }

    /// Bytes per value.
    pub(crate) fn width(&self) -> usize {
        self.width
    }

    /// `len` values from `start`; an error naming `what` past the end.
    pub(crate) fn range(
        self,
        what: &'static str,
        start: usize,
        len: usize,
    ) -> Result<Self, CudaError> {
        within(what, start, len, self.len)?;
        Ok(Rows {
            ptr: self.ptr + (start * self.width) as DPtr,
            len,
            ..self
        })
    }

    /// Checks that the view holds at least `needed` values.
    pub(crate) fn need(&self, what: &'static str, needed: usize) -> Result<(), CudaError> {
        within(what, 0, needed, self.len)
    }
}

/// The device's view of page-locked host memory from cuMemAllocHost, which
/// is mapped into the device's address space where the device can map host
/// memory with unified addressing (checked by the caller before asking).
///
/// The view does not borrow `host`: the slot that owns the buffer keeps the
/// view beside it and drops both together, after its stream is idle.
pub(crate) fn mapped<T: DeviceCopy>(
    host: &mut LockedBuffer<T>,
) -> Result<DevSlice<'static, T>, CudaError> {
    let mut dev: DPtr = 0;
    // SAFETY: `dev` is valid for one write; the driver checks that the
    // pointer is page-locked memory it allocated and reports an error
    // otherwise.
    let status =
        unsafe { cu::cuMemHostGetDevicePointer_v2(&mut dev, host.as_mut_ptr() as *mut c_void, 0) };
    check("cuMemHostGetDevicePointer", status)?;
    Ok(DevSlice {
        ptr: dev,
        len: host.len(),
        _buffer: PhantomData,
    })
}

/// A caller's device buffer as a view for a graph that outlives the borrow:
/// the graph is replayed only while a query of this very address and length
/// is searched (see the graph cache).
pub(crate) fn detached<T: DeviceCopy>(buf: &DeviceSlice<T>) -> DevSlice<'static, T> {
    DevSlice {
        ptr: buf.as_device_ptr().as_raw(),
        len: buf.len(),
        _buffer: PhantomData,
    }
}

/// Whether all the work queued on `stream` has finished (`Ok(false)`: some
/// is still running); a failed launch is its error.
pub(crate) fn stream_done(stream: &Stream) -> Result<bool, CudaError> {
    // SAFETY: the stream handle is live while `stream` is.
    let status = unsafe { cu::cuStreamQuery(stream.as_inner()) };
    if status == cu::CUresult::CUDA_ERROR_NOT_READY {
        return Ok(false);
    }
    check("cuStreamQuery", status)?;
    Ok(true)
}

/// The status word of the first result row in `buf`, read afresh from
/// memory each call: the device writes it (mapped host memory) while the
/// host polls.
pub(crate) fn read_header(buf: &LockedBuffer<DevNeighbor>) -> u32 {
    let header = buf.as_ptr() as *const u32;
    // SAFETY: `buf` holds at least one element (every pinned buffer is
    // allocated with at least one), `DevNeighbor` is repr(C) with the u32
    // index first, and the memory is page-locked and aligned for a u32; a
    // volatile read sees each new value the device writes.
    unsafe { std::ptr::read_volatile(header) }
}

/// A view of `len` values of `T` at the device address `ptr`, memory
/// another library allocated (a torch or CuPy tensor), after checking with
/// the driver that `ptr` lies in device memory of the current context's
/// device and that `len` values from it stay inside that allocation. The
/// caller keeps the allocation alive while the view is used.
pub(crate) fn external<T: DeviceCopy>(
    ptr: DPtr,
    len: usize,
) -> Result<DevSlice<'static, T>, CudaError> {
    let bad = |reason: String| CudaError::BadDevicePointer { ptr, reason };
    let bytes = len
        .checked_mul(std::mem::size_of::<T>())
        .ok_or_else(|| bad(format!("{len} values overflow")))?;
    let mut kind: u32 = 0;
    // SAFETY: `kind` is valid for the u32 the memory-type attribute writes.
    let status = unsafe {
        cu::cuPointerGetAttribute(
            &mut kind as *mut u32 as *mut c_void,
            cu::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
            ptr,
        )
    };
    if status != cu::cudaError_enum::CUDA_SUCCESS
        || kind != cu::CUmemorytype_enum::CU_MEMORYTYPE_DEVICE as u32
    {
        return Err(bad(format!(
            "not device memory of this process ({status:?}, memory type {kind})"
        )));
    }
    // Memory of another device is addressable here too (unified addresses),
    // but a kernel of this engine's device would fault reading it.
    let mut ordinal: i32 = -1;
    // SAFETY: `ordinal` is valid for the int the device-ordinal attribute writes.
    check("cuPointerGetAttribute", unsafe {
        cu::cuPointerGetAttribute(
            &mut ordinal as *mut i32 as *mut c_void,
            cu::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
            ptr,
        )
    })?;
    let mut current: cu::CUdevice = -1;
    // SAFETY: `current` is valid for the device handle cuCtxGetDevice writes;
    // the engine's context is current (every caller makes it so first).
    check("cuCtxGetDevice", unsafe {
        cu::cuCtxGetDevice(&mut current)
    })?;
    if ordinal != current {
        return Err(bad(format!(
            "it lives on device {ordinal}, this index runs on device {current}: \
             move the queries there first"
        )));
    }
    let (mut start, mut size): (DPtr, usize) = (0, 0);
    // SAFETY: `start` and `size` are valid for the pointer-sized values the
    // range attributes write.
    check("cuPointerGetAttribute", unsafe {
        cu::cuPointerGetAttribute(
            &mut start as *mut DPtr as *mut c_void,
            cu::CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
            ptr,
        )
    })?;
    // SAFETY: as above.
    check("cuPointerGetAttribute", unsafe {
        cu::cuPointerGetAttribute(
            &mut size as *mut usize as *mut c_void,
            cu::CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_SIZE,
            ptr,
        )
    })?;
    let end = start.saturating_add(size as DPtr);
    if ptr.saturating_add(bytes as DPtr) > end {
        return Err(bad(format!(
            "{bytes} bytes from it pass the end of its allocation ({size} bytes)"
        )));
    }
    if ptr % std::mem::align_of::<T>() as DPtr != 0 {
        return Err(bad(format!(
            "not aligned to {} bytes",
            std::mem::align_of::<T>()
        )));
    }
    Ok(DevSlice {
        ptr,
        len,
        _buffer: PhantomData,
    })
}

/// Makes the work queued on `ours` wait for the work queued so far on the
/// caller's stream `theirs` (a raw `CUstream` of this context; 0 is the
/// legacy default stream), with an event recorded there.
pub(crate) fn wait_for_stream(ours: &Stream, theirs: u64) -> Result<(), CudaError> {
    let mut event: cu::CUevent = std::ptr::null_mut();
    // SAFETY: `event` is valid for the handle cuEventCreate writes.
    check("cuEventCreate", unsafe {
        cu::cuEventCreate(
            &mut event,
            cu::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32,
        )
    })?;
    // SAFETY: `event` is live; `theirs` is the caller's stream handle of
    // this context (or 0, the default stream), which the driver checks.
    let recorded = check("cuEventRecord", unsafe {
        cu::cuEventRecord(event, theirs as cu::CUstream)
    });
    let waited = recorded.and_then(|()| {
        // SAFETY: both handles are live.
        check("cuStreamWaitEvent", unsafe {
            cu::cuStreamWaitEvent(ours.as_inner(), event, 0)
        })
    });
    // SAFETY: the event is live and not used after this; the driver keeps
    // the wait it was queued for.
    let destroyed = check("cuEventDestroy", unsafe { cu::cuEventDestroy_v2(event) });
    waited.and(destroyed)
}

/// A tensor map of the copy engine (`CUtensorMap`: 128 bytes, 64-byte
/// aligned), passed by value to the kernels that stage tiles with
/// `cp.async.bulk.tensor` (`W9Map` in `kernels/filter90.cu`).
#[repr(C, align(64))]
#[derive(Clone, Copy)]
pub(crate) struct TensorMap([u64; 16]);

// The driver's encoder of tiled tensor maps (CUDA 12.0 and later; the
// engine's PTX needs a newer driver than that). Its enumerations are C
// `int`s; the status is read as the integer it is, so that a code this
// crate's bindings do not know stays a value.
extern "C" {
    fn cuTensorMapEncodeTiled(
        map: *mut TensorMap,
        dtype: u32,
        rank: u32,
        address: *mut c_void,
        dims: *const u64,
        strides: *const u64,
        box_dims: *const u32,
        element_strides: *const u32,
        interleave: u32,
        swizzle: u32,
        l2_promotion: u32,
        oob_fill: u32,
    ) -> u32;
}

impl TensorMap {
    /// The map of `rows` vectors of `d` values of `width` (4 or 2) bytes
    /// each from `ptr` (row-major), read in boxes of 128 bytes of `box_rows`
    /// vectors (at most 256) in the 128-byte swizzle, with zeros past the
    /// tensor's edges. The copy engine needs a 16-byte aligned `ptr` and
    /// `d · width` a multiple of 16: an error otherwise, naming `what`.
    pub(crate) fn tiled(
        what: &'static str,
        ptr: DPtr,
        rows: usize,
        d: usize,
        width: usize,
        box_rows: u32,
    ) -> Result<Self, CudaError> {
        Self::tiled_every(what, ptr, rows, d, width, box_rows, 1)
    }

    /// [`Self::tiled`] over every `every`-th vector from `ptr`: `rows`
    /// vectors `every · d` values apart (the sampled rows of the Hopper
    /// listing).
    pub(crate) fn tiled_every(
        what: &'static str,
        ptr: DPtr,
        rows: usize,
        d: usize,
        width: usize,
        box_rows: u32,
        every: usize,
    ) -> Result<Self, CudaError> {
        let stride = d * width * every.max(1);
        if ptr % 16 != 0 {
            return Err(CudaError::InvalidOption {
                name: what,
                value: ptr as usize,
                reason: "the copy engine needs a 16-byte aligned address",
            });
        }
        if stride % 16 != 0 || !(width == 2 || width == 4) {
            return Err(CudaError::InvalidOption {
                name: what,
                value: stride,
                reason: "the copy engine needs vectors of 2- or 4-byte values, 16 bytes a multiple",
            });
        }
        // CU_TENSOR_MAP_DATA_TYPE_UINT16 / _FLOAT32: the copy moves bytes,
        // so a 16-bit type stands for f16 and bf16 alike.
        let dtype = if width == 2 { 1 } else { 7 };
        let dims = [d as u64, rows.max(1) as u64];
        let strides = [stride as u64];
        let box_dims = [(128 / width) as u32, box_rows];
        let element_strides = [1u32, 1];
        let mut map = TensorMap([0; 16]);
        // SAFETY: `map` is 128 writable bytes aligned to 64; the arrays hold
        // rank (2) dimensions, rank - 1 strides, 2 box sizes and 2 element
        // strides. The encoder only reads `ptr` as an address. Interleave
        // none (0), swizzle 128 bytes (3), L2 promotion 256 bytes (3), zero
        // fill (0).
        let status = unsafe {
            cuTensorMapEncodeTiled(
                &mut map,
                dtype,
                2,
                ptr as *mut c_void,
                dims.as_ptr(),
                strides.as_ptr(),
                box_dims.as_ptr(),
                element_strides.as_ptr(),
                0,
                3,
                3,
                0,
            )
        };
        if status != 0 {
            return Err(CudaError::Driver {
                op: what,
                reason: format!("cuTensorMapEncodeTiled returned {status}"),
            });
        }
        Ok(map)
    }
}

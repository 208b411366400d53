//! The C ABI between this loader and `libtopk_cuda_plugin.so`, defined once:
//! the plugin (crates/topk-cuda-plugin) implements exactly these names and
//! signatures, and checks them against these types when it compiles.
//!
//! Conventions, for every entry point:
//!
//! - A status code ([`Status::code`]) is returned; 0 is success. On failure
//!   the plugin writes a UTF-8 message into the caller's [`MessageBuf`]
//!   (truncated to its capacity, at a character boundary) when one is given.
//! - No panic crosses the boundary: the plugin catches it and answers
//!   [`Status::Panic`].
//! - Buffers are caller-owned; the plugin never keeps a pointer it was given
//!   past the call, except the handle that `open` returns and `free` ends.
//! - A handle may be used from several threads at once (the engine is
//!   `Send + Sync`); `free` must be called once, when no call on it runs.
//! - Sizes are `usize` (`size_t`), the metric is [`metric_code`].
//!
//! The ABI is versioned by [`ABI_VERSION`]; the loader checks the plugin's
//! `topk_cuda_plugin_abi_version` before resolving anything else, so a plugin
//! from another version is refused with both numbers.

use std::marker::{PhantomData, PhantomPinned};

use topk_core::{Dtype, Metric};

/// Version of this ABI; bump it on any change to a signature or struct below.
pub const ABI_VERSION: u32 = 3;

/// File name of the plugin the loader looks for.
pub const PLUGIN_FILE: &str = "libtopk_cuda_plugin.so";

/// Environment variable naming the plugin's path, which replaces the search.
pub const PLUGIN_ENV: &str = "TOPK_CUDA_PLUGIN";

/// How to build a plugin with CUDA support (what error messages suggest).
pub const BUILD_COMMAND: &str = "cargo build --release -p topk-cuda-plugin --features cuda";

/// The soname of the NVIDIA driver's library, which the plugin links.
pub const DRIVER_LIBRARY: &str = "libcuda.so.1";

/// Symbol of [`AbiVersionFn`].
pub const SYM_ABI_VERSION: &[u8] = b"topk_cuda_plugin_abi_version\0";
/// Symbol of [`DeviceSummaryFn`].
pub const SYM_DEVICE_SUMMARY: &[u8] = b"topk_cuda_plugin_device_summary\0";
/// Symbol of [`OpenFn`].
pub const SYM_OPEN: &[u8] = b"topk_cuda_plugin_open\0";
/// Symbol of the [`SizeFn`] answering N.
pub const SYM_LEN: &[u8] = b"topk_cuda_plugin_len\0";
/// Symbol of the [`SizeFn`] answering D.
pub const SYM_DIM: &[u8] = b"topk_cuda_plugin_dim\0";
/// Symbol of [`MetricFn`].
pub const SYM_METRIC: &[u8] = b"topk_cuda_plugin_metric\0";
/// Symbol of [`DeviceNameFn`].
pub const SYM_DEVICE_NAME: &[u8] = b"topk_cuda_plugin_device_name\0";
/// Symbol of [`SearchFn`].
pub const SYM_SEARCH: &[u8] = b"topk_cuda_plugin_search\0";
/// Symbol of [`SearchBatchFn`].
pub const SYM_SEARCH_BATCH: &[u8] = b"topk_cuda_plugin_search_batch\0";
/// Symbol of [`FreeFn`].
pub const SYM_FREE: &[u8] = b"topk_cuda_plugin_free\0";

/// Symbol of [`ResidentOpenFn`].
pub const SYM_RESIDENT_OPEN: &[u8] = b"topk_cuda_plugin_resident_open\0";
/// Symbol of [`ResidentMutateFn`].
pub const SYM_RESIDENT_MUTATE: &[u8] = b"topk_cuda_plugin_resident_mutate\0";
/// Symbol of [`ResidentSearchFn`].
pub const SYM_RESIDENT_SEARCH: &[u8] = b"topk_cuda_plugin_resident_search\0";
/// Symbol of [`ResidentSearchDeviceFn`].
pub const SYM_RESIDENT_SEARCH_DEVICE: &[u8] = b"topk_cuda_plugin_resident_search_device\0";
/// Symbol of [`ResidentInfoFn`].
pub const SYM_RESIDENT_INFO: &[u8] = b"topk_cuda_plugin_resident_info\0";
/// Symbol of [`ResidentFreeFn`].
pub const SYM_RESIDENT_FREE: &[u8] = b"topk_cuda_plugin_resident_free\0";

/// `u32 topk_cuda_plugin_abi_version(void)`: the plugin's [`ABI_VERSION`].
pub type AbiVersionFn = unsafe extern "C" fn() -> u32;

/// `i32 topk_cuda_plugin_device_summary(size_t device, DeviceSummaryRaw *out,
/// MessageBuf *err)`: what the driver reports about device `device`.
pub type DeviceSummaryFn =
    unsafe extern "C" fn(device: usize, out: *mut DeviceSummaryRaw, err: *mut MessageBuf) -> i32;

/// `i32 topk_cuda_plugin_open(const void *rows, size_t n, size_t dim,
/// u32 metric, const PluginConfig *config, PluginHandle **handle,
/// MessageBuf *err)`: uploads `n × dim` row-major values and writes a new
/// handle into `*handle`. The values are of the storage type
/// `config->dtype`: `float`s for f32, the 16-bit patterns (`uint16_t`) of
/// an f16 or bf16 store, which the device then holds as they are.
pub type OpenFn = unsafe extern "C" fn(
    rows: *const std::ffi::c_void,
    n: usize,
    dim: usize,
    metric: u32,
    config: *const PluginConfig,
    handle: *mut *mut PluginHandle,
    err: *mut MessageBuf,
) -> i32;

/// `size_t topk_cuda_plugin_len(const PluginHandle *)` (N) and
/// `size_t topk_cuda_plugin_dim(const PluginHandle *)` (D).
pub type SizeFn = unsafe extern "C" fn(handle: *const PluginHandle) -> usize;

/// `u32 topk_cuda_plugin_metric(const PluginHandle *)`: the [`metric_code`].
pub type MetricFn = unsafe extern "C" fn(handle: *const PluginHandle) -> u32;

/// `i32 topk_cuda_plugin_device_name(const PluginHandle *, MessageBuf *out)`:
/// the device's name, written like an error message.
pub type DeviceNameFn =
    unsafe extern "C" fn(handle: *const PluginHandle, out: *mut MessageBuf) -> i32;

/// `i32 topk_cuda_plugin_search(const PluginHandle *, const float *query,
/// size_t dim, size_t k, u32 *indices, float *scores, size_t capacity,
/// size_t *count, MessageBuf *err)`: the best `min(k, N)` rows of one query,
/// best first, into `indices` and `scores` (each `capacity` long, at least
/// `min(k, N)`), their number into `*count`.
pub type SearchFn = unsafe extern "C" fn(
    handle: *const PluginHandle,
    query: *const f32,
    dim: usize,
    k: usize,
    indices: *mut u32,
    scores: *mut f32,
    capacity: usize,
    count: *mut usize,
    err: *mut MessageBuf,
) -> i32;

/// `i32 topk_cuda_plugin_search_batch(const PluginHandle *,
/// const float *queries, size_t nq, size_t dim, size_t k, u32 *indices,
/// float *scores, size_t stride, size_t *counts, MessageBuf *err)`: `nq`
/// row-major queries; query `i`'s results go to
/// `indices[i * stride ..]` / `scores[i * stride ..]` (both `nq × stride`
/// long, `stride` at least `min(k, N)`) and their number to `counts[i]`.
pub type SearchBatchFn = unsafe extern "C" fn(
    handle: *const PluginHandle,
    queries: *const f32,
    nq: usize,
    dim: usize,
    k: usize,
    indices: *mut u32,
    scores: *mut f32,
    stride: usize,
    counts: *mut usize,
    err: *mut MessageBuf,
) -> i32;

/// `void topk_cuda_plugin_free(PluginHandle *)`: releases the engine and its
/// device memory. A null handle is ignored.
pub type FreeFn = unsafe extern "C" fn(handle: *mut PluginHandle);

/// `i32 topk_cuda_plugin_resident_open(size_t dim, u32 metric,
/// size_t capacity, const PluginConfig *config, ResidentHandle **handle,
/// MessageBuf *err)`: a new, empty mutable resident corpus
/// (`topk_cuda::ResidentCorpus`) with device room for `capacity` rows.
pub type ResidentOpenFn = unsafe extern "C" fn(
    dim: usize,
    metric: u32,
    capacity: usize,
    config: *const PluginConfig,
    handle: *mut *mut ResidentHandle,
    err: *mut MessageBuf,
) -> i32;

/// [`ResidentMutateFn`] operation: add rows under new ids.
pub const MUTATE_ADD: u32 = 0;
/// [`ResidentMutateFn`] operation: replace or add rows.
pub const MUTATE_UPSERT: u32 = 1;
/// [`ResidentMutateFn`] operation: remove ids (rows unused).
pub const MUTATE_REMOVE: u32 = 2;
/// [`ResidentMutateFn`] operation: drop removed rows (ids and rows unused).
pub const MUTATE_COMPACT: u32 = 3;

/// `i32 topk_cuda_plugin_resident_mutate(ResidentHandle *, u32 op,
/// const u64 *ids, size_t n, const float *rows, size_t dim, size_t *removed,
/// MessageBuf *err)`: one mutation ([`MUTATE_ADD`] ..): `n` ids and, for add
/// and upsert, `n × dim` row-major values; a removal writes how many ids were
/// live into `*removed`. The caller holds the handle exclusively for the
/// call. Pointers an operation does not use may be null.
pub type ResidentMutateFn = unsafe extern "C" fn(
    handle: *mut ResidentHandle,
    op: u32,
    ids: *const u64,
    n: usize,
    rows: *const f32,
    dim: usize,
    removed: *mut usize,
    err: *mut MessageBuf,
) -> i32;

/// [`ResidentSearchFn`] filter mode: every live row.
pub const FILTER_NONE: u32 = 0;
/// [`ResidentSearchFn`] filter mode: one allow-list for every query,
/// `filter_ids[filter_offsets[0]..filter_offsets[1]]`.
pub const FILTER_SHARED: u32 = 1;
/// [`ResidentSearchFn`] filter mode: query `i`'s allow-list is
/// `filter_ids[filter_offsets[i]..filter_offsets[i + 1]]`.
pub const FILTER_PER_QUERY: u32 = 2;

/// `i32 topk_cuda_plugin_resident_search(const ResidentHandle *,
/// const float *queries, size_t nq, size_t dim, size_t k, u32 filter_mode,
/// const u64 *filter_ids, size_t filter_len, const size_t *filter_offsets,
/// u64 *ids, float *scores, size_t stride, size_t *counts, MessageBuf *err)`:
/// `nq` row-major queries; query `i`'s hits go to `ids[i * stride ..]` /
/// `scores[i * stride ..]` (both `nq × stride` long) and their number to
/// `counts[i]`. `filter_offsets` has 2 entries for [`FILTER_SHARED`] and
/// `nq + 1` for [`FILTER_PER_QUERY`], each at most `filter_len`.
pub type ResidentSearchFn = unsafe extern "C" fn(
    handle: *const ResidentHandle,
    queries: *const f32,
    nq: usize,
    dim: usize,
    k: usize,
    filter_mode: u32,
    filter_ids: *const u64,
    filter_len: usize,
    filter_offsets: *const usize,
    ids: *mut u64,
    scores: *mut f32,
    stride: usize,
    counts: *mut usize,
    err: *mut MessageBuf,
) -> i32;

/// `i32 topk_cuda_plugin_resident_search_device(const ResidentHandle *,
/// u64 queries, size_t nq, size_t dim, size_t k, u64 stream, u32
/// filter_mode, const u64 *filter_ids, size_t filter_len, const size_t
/// *filter_offsets, u64 *ids, float *scores, size_t stride, size_t *counts,
/// MessageBuf *err)`: as [`ResidentSearchFn`], the queries being `nq × dim`
/// floats at the device address `queries` (memory of this process's CUDA
/// context, which must stay allocated for the call), read after the work
/// queued on the raw `CUstream` `stream` (0: the default stream). The plugin
/// checks the address with the driver and the values on the device.
pub type ResidentSearchDeviceFn = unsafe extern "C" fn(
    handle: *const ResidentHandle,
    queries: u64,
    nq: usize,
    dim: usize,
    k: usize,
    stream: u64,
    filter_mode: u32,
    filter_ids: *const u64,
    filter_len: usize,
    filter_offsets: *const usize,
    ids: *mut u64,
    scores: *mut f32,
    stride: usize,
    counts: *mut usize,
    err: *mut MessageBuf,
) -> i32;

/// The counts of a mutable resident corpus.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ResidentInfoRaw {
    /// Live rows.
    pub live: usize,
    /// Stored rows, removed ones included.
    pub stored: usize,
    /// Rows the device buffers hold before the next growth.
    pub capacity: usize,
    /// Values per row.
    pub dim: usize,
    /// The [`metric_code`].
    pub metric: u32,
}

/// `i32 topk_cuda_plugin_resident_info(const ResidentHandle *,
/// ResidentInfoRaw *out)`.
pub type ResidentInfoFn =
    unsafe extern "C" fn(handle: *const ResidentHandle, out: *mut ResidentInfoRaw) -> i32;

/// `void topk_cuda_plugin_resident_free(ResidentHandle *)`: releases the
/// corpus and its device memory. A null handle is ignored.
pub type ResidentFreeFn = unsafe extern "C" fn(handle: *mut ResidentHandle);

/// A mutable resident corpus inside the plugin; only seen behind a pointer.
#[repr(C)]
pub struct ResidentHandle {
    _opaque: [u8; 0],
    _not_send_sync_unpin: PhantomData<(*mut u8, PhantomPinned)>,
}

/// An engine inside the plugin; only ever seen behind a pointer.
#[repr(C)]
pub struct PluginHandle {
    _opaque: [u8; 0],
    _not_send_sync_unpin: PhantomData<(*mut u8, PhantomPinned)>,
}

/// The engine limits that cross the ABI: the user-level fields of
/// [`topk_cuda::CudaConfig`]; everything else keeps the engine's default.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PluginConfig {
    /// CUDA device ordinal.
    pub device: usize,
    /// Largest K selected on the device.
    pub max_k: usize,
    /// Queries a batch stages at once.
    pub max_batch: usize,
    /// Concurrent searches (streams and scratch slots).
    pub streams: usize,
    /// How the device stores the rows: `topk_core::Dtype::code`.
    pub dtype: u32,
}

impl PluginConfig {
    /// The fields of `config` that cross the ABI.
    pub fn from_config(config: &crate::CudaConfig) -> Self {
        PluginConfig {
            device: config.device,
            max_k: config.max_k,
            max_batch: config.max_batch,
            streams: config.streams,
            dtype: u32::from(Dtype::F32.code()),
        }
    }

    /// These fields with rows stored as `dtype`.
    pub fn with_dtype(self, dtype: Dtype) -> Self {
        PluginConfig {
            dtype: u32::from(dtype.code()),
            ..self
        }
    }

    /// The storage type, `None` for a code no [`Dtype`] has.
    pub fn dtype(self) -> Option<Dtype> {
        u8::try_from(self.dtype).ok().and_then(Dtype::from_code)
    }

    /// The engine's configuration: its defaults with these fields set.
    pub fn to_config(self) -> crate::CudaConfig {
        let mut config = crate::CudaConfig::default();
        config.device = self.device;
        config.max_k = self.max_k;
        config.max_batch = self.max_batch;
        config.streams = self.streams;
        config
    }
}

/// A caller-owned byte buffer the plugin writes UTF-8 text into.
#[repr(C)]
#[derive(Debug)]
pub struct MessageBuf {
    /// Start of `capacity` writable bytes (may be null when `capacity` is 0).
    pub ptr: *mut u8,
    /// Bytes the plugin may write.
    pub capacity: usize,
    /// Bytes written, set by the plugin.
    pub len: usize,
}

/// Bytes of the name fields of [`DeviceSummaryRaw`].
pub const NAME_BYTES: usize = 256;

/// What the driver reports about a device, as fixed-size fields.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct DeviceSummaryRaw {
    /// The device's name, UTF-8, `name_len` bytes used.
    pub name: [u8; NAME_BYTES],
    /// Bytes of `name` used.
    pub name_len: usize,
    /// The driver API version ("13.0"), UTF-8, `driver_version_len` bytes used.
    pub driver_version: [u8; NAME_BYTES],
    /// Bytes of `driver_version` used.
    pub driver_version_len: usize,
    /// Device memory in bytes.
    pub total_memory: u64,
    /// Compute capability, major.
    pub compute_major: i32,
    /// Compute capability, minor.
    pub compute_minor: i32,
    /// Streaming multiprocessors.
    pub multiprocessors: u32,
}

impl Default for DeviceSummaryRaw {
    fn default() -> Self {
        DeviceSummaryRaw {
            name: [0; NAME_BYTES],
            name_len: 0,
            driver_version: [0; NAME_BYTES],
            driver_version_len: 0,
            total_memory: 0,
            compute_major: 0,
            compute_minor: 0,
            multiprocessors: 0,
        }
    }
}

/// Copies `text` into a fixed field, cut at a character boundary; returns the
/// bytes used.
pub fn fill_field(field: &mut [u8; NAME_BYTES], text: &str) -> usize {
    let used = floor_char_boundary(text, NAME_BYTES);
    field[..used].copy_from_slice(&text.as_bytes()[..used]);
    used
}

/// The text of a fixed field with `len` bytes used.
pub fn field_text(field: &[u8; NAME_BYTES], len: usize) -> String {
    String::from_utf8_lossy(&field[..len.min(NAME_BYTES)]).into_owned()
}

/// The longest prefix of `text` of at most `max` bytes that ends on a
/// character boundary.
pub fn floor_char_boundary(text: &str, max: usize) -> usize {
    if text.len() <= max {
        return text.len();
    }
    (0..=max)
        .rev()
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(0)
}

/// What an entry point's status code says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Success.
    Ok,
    /// The plugin was built without the `cuda` feature.
    NotCompiled,
    /// The driver could not be initialised (`cuInit` failed).
    NoDriver,
    /// No device with the requested ordinal.
    NoDevice,
    /// Device memory ran out.
    OutOfMemory,
    /// An input broke the rules of docs/CONTRACTS.md §4.
    InvalidInput,
    /// A configuration value out of range.
    InvalidOption,
    /// A driver call or kernel module failed.
    Driver,
    /// The plugin caught a panic.
    Panic,
    /// A null pointer, an unknown metric code or a buffer too small.
    BadArgument,
    /// Any other engine error.
    Other,
    /// A code this version does not know.
    Unknown(i32),
}

impl Status {
    /// The code on the wire.
    pub const fn code(self) -> i32 {
        match self {
            Status::Ok => 0,
            Status::NotCompiled => 1,
            Status::NoDriver => 2,
            Status::NoDevice => 3,
            Status::OutOfMemory => 4,
            Status::InvalidInput => 5,
            Status::InvalidOption => 6,
            Status::Driver => 7,
            Status::Panic => 8,
            Status::BadArgument => 9,
            Status::Other => 10,
            Status::Unknown(code) => code,
        }
    }

    /// The status of a code.
    pub const fn from_code(code: i32) -> Self {
        match code {
            0 => Status::Ok,
            1 => Status::NotCompiled,
            2 => Status::NoDriver,
            3 => Status::NoDevice,
            4 => Status::OutOfMemory,
            5 => Status::InvalidInput,
            6 => Status::InvalidOption,
            7 => Status::Driver,
            8 => Status::Panic,
            9 => Status::BadArgument,
            10 => Status::Other,
            other => Status::Unknown(other),
        }
    }
}

/// A metric's code on the wire (its `repr(u32)` discriminant).
pub const fn metric_code(metric: Metric) -> u32 {
    metric as u32
}

/// The metric of a code, if it names one.
pub fn metric_from_code(code: u32) -> Option<Metric> {
    Metric::ALL.into_iter().find(|&m| metric_code(m) == code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_codes_round_trip() {
        for code in -1..12 {
            assert_eq!(Status::from_code(code).code(), code);
        }
        assert_eq!(Status::from_code(0), Status::Ok);
        assert_eq!(Status::from_code(42), Status::Unknown(42));
    }

    #[test]
    fn metric_codes_round_trip() {
        for m in Metric::ALL {
            assert_eq!(metric_from_code(metric_code(m)), Some(m));
        }
        assert_eq!(metric_from_code(3), None);
    }

    #[test]
    fn fields_cut_at_a_character_boundary() {
        let mut field = [0; NAME_BYTES];
        let long = "é".repeat(200); // 400 bytes
        let used = fill_field(&mut field, &long);
        assert_eq!(used, 256);
        assert_eq!(field_text(&field, used), "é".repeat(128));
        assert_eq!(floor_char_boundary("aé", 2), 1);
        assert_eq!(floor_char_boundary("abc", 10), 3);
    }

    #[test]
    fn config_round_trips_its_fields() {
        let mut config = crate::CudaConfig::default();
        config.device = 3;
        config.max_k = 100;
        config.max_batch = 7;
        config.streams = 5;
        let raw = PluginConfig::from_config(&config);
        let back = raw.to_config();
        assert_eq!(
            (back.device, back.max_k, back.max_batch, back.streams),
            (3, 100, 7, 5)
        );
        assert_eq!(raw.dtype(), Some(Dtype::F32));
        for dtype in Dtype::ALL {
            assert_eq!(raw.with_dtype(dtype).dtype(), Some(dtype));
        }
        let bad = PluginConfig { dtype: 99, ..raw };
        assert_eq!(bad.dtype(), None);
    }

    #[test]
    fn symbols_are_nul_terminated_and_prefixed() {
        for sym in [
            SYM_ABI_VERSION,
            SYM_DEVICE_SUMMARY,
            SYM_OPEN,
            SYM_LEN,
            SYM_DIM,
            SYM_METRIC,
            SYM_DEVICE_NAME,
            SYM_SEARCH,
            SYM_SEARCH_BATCH,
            SYM_FREE,
            SYM_RESIDENT_OPEN,
            SYM_RESIDENT_MUTATE,
            SYM_RESIDENT_SEARCH,
            SYM_RESIDENT_SEARCH_DEVICE,
            SYM_RESIDENT_INFO,
            SYM_RESIDENT_FREE,
        ] {
            assert!(sym.starts_with(b"topk_cuda_plugin_"));
            assert_eq!(sym.iter().position(|&b| b == 0), Some(sym.len() - 1));
        }
    }
}

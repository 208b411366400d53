//! The only unsafe code of the loader: opening the plugin, resolving its
//! entry points and calling them with buffers sized as the ABI requires.

use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::Arc;

use crate::abi::{
    self, AbiVersionFn, DeviceNameFn, DeviceSummaryFn, DeviceSummaryRaw, FreeFn, MessageBuf,
    MetricFn, OpenFn, PluginConfig, PluginHandle, ResidentFreeFn, ResidentHandle, ResidentInfoFn,
    ResidentInfoRaw, ResidentMutateFn, ResidentOpenFn, ResidentSearchDeviceFn, ResidentSearchFn,
    SearchBatchFn, SearchFn, SizeFn, Status, ABI_VERSION, DRIVER_LIBRARY,
};
use crate::LoadError;

/// Bytes of the buffer a plugin's error message is written into.
const MESSAGE_BYTES: usize = 4096;

/// A failed call: the plugin's status and message.
pub(crate) type CallError = (Status, String);

/// The entry points of a loaded plugin.
struct Entry {
    device_summary: DeviceSummaryFn,
    open: OpenFn,
    len: SizeFn,
    dim: SizeFn,
    metric: MetricFn,
    device_name: DeviceNameFn,
    search: SearchFn,
    search_batch: SearchBatchFn,
    free: FreeFn,
    resident_open: ResidentOpenFn,
    resident_mutate: ResidentMutateFn,
    resident_search: ResidentSearchFn,
    resident_search_device: ResidentSearchDeviceFn,
    resident_info: ResidentInfoFn,
    resident_free: ResidentFreeFn,
}

/// A loaded plugin. The library stays loaded as long as this lives, which
/// every [`Handle`] ensures by holding an `Arc` of it.
pub(crate) struct Plugin {
    entry: Entry,
    path: PathBuf,
    // Dropped last: the entry points above point into it.
    _library: libloading::Library,
}

impl std::fmt::Debug for Plugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plugin").field("path", &self.path).finish()
    }
}

/// Classifies the dynamic loader's refusal of `path`.
pub(crate) fn classify_load_failure(path: &Path, reason: String) -> LoadError {
    if reason.contains(DRIVER_LIBRARY) {
        LoadError::DriverMissing {
            path: path.to_owned(),
            reason,
        }
    } else {
        LoadError::Load {
            path: path.to_owned(),
            reason,
        }
    }
}

fn symbol<T: Copy>(lib: &libloading::Library, path: &Path, name: &[u8]) -> Result<T, LoadError> {
    // SAFETY: every `name` passed here is one of the `abi::SYM_*` constants,
    // and `T` is the function pointer type `abi` defines for it; the plugin
    // exports that symbol with exactly that signature (checked where it is
    // compiled). The pointer is copied out and used only while `lib` is
    // loaded, which `Plugin` guarantees by owning `lib`.
    let found = unsafe { lib.get::<T>(name) };
    found.map(|s| *s).map_err(|e| LoadError::MissingSymbol {
        path: path.to_owned(),
        symbol: String::from_utf8_lossy(name.strip_suffix(b"\0").unwrap_or(name)).into_owned(),
        reason: e.to_string(),
    })
}

impl Plugin {
    /// Opens the plugin at `path`, checks its ABI version, resolves every
    /// entry point.
    pub(crate) fn load(path: &Path) -> Result<Self, LoadError> {
        // SAFETY: loading a library runs its initialisers. The file is the
        // topk CUDA plugin (found by name where the loader looks, or named by
        // the user): a Rust cdylib whose only initialisers are those of the
        // Rust runtime and of the libraries it links (the CUDA driver), none
        // of which has preconditions on the calling thread.
        let lib = unsafe { libloading::Library::new(path) }
            .map_err(|e| classify_load_failure(path, e.to_string()))?;
        let version: AbiVersionFn = symbol(&lib, path, abi::SYM_ABI_VERSION)?;
        // SAFETY: `topk_cuda_plugin_abi_version` takes nothing and returns a
        // number; the library is loaded.
        let found = unsafe { version() };
        if found != ABI_VERSION {
            return Err(LoadError::AbiMismatch {
                path: path.to_owned(),
                found,
                expected: ABI_VERSION,
            });
        }
        let entry = Entry {
            device_summary: symbol(&lib, path, abi::SYM_DEVICE_SUMMARY)?,
            open: symbol(&lib, path, abi::SYM_OPEN)?,
            len: symbol(&lib, path, abi::SYM_LEN)?,
            dim: symbol(&lib, path, abi::SYM_DIM)?,
            metric: symbol(&lib, path, abi::SYM_METRIC)?,
            device_name: symbol(&lib, path, abi::SYM_DEVICE_NAME)?,
            search: symbol(&lib, path, abi::SYM_SEARCH)?,
            search_batch: symbol(&lib, path, abi::SYM_SEARCH_BATCH)?,
            free: symbol(&lib, path, abi::SYM_FREE)?,
            resident_open: symbol(&lib, path, abi::SYM_RESIDENT_OPEN)?,
            resident_mutate: symbol(&lib, path, abi::SYM_RESIDENT_MUTATE)?,
            resident_search: symbol(&lib, path, abi::SYM_RESIDENT_SEARCH)?,
            resident_search_device: symbol(&lib, path, abi::SYM_RESIDENT_SEARCH_DEVICE)?,
            resident_info: symbol(&lib, path, abi::SYM_RESIDENT_INFO)?,
            resident_free: symbol(&lib, path, abi::SYM_RESIDENT_FREE)?,
        };
        Ok(Plugin {
            entry,
            path: path.to_owned(),
            _library: lib,
        })
    }

    /// The file this plugin was loaded from.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// What the driver reports about `device`.
    pub(crate) fn device_summary(&self, device: usize) -> Result<DeviceSummaryRaw, CallError> {
        let mut out = DeviceSummaryRaw::default();
        let mut msg = Message::new();
        // SAFETY: `out` and the message buffer are valid for writes for the
        // whole call; the plugin keeps neither pointer.
        let code = unsafe { (self.entry.device_summary)(device, &mut out, msg.buf()) };
        msg.check(code).map(|()| out)
    }

    /// Uploads `n × dim` row-major values into a new engine: `f32`s, or
    /// with `T = u16` the bit patterns of a half-width store (the type in
    /// `config.dtype`, which the caller sets to match).
    pub(crate) fn open<T: Copy>(
        self: &Arc<Self>,
        rows: &[T],
        dim: usize,
        metric: u32,
        config: &PluginConfig,
    ) -> Result<Handle, CallError> {
        let n = rows.len().checked_div(dim).unwrap_or(0);
        let mut handle: *mut PluginHandle = std::ptr::null_mut();
        let mut msg = Message::new();
        // SAFETY: `rows` holds `n * dim` readable values (`n` is derived from
        // its length) and `config`, `handle` and the message buffer are valid
        // for the call; the plugin copies the rows to the device and keeps no
        // pointer into them.
        let code = unsafe {
            (self.entry.open)(
                rows.as_ptr().cast(),
                n,
                dim,
                metric,
                config,
                &mut handle,
                msg.buf(),
            )
        };
        msg.check(code)?;
        let ptr = NonNull::new(handle).ok_or((
            Status::BadArgument,
            "the plugin reported success but returned no engine".to_owned(),
        ))?;
        Ok(Handle {
            plugin: Arc::clone(self),
            ptr,
        })
    }
}

impl Plugin {
    /// A new, empty mutable resident corpus.
    pub(crate) fn resident_open(
        self: &Arc<Self>,
        dim: usize,
        metric: u32,
        capacity: usize,
        config: &PluginConfig,
    ) -> Result<Resident, CallError> {
        let mut handle: *mut ResidentHandle = std::ptr::null_mut();
        let mut msg = Message::new();
        // SAFETY: `config`, `handle` and the message buffer are valid for the
        // call; the plugin keeps none of them.
        let code = unsafe {
            (self.entry.resident_open)(dim, metric, capacity, config, &mut handle, msg.buf())
        };
        msg.check(code)?;
        let ptr = NonNull::new(handle).ok_or((
            Status::BadArgument,
            "the plugin reported success but returned no corpus".to_owned(),
        ))?;
        Ok(Resident {
            plugin: Arc::clone(self),
            ptr,
        })
    }
}

/// Where a resident search's queries are.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Queries<'a> {
    /// Row-major values in host memory.
    Host(&'a [f32]),
    /// A device address of this process's CUDA context, read after the
    /// work queued on the raw CUDA stream `stream`.
    Device { address: u64, stream: u64 },
}

/// A mutable resident corpus inside the plugin; freed on drop. Mutations
/// take `&mut self`, searches `&self`, as the ABI requires.
pub(crate) struct Resident {
    plugin: Arc<Plugin>,
    ptr: NonNull<ResidentHandle>,
}

// SAFETY: the handle stands for a `topk_cuda::ResidentCorpus`, which is
// `Send + Sync`; searches (`&self`) may run from any thread at once,
// mutations need `&mut self`, and `free` runs only in `Drop`.
unsafe impl Send for Resident {}
// SAFETY: see `Send` above.
unsafe impl Sync for Resident {}

impl std::fmt::Debug for Resident {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resident")
            .field("plugin", &self.plugin.path)
            .finish()
    }
}

impl Resident {
    /// The plugin this corpus lives in.
    pub(crate) fn plugin(&self) -> &Plugin {
        &self.plugin
    }

    /// One mutation (`abi::MUTATE_*`): `rows` holds `ids.len() * dim` values
    /// for add and upsert. Returns the ids a removal found live.
    pub(crate) fn mutate(
        &mut self,
        op: u32,
        ids: &[u64],
        rows: &[f32],
        dim: usize,
    ) -> Result<usize, CallError> {
        let uses_rows = matches!(op, abi::MUTATE_ADD | abi::MUTATE_UPSERT);
        if uses_rows && ids.len().checked_mul(dim) != Some(rows.len()) {
            return Err((
                Status::BadArgument,
                format!("{} ids with {} values of D = {dim}", ids.len(), rows.len()),
            ));
        }
        let mut removed = 0usize;
        let mut msg = Message::new();
        // SAFETY: a live handle held exclusively (`&mut self`); `ids` holds
        // `ids.len()` readable values and `rows` `ids.len() * dim` where used
        // (checked above); `removed` and the message buffer are valid; the
        // plugin keeps no pointer past the call.
        let code = unsafe {
            (self.plugin.entry.resident_mutate)(
                self.ptr.as_ptr(),
                op,
                ids.as_ptr(),
                ids.len(),
                rows.as_ptr(),
                dim,
                &mut removed,
                msg.buf(),
            )
        };
        msg.check(code)?;
        Ok(removed)
    }

    /// `counts.len()` queries of `dim` values (host memory, or a device
    /// address read after the work queued on a raw CUDA stream, which the
    /// plugin checks) under a filter (`abi::FILTER_*` with its ids and
    /// offsets); query `i`'s hits land at `i * stride` in `ids` and `scores`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn search(
        &self,
        queries: Queries<'_>,
        dim: usize,
        k: usize,
        filter: (u32, &[u64], &[usize]),
        stride: usize,
        ids: &mut [u64],
        scores: &mut [f32],
        counts: &mut [usize],
    ) -> Result<(), CallError> {
        let nq = counts.len();
        let (mode, filter_ids, offsets) = filter;
        let needed_offsets = match mode {
            abi::FILTER_NONE => 0,
            abi::FILTER_SHARED => 2,
            _ => nq + 1,
        };
        let room = nq.checked_mul(stride);
        let host_ok = match queries {
            Queries::Host(q) => nq.checked_mul(dim) == Some(q.len()),
            Queries::Device { .. } => true,
        };
        let enough = room.is_some_and(|r| ids.len() >= r && scores.len() >= r)
            && host_ok
            && offsets.len() >= needed_offsets;
        if !enough {
            return Err((
                Status::BadArgument,
                format!(
                    "search buffers do not match: {nq} queries of {dim} values, stride {stride}, {} offsets given",
                    offsets.len()
                ),
            ));
        }
        let mut msg = Message::new();
        let (handle, filter_ptr, filter_len) =
            (self.ptr.as_ptr(), filter_ids.as_ptr(), filter_ids.len());
        let code = match queries {
            // SAFETY: a live handle; `q` holds `nq * dim` readable values,
            // `filter_ids` and `offsets` their lengths (at least the entries
            // the mode reads, checked above), `ids`/`scores` at least
            // `nq * stride` writable values and `counts` `nq`; the plugin
            // keeps no pointer.
            Queries::Host(q) => unsafe {
                (self.plugin.entry.resident_search)(
                    handle,
                    q.as_ptr(),
                    nq,
                    dim,
                    k,
                    mode,
                    filter_ptr,
                    filter_len,
                    offsets.as_ptr(),
                    ids.as_mut_ptr(),
                    scores.as_mut_ptr(),
                    stride,
                    counts.as_mut_ptr(),
                    msg.buf(),
                )
            },
            // SAFETY: as above for the host buffers; the plugin checks the
            // device address with the driver.
            Queries::Device { address, stream } => unsafe {
                (self.plugin.entry.resident_search_device)(
                    handle,
                    address,
                    nq,
                    dim,
                    k,
                    stream,
                    mode,
                    filter_ptr,
                    filter_len,
                    offsets.as_ptr(),
                    ids.as_mut_ptr(),
                    scores.as_mut_ptr(),
                    stride,
                    counts.as_mut_ptr(),
                    msg.buf(),
                )
            },
        };
        msg.check(code)
    }

    /// The corpus's counts.
    pub(crate) fn info(&self) -> Result<ResidentInfoRaw, CallError> {
        let mut out = ResidentInfoRaw::default();
        // SAFETY: a live handle and `out` valid for a write.
        let code = unsafe { (self.plugin.entry.resident_info)(self.ptr.as_ptr(), &mut out) };
        match Status::from_code(code) {
            Status::Ok => Ok(out),
            status => Err((
                status,
                "the CUDA plugin could not report its counts".to_owned(),
            )),
        }
    }
}

impl Drop for Resident {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from `resident_open` and is freed exactly once,
        // here; `&mut self` means no other call on it is running.
        unsafe { (self.plugin.entry.resident_free)(self.ptr.as_ptr()) }
    }
}

/// A caller-owned message buffer for one call.
struct Message {
    bytes: Vec<u8>,
    raw: MessageBuf,
}

impl Message {
    fn new() -> Self {
        Message {
            bytes: vec![0u8; MESSAGE_BYTES],
            raw: MessageBuf {
                ptr: std::ptr::null_mut(),
                capacity: 0,
                len: 0,
            },
        }
    }

    /// The buffer to pass to one call, pointing at `bytes` afresh.
    fn buf(&mut self) -> *mut MessageBuf {
        self.raw = MessageBuf {
            ptr: self.bytes.as_mut_ptr(),
            capacity: self.bytes.len(),
            len: 0,
        };
        &mut self.raw
    }

    fn text(&self) -> String {
        let len = self.raw.len.min(self.bytes.len());
        String::from_utf8_lossy(&self.bytes[..len]).into_owned()
    }

    fn check(&self, code: i32) -> Result<(), CallError> {
        match Status::from_code(code) {
            Status::Ok => Ok(()),
            status => Err((status, self.text())),
        }
    }
}

/// An engine inside the plugin; freed on drop.
pub(crate) struct Handle {
    plugin: Arc<Plugin>,
    ptr: NonNull<PluginHandle>,
}

// SAFETY: the handle stands for a `topk_cuda::CudaRetriever`, which is
// `Send + Sync`; the ABI (abi.rs) makes every entry point taking a handle
// safe to call from any thread, concurrently, and `free` runs only in
// `Drop`, when no other call can hold `&self`.
unsafe impl Send for Handle {}
// SAFETY: see `Send` above.
unsafe impl Sync for Handle {}

impl std::fmt::Debug for Handle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handle")
            .field("plugin", &self.plugin.path)
            .finish()
    }
}

impl Handle {
    /// The plugin this engine lives in.
    pub(crate) fn plugin(&self) -> &Plugin {
        &self.plugin
    }

    /// Corpus rows, N.
    pub(crate) fn len(&self) -> usize {
        // SAFETY: `ptr` is a live handle from `open`, freed only on drop.
        unsafe { (self.plugin.entry.len)(self.ptr.as_ptr()) }
    }

    /// Values per row, D.
    pub(crate) fn dim(&self) -> usize {
        // SAFETY: as in `len`.
        unsafe { (self.plugin.entry.dim)(self.ptr.as_ptr()) }
    }

    /// The metric's code.
    pub(crate) fn metric(&self) -> u32 {
        // SAFETY: as in `len`.
        unsafe { (self.plugin.entry.metric)(self.ptr.as_ptr()) }
    }

    /// The device's name.
    pub(crate) fn device_name(&self) -> Result<String, CallError> {
        let mut msg = Message::new();
        // SAFETY: a live handle and a message buffer valid for the call.
        let code = unsafe { (self.plugin.entry.device_name)(self.ptr.as_ptr(), msg.buf()) };
        msg.check(code)?;
        Ok(msg.text())
    }

    /// One query; `indices` and `scores` have the same length, which is the
    /// capacity passed. Returns the results written.
    pub(crate) fn search(
        &self,
        query: &[f32],
        k: usize,
        indices: &mut [u32],
        scores: &mut [f32],
    ) -> Result<usize, CallError> {
        let capacity = indices.len().min(scores.len());
        let mut count = 0usize;
        let mut msg = Message::new();
        // SAFETY: a live handle; `query` holds `query.len()` readable values;
        // `indices` and `scores` hold at least `capacity` writable values
        // each; `count` and the message buffer are valid; the plugin keeps
        // no pointer past the call.
        let code = unsafe {
            (self.plugin.entry.search)(
                self.ptr.as_ptr(),
                query.as_ptr(),
                query.len(),
                k,
                indices.as_mut_ptr(),
                scores.as_mut_ptr(),
                capacity,
                &mut count,
                msg.buf(),
            )
        };
        msg.check(code)?;
        Ok(count.min(capacity))
    }

    /// `counts.len()` row-major queries of `dim` values; query `i`'s results
    /// land at `i * stride` in `indices` and `scores`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn search_batch(
        &self,
        queries: &[f32],
        dim: usize,
        k: usize,
        stride: usize,
        indices: &mut [u32],
        scores: &mut [f32],
        counts: &mut [usize],
    ) -> Result<(), CallError> {
        let nq = counts.len();
        let room = nq.checked_mul(stride);
        let enough = room.is_some_and(|r| indices.len() >= r && scores.len() >= r)
            && nq.checked_mul(dim) == Some(queries.len());
        if !enough {
            return Err((
                Status::BadArgument,
                format!(
                    "batch buffers do not match: {} queries of {dim} values, stride {stride}, {} values given",
                    nq,
                    queries.len()
                ),
            ));
        }
        let mut msg = Message::new();
        // SAFETY: a live handle; `queries` holds `nq * dim` readable values
        // and `indices`/`scores` at least `nq * stride` writable values each
        // (both checked above); `counts` holds `nq` writable values; the
        // plugin keeps no pointer past the call.
        let code = unsafe {
            (self.plugin.entry.search_batch)(
                self.ptr.as_ptr(),
                queries.as_ptr(),
                nq,
                dim,
                k,
                indices.as_mut_ptr(),
                scores.as_mut_ptr(),
                stride,
                counts.as_mut_ptr(),
                msg.buf(),
            )
        };
        msg.check(code)
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from `open` and is freed exactly once, here;
        // `&mut self` means no other call on it is running.
        unsafe { (self.plugin.entry.free)(self.ptr.as_ptr()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_driver_is_told_apart_from_other_load_failures() {
        let p = Path::new("/x/libtopk_cuda_plugin.so");
        let e = classify_load_failure(
            p,
            "libcuda.so.1: cannot open shared object file: No such file or directory".to_owned(),
        );
        assert!(matches!(e, LoadError::DriverMissing { .. }), "{e}");
        let e = classify_load_failure(
            p,
            "/x/libtopk_cuda_plugin.so: invalid ELF header".to_owned(),
        );
        assert!(matches!(e, LoadError::Load { .. }), "{e}");
    }

    #[test]
    fn a_message_is_read_back_within_its_length() {
        let mut m = Message::new();
        let raw = m.buf();
        // Stands in for the plugin writing "no".
        m.bytes[..2].copy_from_slice(b"no");
        m.raw.len = 2;
        assert!(!raw.is_null());
        assert_eq!(m.check(0), Ok(()));
        assert_eq!(m.check(3), Err((Status::NoDevice, "no".to_owned())));
    }
}

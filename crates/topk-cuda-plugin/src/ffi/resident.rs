//! The exported C entry points of the mutable resident corpus
//! (`topk_cuda::ResidentCorpus`): open, mutate, search (host or device
//! queries), counts, free. Contracts: `topk_cuda_loader::abi`.

use std::panic::{catch_unwind, AssertUnwindSafe};

use topk_core::Hit;
use topk_cuda::{IdFilter, ResidentCorpus};
use topk_cuda_loader::abi::{self, MessageBuf, PluginConfig, ResidentHandle, ResidentInfoRaw};

use super::{guarded, product, slice, slice_mut};
use crate::Failure;

/// The resident corpus behind a handle, shared.
///
/// # Safety
/// `handle` is null or a live handle from `topk_cuda_plugin_resident_open`.
unsafe fn resident<'a>(handle: *const ResidentHandle) -> Result<&'a ResidentCorpus, Failure> {
    // SAFETY: a live handle is a `Box<ResidentCorpus>` turned into a pointer
    // by `topk_cuda_plugin_resident_open`; searches share it (`Sync`).
    unsafe { handle.cast::<ResidentCorpus>().as_ref() }
        .ok_or_else(|| Failure::bad("null resident handle"))
}

/// The resident corpus behind a handle, exclusively.
///
/// # Safety
/// `handle` is null or live, and no other call on it runs (the ABI's rule
/// for mutations).
unsafe fn resident_mut<'a>(handle: *mut ResidentHandle) -> Result<&'a mut ResidentCorpus, Failure> {
    // SAFETY: as in `resident`, held exclusively for the call (contract).
    unsafe { handle.cast::<ResidentCorpus>().as_mut() }
        .ok_or_else(|| Failure::bad("null resident handle"))
}

/// A slice of `len` values at `ptr`; a null pointer is an empty slice when
/// `len` is 0 and refused otherwise.
///
/// # Safety
/// `ptr` is null or valid for `len` reads of `T` for `'a`.
unsafe fn maybe_slice<'a, T>(ptr: *const T, len: usize, what: &str) -> Result<&'a [T], Failure> {
    if ptr.is_null() && len == 0 {
        return Ok(&[]);
    }
    // SAFETY: forwarded from this function's contract.
    unsafe { slice(ptr, len, what) }
}

/// See `topk_cuda_loader::abi::ResidentOpenFn`.
///
/// # Safety
/// `config` valid for a read, `handle` for a write, `err` as in `abi`.
#[no_mangle]
pub unsafe extern "C" fn topk_cuda_plugin_resident_open(
    dim: usize,
    metric: u32,
    capacity: usize,
    config: *const PluginConfig,
    handle: *mut *mut ResidentHandle,
    err: *mut MessageBuf,
) -> i32 {
    let run = || {
        // SAFETY: `config` is null (refused) or valid for a read; `handle`
        // null (refused) or valid for a write.
        let (config, out) = unsafe {
            (
                *config.as_ref().ok_or_else(|| Failure::bad("null config"))?,
                handle
                    .as_mut()
                    .ok_or_else(|| Failure::bad("null handle out"))?,
            )
        };
        let corpus = crate::resident_open(dim, metric, capacity, config)?;
        *out = Box::into_raw(Box::new(corpus)).cast::<ResidentHandle>();
        Ok(())
    };
    // SAFETY: `err` is null or a valid message buffer (contract).
    unsafe { guarded(err, run) }
}

/// See `topk_cuda_loader::abi::ResidentMutateFn`.
///
/// # Safety
/// `handle` null or live and held exclusively; `ids` valid for `n` reads;
/// `rows` for `n * dim` reads where the operation uses them; `removed` null
/// or valid for a write; `err` as in `abi`.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn topk_cuda_plugin_resident_mutate(
    handle: *mut ResidentHandle,
    op: u32,
    ids: *const u64,
    n: usize,
    rows: *const f32,
    dim: usize,
    removed: *mut usize,
    err: *mut MessageBuf,
) -> i32 {
    let run = || {
        if !crate::COMPILED {
            return Err(Failure::not_compiled());
        }
        let uses_rows = matches!(op, abi::MUTATE_ADD | abi::MUTATE_UPSERT);
        let values = if uses_rows {
            product(n, dim, "row values")?
        } else {
            0
        };
        let n_ids = if op == abi::MUTATE_COMPACT { 0 } else { n };
        // SAFETY: each pointer is null (refused unless its length is 0) or
        // valid for the length the contract gives it; the handle is held
        // exclusively.
        let (corpus, ids, rows, removed) = unsafe {
            (
                resident_mut(handle)?,
                maybe_slice(ids, n_ids, "ids")?,
                maybe_slice(rows, values, "rows")?,
                removed.as_mut(),
            )
        };
        let count = crate::resident_mutate(corpus, op, ids, rows)?;
        if let Some(r) = removed {
            *r = count;
        }
        Ok(())
    };
    // SAFETY: `err` is null or a valid message buffer (contract).
    unsafe { guarded(err, run) }
}

/// The host side of both resident searches: checks and borrows the filter
/// and result buffers, runs `search` on the corpus under the filter, and
/// writes query `i`'s hits at `i * stride`.
///
/// # Safety
/// As `topk_cuda_plugin_resident_search` for every pointer but the queries
/// (which `search` reads).
#[allow(clippy::too_many_arguments)]
unsafe fn resident_results(
    handle: *const ResidentHandle,
    nq: usize,
    filter_mode: u32,
    filter_ids: *const u64,
    filter_len: usize,
    filter_offsets: *const usize,
    ids: *mut u64,
    scores: *mut f32,
    stride: usize,
    counts: *mut usize,
    search: impl FnOnce(&ResidentCorpus, IdFilter<'_>) -> Result<Vec<Vec<Hit>>, Failure>,
) -> Result<(), Failure> {
    if !crate::COMPILED {
        return Err(Failure::not_compiled());
    }
    let room = product(nq, stride, "result slots")?;
    let n_offsets = match filter_mode {
        abi::FILTER_NONE => 0,
        abi::FILTER_SHARED => 2,
        abi::FILTER_PER_QUERY => nq + 1,
        other => return Err(Failure::bad(format!("unknown filter mode {other}"))),
    };
    let filter_len = if filter_mode == abi::FILTER_NONE {
        0
    } else {
        filter_len
    };
    // SAFETY: each pointer is null (refused unless its length is 0) or valid
    // for the length the contract gives it.
    let (corpus, filter_ids, offsets, ids, scores, counts) = unsafe {
        (
            resident(handle)?,
            maybe_slice(filter_ids, filter_len, "filter ids")?,
            maybe_slice(filter_offsets, n_offsets, "filter offsets")?,
            slice_mut(ids, room, "ids")?,
            slice_mut(scores, room, "scores")?,
            slice_mut(counts, nq, "counts")?,
        )
    };
    let filter = crate::Filter {
        mode: filter_mode,
        ids: filter_ids,
        offsets,
    };
    let spec = crate::filter_spec(&filter, nq)?;
    let results = search(corpus, spec.as_filter())?;
    crate::write_results(&results, stride, ids, scores, counts)
}

/// See `topk_cuda_loader::abi::ResidentSearchFn`.
///
/// # Safety
/// `handle` null or live; `queries` valid for `nq * dim` reads;
/// `filter_ids` for `filter_len` reads and `filter_offsets` for the entries
/// the mode needs (both may be null under `FILTER_NONE`); `ids` and `scores`
/// for `nq * stride` writes each; `counts` for `nq` writes; `err` as in `abi`.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn topk_cuda_plugin_resident_search(
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
) -> i32 {
    let run = || {
        let values = product(nq, dim, "query values")?;
        // SAFETY: `queries` is null (refused unless empty) or valid for
        // `nq * dim` reads (contract).
        let queries = unsafe { maybe_slice(queries, values, "queries")? };
        // SAFETY: the other pointers as the contract gives them.
        unsafe {
            resident_results(
                handle,
                nq,
                filter_mode,
                filter_ids,
                filter_len,
                filter_offsets,
                ids,
                scores,
                stride,
                counts,
                |corpus, filter| Ok(corpus.search(queries, k, filter)?),
            )
        }
    };
    // SAFETY: `err` is null or a valid message buffer (contract).
    unsafe { guarded(err, run) }
}

/// See `topk_cuda_loader::abi::ResidentSearchDeviceFn`.
///
/// # Safety
/// As `topk_cuda_plugin_resident_search`, except that `queries` is a device
/// address whose `nq * dim` floats stay allocated for the call (the driver
/// checks the address and the extent).
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn topk_cuda_plugin_resident_search_device(
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
) -> i32 {
    let search = |corpus: &ResidentCorpus, filter: IdFilter<'_>| {
        if corpus.dim() != dim {
            return Err(Failure::bad(format!(
                "device queries of D = {dim} for a corpus of D = {}",
                corpus.dim()
            )));
        }
        // SAFETY: the caller keeps the queries allocated for the call
        // (contract); the engine checks the address and the extent with the
        // driver.
        Ok(unsafe { corpus.search_device(queries, nq, k, filter, stream) }?)
    };
    let run = || {
        // SAFETY: the host pointers as the contract gives them.
        unsafe {
            resident_results(
                handle,
                nq,
                filter_mode,
                filter_ids,
                filter_len,
                filter_offsets,
                ids,
                scores,
                stride,
                counts,
                search,
            )
        }
    };
    // SAFETY: `err` is null or a valid message buffer (contract).
    unsafe { guarded(err, run) }
}

/// See `topk_cuda_loader::abi::ResidentInfoFn`.
///
/// # Safety
/// `handle` null or live; `out` null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn topk_cuda_plugin_resident_info(
    handle: *const ResidentHandle,
    out: *mut ResidentInfoRaw,
) -> i32 {
    let run = || {
        // SAFETY: null (refused) or live / valid for a write (contract).
        let (corpus, out) = unsafe {
            (
                resident(handle)?,
                out.as_mut().ok_or_else(|| Failure::bad("null info out"))?,
            )
        };
        *out = crate::resident_info(corpus);
        Ok(())
    };
    // SAFETY: no message buffer.
    unsafe { guarded(std::ptr::null_mut(), run) }
}

/// Frees a resident corpus; a null handle is ignored.
///
/// # Safety
/// `handle` is null or live, and no other call on it runs or follows.
#[no_mangle]
pub unsafe extern "C" fn topk_cuda_plugin_resident_free(handle: *mut ResidentHandle) {
    if handle.is_null() {
        return;
    }
    let _ = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: a live handle is a boxed `ResidentCorpus` from
        // `topk_cuda_plugin_resident_open`, freed once, here (contract).
        drop(unsafe { Box::from_raw(handle.cast::<ResidentCorpus>()) });
    }));
}

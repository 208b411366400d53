//! What a caller chooses when building an engine ([`CudaConfig`]), and the
//! engine's internal heuristics ([`Tuning`]), which benchmarks, probes and
//! tests may set but a user never needs to.

use crate::plan::PlanPath;
use crate::CudaError;

/// Limits of an engine, fixed at construction: every device and pinned buffer
/// is sized from them once, so a search allocates nothing.
///
/// ```
/// let mut config = topk_cuda::CudaConfig::default();
/// config.max_k = 100;
/// config.streams = 4;
/// assert!(config.check().is_ok());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CudaConfig {
    /// CUDA device ordinal.
    pub device: usize,
    /// Largest K selected on the device (1..=2048). Larger K still works,
    /// finished on the host from the scores.
    pub max_k: usize,
    /// Queries a batch stages at once (at most 1,024; a larger batch runs in
    /// turns): each stream holds their inputs and results, and queues all of
    /// a turn's chunks before waiting once. Also bounds the queries of one
    /// [`crate::CudaRetriever::score_ids`] call (with 64).
    pub max_batch: usize,
    /// Concurrent searches (streams and scratch slots), 1..=64.
    pub streams: usize,
    /// The engine's heuristics; the defaults are the measured choices.
    #[doc(hidden)]
    pub tuning: Tuning,
}

/// Heuristics of the engine: which path serves which shape, and the sizes
/// of its scratch. Every setting gives the same answers, bit for bit; only
/// the time differs. Hidden from the documentation: benchmarks, probes and
/// tests set them to reach a given path.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Tuning {
    /// Bytes of score scratch per stream for batches: a turn is scored and
    /// selected in chunks of `batch_scratch / (4 N)` queries, but at least 64
    /// (then `64 × N` floats) and at most `max_batch`. Larger chunks mean
    /// fewer, fuller launches. Where the slots of this size do not fit in
    /// the device's free memory beside the corpus, the engine uses 256 MiB,
    /// else the smallest chunks, and says so in a `tracing` info event
    /// (`config()` then reports the size in use).
    pub batch_scratch: usize,
    /// Capacity of [`crate::CudaRetriever::score_ids`] in ids per call.
    pub max_gather: usize,
    /// Corpora of at most this many rows select each query in one block
    /// (one launch after scoring); larger ones use grid-wide launches
    /// (histogram and threshold, then gather and sort). 0 always uses the
    /// grid-wide path.
    pub fuse_rows: usize,
    /// Corpora of more than `fuse_rows` and at most this many rows run a
    /// single query with K <= `max_k` as one cooperative launch (scoring and
    /// every selection pass, with grid barriers between them) where the
    /// device supports it. 0 turns it off.
    pub single_launch_rows: usize,
    /// Host queries with K <= `max_k` replay a CUDA graph of their whole
    /// sequence (query copy, kernels, result copy), built node by node once
    /// per scratch slot and K (no stream capture, so other threads' CUDA
    /// calls cannot interfere), instead of queueing each step: one launch
    /// per query. Device queries do the same per K and query buffer, from
    /// a buffer's second use (a few recent buffers are remembered), the
    /// graph reading the query in place. Where the driver cannot build a
    /// graph, the steps are queued.
    pub graphs: bool,
    /// The selection kernels write each query's K results straight into
    /// pinned host memory mapped into the device's address space, so no
    /// result copy follows them (used where the device can map host memory
    /// with unified addressing; otherwise results are copied back).
    pub mapped_results: bool,
    /// A host query's graph starts with a one-block kernel that reads the
    /// query from pinned host memory mapped into the device's address space,
    /// instead of a host-to-device copy node (used where host memory can be
    /// mapped with unified addressing; otherwise the copy stays).
    pub mapped_queries: bool,
    /// Batch chunks of at least `filter_queries` queries over corpora of at
    /// least `filter_rows` rows (D % 4 == 0, K <= `filter_max_k` and `max_k`) are
    /// filtered: TF32 tensor cores bound every score, and only the rows
    /// whose bound reaches the K-th best lower bound (at most 4,096 per
    /// query) are scored canonically (`kernels/filter.cu`). The answer is
    /// the same, bit for bit; a chunk whose bounds do not separate (heavy
    /// ties) runs again on the canonical path
    /// ([`crate::CudaRetriever::filter_reruns`] counts them). `usize::MAX`
    /// turns it off.
    pub filter_rows: usize,
    /// See `filter_rows`.
    pub filter_queries: usize,
    /// Largest K of a filtered chunk (at most 2,048, half the 4,096 rows a
    /// query may list); larger K take the canonical path. Near this limit
    /// the rows whose bound reaches the K-th lower bound outgrow the list on
    /// ordinary data and the chunk runs twice, so the default stops at
    /// [`DEFAULT_FILTER_MAX_K`].
    pub filter_max_k: usize,
    /// On a device of compute capability 9.0 (Hopper), the filtered path's
    /// lower bounds come from warpgroup tensor-core products (`wgmma`,
    /// `kernels/filter90.cu`) instead of `mma.sync`: the same bounds, the
    /// same answers bit for bit, in about half the time for chunks of 256
    /// queries (`bench/gpu/NOTES.md`). `false` keeps `mma.sync`.
    pub wgmma_bounds: bool,
    /// The filtered path finds its threshold T from the lower bounds of
    /// every s-th row only, s the largest power of two up to this value
    /// with s · K · 4 <= 4,096 (the list's capacity), s · K · D <= 2^19 and
    /// s · K · D <= N (below that the extra rescoring costs more than the
    /// smaller selection saves), and at least 4: the K-th best of a sample is at most the K-th best
    /// of all, so T stays a valid threshold and the answers are the same
    /// bit for bit, while the selection reads 1/s of the bounds (about
    /// s · K rows are then listed and rescored instead of K). Chunks with an allow set, and K where no
    /// such s exists, select over every row; 1 turns sampling off.
    pub filter_sample: usize,
    /// On Hopper (with `wgmma_bounds`), a filtered chunk without an allow
    /// set first bounds every s-th row only (s the largest power of two up
    /// to this value, at least 16, with 4 · s · K at most the room below
    /// and the sample at least 4 K rows) and selects the K-th best of those
    /// bounds, T0; the bound kernel then lists, as it multiplies, the rows
    /// whose upper bound reaches T0 (at most min(32,768, N / 4) a query)
    /// instead of writing every bound, and the threshold is the K-th best
    /// lower bound of the listed rows: the same rows are rescored as with
    /// every bound selected, and the answers are the same bit for bit
    /// (docs/CONTRACTS.md §5). A chunk that lists more rows runs again on
    /// the canonical path. Where no such s exists, or below 16, the chunk
    /// takes `filter_sample`'s path.
    pub filter_emit: usize,
    /// Fewest rows at which a chunk takes the Hopper listing
    /// (`filter_emit`); smaller corpora take `filter_sample`'s path.
    pub filter_emit_rows: usize,
    /// On Hopper (with `wgmma_bounds`), an engine of f32 rows with
    /// D % 8 == 0 where filtered batches run also keeps an f16 copy of its
    /// rows, each row scaled by a power of two (2 bytes a value and 4 a row
    /// more on the device), and its Hopper bounds multiply that copy by the
    /// queries rounded the same way instead of the f32 rows as TF32: half
    /// the bytes read at twice the tensor rate, with bounds that still hold
    /// every canonical score (docs/CONTRACTS.md §5), so the answers are the
    /// same bit for bit. The copy is made at construction (and again after
    /// rows change, by the next filtered chunk); where it does not fit
    /// beside the corpus and the batch scratch, the engine keeps the TF32
    /// bounds. `false` keeps the TF32 bounds.
    pub shadow_bounds: bool,
    /// Fewest values a row (D) for which `shadow_bounds` makes the copy.
    pub shadow_min_dim: usize,
    /// Threads of each query's block in a graph walk (one of
    /// [`WALK_TEAMS`]; at least the graph's largest degree), or 0 for the
    /// engine's choice by batch size. The answers do not depend on
    /// it: a team spreads one walk's steps over its threads, and every
    /// score is one warp's canonical sum whatever the team.
    pub walk_threads: u32,
    /// How a graph walk keeps the set of nodes it has seen. The answers
    /// do not depend on it.
    pub walk_seen: SeenSet,
}

/// How a graph walk keeps the set of nodes it has seen, in shared memory
/// (`kernels/walk.cu`, `WalkSeen`): 32-bit node ids, or 16-bit tags (half
/// the bytes, for graphs of up to 2^22 nodes at the smallest table, more at
/// larger `ef`; 32-bit ids where the nodes do not fit).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SeenSet {
    /// Tags where the batch has more walks than fit on the device at once
    /// with ids, and tags let more of them share a multiprocessor (shared
    /// memory, not registers, bounds the blocks); else ids. Measured on an
    /// H200, a tag costs a single walk more than an id
    /// (`bench/gpu/NOTES.md`, "Seen tags").
    #[default]
    Auto,
    /// Always 32-bit node ids.
    Ids,
    /// 16-bit tags wherever the nodes fit.
    Tags,
}

impl Default for CudaConfig {
    fn default() -> Self {
        CudaConfig {
            device: 0,
            max_k: 2048,
            max_batch: 256,
            streams: 2,
            tuning: Tuning::default(),
        }
    }
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning {
            batch_scratch: DEFAULT_BATCH_SCRATCH,
            max_gather: 65_536,
            fuse_rows: DEFAULT_FUSE_ROWS,
            single_launch_rows: DEFAULT_SINGLE_LAUNCH_ROWS,
            graphs: true,
            mapped_results: true,
            mapped_queries: true,
            filter_rows: DEFAULT_FILTER_ROWS,
            filter_queries: DEFAULT_FILTER_QUERIES,
            filter_max_k: DEFAULT_FILTER_MAX_K,
            wgmma_bounds: true,
            filter_sample: 8,
            filter_emit: 64,
            filter_emit_rows: DEFAULT_FILTER_EMIT_ROWS,
            shadow_bounds: true,
            shadow_min_dim: DEFAULT_SHADOW_MIN_DIM,
            walk_threads: 0,
            walk_seen: SeenSet::Auto,
        }
    }
}

/// Default of `Tuning::batch_scratch`: 1 GiB, what a whole default batch
/// of 256 queries needs at 1M rows (2^20): a filtered batch then reads the
/// corpus once for all of them (`bench/gpu/NOTES.md`, "wgmma bounds").
/// Larger corpora get smaller chunks, never fewer than 64 queries.
pub const DEFAULT_BATCH_SCRATCH: usize = 1 << 30;

/// Default of `Tuning::filter_rows` and `Tuning::filter_queries`: where the
/// filtered path was as fast as the canonical one or faster on an H200
/// (K = 100, Q = 64 and 256, D = 384-1024, from 30k rows; at 20k rows
/// Q = 64 over D = 384 is 20 % slower filtered; `bench/gpu/NOTES.md`).
pub const DEFAULT_FILTER_ROWS: usize = 30_000;
/// See [`DEFAULT_FILTER_ROWS`].
pub const DEFAULT_FILTER_QUERIES: usize = 64;

/// Default of `Tuning::filter_max_k`. Measured on an H200 at 1M × 1024
/// (Gaussian rows, Q = 256): up to K = 1,536 the filtered chunks list every
/// query's rows within the 4,096 (K = 1,536: 5.47 ms against 18.28 ms
/// canonical); from K = 1,792 every chunk overflows its lists and runs
/// again (22.27 ms against 18.41 ms canonical). At 1M × 384 K = 2,048 still
/// listed within them (`bench/gpu/NOTES.md`, "K past 1,024").
pub const DEFAULT_FILTER_MAX_K: usize = 1536;

/// Default of `Tuning::filter_emit_rows`: measured on an H200 (Q = 256,
/// K = 100, D = 384-1024), the Hopper listing is 19-23 % faster than the
/// sampled path at 1M rows, even at 500k and 10-33 % slower at 50k-100k
/// (`bench/gpu/NOTES.md`, "The Hopper listing").
pub const DEFAULT_FILTER_EMIT_ROWS: usize = 500_000;

/// Default of `Tuning::shadow_min_dim`: measured on an H100 (Q = 256,
/// K = 100, one call), the f16 copy's bounds are level with the TF32 ones
/// at D = 384 (50k-1M rows, within 5 % either way) and 9-14 % faster at
/// D = 768 and 1024 at 1M rows (`bench/gpu/NOTES.md`, "The f16 copy of
/// f32 rows"), so only D >= 768 spends the copy's memory.
pub const DEFAULT_SHADOW_MIN_DIM: usize = 768;

/// Default of `Tuning::fuse_rows`: where one block reading every score
/// twice still costs less than a second launch.
pub const DEFAULT_FUSE_ROWS: usize = 16_384;

/// Default of `Tuning::single_launch_rows`: above it the separate scoring
/// kernel's deeper staging outweighs the launch saved (measured on an H200;
/// `bench/gpu/NOTES.md`).
pub const DEFAULT_SINGLE_LAUNCH_ROWS: usize = 131_072;

/// The graph walk's block sizes (`TOPK_WALK_TEAMS` in `kernels/walk.cu`):
/// a block of `t` threads walks graphs whose lists hold at most `t`
/// neighbours.
pub const WALK_TEAMS: [u32; 4] = [32, 64, 128, 256];

/// Largest `max_k`: half the device's candidate buffer, so that K plus the
/// rows tied at the threshold bin still fit.
pub const MAX_DEVICE_K: usize = 2048;

/// Corpora of at least this many bytes stream to the device through pinned
/// staging buffers, their values checked part by part as they go
/// (docs/CONTRACTS.md §5); smaller ones are checked first, then copied from
/// pageable memory (pinning the buffers would cost more than the overlap
/// saves). Callers that check a corpus before handing it over (the plugin
/// loader) leave a corpus this large to the engine's check.
pub const STAGED_UPLOAD_MIN_BYTES: usize = 256 << 20;

impl CudaConfig {
    /// Checks the ranges documented on each field.
    pub fn check(&self) -> Result<(), CudaError> {
        if self.max_k == 0 || self.max_k > MAX_DEVICE_K {
            return Err(CudaError::InvalidOption {
                name: "max_k",
                value: self.max_k,
                reason: "must be in 1..=2048 (larger K is served from the host path)",
            });
        }
        if self.max_batch == 0 {
            return Err(CudaError::InvalidOption {
                name: "max_batch",
                value: 0,
                reason: "must be at least 1",
            });
        }
        let wt = self.tuning.walk_threads;
        if wt != 0 && !WALK_TEAMS.contains(&wt) {
            return Err(CudaError::InvalidOption {
                name: "walk_threads",
                value: wt as usize,
                reason: "must be 0 (the engine's choice) or 32, 64, 128 or 256",
            });
        }
        if self.streams == 0 || self.streams > 64 {
            return Err(CudaError::InvalidOption {
                name: "streams",
                value: self.streams,
                reason: "must be in 1..=64",
            });
        }
        Ok(())
    }

    /// A default configuration whose tuning sends every search the shape
    /// allows down `path` (a conformance tester's way to reach each path;
    /// [`crate::CudaRetriever::path_counts`] says which ran):
    ///
    /// | path | tuning |
    /// | --- | --- |
    /// | `OneLaunch` | one cooperative launch for every N (where the device supports it), batches canonical |
    /// | `SmallSelect` | one-block selection for every N, steps queued without graphs, batches canonical |
    /// | `FusedGather`, `HistGather` | grid-wide selection for every N, results and queries copied rather than mapped, batches canonical (which of the two runs is D's choice: `HistGather` past 16,384 columns) |
    /// | `HostSelect` | `max_k = 1`: every K >= 2 selected on the host |
    /// | `CanonicalBatch` | batches never filtered, single queries grid-wide |
    /// | `FilteredBatch` | every batch chunk filtered where D % 4 == 0 and K <= 2,048 (`filter_max_k` raised to it), single queries one-block without graphs |
    #[doc(hidden)]
    pub fn for_path(path: PlanPath) -> CudaConfig {
        let mut c = CudaConfig::default();
        let t = &mut c.tuning;
        t.filter_rows = usize::MAX;
        match path {
            PlanPath::OneLaunch => {
                t.fuse_rows = 0;
                t.single_launch_rows = usize::MAX;
            }
            PlanPath::SmallSelect => {
                t.fuse_rows = usize::MAX;
                t.single_launch_rows = 0;
                t.graphs = false;
            }
            PlanPath::FusedGather | PlanPath::HistGather | PlanPath::CanonicalBatch => {
                t.fuse_rows = 0;
                t.single_launch_rows = 0;
                t.mapped_results = false;
                t.mapped_queries = false;
            }
            PlanPath::HostSelect => {
                c.max_k = 1;
            }
            PlanPath::FilteredBatch => {
                t.fuse_rows = usize::MAX;
                t.single_launch_rows = 0;
                t.graphs = false;
                t.filter_rows = 0;
                t.filter_queries = 0;
                t.filter_max_k = crate::plan::FILTER_MAX_K;
                t.filter_emit_rows = 0;
            }
        }
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_is_valid_and_out_of_range_limits_are_named() {
        assert!(CudaConfig::default().check().is_ok());
        for (field, set) in [
            (
                "max_k",
                (|c: &mut CudaConfig| c.max_k = 0) as fn(&mut CudaConfig),
            ),
            ("max_k", |c| c.max_k = MAX_DEVICE_K + 1),
            ("max_batch", |c| c.max_batch = 0),
            ("streams", |c| c.streams = 0),
            ("streams", |c| c.streams = 65),
            ("walk_threads", |c| c.tuning.walk_threads = 48),
            ("walk_threads", |c| c.tuning.walk_threads = 512),
        ] {
            let mut c = CudaConfig::default();
            set(&mut c);
            match c.check() {
                Err(CudaError::InvalidOption { name, .. }) => assert_eq!(name, field),
                other => panic!("{field}: expected InvalidOption, got {other:?}"),
            }
        }
    }

    #[test]
    fn every_path_has_a_valid_configuration() {
        for &path in PlanPath::ALL {
            assert!(CudaConfig::for_path(path).check().is_ok(), "{path}");
        }
        assert_eq!(CudaConfig::for_path(PlanPath::HostSelect).max_k, 1);
    }
}

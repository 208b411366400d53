//! Which launches serve a search: a pure decision from the corpus shape, the
//! configuration and the device's abilities, made by a [`Planner`] built once
//! at construction and asked once per query or batch chunk (K and the number
//! of queries). Nothing here touches the device, so every boundary is tested
//! without one.
//!
//! The paths, by [`PlanPath`]:
//!
//! | path | launches | taken when |
//! | --- | --- | --- |
//! | `OneLaunch` | one cooperative kernel scores and selects | one query, `fuse_rows < N <= single_launch_rows`, K <= `max_k`, the device runs the kernel for this D |
//! | `SmallSelect` | scoring, then one block per query selects | N <= `fuse_rows`, K <= `max_k` |
//! | `FusedGather` | scoring whose blocks also find the threshold, then the gather | one query, N > `fuse_rows`, D <= 16,384 |
//! | `HistGather` | scoring, histogram, gather | one query, N > `fuse_rows`, D > 16,384 |
//! | `HostSelect` | scoring only; the host selects from the N scores | K > `max_k` |
//! | `CanonicalBatch` | batch scoring, then one-block or grid-wide selection | a chunk of several queries not filtered |
//! | `FilteredBatch` | tensor-core bounds, selection over them, listing, rescoring, selection | a chunk the filter rule takes (see `Tuning::filter_rows`) |

// The engine is the planner's only user; without CUDA only the public
// types and the tests use this module.
#![cfg_attr(not(feature = "cuda"), allow(dead_code))]

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::config::CudaConfig;

/// Largest D whose query the single-query kernels stage in shared memory
/// beside their tiles; a larger D runs through the batch kernel.
pub(crate) const SINGLE_MAX_DIM: usize = 16 * 1024;

/// Largest K the filtered batch path can take: half the 4,096 rows a query
/// may list (`CAND_CAP`), so that rows listed besides its best K can fit
/// (`Tuning::filter_max_k` sets the largest it does take).
pub(crate) const FILTER_MAX_K: usize = 2048;

/// The way a search was served. Every path returns the same bytes; they
/// differ in launches and time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PlanPath {
    /// One query, scored and selected by one cooperative launch.
    OneLaunch,
    /// Scoring, then one block selects each query.
    SmallSelect,
    /// One query: the scoring kernel also finds the threshold bin, then the
    /// grid-wide gather ranks the candidates.
    FusedGather,
    /// One query: scoring, the grid-wide histogram pass, then the gather.
    HistGather,
    /// K past `max_k`: the device scores, the host selects.
    HostSelect,
    /// A batch chunk on the canonical scoring kernels.
    CanonicalBatch,
    /// A batch chunk through tensor-core bounds and canonical rescoring.
    FilteredBatch,
}

impl PlanPath {
    /// Every path, in declaration order.
    pub const ALL: &'static [PlanPath] = &[
        PlanPath::OneLaunch,
        PlanPath::SmallSelect,
        PlanPath::FusedGather,
        PlanPath::HistGather,
        PlanPath::HostSelect,
        PlanPath::CanonicalBatch,
        PlanPath::FilteredBatch,
    ];

    /// A short stable name, e.g. `one-launch` (also the `Display` form).
    pub fn name(self) -> &'static str {
        match self {
            PlanPath::OneLaunch => "one-launch",
            PlanPath::SmallSelect => "small-select",
            PlanPath::FusedGather => "fused-gather",
            PlanPath::HistGather => "hist-gather",
            PlanPath::HostSelect => "host-select",
            PlanPath::CanonicalBatch => "canonical-batch",
            PlanPath::FilteredBatch => "filtered-batch",
        }
    }

    /// The path named `name` (as [`PlanPath::name`] spells it).
    pub fn from_name(name: &str) -> Option<PlanPath> {
        PlanPath::ALL.iter().copied().find(|p| p.name() == name)
    }

    fn index(self) -> usize {
        PlanPath::ALL
            .iter()
            .position(|&p| p == self)
            .unwrap_or_default()
    }
}

impl fmt::Display for PlanPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How many queries each path has served since construction (see
/// [`crate::CudaRetriever::path_counts`]): a batch counts each of its
/// queries once, under the path of its chunk.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PathCounts {
    counts: [u64; PlanPath::ALL.len()],
}

impl PathCounts {
    /// Queries served by `path`.
    pub fn get(&self, path: PlanPath) -> u64 {
        self.counts[path.index()]
    }

    /// Queries served by every path together.
    pub fn total(&self) -> u64 {
        self.counts.iter().sum()
    }
}

/// The engine's live counters behind [`PathCounts`].
#[derive(Debug, Default)]
pub(crate) struct PathCounters {
    counts: [AtomicU64; PlanPath::ALL.len()],
}

impl PathCounters {
    /// Adds `queries` to `path`'s count.
    pub(crate) fn add(&self, path: PlanPath, queries: usize) {
        self.counts[path.index()].fetch_add(queries as u64, Ordering::Relaxed);
    }

    /// The counts now.
    pub(crate) fn snapshot(&self) -> PathCounts {
        PathCounts {
            counts: std::array::from_fn(|i| self.counts[i].load(Ordering::Relaxed)),
        }
    }
}

/// How the device selects after scoring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Select {
    /// No selection: the N scores stay on the device for the host.
    ScoresOnly,
    /// One block per query.
    Small,
    /// The scoring kernel finds the threshold; the gather follows.
    Fused,
    /// The histogram pass, then the gather.
    Hist,
}

/// The launches of one query or batch chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Steps {
    /// The one-launch search kernel.
    OneLaunch,
    /// A scoring kernel, then the selection given.
    Score(Select),
    /// The filtered batch sequence.
    Filtered,
}

/// The decision for one query or chunk: what runs, and the path it counts as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Plan {
    pub(crate) path: PlanPath,
    pub(crate) steps: Steps,
}

impl Plan {
    /// Scoring alone, for a query the host finishes after the device could
    /// not (too many tied candidates): not a path of its own, since the
    /// query was counted under the path that tried.
    pub(crate) const SCORES_ONLY: Plan = Plan {
        path: PlanPath::HostSelect,
        steps: Steps::Score(Select::ScoresOnly),
    };

    /// Whether the device writes result rows (else the host selects).
    pub(crate) fn device_selects(&self) -> bool {
        self.steps != Steps::Score(Select::ScoresOnly)
    }
}

/// Everything the plan depends on, fixed at construction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Planner {
    n: usize,
    d: usize,
    max_k: usize,
    fuse_rows: usize,
    single_launch_rows: usize,
    graphs: bool,
    /// The device runs the one-launch kernel for this D.
    one_launch: bool,
    /// The filter rule applies to this corpus (enough rows, D % 4 == 0).
    filter_fits: bool,
    filter_queries: usize,
    /// Largest K of a filtered chunk: `Tuning::filter_max_k`, at most
    /// [`FILTER_MAX_K`] and `max_k`.
    filter_max_k: usize,
}

impl Planner {
    /// The planner of an `n × d` corpus under `config`, where the device
    /// can (`one_launch`) or cannot run the one-launch kernel for this D.
    pub(crate) fn new(n: usize, d: usize, config: &CudaConfig, one_launch: bool) -> Self {
        let t = &config.tuning;
        Planner {
            n,
            d,
            max_k: config.max_k,
            fuse_rows: t.fuse_rows,
            single_launch_rows: t.single_launch_rows,
            graphs: t.graphs,
            one_launch,
            filter_fits: Self::filter_fits(n, d, config),
            filter_queries: t.filter_queries,
            filter_max_k: t.filter_max_k.min(FILTER_MAX_K).min(config.max_k),
        }
    }

    /// Whether batches over `n` rows of `d` columns can be filtered under
    /// `config` (the tensor-core kernel stages whole 16-byte pieces), which
    /// decides at construction whether the filtered lists are allocated.
    pub(crate) fn filter_fits(n: usize, d: usize, config: &CudaConfig) -> bool {
        n >= config.tuning.filter_rows && d % 4 == 0 && n <= u32::MAX as usize
    }

    /// Whether the device selects K (else the host does, from the scores).
    pub(crate) fn device_k(&self, k: usize) -> bool {
        k <= self.max_k
    }

    /// Whether a single query with this K replays a graph.
    pub(crate) fn graph(&self, k: usize) -> bool {
        self.graphs && self.device_k(k)
    }

    /// The canonical launches of `nq` queries (at least 1) with this K.
    pub(crate) fn canonical(&self, k: usize, nq: usize) -> Plan {
        let device_k = self.device_k(k);
        let one_launch =
            self.n > self.fuse_rows && self.n <= self.single_launch_rows && self.one_launch;
        let (path, steps) = if !device_k {
            (PlanPath::HostSelect, Steps::Score(Select::ScoresOnly))
        } else if nq == 1 && one_launch {
            (PlanPath::OneLaunch, Steps::OneLaunch)
        } else {
            let select = if self.n <= self.fuse_rows {
                Select::Small
            } else if nq == 1 && self.d <= SINGLE_MAX_DIM {
                Select::Fused
            } else {
                Select::Hist
            };
            let path = match (nq, select) {
                (1, Select::Small) => PlanPath::SmallSelect,
                (1, Select::Fused) => PlanPath::FusedGather,
                (1, _) => PlanPath::HistGather,
                _ => PlanPath::CanonicalBatch,
            };
            (path, Steps::Score(select))
        };
        Plan { path, steps }
    }

    /// Whether a batch chunk of `cq` queries with this K is filtered.
    pub(crate) fn filtered(&self, k: usize, cq: usize) -> bool {
        self.filter_fits && k <= self.filter_max_k && cq >= self.filter_queries
    }

    /// The launches of a batch chunk of `cq` queries with this K.
    pub(crate) fn chunk(&self, k: usize, cq: usize) -> Plan {
        if self.filtered(k, cq) {
            Plan {
                path: PlanPath::FilteredBatch,
                steps: Steps::Filtered,
            }
        } else {
            self.canonical(k, cq)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn planner(n: usize, d: usize, config: &CudaConfig, one_launch: bool) -> Planner {
        Planner::new(n, d, config, one_launch)
    }

    fn path(p: &Planner, k: usize, nq: usize) -> PlanPath {
        p.chunk(k, nq).path
    }

    #[test]
    fn names_round_trip_and_all_lists_each_path_once() {
        for (i, &p) in PlanPath::ALL.iter().enumerate() {
            assert_eq!(PlanPath::from_name(p.name()), Some(p));
            assert_eq!(p.to_string(), p.name());
            assert_eq!(p.index(), i);
        }
        assert_eq!(PlanPath::from_name("nope"), None);
    }

    #[test]
    fn counters_add_per_path() {
        let c = PathCounters::default();
        c.add(PlanPath::HistGather, 1);
        c.add(PlanPath::FilteredBatch, 64);
        c.add(PlanPath::FilteredBatch, 6);
        let s = c.snapshot();
        assert_eq!(s.get(PlanPath::HistGather), 1);
        assert_eq!(s.get(PlanPath::FilteredBatch), 70);
        assert_eq!(s.get(PlanPath::OneLaunch), 0);
        assert_eq!(s.total(), 71);
        assert_eq!(PathCounts::default().total(), 0);
    }

    #[test]
    fn single_queries_by_rows_at_the_default_tuning() {
        let c = CudaConfig::default();
        let (fuse, one) = (c.tuning.fuse_rows, c.tuning.single_launch_rows);
        let at = |n: usize| path(&planner(n, 384, &c, true), 10, 1);
        assert_eq!(at(1), PlanPath::SmallSelect);
        assert_eq!(at(fuse), PlanPath::SmallSelect);
        assert_eq!(at(fuse + 1), PlanPath::OneLaunch);
        assert_eq!(at(one), PlanPath::OneLaunch);
        assert_eq!(at(one + 1), PlanPath::FusedGather);
        // Without the cooperative kernel, mid-size corpora fuse instead.
        assert_eq!(
            path(&planner(fuse + 1, 384, &c, false), 10, 1),
            PlanPath::FusedGather
        );
        // Past the single-query kernel's D the histogram pass runs.
        let wide = planner(one + 1, SINGLE_MAX_DIM + 1, &c, false);
        assert_eq!(path(&wide, 10, 1), PlanPath::HistGather);
        let edge = planner(one + 1, SINGLE_MAX_DIM, &c, false);
        assert_eq!(path(&edge, 10, 1), PlanPath::FusedGather);
    }

    #[test]
    fn k_past_max_k_is_selected_on_the_host() {
        let c = CudaConfig::default();
        for n in [10, 50_000, 1_000_000] {
            let p = planner(n, 384, &c, true);
            assert_ne!(path(&p, c.max_k, 1), PlanPath::HostSelect);
            assert_eq!(path(&p, c.max_k + 1, 1), PlanPath::HostSelect);
            assert_eq!(path(&p, c.max_k + 1, 256), PlanPath::HostSelect);
            assert!(!p.graph(c.max_k + 1));
            assert!(p.graph(c.max_k));
            assert!(!p.chunk(c.max_k + 1, 1).device_selects());
            assert!(p.chunk(c.max_k, 1).device_selects());
        }
        assert!(!Plan::SCORES_ONLY.device_selects());
    }

    #[test]
    fn batch_chunks_filter_only_where_the_rule_allows() {
        let c = CudaConfig::default();
        let (rows, queries) = (c.tuning.filter_rows, c.tuning.filter_queries);
        let p = planner(rows, 384, &c, true);
        assert_eq!(path(&p, 100, queries), PlanPath::FilteredBatch);
        assert_eq!(p.chunk(100, queries).steps, Steps::Filtered);
        assert_eq!(path(&p, 100, queries - 1), PlanPath::CanonicalBatch);
        // The default filters up to filter_max_k; larger K run canonically
        // on the device up to max_k.
        let most = c.tuning.filter_max_k;
        assert_eq!(most, crate::config::DEFAULT_FILTER_MAX_K);
        assert_eq!(path(&p, most, queries), PlanPath::FilteredBatch);
        assert_eq!(path(&p, most + 1, queries), PlanPath::CanonicalBatch);
        assert_eq!(path(&p, FILTER_MAX_K, queries), PlanPath::CanonicalBatch);
        // Raised, filter_max_k reaches FILTER_MAX_K, the device's largest K
        // (past it the host selects), and no further.
        let mut wide = c.clone();
        wide.tuning.filter_max_k = usize::MAX;
        let p = planner(rows, 384, &wide, true);
        assert_eq!(path(&p, FILTER_MAX_K, queries), PlanPath::FilteredBatch);
        assert_eq!(FILTER_MAX_K, crate::config::MAX_DEVICE_K);
        assert_eq!(path(&p, FILTER_MAX_K + 1, queries), PlanPath::HostSelect);
        // The forced path raises it.
        let forced = CudaConfig::for_path(PlanPath::FilteredBatch);
        let p = planner(10, 384, &forced, true);
        assert_eq!(path(&p, FILTER_MAX_K, 1), PlanPath::FilteredBatch);
        // Too few rows, or D not a multiple of 4.
        assert_eq!(
            path(&planner(rows - 1, 384, &c, true), 100, queries),
            PlanPath::CanonicalBatch
        );
        assert_eq!(
            path(&planner(rows, 385, &c, true), 100, queries),
            PlanPath::CanonicalBatch
        );
        assert!(Planner::filter_fits(rows, 384, &c));
        assert!(!Planner::filter_fits(rows, 386, &c));
        // A max_k below the filter's own limit bounds it too.
        let mut small = c.clone();
        small.max_k = 50;
        let p = planner(rows, 384, &small, true);
        assert_eq!(path(&p, 50, queries), PlanPath::FilteredBatch);
        assert_eq!(path(&p, 51, queries), PlanPath::HostSelect);
    }

    #[test]
    fn canonical_batches_select_in_one_block_or_grid_wide() {
        let c = CudaConfig::default();
        let fuse = c.tuning.fuse_rows;
        let small = planner(fuse, 384, &c, true).chunk(10, 2);
        assert_eq!(small.path, PlanPath::CanonicalBatch);
        assert_eq!(small.steps, Steps::Score(Select::Small));
        // Several queries never fuse the threshold into scoring, nor run
        // as one launch.
        let grid = planner(fuse + 1, 384, &c, true).chunk(10, 2);
        assert_eq!(grid.path, PlanPath::CanonicalBatch);
        assert_eq!(grid.steps, Steps::Score(Select::Hist));
        // A chunk of one query is planned as a single query.
        assert_eq!(
            planner(fuse + 1, 384, &c, true).chunk(10, 1).path,
            PlanPath::OneLaunch
        );
    }

    #[test]
    fn zero_and_max_thresholds_turn_paths_off() {
        let mut c = CudaConfig::default();
        c.tuning.fuse_rows = 0;
        c.tuning.single_launch_rows = 0;
        assert_eq!(path(&planner(1, 8, &c, true), 1, 1), PlanPath::FusedGather);
        c.tuning.fuse_rows = usize::MAX;
        assert_eq!(
            path(&planner(1 << 30, 8, &c, true), 1, 1),
            PlanPath::SmallSelect
        );
        c.tuning.graphs = false;
        assert!(!planner(1, 8, &c, true).graph(1));
    }

    #[test]
    fn for_path_reaches_each_path_where_the_shape_allows() {
        // A shape that allows every path: D % 4 == 0, D <= 16,384 (the
        // histogram path needs a wider D), the one-launch kernel available.
        for &want in PlanPath::ALL {
            let c = CudaConfig::for_path(want);
            let (n, d) = (
                1000,
                if want == PlanPath::HistGather {
                    20_000
                } else {
                    64
                },
            );
            let p = planner(n, d, &c, true);
            let got = match want {
                PlanPath::CanonicalBatch | PlanPath::FilteredBatch => path(&p, 10, 8),
                PlanPath::HostSelect => path(&p, 2, 1),
                _ => path(&p, 10, 1),
            };
            assert_eq!(got, want);
        }
    }
}

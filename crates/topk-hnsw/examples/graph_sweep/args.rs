//! The sweep's flags and the checks of their values.

use std::path::PathBuf;

use clap::Parser;
use topk_core::Metric;
use topk_cuda::SeenSet;
use topk_hnsw::BatchSchedule;

use crate::AnyResult;

#[derive(Parser, Debug)]
#[command(about = "GPU graph search vs CPU HNSW vs exact GPU: recall, QPS, latency, builds")]
pub(crate) struct Args {
    /// Rows of the Gaussian-cluster corpus.
    #[arg(long, default_value_t = 1_000_000)]
    pub(crate) n: usize,
    /// Dimension of the Gaussian-cluster corpus.
    #[arg(long, default_value_t = 384)]
    pub(crate) d: usize,
    /// Held-out queries of the Gaussian-cluster set.
    #[arg(long, default_value_t = 10_000)]
    pub(crate) queries: usize,
    /// Cluster centres of the generator.
    #[arg(long, default_value_t = 1_000)]
    pub(crate) clusters: usize,
    /// Standard deviation of the noise around a centre.
    #[arg(long, default_value_t = 1.0)]
    pub(crate) spread: f32,
    /// Seed of the generator (centres and rows; queries draw their noise
    /// from a stream derived from it).
    #[arg(long, default_value_t = 2026)]
    pub(crate) seed: u64,
    /// Metric of the Gaussian-cluster set.
    #[arg(long, default_value = "l2")]
    pub(crate) metric: Metric,
    /// Skip the Gaussian-cluster set (e.g. to run the MiniLM set alone).
    #[arg(long)]
    pub(crate) no_gauss: bool,
    /// Folder of the MiniLM set (`corpus.npy`, `queries.npy`); skipped
    /// with a message where absent.
    #[arg(long)]
    pub(crate) minilm: Option<PathBuf>,
    /// Metric of the MiniLM set (L2-normalised rows).
    #[arg(long, default_value = "dot")]
    pub(crate) minilm_metric: Metric,
    /// Links per node on the upper layers (layer 0 keeps 2·m).
    #[arg(long, default_value_t = 16)]
    pub(crate) m: usize,
    /// Beam width of both builds.
    #[arg(long, default_value_t = 100)]
    pub(crate) ef_construction: usize,
    /// Seed of the level draw.
    #[arg(long, default_value_t = 1)]
    pub(crate) level_seed: u64,
    /// Beam widths of the search sweep.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "16,32,64,128,192,256,384,512"
    )]
    pub(crate) ef: Vec<usize>,
    /// Queries per call (1 = single queries one after another).
    #[arg(long, value_delimiter = ',', default_value = "1,10,100,1000,10000")]
    pub(crate) batch: Vec<usize>,
    /// Neighbours per query.
    #[arg(long, default_value_t = 10)]
    pub(crate) k: usize,
    /// Timed seconds per measurement point, past its minimum repetitions.
    #[arg(long, default_value_t = 2.0)]
    pub(crate) budget_s: f64,
    /// Untimed batches before a point's timed ones (at least 100 queries'
    /// worth for small batches).
    #[arg(long, default_value_t = 2)]
    pub(crate) warmup: usize,
    /// Timed batches per point at least (whatever the budget).
    #[arg(long, default_value_t = 3)]
    pub(crate) min_reps: usize,
    /// Seconds since the start after which the remaining points are skipped
    /// (recorded as skipped), so the outputs are written within the call.
    #[arg(long, default_value_t = 470.0)]
    pub(crate) deadline_s: f64,
    /// Recall floor of the table's "best QPS" columns.
    #[arg(long, default_value_t = 0.95)]
    pub(crate) recall_target: f64,
    /// Host threads of the CPU build and CPU batch searches (0: all).
    #[arg(long, default_value_t = 0)]
    pub(crate) threads: usize,
    /// Queries the exact GPU engine stages per turn (`CudaConfig::max_batch`).
    #[arg(long, default_value_t = 1024)]
    pub(crate) exact_max_batch: usize,
    /// Threads of each query's block in the GPU walk
    /// (`Tuning::walk_threads`: 32, 64, 128, 256, or 0 for the engine's
    /// choice by batch size).
    #[arg(long, default_value_t = 0)]
    pub(crate) walk_threads: u32,
    /// Nodes the GPU walk of the `gpu-graph (wide)` points expands per step
    /// (`Hnsw::search_graph_gpu_counted`'s width, 1 ..= 8); 1 runs no such
    /// points.
    #[arg(long, default_value_t = 1)]
    pub(crate) walk_width: usize,
    /// How the GPU walk keeps its seen set (`Tuning::walk_seen`): auto,
    /// ids (32-bit) or tags (16-bit).
    #[arg(long, default_value = "auto", value_parser = parse_seen)]
    pub(crate) walk_seen: SeenSet,
    /// The GPU builds to time, each with its recall per ef; the first is the
    /// graph of the GPU-built points: `batched` (`Hnsw::build_batched_gpu`,
    /// the default schedule), `batched:DIVISOR:MAX_BATCH`, or `knn`
    /// (`Hnsw::build_knn_gpu`).
    #[arg(long, value_delimiter = ',', default_value = "batched", value_parser = parse_build)]
    pub(crate) gpu_build: Vec<GpuBuild>,
    /// Skip the GPU build (and its graph's points).
    #[arg(long)]
    pub(crate) no_gpu_build: bool,
    /// Skip every GPU part; the ground truth comes from the CPU oracle.
    #[arg(long)]
    pub(crate) cpu_only: bool,
    /// Output folder.
    #[arg(long, default_value = "graph-sweep")]
    pub(crate) out: PathBuf,
}

/// Rejects values the sweep cannot use, naming them.
pub(crate) fn check_args(a: &Args) -> AnyResult<()> {
    if a.ef.is_empty() || a.ef.contains(&0) {
        return Err(format!("--ef needs beam widths of at least 1, got {:?}", a.ef).into());
    }
    if a.batch.is_empty() || a.batch.contains(&0) {
        return Err(format!("--batch needs batch sizes of at least 1, got {:?}", a.batch).into());
    }
    if a.k == 0 {
        return Err("--k must be at least 1, got 0".into());
    }
    if a.queries == 0 && !a.no_gauss {
        return Err("--queries must be at least 1, got 0".into());
    }
    if !(a.budget_s.is_finite() && a.budget_s >= 0.0) {
        return Err(format!("--budget-s must be a finite value ≥ 0, got {}", a.budget_s).into());
    }
    if a.walk_width == 0 || a.walk_width > topk_hnsw::MAX_WALK_WIDTH {
        return Err(format!("--walk-width must be 1 ..= 8, got {}", a.walk_width).into());
    }
    if a.min_reps == 0 {
        return Err("--min-reps must be at least 1, got 0".into());
    }
    Ok(())
}

/// One GPU build of `--gpu-build`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GpuBuild {
    Batched(BatchSchedule),
    Knn,
}

impl std::fmt::Display for GpuBuild {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GpuBuild::Batched(s) => write!(
                f,
                "GPU batched build (Hnsw::build_batched_gpu, divisor {}, max batch {})",
                s.divisor, s.max_batch
            ),
            GpuBuild::Knn => write!(f, "GPU kNN build (Hnsw::build_knn_gpu)"),
        }
    }
}

fn parse_build(s: &str) -> Result<GpuBuild, String> {
    let parts: Vec<&str> = s.split(':').collect();
    match parts.as_slice() {
        ["knn"] => Ok(GpuBuild::Knn),
        ["batched"] => Ok(GpuBuild::Batched(BatchSchedule::default())),
        ["batched", div, max] => {
            let num = |v: &str| {
                v.parse::<usize>()
                    .ok()
                    .filter(|&x| x > 0)
                    .ok_or_else(|| format!("--gpu-build {s:?}: {v:?} is not a count of at least 1"))
            };
            Ok(GpuBuild::Batched(BatchSchedule {
                divisor: num(div)?,
                max_batch: num(max)?,
            }))
        }
        _ => Err(format!(
            "--gpu-build takes batched, batched:DIVISOR:MAX_BATCH or knn, got {s:?}"
        )),
    }
}

fn parse_seen(s: &str) -> Result<SeenSet, String> {
    match s {
        "auto" => Ok(SeenSet::Auto),
        "ids" => Ok(SeenSet::Ids),
        "tags" => Ok(SeenSet::Tags),
        other => Err(format!(
            "--walk-seen takes auto, ids or tags, got {other:?}"
        )),
    }
}

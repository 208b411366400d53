//! The GPU graph-search sweep: GPU graph search, CPU HNSW and the exact GPU
//! engine side by side, on one graph, in one process.
//!
//! For each data set (the seeded Gaussian-cluster corpus, and the MiniLM set
//! when `--minilm DIR` names it):
//!
//! 1. the exact GPU engine uploads the corpus and answers every query with
//!    K = `--k`: the ground truth (exact, bit-identical to the CPU oracle);
//! 2. the graph is built twice, timed: on every host thread
//!    (`Hnsw::build_parallel`'s build) and on the GPU (`Hnsw::build_knn_gpu`),
//!    with the same parameters; each graph's recall@k is measured at every
//!    `ef` of the sweep;
//! 3. for every batch size and `ef`: QPS and per-batch latency (median and
//!    p90 over repetitions after a warm-up) of GPU graph search on the CPU
//!    graph, CPU HNSW (all threads for batches, one thread one query at a
//!    time for batch 1), and the exact GPU engine (one point per batch
//!    size), each with its recall@k;
//! 4. checks: GPU graph search returns the CPU HNSW results on the same
//!    graph, and a query's GPU result does not depend on the batch it is in
//!    (every timed batch is compared with the one-call pass over all
//!    queries).
//!
//! Writes `raw.jsonl` (one line per measurement), `table.md`,
//! `recall_qps.svg` / `.png` (and `recall_qps_minilm.*`) and
//! `environment.json` under `--out`. `--cpu-only` skips every GPU part
//! (ground truth from the CPU oracle) for a machine without a GPU. A part
//! that fails (the GPU build, a graph upload, a point) is recorded in
//! `raw.jsonl` and `table.md` and the rest of the sweep goes on; past
//! `--deadline-s` the remaining points are skipped, so the outputs are
//! always written. The defaults (1M × 384, both sets) take about four
//! minutes on an H200 with a 16-core host.
//!
//! ```text
//! cargo run --release -p topk-hnsw --features cuda --example graph_sweep -- --out graph-sweep
//! cargo run --release -p topk-hnsw --features cuda --example graph_sweep -- --n 20000 --queries 1000 --cpu-only --budget-s 0.3 --out /tmp/gs
//! ```

use std::cell::Cell;
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};
use ndarray::{s, Array2, ArrayView2};
use plotters::prelude::*;
use serde_json::{json, Value};
use topk_core::{Metric, Neighbor, Retriever};
use topk_cuda::{CudaConfig, CudaRetriever};
use topk_hnsw::{recall_at_k, synth, Hnsw, HnswParams};

#[derive(Parser, Debug)]
#[command(about = "GPU graph search vs CPU HNSW vs exact GPU: recall, QPS, latency, builds")]
struct Args {
    /// Rows of the Gaussian-cluster corpus.
    #[arg(long, default_value_t = 1_000_000)]
    n: usize,
    /// Dimension of the Gaussian-cluster corpus.
    #[arg(long, default_value_t = 384)]
    d: usize,
    /// Held-out queries of the Gaussian-cluster set.
    #[arg(long, default_value_t = 10_000)]
    queries: usize,
    /// Cluster centres of the generator.
    #[arg(long, default_value_t = 1_000)]
    clusters: usize,
    /// Standard deviation of the noise around a centre.
    #[arg(long, default_value_t = 1.0)]
    spread: f32,
    /// Seed of the generator (centres and rows; queries draw their noise
    /// from a stream derived from it).
    #[arg(long, default_value_t = 2026)]
    seed: u64,
    /// Metric of the Gaussian-cluster set.
    #[arg(long, default_value = "l2")]
    metric: Metric,
    /// Skip the Gaussian-cluster set (e.g. to run the MiniLM set alone).
    #[arg(long)]
    no_gauss: bool,
    /// Folder of the MiniLM set (`corpus.npy`, `queries.npy`); skipped
    /// with a message where absent.
    #[arg(long)]
    minilm: Option<PathBuf>,
    /// Metric of the MiniLM set (L2-normalised rows).
    #[arg(long, default_value = "dot")]
    minilm_metric: Metric,
    /// Links per node on the upper layers (layer 0 keeps 2·m).
    #[arg(long, default_value_t = 16)]
    m: usize,
    /// Beam width of both builds.
    #[arg(long, default_value_t = 100)]
    ef_construction: usize,
    /// Seed of the level draw.
    #[arg(long, default_value_t = 1)]
    level_seed: u64,
    /// Beam widths of the search sweep.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "16,32,64,128,192,256,384,512"
    )]
    ef: Vec<usize>,
    /// Queries per call (1 = single queries one after another).
    #[arg(long, value_delimiter = ',', default_value = "1,10,100,1000,10000")]
    batch: Vec<usize>,
    /// Neighbours per query.
    #[arg(long, default_value_t = 10)]
    k: usize,
    /// Timed seconds per measurement point, past its minimum repetitions.
    #[arg(long, default_value_t = 2.0)]
    budget_s: f64,
    /// Untimed batches before a point's timed ones (at least 100 queries'
    /// worth for small batches).
    #[arg(long, default_value_t = 2)]
    warmup: usize,
    /// Timed batches per point at least (whatever the budget).
    #[arg(long, default_value_t = 3)]
    min_reps: usize,
    /// Seconds since the start after which the remaining points are skipped
    /// (recorded as skipped), so the outputs are written within the call.
    #[arg(long, default_value_t = 470.0)]
    deadline_s: f64,
    /// Recall floor of the table's "best QPS" columns.
    #[arg(long, default_value_t = 0.95)]
    recall_target: f64,
    /// Host threads of the CPU build and CPU batch searches (0: all).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// Queries the exact GPU engine stages per turn (`CudaConfig::max_batch`).
    #[arg(long, default_value_t = 1024)]
    exact_max_batch: usize,
    /// Skip every GPU part; the ground truth comes from the CPU oracle.
    #[arg(long)]
    cpu_only: bool,
    /// Output folder.
    #[arg(long, default_value = "graph-sweep")]
    out: PathBuf,
}

type AnyResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// GPU graph search over the CPU-built graph.
const GPU_GRAPH: &str = "gpu-graph";
/// GPU graph search over the GPU-built graph (batch sizes 1 and the largest).
const GPU_GRAPH_GPU_BUILT: &str = "gpu-graph (gpu-built graph)";
/// topk-hnsw's CPU search over the CPU-built graph.
const CPU_HNSW: &str = "cpu-hnsw";
/// The exact GPU engine.
const EXACT_GPU: &str = "exact-gpu";

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("graph_sweep: {e}");
            ExitCode::FAILURE
        }
    }
}

/// A data set of the sweep.
struct Dataset {
    name: String,
    corpus: Array2<f32>,
    queries: Array2<f32>,
    metric: Metric,
    /// How it was made or where it was read from.
    meta: Value,
}

/// Appends JSON lines to `raw.jsonl`, flushed per line so a cut-off run
/// keeps what it measured.
struct Sink {
    file: BufWriter<File>,
}

impl Sink {
    fn emit(&mut self, v: &Value) -> AnyResult<()> {
        writeln!(self.file, "{v}")?;
        self.file.flush()?;
        Ok(())
    }
}

/// One timed point of the sweep.
#[derive(Debug, Clone)]
struct Point {
    method: &'static str,
    batch: usize,
    ef: Option<usize>,
    qps: f64,
    median_ms: f64,
    p90_ms: f64,
    /// Recall of the method at this `ef` over all queries (one-call pass).
    recall: f64,
}

/// The build of one graph.
#[derive(Debug, Clone)]
struct BuildRow {
    what: &'static str,
    seconds: f64,
    /// recall@k at each `ef` of the sweep.
    recall: Vec<(usize, f64)>,
}

/// What one data set's run leaves for the table and the plot.
#[derive(Default)]
struct Summary {
    dataset: String,
    header: Vec<String>,
    builds: Vec<BuildRow>,
    points: Vec<Point>,
    /// Per `ef`: queries whose GPU graph ids differ from CPU HNSW's, whose
    /// (id, score bits) lists differ, and that the CPU path answered.
    gpu_vs_cpu: Vec<(usize, usize, usize, usize)>,
    /// Queries of timed batches whose result differs from the one-call
    /// pass, summed over the points of each method.
    batch_differs: BTreeMap<&'static str, (usize, usize)>,
    /// Queries of GPU graph points that the CPU path answered instead of
    /// the device, per method.
    host_answers: BTreeMap<&'static str, usize>,
    /// Parts that failed, with their errors.
    failures: Vec<String>,
    skipped: usize,
}

fn run(a: Args) -> AnyResult<()> {
    check_args(&a)?;
    let started = Instant::now();
    let threads = if a.threads == 0 {
        std::thread::available_parallelism().map_or(1, |p| p.get())
    } else {
        a.threads
    };
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build_global()?;
    std::fs::create_dir_all(&a.out)?;
    let mut sink = Sink {
        file: BufWriter::new(File::create(a.out.join("raw.jsonl"))?),
    };
    let mut env = environment(&a, threads);

    let mut datasets: Vec<Dataset> = Vec::new();
    // The small set first: its numbers are in even if the large one runs
    // out of time.
    if let Some(dir) = &a.minilm {
        match read_minilm(dir, a.minilm_metric) {
            Ok(ds) => datasets.push(ds),
            Err(e) => {
                tracing::warn!("MiniLM set skipped: {e}");
                sink.emit(&json!({"what": "dataset_skipped", "dataset": "minilm", "path": dir.display().to_string(), "reason": e.to_string()}))?;
            }
        }
    }
    if !a.no_gauss {
        datasets.push(gauss(&a)?);
    }

    let mut summaries = Vec::new();
    let mut devices = Vec::new();
    for ds in &datasets {
        let s = run_dataset(&a, ds, threads, started, &mut sink, &mut devices)?;
        summaries.push(s);
    }
    if let Some(dev) = devices.first() {
        env["device"] = dev.clone();
    }
    env["seconds"] = started.elapsed().as_secs_f64().into();
    std::fs::write(
        a.out.join("environment.json"),
        serde_json::to_string_pretty(&env)?,
    )?;
    std::fs::write(a.out.join("table.md"), table(&a, &summaries))?;
    for s in &summaries {
        let stem = if s.dataset.starts_with("minilm") {
            "recall_qps_minilm"
        } else {
            "recall_qps"
        };
        plot(&a.out, stem, s, a.recall_target)?;
    }
    tracing::info!(
        "wrote {} in {:.0} s",
        a.out.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Rejects values the sweep cannot use, naming them.
fn check_args(a: &Args) -> AnyResult<()> {
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
    if a.min_reps == 0 {
        return Err("--min-reps must be at least 1, got 0".into());
    }
    Ok(())
}

/// The seeded Gaussian-cluster corpus and its held-out queries.
fn gauss(a: &Args) -> AnyResult<Dataset> {
    tracing::info!(
        "generating {} x {} Gaussian-cluster rows ({} clusters, spread {}, seed {}) and {} queries",
        a.n,
        a.d,
        a.clusters,
        a.spread,
        a.seed,
        a.queries
    );
    let pb = spinner("generating the corpus");
    let t = Instant::now();
    let corpus = Array2::from_shape_vec(
        (a.n, a.d),
        synth::gaussian_clusters(a.n, a.d, a.clusters, a.spread, a.seed),
    )?;
    let queries = Array2::from_shape_vec(
        (a.queries, a.d),
        synth::cluster_queries(a.queries, a.d, a.clusters, a.spread, a.seed),
    )?;
    pb.finish_and_clear();
    Ok(Dataset {
        name: format!("gauss-{}x{}", a.n, a.d),
        corpus,
        queries,
        metric: a.metric,
        meta: json!({
            "generator": "topk_hnsw::synth::gaussian_clusters",
            "queries_generator": "topk_hnsw::synth::cluster_queries (same centres, independent noise stream)",
            "n": a.n, "d": a.d, "queries": a.queries, "clusters": a.clusters,
            "spread": a.spread, "seed": a.seed, "generate_s": t.elapsed().as_secs_f64(),
        }),
    })
}

/// The shared MiniLM set: `corpus.npy` and `queries.npy`, L2-normalised.
fn read_minilm(dir: &Path, metric: Metric) -> AnyResult<Dataset> {
    let corpus_path = dir.join("corpus.npy");
    let queries_path = dir.join("queries.npy");
    for p in [&corpus_path, &queries_path] {
        if !p.is_file() {
            return Err(format!("{} is not there", p.display()).into());
        }
    }
    let corpus = topk_io::read_matrix(&corpus_path)?;
    let queries = topk_io::read_matrix(&queries_path)?;
    let name = dir
        .file_name()
        .map_or_else(|| "minilm".to_owned(), |s| s.to_string_lossy().into_owned());
    let name = if name.starts_with("minilm") {
        name
    } else {
        format!("minilm-{name}")
    };
    Ok(Dataset {
        meta: json!({
            "path": dir.display().to_string(), "n": corpus.nrows(), "d": corpus.ncols(),
            "queries": queries.nrows(),
        }),
        name,
        corpus,
        queries,
        metric,
    })
}

/// The environment record: host, parameters, commit.
fn environment(a: &Args, threads: usize) -> Value {
    let cpu_model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_owned())
        })
        .unwrap_or_default();
    let unix_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    json!({
        "host_threads": std::thread::available_parallelism().map_or(1, |p| p.get()),
        "threads": threads,
        "cpu_model": cpu_model,
        "os": std::env::consts::OS,
        "arch": std::env::consts::ARCH,
        "commit": std::env::var("TOPK_COMMIT").ok(),
        "started_unix_s": unix_s,
        "device": Value::Null,
        "args": format!("{a:?}"),
        "parameters": {
            "n": a.n, "d": a.d, "queries": a.queries, "clusters": a.clusters,
            "spread": a.spread, "seed": a.seed, "metric": a.metric.as_str(),
            "minilm": a.minilm.as_ref().map(|p| p.display().to_string()),
            "minilm_metric": a.minilm_metric.as_str(),
            "m": a.m, "ef_construction": a.ef_construction, "level_seed": a.level_seed,
            "ef": a.ef, "batch": a.batch, "k": a.k, "budget_s": a.budget_s,
            "warmup": a.warmup, "min_reps": a.min_reps, "deadline_s": a.deadline_s,
            "recall_target": a.recall_target, "exact_max_batch": a.exact_max_batch,
            "cpu_only": a.cpu_only,
        },
    })
}

fn spinner(msg: &'static str) -> ProgressBar {
    let pb = ProgressBar::new_spinner();
    pb.set_message(msg);
    pb.enable_steady_tick(Duration::from_millis(200));
    pb
}

fn bar(len: u64, what: &str) -> ProgressBar {
    let pb = ProgressBar::new(len);
    let style = ProgressStyle::with_template(&format!(
        "{what} [{{elapsed_precise}}] {{bar:40}} {{pos}}/{{len}} {{msg}}"
    ))
    .unwrap_or_else(|_| ProgressStyle::default_bar());
    pb.set_style(style);
    pb
}

/// Ids of each result list.
fn ids(v: &[Vec<Neighbor>]) -> Vec<Vec<u32>> {
    v.iter()
        .map(|r| r.iter().map(|n| n.index).collect())
        .collect()
}

/// Queries whose id lists differ, and whose (id, score bits) lists differ.
fn differ(a: &[Vec<Neighbor>], b: &[Vec<Neighbor>]) -> (usize, usize) {
    let mut by_ids = 0;
    let mut by_bits = 0;
    for (x, y) in a.iter().zip(b) {
        let same_ids = x.len() == y.len() && x.iter().zip(y).all(|(p, q)| p.index == q.index);
        let same_bits = same_ids
            && x.iter()
                .zip(y)
                .all(|(p, q)| p.score.to_bits() == q.score.to_bits());
        by_ids += usize::from(!same_ids);
        by_bits += usize::from(!same_bits);
    }
    by_ids += a.len().abs_diff(b.len());
    by_bits += a.len().abs_diff(b.len());
    (by_ids, by_bits)
}

/// Latencies of a point's timed batches and its results per query.
struct Timed {
    warmup: usize,
    lat_s: Vec<f64>,
    queries: usize,
    /// Results of every query a timed batch covered (first time covered).
    results: Vec<Option<Vec<Neighbor>>>,
}

/// Runs `search` over consecutive batches of `b` queries: `warmup` untimed
/// batches from the end of the query set, then timed batches from its start
/// until at least `min_reps` ran and either `budget_s` is spent or every
/// batch of the set ran once.
fn time_point(
    nq: usize,
    b: usize,
    a: &Args,
    search: &mut dyn FnMut(usize, usize) -> AnyResult<Vec<Vec<Neighbor>>>,
) -> AnyResult<Timed> {
    let slices = (nq / b).max(1);
    let range = |i: usize| {
        let lo = (i % slices) * b;
        (lo, (lo + b).min(nq))
    };
    // Small batches warm up on at least 100 queries.
    let warmup = a.warmup.max(100usize.div_ceil(b).min(slices));
    for w in 0..warmup {
        let (lo, hi) = range(slices - 1 - (w % slices));
        search(lo, hi)?;
    }
    let mut t = Timed {
        warmup,
        lat_s: Vec::new(),
        queries: 0,
        results: vec![None; nq],
    };
    let started = Instant::now();
    let mut rep = 0;
    loop {
        let (lo, hi) = range(rep);
        let t0 = Instant::now();
        let out = search(lo, hi)?;
        t.lat_s.push(t0.elapsed().as_secs_f64());
        t.queries += hi - lo;
        for (slot, r) in t.results[lo..hi].iter_mut().zip(out) {
            if slot.is_none() {
                *slot = Some(r);
            }
        }
        rep += 1;
        if rep >= a.min_reps && (started.elapsed().as_secs_f64() >= a.budget_s || rep >= slices) {
            break;
        }
    }
    Ok(t)
}

/// Median and p90 of `v` (sorted here).
fn median_p90(v: &mut [f64]) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    let n = v.len();
    let med = if n % 2 == 1 {
        v[n / 2]
    } else {
        0.5 * (v[n / 2 - 1] + v[n / 2])
    };
    let p90 = v[((0.9 * n as f64).ceil() as usize).clamp(1, n) - 1];
    (med, p90)
}

/// Records a part of the sweep that failed (the rest goes on).
fn failed(
    sink: &mut Sink,
    sum: &mut Summary,
    dataset: &str,
    what: &str,
    e: &dyn std::fmt::Display,
) -> AnyResult<()> {
    tracing::warn!("{dataset}: {what} failed: {e}");
    sink.emit(
        &json!({"what": "failed", "dataset": dataset, "part": what, "error": e.to_string()}),
    )?;
    sum.failures.push(format!("{what}: {e}"));
    Ok(())
}

/// Everything one data set's part of the sweep needs.
struct Ctx<'a> {
    a: &'a Args,
    ds: &'a Dataset,
    truth: Vec<Vec<u32>>,
    started: Instant,
}

impl Ctx<'_> {
    fn out_of_time(&self) -> bool {
        self.started.elapsed().as_secs_f64() > self.a.deadline_s
    }

    /// Times one point and records it: `full` is the one-call pass of the
    /// same method and `ef`, against which every timed batch is compared.
    #[allow(clippy::too_many_arguments)]
    fn point(
        &self,
        sink: &mut Sink,
        sum: &mut Summary,
        method: &'static str,
        b: usize,
        ef: Option<usize>,
        full: &[Vec<Neighbor>],
        walks: Option<&GraphSearcher<'_>>,
        search: &mut dyn FnMut(usize, usize) -> AnyResult<Vec<Vec<Neighbor>>>,
    ) -> AnyResult<()> {
        let nq = self.ds.queries.nrows();
        let base = json!({
            "dataset": self.ds.name, "method": method, "batch": b, "ef": ef, "k": self.a.k,
            "n": self.ds.corpus.nrows(), "d": self.ds.corpus.ncols(),
            "metric": self.ds.metric.as_str(), "m": self.a.m,
            "ef_construction": self.a.ef_construction,
        });
        if self.out_of_time() {
            let mut rec = base;
            rec["what"] = "skipped".into();
            rec["reason"] = format!("past --deadline-s {}", self.a.deadline_s).into();
            sink.emit(&rec)?;
            sum.skipped += 1;
            return Ok(());
        }
        if let Some(w) = walks {
            w.take_counts();
        }
        let mut t = match time_point(nq, b, self.a, search) {
            Ok(t) => t,
            Err(e) => {
                let what = format!("{method} batch {b} ef {ef:?}");
                return failed(sink, sum, &self.ds.name, &what, &e);
            }
        };
        let covered: Vec<usize> = (0..nq).filter(|&i| t.results[i].is_some()).collect();
        let got: Vec<Vec<Neighbor>> = covered
            .iter()
            .filter_map(|&i| t.results[i].take())
            .collect();
        let want: Vec<Vec<Neighbor>> = covered.iter().map(|&i| full[i].clone()).collect();
        let truth: Vec<&[u32]> = covered.iter().map(|&i| self.truth[i].as_slice()).collect();
        let recall_timed = recall_at_k(&got, &truth, self.a.k)?;
        let recall = recall_at_k(full, &self.truth, self.a.k)?;
        let (ids_differ, bits_differ) = differ(&got, &want);
        let total_s: f64 = t.lat_s.iter().sum();
        let qps = t.queries as f64 / total_s;
        let reps = t.lat_s.len();
        let (med, p90) = median_p90(&mut t.lat_s);
        let mut rec = base;
        rec["what"] = "search".into();
        rec["qps"] = qps.into();
        rec["latency_median_ms"] = (med * 1e3).into();
        rec["latency_p90_ms"] = (p90 * 1e3).into();
        rec["reps"] = reps.into();
        rec["warmup_batches"] = t.warmup.into();
        rec["queries_timed"] = t.queries.into();
        rec["distinct_queries_timed"] = covered.len().into();
        rec["recall"] = recall.into();
        rec["recall_timed_queries"] = recall_timed.into();
        rec["differs_from_one_call_ids"] = ids_differ.into();
        rec["differs_from_one_call_bits"] = bits_differ.into();
        if let Some(w) = walks {
            // Warm-up included: which side answered, over every call of the point.
            let (dev, host) = w.take_counts();
            rec["device_walks"] = dev.into();
            rec["host_answers"] = host.into();
            *sum.host_answers.entry(method).or_default() += host;
        }
        rec["threads"] = match (method, b) {
            (CPU_HNSW, 1) => 1,
            (CPU_HNSW, _) => rayon::current_num_threads(),
            _ => 1,
        }
        .into();
        sink.emit(&rec)?;
        let e = sum.batch_differs.entry(method).or_default();
        e.0 += ids_differ;
        e.1 += covered.len();
        sum.points.push(Point {
            method,
            batch: b,
            ef,
            qps,
            median_ms: med * 1e3,
            p90_ms: p90 * 1e3,
            recall,
        });
        Ok(())
    }
}

fn run_dataset(
    a: &Args,
    ds: &Dataset,
    threads: usize,
    started: Instant,
    sink: &mut Sink,
    devices: &mut Vec<Value>,
) -> AnyResult<Summary> {
    let (n, d) = ds.corpus.dim();
    let nq = ds.queries.nrows();
    let k = a.k;
    let metric = ds.metric;
    tracing::info!("{}: {n} x {d} ({metric}), {nq} queries, k = {k}", ds.name);
    let mut sum = Summary {
        dataset: ds.name.clone(),
        ..Summary::default()
    };
    let described: Vec<String> = ds
        .meta
        .as_object()
        .map(|o| o.iter().map(|(key, v)| format!("{key} = {v}")).collect())
        .unwrap_or_default();
    sum.header.push(format!(
        "{n} × {d}, {metric}, {nq} queries, k = {k}. Data: {}.",
        described.join(", ")
    ));
    let mut info = ds.meta.clone();
    info["what"] = "dataset".into();
    info["dataset"] = ds.name.clone().into();
    info["metric"] = metric.as_str().into();
    sink.emit(&info)?;

    let flat: Vec<f32> = ds.corpus.iter().copied().collect();
    let qflat: Vec<f32> = ds.queries.iter().copied().collect();
    let qv = ds.queries.view();

    // The exact engine, and the ground truth.
    let gpu = if a.cpu_only {
        None
    } else {
        let pb = spinner("uploading the corpus to the GPU");
        let t = Instant::now();
        let mut config = CudaConfig::default();
        config.max_batch = a.exact_max_batch;
        let gpu = CudaRetriever::from_rowmajor(flat.clone(), d, metric, config)?;
        pb.finish_and_clear();
        let dev = gpu.info();
        let dev = json!({
            "name": dev.name, "driver_version": dev.driver_version,
            "total_memory": dev.total_memory,
            "compute_capability": [dev.compute_capability.0, dev.compute_capability.1],
            "multiprocessors": dev.multiprocessors,
        });
        devices.push(dev.clone());
        sink.emit(&json!({
            "what": "engine", "dataset": ds.name, "device": dev,
            "upload_s": t.elapsed().as_secs_f64(),
        }))?;
        Some(gpu)
    };
    let pb = spinner("ground truth");
    let t = Instant::now();
    let (exact_full, truth_by) = match &gpu {
        Some(g) => (g.search_batch_rowmajor(&qflat, k)?, "exact GPU engine"),
        None => (
            topk_cpu::CpuRetriever::new(ds.corpus.view(), metric)?.search_batch(qv, k)?,
            "CPU oracle",
        ),
    };
    pb.finish_and_clear();
    sum.header
        .push(format!("Ground truth: the {truth_by}, K = {k}."));
    sink.emit(&json!({
        "what": "ground_truth", "dataset": ds.name, "by": truth_by, "k": k,
        "queries": nq, "seconds": t.elapsed().as_secs_f64(),
    }))?;
    let truth = ids(&exact_full);
    let cx = Ctx {
        a,
        ds,
        truth,
        started,
    };

    // The builds.
    let params = HnswParams {
        m: a.m,
        ef_construction: a.ef_construction,
        ef_search: a.ef[0],
        seed: a.level_seed,
        parallel: true,
    };
    tracing::info!("CPU parallel build on {threads} threads");
    let pb = bar(n as u64, "CPU build");
    let report = |rows: usize| pb.set_position(rows as u64);
    let data = flat.clone();
    let t = Instant::now();
    // `Hnsw::build_parallel`'s build (parallel = true), with progress.
    let index = Hnsw::from_rowmajor_with_progress(data, d, metric, params, &report)?;
    let cpu_build_s = t.elapsed().as_secs_f64();
    pb.finish_and_clear();
    tracing::info!("CPU build: {cpu_build_s:.1} s");
    let gpu_index = match &gpu {
        Some(g) => {
            let pb = spinner("GPU build");
            let t = Instant::now();
            let built = gpu_build(&flat, d, metric, params, g);
            let s = t.elapsed().as_secs_f64();
            pb.finish_and_clear();
            match built {
                Ok(built) => {
                    tracing::info!("GPU build: {s:.1} s");
                    Some((built, s))
                }
                Err(e) => {
                    failed(sink, &mut sum, &ds.name, "GPU build", &e)?;
                    None
                }
            }
        }
        None => None,
    };

    // One-call passes over all queries: recall per ef, and the references
    // every timed batch is compared with.
    let mut cpu_full: BTreeMap<usize, Vec<Vec<Neighbor>>> = BTreeMap::new();
    let mut builds = vec![BuildRow {
        what: "CPU parallel build (Hnsw::build_parallel)",
        seconds: cpu_build_s,
        recall: Vec::new(),
    }];
    let mut gpu_built_row = gpu_index.as_ref().map(|(_, s)| BuildRow {
        what: "GPU build (Hnsw::build_knn_gpu)",
        seconds: *s,
        recall: Vec::new(),
    });
    let pb = bar(a.ef.len() as u64, "recall per ef");
    for &ef in &a.ef {
        let r = index.search_batch_with_ef(qv, k, ef)?;
        let rc = recall_at_k(&r, &cx.truth, k)?;
        builds[0].recall.push((ef, rc));
        cpu_full.insert(ef, r);
        if let (Some((gi, _)), Some(row)) = (&gpu_index, gpu_built_row.as_mut()) {
            let r = gi.search_batch_with_ef(qv, k, ef)?;
            row.recall.push((ef, recall_at_k(&r, &cx.truth, k)?));
        }
        pb.inc(1);
    }
    pb.finish_and_clear();
    builds.extend(gpu_built_row);
    for b in &builds {
        let stats = if b.what.starts_with("CPU") {
            Some(index.stats())
        } else {
            gpu_index.as_ref().map(|(gi, _)| gi.stats())
        };
        sink.emit(&json!({
            "what": "build", "dataset": ds.name, "build": b.what, "seconds": b.seconds,
            "n": n, "d": d, "metric": metric.as_str(), "m": a.m,
            "ef_construction": a.ef_construction, "level_seed": a.level_seed,
            "threads": threads, "k": k,
            "recall_at_ef": b.recall.iter().map(|&(ef, r)| json!({"ef": ef, "recall": r})).collect::<Vec<_>>(),
            "max_level": stats.as_ref().map(|s| s.max_level),
            "mean_degree": stats.as_ref().map(|s| s.mean_degree.clone()),
        }))?;
    }
    sum.builds = builds;

    let mut batches: Vec<usize> = a.batch.iter().map(|&b| b.min(nq)).collect();
    batches.sort_unstable_by(|x, y| y.cmp(x));
    batches.dedup();
    let (b_max, b_min) = (batches[0], batches[batches.len() - 1]);

    // GPU graph search: the graph uploaded, one-call passes, the CPU check.
    let mut gpu_full: BTreeMap<usize, Vec<Vec<Neighbor>>> = BTreeMap::new();
    let mut gpu_built_full: BTreeMap<usize, Vec<Vec<Neighbor>>> = BTreeMap::new();
    let mut searcher = match &gpu {
        Some(g) => {
            let t = Instant::now();
            match upload_graph(&index, g) {
                Ok(s) => {
                    sink.emit(&json!({"what": "graph_upload", "dataset": ds.name, "graph": "cpu-built", "seconds": t.elapsed().as_secs_f64()}))?;
                    Some(s)
                }
                Err(e) => {
                    failed(
                        sink,
                        &mut sum,
                        &ds.name,
                        "graph upload (CPU-built graph)",
                        &e,
                    )?;
                    None
                }
            }
        }
        None => None,
    };
    let mut searcher_gpu_built = match (&gpu, &gpu_index) {
        (Some(g), Some((gi, _))) => {
            let t = Instant::now();
            match upload_graph(gi, g) {
                Ok(s) => {
                    sink.emit(&json!({"what": "graph_upload", "dataset": ds.name, "graph": "gpu-built", "seconds": t.elapsed().as_secs_f64()}))?;
                    Some(s)
                }
                Err(e) => {
                    failed(
                        sink,
                        &mut sum,
                        &ds.name,
                        "graph upload (GPU-built graph)",
                        &e,
                    )?;
                    None
                }
            }
        }
        _ => None,
    };
    if let Some(s) = &searcher {
        for &ef in &a.ef {
            s.take_counts();
            let r = match s.search(qv, k, ef) {
                Ok(r) => r,
                Err(e) => {
                    failed(
                        sink,
                        &mut sum,
                        &ds.name,
                        &format!("{GPU_GRAPH} one call, ef = {ef}"),
                        &e,
                    )?;
                    gpu_full.clear();
                    break;
                }
            };
            let (device_walks, host_answers) = s.take_counts();
            let cpu = cpu_full.get(&ef).map_or(&[][..], |v| v.as_slice());
            let (ids_differ, bits_differ) = differ(&r, cpu);
            sum.gpu_vs_cpu
                .push((ef, ids_differ, bits_differ, host_answers));
            sink.emit(&json!({
                "what": "check_gpu_graph_equals_cpu_hnsw", "dataset": ds.name, "ef": ef,
                "k": k, "queries": nq, "ids_differ": ids_differ, "bits_differ": bits_differ,
                "recall_gpu_graph": recall_at_k(&r, &cx.truth, k)?,
                "device_walks": device_walks, "host_answers": host_answers,
            }))?;
            gpu_full.insert(ef, r);
        }
    }
    if gpu_full.len() < a.ef.len() {
        searcher = None;
    }
    if let Some(s) = &searcher_gpu_built {
        for &ef in &a.ef {
            match s.search(qv, k, ef) {
                Ok(r) => {
                    gpu_built_full.insert(ef, r);
                }
                Err(e) => {
                    let what = format!("{GPU_GRAPH_GPU_BUILT} one call, ef = {ef}");
                    failed(sink, &mut sum, &ds.name, &what, &e)?;
                    break;
                }
            }
        }
    }
    if gpu_built_full.len() < a.ef.len() {
        searcher_gpu_built = None;
    }

    // The timed sweep.
    let gpu_points = if gpu.is_some() {
        a.ef.len() * batches.len() + 2 * a.ef.len() + batches.len()
    } else {
        0
    };
    let pb = bar(
        (a.ef.len() * batches.len() + gpu_points) as u64,
        "search sweep",
    );
    for &b in &batches {
        for &ef in &a.ef {
            if let Some(s) = &searcher {
                pb.set_message(format!("{GPU_GRAPH} b={b} ef={ef}"));
                let full = gpu_full.get(&ef).map_or(&[][..], |v| v.as_slice());
                let mut f = |lo: usize, hi: usize| s.search(qv.slice(s![lo..hi, ..]), k, ef);
                cx.point(
                    sink,
                    &mut sum,
                    GPU_GRAPH,
                    b,
                    Some(ef),
                    full,
                    Some(s),
                    &mut f,
                )?;
                pb.inc(1);
            }
            if let Some(s) = searcher_gpu_built
                .as_ref()
                .filter(|_| b == b_max || b == b_min)
            {
                pb.set_message(format!("{GPU_GRAPH_GPU_BUILT} b={b} ef={ef}"));
                let full = gpu_built_full.get(&ef).map_or(&[][..], |v| v.as_slice());
                let mut f = |lo: usize, hi: usize| s.search(qv.slice(s![lo..hi, ..]), k, ef);
                cx.point(
                    sink,
                    &mut sum,
                    GPU_GRAPH_GPU_BUILT,
                    b,
                    Some(ef),
                    full,
                    Some(s),
                    &mut f,
                )?;
                pb.inc(1);
            }
            pb.set_message(format!("{CPU_HNSW} b={b} ef={ef}"));
            let full = cpu_full.get(&ef).map_or(&[][..], |v| v.as_slice());
            let mut f = |lo: usize, hi: usize| -> AnyResult<Vec<Vec<Neighbor>>> {
                if hi - lo == 1 {
                    // One query on this thread: the single-threaded latency.
                    let mut out = Vec::with_capacity(k);
                    let q: Vec<f32> = qv.row(lo).iter().copied().collect();
                    index.search_with_ef(&q, k, ef, &mut out)?;
                    Ok(vec![out])
                } else {
                    Ok(index.search_batch_with_ef(qv.slice(s![lo..hi, ..]), k, ef)?)
                }
            };
            cx.point(sink, &mut sum, CPU_HNSW, b, Some(ef), full, None, &mut f)?;
            pb.inc(1);
        }
        if let Some(g) = &gpu {
            pb.set_message(format!("{EXACT_GPU} b={b}"));
            let mut one = Vec::with_capacity(k);
            let mut f = |lo: usize, hi: usize| -> AnyResult<Vec<Vec<Neighbor>>> {
                if hi - lo == 1 {
                    g.search_host(&qflat[lo * d..hi * d], k, &mut one)?;
                    Ok(vec![one.clone()])
                } else {
                    Ok(g.search_batch_rowmajor(&qflat[lo * d..hi * d], k)?)
                }
            };
            cx.point(
                sink,
                &mut sum,
                EXACT_GPU,
                b,
                None,
                &exact_full,
                None,
                &mut f,
            )?;
            pb.inc(1);
        }
    }
    pb.finish_and_clear();
    Ok(sum)
}

/// GPU graph search over one uploaded graph (`Hnsw::upload_graph`,
/// `Hnsw::search_graph_gpu`), counting the walks the device finished and
/// the queries the CPU path answered instead.
struct GraphSearcher<'a> {
    index: &'a Hnsw,
    graph: topk_hnsw::GpuGraph<'a>,
    /// (device walks, host answers) since the last [`GraphSearcher::take_counts`].
    counts: Cell<(usize, usize)>,
}

impl GraphSearcher<'_> {
    fn search(
        &self,
        queries: ArrayView2<'_, f32>,
        k: usize,
        ef: usize,
    ) -> AnyResult<Vec<Vec<Neighbor>>> {
        let (hits, c) = self
            .index
            .search_graph_gpu_counted(&self.graph, queries, k, ef, None)?;
        let (dev, host) = self.counts.get();
        self.counts.set((dev + c.device, host + c.host));
        Ok(hits)
    }

    fn take_counts(&self) -> (usize, usize) {
        self.counts.replace((0, 0))
    }
}

/// Uploads `index`'s graph to the engine that holds its corpus.
fn upload_graph<'a>(index: &'a Hnsw, gpu: &'a CudaRetriever) -> AnyResult<GraphSearcher<'a>> {
    Ok(GraphSearcher {
        index,
        graph: index.upload_graph(gpu)?,
        counts: Cell::new((0, 0)),
    })
}

/// The GPU build (`Hnsw::build_knn_gpu`: the exact kNN graph from the
/// engine, pruned).
fn gpu_build(
    data: &[f32],
    dim: usize,
    metric: Metric,
    params: HnswParams,
    gpu: &CudaRetriever,
) -> AnyResult<Hnsw> {
    Ok(Hnsw::build_knn_gpu(data, dim, metric, params, gpu)?)
}

/// The best QPS among `points` of `method` at batch `b` with recall at
/// least `target`.
fn best<'a>(points: &'a [Point], method: &str, b: usize, target: f64) -> Option<&'a Point> {
    points
        .iter()
        .filter(|p| p.method == method && p.batch == b && p.recall >= target)
        .max_by(|x, y| x.qps.total_cmp(&y.qps))
}

fn fmt_qps(q: f64) -> String {
    if q >= 1e6 {
        format!("{:.2}M", q / 1e6)
    } else if q >= 1e4 {
        format!("{:.0}k", q / 1e3)
    } else if q >= 1e3 {
        format!("{:.1}k", q / 1e3)
    } else {
        format!("{q:.0}")
    }
}

fn cell(p: Option<&Point>) -> String {
    match p {
        Some(p) => format!(
            "{} (ef {}, recall {:.3}, {:.3} ms)",
            fmt_qps(p.qps),
            p.ef.map_or_else(|| "—".to_owned(), |e| e.to_string()),
            p.recall,
            p.median_ms
        ),
        None => "—".to_owned(),
    }
}

fn ratio(x: Option<&Point>, y: Option<&Point>) -> String {
    match (x, y) {
        (Some(x), Some(y)) => format!("{:.2}×", x.qps / y.qps),
        _ => "—".to_owned(),
    }
}

/// The markdown summary of every data set.
fn table(a: &Args, sums: &[Summary]) -> String {
    let mut o = String::new();
    let t = a.recall_target;
    o.push_str("# GPU graph search sweep\n\n");
    o.push_str(&format!(
        "CPU: {} threads (CPU HNSW batches and the CPU build; batch 1 on one thread). \
         m = {}, ef_construction = {}, k = {}; best QPS at recall@{} ≥ {t} per batch size \
         (cell: QPS (ef, recall, median latency per batch)); recall against each data set's exact ground truth.\n\n",
        rayon::current_num_threads(),
        a.m, a.ef_construction, a.k, a.k
    ));
    for s in sums {
        o.push_str(&format!("## {}\n\n", s.dataset));
        for h in &s.header {
            o.push_str(&format!("{h}\n\n"));
        }
        o.push_str("### Builds\n\n| build | seconds |");
        for &ef in &a.ef {
            o.push_str(&format!(" recall ef={ef} |"));
        }
        o.push_str("\n| --- | ---: |");
        for _ in &a.ef {
            o.push_str(" ---: |");
        }
        o.push('\n');
        for b in &s.builds {
            o.push_str(&format!("| {} | {:.2} |", b.what, b.seconds));
            for &(_, r) in &b.recall {
                o.push_str(&format!(" {r:.4} |"));
            }
            o.push('\n');
        }
        if let [cpu, gpu, ..] = s.builds.as_slice() {
            o.push_str(&format!(
                "\nGPU build: {:.2}× faster than the CPU parallel build.\n",
                cpu.seconds / gpu.seconds
            ));
        }
        let mut batches: Vec<usize> = s.points.iter().map(|p| p.batch).collect();
        batches.sort_unstable();
        batches.dedup();
        o.push_str(&format!(
            "\n### Best QPS at recall@{} ≥ {t}\n\n| batch | {GPU_GRAPH} | {CPU_HNSW} | {EXACT_GPU} | {GPU_GRAPH}/{CPU_HNSW} | {GPU_GRAPH}/{EXACT_GPU} | {GPU_GRAPH_GPU_BUILT} |\n| ---: | --- | --- | --- | ---: | ---: | --- |\n",
            a.k
        ));
        for &b in &batches {
            let g = best(&s.points, GPU_GRAPH, b, t);
            let c = best(&s.points, CPU_HNSW, b, t);
            let e = best(&s.points, EXACT_GPU, b, t);
            let gg = best(&s.points, GPU_GRAPH_GPU_BUILT, b, t);
            o.push_str(&format!(
                "| {b} | {} | {} | {} | {} | {} | {} |\n",
                cell(g),
                cell(c),
                cell(e),
                ratio(g, c),
                ratio(g, e),
                cell(gg)
            ));
        }
        o.push_str("\n### Every point\n\n| method | batch | ef | recall | QPS | median ms | p90 ms |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n");
        for p in &s.points {
            o.push_str(&format!(
                "| {} | {} | {} | {:.4} | {:.0} | {:.4} | {:.4} |\n",
                p.method,
                p.batch,
                p.ef.map_or_else(|| "—".to_owned(), |e| e.to_string()),
                p.recall,
                p.qps,
                p.median_ms,
                p.p90_ms
            ));
        }
        o.push_str("\n### Checks\n\n");
        if s.gpu_vs_cpu.is_empty() {
            o.push_str("- GPU graph search not run.\n");
        }
        for &(ef, ids, bits, host) in &s.gpu_vs_cpu {
            o.push_str(&format!(
                "- ef = {ef}, one call of all queries: {ids} queries whose GPU graph ids differ from CPU HNSW's on the same graph ({bits} with any score bit differing); {host} answered by the CPU path.\n"
            ));
        }
        for (m, host) in &s.host_answers {
            o.push_str(&format!(
                "- {m}: {host} queries of the timed calls answered by the CPU path instead of the device walk.\n"
            ));
        }
        for (m, (diff, of)) in &s.batch_differs {
            o.push_str(&format!(
                "- {m}: {diff} of {of} timed query results differ from the same query's in the one-call batch of all queries.\n"
            ));
        }
        for f in &s.failures {
            o.push_str(&format!("- failed: {f}\n"));
        }
        if s.skipped > 0 {
            o.push_str(&format!(
                "- {} points skipped: past --deadline-s {}.\n",
                s.skipped, a.deadline_s
            ));
        }
        o.push('\n');
    }
    o
}

static FONT: &[u8] = include_bytes!("../../topk-bench/assets/DejaVuSans.ttf");
const FAMILY: &str = "sans-serif";

/// Registers the bundled font once (plotters lays text out with it).
fn ensure_font() -> AnyResult<()> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    let ok = *REGISTERED
        .get_or_init(|| plotters::style::register_font(FAMILY, FontStyle::Normal, FONT).is_ok());
    if ok {
        Ok(())
    } else {
        Err("the bundled font could not be loaded".into())
    }
}

fn colour(method: &str) -> RGBColor {
    match method {
        GPU_GRAPH => RGBColor(0x1f, 0x77, 0xb4),
        GPU_GRAPH_GPU_BUILT => RGBColor(0x2c, 0xa0, 0x2c),
        CPU_HNSW => RGBColor(0xff, 0x7f, 0x0e),
        EXACT_GPU => RGBColor(0xd6, 0x27, 0x28),
        _ => RGBColor(0x7f, 0x7f, 0x7f),
    }
}

/// Draws the recall–QPS figure of `s` as `stem.svg` and `stem.png` in `dir`.
fn plot(dir: &Path, stem: &str, s: &Summary, target: f64) -> AnyResult<()> {
    if s.points.is_empty() {
        return Ok(());
    }
    ensure_font()?;
    let size = (960, 640);
    let svg = dir.join(format!("{stem}.svg"));
    let png = dir.join(format!("{stem}.png"));
    {
        let root = SVGBackend::new(&svg, size).into_drawing_area();
        draw_recall_qps(&root, s, target).map_err(|m| format!("{}: {m}", svg.display()))?;
    }
    {
        let root = BitMapBackend::new(&png, size).into_drawing_area();
        draw_recall_qps(&root, s, target).map_err(|m| format!("{}: {m}", png.display()))?;
    }
    Ok(())
}

/// recall@k against QPS (log scale): one series per method for the
/// smallest and the largest batch size, and the recall target as a line.
fn draw_recall_qps<DB: DrawingBackend>(
    root: &DrawingArea<DB, plotters::coord::Shift>,
    s: &Summary,
    target: f64,
) -> Result<(), String> {
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    let b_min = s.points.iter().map(|p| p.batch).min().unwrap_or(1);
    let b_max = s.points.iter().map(|p| p.batch).max().unwrap_or(1);
    let shown: Vec<&Point> = s
        .points
        .iter()
        .filter(|p| p.batch == b_min || p.batch == b_max)
        .filter(|p| p.qps.is_finite() && p.qps > 0.0)
        .collect();
    if shown.is_empty() {
        return Ok(());
    }
    let lo = shown.iter().map(|p| p.qps).fold(f64::INFINITY, f64::min) * 0.6;
    // Room on the right for the legend.
    let hi = shown.iter().map(|p| p.qps).fold(0.0, f64::max) * 30.0;
    let rmin = shown.iter().map(|p| p.recall).fold(1.0, f64::min);
    let ymin = ((rmin - 0.02).min(target - 0.02) * 20.0).floor() / 20.0;
    let ymin = ymin.clamp(0.0, 0.95);
    root.fill(&WHITE).map_err(e)?;
    let mut chart = ChartBuilder::on(root)
        .caption(
            format!("{}: recall@k against queries per second", s.dataset),
            (FAMILY, 20),
        )
        .margin(14)
        .x_label_area_size(44)
        .y_label_area_size(60)
        .build_cartesian_2d((lo..hi).log_scale(), ymin..1.005)
        .map_err(e)?;
    chart
        .configure_mesh()
        .x_desc("queries per second (log scale)")
        .y_desc("recall@k")
        .label_style((FAMILY, 13))
        .axis_desc_style((FAMILY, 15))
        .x_label_formatter(&|v| fmt_qps(*v))
        .y_label_formatter(&|v| format!("{v:.2}"))
        .draw()
        .map_err(e)?;
    chart
        .draw_series(LineSeries::new(
            vec![(lo, target), (hi, target)],
            BLACK.mix(0.3).stroke_width(1),
        ))
        .map_err(e)?;
    let methods = [GPU_GRAPH, GPU_GRAPH_GPU_BUILT, CPU_HNSW, EXACT_GPU];
    let batches = if b_min == b_max {
        vec![(b_max, true)]
    } else {
        vec![(b_max, true), (b_min, false)]
    };
    for &m in &methods {
        for &(b, solid) in &batches {
            let mut pts: Vec<(f64, f64)> = shown
                .iter()
                .filter(|p| p.method == m && p.batch == b)
                .map(|p| (p.qps, p.recall))
                .collect();
            if pts.is_empty() {
                continue;
            }
            pts.sort_by(|x, y| x.1.total_cmp(&y.1));
            let c = colour(m);
            let style = if solid {
                c.stroke_width(2)
            } else {
                c.mix(0.6).stroke_width(1)
            };
            let label = format!("{m}, batch {b}");
            chart
                .draw_series(LineSeries::new(pts.clone(), style))
                .map_err(e)?
                .label(label)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], style));
            if solid {
                chart
                    .draw_series(pts.iter().map(|&p| Circle::new(p, 4, c.filled())))
                    .map_err(e)?;
            } else {
                chart
                    .draw_series(
                        pts.iter()
                            .map(|&p| TriangleMarker::new(p, 5, c.mix(0.6).stroke_width(1))),
                    )
                    .map_err(e)?;
            }
        }
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.4))
        .label_font((FAMILY, 13))
        .draw()
        .map_err(e)?;
    root.present().map_err(e)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_p90_of_ten() {
        let mut v: Vec<f64> = (1..=10).rev().map(f64::from).collect();
        assert_eq!(median_p90(&mut v), (5.5, 9.0));
        let mut one = vec![2.0];
        assert_eq!(median_p90(&mut one), (2.0, 2.0));
    }

    #[test]
    fn time_point_covers_each_batch_once_after_warm_up_from_the_end() {
        let a = Args::parse_from(["graph_sweep", "--budget-s", "1000", "--min-reps", "1"]);
        let mut calls = Vec::new();
        let mut search = |lo: usize, hi: usize| -> AnyResult<Vec<Vec<Neighbor>>> {
            calls.push((lo, hi));
            Ok((lo..hi)
                .map(|i| vec![Neighbor::new(i as u32, 0.0)])
                .collect())
        };
        let t = time_point(10, 3, &a, &mut search).unwrap();
        // 3 slices of 3: warm-up max(2, min(ceil(100 / 3), 3)) = 3 batches,
        // last slice first, then each slice once.
        assert_eq!(t.warmup, 3);
        assert_eq!(calls, [(6, 9), (3, 6), (0, 3), (0, 3), (3, 6), (6, 9)]);
        assert_eq!((t.lat_s.len(), t.queries), (3, 9));
        let covered: Vec<Option<u32>> = t
            .results
            .iter()
            .map(|r| r.as_ref().map(|v| v[0].index))
            .collect();
        let mut want: Vec<Option<u32>> = (0..9).map(Some).collect();
        want.push(None);
        assert_eq!(covered, want);
    }

    #[test]
    fn differ_counts_ids_and_bits() {
        let a = vec![
            vec![Neighbor::new(1, 1.0)],
            vec![Neighbor::new(2, 2.0)],
            vec![Neighbor::new(3, 3.0)],
        ];
        let b = vec![
            vec![Neighbor::new(1, 1.0)],
            vec![Neighbor::new(2, -2.0)],
            vec![Neighbor::new(4, 3.0)],
        ];
        assert_eq!(differ(&a, &b), (1, 2));
        assert_eq!(differ(&a, &a[..2]), (1, 1));
    }
}

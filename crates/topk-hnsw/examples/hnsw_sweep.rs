//! The HNSW benchmark sweep: build time, then recall@k and single-thread QPS
//! for a list of `ef` values, on a corpus read from disk.
//!
//! Two subcommands:
//! - `gen` writes a seeded Gaussian-cluster corpus, queries and their exact
//!   top-100 (from topk-cpu's exact retriever) as `.npy` / `.ivecs`, so every
//!   library of the comparison reads identical data;
//! - `sweep` builds the index and prints one `HNSW_SWEEP_JSON {...}` line per
//!   `ef` (and one for the build), also appended to `--csv`.
//!
//! ```text
//! cargo run --release -p topk-hnsw --example hnsw_sweep -- gen --n 100000 --d 128 --out-dir target/hnsw-data/gauss-100k
//! cargo run --release -p topk-hnsw --example hnsw_sweep -- sweep --dir target/hnsw-data/gauss-100k --metric l2
//! ```

use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::{Parser, Subcommand};
use ndarray::{Array2, ArrayView2};
use topk_core::{Metric, Neighbor, Retriever};
use topk_cpu::CpuRetriever;
use topk_hnsw::{recall_at_k, synth, Hnsw, HnswParams};

#[derive(Parser)]
#[command(about = "HNSW build/recall/QPS sweep")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Writes corpus.npy, queries.npy and gt_top100.ivecs of a Gaussian-cluster set.
    Gen {
        #[arg(long, default_value_t = 100_000)]
        n: usize,
        #[arg(long, default_value_t = 128)]
        d: usize,
        #[arg(long, default_value_t = 1_000)]
        queries: usize,
        #[arg(long, default_value_t = 256)]
        clusters: usize,
        #[arg(long, default_value_t = 1.0)]
        spread: f32,
        #[arg(long, default_value_t = 2026)]
        seed: u64,
        /// Metric of the ground truth.
        #[arg(long, default_value = "l2")]
        metric: Metric,
        #[arg(long)]
        out_dir: PathBuf,
    },
    /// Builds an index over `<dir>/corpus.npy` and sweeps `ef`.
    Sweep {
        /// Holds corpus.npy, queries.npy and gt_top100.ivecs.
        #[arg(long)]
        dir: PathBuf,
        /// Name of the data set in the output.
        #[arg(long)]
        dataset: Option<String>,
        #[arg(long, default_value = "l2")]
        metric: Metric,
        #[arg(long, default_value_t = 16)]
        m: usize,
        #[arg(long, default_value_t = 100)]
        ef_construction: usize,
        #[arg(long, value_delimiter = ',', default_value = "10,20,40,80,160,320")]
        ef: Vec<usize>,
        #[arg(long, default_value_t = 10)]
        k: usize,
        /// Build threads: 1 is the deterministic sequential build.
        #[arg(long, default_value_t = 1)]
        build_threads: usize,
        /// Passes over the queries per `ef`; the fastest is reported.
        #[arg(long, default_value_t = 3)]
        repeats: usize,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// CSV file to append result rows to.
        #[arg(long)]
        csv: Option<PathBuf>,
        /// Time the build only (one row with `ef` = 0), no search sweep.
        #[arg(long)]
        build_only: bool,
    },
}

type AnyResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn main() -> AnyResult<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().cmd {
        Cmd::Gen {
            n,
            d,
            queries,
            clusters,
            spread,
            seed,
            metric,
            out_dir,
        } => gen(n, d, queries, clusters, spread, seed, metric, &out_dir),
        Cmd::Sweep {
            dir,
            dataset,
            metric,
            m,
            ef_construction,
            ef,
            k,
            build_threads,
            repeats,
            seed,
            csv,
            build_only,
        } => {
            let ef = if build_only { Vec::new() } else { ef };
            let dataset = dataset.unwrap_or_else(|| {
                dir.file_name()
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_default()
            });
            let params = HnswParams {
                m,
                ef_construction,
                ef_search: 64,
                seed,
                parallel: build_threads > 1,
            };
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(build_threads)
                .build()?;
            pool.install(|| {
                sweep(
                    &dir,
                    &dataset,
                    metric,
                    params,
                    &ef,
                    k,
                    build_threads,
                    repeats,
                    csv.as_deref(),
                )
            })
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn gen(
    n: usize,
    d: usize,
    q: usize,
    clusters: usize,
    spread: f32,
    seed: u64,
    metric: Metric,
    out: &Path,
) -> AnyResult<()> {
    std::fs::create_dir_all(out)?;
    let corpus = Array2::from_shape_vec(
        (n, d),
        synth::gaussian_clusters(n, d, clusters, spread, seed),
    )?;
    let queries =
        Array2::from_shape_vec((q, d), synth::cluster_queries(q, d, clusters, spread, seed))?;
    let started = Instant::now();
    let exact = CpuRetriever::new(corpus.view(), metric)?;
    let truth = exact.search_batch(queries.view(), 100)?;
    let mut gt = Array2::<i32>::zeros((q, 100));
    for (i, row) in truth.iter().enumerate() {
        for (j, nb) in row.iter().enumerate() {
            gt[[i, j]] = i32::try_from(nb.index)?;
        }
    }
    topk_io::write_matrix(out.join("corpus.npy"), corpus.view())?;
    topk_io::write_matrix(out.join("queries.npy"), queries.view())?;
    topk_io::write_ivecs(out.join("gt_top100.ivecs"), gt.view())?;
    let meta = serde_json::json!({
        "generator": "topk_hnsw::synth::gaussian_clusters",
        "n": n, "d": d, "queries": q, "clusters": clusters, "spread": spread,
        "seed": seed, "ground_truth": format!("exact top-100, {metric}, topk-cpu canonical score"),
        "gt_seconds": started.elapsed().as_secs_f64(),
    });
    std::fs::write(out.join("meta.json"), serde_json::to_string_pretty(&meta)?)?;
    eprintln!("wrote {} ({n} x {d}, {q} queries)", out.display());
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn sweep(
    dir: &Path,
    dataset: &str,
    metric: Metric,
    params: HnswParams,
    efs: &[usize],
    k: usize,
    build_threads: usize,
    repeats: usize,
    csv: Option<&Path>,
) -> AnyResult<()> {
    let corpus = topk_io::read_matrix(dir.join("corpus.npy"))?;
    let queries = topk_io::read_matrix(dir.join("queries.npy"))?;
    let gt = topk_io::read_ids(dir.join("gt_top100.ivecs"))?;
    let truth: Vec<Vec<u32>> = gt.outer_iter().map(|r| r.to_vec()).collect();
    let (n, d) = corpus.dim();

    let started = Instant::now();
    let index = Hnsw::new(corpus.view(), metric, params)?;
    let build_s = started.elapsed().as_secs_f64();
    let stats = index.stats();
    let base = serde_json::json!({
        "library": "topk-hnsw", "dataset": dataset, "n": n, "d": d, "metric": metric.as_str(),
        "m": params.m, "ef_construction": params.ef_construction, "k": k,
        "build_threads": build_threads, "build_s": build_s, "max_level": stats.max_level,
    });
    let mut rows = Vec::new();
    for &ef in efs {
        let (res, secs) = timed_pass(&index, queries.view(), k, ef, repeats)?;
        let recall = recall_at_k(&res, &truth, k)?;
        let mut rec = base.clone();
        rec["ef"] = ef.into();
        rec["recall"] = recall.into();
        rec["qps"] = (queries.nrows() as f64 / secs).into();
        rec["us_per_query"] = (secs * 1e6 / queries.nrows() as f64).into();
        println!("HNSW_SWEEP_JSON {rec}");
        rows.push(rec);
    }
    if efs.is_empty() {
        let mut rec = base.clone();
        rec["ef"] = 0.into();
        rec["recall"] = serde_json::Value::Null;
        rec["qps"] = serde_json::Value::Null;
        println!("HNSW_SWEEP_JSON {rec}");
        rows.push(rec);
    }
    if let Some(path) = csv {
        append_csv(path, &rows)?;
    }
    Ok(())
}

/// One thread, queries one at a time; the fastest of `repeats` passes.
fn timed_pass(
    index: &Hnsw,
    queries: ArrayView2<'_, f32>,
    k: usize,
    ef: usize,
    repeats: usize,
) -> AnyResult<(Vec<Vec<Neighbor>>, f64)> {
    let qs: Vec<Vec<f32>> = queries.outer_iter().map(|r| r.to_vec()).collect();
    let mut out = vec![Vec::with_capacity(k); qs.len()];
    let mut best = f64::INFINITY;
    for _ in 0..repeats.max(1) {
        let started = Instant::now();
        for (q, o) in qs.iter().zip(out.iter_mut()) {
            index.search_with_ef(q, k, ef, o)?;
        }
        best = best.min(started.elapsed().as_secs_f64());
    }
    debug_assert!(out.iter().all(|o| o.len() == k.min(index.len())));
    Ok((out, best))
}

const CSV_COLUMNS: [&str; 13] = [
    "library",
    "dataset",
    "n",
    "d",
    "metric",
    "m",
    "ef_construction",
    "build_threads",
    "build_s",
    "ef",
    "k",
    "recall",
    "qps",
];

fn append_csv(path: &Path, rows: &[serde_json::Value]) -> AnyResult<()> {
    use std::io::Write;
    let fresh = !path.exists();
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    if fresh {
        writeln!(f, "{}", CSV_COLUMNS.join(","))?;
    }
    for r in rows {
        let cells: Vec<String> = CSV_COLUMNS
            .iter()
            .map(|c| match &r[*c] {
                serde_json::Value::String(s) => s.clone(),
                serde_json::Value::Null => String::new(),
                v => v.to_string(),
            })
            .collect();
        writeln!(f, "{}", cells.join(","))?;
    }
    Ok(())
}

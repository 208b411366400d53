//! Per-query time of HNSW search with CPU distances against GPU-batched
//! distances, for 1, 10 and 100 queries in flight; one `HNSW_GPU_JSON {...}`
//! line per measurement, each with whether the GPU results equal the CPU
//! results bit for bit. Also times a sequential build on each path over a
//! prefix of the corpus and checks that both give the byte-identical graph.
//!
//! ```text
//! cargo run --release -p topk-hnsw --features cuda --example hnsw_gpu_probe -- [--n 100000] [--d 128]
//! ```
//! With `--data DIR` it reads `DIR/corpus.npy` and `DIR/queries.npy` instead
//! of generating a Gaussian-cluster set.

use std::path::PathBuf;
use std::time::Instant;

use clap::Parser;
use ndarray::{Array2, ArrayView2};
use rayon::prelude::*;
use topk_core::{Metric, Neighbor};
use topk_cuda::{CudaConfig, CudaRetriever};
use topk_hnsw::{recall_at_k, synth, Hnsw, HnswParams};

#[derive(Parser)]
struct Args {
    #[arg(long, default_value_t = 100_000)]
    n: usize,
    #[arg(long, default_value_t = 128)]
    d: usize,
    #[arg(long, default_value_t = 1_000)]
    queries: usize,
    #[arg(long)]
    data: Option<PathBuf>,
    #[arg(long, default_value = "l2")]
    metric: Metric,
    #[arg(long, default_value_t = 16)]
    m: usize,
    #[arg(long, default_value_t = 100)]
    ef_construction: usize,
    #[arg(long, default_value_t = 100)]
    ef: usize,
    #[arg(long, default_value_t = 10)]
    k: usize,
    #[arg(long, value_delimiter = ',', default_value = "1,10,100")]
    in_flight: Vec<usize>,
    /// Rows of the build comparison (the first rows of the corpus): a
    /// sequential build pays one launch per expansion, so it is timed on a
    /// prefix; 0 skips it.
    #[arg(long, default_value_t = 10_000)]
    build_n: usize,
}

type AnyResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn emit(v: serde_json::Value) {
    println!("HNSW_GPU_JSON {v}");
}

fn bits(v: &[Vec<Neighbor>]) -> Vec<Vec<(u32, u32)>> {
    v.iter()
        .map(|r| r.iter().map(|n| (n.index, n.score.to_bits())).collect())
        .collect()
}

fn main() -> AnyResult<()> {
    let a = Args::parse();
    let (corpus, queries, name) = match &a.data {
        Some(dir) => (
            topk_io::read_matrix(dir.join("corpus.npy"))?,
            topk_io::read_matrix(dir.join("queries.npy"))?,
            dir.display().to_string(),
        ),
        None => (
            Array2::from_shape_vec(
                (a.n, a.d),
                synth::gaussian_clusters(a.n, a.d, 256, 1.0, 2026),
            )?,
            Array2::from_shape_vec(
                (a.queries, a.d),
                synth::cluster_queries(a.queries, a.d, 256, 1.0, 2026),
            )?,
            format!("gauss-{}-d{}", a.n, a.d),
        ),
    };
    let (n, d) = corpus.dim();
    let data: Vec<f32> = corpus.iter().copied().collect();
    let params = HnswParams {
        m: a.m,
        ef_construction: a.ef_construction,
        ef_search: a.ef,
        seed: 1,
        parallel: false,
    };
    let base = serde_json::json!({
        "dataset": name, "n": n, "d": d, "metric": a.metric.as_str(), "m": a.m,
        "ef_construction": a.ef_construction, "ef": a.ef, "k": a.k,
    });

    let t = Instant::now();
    let gpu = CudaRetriever::from_rowmajor(data.clone(), d, a.metric, CudaConfig::default())?;
    let upload_s = t.elapsed().as_secs_f64();
    let mut rec = base.clone();
    rec["what"] = "engine".into();
    rec["device"] = gpu.info().name.clone().into();
    rec["upload_s"] = upload_s.into();
    emit(rec);

    let bn = a.build_n.min(n);
    if bn > 0 {
        let prefix = &data[..bn * d];
        let small_gpu =
            CudaRetriever::from_rowmajor(prefix.to_vec(), d, a.metric, CudaConfig::default())?;
        let t = Instant::now();
        let cpu_index = Hnsw::build(prefix, d, a.metric, params)?;
        let cpu_s = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let gpu_index = Hnsw::build_gpu(prefix, d, a.metric, params, &small_gpu)?;
        let gpu_s = t.elapsed().as_secs_f64();
        let mut rec = base.clone();
        rec["what"] = "build".into();
        rec["build_n"] = bn.into();
        rec["cpu_seconds"] = cpu_s.into();
        rec["gpu_seconds"] = gpu_s.into();
        rec["identical_graph"] = (gpu_index.to_bytes() == cpu_index.to_bytes()).into();
        emit(rec);
    }

    // The search index is built on the CPU with all threads (its graph does
    // not affect the comparison: both paths search the same one).
    let t = Instant::now();
    let index = Hnsw::build_parallel(&data, d, a.metric, params)?;
    let mut rec = base.clone();
    rec["what"] = "build_parallel_cpu".into();
    rec["seconds"] = t.elapsed().as_secs_f64().into();
    emit(rec);

    let qv = queries.view();
    let exact = topk_cpu::CpuRetriever::new(corpus.view(), a.metric)?;
    let truth: Vec<Vec<u32>> = topk_core::Retriever::search_batch(&exact, qv, a.k)?
        .into_iter()
        .map(|r| r.into_iter().map(|nb| nb.index).collect())
        .collect();
    let reference = cpu_search(&index, qv, a.k, a.ef, 1)?;
    let recall = recall_at_k(&reference, &truth, a.k)?;
    let nq = queries.nrows() as f64;
    for &fl in &a.in_flight {
        let threads = fl.min(std::thread::available_parallelism().map_or(1, |p| p.get()));
        let t = Instant::now();
        let cpu = cpu_search(&index, qv, a.k, a.ef, threads)?;
        let cpu_s = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let g = index.search_batch_gpu(&gpu, qv, a.k, a.ef, fl)?;
        let gpu_s = t.elapsed().as_secs_f64();
        let mut rec = base.clone();
        rec["what"] = "search".into();
        rec["in_flight"] = fl.into();
        rec["cpu_threads"] = threads.into();
        rec["cpu_ms_per_query"] = (cpu_s * 1e3 / nq).into();
        rec["gpu_ms_per_query"] = (gpu_s * 1e3 / nq).into();
        rec["recall"] = recall.into();
        rec["gpu_equals_cpu"] =
            (bits(&g) == bits(&reference) && bits(&cpu) == bits(&reference)).into();
        emit(rec);
    }
    // One query at a time through the direct (unbatched) GPU scorer.
    let t = Instant::now();
    let mut out = Vec::new();
    let mut same = true;
    for (i, q) in queries.outer_iter().enumerate() {
        let q: Vec<f32> = q.to_vec();
        index.search_gpu(&gpu, &q, a.k, a.ef, &mut out)?;
        same &= bits(std::slice::from_ref(&out)) == bits(std::slice::from_ref(&reference[i]));
    }
    let mut rec = base.clone();
    rec["what"] = "search".into();
    rec["in_flight"] = 1.into();
    rec["mode"] = "direct".into();
    rec["gpu_ms_per_query"] = (t.elapsed().as_secs_f64() * 1e3 / nq).into();
    rec["gpu_equals_cpu"] = same.into();
    emit(rec);
    Ok(())
}

fn cpu_search(
    index: &Hnsw,
    qs: ArrayView2<'_, f32>,
    k: usize,
    ef: usize,
    threads: usize,
) -> AnyResult<Vec<Vec<Neighbor>>> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()?;
    let rows: Vec<Vec<f32>> = qs.outer_iter().map(|r| r.to_vec()).collect();
    pool.install(|| {
        rows.par_iter()
            .map(|q| {
                let mut out = Vec::new();
                index.search_with_ef(q, k, ef, &mut out)?;
                Ok(out)
            })
            .collect::<Result<Vec<_>, topk_hnsw::HnswError>>()
    })
    .map_err(Into::into)
}

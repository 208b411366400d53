//! Recall@10 of the two builds on the same Gaussian-cluster corpus: the
//! insertion build (`Hnsw::build_parallel`) against the exact-kNN build
//! (`Hnsw::build_knn_cpu`), over ef ∈ {32, 64, 128, 256}, CPU only.
//!
//! ```text
//! cargo run --release -p topk-hnsw --example knn_build_recall -- [N] [CLUSTERS]
//! ```
//!
//! N rows (default 50,000) of D = 384 in CLUSTERS clusters (default 50),
//! spread 1.0, seed 2026; 500 queries from the same centres; m = 16,
//! ef_construction = 100; ground truth from topk-cpu.
use ndarray::ArrayView2;
use std::time::Instant;
use topk_core::{Metric, Retriever};
use topk_hnsw::{recall_at_k, synth, Hnsw, HnswParams};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let arg = |i: usize, default: usize| -> Result<usize, Box<dyn std::error::Error>> {
        match std::env::args().nth(i) {
            Some(s) => Ok(s.parse()?),
            None => Ok(default),
        }
    };
    let (n, clusters) = (arg(1, 50_000)?, arg(2, 50)?);
    println!("{n} x 384 in {clusters} clusters, spread 1.0, m = 16, ef_construction = 100");
    let d = 384;
    let nq = 500;
    let data = synth::gaussian_clusters(n, d, clusters, 1.0, 2026);
    let queries = synth::cluster_queries(nq, d, clusters, 1.0, 2027);
    let cpu = topk_cpu::CpuRetriever::from_rowmajor(data.clone(), d, Metric::L2)?;
    let qs = ArrayView2::from_shape((nq, d), &queries[..])?;
    let truth: Vec<Vec<u32>> = cpu
        .search_batch(qs, 10)?
        .iter()
        .map(|r| r.iter().map(|h| h.index).collect())
        .collect();
    let params = HnswParams {
        m: 16,
        ef_construction: 100,
        ef_search: 64,
        seed: 1,
        parallel: true,
    };
    let t = Instant::now();
    let a = Hnsw::build_parallel(&data, d, Metric::L2, params)?;
    println!("parallel build {:.1}s", t.elapsed().as_secs_f64());
    let t = Instant::now();
    let b = Hnsw::build_knn_cpu(&data, d, Metric::L2, params)?;
    println!("knn build {:.1}s", t.elapsed().as_secs_f64());
    for ef in [32, 64, 128, 256] {
        let ra = recall_at_k(&a.search_batch_with_ef(qs, 10, ef)?, &truth, 10)?;
        let rb = recall_at_k(&b.search_batch_with_ef(qs, 10, ef)?, &truth, 10)?;
        println!("ef {ef}: insertion {ra:.4} knn {rb:.4}");
    }
    Ok(())
}

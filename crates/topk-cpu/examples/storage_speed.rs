//! Time of exact CPU search over a corpus stored as f32, f16 and bf16
//! (docs/CONTRACTS.md §14), side by side in one run: single queries and a
//! certified batch, as ratios to f32, with the bytes each store takes. The
//! answers of every type are checked against the oracle over the rounded
//! rows before anything is timed.
//!
//! `cargo run --release -p topk-cpu --example storage_speed -- [N] [D] [Q]`
//! (defaults 200000 384 1000).

use std::time::Instant;

use topk_core::{Dtype, Metric, Retriever};
use topk_cpu::{CpuRetriever, Oracle};

const K: usize = 10;
/// Single queries timed per type (the median is reported).
const SINGLES: usize = 30;

fn arg(i: usize, default: usize) -> usize {
    std::env::args()
        .nth(i)
        .and_then(|a| a.parse().ok())
        .unwrap_or(default)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (n, d, nq) = (arg(1, 200_000), arg(2, 384), arg(3, 1000));
    let corpus_rows = topk_io::synth::gaussian_rows(n, d, 2026, true);
    let queries = topk_io::synth::gaussian_queries(nq, d, 2026, true);
    let corpus = corpus_rows.view();
    println!(
        "N = {n}, D = {d}, K = {K}, cosine; {} threads",
        rayon::current_num_threads()
    );
    println!("| storage | bytes | single query (median of {SINGLES}) | × f32 | batch of {nq} (QPS) | × f32 |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: |");
    let mut base: Option<(f64, f64)> = None;
    for dtype in Dtype::ALL {
        let cpu = CpuRetriever::with_dtype(corpus, Metric::Cosine, dtype)?;
        let rounded = corpus.mapv(|x| dtype.round(x));
        let oracle = Oracle::new(rounded.view(), Metric::Cosine)?;
        let q0 = queries.row(0).to_vec();
        assert_eq!(
            cpu.search(&q0, K)?,
            oracle.search(&q0, K)?,
            "{dtype}: not the oracle's answer"
        );
        let batch = cpu.search_batch(queries.view(), K)?;
        assert_eq!(batch[0], oracle.search(&q0, K)?, "{dtype}: batch differs");
        let singles: Vec<f64> = (0..SINGLES)
            .map(|i| {
                let q = queries.row(i % nq).to_vec();
                let t = Instant::now();
                let hits = cpu.search(&q, K);
                let s = t.elapsed().as_secs_f64();
                assert!(hits.is_ok());
                s
            })
            .collect();
        let single = median(singles);
        let t = Instant::now();
        let out = cpu.search_batch(queries.view(), K)?;
        let qps = nq as f64 / t.elapsed().as_secs_f64();
        assert_eq!(out, batch, "{dtype}: a second batch differs");
        let (s0, q0) = *base.get_or_insert((single, qps));
        println!(
            "| {dtype} | {} | {:.2} ms | {:.2} | {:.0} | {:.2} |",
            cpu.store().bytes(),
            single * 1e3,
            single / s0,
            qps,
            qps / q0
        );
    }
    Ok(())
}

//! One query's latency with the f32 product (the plain SIMD scan) and with
//! the int8 product (the certified path), side by side in one process: how
//! `MIN_INT8_VALUES` was chosen (bench/gpu/NOTES.md).
//!
//! ```sh
//! cargo run --release -p topk-cpu --example int8_singles -- 100000 384 8
//! cargo run --release -p topk-cpu --example int8_singles -- \
//!     ../shared/data/minilm-docs-20k/corpus.npy ../shared/data/minilm-docs-20k/queries.npy 10
//! ```
//!
//! With three numbers: `N D K` over uniform rows in [-1, 1). With two files
//! and K: the corpus and the first 16 queries of `.npy` / `.fvecs` files.
//! Prints the best of 5 rounds of 16 queries, per query, after the row state
//! is prepared (`prepare_certified`) and one warm-up query.

use std::time::Instant;

use topk_core::{Metric, Retriever};
use topk_cpu::{BatchGemm, CpuRetriever};
use topk_testkit::corpora::Rng;

const QUERIES: usize = 16;

fn usage() -> ! {
    eprintln!("usage: int8_singles N D K | int8_singles CORPUS QUERIES K");
    std::process::exit(2)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() != 3 {
        usage();
    }
    let k: usize = args[2].parse()?;
    let (data, queries, d) = match (args[0].parse::<usize>(), args[1].parse::<usize>()) {
        (Ok(n), Ok(d)) => {
            let mut rng = Rng::new(5);
            let data: Vec<f32> = (0..n * d).map(|_| rng.unit()).collect();
            let queries: Vec<f32> = (0..QUERIES * d).map(|_| rng.unit()).collect();
            (data, queries, d)
        }
        _ => {
            let corpus = topk_io::read_matrix(&args[0])?;
            let queries = topk_io::read_matrix(&args[1])?;
            let d = corpus.ncols();
            let q: Vec<f32> = queries.iter().take(QUERIES * d).copied().collect();
            (corpus.iter().copied().collect(), q, d)
        }
    };
    let n = data.len() / d.max(1);
    let base = CpuRetriever::from_rowmajor(data, d, Metric::Dot)?;
    for gemm in BatchGemm::available() {
        let cpu = base.clone().with_batch_gemm(gemm)?;
        // Single queries use the int8 codes once built; they never build them.
        cpu.prepare_certified();
        cpu.search(&queries[..d], k)?;
        let mut best = f64::MAX;
        for _ in 0..5 {
            let t = Instant::now();
            for q in queries.chunks_exact(d) {
                std::hint::black_box(cpu.search(q, k)?);
            }
            best = best.min(t.elapsed().as_secs_f64() / (queries.len() / d) as f64);
        }
        println!("N={n} D={d} K={k} {gemm}: {:.1} us per query", best * 1e6);
    }
    Ok(())
}

//! Single-query latency and batch throughput of `CpuRetriever`.
//!
//! Rows are uniform in [-1, 1) per value, then L2-normalised, scored with the
//! dot metric. The default run is short (N = 100k, D = 384, a batch of 100);
//! `TOPK_CPU_BENCH=full` runs N ∈ {100k, 1M} × D ∈ {384, 1024} × K ∈ {8, 100}
//! with batches of 1,000 queries. `TOPK_CPU_BENCH_PATH=scalar|avx2|avx512`
//! forces a kernel path. Single queries run on rayon's global pool and on a
//! one-thread pool; batches run with every batch product this CPU has
//! (`batch<Q>_f32`, `batch<Q>_int8`), side by side.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use ndarray::ArrayView2;
use rayon::prelude::*;
use topk_core::{Metric, Neighbor, Retriever};
use topk_cpu::{BatchGemm, CpuRetriever, Kernels, Path};

use topk_testkit::corpora as common;

/// `n` normalised rows of `d` values, generated in parallel from `seed`.
fn rows(seed: u64, n: usize, d: usize) -> Vec<f32> {
    let mut data = vec![0.0_f32; n * d];
    data.par_chunks_mut(d * 4096)
        .enumerate()
        .for_each(|(b, block)| {
            let mut rng = common::Rng::new(seed ^ (b as u64).wrapping_mul(0x9E37_79B9));
            for row in block.chunks_exact_mut(d) {
                row.iter_mut().for_each(|v| *v = rng.unit());
                let norm = row.iter().map(|v| v * v).sum::<f32>().sqrt();
                row.iter_mut().for_each(|v| *v /= norm);
            }
        });
    data
}

fn kernels() -> Kernels {
    let forced = std::env::var("TOPK_CPU_BENCH_PATH").ok();
    match forced.as_deref() {
        None => Kernels::best(),
        Some(name) => {
            let path = Path::ALL
                .into_iter()
                .find(|p| p.as_str() == name)
                .unwrap_or_else(|| panic!("unknown path {name}"));
            Kernels::new(path).unwrap_or_else(|e| panic!("{e}"))
        }
    }
}

fn bench(c: &mut Criterion) {
    let full = std::env::var("TOPK_CPU_BENCH").is_ok_and(|v| v == "full");
    let (ns, ds, batch): (&[usize], &[usize], usize) = if full {
        (&[100_000, 1_000_000], &[384, 1024], 1000)
    } else {
        (&[100_000], &[384], 100)
    };
    let kernels = kernels();
    let one_thread = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .expect("one-thread pool");
    eprintln!(
        "topk-cpu bench: path {}, {} threads",
        kernels.path(),
        rayon::current_num_threads()
    );
    for &d in ds {
        let queries = rows(0xC0FFEE, batch, d);
        for &n in ns {
            // One retriever, its batch product switched between the batch
            // benchmarks (no copy of the corpus per product).
            let mut cpu = CpuRetriever::from_rowmajor(rows(42, n, d), d, Metric::Dot)
                .expect("valid corpus")
                .with_kernels(kernels);
            let mut g = c.benchmark_group(format!("cpu/n{n}/d{d}"));
            g.sample_size(10)
                .warm_up_time(Duration::from_millis(500))
                .measurement_time(Duration::from_secs(3));
            for k in [8, 100] {
                g.throughput(Throughput::Bytes((n * d * 4) as u64));
                let mut out: Vec<Neighbor> = Vec::with_capacity(k);
                let mut qi = 0;
                // A search without its own pool runs on the pool it is called
                // from: the one-thread pool shows whether a single stream beats
                // two threads that compete for cores on a busy machine.
                for (name, pool) in [("single", None), ("single_1thread", Some(&one_thread))] {
                    g.bench_function(BenchmarkId::new(name, format!("k{k}")), |b| {
                        b.iter(|| {
                            let q = &queries[qi * d..(qi + 1) * d];
                            qi = (qi + 1) % batch;
                            let mut run = || cpu.search_into(black_box(q), k, &mut out);
                            match pool {
                                Some(p) => p.install(run),
                                None => run(),
                            }
                            .expect("search");
                            black_box(&out);
                        })
                    });
                }
                let qs = ArrayView2::from_shape((batch, d), &queries).expect("shape");
                let mut outs = Vec::new();
                g.throughput(Throughput::Elements(batch as u64));
                for gemm in BatchGemm::available() {
                    cpu = cpu.with_batch_gemm(gemm).expect("available");
                    let cpu = &cpu;
                    g.bench_function(
                        BenchmarkId::new(format!("batch{batch}_{gemm}"), format!("k{k}")),
                        |b| {
                            b.iter(|| {
                                cpu.search_batch_into(black_box(qs), k, &mut outs)
                                    .expect("batch");
                                black_box(&outs);
                            })
                        },
                    );
                }
            }
            g.finish();
        }
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);

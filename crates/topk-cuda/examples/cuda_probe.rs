//! `cuda_probe`: quick latency probe of the GPU engine over the docs/CONTRACTS.md §6
//! configurations, one JSON line per measurement on stdout.
//!
//! Usage: `cuda_probe [--quick] [--ns N1,N2,…] [--ds D1,…] [--ks K1,…] [--trials T]
//! [--fuse-rows R] [--single-launch-rows S] [--no-graphs] [--copy-results]
//! [--copy-queries] [--batches Q1,…] [--batch-trials B] [--no-single]
//! [--filter-rows F] [--filter-queries FQ] [--batch-scratch BYTES] [--no-wgmma]
//! [--filter-sample S] [--filter-emit E] [--filter-emit-rows R] [--no-shadow]
//! [--dtype f32|f16|bf16] [--batch-k K] [--device-batches]`
//! (`--ns`, `--ds` and `--ks` pick the corpus sizes, dimensions and K;
//! `--batches` times batches of those sizes (K = 100 or `--batch-k`, B trials, default 10)
//! at every corpus, instead of Q = 256 at 1M × 1024 only; `--no-single`
//! leaves out the single-query and round-trip lines; R, S, F, FQ and BYTES
//! set `Tuning::fuse_rows`, `single_launch_rows`, `filter_rows`,
//! `filter_queries` and `batch_scratch`;
//! `--no-graphs` clears `Tuning::graphs`, `--no-wgmma`
//! `Tuning::wgmma_bounds`, `--copy-results`
//! `Tuning::mapped_results`, `--copy-queries`
//! `Tuning::mapped_queries`; `--filter-sample S` sets
//! `Tuning::filter_sample` (1: off), `--filter-emit E`
//! `Tuning::filter_emit` (0: off), `--filter-emit-rows R`
//! `Tuning::filter_emit_rows`, `--filter-max-k K` `Tuning::filter_max_k`,
//! `--no-shadow` clears `Tuning::shadow_bounds`; `--device-batches` also
//! times each batch from device memory, alternating with the host batches;
//! `--dtype` stores the rows as that type on the
//! device, the reference and the floor taken over the stored rows). Rows are
//! seeded Gaussian,
//! L2-normalised, dot metric. Every configuration is first checked against
//! the scalar definition (index and score bits) for its largest K.

use std::time::Instant;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use topk_core::{order::sort_best_first, Dtype, Metric, Neighbor, RowStore};
use topk_cuda::{device_info, measure_d2d_bandwidth, CudaConfig, CudaRetriever, RoundTrip};

fn gaussian_rows(n: usize, d: usize, seed: u64) -> Vec<f32> {
    let mut v = vec![0.0f32; n * d];
    let threads = std::thread::available_parallelism().map_or(4, |p| p.get());
    let rows_per = n.div_ceil(threads).max(1);
    std::thread::scope(|s| {
        for (c, part) in v.chunks_mut(rows_per * d).enumerate() {
            s.spawn(move || {
                let mut rng =
                    ChaCha8Rng::seed_from_u64(seed.wrapping_mul(1000).wrapping_add(c as u64));
                for row in part.chunks_mut(d) {
                    // Box-Muller, both outputs used.
                    for pair in row.chunks_mut(2) {
                        let u1: f32 = rng.random::<f32>().max(1e-7);
                        let u2: f32 = rng.random::<f32>();
                        let r = (-2.0 * u1.ln()).sqrt();
                        let (sn, cs) = (std::f32::consts::TAU * u2).sin_cos();
                        pair[0] = r * cs;
                        if let Some(x) = pair.get_mut(1) {
                            *x = r * sn;
                        }
                    }
                    let norm = row.iter().map(|x| x * x).sum::<f32>().sqrt();
                    row.iter_mut().for_each(|x| *x /= norm);
                }
            });
        }
    });
    v
}

fn reference(corpus: &[f32], d: usize, q: &[f32], k: usize) -> Vec<Neighbor> {
    let n = corpus.len() / d;
    let mut all: Vec<Neighbor> = vec![Neighbor::default(); n];
    let threads = std::thread::available_parallelism().map_or(4, |p| p.get());
    let per = n.div_ceil(threads).max(1);
    std::thread::scope(|s| {
        for (c, part) in all.chunks_mut(per).enumerate() {
            s.spawn(move || {
                for (j, slot) in part.iter_mut().enumerate() {
                    let i = c * per + j;
                    *slot = Neighbor::new(
                        i as u32,
                        Metric::Dot.score_scalar(q, &corpus[i * d..(i + 1) * d]),
                    );
                }
            });
        }
    });
    sort_best_first(&mut all);
    all.truncate(k);
    all
}

fn same_bits(a: &[Neighbor], b: &[Neighbor]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| x.index == y.index && x.score.to_bits() == y.score.to_bits())
}

fn stats(mut t: Vec<f64>) -> (f64, f64, f64) {
    t.sort_by(f64::total_cmp);
    (t[t.len() / 2], t[0], t[t.len() - 1])
}

/// The number after `flag` on the command line, if any.
fn flag_value(args: &[String], flag: &str) -> Option<usize> {
    let i = args.iter().position(|a| a == flag)?;
    args.get(i + 1)?.parse().ok()
}

/// The comma-separated numbers after `flag` (`--ns 50000,100000`), if any.
fn flag_list(args: &[String], flag: &str) -> Option<Vec<usize>> {
    let i = args.iter().position(|a| a == flag)?;
    args.get(i + 1)?
        .split(',')
        .map(|v| v.trim().parse().ok())
        .collect()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let trials: usize = flag_value(&args, "--trials").unwrap_or(50);
    let fuse_rows: usize = flag_value(&args, "--fuse-rows").unwrap_or(topk_cuda::DEFAULT_FUSE_ROWS);
    let single_launch_rows: usize =
        flag_value(&args, "--single-launch-rows").unwrap_or(topk_cuda::DEFAULT_SINGLE_LAUNCH_ROWS);
    let graphs = !args.iter().any(|a| a == "--no-graphs");
    let wgmma_bounds = !args.iter().any(|a| a == "--no-wgmma");
    let shadow_bounds = !args.iter().any(|a| a == "--no-shadow");
    let mapped_results = !args.iter().any(|a| a == "--copy-results");
    let mapped_queries = !args.iter().any(|a| a == "--copy-queries");
    let filter_rows: usize =
        flag_value(&args, "--filter-rows").unwrap_or(topk_cuda::DEFAULT_FILTER_ROWS);
    let batch_scratch: usize =
        flag_value(&args, "--batch-scratch").unwrap_or(topk_cuda::DEFAULT_BATCH_SCRATCH);
    let filter_queries: usize =
        flag_value(&args, "--filter-queries").unwrap_or(topk_cuda::DEFAULT_FILTER_QUERIES);
    let mut opts = CudaConfig::default();
    let filter_sample: usize =
        flag_value(&args, "--filter-sample").unwrap_or(opts.tuning.filter_sample);
    let filter_emit: usize = flag_value(&args, "--filter-emit").unwrap_or(opts.tuning.filter_emit);
    let filter_emit_rows: usize =
        flag_value(&args, "--filter-emit-rows").unwrap_or(opts.tuning.filter_emit_rows);
    let filter_max_k: usize =
        flag_value(&args, "--filter-max-k").unwrap_or(opts.tuning.filter_max_k);
    let t = &mut opts.tuning;
    t.filter_max_k = filter_max_k;
    t.filter_sample = filter_sample;
    t.filter_emit = filter_emit;
    t.filter_emit_rows = filter_emit_rows;
    t.filter_rows = filter_rows;
    t.filter_queries = filter_queries;
    t.batch_scratch = batch_scratch;
    t.fuse_rows = fuse_rows;
    t.single_launch_rows = single_launch_rows;
    t.graphs = graphs;
    t.wgmma_bounds = wgmma_bounds;
    t.shadow_bounds = shadow_bounds;
    t.mapped_results = mapped_results;
    t.mapped_queries = mapped_queries;
    let info = device_info(0)?;
    let bw = measure_d2d_bandwidth(0, 1 << 30)?;
    println!(
        "{}",
        serde_json::json!({"kind": "env", "device": info.name, "driver": info.driver_version,
            "memory": info.total_memory, "sms": info.multiprocessors, "d2d_bytes_per_s": bw})
    );
    let ns: Vec<usize> = if let Some(list) = flag_list(&args, "--ns") {
        list
    } else if quick {
        vec![10_000, 100_000, 1_000_000]
    } else {
        vec![10_000, 50_000, 100_000, 500_000, 1_000_000]
    };
    let ds: Vec<usize> = if let Some(list) = flag_list(&args, "--ds") {
        list
    } else if quick {
        vec![384, 1024]
    } else {
        vec![384, 768, 1024]
    };
    let ks = flag_list(&args, "--ks").unwrap_or_else(|| vec![8, 32, 100, 1000]);
    let batches = flag_list(&args, "--batches");
    let batch_trials = flag_value(&args, "--batch-trials").unwrap_or(10).max(1);
    let batch_k = flag_value(&args, "--batch-k").unwrap_or(100).max(1);
    let single = !args.iter().any(|a| a == "--no-single");
    let device_batches = args.iter().any(|a| a == "--device-batches");
    let dtype: Dtype = match args.iter().position(|a| a == "--dtype") {
        Some(i) => args.get(i + 1).map_or("", String::as_str).parse()?,
        None => Dtype::F32,
    };
    let cpu_k = *ks.iter().max().unwrap_or(&1000);
    for &n in &ns {
        for &d in &ds {
            let store = RowStore::from_f32(gaussian_rows(n, d, 42), d, dtype)?;
            // The reference scores the stored values, widened.
            let corpus = store.to_f32();
            let query = gaussian_rows(1, d, 7);
            let gpu = CudaRetriever::from_store(&store, Metric::Dot, opts.clone())?;
            drop(store);
            let dq = gpu.upload_query(&query)?;
            let expect = if single {
                reference(&corpus, d, &query, cpu_k)
            } else {
                Vec::new()
            };
            let floor_ms = (n * d * dtype.bytes()) as f64 / bw * 1e3;
            for &k in ks.iter().filter(|_| single) {
                let mut out = Vec::new();
                gpu.search_host(&query, k, &mut out)?;
                let ok_host = same_bits(&out, &expect[..k.min(n)]);
                gpu.search_device(&dq, k, &mut out)?;
                let ok_dev = same_bits(&out, &expect[..k.min(n)]);
                for _ in 0..5 {
                    gpu.search_host(&query, k, &mut out)?;
                }
                let mut th = Vec::with_capacity(trials);
                let mut td = Vec::with_capacity(trials);
                for _ in 0..trials {
                    let t = Instant::now();
                    gpu.search_host(&query, k, &mut out)?;
                    th.push(t.elapsed().as_secs_f64() * 1e3);
                    let t = Instant::now();
                    gpu.search_device(&dq, k, &mut out)?;
                    td.push(t.elapsed().as_secs_f64() * 1e3);
                }
                let stages = gpu.stage_times(&query, k)?;
                let stage_json: serde_json::Map<String, serde_json::Value> = stages
                    .iter()
                    .map(|(name, ms)| ((*name).to_owned(), serde_json::json!(ms)))
                    .collect();
                let (hm, hmin, hmax) = stats(th);
                let (dm, dmin, dmax) = stats(td);
                println!(
                    "{}",
                    serde_json::json!({"kind": "single", "dtype": dtype.as_str(), "fuse_rows": fuse_rows,
                        "single_launch_rows": single_launch_rows, "graphs": graphs, "mapped_results": mapped_results, "mapped_queries": mapped_queries, "n": n, "d": d, "k": k, "metric": "dot",
                        "trials": trials, "host_median_ms": hm, "host_min_ms": hmin, "host_max_ms": hmax,
                        "device_median_ms": dm, "device_min_ms": dmin, "device_max_ms": dmax,
                        "floor_ms": floor_ms, "host_minus_floor_us": (hm - floor_ms) * 1e3,
                        "stages_ms": stage_json, "correct": ok_host && ok_dev})
                );
            }
            let qs = match &batches {
                Some(list) => list.clone(),
                None if n == 1_000_000 && d == 1024 => vec![256],
                None => Vec::new(),
            };
            for q in qs {
                let trials = if batches.is_some() { batch_trials } else { 3 };
                for line in time_batch(&gpu, &corpus, d, q, batch_k, trials, device_batches)? {
                    println!("{line}");
                }
            }
            if single && n <= 100_000 {
                let cpu = topk_cpu_oracle(&corpus, d);
                let mut rt = RoundTrip::new(&gpu, 1000)?;
                let mut out = Vec::new();
                let mut tr = Vec::new();
                for _ in 0..10 {
                    let t = Instant::now();
                    rt.run(&dq, &cpu, 100, &mut out)?;
                    tr.push(t.elapsed().as_secs_f64() * 1e3);
                }
                let (m, _, _) = stats(tr);
                println!(
                    "{}",
                    serde_json::json!({"kind": "roundtrip_oracle", "n": n, "d": d, "k": 100,
                        "median_ms": m, "correct": same_bits(&out, &expect[..100.min(n)])})
                );
            }
        }
    }
    Ok(())
}

/// Host-clock times of `trials` batches of `q` queries (top `k`) after one
/// untimed batch, whose first and last answers are checked bit for bit. With
/// `device`, the same queries are also searched from device memory
/// (`search_batch_device_slice`), alternating with the host batches; every
/// device answer must equal the host batch's. One JSON line per source.
fn time_batch(
    gpu: &CudaRetriever,
    corpus: &[f32],
    d: usize,
    q: usize,
    k: usize,
    trials: usize,
    device: bool,
) -> Result<Vec<serde_json::Value>, Box<dyn std::error::Error>> {
    let n = corpus.len() / d;
    let queries = gaussian_rows(q, d, 9);
    let first = gpu.search_batch_rowmajor(&queries, k)?;
    let ok = same_bits(&first[0], &reference(corpus, d, &queries[..d], k))
        && same_bits(
            &first[q - 1],
            &reference(corpus, d, &queries[(q - 1) * d..], k),
        );
    let dev = if device {
        Some(cust::memory::DeviceBuffer::from_slice(&queries)?)
    } else {
        None
    };
    let same_as_host = |r: &[Vec<Neighbor>]| {
        r.len() == first.len() && r.iter().zip(&first).all(|(a, b)| same_bits(a, b))
    };
    let mut dev_ok = true;
    if let Some(dev) = &dev {
        dev_ok = same_as_host(&gpu.search_batch_device_slice(dev, None, k)?);
    }
    let mut tb = Vec::with_capacity(trials);
    let mut td = Vec::with_capacity(trials);
    for _ in 0..trials {
        let t = Instant::now();
        let r = gpu.search_batch_rowmajor(&queries, k)?;
        tb.push(t.elapsed().as_secs_f64() * 1e3);
        std::hint::black_box(r);
        if let Some(dev) = &dev {
            let t = Instant::now();
            let r = gpu.search_batch_device_slice(dev, None, k)?;
            td.push(t.elapsed().as_secs_f64() * 1e3);
            dev_ok &= same_as_host(&r);
        }
    }
    let line = |source: &str, times: Vec<f64>, correct: bool| {
        let (bm, bmin, bmax) = stats(times);
        serde_json::json!({"kind": "batch", "queries": source, "dtype": gpu.dtype().as_str(), "n": n, "d": d, "k": k, "q": q,
        "trials": trials, "median_ms": bm, "min_ms": bmin, "max_ms": bmax, "correct": correct,
        "filter_rows": gpu.config().tuning.filter_rows,
        "filter_queries": gpu.config().tuning.filter_queries, "filter_reruns": gpu.filter_reruns(),
        "filter_max_k": gpu.config().tuning.filter_max_k,
        "batch_scratch": gpu.config().tuning.batch_scratch,
        "wgmma_bounds": gpu.config().tuning.wgmma_bounds,
        "filter_sample": gpu.config().tuning.filter_sample,
        "filter_emit": gpu.config().tuning.filter_emit,
        "filter_emit_rows": gpu.config().tuning.filter_emit_rows, "filter_listed": gpu.filter_listed(),
        "shadow_bounds": gpu.shadow_bounds(), "filter_shadowed": gpu.filter_shadowed(),
        "qps": q as f64 * 1e3 / bm})
    };
    let mut lines = vec![line("host", tb, ok)];
    if device {
        lines.push(line("device", td, ok && dev_ok));
    }
    Ok(lines)
}

fn topk_cpu_oracle(corpus: &[f32], d: usize) -> topk_cpu::Oracle {
    let view = ndarray::ArrayView2::from_shape((corpus.len() / d, d), corpus).expect("shape");
    topk_cpu::Oracle::new(view, Metric::Dot).expect("valid corpus")
}

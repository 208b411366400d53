//! The filtered batch's tensor-core bounds (docs/CONTRACTS.md §6) under near
//! ties: corpora whose rows differ by 2^-e of their size, so that from e
//! near 8 on every row's score lies within the bounds' width of the K-th and
//! the list of rows to rescore is long, and past the list's capacity the
//! chunk runs again on the canonical path. Either bound kernel (`wgmma` on
//! compute capability 9.0, `mma.sync` everywhere), over rows stored as f32,
//! f16 or bf16 (whose `wgmma` bounds multiply the stored halves by each
//! query scaled and rounded to the same type), must give the oracle's bytes
//! over the same store.
//!
//! f32 rows on Hopper have their bounds from an f16 copy of the rows, each
//! row scaled by a power of two (`Tuning::shadow_bounds`): the property test
//! turns it on and off, and a corpus of rows of every magnitude (rows whose
//! largest value lies outside the copy's band, subnormal values, rows mixing
//! values 2^28 apart) holds it to the oracle.
//!
//! Device cases skip with a printed reason where there is no device, and
//! fail instead under `TOPK_REQUIRE_GPU=1`. `TOPK_GPU_CASES` sets the number
//! of property cases (default 24).

use ndarray::ArrayView2;
use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use topk_core::{Dtype, Metric, Retriever, RowStore};
use topk_cpu::Oracle;
use topk_cuda::{CudaConfig, CudaRetriever, PlanPath};
use topk_testkit::corpora::bitwise_diff;
use topk_testkit::{gpu_or_skip, gpu_runner};

/// `n` rows b + 2^-e u (b one random row, u uniform in [-1, 1) per value;
/// e may be negative),
/// every `dup`-th row a copy of the one before (exact ties, ranked by row).
fn near_ties(seed: u64, n: usize, d: usize, e: i32, dup: usize) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let base: Vec<f32> = (0..d).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    let step = 2f32.powi(-e);
    let mut v = Vec::with_capacity(n * d);
    for r in 0..n {
        if dup > 0 && r > 0 && r % dup == 0 {
            v.extend_from_within((r - 1) * d..r * d);
        } else {
            v.extend(
                base.iter()
                    .map(|&b| b + step * rng.random_range(-1.0f32..1.0)),
            );
        }
    }
    v
}

/// Queries: random rows of their own, and rows of the corpus itself.
fn queries(seed: u64, nq: usize, d: usize, corpus: &[f32]) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5bd1_e995);
    let n = corpus.len() / d;
    let mut q = Vec::with_capacity(nq * d);
    for i in 0..nq {
        if i % 3 == 0 {
            let r = rng.random_range(0..n);
            q.extend_from_slice(&corpus[r * d..(r + 1) * d]);
        } else {
            q.extend((0..d).map(|_| rng.random_range(-1.0f32..1.0)));
        }
    }
    q
}

/// The filtered path for every chunk, with or without `wgmma`, chunks of
/// 64 queries (`small_chunks`) or as many as the default scratch holds; the
/// threshold from a sample of the rows (the default) or from all of them;
/// the Hopper listing where it applies (`list`, the default) or not.
fn filtered_with(wgmma: bool, small_chunks: bool, sample: bool, list: bool) -> CudaConfig {
    let mut c = CudaConfig::for_path(PlanPath::FilteredBatch);
    c.tuning.wgmma_bounds = wgmma;
    // The f16 copy of f32 rows at every D the copy takes (D % 8 == 0).
    c.tuning.shadow_min_dim = 0;
    if !sample {
        c.tuning.filter_sample = 1;
    }
    if !list {
        c.tuning.filter_emit = 0;
    }
    if small_chunks {
        c.tuning.batch_scratch = 0;
    }
    c
}

/// [`filtered_with`] with the Hopper listing where it applies.
fn filtered_as(wgmma: bool, small_chunks: bool, sample: bool) -> CudaConfig {
    filtered_with(wgmma, small_chunks, sample, true)
}

/// [`filtered_as`] with the default sampled threshold.
fn filtered(wgmma: bool, small_chunks: bool) -> CudaConfig {
    filtered_as(wgmma, small_chunks, true)
}

/// What a checked batch did: queries served by filtered chunks, chunks
/// run again on the canonical path, chunks whose rows the Hopper bound
/// kernel listed, and chunks bounded from the f16 copy of f32 rows.
struct Counts {
    filtered: u64,
    reruns: usize,
    listed: usize,
    shadowed: usize,
}

/// Every query of the batch against the oracle over the same store (`data`
/// rounded to `dtype`), bit for bit; the engine's count of chunks run again.
#[allow(clippy::too_many_arguments)]
fn check(
    data: &[f32],
    d: usize,
    dtype: Dtype,
    metric: Metric,
    config: CudaConfig,
    qs: &[f32],
    k: usize,
    ctx: &str,
) -> Result<usize, String> {
    check_counts(data, d, dtype, metric, config, qs, k, ctx).map(|c| c.reruns)
}

/// [`check`], with both of the engine's counts.
#[allow(clippy::too_many_arguments)]
fn check_counts(
    data: &[f32],
    d: usize,
    dtype: Dtype,
    metric: Metric,
    config: CudaConfig,
    qs: &[f32],
    k: usize,
    ctx: &str,
) -> Result<Counts, String> {
    let store = RowStore::from_f32(data.to_vec(), d, dtype).map_err(|e| format!("{ctx}: {e}"))?;
    let gpu = CudaRetriever::from_store(&store, metric, config)
        .map_err(|e| format!("{ctx}: engine: {e}"))?;
    let oracle = Oracle::from_store(store, metric).map_err(|e| format!("{ctx}: {e}"))?;
    let nq = qs.len() / d;
    let view = ArrayView2::from_shape((nq, d), qs).map_err(|e| e.to_string())?;
    let got = gpu
        .search_batch(view, k)
        .map_err(|e| format!("{ctx}: batch: {e}"))?;
    for (i, row) in got.iter().enumerate() {
        let want = oracle
            .search(&qs[i * d..(i + 1) * d], k)
            .map_err(|e| e.to_string())?;
        if let Some(diff) = bitwise_diff(row, &want) {
            return Err(format!("{ctx}: query {i}: {diff}"));
        }
    }
    Ok(Counts {
        filtered: gpu.path_counts().get(PlanPath::FilteredBatch),
        reruns: gpu.filter_reruns(),
        listed: gpu.filter_listed(),
        shadowed: gpu.filter_shadowed(),
    })
}

/// Whether the device runs the Hopper bounds, and so the Hopper listing.
fn hopper() -> bool {
    let store = RowStore::from_f32(vec![0.5; 8], 8, Dtype::F32).expect("store");
    CudaRetriever::from_store(&store, Metric::Dot, CudaConfig::default())
        .map(|g| g.info().compute_capability == (9, 0))
        .unwrap_or(false)
}

#[test]
fn near_tie_corpora_are_exact_with_either_bound_kernel() {
    let Some(mut runner) = gpu_runner(24) else {
        return;
    };
    let strategy = (
        any::<u64>(),
        1000usize..5000,
        prop::sample::select(vec![36usize, 64, 100, 128, 384]),
        4i32..24,
        prop::sample::select(vec![0usize, 2, 7]),
        1usize..200,
        prop::sample::select(vec![1usize, 10, 100, 200, 1000, 1500, 2048]),
        0usize..3,
        (
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
        ),
        prop::sample::select(vec![Dtype::F32, Dtype::F16, Dtype::Bf16]),
    );
    runner
        .run(&strategy, |(seed, n, d, e, dup, nq, k, m, flags, dtype)| {
            let (wgmma, small, sample, list, shadow) = flags;
            let metric = [Metric::Dot, Metric::Cosine, Metric::L2][m];
            let data = near_ties(seed, n, d, e, dup);
            let qs = queries(seed, nq, d, &data);
            let ctx = format!(
                "n {n} d {d} e {e} dup {dup} nq {nq} k {k} {metric} {dtype} wgmma {wgmma} \
                 small {small} sample {sample} list {list} shadow {shadow}"
            );
            let mut config = filtered_with(wgmma, small, sample, list);
            config.tuning.shadow_bounds = shadow;
            check(&data, d, dtype, metric, config, &qs, k, &ctx)
                .map(|_| ())
                .map_err(TestCaseError::fail)
        })
        .expect("near ties");
}

#[test]
fn long_lists_are_rescored_and_overflowing_ones_run_again() {
    if gpu_or_skip().is_none() {
        return;
    }
    let d = 128;
    for wgmma in [true, false] {
        for small in [true, false] {
            let config = || filtered(wgmma, small);
            // Rows four times as far from each other as from their common
            // part: the bounds separate the top K, no chunk runs again.
            // (Rows 2^-4 apart already list thousands of rows for K = 100
            // among 20,000, and some queries more than the list holds.)
            let data = near_ties(11, 20_000, d, -2, 0);
            let qs = queries(12, 130, d, &data);
            let ctx = format!("spread rows, wgmma {wgmma} small {small}");
            let reruns =
                check(&data, d, Dtype::F32, Metric::Dot, config(), &qs, 100, &ctx).expect("spread");
            assert_eq!(reruns, 0, "{ctx}: chunks ran again");
            // K = 2,048, the filtered path's largest: the best K and the
            // rows near the K-th fit the 4,096 a query lists.
            let ctx2 = format!("{ctx} k 2048");
            let got = check_counts(
                &data,
                d,
                Dtype::F32,
                Metric::Dot,
                config(),
                &qs,
                2048,
                &ctx2,
            )
            .expect("spread k 2048");
            assert_eq!(got.filtered, 130, "{ctx2}: every query filtered");
            assert_eq!(got.reruns, 0, "{ctx2}: chunks ran again");
            // The same rows stored as halves: their bounds separate too.
            for dtype in [Dtype::F16, Dtype::Bf16] {
                let ctx = format!("{ctx} {dtype}");
                let reruns = check(&data, d, dtype, Metric::Dot, config(), &qs, 100, &ctx)
                    .expect("spread halves");
                assert_eq!(reruns, 0, "{ctx}: chunks ran again");
            }
            // 4,000 rows within 2^-22 of each other: every row can reach the
            // top K, so every one is listed (the list's capacity is 4,096)
            // or, where tied lower bounds stop the first selection, the
            // chunk runs again; exact either way.
            let data = near_ties(13, 4_000, d, 22, 3);
            let qs = queries(14, 70, d, &data);
            let ctx = format!("4,000 near ties, wgmma {wgmma} small {small}");
            check(
                &data,
                d,
                Dtype::F32,
                Metric::Cosine,
                config(),
                &qs,
                10,
                &ctx,
            )
            .expect("long lists");
            // 6,000 such rows: more than the list holds; every chunk runs
            // again on the canonical path, still exact.
            let data = near_ties(15, 6_000, d, 22, 0);
            let qs = queries(16, 70, d, &data);
            let ctx = format!("6,000 near ties, wgmma {wgmma} small {small}");
            let reruns = check(&data, d, Dtype::F32, Metric::L2, config(), &qs, 1000, &ctx)
                .expect("overflow");
            assert!(reruns > 0, "{ctx}: an overflowing list must run again");
            // Every sampled row (every 8th, K = 100) far from the queries,
            // the others near them: the sample's K-th bound is far below
            // the answer's, the list overflows and the chunk runs again,
            // still exact.
            let mut data = near_ties(17, 20_000, d, 6, 0);
            for r in (0..20_000).step_by(8) {
                data[r * d..(r + 1) * d].iter_mut().for_each(|v| *v = -*v);
            }
            let qs: Vec<f32> = (0..70)
                .flat_map(|i| data[(8 * i + 1) * d..(8 * i + 2) * d].to_vec())
                .collect();
            let ctx = format!("sampled rows far, wgmma {wgmma} small {small}");
            let got = check(&data, d, Dtype::F32, Metric::Dot, config(), &qs, 100, &ctx);
            assert!(
                got.expect("sampled far") > 0,
                "{ctx}: the list must overflow"
            );
        }
    }
}

/// Spread rows (`data`, queries `qs`) under each metric and storage type:
/// the oracle's bytes, no chunk run again, and (on Hopper) chunks listed by
/// the bound kernel.
fn spread_rows_are_listed(data: &[f32], d: usize, qs: &[f32], small: bool, hopper: bool) {
    for (metric, dtype, k) in [
        (Metric::Dot, Dtype::F32, 100),
        (Metric::Cosine, Dtype::F16, 10),
        (Metric::L2, Dtype::Bf16, 100),
        (Metric::L2, Dtype::F32, 1),
    ] {
        let ctx = format!("spread rows {metric} {dtype} k {k} small {small}");
        let got = check_counts(data, d, dtype, metric, filtered(true, small), qs, k, &ctx)
            .expect("listed");
        assert_eq!(got.reruns, 0, "{ctx}: chunks ran again");
        if hopper {
            assert!(
                got.listed > 0,
                "{ctx}: no chunk was listed by the bound kernel"
            );
        }
    }
}

/// [`sample_far`]'s rows and queries, K = 100: the oracle's bytes, and (on
/// Hopper) a listing that overflows its room so that its chunk runs again.
fn far_sample_overflows(far: &[f32], d: usize, qs: &[f32], small: bool, hopper: bool) {
    let ctx = format!("sampled rows far, small {small}");
    let config = filtered(true, small);
    let got =
        check_counts(far, d, Dtype::F32, Metric::Dot, config, qs, 100, &ctx).expect("overflow");
    if hopper {
        assert!(
            got.listed > 0 && got.reruns > 0,
            "{ctx}: the listing must overflow"
        );
    }
}

/// `n` near-tie rows with every `stride`-th row (the listing's sample at
/// K = 100) negated, far from the queries: 70 rows just past sampled ones.
fn sample_far(seed: u64, n: usize, d: usize, stride: usize) -> (Vec<f32>, Vec<f32>) {
    let mut far = near_ties(seed, n, d, 6, 0);
    for r in (0..n).step_by(stride) {
        far[r * d..(r + 1) * d].iter_mut().for_each(|v| *v = -*v);
    }
    let qs = (0..70)
        .flat_map(|i| far[(stride * i + 1) * d..(stride * i + 2) * d].to_vec())
        .collect();
    (far, qs)
}

#[test]
fn the_hopper_listing_gives_the_oracles_bytes_and_runs_again_when_it_overflows() {
    if gpu_or_skip().is_none() {
        return;
    }
    let hopper = hopper();
    if !hopper {
        println!("no Hopper bounds on this device: the listing cases run the other paths");
    }
    let (n, d) = (80_000, 128);
    for small in [true, false] {
        // Spread rows: every chunk is listed by the bound kernel (every
        // 32nd row sampled at K = 100, 2,500 rows; room for 20,000 listed
        // rows a query), none runs again, whatever the metric and storage.
        let data = near_ties(21, n, d, -2, 5);
        let qs = queries(22, 150, d, &data);
        spread_rows_are_listed(&data, d, &qs, small, hopper);
        // Every 32nd row (the sample) far from the queries, the others near
        // them: the sample's K-th bound is far below the answer's, the
        // listing overflows its room and every chunk runs again, exact.
        let (far, qs) = sample_far(23, n, d, 32);
        far_sample_overflows(&far, d, &qs, small, hopper);
        // Rows within 2^-22 of each other: every row is listed, and the
        // listing (or the list after it) overflows; exact either way.
        let ties = near_ties(25, n, d, 22, 3);
        let qs = queries(26, 70, d, &ties);
        let ctx = format!("near ties, small {small}");
        let got = check_counts(
            &ties,
            d,
            Dtype::F32,
            Metric::Cosine,
            filtered(true, small),
            &qs,
            10,
            &ctx,
        )
        .expect("near ties");
        assert!(got.reruns > 0, "{ctx}: an overflowing list must run again");
    }
}

#[test]
fn the_hopper_listing_on_a_small_corpus_gives_the_oracles_bytes() {
    if gpu_or_skip().is_none() {
        return;
    }
    if !hopper() {
        println!("no Hopper bounds on this device: the listing does not run");
        return;
    }
    // 40,000 rows: K = 100 samples every 16th row (room for 10,000 listed
    // rows a query); 150 queries, a full and a partial tile of 128, or
    // three chunks of 64, over about 2.4 tiles a block on 132 SMs (an odd
    // count for some blocks' second group). Small enough for the
    // sanitizers. (The near-tie property test runs the listing over
    // corpora of fewer tiles than the device has blocks.)
    let (n, d) = (40_000, 64);
    let data = near_ties(31, n, d, -2, 5);
    let qs = queries(32, 150, d, &data);
    let (far, far_qs) = sample_far(33, n, d, 16);
    for small in [true, false] {
        spread_rows_are_listed(&data, d, &qs, small, true);
        // The sample far from the queries: the listing overflows and every
        // chunk runs again, exact.
        far_sample_overflows(&far, d, &far_qs, small, true);
    }
}

/// `data` (rows of `d` values) with row r scaled by 2^e_r: mostly within
/// the f16 copy's band (largest value in [2^-60, 2^50)), every 997th row
/// below it (down to subnormal values), and every 13th row with its odd
/// columns 2^-28 of the others (values the copy holds as f16 subnormals).
fn every_magnitude(data: &mut [f32], d: usize, seed: u64) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let below = [-61, -75, -100, -135];
    for (r, row) in data.chunks_exact_mut(d).enumerate() {
        let e = if r % 997 == 5 {
            below[(r / 997) % below.len()]
        } else {
            rng.random_range(-59..44)
        };
        let scale = 2f64.powi(e);
        for (c, v) in row.iter_mut().enumerate() {
            let mixed = if r % 13 == 0 && c % 2 == 1 {
                2f64.powi(-28)
            } else {
                1.0
            };
            *v = (*v as f64 * scale * mixed) as f32;
        }
    }
}

#[test]
fn f32_rows_of_every_magnitude_have_f16_bounds_that_hold_every_score() {
    if gpu_or_skip().is_none() {
        return;
    }
    let hopper = hopper();
    if !hopper {
        println!("no Hopper bounds on this device: the f16 copy is not made, other paths run");
    }
    let (n, d) = (40_000, 64);
    // Spread rows (their bounds separate the top K) and near ties (long
    // lists), each row scaled by its own power of two: cosine does not see
    // the scales, dot and l2 do.
    for (spread, e) in [(true, -2), (false, 6)] {
        let mut data = near_ties(31 + e as u64, n, d, e, 0);
        every_magnitude(&mut data, d, 32);
        // Queries (random, or rows of the corpus: every third) brought to
        // a largest value in [1, 2), then scaled by 1, 2^-20 or 2^30; not
        // further down, where cosine's absolute term (2^-100 over the
        // norms' product) lists every row for a query and the lists
        // overflow (exact still, but run again).
        let mut qs = queries(33, 130, d, &data);
        for (i, q) in qs.chunks_exact_mut(d).enumerate() {
            let m = q.iter().fold(0f64, |m, &v| m.max((v as f64).abs()));
            let unit = if m > 0.0 {
                2f64.powi(-m.log2().floor() as i32)
            } else {
                1.0
            };
            let s = [1.0, 2f64.powi(-20), 2f64.powi(30)][(i / 3) % 3];
            q.iter_mut()
                .for_each(|v| *v = (*v as f64 * unit * s) as f32);
        }
        for (metric, k, list) in [
            (Metric::Cosine, 100, true),
            (Metric::Dot, 10, true),
            (Metric::L2, 100, true),
            (Metric::Cosine, 10, false),
        ] {
            let ctx = format!("spread {spread} {metric} k {k} list {list}");
            let config = filtered_with(true, false, true, list);
            let got = check_counts(&data, d, Dtype::F32, metric, config, &qs, k, &ctx)
                .expect("every magnitude");
            if hopper {
                assert!(
                    got.shadowed > 0,
                    "{ctx}: no chunk bounded from the f16 copy"
                );
                // L2 ranks a query's nearest rows; rows far shorter than
                // the query all lie within the bound's width of |q|^2 (a tie
                // the bounds cannot separate), so its lists may overflow
                // and the chunk run again, exact still.
                if spread && metric != Metric::L2 {
                    assert_eq!(got.reruns, 0, "{ctx}: chunks ran again");
                }
            } else {
                assert_eq!(got.shadowed, 0, "{ctx}: an f16 copy without Hopper bounds");
            }
            // The TF32 bounds of the same rows: the same bytes (both are
            // the oracle's).
            let mut tf32 = filtered_with(true, false, true, list);
            tf32.tuning.shadow_bounds = false;
            let got = check_counts(&data, d, Dtype::F32, metric, tf32, &qs, k, &ctx)
                .expect("TF32 bounds");
            assert_eq!(got.shadowed, 0, "{ctx}: f16 copy with shadow_bounds off");
        }
    }
}

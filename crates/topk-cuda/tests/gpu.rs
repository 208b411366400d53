//! The GPU engine against the CPU oracle, bit for bit, and its error paths.
//!
//! Device cases call [`gpu_or_skip`]: without a device (or in a build without
//! the `cuda` feature) they print why and pass, unless `TOPK_REQUIRE_GPU=1`,
//! under which a missing device fails the test (the GPU bundle sets it, so a
//! run on the GPU machine cannot pass by skipping). `TOPK_GPU_CASES` sets the
//! number of property cases (default 48).
// Without the `cuda` feature `DeviceQuery` is uninhabited, so the code after
// `upload_query` is statically unreachable there (the cases skip at run time).
#![cfg_attr(not(feature = "cuda"), allow(unused_variables, unreachable_code))]

use ndarray::ArrayView2;
use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use topk_core::{Metric, Neighbor, Retriever};
use topk_cpu::Oracle;
use topk_cuda::{CudaConfig, CudaError, CudaRetriever, PlanPath};
use topk_testkit::{gpu_or_skip, gpu_runner};

/// Corpora with forced ties: `kind` picks plain floats, small integers,
/// duplicated rows, negative zeros and subnormals, or zero rows.
fn corpus(seed: u64, n: usize, d: usize, kind: u8) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut v: Vec<f32> = (0..n * d)
        .map(|_| match kind {
            0 => rng.random_range(-1.0f32..1.0),
            1 | 2 => rng.random_range(-3i32..=3) as f32,
            3 => match rng.random_range(0..6) {
                0 => -0.0,
                1 => 0.0,
                2 => f32::from_bits(rng.random_range(1u32..0x007f_ffff)),
                3 => -f32::from_bits(rng.random_range(1u32..0x007f_ffff)),
                _ => rng.random_range(-2i32..=2) as f32 * 0.5,
            },
            _ => rng.random_range(-1.0f32..1.0),
        })
        .collect();
    if kind == 2 && n > 1 {
        // Duplicate rows: every row copies one of the first few.
        let distinct = (n / 4).max(1);
        for i in distinct..n {
            let src = rng.random_range(0..distinct);
            v.copy_within(src * d..(src + 1) * d, i * d);
        }
    }
    if kind == 4 {
        for i in (0..n).step_by(3) {
            v[i * d..(i + 1) * d].fill(0.0);
        }
    }
    v
}

fn query_like(seed: u64, d: usize, kind: u8) -> Vec<f32> {
    let mut q = corpus(seed ^ 0x9e37_79b9, 1, d, if kind == 4 { 0 } else { kind });
    if kind == 4 && seed % 5 == 0 {
        q.fill(0.0); // zero query under cosine: every score -inf
    }
    q
}

fn assert_same(got: &[Neighbor], want: &[Neighbor], ctx: &str) {
    assert_eq!(got.len(), want.len(), "{ctx}: result count");
    for (r, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            g.index == w.index && g.score.to_bits() == w.score.to_bits(),
            "{ctx}: rank {r}: gpu ({}, {:?} bits {:#x}) != oracle ({}, {:?} bits {:#x})",
            g.index,
            g.score,
            g.score.to_bits(),
            w.index,
            w.score,
            w.score.to_bits()
        );
    }
}

fn engine(data: &[f32], d: usize, metric: Metric, config: CudaConfig) -> (CudaRetriever, Oracle) {
    let gpu = CudaRetriever::from_rowmajor(data.to_vec(), d, metric, config).expect("gpu engine");
    let oracle = Oracle::from_rowmajor(data.to_vec(), d, metric).expect("oracle");
    (gpu, oracle)
}

/// Asserts that `path` served at least one query of `gpu`.
fn assert_ran(gpu: &CudaRetriever, path: PlanPath, ctx: &str) {
    let counts = gpu.path_counts();
    assert!(
        counts.get(path) > 0,
        "{ctx}: path {path} ran nothing ({counts:?})"
    );
}

/// A configuration whose tuning makes `path` serve what the shape allows,
/// with the limits given.
fn config_for(path: PlanPath, set: impl FnOnce(&mut CudaConfig)) -> CudaConfig {
    let mut c = CudaConfig::for_path(path);
    set(&mut c);
    c
}

#[test]
fn bitwise_equal_to_the_oracle_on_tied_corpora() {
    let Some(mut runner) = gpu_runner(48) else {
        return;
    };
    let strategy = (
        any::<u64>(),
        1usize..400,
        prop_oneof![1usize..40, 60usize..140],
        0u8..5,
        0usize..3,
        prop_oneof![1usize..10, 1usize..420],
        0..PlanPath::ALL.len(),
    );
    runner
        .run(&strategy, |(seed, n, d, kind, m, k, p)| {
            let metric = Metric::ALL[m];
            let path = PlanPath::ALL[p];
            let data = corpus(seed, n, d, kind);
            let (gpu, oracle) = engine(&data, d, metric, CudaConfig::for_path(path));
            let ctx =
                format!("seed {seed} n {n} d {d} kind {kind} metric {metric} k {k} path {path}");
            // Host query, single.
            let q = query_like(seed, d, kind);
            let want = oracle.search(&q, k).expect("oracle search");
            let got = gpu.search(&q, k).expect("gpu search");
            assert_same(&got, &want, &format!("{ctx} host"));
            // Device-resident query.
            let dq = gpu.upload_query(&q).expect("upload");
            let mut dev = Vec::new();
            gpu.search_device(&dq, k, &mut dev).expect("device search");
            assert_same(&dev, &want, &format!("{ctx} device"));
            // Batch: corpus rows as queries (exact self-matches and ties),
            // in turn small and large enough for either batch shape.
            let nq = n.min(if seed % 2 == 0 { 11 } else { 57 });
            let qs = ArrayView2::from_shape((nq, d), &data[..nq * d]).expect("shape");
            let got_b = gpu.search_batch(qs, k).expect("gpu batch");
            for (i, row) in got_b.iter().enumerate() {
                let want_i = oracle.search(&data[i * d..(i + 1) * d], k).expect("oracle");
                assert_same(row, &want_i, &format!("{ctx} batch query {i}"));
            }
            // The path asked for ran wherever the shape allows it: D is
            // always below the histogram path's, a batch of one query is
            // planned as a single query, host selection needs K >= 2 and
            // the filter D % 4 == 0.
            let allowed = match path {
                PlanPath::HistGather => false,
                PlanPath::HostSelect => k.min(n) >= 2,
                PlanPath::CanonicalBatch => nq >= 2,
                PlanPath::FilteredBatch => d % 4 == 0,
                _ => true,
            };
            if allowed {
                assert_ran(&gpu, path, &ctx);
            }
            Ok(())
        })
        .expect("property");
}

#[test]
fn large_k_and_k_past_n_and_heavy_ties() {
    if gpu_or_skip().is_none() {
        return;
    }
    for &path in PlanPath::ALL {
        for (kind, n, d) in [(1u8, 5000usize, 37usize), (0, 9000, 64), (2, 6000, 33)] {
            for metric in Metric::ALL {
                let data = corpus(kind as u64 + 11, n, d, kind);
                let (gpu, oracle) = engine(&data, d, metric, CudaConfig::for_path(path));
                let q = query_like(3, d, kind);
                for k in [1, 100, 2047, 2048, 2049, 4100, n - 1, n, n + 5] {
                    let want = oracle.search(&q, k).expect("oracle");
                    let got = gpu.search(&q, k).expect("gpu");
                    assert_same(
                        &got,
                        &want,
                        &format!("kind {kind} n {n} d {d} {metric} k {k} path {path}"),
                    );
                }
            }
        }
        // Every row identical: all N scores tie, far past the device's candidate cap.
        let (n, d) = (10_000, 48);
        let row: Vec<f32> = (0..d).map(|i| (i % 5) as f32 - 2.0).collect();
        let data: Vec<f32> = row.iter().copied().cycle().take(n * d).collect();
        let (gpu, oracle) = engine(&data, d, Metric::Dot, CudaConfig::for_path(path));
        for k in [1, 10, 1000] {
            assert_same(
                &gpu.search(&row, k).expect("gpu"),
                &oracle.search(&row, k).expect("oracle"),
                &format!("all-tied k {k} path {path}"),
            );
        }
    }
}

#[test]
fn crowded_threshold_bin_is_refined_exactly() {
    if gpu_or_skip().is_none() {
        return;
    }
    // 10,000 distinct scores inside one level-1 bin ([1, 1.125): same sign,
    // exponent and top three mantissa bits), more than the candidate buffer
    // holds, so the level-2 histogram must narrow them; 300 rows above the
    // bin; a few exact ties inside it. D = 1 and query [1]: score = value.
    let mut values: Vec<f32> = (0..10_000u32)
        .map(|i| 1.0 + ((i * 7919) % 10_000) as f32 * (1.0 / 131_072.0))
        .collect();
    values.extend((0..300u32).map(|i| 2.0 + i as f32 / 1024.0));
    values.extend([1.0 + 17.0 / 131_072.0; 5]);
    for &path in PlanPath::ALL {
        for metric in [Metric::Dot, Metric::L2] {
            let (gpu, oracle) = engine(&values, 1, metric, CudaConfig::for_path(path));
            for k in [1, 100, 299, 300, 301, 1000, 2048, 4000] {
                assert_same(
                    &gpu.search(&[1.0], k).expect("gpu"),
                    &oracle.search(&[1.0], k).expect("oracle"),
                    &format!("crowded bin {metric} k {k} path {path}"),
                );
            }
        }
    }
}

#[test]
fn many_blocks_and_batches_past_one_chunk() {
    if gpu_or_skip().is_none() {
        return;
    }
    let (n, d) = (200_000, 96);
    let data = corpus(5, n, d, 0);
    // No scratch beyond the 64-query minimum: a 70-query batch is two chunks.
    let opts = config_for(PlanPath::CanonicalBatch, |c| c.tuning.batch_scratch = 0);
    let (gpu, oracle) = engine(&data, d, Metric::Cosine, opts);
    let nq = 70; // more than one 64-query chunk
    let queries = corpus(6, nq, d, 0);
    let qs = ArrayView2::from_shape((nq, d), &queries[..]).expect("shape");
    let got = gpu.search_batch(qs, 100).expect("batch");
    for i in [0, 1, 63, 64, 69] {
        let want = oracle
            .search(&queries[i * d..(i + 1) * d], 100)
            .expect("oracle");
        assert_same(&got[i], &want, &format!("batch query {i}"));
        let single = gpu
            .search(&queries[i * d..(i + 1) * d], 100)
            .expect("single");
        assert_same(&single, &want, &format!("single query {i}"));
    }
    // A dimension past the single-query kernel's shared-memory limit.
    let (n2, d2) = (300, 17_001);
    let data2 = corpus(8, n2, d2, 0);
    let q2 = query_like(9, d2, 0);
    for path in [PlanPath::SmallSelect, PlanPath::HistGather] {
        let (gpu2, oracle2) = engine(&data2, d2, Metric::L2, CudaConfig::for_path(path));
        assert_same(
            &gpu2.search(&q2, 17).expect("gpu"),
            &oracle2.search(&q2, 17).expect("oracle"),
            &format!("D = 17001 {path}"),
        );
        assert_ran(&gpu2, path, "D = 17001");
    }
    // A wide dimension on the one-launch path where the device fits its
    // shared memory (query and tiles), else on the separate kernels.
    let (n3, d3) = (3000, 6000);
    let data3 = corpus(10, n3, d3, 0);
    let (gpu3, oracle3) = engine(
        &data3,
        d3,
        Metric::Dot,
        CudaConfig::for_path(PlanPath::OneLaunch),
    );
    let q3 = query_like(11, d3, 0);
    assert_same(
        &gpu3.search(&q3, 40).expect("gpu"),
        &oracle3.search(&q3, 40).expect("oracle"),
        "D = 6000",
    );
}

#[test]
fn batch_turns_chunks_and_tie_overflows_are_exact() {
    if gpu_or_skip().is_none() {
        return;
    }
    // Turns of 100 staged queries, each scored in chunks of 64 (no scratch
    // beyond the minimum): 150 queries make chunks of 64 + 36, then 50. Half
    // the rows are one row repeated, so a query scoring that row near the
    // top ties past the device's candidate cap, and the host must select
    // from its scores after later chunks have overwritten the score buffer.
    let (n, d) = (6000, 48);
    let mut data = corpus(31, n, d, 1);
    for i in 1..n / 2 {
        data.copy_within(0..d, i * d);
    }
    let nq = 150;
    let queries: Vec<f32> = (0..nq)
        .flat_map(|i| {
            let row = (i * 37) % n;
            data[row * d..(row + 1) * d].to_vec()
        })
        .collect();
    let qs = ArrayView2::from_shape((nq, d), &queries[..]).expect("shape");
    for (metric, filter_rows) in [
        (Metric::Dot, usize::MAX),
        (Metric::Cosine, usize::MAX),
        (Metric::Dot, 0),
        (Metric::L2, 0),
    ] {
        let opts = config_for(PlanPath::CanonicalBatch, |c| {
            c.max_batch = 100;
            c.tuning.batch_scratch = 0;
            c.tuning.filter_rows = filter_rows;
            c.tuning.filter_queries = 0;
        });
        let (gpu, oracle) = engine(&data, d, metric, opts);
        for k in [10, 1000, 2049] {
            let got = gpu.search_batch(qs, k).expect("batch");
            assert_eq!(got.len(), nq);
            for (i, row) in got.iter().enumerate() {
                let want = oracle
                    .search(&queries[i * d..(i + 1) * d], k)
                    .expect("oracle");
                assert_same(
                    row,
                    &want,
                    &format!("{metric} filter {filter_rows} k {k} query {i}"),
                );
            }
        }
    }
}

#[test]
fn batch_shapes_partial_chunks_and_wide_batches_are_exact() {
    if gpu_or_skip().is_none() {
        return;
    }
    // Batches of both resident-query shapes (at most 48 queries take the
    // 16-query one, 49..64 the 32-query one), D with a partial last chunk
    // and D % 4 != 0, and a D whose queries no longer fit shared memory
    // (the general batch kernel).
    for (d, metric, kind) in [
        (1000usize, Metric::Dot, 1u8),
        (515, Metric::Cosine, 0),
        (1023, Metric::L2, 2),
        (3000, Metric::Dot, 0),
    ] {
        let n = 3001;
        let data = corpus(d as u64, n, d, kind);
        let opts = config_for(PlanPath::CanonicalBatch, |c| {
            c.tuning = CudaConfig::default().tuning;
            c.tuning.filter_rows = if kind == 0 { 0 } else { usize::MAX };
            c.tuning.filter_queries = 0;
        });
        let (gpu, oracle) = engine(&data, d, metric, opts);
        for nq in [1usize, 16, 17, 48, 49, 64] {
            let queries = corpus(d as u64 + 1, nq, d, kind);
            let qs = ArrayView2::from_shape((nq, d), &queries[..]).expect("shape");
            let got = gpu.search_batch(qs, 10).expect("batch");
            for (i, row) in got.iter().enumerate() {
                let want = oracle
                    .search(&queries[i * d..(i + 1) * d], 10)
                    .expect("oracle");
                assert_same(row, &want, &format!("d {d} {metric} nq {nq} query {i}"));
            }
        }
    }
}

#[test]
fn filtered_batches_are_exact_and_fall_back_where_bounds_tie() {
    if gpu_or_skip().is_none() {
        return;
    }
    // Plain floats: the tensor-core bounds separate the top K, so no chunk
    // runs again; 70 queries are two chunks (no scratch beyond 64 queries),
    // D from a partial 32-column stage to several, every metric, K up to
    // the filtered path's 1,024 and past it to max_k (each K's answer is a
    // prefix of the largest one's).
    let ks = [1usize, 10, 100, 1000, 1024, 2048];
    for (n, d, metric) in [
        (20_000usize, 36usize, Metric::Dot),
        (12_000, 384, Metric::Cosine),
        (9_000, 100, Metric::L2),
    ] {
        let data = corpus(n as u64, n, d, 0);
        let opts = config_for(PlanPath::FilteredBatch, |c| c.tuning.batch_scratch = 0);
        let (gpu, oracle) = engine(&data, d, metric, opts);
        let nq = 70;
        let queries = corpus(n as u64 + 1, nq, d, 0);
        let qs = ArrayView2::from_shape((nq, d), &queries[..]).expect("shape");
        let want: Vec<Vec<Neighbor>> = (0..nq)
            .map(|i| {
                oracle
                    .search(&queries[i * d..(i + 1) * d], ks[ks.len() - 1])
                    .expect("oracle")
            })
            .collect();
        for k in ks {
            let got = gpu.search_batch(qs, k).expect("batch");
            for (i, row) in got.iter().enumerate() {
                assert_same(
                    row,
                    &want[i][..k],
                    &format!("n {n} d {d} {metric} k {k} query {i}"),
                );
            }
        }
        assert_eq!(
            gpu.filter_reruns(),
            0,
            "n {n} d {d} {metric}: chunks ran again"
        );
        assert_ran(
            &gpu,
            PlanPath::FilteredBatch,
            &format!("n {n} d {d} {metric}"),
        );
    }
    // Every row the same: all lower bounds tie, the first selection cannot
    // finish on the device, and every chunk runs again, still exact.
    let (n, d) = (5_000, 64);
    let row: Vec<f32> = (0..d).map(|i| (i % 7) as f32 - 3.0).collect();
    let data: Vec<f32> = row.iter().copied().cycle().take(n * d).collect();
    let opts = CudaConfig::for_path(PlanPath::FilteredBatch);
    let (gpu, oracle) = engine(&data, d, Metric::Dot, opts);
    let queries = corpus(77, 5, d, 1);
    let qs = ArrayView2::from_shape((5, d), &queries[..]).expect("shape");
    for k in [1, 100, 2048] {
        let got = gpu.search_batch(qs, k).expect("batch");
        for (i, r) in got.iter().enumerate() {
            let want = oracle
                .search(&queries[i * d..(i + 1) * d], k)
                .expect("oracle");
            assert_same(r, &want, &format!("all rows equal k {k} query {i}"));
        }
    }
    assert!(gpu.filter_reruns() > 0, "tied bounds must send chunks back");
}

#[test]
fn reused_device_query_buffers_replay_exactly() {
    if gpu_or_skip().is_none() {
        return;
    }
    // One device buffer overwritten between searches (its second use builds
    // a graph that reads it in place, later ones replay it), on every
    // selection path, with and without graphs, across K values and more
    // buffers than are remembered, interleaved with host queries.
    for (p, &path) in PlanPath::ALL.iter().enumerate() {
        for graphs in [true, false] {
            let (n, d) = (20_000, 100);
            let data = corpus(21 + p as u64, n, d, 1);
            let opts = config_for(path, |c| c.tuning.graphs = graphs);
            let (gpu, oracle) = engine(&data, d, Metric::Cosine, opts);
            let q0 = query_like(1, d, 1);
            let mut bufs: Vec<_> = (0..6)
                .map(|_| gpu.upload_query(&q0).expect("upload"))
                .collect();
            let mut got = Vec::new();
            for round in 0..4u64 {
                for (b, buf) in bufs.iter_mut().enumerate() {
                    let q = query_like(100 * round + b as u64, d, 1);
                    gpu.overwrite_query(buf, &q).expect("overwrite");
                    for k in [1, 10, 1 + (round as usize * 37) % 300] {
                        let want = oracle.search(&q, k).expect("oracle");
                        gpu.search_device(buf, k, &mut got).expect("device");
                        let ctx =
                            format!("path {path} graphs {graphs} round {round} buf {b} k {k}");
                        assert_same(&got, &want, &ctx);
                        // Only the first two buffers are reused often enough
                        // to keep graphs; a host query in between uses the
                        // slot's own graph.
                        if b < 2 {
                            gpu.search_device(buf, k, &mut got).expect("device again");
                            assert_same(&got, &want, &format!("{ctx} again"));
                            let host = gpu.search(&q, k).expect("host");
                            assert_same(&host, &want, &format!("{ctx} host"));
                        }
                    }
                }
            }
            // A wrong length is a typed error, and nothing changes.
            let err = gpu
                .overwrite_query(&mut bufs[0], &q0[..d - 1])
                .expect_err("short query");
            assert!(err.to_string().contains(&format!("{}", d - 1)), "{err}");
        }
    }
}

#[test]
fn concurrent_searches_from_several_threads() {
    if gpu_or_skip().is_none() {
        return;
    }
    let (n, d) = (20_000, 64);
    let data = corpus(21, n, d, 1);
    let (gpu, oracle) = engine(&data, d, Metric::L2, CudaConfig::default());
    let queries: Vec<Vec<f32>> = (0..8).map(|i| query_like(100 + i, d, 1)).collect();
    let expected: Vec<Vec<Neighbor>> = queries
        .iter()
        .map(|q| oracle.search(q, 50).expect("oracle"))
        .collect();
    std::thread::scope(|s| {
        for t in 0..6 {
            let (gpu, queries, expected) = (&gpu, &queries, &expected);
            s.spawn(move || {
                let mut out = Vec::new();
                for round in 0..40 {
                    let i = (t + round) % queries.len();
                    gpu.search_into(&queries[i], 50, &mut out).expect("search");
                    assert_same(&out, &expected[i], &format!("thread {t} round {round}"));
                }
            });
        }
    });
}

#[test]
fn score_ids_matches_the_scalar_score() {
    if gpu_or_skip().is_none() {
        return;
    }
    let (n, d) = (3000, 70);
    let data = corpus(31, n, d, 3);
    for metric in Metric::ALL {
        let gpu = CudaRetriever::from_rowmajor(data.clone(), d, metric, CudaConfig::default())
            .expect("engine");
        let queries = corpus(32, 3, d, 3);
        let ids: Vec<u32> = vec![0, 5, 2999, 17, 17, 1, 2, 3, 1000];
        let offsets = [0usize, 3, 3, 9];
        let mut out = vec![0.0f32; ids.len()];
        gpu.score_ids(&queries, &ids, &offsets, &mut out)
            .expect("score_ids");
        for (q, w) in offsets.windows(2).enumerate() {
            for p in w[0]..w[1] {
                let i = ids[p] as usize;
                let want =
                    metric.score_scalar(&queries[q * d..(q + 1) * d], &data[i * d..(i + 1) * d]);
                assert_eq!(
                    out[p].to_bits(),
                    want.to_bits(),
                    "{metric} query {q} id {i}"
                );
            }
        }
        let err = gpu
            .score_ids(&queries[..d], &[3000], &[0, 1], &mut [0.0])
            .expect_err("id out of range");
        assert!(
            matches!(err, CudaError::RowIdOutOfRange { id: 3000, .. }),
            "{err}"
        );
    }
}

#[test]
fn bad_inputs_are_typed_errors() {
    if gpu_or_skip().is_none() {
        return;
    }
    let d = 8;
    let data = corpus(1, 50, d, 0);
    let gpu = CudaRetriever::from_rowmajor(data.clone(), d, Metric::Dot, CudaConfig::default())
        .expect("engine");
    let q = vec![0.5f32; d];
    assert!(matches!(gpu.search(&q, 0), Err(topk_core::Error::ZeroK)));
    assert!(matches!(
        gpu.search(&q[..d - 1], 3),
        Err(topk_core::Error::DimensionMismatch {
            got: 7,
            expected: 8,
            ..
        })
    ));
    let mut bad = q.clone();
    bad[3] = f32::NAN;
    assert!(matches!(
        gpu.search(&bad, 3),
        Err(topk_core::Error::NonFinite { column: 3, .. })
    ));
    let mut bad_corpus = data.clone();
    bad_corpus[2 * d + 1] = f32::INFINITY;
    let err = CudaRetriever::from_rowmajor(bad_corpus, d, Metric::Dot, CudaConfig::default())
        .expect_err("non-finite corpus");
    assert!(matches!(
        err,
        CudaError::Input(topk_core::Error::NonFinite { column: 1, .. })
    ));
    assert!(matches!(
        CudaRetriever::from_rowmajor(Vec::new(), d, Metric::Dot, CudaConfig::default()),
        Err(CudaError::Input(topk_core::Error::EmptyCorpus))
    ));
}

/// A corpus above the staged-upload threshold (256 MiB) streams through
/// pinned buffers with its values checked part by part: the engine answers
/// bit for bit as the oracle, and a bad value in a late part, or a row over
/// the overflow rule before it, is named exactly as the whole-corpus check
/// names it.
#[test]
fn large_corpora_stream_checked_and_exact() {
    if gpu_or_skip().is_none() {
        return;
    }
    let (n, d) = (72_000usize, 1024usize);
    let data = corpus(21, n, d, 1);
    let q: Vec<f32> = corpus(22, 1, d, 0);
    let oracle = Oracle::from_rowmajor(data.clone(), d, Metric::Dot).expect("oracle");
    let want = oracle.search(&q, 100).expect("oracle search");
    {
        // Scoped: its device memory is freed before the next engines.
        let gpu = CudaRetriever::from_rowmajor(data.clone(), d, Metric::Dot, CudaConfig::default())
            .expect("engine");
        assert_eq!(gpu.search(&q, 100).expect("gpu search"), want);
    }
    for (row, value) in [(n - 3, f32::NAN), (40_000, f32::NEG_INFINITY), (5, 3.0e38)] {
        let mut bad = data.clone();
        bad[row * d + 7] = value;
        let want = topk_core::validate::corpus(&bad, d).expect_err("the host check refuses it");
        let got = CudaRetriever::from_rowmajor(bad, d, Metric::Dot, CudaConfig::default())
            .expect_err("the engine refuses it");
        assert_eq!(
            got.to_string(),
            CudaError::Input(want).to_string(),
            "row {row}"
        );
    }
}

#[test]
fn no_device_path_is_a_clear_error() {
    // Runs everywhere: on a machine without a GPU (or a build without the
    // feature) construction must fail with a message a user can act on.
    let data = vec![1.0f32; 16];
    match CudaRetriever::from_rowmajor(data.clone(), 4, Metric::Dot, CudaConfig::default()) {
        Ok(gpu) => {
            assert_eq!(gpu.len(), 4);
            println!("a device is present: {:?}", gpu.info());
        }
        Err(e) => {
            let msg = e.to_string();
            println!("construction without a device: {msg}");
            assert!(
                matches!(
                    e,
                    CudaError::NotCompiled
                        | CudaError::NoDriver { .. }
                        | CudaError::NoDevice { .. }
                ),
                "unexpected error: {e:?}"
            );
            assert!(msg.contains("CUDA"), "{msg}");
            let core: topk_core::Error = e.into();
            assert!(core.to_string().starts_with("cuda backend:"), "{core}");
        }
    }
    let mut bad = CudaConfig::default();
    bad.max_k = 0;
    assert!(matches!(
        CudaRetriever::from_rowmajor(data, 4, Metric::Dot, bad),
        Err(CudaError::InvalidOption { name: "max_k", .. })
    ));
}

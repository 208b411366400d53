//! Half-width rows on the device (docs/CONTRACTS.md §14): an `f16` or
//! `bf16` store is held as it is stored, 16 bits a value, and every path of
//! the engine widens each value as it reads it. Each path, forced, must give
//! the oracle's bytes over the same store, for single queries and batches,
//! with forced ties (duplicate rows, and near-identical rows that round to
//! the same half) and every D remainder the copies handle differently.
//!
//! Device cases skip with a printed reason where there is no device, and
//! fail instead under `TOPK_REQUIRE_GPU=1`. `TOPK_GPU_CASES` sets the number
//! of property cases (default 24).

use ndarray::ArrayView2;
use proptest::prelude::*;
use topk_core::{Dtype, Metric, Neighbor, Retriever, RowStore};
use topk_cpu::Oracle;
use topk_cuda::{CudaConfig, CudaRetriever, PlanPath};
use topk_testkit::corpora::{self, bitwise_diff, Kind};
use topk_testkit::{gpu_or_skip, gpu_runner};

/// Value kinds every half type can hold (no huge values, which f16
/// cannot), with exact ties.
const KINDS: [Kind; 5] = [
    Kind::Uniform,
    Kind::SmallInt,
    Kind::Duplicate,
    Kind::Constant,
    Kind::Subnormal,
];

/// Rows b + 2^-e u: from e near 11 (f16) or 8 (bf16) on, most of them round
/// to the same stored row, so exact ties are everywhere.
fn near_ties(seed: u64, n: usize, d: usize, e: i32) -> Vec<f32> {
    let mut rng = corpora::Rng::new(seed);
    let base: Vec<f32> = (0..d).map(|_| rng.unit()).collect();
    let step = 2f32.powi(-e);
    (0..n * d)
        .map(|i| base[i % d] + step * rng.unit())
        .collect()
}

/// The oracle's answers over `store`, query by query.
fn oracle_answers(
    store: &RowStore,
    metric: Metric,
    qs: &[f32],
    k: usize,
) -> Result<Vec<Vec<Neighbor>>, String> {
    let oracle = Oracle::from_store(store.clone(), metric).map_err(|e| e.to_string())?;
    qs.chunks_exact(store.dim())
        .map(|q| oracle.search(q, k).map_err(|e| format!("oracle: {e}")))
        .collect()
}

/// One engine over `store` on `path`: every query against `want` (the
/// oracle's answers over the same store), bit for bit, one at a time and
/// as one batch.
fn check(
    store: &RowStore,
    metric: Metric,
    path: PlanPath,
    qs: &[f32],
    k: usize,
    want: &[Vec<Neighbor>],
    ctx: &str,
) -> Result<(), String> {
    let d = store.dim();
    let gpu = CudaRetriever::from_store(store, metric, CudaConfig::for_path(path))
        .map_err(|e| format!("{ctx}: engine: {e}"))?;
    if gpu.dtype() != store.dtype() {
        return Err(format!("{ctx}: the engine holds {}", gpu.dtype()));
    }
    for (i, (q, w)) in qs.chunks_exact(d).zip(want).enumerate() {
        let got = gpu
            .search(q, k)
            .map_err(|e| format!("{ctx}: query {i}: {e}"))?;
        if let Some(diff) = bitwise_diff(&got, w) {
            return Err(format!("{ctx}: single query {i}: {diff}"));
        }
    }
    let view = ArrayView2::from_shape((qs.len() / d, d), qs).map_err(|e| e.to_string())?;
    let got = gpu
        .search_batch(view, k)
        .map_err(|e| format!("{ctx}: batch: {e}"))?;
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        if let Some(diff) = bitwise_diff(g, w) {
            return Err(format!("{ctx}: batch query {i}: {diff}"));
        }
    }
    Ok(())
}

#[test]
fn every_path_over_half_width_rows_is_the_oracle_bit_for_bit() {
    let Some(mut runner) = gpu_runner(24) else {
        return;
    };
    let strategy = (
        any::<u64>(),
        1usize..3000,
        prop_oneof![
            1usize..9,
            Just(33usize),
            Just(128usize),
            Just(130usize),
            Just(384usize)
        ],
        any::<bool>(),
        0usize..3,
        0usize..PlanPath::ALL.len(),
        1usize..40,
        prop::sample::select(vec![1usize, 7, 100, 1000]),
        prop::option::of(6i32..14),
    );
    runner
        .run(&strategy, |(seed, n, d, bf16, m, p, nq, k, ties)| {
            let dtype = if bf16 { Dtype::Bf16 } else { Dtype::F16 };
            let metric = [Metric::Dot, Metric::Cosine, Metric::L2][m];
            let path = PlanPath::ALL[p];
            let data = match ties {
                Some(e) => near_ties(seed, n, d, e),
                None => corpora::corpus(seed, n, d, &KINDS),
            };
            let qs = corpora::queries(seed ^ 1, nq, d, &KINDS, &data);
            let store = RowStore::from_f32(data, d, dtype)
                .map_err(|e| TestCaseError::fail(format!("{dtype} store: {e}")))?;
            let ctx = format!("{dtype} {path} n {n} d {d} {metric} nq {nq} k {k} ties {ties:?}");
            let want = oracle_answers(&store, metric, &qs, k).map_err(TestCaseError::fail)?;
            check(&store, metric, path, &qs, k, &want, &ctx).map_err(TestCaseError::fail)
        })
        .expect("half-width rows");
}

/// Sizes where the paths run their grid-wide passes and the filtered batch
/// its tensor-core bounds (fed the widened halves, exact in TF32) over
/// several row tiles.
#[test]
fn large_half_width_corpora_agree_on_every_path() {
    if gpu_or_skip().is_none() {
        return;
    }
    for (dtype, seed) in [(Dtype::F16, 3u64), (Dtype::Bf16, 4)] {
        for (n, d) in [(60_000usize, 384usize), (20_000, 100)] {
            let data = corpora::shuffled_duplicates(seed, n, d, n / 3);
            let qs = corpora::queries(seed ^ 9, 20, d, &KINDS, &data);
            let store = RowStore::from_f32(data, d, dtype).expect("store");
            for (metric, k) in [
                (Metric::Dot, 10usize),
                (Metric::Cosine, 100),
                (Metric::L2, 1000),
            ] {
                let want = oracle_answers(&store, metric, &qs, k).expect("oracle");
                for &path in PlanPath::ALL {
                    let ctx = format!("{dtype} {path} n {n} d {d} {metric} k {k}");
                    check(&store, metric, path, &qs, k, &want, &ctx).expect("large corpus");
                }
            }
        }
    }
}

/// The stored bits reach the device unchanged: row r has a single nonzero
/// value, so its dot score with the unit query is the widened stored value
/// itself, on every path.
#[test]
fn stored_values_are_read_back_exactly() {
    if gpu_or_skip().is_none() {
        return;
    }
    for dtype in [Dtype::F16, Dtype::Bf16] {
        let d = 4;
        let values: Vec<f32> = (0..4096u32)
            .map(|i| dtype.round(((i as f32) - 2048.0) * 0.013_7))
            .collect();
        let data: Vec<f32> = values.iter().flat_map(|&v| [v, 0.0, 0.0, 0.0]).collect();
        let store = RowStore::from_f32(data, d, dtype).expect("store");
        for &path in PlanPath::ALL {
            let gpu = CudaRetriever::from_store(&store, Metric::Dot, CudaConfig::for_path(path))
                .expect("engine");
            let got = gpu.search(&[1.0, 0.0, 0.0, 0.0], 4096).expect("search");
            // -0.0 and 0.0 are one score (a sum of 0.0 + x * 0): compare
            // values, in total order.
            let order = |mut v: Vec<f32>| {
                v.iter_mut().for_each(|x| *x += 0.0);
                v.sort_by(f32::total_cmp);
                v.into_iter().map(f32::to_bits).collect::<Vec<u32>>()
            };
            let same = order(got.iter().map(|h| h.score).collect()) == order(values.clone());
            assert!(same, "{dtype} {path}: scores differ from the stored values");
        }
    }
}

/// The graph walk reads f32 rows: a half-width engine refuses a graph with
/// an error naming the storage type, before anything reaches the device.
#[test]
fn a_half_width_engine_refuses_a_graph_walk_naming_its_type() {
    if gpu_or_skip().is_none() {
        return;
    }
    let store = RowStore::from_f32(vec![1.0, 0.0, 0.0, 1.0], 2, Dtype::F16).expect("store");
    let gpu =
        CudaRetriever::from_store(&store, Metric::Dot, CudaConfig::default()).expect("engine");
    // Two nodes, each the other's only neighbour, one layer.
    let layout = topk_cuda::GraphLayout {
        layer0: &[1, 1, 1, 0],
        m0: 1,
        upper: &[],
        upper_offset: &[0, 0],
        levels: &[0, 0],
        m: 1,
        entry: 0,
    };
    match gpu.upload_graph(&layout) {
        Ok(_) => panic!("a half-width engine took a graph"),
        Err(e) => assert!(e.to_string().contains("stores f16"), "{e}"),
    }
}

/// A half-width resident corpus checks a whole call against its type
/// before anything changes: an upsert whose replaced row holds a value past
/// f16's range adds none of its new rows either.
#[test]
fn a_half_width_upsert_past_the_type_changes_nothing() {
    if gpu_or_skip().is_none() {
        return;
    }
    let mut c =
        topk_cuda::ResidentCorpus::with_dtype(2, Dtype::F16, Metric::Dot, CudaConfig::default(), 4)
            .expect("corpus");
    c.add(&[1, 2], &[1.0, 0.0, 0.0, 1.0]).expect("add");
    // Id 3 is new, id 1 is replaced by a row f16 cannot hold.
    let e = c
        .upsert(&[3, 1], &[0.5, 0.5, 1.0e5, 0.0])
        .expect_err("past f16's range");
    assert!(e.to_string().contains("does not fit f16"), "{e}");
    assert_eq!(c.len(), 2);
    assert!(!c.contains(3));
}

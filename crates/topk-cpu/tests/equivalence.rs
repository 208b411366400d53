//! `CpuRetriever` returns exactly the `Oracle`'s bytes (indices and score
//! bits), on every kernel path this CPU offers, for single queries and
//! batches, over random shapes rich in ties, signed zeros and subnormals.

use ndarray::{Array2, ArrayView2};
use proptest::prelude::*;
use topk_core::{Metric, Retriever};
use topk_cpu::{CpuRetriever, Kernels, Oracle};

use topk_testkit::corpora::{self as common, bitwise_diff, palette};

fn metric() -> impl Strategy<Value = Metric> {
    prop_oneof![Just(Metric::Dot), Just(Metric::Cosine), Just(Metric::L2)]
}

/// Most cases small; a few at the full N = 5,000 × D = 1,100.
fn shape() -> impl Strategy<Value = (usize, usize, usize)> {
    let n = prop_oneof![4 => 1usize..64, 3 => 64usize..700, 1 => 700usize..=5000];
    let d = prop_oneof![4 => 1usize..40, 3 => 40usize..200, 1 => 200usize..=1100];
    (n, d)
        .prop_filter("keep one case under ~2M values", |(n, d)| {
            n * d <= 2_000_000 || *n < 1200
        })
        .prop_flat_map(|(n, d)| (Just(n), Just(d), 1usize..=n + 5))
}

fn check(
    n: usize,
    d: usize,
    k: usize,
    metric: Metric,
    data: Vec<f32>,
    queries: Vec<f32>,
) -> Result<(), TestCaseError> {
    let corpus = Array2::from_shape_vec((n, d), data).unwrap();
    let qs = Array2::from_shape_vec((queries.len() / d, d), queries).unwrap();
    let oracle = Oracle::new(corpus.view(), metric).unwrap();
    let want: Vec<_> = qs
        .outer_iter()
        .map(|q| oracle.search(q.as_slice().unwrap(), k).unwrap())
        .collect();
    for kernels in Kernels::all_available() {
        let cpu = CpuRetriever::new(corpus.view(), metric)
            .unwrap()
            .with_kernels(kernels);
        let ctx = format!("N={n} D={d} K={k} {metric} path={}", kernels.path());
        for (i, q) in qs.outer_iter().enumerate() {
            let got = cpu.search(q.as_slice().unwrap(), k).unwrap();
            if let Some(diff) = bitwise_diff(&got, &want[i]) {
                return Err(TestCaseError::fail(format!("{ctx} query {i}: {diff}")));
            }
        }
        let batch = cpu.search_batch(qs.view(), k).unwrap();
        prop_assert_eq!(batch.len(), want.len());
        for (i, (got, want)) in batch.iter().zip(&want).enumerate() {
            if let Some(diff) = bitwise_diff(got, want) {
                return Err(TestCaseError::fail(format!(
                    "{ctx} batch query {i}: {diff}"
                )));
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(160))]

    #[test]
    fn cpu_equals_oracle_bitwise(
        (n, d, k) in shape(),
        metric in metric(),
        seed: u64,
        mask: u8,
        nq in 1usize..7,
    ) {
        // Kinds a backend accepts (bit 7, the overflow kind, it rejects).
        let kinds = palette(mask & 0x7f);
        let data = common::corpus(seed, n, d, &kinds);
        let queries = common::queries(seed, nq, d, &kinds, &data);
        check(n, d, k, metric, data, queries)?;
    }

    /// Only exact ties: rows of small integers, duplicates, constants and zeros,
    /// so that most scores are equal and the index decides the order.
    #[test]
    fn ties_are_broken_by_index_like_the_oracle(
        n in 1usize..400,
        d in 1usize..70,
        metric in metric(),
        seed: u64,
        mask in 0u8..16,
    ) {
        // bits 1..=4 of the palette: SmallInt, Duplicate, Constant, Zero.
        let kinds = palette(mask << 1 | 0b10);
        let data = common::corpus(seed, n, d, &kinds);
        let queries = common::queries(seed, 5, d, &kinds, &data);
        for k in [1, n.div_ceil(2), n, n + 3] {
            check(n, d, k, metric, data.clone(), queries.clone())?;
        }
    }
}

/// A large corpus crosses the parallel path (many tasks, merged selectors)
/// and the batch's several row blocks; K spans 1 to N.
#[test]
fn large_corpus_every_k() {
    let (n, d) = (20_000, 100);
    let kinds = palette(0b0000_0011);
    let data = common::corpus(7, n, d, &kinds);
    let queries = common::queries(7, 6, d, &kinds, &data);
    for metric in Metric::ALL {
        for k in [1, 10, 1000, n] {
            check(n, d, k, metric, data.clone(), queries.clone()).unwrap();
        }
    }
}

/// A transposed (column-major) corpus and batch are read by logical position.
#[test]
fn any_memory_layout() {
    let (n, d) = (300, 37);
    let data = common::corpus(3, n, d, &palette(0b11));
    let t = Array2::from_shape_vec((d, n), data).unwrap();
    let corpus: ArrayView2<f32> = t.t();
    let oracle = Oracle::new(corpus, Metric::Cosine).unwrap();
    let cpu = CpuRetriever::new(corpus, Metric::Cosine).unwrap();
    let qdata = common::queries(3, 9, n, &palette(1), &[]);
    let qt = Array2::from_shape_vec((n, 9), qdata).unwrap();
    let qs = qt.t().slice(ndarray::s![.., ..d]).to_owned();
    let qs_view = qt.t();
    let qs_view = qs_view.slice(ndarray::s![.., ..d]);
    let batch = cpu.search_batch(qs_view, 17).unwrap();
    for (i, q) in qs.outer_iter().enumerate() {
        let q: Vec<f32> = q.to_vec();
        let want = oracle.search(&q, 17).unwrap();
        assert_eq!(bitwise_diff(&batch[i], &want), None);
        assert_eq!(bitwise_diff(&cpu.search(&q, 17).unwrap(), &want), None);
    }
}

/// Regression: identical rows under L2 score `-0.0`; the key used for
/// selection folds it into `+0.0`, and the results must still carry `-0.0`.
#[test]
fn l2_exact_matches_keep_negative_zero() {
    let data = vec![1.0, 2.0, 1.0, 2.0, 3.0, 3.0];
    let cpu = CpuRetriever::from_rowmajor(data.clone(), 2, Metric::L2).unwrap();
    let oracle = Oracle::from_rowmajor(data, 2, Metric::L2).unwrap();
    let got = cpu.search(&[1.0, 2.0], 3).unwrap();
    assert_eq!(got[0].index, 0);
    assert_eq!(got[1].index, 1);
    assert_eq!(got[0].score.to_bits(), (-0.0_f32).to_bits());
    assert_eq!(
        bitwise_diff(&got, &oracle.search(&[1.0, 2.0], 3).unwrap()),
        None
    );
}

/// A dedicated thread pool gives the same bytes as the global one.
#[test]
fn dedicated_pool_same_results() {
    let (n, d) = (9000, 64);
    let data = common::corpus(11, n, d, &palette(0b11));
    let q = common::queries(11, 1, d, &palette(1), &data);
    let global = CpuRetriever::from_rowmajor(data.clone(), d, Metric::Dot).unwrap();
    let one = CpuRetriever::from_rowmajor(data, d, Metric::Dot)
        .unwrap()
        .with_threads(1)
        .unwrap();
    assert_eq!(one.threads(), 1);
    let a = global.search(&q, 50).unwrap();
    let b = one.search(&q, 50).unwrap();
    assert_eq!(bitwise_diff(&a, &b), None);
}

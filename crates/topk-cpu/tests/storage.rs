//! Half-width storage (docs/CONTRACTS.md §14): a corpus stored as f16 or
//! bf16 answers, on every kernel path and every search path (single
//! queries, cache-blocked batches, certified GEMM batches of 16 or more
//! queries), with exactly the oracle's bytes over the f32 corpus of rounded
//! values; and rounding is the scalar rule whatever the layout it came from.

use ndarray::{Array2, ArrayView2};
use proptest::prelude::*;
use topk_core::{Dtype, Metric, Retriever, RowStore};
use topk_cpu::{CpuRetriever, Kernels, Oracle};
use topk_testkit::corpora::{self as common, bitwise_diff, palette};

fn metric() -> impl Strategy<Value = Metric> {
    prop_oneof![Just(Metric::Dot), Just(Metric::Cosine), Just(Metric::L2)]
}

fn dtype() -> impl Strategy<Value = Dtype> {
    prop_oneof![Just(Dtype::F16), Just(Dtype::Bf16)]
}

/// `data` clamped to the range of `dtype`, as a caller storing it must.
fn fit(data: &[f32], dtype: Dtype) -> Vec<f32> {
    let max = dtype.max();
    data.iter().map(|&x| x.clamp(-max, max)).collect()
}

/// Runs every path of a `dtype` corpus against the oracle over the rounded
/// values, queries one by one and as one batch.
fn check(
    d: usize,
    k: usize,
    metric: Metric,
    dtype: Dtype,
    data: Vec<f32>,
    queries: Vec<f32>,
) -> Result<(), TestCaseError> {
    let rounded: Vec<f32> = data.iter().map(|&x| dtype.round(x)).collect();
    let Ok(oracle) = Oracle::from_rowmajor(rounded, d, metric) else {
        // Rounding broke the overflow rule: the store must refuse too.
        prop_assert!(RowStore::from_f32(data, d, dtype).is_err());
        return Ok(());
    };
    let qs = ArrayView2::from_shape((queries.len() / d, d), &queries[..]).unwrap();
    let want = oracle.search_batch(qs, k).unwrap();
    let store = RowStore::from_f32(data.clone(), d, dtype).unwrap();
    let stored_oracle = Oracle::from_store(store.clone(), metric).unwrap();
    prop_assert_eq!(stored_oracle.dtype(), dtype);
    for kernels in Kernels::all_available() {
        let cpu = CpuRetriever::from_store(store.clone(), metric)
            .unwrap()
            .with_kernels(kernels);
        let ctx = format!("D={d} K={k} {metric} {dtype} path={}", kernels.path());
        let batch = cpu.search_batch(qs, k).unwrap();
        for (i, q) in qs.outer_iter().enumerate() {
            let q = q.to_vec();
            for (what, got) in [
                ("single", cpu.search(&q, k).unwrap()),
                ("batch", batch[i].clone()),
                ("stored oracle", stored_oracle.search(&q, k).unwrap()),
            ] {
                if let Some(diff) = bitwise_diff(&got, &want[i]) {
                    return Err(TestCaseError::fail(format!(
                        "{ctx} {what} query {i}: {diff}"
                    )));
                }
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Random shapes and kinds (ties, subnormals, huge values), a few
    /// queries: the single and cache-blocked batch paths.
    #[test]
    fn stored_rows_answer_like_the_oracle_over_rounded_values(
        n in 1usize..600,
        d in 1usize..140,
        metric in metric(),
        dtype in dtype(),
        seed: u64,
        mask: u8,
        nq in 1usize..6,
    ) {
        let kinds = palette(mask & 0x7f);
        let data = fit(&common::corpus(seed, n, d, &kinds), dtype);
        let queries = common::queries(seed, nq, d, &kinds, &data);
        let k = 1 + (seed as usize % (n + 4));
        check(d, k, metric, dtype, data, queries)?;
    }

    /// Batches of 16 to 40 queries over 4K ≤ N rows take the certified GEMM
    /// path; its bounds hold on widened rows as on any f32 rows.
    #[test]
    fn certified_batches_over_stored_rows(
        n in 200usize..1500,
        d in 1usize..100,
        metric in metric(),
        dtype in dtype(),
        seed: u64,
        nq in 16usize..40,
        ties: bool,
    ) {
        let kinds = if ties { palette(0b0000_1110) } else { palette(0b0000_0011) };
        let data = fit(&common::corpus(seed, n, d, &kinds), dtype);
        let queries = common::queries(seed, nq, d, &kinds, &data);
        for k in [1, 10, n / 4] {
            check(d, k, metric, dtype, data.clone(), queries.clone())?;
        }
    }
}

/// Values near each other in f32 that round to the same half value become
/// exact ties once stored, broken by the smaller row like any tie.
#[test]
fn rounding_makes_ties_that_rank_by_row() {
    let base = 1.0_f32;
    let ulp = f32::EPSILON;
    // Four rows distinct in f32, equal after f16 and bf16 rounding.
    let data: Vec<f32> = (0..4).flat_map(|i| [base + i as f32 * ulp, 0.5]).collect();
    for dtype in [Dtype::F16, Dtype::Bf16] {
        let cpu = CpuRetriever::with_dtype(
            Array2::from_shape_vec((4, 2), data.clone()).unwrap().view(),
            Metric::Dot,
            dtype,
        )
        .unwrap();
        assert_eq!(cpu.dtype(), dtype);
        let got = cpu.search(&[1.0, 1.0], 4).unwrap();
        let rows: Vec<u32> = got.iter().map(|h| h.index).collect();
        assert_eq!(rows, vec![0, 1, 2, 3], "{dtype}: ties rank by row");
        assert!(got
            .windows(2)
            .all(|w| w[0].score.to_bits() == w[1].score.to_bits()));
        // In f32 the last row wins.
        let f32_cpu = CpuRetriever::from_rowmajor(data.clone(), 2, Metric::Dot).unwrap();
        assert_eq!(f32_cpu.search(&[1.0, 1.0], 1).unwrap()[0].index, 3);
    }
}

/// A strided (column-major) corpus rounds to the same store as its
/// row-major copy, through every constructor.
#[test]
fn every_layout_and_constructor_stores_the_same_rows() {
    let (n, d) = (2500, 19);
    let data = common::corpus(5, n, d, &palette(0b0010_0011));
    let t = Array2::from_shape_vec((d, n), data).unwrap();
    let view: ArrayView2<f32> = t.t();
    let rowmajor: Vec<f32> = view.iter().copied().collect();
    for dtype in [Dtype::F16, Dtype::Bf16] {
        let a = CpuRetriever::with_dtype(view, Metric::L2, dtype).unwrap();
        let b = CpuRetriever::from_store(
            RowStore::from_f32(rowmajor.clone(), d, dtype).unwrap(),
            Metric::L2,
        )
        .unwrap();
        let o = Oracle::with_dtype(view, Metric::L2, dtype).unwrap();
        assert_eq!(a.store(), b.store());
        assert_eq!(a.store().bytes(), n * d * 2);
        let q = &rowmajor[..d];
        let want = o.search(q, 25).unwrap();
        assert_eq!(bitwise_diff(&a.search(q, 25).unwrap(), &want), None);
        assert_eq!(bitwise_diff(&b.search(q, 25).unwrap(), &want), None);
    }
}

/// Bad input names the value: an f16 overflow, NaN, through the views too.
#[test]
fn unstorable_values_are_named() {
    let mut rows = Array2::from_elem((3, 4), 0.25_f32);
    rows[[1, 2]] = 7.0e4;
    let e = CpuRetriever::with_dtype(rows.view(), Metric::Dot, Dtype::F16).unwrap_err();
    let m = e.to_string();
    assert!(
        m.contains("corpus row 1") && m.contains("column 2") && m.contains("f16"),
        "{m}"
    );
    // bf16 holds it.
    CpuRetriever::with_dtype(rows.view(), Metric::Dot, Dtype::Bf16).unwrap();
    rows[[2, 0]] = f32::NAN;
    let e = Oracle::with_dtype(rows.t(), Metric::Dot, Dtype::Bf16).unwrap_err();
    assert!(e.to_string().contains("NaN"), "{e}");
}

#[test]
fn a_store_filled_without_checks_is_checked_when_searched() {
    // `push_checked` and `extend_le_bytes` trust their caller; the retrievers
    // taking such a store check it (NaN, infinities, the overflow rule).
    let big = 2f32.powi(51);
    for (row, what) in [
        ([f32::NAN, 1.0], "non-finite"),
        ([f32::INFINITY, 1.0], "non-finite"),
        ([big, 0.0], "squared norm"),
    ] {
        for dtype in [Dtype::F32, Dtype::Bf16] {
            let mut store = RowStore::empty(2, dtype).unwrap();
            store.push_checked(&[0.5, 0.5]);
            store.push_checked(&row);
            let e = Oracle::from_store(store.clone(), Metric::Dot).unwrap_err();
            assert!(e.to_string().contains(what), "{dtype}: {e}");
            let e = CpuRetriever::from_store(store.clone(), Metric::Dot).unwrap_err();
            assert!(e.to_string().contains(what), "{dtype}: {e}");
            let mut bytes = RowStore::empty(2, Dtype::F32).unwrap();
            bytes.extend_le_bytes(&row.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<_>>());
            assert!(CpuRetriever::from_store(bytes, Metric::Cosine).is_err());
        }
    }
}

//! The overflow rule (docs/CONTRACTS.md §4) on the oracle and the CPU backend
//! (every available kernel): a corpus or query of huge, tiny or subnormal
//! values is either rejected with `Error::NormTooLarge` (or `NonFinite`), or
//! every score is finite (cosine may give `-inf` for a zero computed norm)
//! and the CPU results equal the oracle's, bit for bit.

use ndarray::Array2;
use proptest::prelude::*;
use topk_core::{validate, Error, Metric, Neighbor, Retriever};
use topk_cpu::{CpuRetriever, Kernels, Oracle};

fn value() -> impl Strategy<Value = f32> {
    prop_oneof![
        Just(0.0_f32),
        -1.0f32..1.0,
        (-1.0f32..1.0).prop_map(|v| v * 3e38),
        (-1.0f32..1.0).prop_map(|v| v * 1e38),
        (-1.0f32..1.0).prop_map(|v| v * 2.0_f32.powi(48)),
        (-1.0f32..1.0).prop_map(|v| v * 1e-20),
        (0u32..(1 << 23)).prop_map(f32::from_bits),
    ]
}

/// `rows` vectors of `d` values; with `scale`, every vector is brought to a
/// squared norm of about the limit (0.95 to 1.05 of it).
fn rows(n: usize, d: usize) -> impl Strategy<Value = Vec<f32>> {
    (
        prop::collection::vec(value(), n * d),
        any::<bool>(),
        0.95f64..1.05,
    )
        .prop_map(move |(mut v, scale, f)| {
            if scale {
                for row in v.chunks_mut(d) {
                    let sq: f64 = row.iter().map(|&x| f64::from(x) * f64::from(x)).sum();
                    if sq > 0.0 {
                        let s = (validate::MAX_SQUARED_NORM / sq).sqrt() * f;
                        row.iter_mut().for_each(|x| *x = (f64::from(*x) * s) as f32);
                    }
                }
            }
            v
        })
}

fn case() -> impl Strategy<Value = (usize, Vec<f32>, Vec<f32>)> {
    (1usize..40, 1usize..24, 1usize..4).prop_flat_map(|(d, n, q)| (Just(d), rows(n, d), rows(q, d)))
}

fn bits(hits: &[Vec<Neighbor>]) -> Vec<Vec<(u32, u32)>> {
    hits.iter()
        .map(|h| h.iter().map(|n| (n.index, n.score.to_bits())).collect())
        .collect()
}

fn is_rule(e: &Error) -> bool {
    matches!(e, Error::NormTooLarge { .. } | Error::NonFinite { .. })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn huge_and_tiny_values_are_rejected_or_score_finitely((d, corpus, queries) in case()) {
        let qs = Array2::from_shape_vec((queries.len() / d, d), queries).unwrap();
        let n = corpus.len() / d;
        for metric in Metric::ALL {
            let oracle = match Oracle::from_rowmajor(corpus.clone(), d, metric) {
                Ok(o) => o,
                Err(e) => {
                    prop_assert!(is_rule(&e), "oracle: {e:?}");
                    for kernels in Kernels::all_available() {
                        let e = CpuRetriever::from_rowmajor(corpus.clone(), d, metric)
                            .map(|c| c.with_kernels(kernels))
                            .err();
                        prop_assert!(e.as_ref().is_some_and(is_rule), "cpu accepted: {e:?}");
                    }
                    continue;
                }
            };
            let expect = match oracle.search_batch(qs.view(), n) {
                Ok(r) => r,
                Err(e) => {
                    prop_assert!(is_rule(&e), "oracle search: {e:?}");
                    continue;
                }
            };
            for hit in expect.iter().flatten() {
                prop_assert!(
                    hit.score.is_finite()
                        || (metric == Metric::Cosine && hit.score == f32::NEG_INFINITY),
                    "{metric}: score {} of row {}", hit.score, hit.index
                );
            }
            for kernels in Kernels::all_available() {
                let cpu = CpuRetriever::from_rowmajor(corpus.clone(), d, metric)
                    .unwrap()
                    .with_kernels(kernels);
                let got = cpu.search_batch(qs.view(), n).unwrap();
                prop_assert_eq!(bits(&got), bits(&expect), "{} {}", metric, kernels.path().as_str());
            }
        }
    }
}

#[test]
fn rows_near_3e38_are_rejected_by_both_backends() {
    let mut corpus = vec![1.0_f32; 4 * 8];
    corpus[8..16].fill(3e38);
    for metric in Metric::ALL {
        let e = Oracle::from_rowmajor(corpus.clone(), 8, metric).unwrap_err();
        assert!(matches!(e, Error::NormTooLarge { .. }), "{e:?}");
        assert!(e.to_string().contains("corpus row 1"), "{e}");
        let e = CpuRetriever::from_rowmajor(corpus.clone(), 8, metric).unwrap_err();
        assert!(matches!(e, Error::NormTooLarge { .. }), "{e:?}");
        let ok = CpuRetriever::from_rowmajor(vec![1.0; 8], 8, metric).unwrap();
        let e = ok.search(&[3e38; 8], 1).unwrap_err();
        assert!(matches!(e, Error::NormTooLarge { .. }), "{e:?}");
    }
}

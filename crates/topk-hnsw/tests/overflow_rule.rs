//! The overflow rule (docs/CONTRACTS.md §4) at the HNSW index's input: huge
//! rows or queries are refused with `Error::NormTooLarge`; rows at the limit
//! are accepted and every score the index returns is finite (or cosine's
//! `-inf` for a zero computed norm) and equal to the scalar reference.

use proptest::prelude::*;
use topk_core::{validate, Error, Metric, Retriever};
use topk_hnsw::{Hnsw, HnswError, HnswParams};

fn params() -> HnswParams {
    HnswParams {
        m: 4,
        ef_construction: 16,
        ef_search: 16,
        seed: 3,
        ..HnswParams::default()
    }
}

fn value() -> impl Strategy<Value = f32> {
    prop_oneof![
        Just(0.0_f32),
        -1.0f32..1.0,
        (-1.0f32..1.0).prop_map(|v| v * 3e38),
        (-1.0f32..1.0).prop_map(|v| v * 2.0_f32.powi(48)),
        (-1.0f32..1.0).prop_map(|v| v * 1e-20),
        (0u32..(1 << 23)).prop_map(f32::from_bits),
    ]
}

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

fn is_rule(e: &HnswError) -> bool {
    matches!(e, HnswError::Input(core) if is_core_rule(core))
}

fn is_core_rule(e: &Error) -> bool {
    matches!(e, Error::NormTooLarge { .. } | Error::NonFinite { .. })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn huge_and_tiny_values_are_rejected_or_score_finitely(
        (d, corpus, query) in (1usize..24, 1usize..20)
            .prop_flat_map(|(d, n)| (Just(d), rows(n, d), rows(1, d)))
    ) {
        for metric in Metric::ALL {
            let index = match Hnsw::build(&corpus, d, metric, params()) {
                Ok(i) => i,
                Err(e) => {
                    prop_assert!(is_rule(&e), "{e:?}");
                    continue;
                }
            };
            let hits = match index.search(&query, corpus.len() / d) {
                Ok(h) => h,
                Err(e) => {
                    prop_assert!(is_core_rule(&e), "{e:?}");
                    continue;
                }
            };
            for h in hits {
                let row = &corpus[h.index as usize * d..][..d];
                prop_assert_eq!(h.score.to_bits(), metric.score_scalar(&query, row).to_bits());
                prop_assert!(
                    h.score.is_finite()
                        || (metric == Metric::Cosine && h.score == f32::NEG_INFINITY),
                    "{metric}: {}", h.score
                );
            }
        }
    }
}

#[test]
fn rows_near_3e38_are_rejected() {
    let mut corpus = vec![0.5_f32; 3 * 4];
    corpus[4..8].fill(3e38);
    let e = Hnsw::build(&corpus, 4, Metric::Dot, params()).unwrap_err();
    assert!(is_rule(&e), "{e:?}");
    assert!(e.to_string().contains("corpus row 1"), "{e}");
    let index = Hnsw::build(&[0.5; 4], 4, Metric::L2, params()).unwrap();
    let e = index.search(&[3e38; 4], 1).unwrap_err();
    assert!(is_core_rule(&e), "{e:?}");
}

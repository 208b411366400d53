//! The overflow rule (docs/CONTRACTS.md §4) at the HNSW index's input: huge
//! rows or queries are refused with `Error::NormTooLarge`; rows at the limit
//! are accepted and every score the index returns is finite (or cosine's
//! `-inf` for a zero computed norm) and equal to the scalar reference.

use proptest::prelude::*;
use topk_core::{Error, Metric, Retriever};
use topk_hnsw::{Hnsw, HnswError, HnswParams};
use topk_testkit::overflow;

fn params() -> HnswParams {
    HnswParams {
        m: 4,
        ef_construction: 16,
        ef_search: 16,
        seed: 3,
        ..HnswParams::default()
    }
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
    fn huge_and_tiny_values_are_rejected_or_score_finitely(case in overflow::case()) {
        let (d, corpus) = (case.dim, &case.corpus);
        for (metric, query) in Metric::ALL.into_iter().flat_map(|m| case.queries.chunks(d).map(move |q| (m, q))) {
            let index = match Hnsw::build(corpus, d, metric, params()) {
                Ok(i) => i,
                Err(e) => {
                    prop_assert!(is_rule(&e), "{e:?}");
                    continue;
                }
            };
            let hits = match index.search(query, corpus.len() / d) {
                Ok(h) => h,
                Err(e) => {
                    prop_assert!(is_core_rule(&e), "{e:?}");
                    continue;
                }
            };
            for h in hits {
                let row = &corpus[h.index as usize * d..][..d];
                prop_assert_eq!(h.score.to_bits(), metric.score_scalar(query, row).to_bits());
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

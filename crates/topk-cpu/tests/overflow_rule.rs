//! The overflow rule (docs/CONTRACTS.md §4) on the oracle and the CPU backend
//! (every available kernel): a corpus or query of huge, tiny or subnormal
//! values is either rejected with `Error::NormTooLarge` (or `NonFinite`), or
//! every score is finite (cosine may give `-inf` for a zero computed norm)
//! and the CPU results equal the oracle's, bit for bit.

use proptest::prelude::*;
use topk_core::{Error, Metric, Retriever};
use topk_cpu::{CpuRetriever, Oracle};
use topk_testkit::{overflow, Label};

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn huge_and_tiny_values_are_rejected_or_score_finitely(case in overflow::case()) {
        for label in Label::cpu_paths().into_iter().chain([Label::Oracle]) {
            overflow::check(&label.subject(), &case)?;
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

//! The overflow rule (docs/CONTRACTS.md §4.1) as a property any exact
//! backend must keep: a corpus or query of huge, tiny or subnormal values is
//! either rejected with `Error::NormTooLarge` (or `NonFinite`) by the oracle
//! and the backend alike, or every score is finite (cosine may give `-inf`
//! for a zero computed norm) and the backend's answers equal the oracle's,
//! bit for bit.

use ndarray::ArrayView2;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use topk_core::{validate, Error, Metric, Neighbor, Retriever};
use topk_cpu::Oracle;

use crate::conformance::Subject;

/// One generated case: the dimension, the corpus and the queries, row-major.
#[derive(Debug, Clone)]
pub struct Case {
    /// Values per row.
    pub dim: usize,
    /// `N × dim` corpus values.
    pub corpus: Vec<f32>,
    /// `Q × dim` query values.
    pub queries: Vec<f32>,
}

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

/// `n` vectors of `d` values; half the time every vector is scaled to a
/// squared norm of 0.95 to 1.05 times the limit.
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

/// Cases of 1–39 dimensions, 1–23 rows and 1–3 queries.
pub fn case() -> impl Strategy<Value = Case> {
    (1usize..40, 1usize..24, 1usize..4).prop_flat_map(|(d, n, q)| {
        (rows(n, d), rows(q, d)).prop_map(move |(corpus, queries)| Case {
            dim: d,
            corpus,
            queries,
        })
    })
}

/// Whether `e` is one of the two rules a huge input may break.
pub fn is_rule(e: &Error) -> bool {
    matches!(e, Error::NormTooLarge { .. } | Error::NonFinite { .. })
}

fn bits(hits: &[Vec<Neighbor>]) -> Vec<Vec<(u32, u32)>> {
    hits.iter()
        .map(|h| h.iter().map(|n| (n.index, n.score.to_bits())).collect())
        .collect()
}

/// Checks `case` on `subject` under every metric (see the module doc).
pub fn check(subject: &Subject<'_>, case: &Case) -> Result<(), TestCaseError> {
    let d = case.dim;
    let n = case.corpus.len() / d;
    let qs = ArrayView2::from_shape((case.queries.len() / d, d), &case.queries)
        .map_err(|e| TestCaseError::fail(format!("bad case shape: {e}")))?;
    let label = subject.label();
    for metric in Metric::ALL {
        let oracle = match Oracle::from_rowmajor(case.corpus.clone(), d, metric) {
            Ok(o) => o,
            Err(e) => {
                prop_assert!(is_rule(&e), "oracle: {e:?}");
                let got = subject.open(case.corpus.clone(), d, metric).err();
                prop_assert!(
                    got.as_ref().is_some_and(is_rule),
                    "{label} {metric}: accepted a corpus the oracle rejects ({got:?})"
                );
                continue;
            }
        };
        let backend = subject
            .open(case.corpus.clone(), d, metric)
            .map_err(|e| TestCaseError::fail(format!("{label} {metric}: {e}")))?;
        let expect = match oracle.search_batch(qs, n) {
            Ok(r) => r,
            Err(e) => {
                prop_assert!(is_rule(&e), "oracle search: {e:?}");
                let got = backend.search_batch(qs, n).err();
                prop_assert!(
                    got.as_ref().is_some_and(is_rule),
                    "{label} {metric}: answered a batch the oracle rejects ({got:?})"
                );
                continue;
            }
        };
        for hit in expect.iter().flatten() {
            prop_assert!(
                hit.score.is_finite()
                    || (metric == Metric::Cosine && hit.score == f32::NEG_INFINITY),
                "{metric}: score {} of row {}",
                hit.score,
                hit.index
            );
        }
        let got = backend
            .search_batch(qs, n)
            .map_err(|e| TestCaseError::fail(format!("{label} {metric}: {e}")))?;
        prop_assert_eq!(bits(&got), bits(&expect), "{} {}", label, metric);
        for (q, want) in qs.outer_iter().zip(&expect) {
            let one = backend
                .search(q.as_slice().unwrap_or(&[]), n)
                .map_err(|e| TestCaseError::fail(format!("{label} {metric}: {e}")))?;
            prop_assert_eq!(
                bits(&[one]),
                bits(std::slice::from_ref(want)),
                "{} {} single",
                label,
                metric
            );
        }
    }
    Ok(())
}

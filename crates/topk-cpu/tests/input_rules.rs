//! Every input rule of docs/CONTRACTS.md §4, on both backends: the error variant, and
//! a message that names the offending value.

use ndarray::Array2;
use topk_core::{Error, Located, Metric, Retriever};
use topk_cpu::{CpuError, CpuRetriever, Oracle};

type Build = fn(Vec<f32>, usize, Metric) -> topk_core::Result<Box<dyn Retriever>>;

fn builders() -> [(&'static str, Build); 2] {
    [
        ("oracle", |d, dim, m| {
            Ok(Box::new(Oracle::from_rowmajor(d, dim, m)?))
        }),
        ("cpu", |d, dim, m| {
            Ok(Box::new(CpuRetriever::from_rowmajor(d, dim, m)?))
        }),
    ]
}

type BuildView = fn(&Array2<f32>) -> topk_core::Result<Box<dyn Retriever>>;

fn view_builders() -> [(&'static str, BuildView); 2] {
    [
        ("oracle", |a| {
            Ok(Box::new(Oracle::new(a.view(), Metric::Dot)?))
        }),
        ("cpu", |a| {
            Ok(Box::new(CpuRetriever::new(a.view(), Metric::Dot)?))
        }),
    ]
}

fn err_of<T>(r: topk_core::Result<T>, name: &str) -> Error {
    match r {
        Ok(_) => panic!("{name}: expected an error"),
        Err(e) => e,
    }
}

fn assert_names(e: &Error, parts: &[&str], name: &str) {
    let m = e.to_string();
    for p in parts {
        assert!(m.contains(p), "{name}: message {m:?} does not name {p:?}");
    }
}

#[test]
fn zero_dimension_is_rejected() {
    for (name, build) in builders() {
        let e = err_of(build(vec![1.0; 4], 0, Metric::Dot), name);
        assert!(matches!(e, Error::ZeroDimension), "{name}: {e:?}");
        assert_names(&e, &["D = 0"], name);
    }
    for (name, build) in view_builders() {
        let e = err_of(build(&Array2::zeros((3, 0))), name);
        assert!(matches!(e, Error::ZeroDimension), "{name}: {e:?}");
        assert_names(&e, &["D = 0"], name);
    }
}

#[test]
fn empty_corpus_is_rejected_at_construction() {
    for (name, build) in builders() {
        let e = err_of(build(Vec::new(), 8, Metric::Cosine), name);
        assert!(matches!(e, Error::EmptyCorpus), "{name}: {e:?}");
        assert_names(&e, &["N = 0"], name);
    }
    for (name, build) in view_builders() {
        let e = err_of(build(&Array2::zeros((0, 5))), name);
        assert!(matches!(e, Error::EmptyCorpus), "{name}: {e:?}");
    }
}

#[test]
fn ragged_buffer_is_rejected() {
    for (name, build) in builders() {
        let e = err_of(build(vec![0.5; 10], 4, Metric::L2), name);
        assert!(
            matches!(e, Error::RaggedCorpus { len: 10, dim: 4 }),
            "{name}: {e:?}"
        );
        assert_names(&e, &["10 values", "D = 4"], name);
    }
}

#[test]
fn non_finite_corpus_value_names_row_and_column() {
    for (bad, text) in [
        (f32::NAN, "NaN"),
        (f32::INFINITY, "inf"),
        (f32::NEG_INFINITY, "-inf"),
    ] {
        for (name, build) in builders() {
            let mut data = vec![0.25_f32; 5 * 3];
            data[3 * 3 + 2] = bad;
            let e = err_of(build(data, 3, Metric::Dot), name);
            assert!(
                matches!(
                    e,
                    Error::NonFinite {
                        at: Located::Row(3),
                        column: 2,
                        ..
                    }
                ),
                "{name}: {e:?}"
            );
            assert_names(&e, &["corpus row 3", "column 2", text], name);
        }
        for (name, build) in view_builders() {
            let mut a = Array2::<f32>::ones((4, 6));
            a[[1, 5]] = bad;
            let e = err_of(build(&a), name);
            assert!(
                matches!(
                    e,
                    Error::NonFinite {
                        at: Located::Row(1),
                        column: 5,
                        ..
                    }
                ),
                "{name}: {e:?}"
            );
            assert_names(&e, &["corpus row 1", "column 5", text], name);
        }
    }
}

fn small(name: &str, build: Build, metric: Metric) -> Box<dyn Retriever> {
    let data: Vec<f32> = (0..12).map(|i| i as f32 - 5.0).collect();
    build(data, 3, metric).unwrap_or_else(|e| panic!("{name}: {e}"))
}

#[test]
fn query_of_the_wrong_length_names_both_sizes() {
    for (name, build) in builders() {
        let r = small(name, build, Metric::Dot);
        let e = err_of(r.search(&[1.0; 4], 2), name);
        assert!(
            matches!(
                e,
                Error::DimensionMismatch {
                    expected: 3,
                    got: 4,
                    ..
                }
            ),
            "{name}: {e:?}"
        );
        assert_names(&e, &["4 values", "D = 3"], name);

        let e = err_of(r.search_batch(Array2::zeros((2, 5)).view(), 1), name);
        assert!(
            matches!(
                e,
                Error::DimensionMismatch {
                    expected: 3,
                    got: 5,
                    ..
                }
            ),
            "{name}: {e:?}"
        );
        assert_names(&e, &["5 values", "D = 3"], name);
    }
}

#[test]
fn non_finite_query_value_names_query_and_column() {
    for (name, build) in builders() {
        let r = small(name, build, Metric::L2);
        let e = err_of(r.search(&[0.0, f32::NAN, 1.0], 1), name);
        assert!(
            matches!(
                e,
                Error::NonFinite {
                    at: Located::Query(0),
                    column: 1,
                    ..
                }
            ),
            "{name}: {e:?}"
        );
        assert_names(&e, &["query 0", "column 1", "NaN"], name);

        let mut qs = Array2::<f32>::zeros((4, 3));
        qs[[2, 0]] = f32::NEG_INFINITY;
        let e = err_of(r.search_batch(qs.view(), 2), name);
        assert!(
            matches!(
                e,
                Error::NonFinite {
                    at: Located::Query(2),
                    column: 0,
                    ..
                }
            ),
            "{name}: {e:?}"
        );
        assert_names(&e, &["query 2", "column 0", "-inf"], name);
    }
}

#[test]
fn k_zero_is_rejected() {
    for (name, build) in builders() {
        let r = small(name, build, Metric::Dot);
        let e = err_of(r.search(&[1.0, 2.0, 3.0], 0), name);
        assert!(matches!(e, Error::ZeroK), "{name}: {e:?}");
        assert_names(&e, &["K = 0"], name);
        let e = err_of(r.search_batch(Array2::ones((3, 3)).view(), 0), name);
        assert!(matches!(e, Error::ZeroK), "{name}: {e:?}");
    }
}

#[test]
fn k_beyond_n_returns_every_row_sorted() {
    for (name, build) in builders() {
        for metric in Metric::ALL {
            let r = small(name, build, metric);
            let hits = r.search(&[1.0, -1.0, 0.5], 100).unwrap();
            assert_eq!(hits.len(), 4, "{name} {metric}");
            let mut idx: Vec<u32> = hits.iter().map(|h| h.index).collect();
            idx.sort_unstable();
            assert_eq!(idx, vec![0, 1, 2, 3], "{name} {metric}");
            assert!(
                hits.windows(2).all(|w| w[0].score >= w[1].score),
                "{name} {metric}"
            );
            let batch = r.search_batch(Array2::ones((2, 3)).view(), 7).unwrap();
            assert!(batch.iter().all(|b| b.len() == 4), "{name} {metric}");
        }
    }
}

#[test]
fn cosine_zero_row_and_zero_query_score_negative_infinity() {
    for (name, build) in builders() {
        let data = vec![0.0, 0.0, 1.0, 0.0, -0.0, 0.0, 0.0, 2.0];
        let r = build(data, 2, Metric::Cosine).unwrap();
        let hits = r.search(&[1.0, 1.0], 4).unwrap();
        let by_index: Vec<(u32, f32)> = hits.iter().map(|h| (h.index, h.score)).collect();
        assert_eq!(by_index[2], (0, f32::NEG_INFINITY), "{name}");
        assert_eq!(by_index[3], (2, f32::NEG_INFINITY), "{name}");
        // A zero query ties every row at -inf: the order is the index order.
        let hits = r.search(&[0.0, -0.0], 4).unwrap();
        assert!(hits.iter().all(|h| h.score == f32::NEG_INFINITY), "{name}");
        assert_eq!(
            hits.iter().map(|h| h.index).collect::<Vec<_>>(),
            vec![0, 1, 2, 3]
        );
    }
}

#[test]
fn an_empty_batch_answers_nothing() {
    for (name, build) in builders() {
        let r = small(name, build, Metric::Dot);
        assert!(
            r.search_batch(Array2::zeros((0, 3)).view(), 3)
                .unwrap()
                .is_empty(),
            "{name}"
        );
    }
}

#[test]
fn zero_threads_is_rejected_with_the_value() {
    let r = CpuRetriever::from_rowmajor(vec![1.0; 6], 3, Metric::Dot).unwrap();
    let e = err_of(r.with_threads(0), "cpu");
    match &e {
        Error::Backend {
            backend: "cpu",
            source,
        } => {
            let inner = source
                .downcast_ref::<CpuError>()
                .expect("a CpuError inside");
            assert!(matches!(inner, CpuError::ZeroThreads { threads: 0 }));
        }
        other => panic!("expected a cpu backend error, got {other:?}"),
    }
    assert_names(&e, &["cpu backend", "thread count 0"], "cpu");
}

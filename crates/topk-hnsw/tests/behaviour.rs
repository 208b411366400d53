//! Edge cases and contracts: tiny graphs, K > N, ties, every metric, the
//! `Retriever` trait, and typed errors for bad parameters and inputs.

mod common;

use ndarray::ArrayView2;
use topk_core::{Error, Located, Metric, Neighbor, Retriever};
use topk_hnsw::{synth, Hnsw, HnswError, HnswParams};

fn params(m: usize, ef: usize) -> HnswParams {
    HnswParams {
        m,
        ef_construction: 32,
        ef_search: ef,
        seed: 11,
        ..HnswParams::default()
    }
}

fn bits(v: &[Neighbor]) -> Vec<(u32, u32)> {
    v.iter().map(|n| (n.index, n.score.to_bits())).collect()
}

#[test]
fn single_row_corpus() {
    for metric in Metric::ALL {
        let index = Hnsw::build(&[1.0, 2.0, 3.0], 3, metric, params(2, 1)).unwrap();
        let q = [0.5, -1.0, 2.0];
        for k in [1, 5] {
            let hits = index.search(&q, k).unwrap();
            assert_eq!(hits.len(), 1, "{metric} k={k}");
            assert_eq!(hits[0].index, 0);
            assert_eq!(
                hits[0].score.to_bits(),
                metric.score_scalar(&q, &[1.0, 2.0, 3.0]).to_bits()
            );
        }
    }
}

#[test]
fn two_row_corpus_through_the_graph_and_exhaustively() {
    let data = [0.0_f32, 0.0, 3.0, 4.0];
    let index = Hnsw::build(&data, 2, Metric::L2, params(2, 1)).unwrap();
    let mut out = Vec::new();
    // ef = 1 < N: the graph walk; ef ≥ N: every row is scored.
    for ef in [1, 2, 50] {
        index.search_with_ef(&[2.9, 4.1], 1, ef, &mut out).unwrap();
        let want = Neighbor::new(1, Metric::L2.score_scalar(&[2.9, 4.1], &[3.0, 4.0]));
        assert_eq!(bits(&out), bits(&[want]), "ef={ef}");
        index.search_with_ef(&[0.1, 0.0], 2, ef, &mut out).unwrap();
        assert_eq!(
            out.iter().map(|n| n.index).collect::<Vec<_>>(),
            vec![0, 1],
            "ef={ef}"
        );
    }
}

#[test]
fn k_larger_than_n_returns_every_row_in_order() {
    let dim = 4;
    let data = synth::gaussian_clusters(37, dim, 3, 0.5, 5);
    for metric in Metric::ALL {
        let index = Hnsw::build(&data, dim, metric, params(4, 8)).unwrap();
        let q = &data[..dim];
        let hits = index.search(q, 100).unwrap();
        let exact = common::exact(&data, dim, metric, q, 100).remove(0);
        assert_eq!(bits(&hits), bits(&exact), "{metric}");
    }
}

#[test]
fn small_graphs_find_every_row_with_a_wide_beam() {
    // ef ≥ N scores every row, so the answer is exact for any corpus shape.
    for n in [1usize, 2, 3, 5, 17, 64] {
        let data = synth::gaussian_clusters(n, 3, 2, 1.0, n as u64);
        let index = Hnsw::build(&data, 3, Metric::Dot, params(2, n)).unwrap();
        let q = [0.3, -0.2, 0.9];
        let hits = index.search(&q, n).unwrap();
        let exact = common::exact(&data, 3, Metric::Dot, &q, n).remove(0);
        assert_eq!(bits(&hits), bits(&exact), "n = {n}");
    }
}

#[test]
fn graph_search_always_returns_min_k_n_rows() {
    // Duplicated rows give many equal scores; the heuristic prunes links
    // between identical points hard, which is where unreachable nodes appear.
    let dim = 2;
    let mut data = Vec::new();
    for i in 0..300 {
        let v = (i % 3) as f32;
        data.extend_from_slice(&[v, v]);
    }
    let index = Hnsw::build(&data, dim, Metric::L2, params(2, 4)).unwrap();
    let mut out = Vec::new();
    for k in [1, 10, 150, 299, 300, 400] {
        index.search_with_ef(&[1.0, 1.0], k, 4, &mut out).unwrap();
        assert_eq!(out.len(), k.min(300), "k = {k}");
        for w in out.windows(2) {
            assert_eq!(
                topk_core::cmp_rank(&w[0], &w[1]),
                std::cmp::Ordering::Less,
                "k = {k}"
            );
        }
        let mut ids: Vec<u32> = out.iter().map(|n| n.index).collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), out.len(), "repeated ids at k = {k}");
    }
    // The 100 rows equal to the query score -0.0 and tie; the smallest indices win.
    index.search_with_ef(&[1.0, 1.0], 5, 300, &mut out).unwrap();
    assert_eq!(
        bits(&out),
        bits(&[1, 4, 7, 10, 13].map(|i| Neighbor::new(i, -0.0)))
    );
}

#[test]
fn cosine_search_matches_the_oracle_on_easy_queries() {
    let dim = 16;
    let data = synth::gaussian_clusters(2_000, dim, 20, 0.3, 9);
    let index = Hnsw::build(&data, dim, Metric::Cosine, params(8, 64)).unwrap();
    let queries = &data[..50 * dim];
    let truth = common::exact_ids(&data, dim, Metric::Cosine, queries, 10);
    let res = common::search_all(&index, queries, dim, 10, 64);
    let r = topk_hnsw::recall_at_k(&res, &truth, 10).unwrap();
    assert!(r >= 0.95, "cosine recall@10 = {r}");
}

fn answer<R: Retriever>(r: &R, q: &[f32]) -> Vec<Neighbor> {
    r.search(q, 3).unwrap()
}

#[test]
fn works_as_a_generic_retriever() {
    let dim = 8;
    let data = synth::gaussian_clusters(500, dim, 5, 0.4, 2);
    let index = Hnsw::build(&data, dim, Metric::Dot, params(8, 500)).unwrap();
    let boxed: Box<dyn Retriever> =
        Box::new(Hnsw::build(&data, dim, Metric::Dot, params(8, 500)).unwrap());
    assert_eq!(boxed.backend(), "hnsw");
    assert_eq!(
        (boxed.len(), boxed.dim(), boxed.metric()),
        (500, dim, Metric::Dot)
    );
    let qs = &data[..4 * dim];
    let batch = index
        .search_batch(ArrayView2::from_shape((4, dim), qs).unwrap(), 3)
        .unwrap();
    for (i, q) in qs.chunks_exact(dim).enumerate() {
        // ef = N: the exact answer, whichever way it is asked.
        let exact = common::exact(&data, dim, Metric::Dot, q, 3).remove(0);
        assert_eq!(bits(&answer(&index, q)), bits(&exact));
        assert_eq!(bits(&answer(&boxed, q)), bits(&exact));
        assert_eq!(bits(&batch[i]), bits(&exact));
    }
}

#[test]
fn bad_build_parameters_are_typed_errors() {
    let data = [1.0_f32; 8];
    let e = Hnsw::build(&data, 2, Metric::L2, HnswParams::with_m(1)).unwrap_err();
    assert!(
        matches!(
            e,
            HnswError::InvalidParameter {
                name: "m",
                value: 1,
                ..
            }
        ),
        "{e}"
    );
    let e = Hnsw::build(
        &data,
        2,
        Metric::L2,
        HnswParams {
            ef_construction: 0,
            ..HnswParams::default()
        },
    )
    .unwrap_err();
    assert!(
        matches!(
            e,
            HnswError::InvalidParameter {
                name: "ef_construction",
                value: 0,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("ef_construction = 0"), "{e}");
    let e = Hnsw::build(&[], 2, Metric::L2, HnswParams::default()).unwrap_err();
    assert!(matches!(e, HnswError::Input(Error::EmptyCorpus)), "{e}");
    let e = Hnsw::build(
        &[1.0, f32::NAN, 0.0, 0.0],
        2,
        Metric::L2,
        HnswParams::default(),
    )
    .unwrap_err();
    assert!(
        matches!(
            e,
            HnswError::Input(Error::NonFinite {
                at: Located::Row(0),
                column: 1,
                ..
            })
        ),
        "{e}"
    );
    let e = Hnsw::build(&[1.0; 5], 2, Metric::L2, HnswParams::default()).unwrap_err();
    assert!(
        matches!(e, HnswError::Input(Error::RaggedCorpus { len: 5, dim: 2 })),
        "{e}"
    );
}

/// Every build checks the corpus before its parameters: the same bad call
/// gets the same error whichever build it reaches.
#[test]
fn every_build_names_a_bad_corpus_before_bad_parameters() {
    let data = [1.0, f32::NAN, 0.0, 0.0];
    let bad = HnswParams {
        m: 1,
        ..HnswParams::default()
    };
    let is_nan = |e: &HnswError| {
        matches!(
            e,
            HnswError::Input(Error::NonFinite {
                at: Located::Row(0),
                column: 1,
                ..
            })
        )
    };
    let e = Hnsw::build(&data, 2, Metric::Dot, bad).unwrap_err();
    assert!(is_nan(&e), "build: {e}");
    let e = Hnsw::build_batched(
        data.to_vec(),
        2,
        Metric::Dot,
        bad,
        topk_hnsw::BatchSchedule::default(),
    )
    .unwrap_err();
    assert!(is_nan(&e), "build_batched: {e}");
    let e = Hnsw::build_knn_cpu(&data, 2, Metric::Dot, bad).unwrap_err();
    assert!(is_nan(&e), "build_knn_cpu: {e}");
}

#[test]
fn bad_search_inputs_are_typed_errors() {
    let mut index =
        Hnsw::build(&[1.0, 0.0, 0.0, 1.0], 2, Metric::Dot, HnswParams::default()).unwrap();
    let mut out = Vec::new();
    let e = index
        .search_with_ef(&[1.0, 0.0], 1, 0, &mut out)
        .unwrap_err();
    assert!(
        matches!(
            e,
            HnswError::InvalidParameter {
                name: "ef",
                value: 0,
                ..
            }
        ),
        "{e}"
    );
    assert!(matches!(
        index.set_ef(0),
        Err(HnswError::InvalidParameter { name: "ef", .. })
    ));
    // ef < k is accepted and raised to k.
    index.set_ef(1).unwrap();
    assert_eq!(index.search(&[1.0, 0.0], 2).unwrap().len(), 2);
    // Through the Retriever trait, input errors keep their topk-core variant.
    assert!(matches!(index.search(&[1.0, 0.0], 0), Err(Error::ZeroK)));
    assert!(matches!(
        index.search(&[1.0, 0.0, 2.0], 1),
        Err(Error::DimensionMismatch {
            expected: 2,
            got: 3,
            ..
        })
    ));
    assert!(matches!(
        index.search(&[f32::INFINITY, 0.0], 1),
        Err(Error::NonFinite {
            at: Located::Query(0),
            column: 0,
            ..
        })
    ));
}

/// A full-width search (`ef ≥ N`) once kept the sorted beam of the previous
/// search on the same pooled scratch and returned its rows twice.
#[test]
fn regression_full_width_search_after_a_graph_search_has_no_stale_rows() {
    let dim = 6;
    let data = synth::gaussian_clusters(200, dim, 4, 0.5, 21);
    let index = Hnsw::build(&data, dim, Metric::L2, params(4, 8)).unwrap();
    let mut out = Vec::new();
    for q in data.chunks_exact(dim).take(5) {
        index.search_with_ef(q, 10, 8, &mut out).unwrap();
        index.search_with_ef(q, 10, 500, &mut out).unwrap();
        let exact = common::exact(&data, dim, Metric::L2, q, 10).remove(0);
        assert_eq!(bits(&out), bits(&exact));
    }
}

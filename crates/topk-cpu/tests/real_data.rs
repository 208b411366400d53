//! Exact search on real sentence embeddings (`minilm-docs-20k`, read from the
//! workplace's shared data folder): the fast backend equals the oracle bit for
//! bit, and both agree with the float64 ground truth except where two scores
//! lie within f32 rounding of each other.

use std::path::PathBuf;

use topk_core::{Metric, Retriever};
use topk_cpu::{CpuRetriever, Oracle};

/// The data set, or `None` (with a message) where it is absent and
/// `TOPK_REQUIRE_DATA=1` is not set.
fn data_dir() -> Option<PathBuf> {
    topk_testkit::shared_data("minilm-docs-20k")
}

#[test]
fn minilm_docs_exact_and_close_to_float64_truth() {
    let Some(dir) = data_dir() else { return };
    let corpus = topk_io::read_npy_f32(dir.join("corpus.npy")).expect("corpus.npy");
    let queries = topk_io::read_npy_f32(dir.join("queries.npy")).expect("queries.npy");
    let truth = topk_io::read_ids(dir.join("gt_top100.npy")).expect("gt_top100.npy");
    let (k, nq) = (100, 64);
    let cpu = CpuRetriever::new(corpus.view(), Metric::Dot).unwrap();
    let oracle = Oracle::new(corpus.view(), Metric::Dot).unwrap();
    let batch = cpu
        .search_batch(queries.slice(ndarray::s![..nq, ..]), k)
        .unwrap();
    let mut same_ids = 0;
    for (i, got) in batch.iter().enumerate() {
        let q = queries.row(i).to_vec();
        let want = oracle.search(&q, k).unwrap();
        let single = cpu.search(&q, k).unwrap();
        for (a, b) in [(got, &want), (&single, &want)] {
            assert!(
                a.iter()
                    .zip(b.iter())
                    .all(|(x, y)| x.index == y.index && x.score.to_bits() == y.score.to_bits()),
                "query {i}: cpu differs from oracle"
            );
        }
        // Against the float64 truth, a swapped pair must be a near-tie.
        for (rank, (n, &t)) in got.iter().zip(truth.row(i).iter()).enumerate() {
            if n.index == t {
                same_ids += 1;
            } else {
                let t_score =
                    Metric::Dot.score_scalar(&q, corpus.row(t as usize).as_slice().unwrap());
                assert!(
                    (n.score - t_score).abs() <= 1e-6,
                    "query {i} rank {rank}: row {} ({}) vs truth row {t} ({t_score})",
                    n.index,
                    n.score
                );
            }
        }
    }
    let agree = same_ids as f64 / (nq * k) as f64;
    println!(
        "minilm-docs-20k: {nq} queries, K = {k}: {:.4} of ranks match the float64 truth",
        agree
    );
    assert!(agree > 0.99, "only {agree} of ranks match");
}

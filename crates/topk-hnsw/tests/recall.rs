//! Recall against the exact oracle: the 20k Gaussian-cluster set (D = 64,
//! L2), the real MiniLM embeddings where present, monotonicity in `ef`, and
//! the parallel build against the sequential one.

mod common;

use common::*;
use topk_core::{Metric, Retriever};
use topk_hnsw::{recall_at_k, Hnsw, HnswParams};

#[test]
fn recall_at_10_reaches_095_at_ef_64_on_gaussian_clusters() {
    let f = gaussian();
    let res = search_all(sequential_index(), &f.queries, D, 10, 64);
    let r = recall_at_k(&res, &f.truth, 10).unwrap();
    eprintln!("gaussian 20k D=64 L2, sequential build: recall@10 at ef=64 = {r:.4}");
    assert!(r >= 0.95, "recall@10 = {r} at ef = 64 (N = {N}, D = {D})");
}

#[test]
fn recall_grows_with_ef() {
    let f = gaussian();
    let index = sequential_index();
    let recalls: Vec<f64> = [10, 20, 40, 80, 160]
        .iter()
        .map(|&ef| recall_at_k(&search_all(index, &f.queries, D, 10, ef), &f.truth, 10).unwrap())
        .collect();
    eprintln!("recall@10 over ef 10..160: {recalls:?}");
    for w in recalls.windows(2) {
        // A wider beam explores a superset in practice; allow one query's worth of noise.
        assert!(w[1] >= w[0] - 0.005, "recall fell with ef: {recalls:?}");
    }
    assert!(
        recalls[4] > recalls[0],
        "no gain from ef 10 to 160: {recalls:?}"
    );
    assert!(recalls[4] >= 0.99, "{recalls:?}");
}

#[test]
fn parallel_build_recall_is_within_noise_of_sequential() {
    let f = gaussian();
    for ef in [16, 64] {
        let seq = recall_at_k(
            &search_all(sequential_index(), &f.queries, D, 10, ef),
            &f.truth,
            10,
        )
        .unwrap();
        let par = recall_at_k(
            &search_all(parallel_index(), &f.queries, D, 10, ef),
            &f.truth,
            10,
        )
        .unwrap();
        eprintln!("ef={ef}: sequential {seq:.4}, parallel {par:.4}");
        // 2000 (query, rank) pairs: 0.02 is several standard errors at these recalls.
        assert!(
            (seq - par).abs() <= 0.02,
            "ef = {ef}: sequential {seq}, parallel {par}"
        );
    }
    // Not asserted (a one-core pool inserts in order), only reported.
    let same = parallel_index().to_bytes() == sequential_index().to_bytes();
    eprintln!("parallel graph identical to the sequential one: {same}");
    let s = parallel_index().stats();
    assert_eq!(s.n, N);
    assert_eq!(s.nodes_per_layer[0], N);
}

#[test]
fn returned_scores_are_the_canonical_scores() {
    let f = gaussian();
    let index = sequential_index();
    for q in f.queries.chunks_exact(D).take(20) {
        let hits = index.search(q, 10).unwrap();
        assert_eq!(hits.len(), 10);
        for h in &hits {
            let row = &f.corpus[h.index as usize * D..(h.index as usize + 1) * D];
            assert_eq!(
                h.score.to_bits(),
                Metric::L2.score_scalar(q, row).to_bits(),
                "row {}",
                h.index
            );
        }
        for w in hits.windows(2) {
            assert_eq!(topk_core::cmp_rank(&w[0], &w[1]), std::cmp::Ordering::Less);
        }
    }
}

#[test]
fn recall_on_minilm_docs_real_embeddings() {
    let Some(dir) = minilm_dir() else { return };
    let corpus = topk_io::read_matrix(dir.join("corpus.npy")).unwrap();
    let queries = topk_io::read_matrix(dir.join("queries.npy")).unwrap();
    let gt = topk_io::read_ids(dir.join("gt_top100.ivecs")).unwrap();
    let dim = corpus.ncols();
    let params = HnswParams {
        m: 16,
        ef_construction: 64,
        ef_search: 64,
        seed: 3,
        parallel: true,
    };
    let index = Hnsw::new(corpus.view(), Metric::Dot, params).unwrap();
    let q: Vec<f32> = queries.iter().copied().collect();
    let res = search_all(&index, &q, dim, 10, 64);

    let file_truth: Vec<Vec<u32>> = gt.outer_iter().map(|r| r.to_vec()).collect();
    let vs_file = recall_at_k(&res, &file_truth, 10).unwrap();
    let oracle_truth = exact_ids(corpus.as_slice().unwrap(), dim, Metric::Dot, &q, 10);
    let vs_oracle = recall_at_k(&res, &oracle_truth, 10).unwrap();
    // The float64 ground truth may order near-equal scores differently from the
    // canonical f32 order, but the two must agree almost everywhere.
    let agree = recall_at_k(
        &oracle_truth
            .iter()
            .map(|ids| {
                ids.iter()
                    .map(|&i| topk_core::Neighbor::new(i, 0.0))
                    .collect()
            })
            .collect::<Vec<_>>(),
        &file_truth,
        10,
    )
    .unwrap();
    eprintln!("minilm-docs-20k: recall@10 at ef=64 vs oracle {vs_oracle:.4}, vs gt file {vs_file:.4}; oracle vs file {agree:.4}");
    assert!(
        agree >= 0.99,
        "oracle and ground-truth file disagree: {agree}"
    );
    assert!(vs_oracle >= 0.95, "recall@10 vs oracle = {vs_oracle}");
    assert!(vs_file >= 0.95, "recall@10 vs gt_top100.ivecs = {vs_file}");
}

//! Fixtures shared by the integration tests: seeded corpora, indexes built
//! once per test binary, and exact ground truth from the scalar oracle.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::OnceLock;

use ndarray::ArrayView2;
use topk_core::{Metric, Neighbor, Retriever};
use topk_cpu::Oracle;
use topk_hnsw::{synth, Hnsw, HnswParams};

pub const N: usize = 20_000;
pub const D: usize = 64;
pub const Q: usize = 200;
pub const CLUSTERS: usize = 64;
pub const SPREAD: f32 = 0.6;
pub const SEED: u64 = 20_260_101;

/// Build parameters of the 20k fixtures: M = 16 with a modest
/// ef_construction keeps the test binary's builds to a few seconds.
pub fn params() -> HnswParams {
    HnswParams {
        m: 16,
        ef_construction: 64,
        ef_search: 64,
        seed: 7,
        ..HnswParams::default()
    }
}

pub struct Fixture {
    pub corpus: Vec<f32>,
    pub queries: Vec<f32>,
    /// Exact top-10 ids per query (scalar oracle).
    pub truth: Vec<Vec<u32>>,
}

pub fn gaussian() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let corpus = synth::gaussian_clusters(N, D, CLUSTERS, SPREAD, SEED);
        let queries = synth::cluster_queries(Q, D, CLUSTERS, SPREAD, SEED);
        let truth = exact_ids(&corpus, D, Metric::L2, &queries, 10);
        Fixture {
            corpus,
            queries,
            truth,
        }
    })
}

pub fn sequential_index() -> &'static Hnsw {
    static I: OnceLock<Hnsw> = OnceLock::new();
    I.get_or_init(|| Hnsw::build(&gaussian().corpus, D, Metric::L2, params()).unwrap())
}

pub fn parallel_index() -> &'static Hnsw {
    static I: OnceLock<Hnsw> = OnceLock::new();
    I.get_or_init(|| Hnsw::build_parallel(&gaussian().corpus, D, Metric::L2, params()).unwrap())
}

/// Exact top-`k` ids of every query, from topk-cpu's scalar oracle.
pub fn exact_ids(
    corpus: &[f32],
    dim: usize,
    metric: Metric,
    queries: &[f32],
    k: usize,
) -> Vec<Vec<u32>> {
    exact(corpus, dim, metric, queries, k)
        .into_iter()
        .map(|r| r.into_iter().map(|n| n.index).collect())
        .collect()
}

/// Exact top-`k` neighbours of every query, from topk-cpu's scalar oracle.
pub fn exact(
    corpus: &[f32],
    dim: usize,
    metric: Metric,
    queries: &[f32],
    k: usize,
) -> Vec<Vec<Neighbor>> {
    let oracle = Oracle::from_rowmajor(corpus.to_vec(), dim, metric).unwrap();
    let qs = ArrayView2::from_shape((queries.len() / dim, dim), queries).unwrap();
    oracle.search_batch(qs, k).unwrap()
}

/// All queries' results at beam width `ef`.
pub fn search_all(
    index: &Hnsw,
    queries: &[f32],
    dim: usize,
    k: usize,
    ef: usize,
) -> Vec<Vec<Neighbor>> {
    let qs = ArrayView2::from_shape((queries.len() / dim, dim), queries).unwrap();
    index.search_batch_with_ef(qs, k, ef).unwrap()
}

/// The real-embedding set, or `None` (with a message) where it is absent
/// and `TOPK_REQUIRE_DATA=1` is not set.
pub fn minilm_dir() -> Option<PathBuf> {
    topk_testkit::shared_data("minilm-docs-20k")
}

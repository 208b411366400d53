//! Indexes built from an exact kNN graph (`Hnsw::build_from_knn`,
//! `Hnsw::build_knn_cpu`): recall against the insertion build, index files,
//! determinism, and bad inputs.

mod common;

use common::{exact_ids, minilm_dir};
use topk_core::{Metric, Retriever};
use topk_cpu::CpuRetriever;
use topk_hnsw::{recall_at_k, synth, Hnsw, HnswError, HnswParams, KnnSource};

const N: usize = 5_000;
const D: usize = 32;
const Q: usize = 200;
const CLUSTERS: usize = 32;
const SPREAD: f32 = 0.6;
const SEED: u64 = 20_261_201;

fn params() -> HnswParams {
    HnswParams {
        m: 16,
        ef_construction: 100,
        ef_search: 64,
        seed: 3,
        ..HnswParams::default()
    }
}

fn recall(index: &Hnsw, queries: &[f32], truth: &[Vec<u32>], ef: usize) -> f64 {
    let mut res = Vec::new();
    for q in queries.chunks_exact(D) {
        let mut out = Vec::new();
        index.search_with_ef(q, 10, ef, &mut out).unwrap();
        res.push(out);
    }
    recall_at_k(&res, truth, 10).unwrap()
}

#[test]
fn recall_matches_the_insertion_build() {
    let corpus = synth::gaussian_clusters(N, D, CLUSTERS, SPREAD, SEED);
    let queries = synth::cluster_queries(Q, D, CLUSTERS, SPREAD, SEED);
    for metric in [Metric::L2, Metric::Cosine] {
        let truth = exact_ids(&corpus, D, metric, &queries, 10);
        let knn = Hnsw::build_knn_cpu(&corpus, D, metric, params()).unwrap();
        let ins = Hnsw::build(&corpus, D, metric, params()).unwrap();
        for ef in [16, 64] {
            let (rk, ri) = (
                recall(&knn, &queries, &truth, ef),
                recall(&ins, &queries, &truth, ef),
            );
            eprintln!("{metric} ef={ef}: kNN build {rk:.4}, insertion build {ri:.4}");
            if ef == 64 {
                assert!(
                    rk >= ri - 0.01,
                    "{metric} ef = {ef}: kNN {rk}, insertion {ri}"
                );
            }
        }
    }
}

#[test]
fn recall_on_minilm_docs_matches_the_insertion_build() {
    let Some(dir) = minilm_dir() else { return };
    let corpus = topk_io::read_matrix(dir.join("corpus.npy")).unwrap();
    let queries = topk_io::read_matrix(dir.join("queries.npy")).unwrap();
    let (dim, data) = (corpus.ncols(), corpus.as_slice().unwrap());
    let q: Vec<f32> = queries.iter().copied().collect();
    let truth = exact_ids(data, dim, Metric::Dot, &q, 10);
    let params = HnswParams {
        m: 16,
        ef_construction: 64,
        ef_search: 64,
        seed: 3,
        parallel: true,
    };
    let knn = Hnsw::build_knn_cpu(data, dim, Metric::Dot, params).unwrap();
    let ins = Hnsw::build_parallel(data, dim, Metric::Dot, params).unwrap();
    let recall = |index: &Hnsw, ef: usize| {
        let mut res = Vec::new();
        for query in q.chunks_exact(dim) {
            let mut out = Vec::new();
            index.search_with_ef(query, 10, ef, &mut out).unwrap();
            res.push(out);
        }
        recall_at_k(&res, &truth, 10).unwrap()
    };
    for ef in [16, 64] {
        let (rk, ri) = (recall(&knn, ef), recall(&ins, ef));
        eprintln!("minilm-docs-20k ef={ef}: kNN build {rk:.4}, parallel insertion build {ri:.4}");
        if ef == 64 {
            assert!(rk >= ri - 0.01, "ef = {ef}: kNN {rk}, insertion {ri}");
        }
    }
}

#[test]
fn index_file_round_trips_and_searches_alike() {
    let corpus = synth::gaussian_clusters(2_000, D, CLUSTERS, SPREAD, SEED);
    let queries = synth::cluster_queries(50, D, CLUSTERS, SPREAD, SEED);
    let index = Hnsw::build_knn_cpu(&corpus, D, Metric::Dot, params()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("knn.hnsw");
    index.save(&path).unwrap();
    let loaded = Hnsw::load(&path).unwrap();
    assert!(loaded.to_bytes() == index.to_bytes());
    for q in queries.chunks_exact(D) {
        assert_eq!(loaded.search(q, 10).unwrap(), index.search(q, 10).unwrap());
    }
}

#[test]
fn the_same_inputs_give_the_same_file() {
    let corpus = synth::gaussian_clusters(3_000, 16, 8, 0.5, 9);
    let a = Hnsw::build_knn_cpu(&corpus, 16, Metric::L2, params()).unwrap();
    let b = Hnsw::build_knn_cpu(&corpus, 16, Metric::L2, params()).unwrap();
    assert!(a.to_bytes() == b.to_bytes());
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    let c = pool.install(|| Hnsw::build_knn_cpu(&corpus, 16, Metric::L2, params()).unwrap());
    assert!(c.to_bytes() == a.to_bytes());
    let other_seed = HnswParams {
        seed: 4,
        ..params()
    };
    let d = Hnsw::build_knn_cpu(&corpus, 16, Metric::L2, other_seed).unwrap();
    assert!(
        d.to_bytes() != a.to_bytes(),
        "the seed must reach the level draw"
    );
}

#[test]
fn built_index_inserts_and_deletes() {
    let corpus = synth::gaussian_clusters(1_000, 8, 4, 0.5, 2);
    let mut index = Hnsw::build_knn_cpu(&corpus, 8, Metric::L2, params()).unwrap();
    assert!(index.mark_deleted(5).unwrap());
    let row5 = &corpus[5 * 8..6 * 8];
    assert!(index.search(row5, 5).unwrap().iter().all(|h| h.index != 5));
    assert_eq!(index.insert(row5).unwrap(), 5);
    assert_eq!(index.search(row5, 1).unwrap()[0].index, 5);
}

#[test]
fn tiny_corpora_build_and_answer_every_row() {
    let p = params();
    for n in [1, 2, 3, p.m0() - 1, p.m0(), p.m0() + 1] {
        let corpus = synth::gaussian_clusters(n, 4, 2, 0.5, n as u64);
        let index = Hnsw::build_knn_cpu(&corpus, 4, Metric::L2, p).unwrap();
        assert_eq!(index.len(), n);
        for (i, row) in corpus.chunks_exact(4).enumerate() {
            let hits = index.search(row, n).unwrap();
            assert_eq!(hits.len(), n, "n = {n}");
            assert_eq!(hits[0].index, i as u32, "n = {n}");
        }
    }
}

#[test]
fn lists_wider_than_the_candidate_cap_build() {
    // m0 = 1200 is above MAX_KNN_CANDIDATES: every list takes m0 candidates.
    let p = HnswParams { m: 600, ..params() };
    assert!(p.m0() > topk_hnsw::MAX_KNN_CANDIDATES);
    let corpus = synth::gaussian_clusters(1_500, 4, 4, 0.5, 3);
    let index = Hnsw::build_knn_cpu(&corpus, 4, Metric::L2, p).unwrap();
    for (i, row) in corpus.chunks_exact(4).enumerate().step_by(97) {
        assert_eq!(index.search(row, 1).unwrap()[0].index, i as u32);
    }
}

#[test]
fn bad_parameters_and_inputs_are_typed_errors() {
    let corpus = synth::gaussian_clusters(100, 4, 2, 0.5, 1);
    let e = Hnsw::build_knn_cpu(&corpus, 4, Metric::L2, HnswParams::with_m(1)).unwrap_err();
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
    let zero_ef = HnswParams {
        ef_construction: 0,
        ..params()
    };
    let e = Hnsw::build_knn_cpu(&corpus, 4, Metric::L2, zero_ef).unwrap_err();
    assert!(
        matches!(
            e,
            HnswError::InvalidParameter {
                name: "ef_construction",
                ..
            }
        ),
        "{e}"
    );
    let e = Hnsw::build_knn_cpu(&[], 4, Metric::L2, params()).unwrap_err();
    assert!(
        matches!(e, HnswError::Input(topk_core::Error::EmptyCorpus)),
        "{e}"
    );
    let e = Hnsw::build_knn_cpu(&corpus[..7], 4, Metric::L2, params()).unwrap_err();
    assert!(matches!(e, HnswError::Input(_)), "{e}");
    let mut nan = corpus.clone();
    nan[13] = f32::NAN;
    let e = Hnsw::build_knn_cpu(&nan, 4, Metric::L2, params()).unwrap_err();
    assert!(matches!(e, HnswError::Input(_)), "{e}");

    // A source over fewer rows than the corpus.
    let short = CpuRetriever::from_rowmajor(corpus[..40].to_vec(), 4, Metric::L2).unwrap();
    let e = Hnsw::build_from_knn(&corpus, 4, Metric::L2, params(), &short).unwrap_err();
    assert!(matches!(e, HnswError::KnnSource { .. }), "{e}");
    assert!(e.to_string().contains("10 rows"), "{e}");
    // A source under another metric scores the rows differently.
    let dot = CpuRetriever::from_rowmajor(corpus.clone(), 4, Metric::Dot).unwrap();
    assert_eq!(dot.rows(), 100);
    let e = Hnsw::build_from_knn(&corpus, 4, Metric::L2, params(), &dot).unwrap_err();
    assert!(matches!(e, HnswError::KnnSource { .. }), "{e}");
}

#[test]
fn progress_reports_rows_and_does_not_change_the_graph() {
    let corpus = synth::gaussian_clusters(9_000, 4, 4, 0.5, 5);
    let cpu = CpuRetriever::from_rowmajor(corpus.clone(), 4, Metric::L2).unwrap();
    let seen = std::sync::Mutex::new(Vec::new());
    let report = |rows: usize| seen.lock().unwrap().push(rows);
    let watched =
        Hnsw::build_from_knn_with_progress(&corpus, 4, Metric::L2, params(), &cpu, &report)
            .unwrap();
    let plain = Hnsw::build_from_knn(&corpus, 4, Metric::L2, params(), &cpu).unwrap();
    assert!(watched.to_bytes() == plain.to_bytes());
    assert_eq!(*seen.lock().unwrap(), vec![4096, 8192, 9000, 9000]);
}

/// The GPU engine as the source: the same index as the CPU engine gives.
/// Without a device the cases print why and pass, unless
/// `TOPK_REQUIRE_GPU=1`.
#[cfg(feature = "cuda")]
mod gpu {
    use topk_core::Metric;
    use topk_cuda::{CudaConfig, CudaRetriever};
    use topk_hnsw::{synth, Hnsw, HnswError, HnswParams, GPU_LAYER_MIN_ROWS};
    use topk_testkit::gpu_or_skip;

    #[test]
    fn gpu_knn_build_is_the_cpu_knn_build() {
        let Some(()) = gpu_or_skip() else { return };
        // m = 4 puts about 10k nodes on layer 1, so its later blocks run on
        // an engine of their own.
        let (n, dim) = (40_000, 16);
        let params = HnswParams {
            m: 4,
            ef_construction: 40,
            ..HnswParams::default()
        };
        assert!(n / params.m > GPU_LAYER_MIN_ROWS);
        let data = synth::gaussian_clusters(n, dim, 64, 0.5, 12);
        for metric in Metric::ALL {
            let gpu =
                CudaRetriever::from_rowmajor(data.clone(), dim, metric, CudaConfig::default())
                    .unwrap();
            let on_gpu = Hnsw::build_knn_gpu(&data, dim, metric, params, &gpu).unwrap();
            let on_cpu = Hnsw::build_knn_cpu(&data, dim, metric, params).unwrap();
            assert!(
                on_gpu.to_bytes() == on_cpu.to_bytes(),
                "{metric}: graphs differ"
            );
        }
    }

    #[test]
    fn an_engine_over_other_rows_is_refused() {
        let Some(()) = gpu_or_skip() else { return };
        let (n, dim) = (2_000, 8);
        let data = synth::gaussian_clusters(n, dim, 8, 0.5, 1);
        let other = synth::gaussian_clusters(n, dim, 8, 0.5, 2);
        let params = HnswParams::default();
        let gpu =
            CudaRetriever::from_rowmajor(other, dim, Metric::L2, CudaConfig::default()).unwrap();
        let e = Hnsw::build_knn_gpu(&data, dim, Metric::L2, params, &gpu).unwrap_err();
        assert!(matches!(e, HnswError::GpuMismatch { .. }), "{e}");
        let short = CudaRetriever::from_rowmajor(
            data[..dim * 100].to_vec(),
            dim,
            Metric::L2,
            CudaConfig::default(),
        )
        .unwrap();
        let e = Hnsw::build_knn_gpu(&data, dim, Metric::L2, params, &short).unwrap_err();
        assert!(matches!(e, HnswError::GpuMismatch { .. }), "{e}");
    }
}

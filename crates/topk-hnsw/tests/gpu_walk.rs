//! GPU graph search (`Hnsw::search_graph_gpu`) against the CPU walk, bit for
//! bit: every metric, beam widths from k to past the corpus, deletions,
//! allow-lists, forced ties, and any batch composition.
//!
//! Without a device (or without the `cuda` feature) the cases print why and
//! pass, unless `TOPK_REQUIRE_GPU=1`, under which a missing device fails.
#![cfg(feature = "cuda")]

use ndarray::ArrayView2;
use proptest::prelude::*;
use topk_core::{Metric, Neighbor};
use topk_cuda::{CudaConfig, CudaRetriever, SeenSet};
use topk_hnsw::{synth, Hnsw, HnswError, HnswParams, SlotFilter};
use topk_testkit::gpu_or_skip;

fn bits(v: &[Neighbor]) -> Vec<(u32, u32)> {
    v.iter().map(|n| (n.index, n.score.to_bits())).collect()
}

fn params(m: usize, seed: u64) -> HnswParams {
    HnswParams {
        m,
        ef_construction: 60,
        ef_search: 40,
        seed,
        parallel: false,
    }
}

fn engine(data: &[f32], dim: usize, metric: Metric) -> CudaRetriever {
    CudaRetriever::from_rowmajor(data.to_vec(), dim, metric, CudaConfig::default()).unwrap()
}

/// Every query's GPU answer equals the CPU walk's, and the device walked
/// (did not hand back) every query of an unfiltered search.
fn assert_same(
    index: &Hnsw,
    gpu: &CudaRetriever,
    queries: &[f32],
    dim: usize,
    k: usize,
    ef: usize,
    width: usize,
) {
    let nq = queries.len() / dim;
    let qs = ArrayView2::from_shape((nq, dim), queries).unwrap();
    let g = index.upload_graph(gpu).unwrap();
    let (got, counts) = index
        .search_graph_gpu_counted(&g, qs, k, ef, width, None)
        .unwrap();
    let want = if width == 1 {
        index.search_batch_with_ef(qs, k, ef).unwrap()
    } else {
        index.search_batch_wide(qs, k, ef, width, None).unwrap()
    };
    for (i, (a, b)) in got.iter().zip(&want).enumerate() {
        assert_eq!(bits(a), bits(b), "query {i}, k {k}, ef {ef}, width {width}");
    }
    assert_eq!(counts.device + counts.host, nq);
}

#[test]
fn every_metric_and_beam_width_gives_the_cpu_bits() {
    let Some(()) = gpu_or_skip() else { return };
    for (dim, m) in [(48, 12), (7, 4), (100, 16), (384, 32), (33, 64)] {
        let n = 4_000;
        let data = synth::gaussian_clusters(n, dim, 24, 0.6, dim as u64);
        let queries = synth::cluster_queries(200, dim, 24, 0.6, 99);
        for metric in Metric::ALL {
            let gpu = engine(&data, dim, metric);
            let index = Hnsw::build(&data, dim, metric, params(m, 5)).unwrap();
            for (k, ef) in [(1, 1), (10, 10), (10, 64), (50, 200), (100, 700)] {
                assert_same(&index, &gpu, &queries, dim, k, ef, 1);
            }
            // The device walks every unfiltered query with ef below n.
            let qs = ArrayView2::from_shape((200, dim), &queries[..]).unwrap();
            let g = index.upload_graph(&gpu).unwrap();
            let (_, counts) = index
                .search_graph_gpu_counted(&g, qs, 10, 64, 1, None)
                .unwrap();
            assert_eq!(counts.device, 200, "{metric} d {dim}");
        }
    }
}

#[test]
fn a_query_answer_does_not_depend_on_its_batch() {
    let Some(()) = gpu_or_skip() else { return };
    let dim = 32;
    let data = synth::gaussian_clusters(3_000, dim, 16, 0.5, 3);
    let queries = synth::cluster_queries(257, dim, 16, 0.5, 4);
    let gpu = engine(&data, dim, Metric::L2);
    let index = Hnsw::build(&data, dim, Metric::L2, params(8, 1)).unwrap();
    let g = index.upload_graph(&gpu).unwrap();
    let all = ArrayView2::from_shape((257, dim), &queries[..]).unwrap();
    let whole = index.search_graph_gpu(&g, all, 10, 48).unwrap();
    // One at a time, reversed, and in odd-sized slices.
    for i in 0..257 {
        let one = ArrayView2::from_shape((1, dim), &queries[i * dim..(i + 1) * dim]).unwrap();
        assert_eq!(
            bits(&index.search_graph_gpu(&g, one, 10, 48).unwrap()[0]),
            bits(&whole[i])
        );
    }
    let reversed: Vec<f32> = queries.chunks(dim).rev().flatten().copied().collect();
    let rev = ArrayView2::from_shape((257, dim), &reversed[..]).unwrap();
    for (i, r) in index
        .search_graph_gpu(&g, rev, 10, 48)
        .unwrap()
        .iter()
        .enumerate()
    {
        assert_eq!(bits(r), bits(&whole[256 - i]), "reversed position {i}");
    }
    for size in [2, 7, 64, 100] {
        for (c, part) in queries.chunks(size * dim).enumerate() {
            let v = ArrayView2::from_shape((part.len() / dim, dim), part).unwrap();
            for (j, r) in index
                .search_graph_gpu(&g, v, 10, 48)
                .unwrap()
                .iter()
                .enumerate()
            {
                assert_eq!(bits(r), bits(&whole[c * size + j]), "batch {size}");
            }
        }
    }
    // A strided view gives the same answers as the contiguous batch.
    let wide: Vec<f32> = queries
        .chunks(dim)
        .flat_map(|q| q.iter().chain(q))
        .copied()
        .collect();
    let strided = ArrayView2::from_shape((257, 2 * dim), &wide[..]).unwrap();
    let left = strided.slice(ndarray::s![.., ..dim]);
    for (i, r) in index
        .search_graph_gpu(&g, left, 10, 48)
        .unwrap()
        .iter()
        .enumerate()
    {
        assert_eq!(bits(r), bits(&whole[i]), "strided query {i}");
    }
}

/// Every block size the walk has gives the CPU bits, with and without an
/// allow-list, with either seen set (16-bit tags or 32-bit ids); a team
/// narrower than the graph's lists is refused by name.
#[test]
fn every_team_size_gives_the_cpu_bits() {
    let Some(()) = gpu_or_skip() else { return };
    let n = 5_000;
    for (dim, m) in [(40, 12), (96, 16), (33, 64)] {
        let data = synth::gaussian_clusters(n, dim, 20, 0.6, 40 + dim as u64);
        let queries = synth::cluster_queries(120, dim, 20, 0.6, 41);
        let qs = ArrayView2::from_shape((120, dim), &queries[..]).unwrap();
        let filter = SlotFilter::from_fn(n, |s| s % 3 != 0);
        for metric in Metric::ALL {
            let index = Hnsw::build(&data, dim, metric, params(m, 6)).unwrap();
            let want = index.search_batch_with_ef(qs, 10, 60).unwrap();
            let want_filtered: Vec<Vec<Neighbor>> = queries
                .chunks(dim)
                .map(|q| {
                    let mut w = Vec::new();
                    index
                        .search_filtered_with_ef(q, 10, 60, &filter, &mut w)
                        .unwrap();
                    w
                })
                .collect();
            let runs = topk_cuda::WALK_TEAMS
                .into_iter()
                .flat_map(|t| [(t, SeenSet::Tags), (t, SeenSet::Ids)]);
            for (threads, seen) in runs {
                let mut config = CudaConfig::default();
                config.tuning.walk_threads = threads;
                config.tuning.walk_seen = seen;
                let gpu = CudaRetriever::from_rowmajor(data.clone(), dim, metric, config).unwrap();
                let g = index.upload_graph(&gpu).unwrap();
                let got = index.search_graph_gpu_counted(&g, qs, 10, 60, 1, None);
                if (threads as usize) < 2 * m {
                    let e = got.unwrap_err().to_string();
                    assert!(
                        e.contains("walk threads") && e.contains(&threads.to_string()),
                        "{e}"
                    );
                    continue;
                }
                let (got, counts) = got.unwrap();
                let case = format!("{metric} d {dim} team {threads} seen {seen:?}");
                assert_eq!(counts.device, 120, "{case}");
                for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(bits(a), bits(b), "{case} query {i}");
                }
                let got = index
                    .search_graph_gpu_counted(&g, qs, 10, 60, 1, Some(&filter))
                    .unwrap()
                    .0;
                for (i, (a, b)) in got.iter().zip(&want_filtered).enumerate() {
                    assert_eq!(bits(a), bits(b), "{case} filtered query {i}");
                }
            }
        }
    }
}

/// Every width the walk takes gives the CPU walk's bits at that width,
/// unfiltered, filtered and with deletions, by the team the engine picks
/// and by forced ones (a step of more slots than threads included), and a
/// query's answer does not depend on its batch; widths past the limits are
/// refused by name.
#[test]
fn every_walk_width_gives_the_cpu_bits() {
    let Some(()) = gpu_or_skip() else { return };
    let n = 5_000;
    for (dim, m) in [(40, 8), (96, 16), (33, 32)] {
        let data = synth::gaussian_clusters(n, dim, 20, 0.6, 50 + dim as u64);
        let queries = synth::cluster_queries(150, dim, 20, 0.6, 51);
        let qs = ArrayView2::from_shape((150, dim), &queries[..]).unwrap();
        let filter = SlotFilter::from_fn(n, |s| s % 4 != 1);
        for metric in Metric::ALL {
            let mut index = Hnsw::build(&data, dim, metric, params(m, 7)).unwrap();
            for s in (0..n as u32).step_by(11) {
                index.mark_deleted(s).unwrap();
            }
            for threads in [0, 64, 256] {
                if threads != 0 && (threads as usize) < 2 * m {
                    continue;
                }
                let mut config = CudaConfig::default();
                config.tuning.walk_threads = threads;
                let gpu = CudaRetriever::from_rowmajor(data.clone(), dim, metric, config).unwrap();
                let g = index.upload_graph(&gpu).unwrap();
                for width in 1..=topk_hnsw::MAX_WALK_WIDTH {
                    let case = format!("{metric} d {dim} m {m} team {threads} width {width}");
                    let (got, counts) = index
                        .search_graph_gpu_counted(&g, qs, 10, 60, width, None)
                        .unwrap();
                    assert_eq!(counts.device, 150, "{case}");
                    let want = index.search_batch_wide(qs, 10, 60, width, None).unwrap();
                    for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                        assert_eq!(bits(a), bits(b), "{case} query {i}");
                    }
                    let got = index
                        .search_graph_gpu_counted(&g, qs, 10, 60, width, Some(&filter))
                        .unwrap()
                        .0;
                    let want = index
                        .search_batch_wide(qs, 10, 60, width, Some(&filter))
                        .unwrap();
                    for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                        assert_eq!(bits(a), bits(b), "{case} filtered query {i}");
                    }
                    // One query alone, and the batch reversed, against the
                    // CPU answers of the whole batch.
                    let one = ArrayView2::from_shape((1, dim), &queries[7 * dim..8 * dim]).unwrap();
                    let alone = index
                        .search_graph_gpu_counted(&g, one, 10, 60, width, None)
                        .unwrap()
                        .0;
                    let whole = index.search_batch_wide(qs, 10, 60, width, None).unwrap();
                    let reversed: Vec<f32> = queries.chunks(dim).rev().flatten().copied().collect();
                    let rev = ArrayView2::from_shape((150, dim), &reversed[..]).unwrap();
                    let back = index
                        .search_graph_gpu_counted(&g, rev, 10, 60, width, None)
                        .unwrap()
                        .0;
                    for (i, r) in back.iter().enumerate() {
                        assert_eq!(bits(r), bits(&whole[149 - i]), "{case} reversed {i}");
                    }
                    assert_eq!(bits(&alone[0]), bits(&whole[7]), "{case} alone");
                }
            }
            let gpu = engine(&data, dim, metric);
            let g = index.upload_graph(&gpu).unwrap();
            for width in [0, topk_hnsw::MAX_WALK_WIDTH + 1] {
                assert!(
                    matches!(
                        index.search_graph_gpu_counted(&g, qs, 10, 60, width, None),
                        Err(HnswError::InvalidParameter { name: "width", .. })
                    ),
                    "width {width}"
                );
            }
        }
    }
}

#[test]
fn deletions_and_allow_lists_match_the_cpu_walk() {
    let Some(()) = gpu_or_skip() else { return };
    let dim = 24;
    let n = 6_000;
    let data = synth::gaussian_clusters(n, dim, 20, 0.6, 11);
    let queries = synth::cluster_queries(150, dim, 20, 0.6, 12);
    let qs = ArrayView2::from_shape((150, dim), &queries[..]).unwrap();
    for metric in Metric::ALL {
        let gpu = engine(&data, dim, metric);
        let mut index = Hnsw::build(&data, dim, metric, params(10, 2)).unwrap();
        for s in (0..n as u32).step_by(7) {
            index.mark_deleted(s).unwrap();
        }
        let g = index.upload_graph(&gpu).unwrap();
        let got = index.search_graph_gpu(&g, qs, 10, 50).unwrap();
        for (i, (q, r)) in queries.chunks(dim).zip(&got).enumerate() {
            let mut want = Vec::new();
            index.search_with_ef(q, 10, 50, &mut want).unwrap();
            assert_eq!(bits(r), bits(&want), "{metric}: deleted, query {i}");
            assert!(r.iter().all(|h| h.index % 7 != 0));
        }
        for keep in [2u32, 3, 10, 40] {
            let filter = SlotFilter::from_fn(n, |s| s % keep == 1);
            let (got, counts) = index
                .search_graph_gpu_counted(&g, qs, 10, 50, 1, Some(&filter))
                .unwrap();
            for (i, (q, r)) in queries.chunks(dim).zip(&got).enumerate() {
                let mut want = Vec::new();
                index
                    .search_filtered_with_ef(q, 10, 50, &filter, &mut want)
                    .unwrap();
                assert_eq!(bits(r), bits(&want), "{metric}: 1 in {keep}, query {i}");
            }
            assert_eq!(counts.device + counts.host, 150);
        }
    }
}

#[test]
fn stale_mismatched_and_bad_inputs_are_errors() {
    let Some(()) = gpu_or_skip() else { return };
    let dim = 16;
    let data = synth::gaussian_clusters(1_000, dim, 8, 0.5, 1);
    let gpu = engine(&data, dim, Metric::Dot);
    let mut index = Hnsw::build(&data, dim, Metric::Dot, params(8, 1)).unwrap();
    let g = index.upload_graph(&gpu).unwrap();
    let q = vec![0.5f32; dim];
    let one = ArrayView2::from_shape((1, dim), &q[..]).unwrap();
    assert!(index.search_graph_gpu(&g, one, 0, 10).is_err(), "k = 0");
    assert!(index.search_graph_gpu(&g, one, 5, 0).is_err(), "ef = 0");
    let short = ArrayView2::from_shape((1, dim - 1), &q[..dim - 1]).unwrap();
    assert!(
        index.search_graph_gpu(&g, short, 5, 10).is_err(),
        "wrong width"
    );
    let mut nan = q.clone();
    nan[3] = f32::NAN;
    let bad = ArrayView2::from_shape((1, dim), &nan[..]).unwrap();
    assert!(index.search_graph_gpu(&g, bad, 5, 10).is_err(), "NaN query");
    // Another index of the same shape, and the same index after an insert.
    let other = Hnsw::build(&data, dim, Metric::Dot, params(8, 2)).unwrap();
    assert!(matches!(
        other.search_graph_gpu(&g, one, 5, 10),
        Err(HnswError::GpuGraphStale)
    ));
    drop(g);
    index.insert(&q).unwrap();
    assert!(matches!(
        index.upload_graph(&gpu),
        Err(HnswError::GpuMismatch { .. })
    ));
    let other_rows = synth::gaussian_clusters(1_000, dim, 8, 0.5, 9);
    let wrong = engine(&other_rows, dim, Metric::Dot);
    assert!(matches!(
        other.upload_graph(&wrong),
        Err(HnswError::GpuMismatch { .. })
    ));
    // Lists longer than the device walk takes are refused at upload.
    let wide = Hnsw::build(&data, dim, Metric::Dot, params(65, 1)).unwrap();
    let e = wide.upload_graph(&gpu).unwrap_err();
    assert!(e.to_string().contains("m0 = 130"), "{e}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Corpora of few distinct small-integer rows (so many scores tie
    /// exactly and rows repeat), any metric, k and ef: the device walk
    /// breaks every tie as the CPU walk does.
    #[test]
    fn forced_ties_give_the_cpu_bits(
        distinct in 1usize..40,
        n in 50usize..1500,
        dim in 1usize..12,
        metric in prop::sample::select(Metric::ALL.to_vec()),
        k in 1usize..30,
        ef in 1usize..120,
        width in 1usize..=8,
        seed in any::<u64>(),
    ) {
        let Some(()) = gpu_or_skip() else { return Ok(()) };
        let (data, queries) = synth::tied_rows(distinct, n, dim, 20, seed);
        let gpu = engine(&data, dim, metric);
        let index = Hnsw::build(&data, dim, metric, params(6, seed)).unwrap();
        assert_same(&index, &gpu, &queries, dim, k.min(n), ef, width);
    }
}

/// A small case for the sanitizers (memcheck, racecheck): every metric,
/// unfiltered and filtered walks over a few hundred rows, by the team the
/// engine picks (256 threads, 32-bit seen ids) and by teams of 32 and 64
/// told to keep 16-bit seen tags, at widths 1, 4 and 8.
#[test]
fn small_walks_match_the_cpu() {
    let Some(()) = gpu_or_skip() else { return };
    let dim = 20;
    let n = 600;
    let data = synth::gaussian_clusters(n, dim, 6, 0.5, 21);
    let queries = synth::cluster_queries(24, dim, 6, 0.5, 22);
    let qs = ArrayView2::from_shape((24, dim), &queries[..]).unwrap();
    let filter = SlotFilter::from_fn(n, |s| s % 3 != 0);
    for (metric, threads) in Metric::ALL
        .into_iter()
        .flat_map(|m| [(m, 0), (m, 32), (m, 64)])
    {
        let mut config = CudaConfig::default();
        config.tuning.walk_threads = threads;
        if threads != 0 {
            config.tuning.walk_seen = SeenSet::Tags;
        }
        let gpu = CudaRetriever::from_rowmajor(data.clone(), dim, metric, config).unwrap();
        let index = Hnsw::build(&data, dim, metric, params(8, 4)).unwrap();
        // Wide walks too: a 32-thread team reads a step of 8 lists of 16
        // slots four slots a thread.
        for width in [1, 4, 8] {
            assert_same(&index, &gpu, &queries, dim, 10, 40, width);
        }
        let g = index.upload_graph(&gpu).unwrap();
        let got = index
            .search_graph_gpu_filtered(&g, qs, 10, 40, &filter)
            .unwrap();
        for (i, (q, r)) in queries.chunks(dim).zip(&got).enumerate() {
            let mut want = Vec::new();
            index
                .search_filtered_with_ef(q, 10, 40, &filter, &mut want)
                .unwrap();
            assert_eq!(
                bits(r),
                bits(&want),
                "{metric} team {threads}: filtered query {i}"
            );
        }
    }
}

/// More queries than one launch takes (65,536): the batch is walked in
/// launches of that size and every answer is still the CPU walk's.
#[test]
fn batches_past_one_launch_match_the_cpu() {
    let Some(()) = gpu_or_skip() else { return };
    let dim = 8;
    let data = synth::gaussian_clusters(2_000, dim, 10, 0.5, 31);
    let nq = 70_001;
    let queries = synth::cluster_queries(nq, dim, 10, 0.5, 32);
    let gpu = engine(&data, dim, Metric::Cosine);
    let index = Hnsw::build(&data, dim, Metric::Cosine, params(6, 3)).unwrap();
    let qs = ArrayView2::from_shape((nq, dim), &queries[..]).unwrap();
    let g = index.upload_graph(&gpu).unwrap();
    let (got, counts) = index
        .search_graph_gpu_counted(&g, qs, 5, 24, 1, None)
        .unwrap();
    assert_eq!(counts.device, nq);
    let want = index.search_batch_with_ef(qs, 5, 24).unwrap();
    let differ = got
        .iter()
        .zip(&want)
        .filter(|(a, b)| bits(a) != bits(b))
        .count();
    assert_eq!(differ, 0, "{differ} of {nq} queries differ");
}

/// Index files are interchangeable: a graph built on the GPU (`build_knn_gpu`)
/// or on the CPU, saved and loaded, is walked on the device with the answers
/// the CPU walk gives on the original index.
#[test]
fn saved_and_loaded_graphs_walk_the_same() {
    let Some(()) = gpu_or_skip() else { return };
    let dim = 24;
    let data = synth::gaussian_clusters(3_000, dim, 12, 0.5, 41);
    let queries = synth::cluster_queries(100, dim, 12, 0.5, 42);
    let qs = ArrayView2::from_shape((100, dim), &queries[..]).unwrap();
    let gpu = engine(&data, dim, Metric::Dot);
    let dir = tempfile::tempdir().unwrap();
    let built = [
        Hnsw::build(&data, dim, Metric::Dot, params(8, 6)).unwrap(),
        Hnsw::build_knn_gpu(&data, dim, Metric::Dot, params(8, 6), &gpu).unwrap(),
    ];
    for (i, index) in built.iter().enumerate() {
        let path = dir.path().join(format!("g{i}.hnsw"));
        index.save(&path).unwrap();
        let loaded = Hnsw::load(&path).unwrap();
        let g = loaded.upload_graph(&gpu).unwrap();
        let got = loaded.search_graph_gpu(&g, qs, 10, 40).unwrap();
        let want = index.search_batch_with_ef(qs, 10, 40).unwrap();
        for (q, (a, b)) in got.iter().zip(&want).enumerate() {
            assert_eq!(bits(a), bits(b), "graph {i}, query {q}");
        }
    }
}

//! The GPU-batched distance path against the CPU path, bit for bit: the same
//! graph from a sequential build, the same results from every search mode.
//!
//! Without a device (or without the `cuda` feature) the cases print why and
//! pass, unless `TOPK_REQUIRE_GPU=1`, under which a missing device fails.
#![cfg(feature = "cuda")]

use ndarray::ArrayView2;
use topk_core::{Metric, Neighbor};
use topk_cuda::{CudaConfig, CudaRetriever};
use topk_hnsw::{synth, Hnsw, HnswParams};
use topk_testkit::gpu_or_skip;

fn bits(v: &[Neighbor]) -> Vec<(u32, u32)> {
    v.iter().map(|n| (n.index, n.score.to_bits())).collect()
}

const DIM: usize = 48;

fn params() -> HnswParams {
    HnswParams {
        m: 12,
        ef_construction: 60,
        ef_search: 40,
        seed: 17,
        parallel: false,
    }
}

#[test]
fn gpu_build_and_search_reproduce_the_cpu_bits() {
    let Some(()) = gpu_or_skip() else { return };
    let n = 5_000;
    let data = synth::gaussian_clusters(n, DIM, 32, 0.7, 8);
    let queries = synth::cluster_queries(300, DIM, 32, 0.7, 8);
    for metric in Metric::ALL {
        let gpu =
            CudaRetriever::from_rowmajor(data.clone(), DIM, metric, CudaConfig::default()).unwrap();
        let cpu_index = Hnsw::build(&data, DIM, metric, params()).unwrap();
        let gpu_index = Hnsw::build_gpu(&data, DIM, metric, params(), &gpu).unwrap();
        assert!(
            cpu_index.to_bytes() == gpu_index.to_bytes(),
            "{metric}: graphs differ"
        );

        let qs = ArrayView2::from_shape((300, DIM), &queries[..]).unwrap();
        let cpu = cpu_index.search_batch_with_ef(qs, 10, 40).unwrap();
        let mut out = Vec::new();
        for (i, q) in queries.chunks_exact(DIM).enumerate().take(50) {
            gpu_index.search_gpu(&gpu, q, 10, 40, &mut out).unwrap();
            assert_eq!(bits(&out), bits(&cpu[i]), "{metric}: query {i}");
        }
        for in_flight in [1, 10, 100] {
            let batched = gpu_index
                .search_batch_gpu(&gpu, qs, 10, 40, in_flight)
                .unwrap();
            for (i, (g, c)) in batched.iter().zip(&cpu).enumerate() {
                assert_eq!(
                    bits(g),
                    bits(c),
                    "{metric}: in flight {in_flight}, query {i}"
                );
            }
        }
    }
}

#[test]
fn engine_with_other_rows_is_rejected() {
    let Some(()) = gpu_or_skip() else { return };
    let data = synth::gaussian_clusters(500, DIM, 4, 0.5, 1);
    let other = synth::gaussian_clusters(500, DIM, 4, 0.5, 2);
    let gpu = CudaRetriever::from_rowmajor(other, DIM, Metric::L2, CudaConfig::default()).unwrap();
    let e = Hnsw::build_gpu(&data, DIM, Metric::L2, params(), &gpu).unwrap_err();
    assert!(matches!(e, topk_hnsw::HnswError::GpuMismatch { .. }), "{e}");
    let small = CudaRetriever::from_rowmajor(
        data[..100 * DIM].to_vec(),
        DIM,
        Metric::L2,
        CudaConfig::default(),
    )
    .unwrap();
    let index = Hnsw::build(&data, DIM, Metric::L2, params()).unwrap();
    let mut out = Vec::new();
    let e = index
        .search_gpu(&small, &data[..DIM], 5, 10, &mut out)
        .unwrap_err();
    assert!(matches!(e, topk_hnsw::HnswError::GpuMismatch { .. }), "{e}");
}

//! The real plugin, wherever the loader finds it from this test binary
//! (`target/<profile>/libtopk_cuda_plugin.so` after `cargo build -p
//! topk-cuda-plugin`): every outcome is checked for what it must say, and on
//! a machine with a GPU the answers must be the CPU oracle's, bit for bit.

use topk_core::{Metric, Neighbor, Retriever};
use topk_cpu::Oracle;
use topk_cuda_loader::{abi, CudaConfig, EngineErrorKind, LoadError};

fn corpus(n: usize, d: usize) -> Vec<f32> {
    // Small integers: many exact ties, and -0.0 scores under dot.
    (0..n * d)
        .map(|i| ((i * 7919 + 13) % 9) as f32 - 4.0)
        .collect()
}

fn bits(v: &[Neighbor]) -> Vec<(u32, u32)> {
    v.iter().map(|h| (h.index, h.score.to_bits())).collect()
}

#[test]
fn the_plugin_answers_like_the_oracle_or_says_what_is_missing() {
    let (n, d) = (3_000, 24);
    let data = corpus(n, d);
    let opened = topk_cuda_loader::open_rowmajor(&data, d, Metric::Dot, &CudaConfig::default());
    let gpu = match opened {
        Ok(gpu) => gpu,
        Err(e) => {
            let msg = e.to_string();
            assert!(
                std::env::var("TOPK_REQUIRE_GPU").as_deref() != Ok("1"),
                "TOPK_REQUIRE_GPU=1 but: {msg}"
            );
            match &e {
                LoadError::NotFound { .. } | LoadError::WithoutCuda { .. } => {
                    assert!(msg.contains(abi::BUILD_COMMAND), "{msg}")
                }
                LoadError::DriverMissing { .. } => {
                    assert!(msg.contains("libcuda.so.1"), "{msg}");
                    assert!(msg.contains("NVIDIA driver is not installed"), "{msg}");
                }
                LoadError::Engine {
                    kind: EngineErrorKind::NoDriver | EngineErrorKind::NoDevice,
                    ..
                } => assert!(msg.contains("CUDA"), "{msg}"),
                other => panic!("unexpected failure: {other}"),
            }
            eprintln!("skipping the device half: {msg}");
            return;
        }
    };
    assert_eq!((gpu.len(), gpu.dim(), gpu.metric()), (n, d, Metric::Dot));
    assert!(!gpu.device_name().is_empty());
    let oracle = Oracle::from_rowmajor(data.clone(), d, Metric::Dot).expect("oracle");
    let queries = &data[..16 * d];
    for k in [1, 10, 100, n + 5] {
        for q in queries.chunks(d) {
            let want = oracle.search(q, k).expect("oracle search");
            assert_eq!(bits(&gpu.search(q, k).expect("gpu search")), bits(&want));
        }
        let got = gpu.search_batch_rowmajor(queries, k).expect("gpu batch");
        for (g, q) in got.iter().zip(queries.chunks(d)) {
            assert_eq!(bits(g), bits(&oracle.search(q, k).expect("oracle search")));
        }
    }
    // Input rules are checked before the plugin, with the core's typed errors.
    assert!(matches!(
        gpu.search(&queries[..d], 0),
        Err(topk_core::Error::ZeroK)
    ));
    assert!(matches!(
        gpu.search(&queries[..d - 1], 1),
        Err(topk_core::Error::DimensionMismatch { .. })
    ));
}

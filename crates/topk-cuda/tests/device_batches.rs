//! Batches whose queries come from device memory (an embedding model's
//! output, say) against host batches: the same bytes as the oracle and as
//! each other, on the canonical and the filtered paths, over several turns,
//! and every bad input a typed error that names its query, after which the
//! engine still answers.
//!
//! Without a device each case prints why and passes, unless
//! `TOPK_REQUIRE_GPU=1`, under which a missing device fails.
#![cfg(feature = "cuda")]

use cust::memory::DeviceBuffer;
use cust::stream::{Stream, StreamFlags};
use ndarray::ArrayView2;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use topk_core::{Hit, Metric, Neighbor, Retriever};
use topk_cpu::Oracle;
use topk_cuda::{CudaConfig, CudaError, CudaRetriever, IdFilter, ResidentCorpus};
use topk_testkit::gpu_or_skip;

/// Rows of small integers (many exact ties) or plain floats.
fn rows(seed: u64, n: usize, d: usize, ties: bool) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n * d)
        .map(|_| {
            if ties {
                rng.random_range(-2i32..=2) as f32
            } else {
                rng.random_range(-1.0f32..1.0)
            }
        })
        .collect()
}

fn assert_bits(got: &[Vec<Neighbor>], want: &[Vec<Neighbor>], ctx: &str) {
    assert_eq!(got.len(), want.len(), "{ctx}: query count");
    for (q, (g, w)) in got.iter().zip(want).enumerate() {
        let g: Vec<(u32, u32)> = g.iter().map(|n| (n.index, n.score.to_bits())).collect();
        let w: Vec<(u32, u32)> = w.iter().map(|n| (n.index, n.score.to_bits())).collect();
        assert_eq!(g, w, "{ctx}: query {q}");
    }
}

/// The oracle's answer to each query, the queries spread over the cores
/// (each answer is the oracle's own, whatever thread computes it).
fn oracle_batch(oracle: &Oracle, queries: &[f32], d: usize, k: usize) -> Vec<Vec<Neighbor>> {
    use rayon::prelude::*;
    queries
        .par_chunks_exact(d)
        .map(|q| oracle.search(q, k).expect("oracle"))
        .collect()
}

/// Device batches give the oracle's bytes, and the host batch's, on the
/// canonical path (small corpus) and the filtered path (past
/// `filter_rows`), in turns of a few staged queries and in one turn, with
/// and without a caller's stream to wait on.
#[test]
fn device_batches_give_the_host_batches_bytes() {
    let Some(()) = gpu_or_skip() else { return };
    for (n, d, ties) in [(3_000, 40, true), (40_000, 96, false), (40_000, 64, true)] {
        let data = rows(n as u64 + d as u64, n, d, ties);
        let nq = 150;
        let mut queries = rows(7, nq, d, ties);
        // A query equal to a stored row, and a zero query.
        queries[..d].copy_from_slice(&data[5 * d..6 * d]);
        queries[d..2 * d].fill(0.0);
        for metric in [Metric::Dot, Metric::Cosine, Metric::L2] {
            let oracle = Oracle::from_rowmajor(data.clone(), d, metric).expect("oracle");
            let wants: Vec<(usize, Vec<Vec<Neighbor>>)> = [1, 10, 100]
                .into_iter()
                .map(|k| (k, oracle_batch(&oracle, &queries, d, k)))
                .collect();
            for max_batch in [64, 256] {
                let mut config = CudaConfig::default();
                config.max_batch = max_batch;
                let gpu =
                    CudaRetriever::from_rowmajor(data.clone(), d, metric, config).expect("engine");
                let dev = DeviceBuffer::from_slice(&queries).expect("device queries");
                let uploaded = gpu.upload_batch(&queries).expect("uploaded batch");
                assert_eq!(uploaded.len(), nq);
                for (k, want) in &wants {
                    let ctx = format!("n {n} d {d} {metric} max_batch {max_batch} k {k}");
                    let host = gpu.search_batch_rowmajor(&queries, *k).expect("host batch");
                    assert_bits(&host, want, &format!("{ctx} host"));
                    let got = gpu
                        .search_batch_device_slice(&dev, None, *k)
                        .expect("device batch");
                    assert_bits(&got, want, &format!("{ctx} device"));
                    let got = gpu
                        .search_device_batch(&uploaded, *k)
                        .expect("uploaded batch");
                    assert_bits(&got, want, &format!("{ctx} uploaded"));
                }
            }
        }
    }
}

/// With a caller's stream, the batch reads the queries only after the work
/// queued there: the buffer is filled on that stream just before the call.
#[test]
fn a_device_batch_waits_for_the_callers_stream() {
    let Some(()) = gpu_or_skip() else { return };
    let (n, d) = (40_000, 128);
    let data = rows(3, n, d, false);
    let gpu = CudaRetriever::from_rowmajor(data.clone(), d, Metric::Dot, CudaConfig::default())
        .expect("engine");
    let oracle = Oracle::from_rowmajor(data, d, Metric::Dot).expect("oracle");
    let stream = Stream::new(StreamFlags::NON_BLOCKING, None).expect("stream");
    let nq = 64;
    let mut dev = DeviceBuffer::from_slice(&vec![0.0f32; nq * d]).expect("device queries");
    for (round, value) in [0.25f32, -0.5, 1.0].into_iter().enumerate() {
        // SAFETY: `dev` outlives the stream's work (the search waits for it,
        // and the buffer is dropped after the stream is synchronised below).
        unsafe { dev.set_32_async(value.to_bits(), &stream) }.expect("fill");
        let got = gpu
            .search_batch_device_slice(&dev, Some(&stream), 10)
            .expect("device batch");
        let want = oracle_batch(&oracle, &vec![value; nq * d], d, 10);
        assert_bits(&got, &want, &format!("round {round}"));
    }
    stream.synchronize().expect("stream");
}

/// `upload_batch` checks the values on the host (a bad query is named
/// there, before anything is copied), an empty batch answers nothing, and
/// K = 0 is refused at search time.
#[test]
fn uploaded_batches_are_checked_and_searched_where_they_lie() {
    let Some(()) = gpu_or_skip() else { return };
    let (n, d) = (5_000, 48);
    let data = rows(11, n, d, true);
    let gpu = CudaRetriever::from_rowmajor(data.clone(), d, Metric::Dot, CudaConfig::default())
        .expect("engine");
    let mut queries = rows(12, 20, d, true);
    queries[7 * d + 3] = f32::NAN;
    let e = gpu.upload_batch(&queries).expect_err("NaN");
    assert!(e.to_string().contains("query 7"), "{e}");
    let e = gpu.upload_batch(&queries[..d + 1]).expect_err("ragged");
    assert!(matches!(e, CudaError::Input(_)), "{e}");
    queries[7 * d + 3] = 0.5;
    let batch = gpu.upload_batch(&queries).expect("upload");
    assert!(matches!(
        gpu.search_device_batch(&batch, 0),
        Err(CudaError::Input(_))
    ));
    let oracle = Oracle::from_rowmajor(data, d, Metric::Dot).expect("oracle");
    let got = gpu.search_device_batch(&batch, 25).expect("search");
    assert_bits(&got, &oracle_batch(&oracle, &queries, d, 25), "uploaded");
    let empty = gpu.upload_batch(&[]).expect("empty upload");
    assert!(empty.is_empty());
    assert!(gpu
        .search_device_batch(&empty, 5)
        .expect("empty")
        .is_empty());
}

/// Bad device batches are typed errors naming the query (also in the second
/// turn of a batch) or the length, and the engine answers the next batch
/// exactly; with the check's verdict written to mapped host memory and
/// copied back.
#[test]
fn bad_device_batches_are_refused() {
    let Some(()) = gpu_or_skip() else { return };
    for mapped in [true, false] {
        let mut config = CudaConfig::default();
        config.tuning.mapped_results = mapped;
        refuse_bad_device_batches(config);
    }
}

fn refuse_bad_device_batches(config: CudaConfig) {
    let (n, d) = (40_000, 64);
    let data = rows(9, n, d, false);
    let gpu =
        CudaRetriever::from_rowmajor(data.clone(), d, Metric::Cosine, config).expect("engine");
    let oracle = Oracle::from_rowmajor(data, d, Metric::Cosine).expect("oracle");
    let queries = rows(10, 300, d, false);
    for (at, value) in [
        (0, f32::NAN),
        (7 * d + 3, f32::INFINITY),
        (299 * d, f32::NEG_INFINITY),
    ] {
        let mut bad = queries.clone();
        bad[at] = value;
        let dev = DeviceBuffer::from_slice(&bad).expect("device queries");
        let e = gpu
            .search_batch_device_slice(&dev, None, 10)
            .expect_err("non-finite device query");
        assert!(
            matches!(e, CudaError::BadDeviceQuery { query } if query == at / d),
            "value at {at}: {e}"
        );
    }
    // The verdict is read with the results: a batch at fault is searched
    // first, also where K is past the device's selection (host selection
    // over its scores), and is still refused.
    let mut bad = queries.clone();
    bad[5 * d + 1] = f32::NAN;
    let dev = DeviceBuffer::from_slice(&bad).expect("device queries");
    let e = gpu
        .search_batch_device_slice(&dev, None, 3000)
        .expect_err("non-finite device query, K past the device's selection");
    assert!(matches!(e, CudaError::BadDeviceQuery { query: 5 }), "{e}");
    // A query over the overflow rule (every value finite).
    let mut big = queries.clone();
    big[40 * d..41 * d].fill(1e15);
    let dev = DeviceBuffer::from_slice(&big).expect("device queries");
    let e = gpu
        .search_batch_device_slice(&dev, None, 10)
        .expect_err("overflow");
    assert!(matches!(e, CudaError::BadDeviceQuery { query: 40 }), "{e}");
    let dev = DeviceBuffer::from_slice(&queries).expect("device queries");
    let e = gpu
        .search_batch_device_slice(&dev.index(..d * 3 + 5), None, 10)
        .expect_err("partial query");
    assert!(
        matches!(e, CudaError::DeviceBatchLength { got, expected } if got == 3 * d + 5 && expected == d)
    );
    assert!(e.to_string().contains(&format!("{}", 3 * d + 5)), "{e}");
    let e = gpu
        .search_batch_device_slice(&dev, None, 0)
        .expect_err("k = 0");
    assert!(
        matches!(e, CudaError::Input(topk_core::Error::ZeroK)),
        "{e}"
    );
    assert!(gpu
        .search_batch_device_slice(&dev.index(..0), None, 10)
        .expect("empty batch")
        .is_empty());
    let got = gpu
        .search_batch_device_slice(&dev, None, 10)
        .expect("good batch");
    assert_bits(
        &got,
        &oracle_batch(&oracle, &queries, d, 10),
        "after the errors",
    );
}

/// A bad value in a late query of a late turn of a host batch fails the
/// whole batch, named by its query in the whole batch (the first at fault
/// where there are two), and the next batch is exact.
#[test]
fn host_batches_name_the_query_at_fault() {
    let Some(()) = gpu_or_skip() else { return };
    let (n, d) = (40_000, 384);
    let data = rows(11, n, d, false);
    let oracle = Oracle::from_rowmajor(data.clone(), d, Metric::Dot).expect("oracle");
    let mut config = CudaConfig::default();
    config.max_batch = 256;
    let gpu = CudaRetriever::from_rowmajor(data, d, Metric::Dot, config).expect("engine");
    // 700 queries: turns of 256.
    let nq = 700;
    let queries = rows(12, nq, d, false);
    let cases: [&[(usize, usize, f32)]; 4] = [
        &[(0, 0, f32::NAN)],
        &[(171, 5, f32::INFINITY)],
        &[(699, 383, f32::NAN)],
        &[(600, 1, f32::NAN), (213, 7, f32::NEG_INFINITY)],
    ];
    for case in cases {
        let mut bad = queries.clone();
        for &(q, column, value) in case {
            bad[q * d + column] = value;
        }
        let (q, column) = case.iter().map(|&(q, c, _)| (q, c)).min().expect("a value");
        let e = gpu.search_batch_rowmajor(&bad, 10).expect_err("non-finite");
        let whole = topk_core::validate::queries_rowmajor(&bad, d).expect_err("whole check");
        assert_eq!(e.to_string(), CudaError::from(whole).to_string());
        assert!(non_finite_at(&e, q, column), "{e}");
        let view = ArrayView2::from_shape((nq, d), &bad[..]).expect("shape");
        let e = gpu.search_batch(view, 10).expect_err("non-finite view");
        assert!(e.to_string().contains(&format!("query {q},")), "{e}");
    }
    let mut big = queries.clone();
    big[520 * d..521 * d].fill(1e15);
    let e = gpu.search_batch_rowmajor(&big, 10).expect_err("overflow");
    assert!(
        matches!(
            &e,
            CudaError::Input(topk_core::Error::NormTooLarge {
                at: topk_core::Located::Query(520),
                ..
            })
        ),
        "{e}"
    );
    // A norm over the bound in one query and a NaN in a later one: the
    // row-major check names the first query at fault, the view's check the
    // non-finite value first, as every backend's host check does.
    let mut mixed = big.clone();
    mixed[610 * d + 3] = f32::NAN;
    let e = gpu.search_batch_rowmajor(&mixed, 10).expect_err("mixed");
    let whole = topk_core::validate::queries_rowmajor(&mixed, d).expect_err("whole check");
    assert_eq!(e.to_string(), CudaError::from(whole).to_string());
    let view = ArrayView2::from_shape((nq, d), &mixed[..]).expect("shape");
    let e = gpu.search_batch(view, 10).expect_err("mixed view");
    let whole = topk_core::validate::queries(view, d).expect_err("view check");
    assert_eq!(e.to_string(), whole.to_string());
    // Values are refused before K = 0; K past `max_k` (scores read back
    // to the host) still waits for the verdict.
    let e = gpu
        .search_batch_rowmajor(&bad_at(&queries, 300 * d), 0)
        .expect_err("K = 0");
    assert!(
        matches!(&e, CudaError::Input(topk_core::Error::NonFinite { .. })),
        "{e}"
    );
    let e = gpu.search_batch_rowmajor(&queries, 0).expect_err("K = 0");
    assert!(
        matches!(&e, CudaError::Input(topk_core::Error::ZeroK)),
        "{e}"
    );
    let k_past = CudaConfig::default().max_k + 1;
    let e = gpu
        .search_batch_rowmajor(&bad_at(&queries, 650 * d + 9), k_past)
        .expect_err("K past max_k");
    assert!(non_finite_at(&e, 650, 9), "{e}");
    let e = gpu
        .search_batch_rowmajor(&queries[..d + 1], 10)
        .expect_err("ragged");
    assert!(
        matches!(
            &e,
            CudaError::Input(topk_core::Error::DimensionMismatch { .. })
        ),
        "{e}"
    );
    let got = gpu.search_batch_rowmajor(&queries, 10).expect("good batch");
    assert_bits(
        &got,
        &oracle_batch(&oracle, &queries, d, 10),
        "after the errors",
    );
}

/// Whether `e` is the input rule's non-finite error at `query`, `column`.
fn non_finite_at(e: &CudaError, query: usize, column: usize) -> bool {
    matches!(e, CudaError::Input(topk_core::Error::NonFinite { at: topk_core::Located::Query(i), column: c, .. }) if *i == query && *c == column)
}

/// The oracle's answers as hits of `ids` (row `i` holds `ids[i]`).
fn oracle_hits(oracle: &Oracle, queries: &[f32], d: usize, k: usize, ids: &[u64]) -> Vec<Vec<Hit>> {
    oracle_batch(oracle, queries, d, k)
        .iter()
        .map(|r| {
            r.iter()
                .map(|h| Hit::new(ids[h.index as usize], h.score))
                .collect()
        })
        .collect()
}

/// `values` with a NaN at flat position `at`.
fn bad_at(values: &[f32], at: usize) -> Vec<f32> {
    let mut v = values.to_vec();
    v[at] = f32::NAN;
    v
}

/// The resident corpus with no row removed hands device batches to the
/// engine's batch path: the same hits as its host queries, and a NaN is
/// refused before anything is searched.
#[test]
fn resident_device_batches_take_the_engines_path() {
    let Some(()) = gpu_or_skip() else { return };
    let (n, d) = (40_000, 64);
    let data = rows(13, n, d, true);
    let mut c = ResidentCorpus::new(d, Metric::L2, CudaConfig::default(), n).expect("corpus");
    let ids: Vec<u64> = (0..n as u64).map(|i| i * 3 + 1).collect();
    c.add(&ids, &data).expect("add");
    let nq = 200;
    let queries = rows(14, nq, d, true);
    let dev = DeviceBuffer::from_slice(&queries).expect("device queries");
    let ptr = dev.as_device_ptr().as_raw();
    let oracle = Oracle::from_rowmajor(data, d, Metric::L2).expect("oracle");
    for k in [1, 10, 100] {
        // Ids ascend with the rows, so the oracle's row order is the id order.
        let want = oracle_hits(&oracle, &queries, d, k, &ids);
        let host = c.search(&queries, k, IdFilter::All).expect("host");
        assert_eq!(host, want, "k {k} host");
        // SAFETY: `dev` lives past the call and nothing writes it.
        let got = unsafe { c.search_device(ptr, nq, k, IdFilter::All, 0) }.expect("device");
        assert_eq!(got, want, "k {k}");
    }
    let mut bad = queries.clone();
    bad[77 * d] = f32::NAN;
    let e = c.search(&bad, 10, IdFilter::All).expect_err("host NaN");
    assert!(non_finite_at(&e, 77, 0), "{e}");
    let host = c
        .search(&queries, 10, IdFilter::All)
        .expect("host after the error");
    assert_eq!(
        host,
        oracle_hits(&oracle, &queries, d, 10, &ids),
        "host after the error"
    );
    let bad_dev = DeviceBuffer::from_slice(&bad).expect("device queries");
    // SAFETY: as above.
    let e = unsafe { c.search_device(bad_dev.as_device_ptr().as_raw(), nq, 10, IdFilter::All, 0) }
        .expect_err("device NaN");
    assert!(matches!(e, CudaError::BadDeviceQuery { query: 77 }), "{e}");
}

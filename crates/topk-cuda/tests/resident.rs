//! The mutable resident corpus against a model: random histories of add /
//! upsert / remove / compact with tie-rich rows under shuffled ids, searched
//! unfiltered and through shared and per-query filters (empty, sparse,
//! dense, full, naming absent ids), compared bit for bit with the oracle
//! over the final content (docs/CONTRACTS.md §10).
//!
//! Without a device each case prints why and passes, unless
//! `TOPK_REQUIRE_GPU=1`, under which a missing device fails.
#![cfg(feature = "cuda")]

use std::collections::BTreeMap;

use proptest::prelude::*;
use topk_core::{Hit, Metric, Retriever};
use topk_cpu::Oracle;
use topk_cuda::{CudaConfig, CudaError, IdFilter, ResidentCorpus};
use topk_testkit::gpu_or_skip;

/// The live content, by id.
type Model = BTreeMap<u64, Vec<f32>>;

/// The oracle's answer over the model rows `filter` allows, ids ascending
/// so that its smaller-row tiebreak is the smaller-id tiebreak.
fn expected(
    model: &Model,
    dim: usize,
    metric: Metric,
    q: &[f32],
    k: usize,
    filter: Option<&[u64]>,
) -> Vec<Hit> {
    let rows: Vec<(u64, &Vec<f32>)> = model
        .iter()
        .filter(|(id, _)| filter.is_none_or(|f| f.contains(id)))
        .map(|(&id, v)| (id, v))
        .collect();
    if rows.is_empty() {
        return Vec::new();
    }
    let flat: Vec<f32> = rows.iter().flat_map(|(_, v)| v.iter().copied()).collect();
    let oracle = Oracle::from_rowmajor(flat, dim, metric).expect("model rows are valid");
    oracle
        .search(q, k)
        .expect("oracle search")
        .into_iter()
        .map(|nb| Hit::new(rows[nb.index as usize].0, nb.score))
        .collect()
}

fn bits(hits: &[Hit]) -> Vec<(u64, u32)> {
    hits.iter().map(|h| (h.id, h.score.to_bits())).collect()
}

#[derive(Debug, Clone)]
enum Op {
    Add(Vec<u64>),
    Upsert(Vec<u64>),
    Remove(Vec<u64>),
    Compact,
}

/// Values from a small set, so that many scores tie exactly.
fn value() -> impl Strategy<Value = f32> {
    prop::sample::select(vec![-1.0_f32, -0.5, 0.0, 0.5, 1.0, 2.0])
}

fn op() -> impl Strategy<Value = Op> {
    let ids = prop::collection::vec(0u64..48, 0..12);
    prop_oneof![
        4 => ids.clone().prop_map(Op::Add),
        2 => ids.clone().prop_map(Op::Upsert),
        2 => ids.prop_map(Op::Remove),
        1 => Just(Op::Compact),
    ]
}

fn dedup(mut ids: Vec<u64>) -> Vec<u64> {
    let mut seen = std::collections::HashSet::new();
    ids.retain(|id| seen.insert(*id));
    ids
}

/// Checks every search shape of `corpus` against the model.
fn check_searches(
    corpus: &ResidentCorpus,
    model: &Model,
    dim: usize,
    metric: Metric,
    queries: &[f32],
    filters: &[Vec<u64>],
) {
    let nq = queries.len() / dim;
    for k in [1, 3, 7, 64] {
        let got = corpus
            .search(queries, k, IdFilter::All)
            .expect("unfiltered search");
        for (qi, q) in queries.chunks(dim).enumerate() {
            assert_eq!(
                bits(&got[qi]),
                bits(&expected(model, dim, metric, q, k, None)),
                "unfiltered k={k} query {qi}"
            );
        }
        for f in filters {
            let got = corpus
                .search(queries, k, IdFilter::Shared(f))
                .expect("shared filter");
            for (qi, q) in queries.chunks(dim).enumerate() {
                assert_eq!(
                    bits(&got[qi]),
                    bits(&expected(model, dim, metric, q, k, Some(f))),
                    "filter {f:?} k={k} query {qi}"
                );
            }
        }
        let per: Vec<&[u64]> = (0..nq)
            .map(|i| filters[i % filters.len()].as_slice())
            .collect();
        let got = corpus
            .search(queries, k, IdFilter::PerQuery(&per))
            .expect("per-query filters");
        for (qi, q) in queries.chunks(dim).enumerate() {
            assert_eq!(
                bits(&got[qi]),
                bits(&expected(model, dim, metric, q, k, Some(per[qi]))),
                "per-query k={k} query {qi}"
            );
        }
    }
}

fn config(hist: bool) -> CudaConfig {
    let mut c = CudaConfig::default();
    if hist {
        // Every selection takes the grid-wide histogram and gather.
        c.tuning.fuse_rows = 0;
    }
    c
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn histories_match_the_oracle_bit_for_bit(
        metric in prop::sample::select(vec![Metric::Dot, Metric::Cosine, Metric::L2]),
        hist in any::<bool>(),
        capacity in 1usize..8,
        ops in prop::collection::vec(op(), 1..14),
        pool in prop::collection::vec(value(), 8 * 64),
        queries in prop::collection::vec(value(), 8 * 3),
        sparse in prop::collection::vec(0u64..60, 0..6),
    ) {
        let Some(()) = gpu_or_skip() else { return Ok(()) };
        let dim = 8;
        let mut corpus = ResidentCorpus::new(dim, metric, config(hist), capacity).expect("engine");
        let mut model = Model::new();
        // Each id's vector at its t-th write comes from the pool, so
        // upserts change rows and rows repeat across ids (ties).
        let mut writes = 0usize;
        let next_row = |writes: &mut usize| {
            let at = (*writes * 7) % 64;
            *writes += 1;
            let v: Vec<f32> = pool[at * dim..(at + 1) * dim].to_vec();
            v
        };
        for op in ops {
            match op {
                Op::Add(ids) => {
                    let ids = dedup(ids);
                    let rows: Vec<Vec<f32>> = ids.iter().map(|_| next_row(&mut writes)).collect();
                    let flat: Vec<f32> = rows.concat();
                    let present = ids.iter().position(|id| model.contains_key(id));
                    match corpus.add(&ids, &flat) {
                        Ok(()) => {
                            prop_assert!(present.is_none());
                            model.extend(ids.into_iter().zip(rows));
                        }
                        Err(CudaError::IdPresent { position, .. }) => prop_assert_eq!(Some(position), present),
                        Err(e) => panic!("add: {e}"),
                    }
                }
                Op::Upsert(ids) => {
                    let ids = dedup(ids);
                    let rows: Vec<Vec<f32>> = ids.iter().map(|_| next_row(&mut writes)).collect();
                    corpus.upsert(&ids, &rows.concat()).expect("upsert");
                    model.extend(ids.into_iter().zip(rows));
                }
                Op::Remove(ids) => {
                    let expect = dedup(ids.clone()).iter().filter(|id| model.remove(id).is_some()).count();
                    prop_assert_eq!(corpus.remove(&ids).expect("remove"), expect);
                }
                Op::Compact => corpus.compact().expect("compact"),
            }
            prop_assert_eq!(corpus.len(), model.len());
        }
        let live: Vec<u64> = model.keys().copied().collect();
        let dense: Vec<u64> = live.iter().copied().step_by(2).chain([1000, 2000]).collect();
        let filters = vec![Vec::new(), sparse, dense, live, vec![5000]];
        check_searches(&corpus, &model, dim, metric, &queries, &filters);
    }
}

#[test]
fn gathered_and_masked_filters_and_growth_at_scale() {
    let Some(()) = gpu_or_skip() else { return };
    let (dim, n) = (36, 6000);
    for metric in [Metric::Dot, Metric::Cosine, Metric::L2] {
        // Rows from 40 distinct vectors (ties), ids a shuffle of 0..2n step 2.
        let distinct: Vec<f32> = (0..40 * dim)
            .map(|i| ((i * 37 % 11) as f32 - 5.0) * 0.25)
            .collect();
        let mut ids: Vec<u64> = (0..n as u64).map(|i| (i * 7919) % (2 * n as u64)).collect();
        ids.sort_unstable();
        ids.dedup();
        let n = ids.len();
        let mut shuffled = ids.clone();
        for i in (1..n).rev() {
            shuffled.swap(i, (i * 2654435761) % (i + 1));
        }
        let rows: Vec<Vec<f32>> = (0..n)
            .map(|i| distinct[(i % 40) * dim..(i % 40 + 1) * dim].to_vec())
            .collect();
        let mut corpus =
            ResidentCorpus::new(dim, metric, CudaConfig::default(), 100).expect("engine");
        let mut model = Model::new();
        // Three adds: the second below the largest id (a merge), growth past 100.
        for part in shuffled.chunks(n / 3 + 1) {
            let flat: Vec<f32> = part
                .iter()
                .flat_map(|&id| rows[ids.binary_search(&id).unwrap()].clone())
                .collect();
            corpus.add(part, &flat).expect("add");
            for &id in part {
                model.insert(id, rows[ids.binary_search(&id).unwrap()].clone());
            }
        }
        assert!(corpus.capacity() >= n);
        let removed: Vec<u64> = ids.iter().copied().step_by(5).collect();
        assert_eq!(corpus.remove(&removed).unwrap(), removed.len());
        for id in &removed {
            model.remove(id);
        }
        let queries: Vec<f32> = (0..3 * dim)
            .map(|i| ((i * 13 % 7) as f32 - 3.0) * 0.5)
            .collect();
        let live: Vec<u64> = model.keys().copied().collect();
        let one_pct: Vec<u64> = live.iter().copied().step_by(100).collect();
        let ten_pct: Vec<u64> = live.iter().copied().step_by(10).collect();
        let sixty: Vec<u64> = live.iter().copied().filter(|id| id % 5 < 3).collect();
        let filters = vec![one_pct, ten_pct, sixty, live.clone()];
        check_searches(&corpus, &model, dim, metric, &queries, &filters);
        corpus.compact().unwrap();
        assert_eq!(corpus.tombstones(), 0);
        check_searches(&corpus, &model, dim, metric, &queries, &filters);
    }
}

#[test]
fn a_capacity_past_the_ids_or_memory_is_refused_before_the_device() {
    // No device is needed: the sizes are checked first.
    let e = ResidentCorpus::new(4, Metric::Dot, CudaConfig::default(), 1 << 62).unwrap_err();
    assert!(e.to_string().contains("4611686018427387904"), "{e}");
    let (dim, rows) = (u32::MAX as usize, u32::MAX as usize / 2);
    let e = ResidentCorpus::new(dim, Metric::Dot, CudaConfig::default(), rows).unwrap_err();
    assert!(e.to_string().contains("do not fit in memory"), "{e}");
}

#[test]
fn mutations_reject_bad_input_and_change_nothing() {
    let Some(()) = gpu_or_skip() else { return };
    let mut c = ResidentCorpus::new(2, Metric::Dot, CudaConfig::default(), 4).unwrap();
    c.add(&[3, 1], &[1.0, 0.0, 0.0, 1.0]).unwrap();
    let e = c.add(&[7, 1], &[1.0, 1.0, 2.0, 2.0]).unwrap_err();
    assert!(
        matches!(e, CudaError::IdPresent { id: 1, position: 1 }),
        "{e}"
    );
    let e = c.add(&[8, 8], &[1.0, 1.0, 2.0, 2.0]).unwrap_err();
    assert!(e.to_string().contains("appears twice"), "{e}");
    let e = c.add(&[1 << 63], &[1.0, 1.0]).unwrap_err();
    assert!(e.to_string().contains("above the largest id"), "{e}");
    let e = c.add(&[9], &[1.0, f32::NAN]).unwrap_err();
    assert!(e.to_string().contains("non-finite"), "{e}");
    let e = c.add(&[9, 10], &[1.0, 2.0]).unwrap_err();
    assert!(e.to_string().contains("ids for rows"), "{e}");
    let e = c.search(&[1.0, 0.0], 0, IdFilter::All).unwrap_err();
    assert!(
        e.to_string().contains("K = 0") || e.to_string().to_lowercase().contains("k"),
        "{e}"
    );
    let e = c
        .search(&[1.0, 0.0], 1, IdFilter::PerQuery(&[]))
        .unwrap_err();
    assert!(e.to_string().contains("filters for queries"), "{e}");
    assert_eq!(c.len(), 2);
    let got = c.search(&[1.0, 0.0], 5, IdFilter::All).unwrap();
    assert_eq!(got, vec![vec![Hit::new(3, 1.0), Hit::new(1, 0.0)]]);
}

/// Zero rows score -inf under cosine (docs/CONTRACTS.md §2); removed and
/// filtered-out rows must still rank below them, on every path.
#[test]
fn zero_cosine_rows_keep_their_place_below_hidden_rows() {
    let Some(()) = gpu_or_skip() else { return };
    let dim = 4;
    for hist in [false, true] {
        let mut c = ResidentCorpus::new(dim, Metric::Cosine, config(hist), 2).unwrap();
        let mut model = Model::new();
        for id in 0..40u64 {
            let v: Vec<f32> = if id % 4 == 0 {
                vec![0.0; dim]
            } else {
                (0..dim)
                    .map(|j| ((id as usize * 3 + j) % 5) as f32 - 2.0)
                    .collect()
            };
            c.add(&[id], &v).unwrap();
            model.insert(id, v);
        }
        let gone: Vec<u64> = (0..40).filter(|id| id % 3 == 0).collect();
        c.remove(&gone).unwrap();
        for id in &gone {
            model.remove(id);
        }
        let q = [1.0, -1.0, 0.5, 2.0];
        let live: Vec<u64> = model.keys().copied().collect();
        let filters = vec![
            live.clone(),
            live.iter().copied().step_by(2).collect(),
            vec![4, 8, 1, 2],
        ];
        check_searches(&c, &model, dim, Metric::Cosine, &q, &filters);
    }
}

/// Queries already in device memory give the host queries' bytes, and bad
/// ones (NaN, a pointer outside any allocation) are refused.
#[test]
fn device_queries_match_host_queries() {
    let Some(()) = gpu_or_skip() else { return };
    use cust::memory::DeviceBuffer;
    let dim = 8;
    let mut c = ResidentCorpus::new(dim, Metric::Dot, CudaConfig::default(), 16).unwrap();
    let ids: Vec<u64> = (0..300).map(|i| (i * 7) % 1000).collect();
    let rows: Vec<f32> = (0..300 * dim)
        .map(|i| ((i * 13) % 9) as f32 - 4.0)
        .collect();
    c.add(&ids, &rows).unwrap();
    c.remove(&[0, 7, 14]).unwrap();
    let queries: Vec<f32> = (0..5 * dim).map(|i| ((i * 5) % 7) as f32 - 3.0).collect();
    let dev = DeviceBuffer::from_slice(&queries).unwrap();
    let ptr = dev.as_device_ptr().as_raw();
    let allow: Vec<u64> = ids.iter().copied().step_by(3).collect();
    for filter in [IdFilter::All, IdFilter::Shared(&allow)] {
        let want = c.search(&queries, 10, filter).unwrap();
        // SAFETY: `dev` lives past the call and nothing writes it.
        let got = unsafe { c.search_device(ptr, 5, 10, filter, 0) }.unwrap();
        assert_eq!(got, want);
    }
    let bad: Vec<f32> = queries
        .iter()
        .enumerate()
        .map(|(i, &v)| if i == 3 * dim + 2 { f32::NAN } else { v })
        .collect();
    let bad_dev = DeviceBuffer::from_slice(&bad).unwrap();
    // SAFETY: as above.
    let e = unsafe { c.search_device(bad_dev.as_device_ptr().as_raw(), 5, 10, IdFilter::All, 0) }
        .unwrap_err();
    assert!(matches!(e, CudaError::BadDeviceQuery { query: 3 }), "{e}");
    // SAFETY: the pointer is refused before anything is read.
    let e = unsafe { c.search_device(ptr, 50, 10, IdFilter::All, 0) }.unwrap_err();
    assert!(e.to_string().contains("end of its allocation"), "{e}");
}

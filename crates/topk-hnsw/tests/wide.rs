//! Wide walks (`Hnsw::search_batch_wide`): several nodes expanded per step.
//! Width 1 is the standard walk bit for bit; any width returns
//! `min(k, allowed)` distinct allowed rows with their canonical scores in
//! §3 order; recall holds; bad widths are typed errors.

mod common;

use std::collections::HashMap;

use common::*;
use ndarray::ArrayView2;
use proptest::prelude::*;
use topk_core::{rank_key, Metric, Neighbor};
use topk_hnsw::{recall_at_k, synth, Hnsw, HnswError, HnswParams, SlotFilter, MAX_WALK_WIDTH};

fn bits(v: &[Neighbor]) -> Vec<(u32, u32)> {
    v.iter().map(|n| (n.index, n.score.to_bits())).collect()
}

fn small_params(seed: u64) -> HnswParams {
    HnswParams {
        m: 6,
        ef_construction: 40,
        ef_search: 20,
        seed,
        parallel: false,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    /// Width 1 gives the bits of `search_batch_with_ef` and of
    /// `search_filtered_with_ef`, with forced ties and deletions.
    #[test]
    fn width_one_is_the_standard_walk(
        distinct in 1usize..30,
        n in 30usize..800,
        dim in 1usize..10,
        metric in prop::sample::select(Metric::ALL.to_vec()),
        k in 1usize..20,
        ef in 1usize..80,
        keep in 1u32..5,
        seed in any::<u64>(),
    ) {
        let (data, queries) = synth::tied_rows(distinct, n, dim, 12, seed);
        let mut index = Hnsw::build(&data, dim, metric, small_params(seed)).unwrap();
        for s in (0..n as u32).step_by(9) {
            index.mark_deleted(s).unwrap();
        }
        let qs = ArrayView2::from_shape((12, dim), &queries[..]).unwrap();
        let wide = index.search_batch_wide(qs, k, ef, 1, None).unwrap();
        let plain = index.search_batch_with_ef(qs, k, ef).unwrap();
        prop_assert_eq!(
            wide.iter().map(|r| bits(r)).collect::<Vec<_>>(),
            plain.iter().map(|r| bits(r)).collect::<Vec<_>>()
        );
        let filter = SlotFilter::from_fn(n, |s| s % (keep + 1) != 0);
        let wide = index.search_batch_wide(qs, k, ef, 1, Some(&filter)).unwrap();
        for (q, w) in queries.chunks(dim).zip(&wide) {
            let mut want = Vec::new();
            index.search_filtered_with_ef(q, k, ef, &filter, &mut want).unwrap();
            prop_assert_eq!(bits(w), bits(&want));
        }
    }

    /// Any width: `min(k, allowed)` distinct allowed live rows, each with
    /// its canonical score (the oracle's bits), in §3 order.
    #[test]
    fn every_width_keeps_the_result_contract(
        distinct in 1usize..30,
        n in 30usize..600,
        dim in 1usize..10,
        metric in prop::sample::select(Metric::ALL.to_vec()),
        k in 1usize..20,
        ef in 1usize..80,
        width in 1usize..=MAX_WALK_WIDTH,
        filtered in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let (data, queries) = synth::tied_rows(distinct, n, dim, 12, seed);
        let mut index = Hnsw::build(&data, dim, metric, small_params(seed)).unwrap();
        for s in (0..n as u32).step_by(7) {
            index.mark_deleted(s).unwrap();
        }
        let filter = SlotFilter::from_fn(n, |s| s % 3 != 1);
        let allowed = |s: u32| s % 7 != 0 && (!filtered || s % 3 != 1);
        let count = (0..n as u32).filter(|&s| allowed(s)).count();
        let qs = ArrayView2::from_shape((12, dim), &queries[..]).unwrap();
        let got = index
            .search_batch_wide(qs, k, ef, width, filtered.then_some(&filter))
            .unwrap();
        // Every row's canonical score, from the oracle asked for all rows.
        let all = exact(&data, dim, metric, &queries, n);
        for (i, r) in got.iter().enumerate() {
            prop_assert_eq!(r.len(), k.min(count), "query {}", i);
            let score: HashMap<u32, u32> =
                all[i].iter().map(|h| (h.index, h.score.to_bits())).collect();
            for h in r {
                prop_assert!(allowed(h.index), "row {} not allowed", h.index);
                prop_assert_eq!(Some(&h.score.to_bits()), score.get(&h.index));
            }
            for p in r.windows(2) {
                prop_assert!(
                    rank_key(p[0].score, p[0].index) > rank_key(p[1].score, p[1].index),
                    "query {} out of order or repeated", i
                );
            }
        }
    }
}

/// Wider steps reach the standard walk's recall on the 20k Gaussian set (a
/// walk that expands more nodes per step explores at least as much), and a
/// query's answer does not depend on the batch it is in.
#[test]
fn wide_walks_keep_recall_and_batch_independence() {
    let f = gaussian();
    let index = sequential_index();
    let qs = ArrayView2::from_shape((Q, D), &f.queries[..]).unwrap();
    for ef in [16, 64] {
        let base = recall_at_k(&search_all(index, &f.queries, D, 10, ef), &f.truth, 10).unwrap();
        for width in [2, 4, 8] {
            let got = index.search_batch_wide(qs, 10, ef, width, None).unwrap();
            let r = recall_at_k(&got, &f.truth, 10).unwrap();
            eprintln!("ef {ef}: width 1 recall {base:.4}, width {width} {r:.4}");
            // 2,000 (query, rank) pairs: 0.01 is a few standard errors.
            assert!(
                r >= base - 0.01,
                "ef {ef} width {width}: {r} against {base}"
            );
            for i in [0, 17, Q - 1] {
                let one = qs.slice(ndarray::s![i..i + 1, ..]);
                let alone = index.search_batch_wide(one, 10, ef, width, None).unwrap();
                assert_eq!(
                    bits(&alone[0]),
                    bits(&got[i]),
                    "ef {ef} width {width} query {i}"
                );
            }
        }
    }
}

#[test]
fn bad_widths_are_typed_errors() {
    let data = synth::gaussian_clusters(500, 8, 4, 0.5, 1);
    let index = Hnsw::build(&data, 8, Metric::Dot, small_params(1)).unwrap();
    let q = [0.25f32; 8];
    let qs = ArrayView2::from_shape((1, 8), &q[..]).unwrap();
    for width in [0, MAX_WALK_WIDTH + 1, usize::MAX] {
        match index.search_batch_wide(qs, 5, 10, width, None) {
            Err(HnswError::InvalidParameter { name: "width", .. }) => {}
            other => panic!("width {width}: {other:?}"),
        }
    }
    assert!(
        index.search_batch_wide(qs, 0, 10, 2, None).is_err(),
        "k = 0"
    );
    assert!(
        index.search_batch_wide(qs, 5, 0, 2, None).is_err(),
        "ef = 0"
    );
}

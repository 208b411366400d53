//! Inserting, deleting and reusing slots, filtered search, and their
//! persistence, on small seeded corpora: deterministic histories, deleted
//! rows never returned, exact answers where the search is exact, every bad
//! input a typed error.

use proptest::prelude::*;
use topk_core::{Error, Located, Metric, Neighbor, Retriever};
use topk_hnsw::{synth, Hnsw, HnswError, HnswParams, SlotFilter, FORMAT_VERSION};

const DIM: usize = 16;

fn params() -> HnswParams {
    HnswParams {
        m: 8,
        ef_construction: 40,
        ef_search: 32,
        seed: 17,
        ..HnswParams::default()
    }
}

fn rows(n: usize, seed: u64) -> Vec<f32> {
    synth::gaussian_clusters(n, DIM, 12, 0.5, seed)
}

fn row(data: &[f32], i: usize) -> &[f32] {
    &data[i * DIM..(i + 1) * DIM]
}

/// The exact top-`k` of the live slots `filter` allows, by canonical score
/// and the §3 order: what every exact path must return bit for bit.
fn brute(index: &Hnsw, q: &[f32], k: usize, filter: Option<&SlotFilter>) -> Vec<Neighbor> {
    let metric = index.metric();
    let mut all: Vec<Neighbor> = (0..index.len() as u32)
        .filter(|&s| !index.is_deleted(s).unwrap() && filter.is_none_or(|f| f.contains(s)))
        .map(|s| {
            let r = &index.vectors()[s as usize * DIM..(s as usize + 1) * DIM];
            Neighbor::new(s, metric.score_scalar(q, r))
        })
        .collect();
    all.sort_by(topk_core::cmp_rank);
    all.truncate(k);
    all
}

fn bits(v: &[Neighbor]) -> Vec<(u32, u32)> {
    v.iter().map(|n| (n.index, n.score.to_bits())).collect()
}

/// A fixed history: delete a spread of slots (the entry among them), insert
/// fresh rows (reusing those slots, then appending), delete again.
fn history(index: &mut Hnsw, extra: &[f32]) {
    let entry = index.stats().entry;
    index.mark_deleted(entry).unwrap();
    for s in (3..index.len() as u32).step_by(7) {
        index.mark_deleted(s).unwrap();
    }
    for i in 0..extra.len() / DIM {
        index.insert(row(extra, i)).unwrap();
    }
    for s in (5..index.len() as u32).step_by(11) {
        index.mark_deleted(s).unwrap();
    }
}

#[test]
fn same_history_gives_the_same_graph_bytes() {
    let data = rows(1_500, 1);
    let extra = rows(400, 2);
    let mut a = Hnsw::build(&data, DIM, Metric::L2, params()).unwrap();
    let mut b = Hnsw::build(&data, DIM, Metric::L2, params()).unwrap();
    history(&mut a, &extra);
    history(&mut b, &extra);
    assert_eq!(a.to_bytes(), b.to_bytes());
    // 1500 / 7 ≈ 214 slots freed, so the 400 inserts reused all and appended the rest.
    assert!(a.len() > 1_500 && a.len() < 1_900, "{}", a.len());
    // A save and load in the middle of a history changes nothing after it.
    let mut c = Hnsw::from_bytes(&a.to_bytes()).unwrap();
    for i in 0..50 {
        a.insert(row(&data, i)).unwrap();
        c.insert(row(&data, i)).unwrap();
    }
    assert_eq!(a.to_bytes(), c.to_bytes());
}

#[test]
fn a_clone_answers_and_changes_as_the_original() {
    let data = rows(1_000, 3);
    let extra = rows(100, 4);
    let mut a = Hnsw::build(&data, DIM, Metric::Dot, params()).unwrap();
    history(&mut a, &extra);
    let mut b = a.clone();
    assert_eq!(a.to_bytes(), b.to_bytes());
    for i in 0..30 {
        assert_eq!(
            a.insert(row(&data, i)).unwrap(),
            b.insert(row(&data, i)).unwrap()
        );
    }
    assert_eq!(a.to_bytes(), b.to_bytes());
    let (mut x, mut y) = (Vec::new(), Vec::new());
    a.search_with_ef(row(&extra, 5), 10, 32, &mut x).unwrap();
    b.search_with_ef(row(&extra, 5), 10, 32, &mut y).unwrap();
    assert_eq!(bits(&x), bits(&y));
}

#[test]
fn insert_reuses_deleted_slots_last_first_then_appends() {
    let data = rows(300, 3);
    let mut index = Hnsw::build(&data, DIM, Metric::Dot, params()).unwrap();
    assert!(index.mark_deleted(10).unwrap());
    assert!(index.mark_deleted(20).unwrap());
    assert!(!index.mark_deleted(10).unwrap(), "already deleted");
    assert_eq!(index.free_slots(), &[10, 20]);
    assert_eq!((index.len(), index.live_len()), (300, 298));
    assert!(index.is_deleted(10).unwrap() && !index.is_deleted(11).unwrap());
    let fresh = rows(3, 4);
    assert_eq!(index.insert(row(&fresh, 0)).unwrap(), 20);
    assert_eq!(index.insert(row(&fresh, 1)).unwrap(), 10);
    assert_eq!(index.insert(row(&fresh, 2)).unwrap(), 300);
    assert_eq!((index.len(), index.live_len()), (301, 301));
    assert!(index.free_slots().is_empty());
    // Each inserted row is found as its own nearest neighbour (dot: the row
    // with the largest norm in its direction; compare against brute force).
    for (i, slot) in [(0usize, 20u32), (1, 10), (2, 300)] {
        let q = row(&fresh, i);
        let hits = index.search(q, 5).unwrap();
        assert_eq!(bits(&hits), bits(&brute(&index, q, 5, None)), "slot {slot}");
        assert_eq!(&index.vectors()[slot as usize * DIM..][..DIM], q);
    }
}

#[test]
fn deleted_rows_never_appear_and_searches_return_min_k_live() {
    let data = rows(2_000, 5);
    let mut index = Hnsw::build_parallel(&data, DIM, Metric::Cosine, params()).unwrap();
    for s in (0..2_000u32).filter(|s| s % 3 != 0) {
        index.mark_deleted(s).unwrap();
    }
    let live = index.live_len();
    assert_eq!(live, 667);
    for q in data.chunks_exact(DIM).step_by(41) {
        for hit in index.search(q, 50).unwrap() {
            assert_eq!(hit.index % 3, 0, "deleted slot {} returned", hit.index);
        }
        let f = SlotFilter::from_fn(2_000, |s| s % 2 == 0);
        let hits = index.search_filtered(q, 20, &f).unwrap();
        assert_eq!(hits.len(), 20);
        assert!(hits.iter().all(|h| h.index % 6 == 0), "{hits:?}");
    }
    // k beyond the live rows returns every live row, exactly.
    let q = row(&data, 0);
    let all = index.search(q, 5_000).unwrap();
    assert_eq!(bits(&all), bits(&brute(&index, q, 5_000, None)));
    assert_eq!(all.len(), live);
    // Deleting everything leaves nothing to return.
    for s in 0..2_000u32 {
        index.mark_deleted(s).unwrap();
    }
    assert_eq!(index.live_len(), 0);
    assert!(index.search(q, 10).unwrap().is_empty());
}

#[test]
fn filters_naming_nothing_or_absent_slots_return_nothing() {
    let data = rows(500, 6);
    let mut index = Hnsw::build(&data, DIM, Metric::L2, params()).unwrap();
    let q = row(&data, 7);
    assert!(index
        .search_filtered(q, 10, &SlotFilter::new())
        .unwrap()
        .is_empty());
    let absent: SlotFilter = [500u32, 501, 100_000].into_iter().collect();
    assert!(index.search_filtered(q, 10, &absent).unwrap().is_empty());
    // Deleted slots are not allowed even when the filter names them.
    index.mark_deleted(3).unwrap();
    let three: SlotFilter = [3u32, 4, 5, 900].into_iter().collect();
    let hits = index.search_filtered(q, 10, &three).unwrap();
    assert_eq!(bits(&hits), bits(&brute(&index, q, 10, Some(&three))));
    assert_eq!(hits.len(), 2);
    // k = 0 stays the usual input error.
    assert!(matches!(
        index.search_filtered(q, 0, &three),
        Err(HnswError::Input(Error::ZeroK))
    ));
}

#[test]
fn exact_mode_and_full_beams_answer_exactly() {
    let data = rows(1_000, 8);
    let mut index = Hnsw::build(&data, DIM, Metric::Dot, params()).unwrap();
    for s in (0..1_000u32).step_by(5) {
        index.mark_deleted(s).unwrap();
    }
    let f = SlotFilter::from_fn(1_000, |s| s % 4 != 1);
    let q = row(&rows(1, 9), 0).to_vec();
    let want = brute(&index, &q, 25, Some(&f));
    // A beam as wide as the graph scores every allowed row.
    let mut out = Vec::new();
    index
        .search_filtered_with_ef(&q, 25, 1_000, &f, &mut out)
        .unwrap();
    assert_eq!(bits(&out), bits(&want));
    // So does the exact mode, whatever ef.
    index.set_filter_walk_cost(f64::INFINITY).unwrap();
    index
        .search_filtered_with_ef(&q, 25, 1, &f, &mut out)
        .unwrap();
    assert_eq!(bits(&out), bits(&want));
    // The walk at a modest ef finds most of them (approximate: not asserted equal).
    index.set_filter_walk_cost(0.0).unwrap();
    index
        .search_filtered_with_ef(&q, 25, 64, &f, &mut out)
        .unwrap();
    assert_eq!(out.len(), 25);
    assert!(out.iter().all(|h| f.contains(h.index) && h.index % 5 != 0));
}

#[test]
fn bad_slots_and_fractions_are_typed_errors() {
    let data = rows(100, 10);
    let mut index = Hnsw::build(&data, DIM, Metric::L2, params()).unwrap();
    let e = index.mark_deleted(100).unwrap_err();
    assert!(
        matches!(
            e,
            HnswError::SlotOutOfRange {
                slot: 100,
                len: 100
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("slot 100"), "{e}");
    let e = index.is_deleted(u32::MAX).unwrap_err();
    assert!(
        matches!(e, HnswError::SlotOutOfRange { slot, len: 100 } if slot == u64::from(u32::MAX)),
        "{e}"
    );
    for bad in [-0.1, f64::NEG_INFINITY, f64::NAN] {
        let e = index.set_filter_walk_cost(bad).unwrap_err();
        assert!(
            matches!(
                e,
                HnswError::InvalidValue {
                    name: "filter_walk_cost",
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("filter_walk_cost"), "{e}");
    }
    index.set_filter_walk_cost(3.0).unwrap();
    assert_eq!(index.filter_walk_cost(), 3.0);
    assert_eq!(index.live_len(), 100);
}

#[test]
fn inserted_rows_follow_the_input_rules_and_failures_change_nothing() {
    let data = rows(200, 11);
    let mut index = Hnsw::build(&data, DIM, Metric::L2, params()).unwrap();
    index.mark_deleted(42).unwrap();
    let before = index.to_bytes();

    let e = index.insert(&[0.0; DIM + 1]).unwrap_err();
    assert!(
        matches!(&e, HnswError::Input(Error::DimensionMismatch { expected: DIM, got, .. }) if *got == DIM + 1),
        "{e}"
    );
    assert!(e.to_string().contains("row inserted at slot 42"), "{e}");
    let mut nan = vec![0.5; DIM];
    nan[3] = f32::NAN;
    let e = index.insert(&nan).unwrap_err();
    assert!(
        matches!(
            e,
            HnswError::Input(Error::NonFinite {
                at: Located::Row(42),
                column: 3,
                ..
            })
        ),
        "{e}"
    );
    let mut huge = vec![0.0; DIM];
    huge[5] = 3e38;
    let e = index.insert(&huge).unwrap_err();
    assert!(
        matches!(
            e,
            HnswError::Input(Error::NormTooLarge {
                at: Located::Row(42),
                column: 5,
                ..
            })
        ),
        "{e}"
    );
    assert!(e.to_string().contains("corpus row 42"), "{e}");
    assert_eq!(index.to_bytes(), before, "a rejected row changed the index");
    // With no free slot the error names the slot an append would take.
    index.insert(row(&data, 0)).unwrap();
    let e = index.insert(&nan).unwrap_err();
    assert!(
        matches!(
            e,
            HnswError::Input(Error::NonFinite {
                at: Located::Row(200),
                ..
            })
        ),
        "{e}"
    );
}

#[test]
fn a_one_row_index_reuses_its_only_slot() {
    let data = rows(2, 12);
    let mut index = Hnsw::build(row(&data, 0), DIM, Metric::L2, params()).unwrap();
    index.mark_deleted(0).unwrap();
    assert!(index.search(row(&data, 0), 1).unwrap().is_empty());
    assert_eq!(index.insert(row(&data, 1)).unwrap(), 0);
    let hits = index.search(row(&data, 0), 3).unwrap();
    assert_eq!(bits(&hits), bits(&brute(&index, row(&data, 0), 3, None)));
    assert_eq!(index.insert(row(&data, 0)).unwrap(), 1);
    assert_eq!(index.search(row(&data, 0), 1).unwrap()[0].index, 1);
}

#[test]
fn persistence_keeps_deletions_and_the_free_order() {
    let data = rows(800, 13);
    let mut index = Hnsw::build(&data, DIM, Metric::Cosine, params()).unwrap();
    for s in [5u32, 700, 12, 13] {
        index.mark_deleted(s).unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("deleted.hnsw");
    index.save(&path).unwrap();
    let mut back = Hnsw::load(&path).unwrap();
    assert_eq!(back.to_bytes(), index.to_bytes());
    assert_eq!(back.free_slots(), &[5, 700, 12, 13]);
    assert_eq!(back.live_len(), 796);
    assert!(back.is_deleted(700).unwrap() && !back.is_deleted(6).unwrap());
    for q in data.chunks_exact(DIM).step_by(53) {
        assert_eq!(
            bits(&back.search(q, 10).unwrap()),
            bits(&index.search(q, 10).unwrap())
        );
    }
    let fresh = rows(2, 14);
    assert_eq!(back.insert(row(&fresh, 0)).unwrap(), 13);
    assert_eq!(index.insert(row(&fresh, 0)).unwrap(), 13);
    assert_eq!(back.to_bytes(), index.to_bytes());
}

/// Rewrites both checksums after an edit (the layout of `persist.rs`).
fn reseal(bytes: &mut [u8]) {
    let crc = crc32fast::hash(&bytes[..96]);
    bytes[96..100].copy_from_slice(&crc.to_le_bytes());
    let end = bytes.len() - 4;
    let crc = crc32fast::hash(&bytes[100..end]);
    bytes[end..].copy_from_slice(&crc.to_le_bytes());
}

#[test]
fn version_1_files_open_without_deletions() {
    let data = rows(300, 15);
    let index = Hnsw::build(&data, DIM, Metric::L2, params()).unwrap();
    let v2 = index.to_bytes();
    assert_eq!(
        u32::from_le_bytes(v2[8..12].try_into().unwrap()),
        FORMAT_VERSION
    );
    // A version 1 image: the same bytes without the 16-byte lifecycle section.
    let end = v2.len() - 4;
    let mut v1 = [&v2[..end - 16], &v2[end..]].concat();
    v1[8..12].copy_from_slice(&1u32.to_le_bytes());
    let payload_len = u64::from_le_bytes(v1[88..96].try_into().unwrap()) - 16;
    v1[88..96].copy_from_slice(&payload_len.to_le_bytes());
    reseal(&mut v1);
    let mut old = Hnsw::from_bytes(&v1).unwrap();
    assert_eq!(
        old.to_bytes(),
        v2,
        "a version 1 file reopens as the same index"
    );
    assert_eq!(old.live_len(), 300);
    // It continues the build's level stream, as the fresh index does.
    let mut fresh = Hnsw::build(&data, DIM, Metric::L2, params()).unwrap();
    for i in 0..20 {
        old.insert(row(&data, i)).unwrap();
        fresh.insert(row(&data, i)).unwrap();
    }
    assert_eq!(old.to_bytes(), fresh.to_bytes());
}

#[test]
fn a_crafted_free_list_is_rejected() {
    let data = rows(300, 16);
    let mut index = Hnsw::build(&data, DIM, Metric::L2, params()).unwrap();
    index.mark_deleted(7).unwrap();
    index.mark_deleted(9).unwrap();
    let good = index.to_bytes();
    let end = good.len() - 4;
    // The slot list is the last 8 bytes of the payload: [7, 9].
    for (bad_slot, needle) in [(7u32, "listed twice"), (300, "out of range")] {
        let mut bad = good.clone();
        bad[end - 4..end].copy_from_slice(&bad_slot.to_le_bytes());
        reseal(&mut bad);
        let e = Hnsw::from_bytes(&bad).unwrap_err();
        assert!(
            matches!(&e, HnswError::Corrupt { what } if what.contains(needle)),
            "{e}"
        );
    }
    // A stored count that disagrees with the payload length.
    let mut bad = good.clone();
    bad[end - 16..end - 8].copy_from_slice(&3u64.to_le_bytes());
    reseal(&mut bad);
    let e = Hnsw::from_bytes(&bad).unwrap_err();
    assert!(
        matches!(&e, HnswError::Corrupt { what } if what.contains("3 deleted slots declared")),
        "{e}"
    );
}

/// One step of a random history.
#[derive(Debug, Clone)]
enum Step {
    Delete(u32),
    Insert(u64),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (0u32..260).prop_map(Step::Delete),
        any::<u64>().prop_map(Step::Insert),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// After any history, the exact mode equals brute force over the live
    /// allowed rows bit for bit, the walk returns only live allowed rows,
    /// and the counts agree.
    #[test]
    fn random_histories_keep_the_bookkeeping_exact(
        steps in prop::collection::vec(step(), 1..60),
        keep in 1u32..5,
        qseed in any::<u64>(),
    ) {
        let data = rows(200, 21);
        let mut index = Hnsw::build(&data, DIM, Metric::L2, HnswParams { m: 4, ef_construction: 16, ..params() }).unwrap();
        let mut deleted = std::collections::BTreeSet::new();
        for s in &steps {
            match *s {
                Step::Delete(slot) if (slot as usize) < index.len() => {
                    prop_assert_eq!(index.mark_deleted(slot).unwrap(), deleted.insert(slot));
                }
                Step::Delete(slot) => {
                    let rejected = matches!(index.mark_deleted(slot), Err(HnswError::SlotOutOfRange { .. }));
                    prop_assert!(rejected);
                }
                Step::Insert(seed) => {
                    let r = synth::gaussian_clusters(1, DIM, 1, 0.5, seed);
                    let slot = index.insert(&r).unwrap();
                    deleted.remove(&slot);
                }
            }
        }
        prop_assert_eq!(index.live_len(), index.len() - deleted.len());
        let q = synth::gaussian_clusters(1, DIM, 1, 0.5, qseed);
        let f = SlotFilter::from_fn(index.len() + 10, |s| s % keep == 0);
        index.set_filter_walk_cost(f64::INFINITY).unwrap();
        let exact = index.search_filtered(&q, 15, &f).unwrap();
        prop_assert_eq!(bits(&exact), bits(&brute(&index, &q, 15, Some(&f))));
        index.set_filter_walk_cost(0.0).unwrap();
        let walk = index.search_filtered(&q, 15, &f).unwrap();
        prop_assert_eq!(walk.len(), exact.len());
        prop_assert!(walk.iter().all(|h| f.contains(h.index) && !deleted.contains(&h.index)));
        let plain = index.search(&q, 15).unwrap();
        prop_assert_eq!(plain.len(), 15.min(index.live_len()));
        prop_assert!(plain.iter().all(|h| !deleted.contains(&h.index)));
    }
}

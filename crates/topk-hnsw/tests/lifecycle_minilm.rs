//! Recall after a lifecycle history on the real MiniLM embeddings
//! (20k × 384, inner product): remove a random 20 % of the rows, re-insert
//! half of them, then search unfiltered and under random 10 % filters. The
//! truth is exact search (topk-cpu, canonical scores, §3 order) over the
//! live rows the filter allows. The index is built once per test binary.

mod common;

use std::sync::OnceLock;

use ndarray::ArrayView2;
use topk_core::{Metric, Neighbor, Retriever};
use topk_cpu::CpuRetriever;
use topk_hnsw::{recall_at_k, Hnsw, HnswParams, SlotFilter, SplitMix64};

struct Fixture {
    index: Hnsw,
    /// The same index, always walking (never switching to exact scoring).
    walk_only: Hnsw,
    queries: Vec<Vec<f32>>,
    /// Slots removed and not re-inserted.
    removed: Vec<u32>,
    /// Per query, every live slot ranked exactly (best first).
    ranking: Vec<Vec<u32>>,
}

/// A seeded permutation of `0..n` (Fisher–Yates).
fn shuffled(n: usize, rng: &mut SplitMix64) -> Vec<u32> {
    let mut v: Vec<u32> = (0..n as u32).collect();
    for i in (1..n).rev() {
        let j = (rng.next_u64() % (i as u64 + 1)) as usize;
        v.swap(i, j);
    }
    v
}

fn fixture() -> Option<&'static Fixture> {
    static F: OnceLock<Option<Fixture>> = OnceLock::new();
    F.get_or_init(|| {
        let dir = common::minilm_dir()?;
        let corpus = topk_io::read_matrix(dir.join("corpus.npy")).unwrap();
        let queries = topk_io::read_matrix(dir.join("queries.npy")).unwrap();
        let (n, dim) = corpus.dim();
        let params = HnswParams {
            m: 16,
            ef_construction: 64,
            ef_search: 64,
            seed: 3,
            parallel: true,
        };
        let t = std::time::Instant::now();
        let mut index = Hnsw::new(corpus.view(), Metric::Dot, params).unwrap();
        let built = t.elapsed().as_secs_f64();
        let mut rng = SplitMix64::new(2026);
        let order = shuffled(n, &mut rng);
        let (gone, back) = order[..n / 5].split_at(n / 10);
        for &s in order[..n / 5].iter() {
            assert!(index.mark_deleted(s).unwrap());
        }
        // Half of the removed rows come back (into reused slots).
        for &s in back {
            index
                .insert(corpus.row(s as usize).as_slice().unwrap())
                .unwrap();
        }
        let history = t.elapsed().as_secs_f64() - built;
        assert_eq!(index.live_len(), n - n / 10);
        assert_eq!(index.len(), n);
        let removed = index.free_slots().to_vec();
        assert_eq!(removed.len(), gone.len());

        // Exact ranking of the live slots, with slot numbers restored.
        let live: Vec<u32> = (0..n as u32)
            .filter(|&s| !index.is_deleted(s).unwrap())
            .collect();
        let mut rows = Vec::with_capacity(live.len() * dim);
        for &s in &live {
            rows.extend_from_slice(&index.vectors()[s as usize * dim..(s as usize + 1) * dim]);
        }
        let exact = CpuRetriever::from_rowmajor(rows, dim, Metric::Dot).unwrap();
        let qs = queries.as_slice().unwrap();
        let ranking = exact
            .search_batch(
                ArrayView2::from_shape((queries.nrows(), dim), qs).unwrap(),
                live.len(),
            )
            .unwrap()
            .into_iter()
            .map(|r| r.into_iter().map(|h| live[h.index as usize]).collect())
            .collect();
        eprintln!(
            "fixture: build {built:.1} s, history {history:.1} s, exact ranking {:.1} s",
            t.elapsed().as_secs_f64() - built - history
        );
        let mut walk_only = Hnsw::from_bytes(&index.to_bytes()).unwrap();
        walk_only.set_filter_walk_cost(0.0).unwrap();
        Some(Fixture {
            walk_only,
            index,
            queries: queries.outer_iter().map(|q| q.to_vec()).collect(),
            removed,
            ranking,
        })
    })
    .as_ref()
}

fn assert_none_removed(f: &Fixture, results: &[Vec<Neighbor>]) {
    let removed: SlotFilter = f.removed.iter().copied().collect();
    for r in results {
        assert!(
            r.iter().all(|h| !removed.contains(h.index)),
            "a removed slot was returned: {r:?}"
        );
    }
}

#[test]
fn recall_after_removing_20_percent_and_re_adding_half() {
    let Some(f) = fixture() else { return };
    let results: Vec<Vec<Neighbor>> = f
        .queries
        .iter()
        .map(|q| {
            let mut out = Vec::new();
            f.index.search_with_ef(q, 10, 64, &mut out).unwrap();
            out
        })
        .collect();
    assert_none_removed(f, &results);
    let r = recall_at_k(&results, &f.ranking, 10).unwrap();
    eprintln!("minilm-docs-20k after -20 % / +10 %: recall@10 at ef=64 = {r:.4}");
    assert!(r >= 0.95, "recall@10 = {r}");
}

/// Recall@10 at ef = 64 of `index` under a random 10 % filter per query.
fn filtered_recall(f: &Fixture, index: &Hnsw) -> (f64, f64) {
    let n = index.len();
    let mut rng = SplitMix64::new(77);
    let mut results = Vec::new();
    let mut truth = Vec::new();
    let mut allowed_total = 0usize;
    for (q, ranking) in f.queries.iter().zip(&f.ranking) {
        // A random tenth of the slots (deleted ones included, as a caller's
        // allow-list may be): about 10 % of the live rows.
        let filter = SlotFilter::from_fn(n, |_| rng.next_u64() % 10 == 0);
        let mut out = Vec::new();
        index
            .search_filtered_with_ef(q, 10, 64, &filter, &mut out)
            .unwrap();
        assert!(out.iter().all(|h| filter.contains(h.index)));
        let t: Vec<u32> = ranking
            .iter()
            .copied()
            .filter(|&s| filter.contains(s))
            .collect();
        allowed_total += t.len();
        truth.push(t);
        results.push(out);
    }
    assert_none_removed(f, &results);
    let selectivity = allowed_total as f64 / (f.queries.len() * index.live_len()) as f64;
    assert!((0.09..0.11).contains(&selectivity), "{selectivity}");
    (selectivity, recall_at_k(&results, &truth, 10).unwrap())
}

#[test]
fn recall_under_10_percent_filters() {
    let Some(f) = fixture() else { return };
    // At 10 % of 20k rows the default rule scores the allowed rows exactly.
    let (s, exact) = filtered_recall(f, &f.index);
    // The filtered walk itself, forced.
    let (_, walk) = filtered_recall(f, &f.walk_only);
    eprintln!(
        "minilm-docs-20k after -20 % / +10 %, filters of {:.1} % selectivity, recall@10 at ef=64: \
         default (exact scoring) {exact:.4}, filtered walk {walk:.4}",
        100.0 * s
    );
    assert_eq!(exact, 1.0, "the exact path must find the exact top-10");
    assert!(walk >= 0.95, "filtered walk recall@10 = {walk}");
}

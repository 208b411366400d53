//! Recall of the `hnsw` backend on real sentence embeddings
//! (`minilm-docs-20k`: 20k × 384, inner product, 500 queries) after a
//! lifecycle history: remove a random 20 % of the ids, add half of them back,
//! then search unfiltered and under random 10 % filters. The truth is the
//! `oracle` backend on the final content. The data lives outside the
//! repository (`../shared/data/`): where it is absent the tests say so and
//! pass, unless `TOPK_REQUIRE_DATA=1`, which makes its absence a failure.

use std::path::PathBuf;
use std::sync::OnceLock;

use topk_core::{Hit, Metric};
use topk_hnsw::{HnswParams, SplitMix64};
use topk_index::{Filter, FilterSpec, Index, IndexBackend, IndexOptions};

struct Fixture {
    index: Index,
    oracle: Index,
    queries: ndarray::Array2<f32>,
    /// Ids removed and not added back.
    gone: Vec<u64>,
}

fn data_dir() -> Option<PathBuf> {
    topk_testkit::shared_data("minilm-docs-20k")
}

fn fixture() -> Option<&'static Fixture> {
    static F: OnceLock<Option<Fixture>> = OnceLock::new();
    F.get_or_init(|| {
        let dir = data_dir()?;
        let corpus = topk_io::read_matrix(dir.join("corpus.npy")).expect("corpus.npy");
        let queries = topk_io::read_matrix(dir.join("queries.npy")).expect("queries.npy");
        let (n, d) = corpus.dim();
        // Ids spread over the range and not in row order.
        let ids: Vec<u64> = (0..n as u64)
            .map(|i| (i * 7_919 + 13) % 1_000_003)
            .collect();
        let params = HnswParams {
            ef_search: 64,
            ..HnswParams::default()
        };
        let opts = IndexOptions::default().hnsw(params);
        let t = std::time::Instant::now();
        let mut index =
            Index::with_options(d, Metric::Dot, IndexBackend::Hnsw, &opts).expect("index");
        index.add(&ids, corpus.view()).expect("add");
        let built = t.elapsed().as_secs_f64();
        let mut rng = SplitMix64::new(2026);
        let mut order: Vec<usize> = (0..n).collect();
        for i in (1..n).rev() {
            order.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
        }
        let removed: Vec<usize> = order[..n / 5].to_vec();
        let removed_ids: Vec<u64> = removed.iter().map(|&r| ids[r]).collect();
        assert_eq!(index.remove(&removed_ids), n / 5);
        let back = &removed[..n / 10];
        let back_ids: Vec<u64> = back.iter().map(|&r| ids[r]).collect();
        let back_rows = corpus.select(ndarray::Axis(0), back);
        index.add(&back_ids, back_rows.view()).expect("add back");
        assert_eq!(index.len(), n - n / 10);
        eprintln!(
            "hnsw index: build {built:.1} s, history {:.1} s",
            t.elapsed().as_secs_f64() - built
        );
        let oracle = index.clone().with_backend(IndexBackend::Oracle);
        Some(Fixture {
            index,
            oracle,
            queries,
            gone: removed[n / 10..].iter().map(|&r| ids[r]).collect(),
        })
    })
    .as_ref()
}

/// Mean over queries of |found ∩ truth| / |truth|.
fn recall(found: &[Vec<Hit>], truth: &[Vec<Hit>]) -> f64 {
    let mut sum = 0.0;
    for (f, t) in found.iter().zip(truth) {
        let hit = f.iter().filter(|h| t.iter().any(|x| x.id == h.id)).count();
        sum += hit as f64 / t.len().max(1) as f64;
    }
    sum / truth.len() as f64
}

fn assert_none_gone(f: &Fixture, results: &[Vec<Hit>]) {
    for r in results {
        assert!(
            r.iter().all(|h| !f.gone.contains(&h.id)),
            "a removed id was returned: {r:?}"
        );
    }
}

#[test]
fn recall_after_removing_20_percent_and_adding_half_back() {
    let Some(f) = fixture() else { return };
    let found = f
        .index
        .search_batch(f.queries.view(), 10, FilterSpec::None)
        .expect("hnsw");
    let truth = f
        .oracle
        .search_batch(f.queries.view(), 10, FilterSpec::None)
        .expect("oracle");
    assert_none_gone(f, &found);
    let r = recall(&found, &truth);
    eprintln!("minilm-docs-20k (hnsw index) after -20 % / +10 %: recall@10 at ef=64 = {r:.4}");
    assert!(r >= 0.95, "recall@10 = {r}");
}

#[test]
fn recall_under_10_percent_filters() {
    let Some(f) = fixture() else { return };
    let live = f.index.ids();
    let mut rng = SplitMix64::new(77);
    let filters: Vec<Filter> = (0..f.queries.nrows())
        .map(|_| {
            Filter::new(
                live.iter()
                    .copied()
                    .filter(|_| rng.next_u64().is_multiple_of(10)),
            )
        })
        .collect();
    let allowed: usize = filters.iter().map(Filter::len).sum();
    let selectivity = allowed as f64 / (filters.len() * live.len()) as f64;
    assert!((0.09..0.11).contains(&selectivity), "{selectivity}");
    let spec = FilterSpec::PerQuery(&filters);
    let truth = f
        .oracle
        .search_batch(f.queries.view(), 10, spec)
        .expect("oracle");
    // About 1,800 allowed rows of 20,000 slots: below sqrt(16 · 64 · 20,000)
    // ≈ 4,525, so the default rule answers exactly, bit for bit.
    let exact = f
        .index
        .search_batch(f.queries.view(), 10, spec)
        .expect("hnsw");
    for (q, (got, want)) in exact.iter().zip(&truth).enumerate() {
        let bits = |h: &[Hit]| {
            h.iter()
                .map(|h| (h.id, h.score.to_bits()))
                .collect::<Vec<_>>()
        };
        assert_eq!(bits(got), bits(want), "query {q}");
    }
    // The filtered walk itself, forced.
    let mut walking = f.index.clone();
    walking.set_filter_walk_cost(0.0).expect("c = 0");
    let walked = walking
        .search_batch(f.queries.view(), 10, spec)
        .expect("walk");
    assert_none_gone(f, &walked);
    for (w, filter) in walked.iter().zip(&filters) {
        assert!(w.iter().all(|h| filter.contains(h.id)));
    }
    let walk = recall(&walked, &truth);
    eprintln!(
        "minilm-docs-20k (hnsw index) after -20 % / +10 %, filters of {:.1} % selectivity, \
         recall@10 at ef=64: default (exact switch) 1.0000, filtered walk {walk:.4}",
        100.0 * selectivity
    );
    assert!(walk >= 0.95, "filtered walk recall@10 = {walk}");
}

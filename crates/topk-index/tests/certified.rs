//! The `cpu` backend's certified path (docs/CONTRACTS.md §2.1): batches of
//! 16 queries or more, and single queries over 2^20 stored values or more
//! where the CPU runs the int8 product. Through a history of changes that
//! the path's row state must follow (appends across row blocks, upserts in
//! place, tombstones, compaction), under every filter shape, with f32 and
//! f16 storage: every answer equals, bit for bit, the oracle index rebuilt
//! from scratch over the content at that moment. Rows of small integers
//! with duplicates tie at the K-th score, and shuffled ids make the id
//! tiebreak differ from the row order.

use std::collections::BTreeMap;

use ndarray::ArrayView2;
use topk_core::{Dtype, Metric, MAX_ID};
use topk_cpu::{MIN_INT8_VALUES, MIN_QUERIES};
use topk_index::{Filter, FilterSpec, Index, IndexBackend, IndexOptions};
use topk_testkit::corpora::{self, Kind, Rng};
use topk_testkit::hits::{rows_of, same_hits as same};

const KINDS: [Kind; 3] = [Kind::SmallInt, Kind::Duplicate, Kind::Uniform];

/// An index and the content it should hold.
struct Subject {
    index: Index,
    model: BTreeMap<u64, Vec<f32>>,
    dtype: Dtype,
    metric: Metric,
    d: usize,
    rng: Rng,
    earlier: Vec<f32>,
    next_id: u64,
}

impl Subject {
    fn new(d: usize, metric: Metric, dtype: Dtype, seed: u64) -> Subject {
        let options = IndexOptions::default().dtype(dtype);
        Subject {
            index: Index::with_options(d, metric, IndexBackend::Cpu, &options).expect("index"),
            model: BTreeMap::new(),
            dtype,
            metric,
            d,
            rng: Rng::new(seed),
            earlier: Vec::new(),
            next_id: 0,
        }
    }

    /// `n` fresh vectors of the tie-rich kinds.
    fn vectors(&mut self, n: usize) -> Vec<Vec<f32>> {
        (0..n)
            .map(|_| {
                let v = corpora::vector_of(&mut self.rng, &KINDS, self.d, &self.earlier);
                self.earlier.extend_from_slice(&v);
                v
            })
            .collect()
    }

    /// Ids in a scrambled order, some near the top of the id range.
    fn fresh_id(&mut self) -> u64 {
        self.next_id += 1;
        let i = self.next_id;
        if i.is_multiple_of(7) {
            MAX_ID - i
        } else {
            (i * 0x9E37_79B9) % (1 << 40)
        }
    }

    fn keep(&mut self, ids: &[u64], vs: &[Vec<f32>]) {
        for (&id, v) in ids.iter().zip(vs) {
            let stored = v.iter().map(|&x| self.dtype.round(x)).collect();
            self.model.insert(id, stored);
        }
    }

    fn add(&mut self, n: usize) {
        let ids: Vec<u64> = (0..n).map(|_| self.fresh_id()).collect();
        let vs = self.vectors(n);
        self.index
            .add(&ids, rows_of(&vs, self.d).view())
            .expect("add");
        self.keep(&ids, &vs);
    }

    /// Replaces `present` live vectors in place and adds `fresh` new ones.
    fn upsert(&mut self, present: usize, fresh: usize) {
        let live: Vec<u64> = self.model.keys().copied().collect();
        let mut ids: Vec<u64> = (0..present)
            .map(|_| live[self.rng.below(live.len())])
            .collect();
        ids.sort_unstable();
        ids.dedup();
        ids.extend((0..fresh).map(|_| self.fresh_id()));
        let vs = self.vectors(ids.len());
        self.index
            .upsert(&ids, rows_of(&vs, self.d).view())
            .expect("upsert");
        self.keep(&ids, &vs);
    }

    /// Removes about one live row in `every`.
    fn remove(&mut self, every: usize) {
        let gone: Vec<u64> = self.model.keys().copied().step_by(every).collect();
        assert_eq!(self.index.remove(&gone), gone.len());
        for id in gone {
            self.model.remove(&id);
        }
    }

    fn oracle(&self) -> Index {
        let ids: Vec<u64> = self.model.keys().copied().collect();
        let flat: Vec<f32> = self.model.values().flatten().copied().collect();
        let rows = ArrayView2::from_shape((ids.len(), self.d), &flat).expect("shape");
        Index::with_ids(&ids, rows, self.metric, IndexBackend::Oracle).expect("oracle")
    }

    /// A filter allowing about `percent` % of the live ids, and some absent ones.
    fn filter(&mut self, percent: usize) -> Filter {
        let live: Vec<u64> = self.model.keys().copied().collect();
        let rng = &mut self.rng;
        Filter::new(
            live.into_iter()
                .filter(|_| rng.below(100) < percent)
                .chain([MAX_ID, 5]),
        )
    }

    /// Batches of `q` queries under no filter, shared dense and sparse
    /// filters and one filter per query, and `singles` single queries,
    /// against the oracle; then checks that the row state covers every
    /// stored row (`state`), or was never built.
    fn check(&mut self, step: &str, q: usize, singles: usize, state: bool) {
        let d = self.d;
        let truth = self.oracle();
        let qs = corpora::queries(self.rng.next_u64(), q, d, &KINDS, &self.earlier);
        let view = ArrayView2::from_shape((q, d), &qs).expect("shape");
        let dense = self.filter(70);
        let sparse = self.filter(10);
        // A quarter sparse (gathered), the rest dense (certified together
        // once 16 or more of them share a chunk).
        let per: Vec<Filter> = (0..q)
            .map(|i| self.filter(if i % 4 == 0 { 10 } else { 60 }))
            .collect();
        let ctx = format!("{} {:?} {step}", self.metric, self.dtype);
        for k in [1, 10, 100] {
            let runs: [(&str, FilterSpec<'_>); 4] = [
                ("unfiltered", FilterSpec::None),
                ("dense", FilterSpec::Shared(&dense)),
                ("sparse", FilterSpec::Shared(&sparse)),
                ("per query", FilterSpec::PerQuery(&per)),
            ];
            for (name, spec) in runs {
                let got = self.index.search_batch(view, k, spec).expect("batch");
                for (i, (g, query)) in got.iter().zip(qs.chunks_exact(d)).enumerate() {
                    let want = truth.search(query, k, filter_of(spec, i)).expect("oracle");
                    same(g, &want)
                        .unwrap_or_else(|e| panic!("{ctx} {name} K={k} batch query {i}: {e}"));
                }
            }
            for (i, query) in qs.chunks_exact(d).take(singles).enumerate() {
                for f in [None, Some(&dense)] {
                    let got = self.index.search(query, k, f).expect("search");
                    let want = truth.search(query, k, f).expect("oracle");
                    same(&got, &want).unwrap_or_else(|e| {
                        panic!("{ctx} K={k} single query {i} filtered {}: {e}", f.is_some())
                    });
                }
            }
        }
        let want = state.then(|| self.index.stored_rows());
        assert_eq!(
            self.index.certified_coverage(),
            want,
            "{ctx}: the certified row state follows the rows"
        );
    }
}

/// Query `i`'s filter.
fn filter_of<'a>(spec: FilterSpec<'a>, i: usize) -> Option<&'a Filter> {
    match spec {
        FilterSpec::None => None,
        FilterSpec::Shared(f) => Some(f),
        FilterSpec::PerQuery(fs) => fs.get(i),
    }
}

/// Batches over a few thousand rows: the state is built by the first batch
/// and follows appends, upserts, removals and compaction from then on.
#[test]
fn batches_follow_every_change_of_the_rows() {
    let d = 24;
    for dtype in [Dtype::F32, Dtype::F16] {
        for metric in Metric::ALL {
            let mut s = Subject::new(d, metric, dtype, 3);
            s.add(2_000);
            assert_eq!(s.index.certified_coverage(), None);
            s.check("built", 2 * MIN_QUERIES + 8, 0, true);
            // Across the 512-row blocks of the state, in several appends.
            s.add(700);
            s.add(1);
            s.check("appended", MIN_QUERIES, 0, true);
            s.upsert(60, 30);
            s.check("upserted", MIN_QUERIES + 1, 0, true);
            // Under the compaction point: tombstones stay in the rows.
            s.remove(6);
            assert!(s.index.tombstones() > 0);
            s.check("removed", MIN_QUERIES, 0, true);
            s.index.compact();
            s.check("compacted", MIN_QUERIES, 0, true);
            s.add(5);
            s.check("appended after compaction", MIN_QUERIES, 0, true);
        }
    }
}

/// Single queries over 2^20 stored values take the path once the state is
/// prepared, where the CPU runs the int8 product (elsewhere they scan; the
/// answers are the same).
#[test]
fn single_queries_over_many_values_follow_the_rows() {
    let d = 20;
    let n = MIN_INT8_VALUES / d + 40;
    for metric in Metric::ALL {
        let mut s = Subject::new(d, metric, Dtype::F32, 9);
        s.add(n);
        // Small searches use the state but never build it.
        let q = corpora::queries(3, 1, d, &KINDS, &s.earlier);
        s.index.search(&q, 10, None).expect("search");
        assert_eq!(s.index.certified_coverage(), None, "{metric}");
        s.index.prepare_certified();
        for (i, q) in corpora::queries(4, 3, d, &KINDS, &s.earlier)
            .chunks_exact(d)
            .enumerate()
        {
            let got = s.index.search(q, 10, None).expect("search");
            let want = s.oracle().search(q, 10, None).expect("oracle");
            same(&got, &want).unwrap_or_else(|e| panic!("{metric} query {i}: {e}"));
        }
        assert_eq!(s.index.certified_coverage(), Some(n), "{metric}: prepared");
        s.upsert(5, 3);
        s.remove(40);
        s.check("changed", 2, 2, true);
    }
}

/// Only the `cpu` backend holds the state.
#[test]
fn other_backends_hold_no_certified_state() {
    let rows = ndarray::Array2::<f32>::ones((100, 4));
    for backend in [IndexBackend::Oracle, IndexBackend::Hnsw] {
        let index = Index::from_rows(rows.view(), Metric::Dot, backend).expect("index");
        index.prepare_certified();
        assert_eq!(index.certified_coverage(), None, "{backend}");
    }
    let cpu = Index::from_rows(rows.view(), Metric::Dot, IndexBackend::Cpu).expect("index");
    cpu.prepare_certified();
    assert_eq!(cpu.certified_coverage(), Some(100));
}

/// Filters given per query, past one chunk of queries held at once: each
/// query under its own filter, dense and sparse ones mixed, bit for bit the
/// oracle's.
#[test]
fn per_query_filters_across_chunks() {
    let d = 16;
    let mut s = Subject::new(d, Metric::Dot, Dtype::F32, 21);
    s.add(3_000);
    s.remove(9);
    let truth = s.oracle();
    let q = 300;
    let qs = corpora::queries(22, q, d, &KINDS, &s.earlier);
    let view = ArrayView2::from_shape((q, d), &qs).expect("shape");
    let per: Vec<Filter> = (0..q).map(|i| s.filter([5, 40, 90, 100][i % 4])).collect();
    for k in [1, 7, 100] {
        let got = s
            .index
            .search_batch(view, k, FilterSpec::PerQuery(&per))
            .expect("batch");
        for (i, (g, query)) in got.iter().zip(qs.chunks_exact(d)).enumerate() {
            let want = truth.search(query, k, Some(&per[i])).expect("oracle");
            same(g, &want).unwrap_or_else(|e| panic!("K={k} query {i}: {e}"));
        }
    }
    assert_eq!(s.index.certified_coverage(), Some(s.index.stored_rows()));
}

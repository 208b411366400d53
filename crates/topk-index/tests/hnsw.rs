//! The `hnsw` backend of `Index` (docs/CONTRACTS.md §10): random histories of
//! add / upsert / remove / compact / save+open checked against every rule an
//! approximate index keeps exactly, the exact switch of very selective
//! filters, the graph section of the file, and the errors it shares with the
//! exact backends.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use ndarray::{Array2, ArrayView2};
use proptest::prelude::*;
use topk_core::{cmp_hit, Hit, Metric};
use topk_hnsw::{HnswParams, DEFAULT_FILTER_WALK_COST};
use topk_index::{Filter, FilterSpec, Index, IndexBackend, IndexError, IndexOptions, ProgressHook};
use topk_testkit::corpora::{self, Kind, Rng};

/// Small graphs with a narrow beam, so that indexes of a few hundred rows
/// are walked rather than scored exactly.
fn params(seed: u64) -> HnswParams {
    HnswParams {
        m: 4,
        ef_construction: 16,
        ef_search: 4,
        seed,
        parallel: false,
    }
}

fn options(seed: u64, walk_cost: Option<f64>) -> IndexOptions {
    let o = IndexOptions::default().hnsw(params(seed));
    match walk_cost {
        Some(c) => o.filter_walk_cost(c),
        None => o,
    }
}

fn rows_of(vectors: &[Vec<f32>], d: usize) -> Array2<f32> {
    let flat: Vec<f32> = vectors.iter().flatten().copied().collect();
    Array2::from_shape_vec((vectors.len(), d), flat).unwrap_or_else(|_| Array2::zeros((0, d)))
}

/// The oracle rebuilt from scratch on the model's content.
fn rebuilt(model: &BTreeMap<u64, Vec<f32>>, d: usize, metric: Metric) -> Index {
    let ids: Vec<u64> = model.keys().copied().collect();
    let vs: Vec<Vec<f32>> = model.values().cloned().collect();
    Index::with_ids(&ids, rows_of(&vs, d).view(), metric, IndexBackend::Oracle)
        .expect("model content is valid")
}

/// Compares two hit lists bit for bit (ids and score bits).
fn same(got: &[Hit], want: &[Hit]) -> Result<(), String> {
    let bits = |h: &[Hit]| {
        h.iter()
            .map(|h| (h.id, h.score.to_bits()))
            .collect::<Vec<_>>()
    };
    if bits(got) != bits(want) {
        return Err(format!("got {got:?}, expected {want:?}"));
    }
    Ok(())
}

/// Every rule an approximate result keeps exactly: only live allowed ids,
/// each once, each with the canonical score of its stored vector, in the
/// §3 order, `min(k, allowed)` of them.
fn check_approximate(
    hits: &[Hit],
    query: &[f32],
    k: usize,
    filter: Option<&Filter>,
    model: &BTreeMap<u64, Vec<f32>>,
    metric: Metric,
) -> Result<(), String> {
    let allowed = model
        .keys()
        .filter(|&&id| filter.is_none_or(|f| f.contains(id)))
        .count();
    if hits.len() != k.min(allowed) {
        return Err(format!(
            "{} hits for k = {k} and {allowed} allowed rows",
            hits.len()
        ));
    }
    let mut seen = std::collections::HashSet::new();
    for h in hits {
        let Some(v) = model.get(&h.id) else {
            return Err(format!("id {} is not in the index", h.id));
        };
        if filter.is_some_and(|f| !f.contains(h.id)) {
            return Err(format!("id {} is not allowed", h.id));
        }
        if !seen.insert(h.id) {
            return Err(format!("id {} twice", h.id));
        }
        let want = metric.score_scalar(query, v);
        if h.score.to_bits() != want.to_bits() {
            return Err(format!(
                "id {}: score {:?}, canonical {want:?}",
                h.id, h.score
            ));
        }
    }
    for w in hits.windows(2) {
        if cmp_hit(&w[0], &w[1]) != std::cmp::Ordering::Less {
            return Err(format!("out of order: {:?} then {:?}", w[0], w[1]));
        }
    }
    Ok(())
}

#[derive(Debug, Clone)]
enum Op {
    Add(usize),
    Upsert(usize),
    Remove(usize),
    Compact,
    /// Save, then reopen on hnsw (the graph kept) or on the oracle.
    SaveOpen(bool),
    /// Filter shape `0..6`, K.
    Search(u8, usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (1usize..80).prop_map(Op::Add),
        2 => (1usize..12).prop_map(Op::Upsert),
        2 => (1usize..60).prop_map(Op::Remove),
        1 => Just(Op::Compact),
        1 => any::<bool>().prop_map(Op::SaveOpen),
        4 => (0u8..6, 1usize..24).prop_map(|(f, k)| Op::Search(f, k)),
    ]
}

/// A filter of shape `shape`: 0 empty, 1 every present id, 2 very sparse
/// (about 3 %), 3 dense (about 60 %), 4 only absent ids, 5 a third of the
/// present ids and some absent ones.
fn filter(shape: u8, model: &BTreeMap<u64, Vec<f32>>, pool: &[u64], rng: &mut Rng) -> Filter {
    let present: Vec<u64> = model.keys().copied().collect();
    let absent = pool.iter().copied().filter(|id| !model.contains_key(id));
    match shape {
        0 => Filter::default(),
        1 => Filter::new(present),
        2 => Filter::new(present.into_iter().filter(|_| rng.below(32) == 0)),
        3 => Filter::new(present.into_iter().filter(|_| rng.below(5) < 3)),
        4 => Filter::new(absent),
        _ => Filter::new(
            present
                .into_iter()
                .filter(|_| rng.below(3) == 0)
                .chain(absent.take(5)),
        ),
    }
}

/// The indexes a history drives: the default exact switch, and one that
/// always walks.
struct Pair {
    switching: Index,
    walking: Index,
}

impl Pair {
    fn each(&mut self, mut f: impl FnMut(&mut Index) -> Result<(), String>) -> Result<(), String> {
        f(&mut self.switching)?;
        f(&mut self.walking)
    }
}

fn run_history(
    seed: u64,
    d: usize,
    metric: Metric,
    kinds: &[Kind],
    ops: &[Op],
) -> Result<(), String> {
    let mut rng = Rng::new(seed);
    let mut pool: Vec<u64> = (0..400u64).map(|i| i * 7 + (seed % 5)).collect();
    for i in (1..pool.len()).rev() {
        pool.swap(i, rng.below(i + 1));
    }
    let e = |e: IndexError| e.to_string();
    let mut ix = Pair {
        switching: Index::with_options(d, metric, IndexBackend::Hnsw, &options(seed, None))
            .map_err(e)?,
        walking: Index::with_options(d, metric, IndexBackend::Hnsw, &options(seed, Some(0.0)))
            .map_err(e)?,
    };
    let mut model: BTreeMap<u64, Vec<f32>> = BTreeMap::new();
    let mut earlier: Vec<f32> = Vec::new();
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    for (step, op) in ops.iter().enumerate() {
        let mut fresh = |rng: &mut Rng| {
            let v = corpora::vector_of(rng, kinds, d, &earlier);
            earlier.extend_from_slice(&v);
            v
        };
        match *op {
            Op::Add(n) => {
                let ids: Vec<u64> = pool
                    .iter()
                    .copied()
                    .filter(|id| !model.contains_key(id))
                    .take(n)
                    .collect();
                let vs: Vec<Vec<f32>> = ids.iter().map(|_| fresh(&mut rng)).collect();
                let rows = rows_of(&vs, d);
                ix.each(|i| i.add(&ids, rows.view()).map_err(e))?;
                model.extend(ids.into_iter().zip(vs));
            }
            Op::Upsert(n) => {
                let mut ids: Vec<u64> = Vec::new();
                while ids.len() < n {
                    let id = pool[rng.below(pool.len())];
                    if !ids.contains(&id) {
                        ids.push(id);
                    }
                }
                let vs: Vec<Vec<f32>> = ids.iter().map(|_| fresh(&mut rng)).collect();
                let rows = rows_of(&vs, d);
                ix.each(|i| i.upsert(&ids, rows.view()).map_err(e))?;
                model.extend(ids.into_iter().zip(vs));
            }
            Op::Remove(n) => {
                let ids: Vec<u64> = (0..n).map(|_| pool[rng.below(pool.len())]).collect();
                let mut unique = ids.clone();
                unique.sort_unstable();
                unique.dedup();
                let want = unique
                    .iter()
                    .filter(|&id| model.remove(id).is_some())
                    .count();
                ix.each(|i| {
                    let got = i.remove(&ids);
                    if got != want {
                        return Err(format!("step {step}: removed {got}, expected {want}"));
                    }
                    Ok(())
                })?;
            }
            Op::Compact => ix.each(|i| {
                i.compact();
                Ok(())
            })?,
            Op::SaveOpen(keep_graph) => {
                let q = fresh(&mut rng);
                let mut next = Vec::new();
                for (name, index) in [("switching", &ix.switching), ("walking", &ix.walking)] {
                    let path = dir.path().join(format!("step{step}{name}.topkidx"));
                    index.save(&path).map_err(e)?;
                    let before = index.search(&q, 9, None).map_err(e)?;
                    let walk_cost = (name == "walking").then_some(0.0);
                    let oracle = Index::open_with_options(
                        &path,
                        IndexBackend::Oracle,
                        &options(seed, walk_cost),
                    )
                    .map_err(e)?;
                    same(
                        &oracle.search(&q, 9, None).map_err(e)?,
                        &rebuilt(&model, d, metric).search(&q, 9, None).map_err(e)?,
                    )
                    .map_err(|m| format!("step {step}: {name} file on the oracle: {m}"))?;
                    let back = Index::open_with_options(
                        &path,
                        IndexBackend::Hnsw,
                        &options(seed, walk_cost),
                    )
                    .map_err(e)?;
                    if !model.is_empty() && !back.has_graph() {
                        return Err(format!("step {step}: {name} reopened without its graph"));
                    }
                    same(&back.search(&q, 9, None).map_err(e)?, &before)
                        .map_err(|m| format!("step {step}: {name} reopened: {m}"))?;
                    next.push(if keep_graph {
                        back
                    } else {
                        // Through the oracle and back: a fresh graph over the file's rows.
                        oracle.with_backend(IndexBackend::Hnsw)
                    });
                }
                let walking = next.pop().ok_or("no walking index")?;
                let switching = next.pop().ok_or("no switching index")?;
                ix = Pair { switching, walking };
                ix.walking.set_filter_walk_cost(0.0).map_err(e)?;
            }
            Op::Search(shape, k) => {
                let truth = rebuilt(&model, d, metric);
                let corpus: Vec<f32> = model.values().flatten().copied().collect();
                let qs = corpora::queries(rng.next_u64(), 3, d, kinds, &corpus);
                let qv = ArrayView2::from_shape((3, d), &qs).map_err(|e| e.to_string())?;
                let filters: Vec<Filter> = (0..3)
                    .map(|_| filter(shape, &model, &pool, &mut rng))
                    .collect();
                for (name, index) in [("switching", &ix.switching), ("walking", &ix.walking)] {
                    let per_query = index
                        .search_batch(qv, k, FilterSpec::PerQuery(&filters))
                        .map_err(e)?;
                    let shared = index
                        .search_batch(qv, k, FilterSpec::Shared(&filters[0]))
                        .map_err(e)?;
                    let unfiltered = index.search_batch(qv, k, FilterSpec::None).map_err(e)?;
                    for (i, q) in qs.chunks_exact(d).enumerate() {
                        let ctx = |what: &str, m: String| {
                            format!(
                                "step {step} {name} query {i} {what} (filter {shape}, k {k}): {m}"
                            )
                        };
                        let single = index.search(q, k, Some(&filters[i])).map_err(e)?;
                        same(&single, &per_query[i]).map_err(|m| ctx("single vs batch", m))?;
                        for (what, hits, f) in [
                            ("per-query filter", &per_query[i], Some(&filters[i])),
                            ("shared filter", &shared[i], Some(&filters[0])),
                            ("unfiltered", &unfiltered[i], None),
                        ] {
                            check_approximate(hits, q, k, f, &model, metric)
                                .map_err(|m| ctx(what, m))?;
                            // Some live rows excluded and few allowed: at most
                            // sqrt(c · max(ef, k) · slots) whatever the slot
                            // count (slots ≥ live rows > allowed).
                            let allowed = f.map_or(model.len(), |f| {
                                model.keys().filter(|&&id| f.contains(id)).count()
                            });
                            let few = allowed < model.len()
                                && allowed as f64
                                    <= DEFAULT_FILTER_WALK_COST * index.ef().max(k) as f64;
                            if name == "switching" && few {
                                same(hits, &truth.search(q, k, f).map_err(e)?)
                                    .map_err(|m| ctx(&format!("{what}, exact switch"), m))?;
                            }
                        }
                    }
                }
            }
        }
        for index in [&ix.switching, &ix.walking] {
            if index.len() != model.len() {
                return Err(format!(
                    "step {step}: len {}, expected {}",
                    index.len(),
                    model.len()
                ));
            }
        }
    }
    Ok(())
}

fn metric() -> impl Strategy<Value = Metric> {
    prop_oneof![Just(Metric::Dot), Just(Metric::Cosine), Just(Metric::L2)]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// Tie-rich rows under shuffled ids, graphs of up to a few hundred slots
    /// walked with a beam of 4.
    #[test]
    fn hnsw_histories_keep_every_exact_rule(
        seed in any::<u64>(),
        d in prop_oneof![1usize..6, Just(24usize)],
        metric in metric(),
        mask in any::<u8>(),
        ops in prop::collection::vec(op(), 1..24),
    ) {
        let mut kinds = corpora::palette(mask & 0x7f);
        kinds.extend([Kind::SmallInt, Kind::Duplicate, Kind::Uniform]);
        if let Err(m) = run_history(seed, d, metric, &kinds, &ops) {
            return Err(TestCaseError::fail(format!("seed {seed}: {m}")));
        }
    }
}

fn uniform(n: usize, d: usize, seed: u64) -> Array2<f32> {
    let data = corpora::corpus(seed, n, d, &[Kind::Uniform]);
    Array2::from_shape_vec((n, d), data).expect("shape")
}

#[test]
fn an_empty_hnsw_index_answers_nothing_and_refuses_what_cpu_refuses() {
    let mut ix = Index::new(3, Metric::Dot, IndexBackend::Hnsw).expect("index");
    assert!(!ix.has_graph());
    assert_eq!(
        ix.search(&[1.0, 0.0, 0.0], 5, None).expect("search"),
        vec![]
    );
    let cpu = Index::new(3, Metric::Dot, IndexBackend::Cpu).expect("index");
    let qs = Array2::<f32>::zeros((2, 3));
    for index in [&ix, &cpu] {
        let k0 = index.search(&[1.0, 0.0, 0.0], 0, None).expect_err("k = 0");
        let dim = index.search(&[1.0, 0.0], 3, None).expect_err("dimension");
        let count = index
            .search_batch(qs.view(), 3, FilterSpec::PerQuery(&[Filter::default()]))
            .expect_err("filter count");
        assert!(
            matches!(k0, IndexError::Input(topk_core::Error::ZeroK)),
            "{k0}"
        );
        assert!(matches!(dim, IndexError::Input(_)), "{dim}");
        assert!(
            count.to_string().contains("1 filters for 2 queries"),
            "{count}"
        );
    }
    // Rows, then every row removed: the graph stays, nothing is returned.
    let rows = uniform(100, 3, 1);
    let ids: Vec<u64> = (0..100).collect();
    ix.add(&ids, rows.view()).expect("add");
    assert!(ix.has_graph());
    assert_eq!(
        ix.search(&[1.0, 0.0, 0.0], 500, None).expect("k > n").len(),
        100
    );
    assert_eq!(ix.remove(&ids), 100);
    assert_eq!(
        ix.search(&[1.0, 0.0, 0.0], 5, None).expect("search"),
        vec![]
    );
    let err = ix.add(&[1], uniform(1, 2, 1).view()).expect_err("width");
    assert!(err.to_string().contains("the index has D = 3"), "{err}");
}

#[test]
fn very_selective_filters_are_answered_exactly() {
    let (n, d) = (3000, 8);
    let rows = corpora::shuffled_duplicates(5, n, d, 400);
    let rows = ArrayView2::from_shape((n, d), &rows).expect("shape");
    let ids: Vec<u64> = (0..n as u64).map(|i| (i * 7919) % 10_007).collect();
    let opts = IndexOptions::default().hnsw(HnswParams {
        ef_search: 16,
        ..params(3)
    });
    let mut ix = Index::with_options(d, Metric::Dot, IndexBackend::Hnsw, &opts).expect("index");
    ix.add(&ids, rows).expect("add");
    let oracle = ix.clone().with_backend(IndexBackend::Oracle);
    let mut rng = Rng::new(9);
    // sqrt(16 · 16 · 3000) ≈ 876 allowed rows or fewer: exact.
    for allowed in [1usize, 10, 100, 800] {
        let f = Filter::new((0..allowed).map(|_| ids[rng.below(n)]));
        for q in 0..5 {
            let query = rows.row(q * 31).to_vec();
            for k in [1, 10, 100] {
                same(
                    &ix.search(&query, k, Some(&f)).expect("hnsw"),
                    &oracle.search(&query, k, Some(&f)).expect("oracle"),
                )
                .unwrap_or_else(|m| panic!("{allowed} allowed, k {k}: {m}"));
            }
        }
    }
}

#[test]
fn the_graph_is_saved_checksummed_and_ignored_by_exact_backends() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("g.topkidx");
    let rows = uniform(500, 6, 2);
    let ids: Vec<u64> = (0..500).map(|i| 1000 + i).collect();
    let mut ix =
        Index::with_options(6, Metric::L2, IndexBackend::Hnsw, &options(1, None)).expect("index");
    ix.add(&ids, rows.view()).expect("add");
    assert_eq!(ix.remove(&ids[..50]), 50);
    ix.save(&path).expect("save");
    let bytes = std::fs::read(&path).expect("read");
    let rows_end = 48 + 450 * (8 + 6 * 4) + 4 + 4;
    assert_eq!(&bytes[rows_end..rows_end + 8], b"TOPKGRPH");
    let info = Index::file_info(&path).expect("info");
    assert_eq!(
        (info.version, info.rows, info.dim, info.graph),
        (2, 450, 6, true)
    );
    let q = rows.row(7).to_vec();
    let before = ix.search(&q, 10, None).expect("search");
    let back = Index::open(&path, IndexBackend::Hnsw).expect("open");
    assert_eq!(back.ef(), 4, "the file's parameters");
    same(&back.search(&q, 10, None).expect("search"), &before).expect("same answers");
    let exact = Index::open(&path, IndexBackend::Cpu).expect("open");
    assert!(!exact.has_graph());
    same(
        &exact.search(&q, 10, None).expect("search"),
        &back
            .clone()
            .with_backend(IndexBackend::Oracle)
            .search(&q, 10, None)
            .expect("oracle"),
    )
    .expect("exact");

    let open_bytes = |b: &[u8], backend| {
        let p = dir.path().join("edited.topkidx");
        std::fs::write(&p, b).expect("write");
        Index::open(&p, backend)
    };
    // A flipped byte of the graph: a checksum error over the section's body.
    let mut bad = bytes.clone();
    bad[rows_end + 40] ^= 1;
    let err = open_bytes(&bad, IndexBackend::Hnsw).expect_err("flip");
    let body_at = rows_end as u64 + 16;
    let body_end = bytes.len() as u64 - 4;
    assert!(
        err.to_string().contains(&format!(
            "checksum mismatch over bytes {body_at}..{body_end}"
        )),
        "{err}"
    );
    // The exact backends do not read the graph's body.
    assert_eq!(
        open_bytes(&bad, IndexBackend::Oracle)
            .expect("oracle")
            .len(),
        450
    );
    // Cut anywhere in the section: truncated, naming where the file ends.
    for cut in [rows_end + 3, rows_end + 12, rows_end + 100, bytes.len() - 1] {
        let err = open_bytes(&bytes[..cut], IndexBackend::Hnsw).expect_err("cut");
        assert!(
            matches!(err, IndexError::Truncated { len, .. } if len == cut as u64),
            "cut {cut}: {err}"
        );
    }
    // Bytes after the section.
    let mut longer = bytes.clone();
    longer.extend_from_slice(&[0; 3]);
    let err = open_bytes(&longer, IndexBackend::Cpu).expect_err("trailing");
    assert!(
        err.to_string().contains(&format!(
            "3 unexpected bytes after the end of the index at offset {}",
            bytes.len()
        )),
        "{err}"
    );
    // A checksummed section that names an id the rows do not hold.
    let mut forged = bytes.clone();
    let slot0 = rows_end + 16 + 8;
    let (free_slots, live_id) = (u64::MAX.to_le_bytes(), 1_000_000u64.to_le_bytes());
    let first_live = (0..500)
        .map(|s| slot0 + 8 * s)
        .find(|&at| forged[at..at + 8] != free_slots)
        .expect("a live slot");
    forged[first_live..first_live + 8].copy_from_slice(&live_id);
    let body = &forged[rows_end + 16..forged.len() - 4];
    let crc = crc32fast::hash(body).to_le_bytes();
    let n = forged.len();
    forged[n - 4..].copy_from_slice(&crc);
    let err = open_bytes(&forged, IndexBackend::Hnsw).expect_err("forged");
    assert!(
        err.to_string().contains(&format!(
            "corrupt at offset {first_live}: slot {} holds id 1000000, which the index does not",
            (first_live - slot0) / 8
        )),
        "{err}"
    );
}

#[test]
fn a_file_without_a_graph_gets_one_built_with_progress() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("plain.topkidx");
    let rows = uniform(3000, 4, 3);
    Index::from_rows(rows.view(), Metric::Dot, IndexBackend::Cpu)
        .expect("index")
        .save(&path)
        .expect("save");
    assert!(!Index::file_info(&path).expect("info").graph);
    let seen = Arc::new(AtomicUsize::new(0));
    let hook = {
        let seen = Arc::clone(&seen);
        ProgressHook::new(move |rows| {
            seen.fetch_max(rows, Ordering::Relaxed);
        })
    };
    let opts = IndexOptions::default().hnsw(params(4)).progress(hook);
    let ix = Index::open_with_options(&path, IndexBackend::Hnsw, &opts).expect("open");
    assert!(ix.has_graph());
    assert_eq!(seen.load(Ordering::Relaxed), 3000);
    let bad = IndexOptions::default().hnsw(HnswParams { m: 1, ..params(4) });
    let err = Index::open_with_options(&path, IndexBackend::Hnsw, &bad).expect_err("m = 1");
    assert!(err.to_string().contains("hnsw backend"), "{err}");
    let err = Index::with_options(4, Metric::Dot, IndexBackend::Hnsw, &bad).expect_err("m = 1");
    assert!(err.to_string().contains("m"), "{err}");
    let err = Index::with_options(
        4,
        Metric::Dot,
        IndexBackend::Hnsw,
        &IndexOptions::default().filter_walk_cost(-1.0),
    )
    .expect_err("c < 0");
    assert!(err.to_string().contains("filter_walk_cost"), "{err}");
    // On an exact backend too: a later switch to hnsw would use them.
    for backend in [IndexBackend::Cpu, IndexBackend::Oracle] {
        let err = Index::with_options(4, Metric::Dot, backend, &bad).expect_err("m = 1");
        assert!(err.to_string().contains("hnsw backend"), "{err}");
        let err = Index::open_with_options(&path, backend, &bad).expect_err("m = 1");
        assert!(err.to_string().contains("hnsw backend"), "{err}");
        let nan = IndexOptions::default().filter_walk_cost(f64::NAN);
        let err = Index::with_options(4, Metric::Dot, backend, &nan).expect_err("NaN");
        assert!(err.to_string().contains("filter_walk_cost"), "{err}");
    }
}

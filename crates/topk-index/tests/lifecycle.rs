//! Random histories of mutations, saves and searches: every search of the
//! index that lived through the history equals, bit for bit, the search of an
//! oracle index built from scratch on the content at that moment
//! (docs/CONTRACTS.md §10: a result depends only on the (id, vector) pairs).
//! Indexes storing f16 or bf16 rows live through the same histories and
//! equal an f32 oracle rebuilt over the rounded rows (§14).

use std::collections::BTreeMap;

use ndarray::ArrayView2;
use proptest::prelude::*;
use topk_core::{Dtype, Hit, Metric, MAX_ID};
use topk_index::{Filter, FilterResolution, FilterSpec, Index, IndexBackend, IndexOptions};
use topk_testkit::corpora::{self, Kind, Rng};
use topk_testkit::hits::{rows_of, same_hits as same};

/// One step of a history.
#[derive(Debug, Clone)]
enum Op {
    /// Add this many fresh ids.
    Add(usize),
    /// Add with ids following the largest.
    AddAuto(usize),
    /// Upsert this many ids, about half of them present.
    Upsert(usize),
    /// Remove this many ids, about half of them present.
    Remove(usize),
    /// Compact now.
    Compact,
    /// Save, then reopen on the given backend.
    SaveOpen(bool),
    /// Try to add an id already present (must fail and change nothing).
    AddExisting,
    /// Search with filter shape `0..6` and this K.
    Search(u8, usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (1usize..12).prop_map(Op::Add),
        1 => (1usize..4).prop_map(Op::AddAuto),
        2 => (1usize..8).prop_map(Op::Upsert),
        2 => (1usize..10).prop_map(Op::Remove),
        1 => Just(Op::Compact),
        1 => any::<bool>().prop_map(Op::SaveOpen),
        1 => Just(Op::AddExisting),
        5 => (0u8..6, 1usize..40).prop_map(|(f, k)| Op::Search(f, k)),
    ]
}

/// Ids drawn from a shuffled pool spanning small values and the top of the
/// id range, so the tiebreak compares ids of every magnitude.
fn id_pool(rng: &mut Rng) -> Vec<u64> {
    let mut pool: Vec<u64> = (0..48u64)
        .chain((0..16).map(|i| MAX_ID - 3 * i))
        .chain((0..16).map(|i| (1 << 40) + 7 * i))
        .collect();
    shuffle(&mut pool, rng);
    pool
}

/// Shuffles `ids` in place (Fisher–Yates) with `rng`.
fn shuffle(ids: &mut [u64], rng: &mut Rng) {
    for i in (1..ids.len()).rev() {
        ids.swap(i, rng.below(i + 1));
    }
}

/// The oracle rebuilt from scratch on the model's content.
fn rebuilt(model: &BTreeMap<u64, Vec<f32>>, d: usize, metric: Metric) -> Index {
    let ids: Vec<u64> = model.keys().copied().collect();
    let vs: Vec<Vec<f32>> = model.values().cloned().collect();
    let rows = rows_of(&vs, d);
    Index::with_ids(&ids, rows.view(), metric, IndexBackend::Oracle)
        .expect("model content is valid")
}

/// A filter of shape `shape` over the model's ids: 0 empty, 1 every id,
/// 2 sparse (about 5 %), 3 dense (about 60 %), 4 only absent ids, 5 a mix of
/// present and absent ids.
fn filter(shape: u8, model: &BTreeMap<u64, Vec<f32>>, pool: &[u64], rng: &mut Rng) -> Filter {
    let present: Vec<u64> = model.keys().copied().collect();
    let absent = pool.iter().copied().filter(|id| !model.contains_key(id));
    match shape {
        0 => Filter::default(),
        1 => Filter::new(present),
        2 => Filter::new(present.into_iter().filter(|_| rng.below(20) == 0)),
        3 => Filter::new(present.into_iter().filter(|_| rng.below(5) < 3)),
        4 => Filter::new(absent.chain([MAX_ID + 1, u64::MAX])),
        _ => Filter::new(
            present
                .into_iter()
                .filter(|_| rng.below(3) == 0)
                .chain(absent.take(5)),
        ),
    }
}

/// Runs `ops` on an index of backend `subject` (named `cpu` below, the
/// default subject) and an oracle index, checking every search against an
/// oracle rebuilt from scratch.
fn run_history(
    subject: IndexBackend,
    dtype: Dtype,
    seed: u64,
    d: usize,
    metric: Metric,
    kinds: &[Kind],
    ops: &[Op],
) -> Result<(), String> {
    let mut rng = Rng::new(seed);
    let pool = id_pool(&mut rng);
    let mut model: BTreeMap<u64, Vec<f32>> = BTreeMap::new();
    let mut earlier: Vec<f32> = Vec::new();
    let options = IndexOptions::default().dtype(dtype);
    let mut cpu = Index::with_options(d, metric, subject, &options).map_err(|e| e.to_string())?;
    let mut oracle = Index::with_options(d, metric, IndexBackend::Oracle, &options)
        .map_err(|e| e.to_string())?;
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let fresh = |rng: &mut Rng, earlier: &mut Vec<f32>| {
        let v = corpora::vector_of(rng, kinds, d, earlier);
        earlier.extend_from_slice(&v);
        v
    };
    // What the model holds for a given row: the values as stored.
    let stored = |vs: &[Vec<f32>]| -> Vec<Vec<f32>> {
        vs.iter()
            .map(|v| v.iter().map(|&x| dtype.round(x)).collect())
            .collect()
    };
    for (step, op) in ops.iter().enumerate() {
        let both = |f: &mut dyn FnMut(&mut Index) -> Result<(), String>,
                    cpu: &mut Index,
                    oracle: &mut Index| {
            f(cpu)?;
            f(oracle)
        };
        match *op {
            Op::Add(n) => {
                let ids: Vec<u64> = pool
                    .iter()
                    .copied()
                    .filter(|id| !model.contains_key(id))
                    .take(n)
                    .collect();
                let vs: Vec<Vec<f32>> = ids.iter().map(|_| fresh(&mut rng, &mut earlier)).collect();
                let rows = rows_of(&vs, d);
                both(
                    &mut |ix| ix.add(&ids, rows.view()).map_err(|e| e.to_string()),
                    &mut cpu,
                    &mut oracle,
                )?;
                model.extend(ids.into_iter().zip(stored(&vs)));
            }
            Op::AddAuto(n) => {
                let vs: Vec<Vec<f32>> = (0..n).map(|_| fresh(&mut rng, &mut earlier)).collect();
                let rows = rows_of(&vs, d);
                let first = model.keys().next_back().map_or(0, |&m| m + 1);
                if first.saturating_add(n as u64 - 1) > MAX_ID {
                    let err = cpu
                        .add_auto(rows.view())
                        .map(|_| ())
                        .map_err(|e| e.to_string());
                    if err.is_ok() {
                        return Err(format!("step {step}: add_auto past MAX_ID succeeded"));
                    }
                    continue;
                }
                let a = cpu.add_auto(rows.view()).map_err(|e| e.to_string())?;
                let b = oracle.add_auto(rows.view()).map_err(|e| e.to_string())?;
                if a != first || b != first {
                    return Err(format!(
                        "step {step}: add_auto began at {a} / {b}, expected {first}"
                    ));
                }
                model.extend((first..).zip(stored(&vs)));
            }
            Op::Upsert(n) => {
                let mut ids: Vec<u64> = Vec::new();
                while ids.len() < n {
                    let id = pool[rng.below(pool.len())];
                    if !ids.contains(&id) {
                        ids.push(id);
                    }
                }
                let vs: Vec<Vec<f32>> = ids.iter().map(|_| fresh(&mut rng, &mut earlier)).collect();
                let rows = rows_of(&vs, d);
                both(
                    &mut |ix| ix.upsert(&ids, rows.view()).map_err(|e| e.to_string()),
                    &mut cpu,
                    &mut oracle,
                )?;
                model.extend(ids.into_iter().zip(stored(&vs)));
            }
            Op::Remove(n) => {
                let ids: Vec<u64> = (0..n).map(|_| pool[rng.below(pool.len())]).collect();
                let mut want = 0;
                for id in &ids {
                    if model.remove(id).is_some() {
                        want += 1;
                    }
                }
                let (a, b) = (cpu.remove(&ids), oracle.remove(&ids));
                if a != want || b != want {
                    return Err(format!(
                        "step {step}: remove returned {a} / {b}, expected {want}"
                    ));
                }
            }
            Op::Compact => {
                cpu.compact();
                if cpu.tombstones() != 0 {
                    return Err(format!("step {step}: tombstones left after compact"));
                }
            }
            Op::SaveOpen(to_oracle) => {
                let path = dir.path().join(format!("step{step}.topkidx"));
                cpu.save(&path).map_err(|e| e.to_string())?;
                let backend = if to_oracle {
                    IndexBackend::Oracle
                } else {
                    subject
                };
                let back = Index::open(&path, backend).map_err(|e| e.to_string())?;
                if back.dtype() != dtype {
                    return Err(format!(
                        "step {step}: reopened as {}, saved as {dtype}",
                        back.dtype()
                    ));
                }
                let q = fresh(&mut rng, &mut earlier);
                let before = cpu.search(&q, 7, None).map_err(|e| e.to_string())?;
                same(
                    &back.search(&q, 7, None).map_err(|e| e.to_string())?,
                    &before,
                )
                .map_err(|e| format!("step {step}: reopened on {backend}: {e}"))?;
                // The reopened index answers for the cpu one from now on, on its backend.
                cpu = back.with_backend(subject);
            }
            Op::AddExisting => {
                if let Some(&id) = model.keys().next() {
                    let v = fresh(&mut rng, &mut earlier);
                    let other = pool.iter().copied().find(|p| !model.contains_key(p));
                    let ids: Vec<u64> = other.into_iter().chain([id]).collect();
                    let vs = vec![v; ids.len()];
                    let rows = rows_of(&vs, d);
                    match cpu.add(&ids, rows.view()) {
                        Err(topk_index::IndexError::IdExists { id: got, .. }) if got == id => {}
                        other => {
                            return Err(format!("step {step}: add of present id {id}: {other:?}"))
                        }
                    }
                }
            }
            Op::Search(shape, k) => {
                let truth = rebuilt(&model, d, metric);
                let corpus: Vec<f32> = model.values().flatten().copied().collect();
                let qs = corpora::queries(rng.next_u64(), 3, d, kinds, &corpus);
                let qv = ArrayView2::from_shape((3, d), &qs).map_err(|e| e.to_string())?;
                let filters: Vec<Filter> = (0..3)
                    .map(|_| filter(shape, &model, &pool, &mut rng))
                    .collect();
                let f0 = Some(&filters[0]);
                for (i, q) in qs.chunks_exact(d).enumerate() {
                    let want = truth.search(q, k, f0).map_err(|e| e.to_string())?;
                    let ctx = |who: &str, e: String| {
                        format!("step {step} query {i} {who} filter {shape} k {k}: {e}")
                    };
                    same(&cpu.search(q, k, f0).map_err(|e| e.to_string())?, &want)
                        .map_err(|e| ctx("cpu", e))?;
                    same(&oracle.search(q, k, f0).map_err(|e| e.to_string())?, &want)
                        .map_err(|e| ctx("oracle", e))?;
                    let unfiltered = truth.search(q, k, None).map_err(|e| e.to_string())?;
                    same(
                        &cpu.search(q, k, None).map_err(|e| e.to_string())?,
                        &unfiltered,
                    )
                    .map_err(|e| ctx("cpu unfiltered", e))?;
                }
                let batch = cpu
                    .search_batch(qv, k, FilterSpec::PerQuery(&filters))
                    .map_err(|e| e.to_string())?;
                let shared = cpu
                    .search_batch(qv, k, FilterSpec::Shared(&filters[0]))
                    .map_err(|e| e.to_string())?;
                for (i, q) in qs.chunks_exact(d).enumerate() {
                    let want = truth
                        .search(q, k, Some(&filters[i]))
                        .map_err(|e| e.to_string())?;
                    same(&batch[i], &want)
                        .map_err(|e| format!("step {step} batch query {i}: {e}"))?;
                    let want = truth
                        .search(q, k, Some(&filters[0]))
                        .map_err(|e| e.to_string())?;
                    same(&shared[i], &want)
                        .map_err(|e| format!("step {step} shared batch query {i}: {e}"))?;
                }
            }
        }
        if cpu.len() != model.len() || oracle.len() != model.len() {
            return Err(format!(
                "step {step}: len {} / {}, expected {}",
                cpu.len(),
                oracle.len(),
                model.len()
            ));
        }
    }
    Ok(())
}

fn metric() -> impl Strategy<Value = Metric> {
    prop_oneof![Just(Metric::Dot), Just(Metric::Cosine), Just(Metric::L2)]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Tie-rich rows (small integers, duplicates, constants, zeros) under
    /// shuffled ids: equal scores are everywhere, so the id tiebreak decides.
    #[test]
    fn histories_match_an_oracle_rebuilt_from_scratch(
        seed in any::<u64>(),
        d in prop_oneof![1usize..6, Just(33usize)],
        metric in metric(),
        mask in any::<u8>(),
        ops in prop::collection::vec(op(), 1..32),
    ) {
        // Tie-rich kinds always present; the rest of the palette by the mask.
        let mut kinds = corpora::palette(mask & 0x7f);
        kinds.extend([Kind::SmallInt, Kind::Duplicate, Kind::Constant]);
        if let Err(e) = run_history(IndexBackend::Cpu, Dtype::F32, seed, d, metric, &kinds, &ops) {
            return Err(TestCaseError::fail(format!("seed {seed}: {e}")));
        }
    }

    /// The same histories over rows stored as f16 or bf16 (every kind but
    /// the huge values, which f16 cannot hold): the model keeps the rounded
    /// rows, and the f32 oracle over them is the truth.
    #[test]
    fn half_width_histories_match_an_oracle_over_rounded_rows(
        seed in any::<u64>(),
        d in prop_oneof![1usize..6, Just(33usize)],
        metric in metric(),
        bf16 in any::<bool>(),
        mask in any::<u8>(),
        ops in prop::collection::vec(op(), 1..24),
    ) {
        let dtype = if bf16 { Dtype::Bf16 } else { Dtype::F16 };
        let mut kinds = corpora::palette(mask & 0x3f);
        kinds.extend([Kind::SmallInt, Kind::Duplicate, Kind::Uniform]);
        if let Err(e) = run_history(IndexBackend::Cpu, dtype, seed, d, metric, &kinds, &ops) {
            return Err(TestCaseError::fail(format!("{dtype} seed {seed}: {e}")));
        }
    }
}

/// Large enough for the parallel scans, the block skipping of dense masks
/// and both sides of the sparse threshold.
#[test]
fn large_index_agrees_with_the_oracle_under_every_filter_shape() {
    let (n, d) = (20_000usize, 16usize);
    let data = corpora::shuffled_duplicates(7, n, d, 300);
    let rows = ArrayView2::from_shape((n, d), &data).expect("shape");
    let mut rng = Rng::new(11);
    let mut ids: Vec<u64> = (0..n as u64).map(|i| i * 3 + 1).collect();
    shuffle(&mut ids, &mut rng);
    for metric in Metric::ALL {
        let mut cpu = Index::with_ids(&ids, rows, metric, IndexBackend::Cpu).expect("valid");
        // Tombstones at a fifth of the rows stay below the compaction point.
        let gone: Vec<u64> = ids.iter().copied().step_by(5).collect();
        assert_eq!(cpu.remove(&gone), gone.len());
        assert!(cpu.tombstones() > 0);
        let oracle = rebuilt_from(&cpu, metric);
        let qs = corpora::queries(5, 4, d, &[Kind::SmallInt], &data);
        for fraction in [0usize, 1, 5, 10, 24, 26, 30, 60, 100] {
            let f = Filter::new(ids.iter().copied().filter(|_| rng.below(100) < fraction));
            for q in qs.chunks_exact(d) {
                for k in [1, 10, 257] {
                    let want = oracle.search(q, k, Some(&f)).expect("search");
                    let got = cpu.search(q, k, Some(&f)).expect("search");
                    same(&got, &want)
                        .unwrap_or_else(|e| panic!("{metric} {fraction} % k {k}: {e}"));
                }
            }
        }
        let q = &qs[..d];
        same(
            &cpu.search(q, 50, None).expect("search"),
            &oracle.search(q, 50, None).expect("search"),
        )
        .unwrap_or_else(|e| panic!("{metric} unfiltered: {e}"));
    }
}

fn rebuilt_from(index: &Index, metric: Metric) -> Index {
    let ids = index.ids();
    let flat: Vec<f32> = ids
        .iter()
        .flat_map(|&id| index.get(id).map(|r| r.to_vec()).unwrap_or_default())
        .collect();
    let rows = ArrayView2::from_shape((ids.len(), index.dim()), &flat).expect("shape");
    Index::with_ids(&ids, rows, metric, IndexBackend::Oracle).expect("valid")
}

#[test]
fn empty_index_and_empty_filter_give_empty_results() {
    let mut ix = Index::new(3, Metric::Dot, IndexBackend::Cpu).expect("index");
    assert!(ix
        .search(&[1.0, 2.0, 3.0], 5, None)
        .expect("search")
        .is_empty());
    ix.add(
        &[4],
        ArrayView2::from_shape((1, 3), &[1.0, 0.0, 0.0]).expect("shape"),
    )
    .expect("add");
    assert!(ix
        .search(&[1.0, 2.0, 3.0], 5, Some(&Filter::default()))
        .expect("search")
        .is_empty());
    assert_eq!(
        ix.search(&[1.0, 2.0, 3.0], 5, None).expect("search"),
        vec![Hit::new(4, 1.0)]
    );
}

#[test]
fn automatic_compaction_past_a_quarter_of_tombstones() {
    let data: Vec<f32> = (0..40).map(|v| v as f32).collect();
    let rows = ArrayView2::from_shape((20, 2), &data).expect("shape");
    let mut ix = Index::from_rows(rows, Metric::L2, IndexBackend::Cpu).expect("index");
    assert_eq!(ix.remove(&[0, 1, 2, 3]), 4);
    assert_eq!(ix.tombstones(), 4);
    assert_eq!(ix.remove(&[4, 100]), 1);
    assert_eq!(ix.tombstones(), 0, "5 of 20 rows reach 25 %");
    assert_eq!(ix.len(), 15);
    assert_eq!(
        ix.search(&[0.0, 0.0], 1, None).expect("search"),
        vec![Hit::new(5, -(100.0 + 121.0))]
    );
}

/// Filters allowing every live id, or all but a few, after removals, upserts
/// and small appends (rows not yet in the id-sorted order), agree with the
/// oracle under every way of resolving a filter.
#[test]
fn all_and_near_all_filters_after_removals_and_upserts() {
    let (n, d) = (6_000usize, 8usize);
    let data = corpora::shuffled_duplicates(3, n, d, 200);
    let rows = ArrayView2::from_shape((n, d), &data).expect("shape");
    let mut rng = Rng::new(5);
    let mut ids: Vec<u64> = (0..n as u64).map(|i| i * 2 + 7).collect();
    shuffle(&mut ids, &mut rng);
    let metric = Metric::Dot;
    let mut cpu = Index::with_ids(&ids, rows, metric, IndexBackend::Cpu).expect("valid");
    let qs = corpora::queries(9, 2, d, &[Kind::SmallInt], &data);
    let check = |cpu: &Index, stage: &str| {
        let oracle = rebuilt_from(cpu, metric);
        let live = cpu.ids();
        let removed: Vec<u64> = ids
            .iter()
            .copied()
            .filter(|&id| !cpu.contains(id))
            .collect();
        let filters = [
            ("all", Filter::new(live.iter().copied())),
            (
                "all but every 97th",
                Filter::new(
                    live.iter()
                        .copied()
                        .enumerate()
                        .filter(|(i, _)| i % 97 != 0)
                        .map(|(_, id)| id),
                ),
            ),
            (
                "all with removed and absent ids",
                Filter::new(
                    live.iter()
                        .copied()
                        .chain(removed)
                        .chain([0, 1, MAX_ID, u64::MAX]),
                ),
            ),
        ];
        for (name, f) in &filters {
            for resolution in [
                FilterResolution::Auto,
                FilterResolution::Lookup,
                FilterResolution::Merge,
            ] {
                let ix = cpu.clone().with_filter_resolution(resolution);
                for q in qs.chunks_exact(d) {
                    for k in [1, 100] {
                        let want = oracle.search(q, k, Some(f)).expect("search");
                        let got = ix.search(q, k, Some(f)).expect("search");
                        same(&got, &want).unwrap_or_else(|e| {
                            panic!("{stage}, {name}, {resolution:?}, k {k}: {e}")
                        });
                    }
                }
            }
        }
    };
    check(&cpu, "fresh");
    let gone: Vec<u64> = ids.iter().copied().step_by(7).collect();
    assert_eq!(cpu.remove(&gone), gone.len());
    check(&cpu, "after removals");
    // Upserts of present ids tombstone their old rows and append new ones.
    let up: Vec<u64> = ids.iter().copied().skip(1).step_by(11).take(40).collect();
    let up_rows: Vec<f32> = (0..up.len() * d).map(|v| (v % 13) as f32 - 6.0).collect();
    cpu.upsert(
        &up,
        ArrayView2::from_shape((up.len(), d), &up_rows).expect("shape"),
    )
    .expect("upsert");
    // Re-adding removed ids appends rows whose ids also sit, dead, in the sorted order.
    let back: Vec<u64> = gone
        .iter()
        .copied()
        .filter(|&id| !cpu.contains(id))
        .take(30)
        .collect();
    let back_rows: Vec<f32> = (0..back.len() * d).map(|v| (v % 7) as f32 - 3.0).collect();
    cpu.add(
        &back,
        ArrayView2::from_shape((back.len(), d), &back_rows).expect("shape"),
    )
    .expect("add");
    assert!(cpu.tombstones() > 0);
    check(&cpu, "after upserts");
    cpu.compact();
    check(&cpu, "after compaction");
}

/// The `cuda` backend through the same histories: every search bit for bit
/// the oracle's, saves reopened on the device, clones and backend switches
/// uploading their own mirror. Runs where the build has the `cuda` feature
/// and the engine's plugin finds a device; elsewhere it prints why and
/// passes, unless `TOPK_REQUIRE_GPU=1`.
#[cfg(feature = "cuda")]
mod cuda {
    use super::*;
    use topk_testkit::or_skip;

    fn device() -> Option<()> {
        or_skip(topk_cuda_loader::available().map(|_| ()))
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

        #[test]
        fn histories_match_an_oracle_rebuilt_from_scratch_on_the_gpu(
            seed in any::<u64>(),
            d in prop_oneof![1usize..6, Just(33usize)],
            metric in metric(),
            mask in any::<u8>(),
            ops in prop::collection::vec(op(), 1..32),
        ) {
            let Some(()) = device() else { return Ok(()) };
            let mut kinds = corpora::palette(mask & 0x7f);
            kinds.extend([Kind::SmallInt, Kind::Duplicate, Kind::Constant]);
            if let Err(e) = run_history(IndexBackend::Cuda, Dtype::F32, seed, d, metric, &kinds, &ops) {
                return Err(TestCaseError::fail(format!("seed {seed}: {e}")));
            }
        }

        /// A half-width index on the device: its mirror stores the rows as
        /// the index does (16 bits a value), so it answers like the host
        /// over rounded rows.
        #[test]
        fn half_width_histories_on_the_gpu(
            seed in any::<u64>(),
            d in prop_oneof![1usize..6, Just(33usize)],
            metric in metric(),
            bf16 in any::<bool>(),
            ops in prop::collection::vec(op(), 1..24),
        ) {
            let Some(()) = device() else { return Ok(()) };
            let dtype = if bf16 { Dtype::Bf16 } else { Dtype::F16 };
            let kinds = [Kind::Uniform, Kind::SmallInt, Kind::Duplicate, Kind::Subnormal];
            if let Err(e) = run_history(IndexBackend::Cuda, dtype, seed, d, metric, &kinds, &ops) {
                return Err(TestCaseError::fail(format!("{dtype} seed {seed}: {e}")));
            }
        }
    }

    /// Both filter paths of the device (row lists and bitsets), removals,
    /// re-adds below the largest id, growth and compaction at a size where
    /// the device selection runs its grid-wide passes.
    #[test]
    fn large_index_agrees_with_the_oracle_on_the_gpu() {
        let Some(()) = device() else { return };
        let (n, d) = (20_000usize, 16usize);
        let data = corpora::shuffled_duplicates(7, n, d, 300);
        let rows = ArrayView2::from_shape((n, d), &data).expect("shape");
        let mut rng = Rng::new(11);
        let mut ids: Vec<u64> = (0..n as u64).map(|i| i * 3 + 1).collect();
        shuffle(&mut ids, &mut rng);
        let qs = corpora::queries(5, 4, d, &[Kind::SmallInt], &data);
        let qv = ArrayView2::from_shape((4, d), &qs).expect("shape");
        for metric in Metric::ALL {
            let options = topk_index::IndexOptions::default().capacity(1000);
            let mut gpu =
                Index::with_options(d, metric, IndexBackend::Cuda, &options).expect("gpu");
            gpu.add(&ids, rows).expect("add");
            let gone: Vec<u64> = ids.iter().copied().step_by(5).collect();
            assert_eq!(gpu.remove(&gone), gone.len());
            let back: Vec<u64> = gone.iter().copied().step_by(3).collect();
            let back_rows: Vec<f32> = (0..back.len() * d).map(|v| (v % 5) as f32 - 2.0).collect();
            gpu.add(
                &back,
                ArrayView2::from_shape((back.len(), d), &back_rows).expect("shape"),
            )
            .expect("re-add");
            for stage in ["mutated", "compacted"] {
                let oracle = rebuilt_from(&gpu, metric);
                for fraction in [0usize, 1, 10, 24, 26, 60, 100] {
                    let f = Filter::new(ids.iter().copied().filter(|_| rng.below(100) < fraction));
                    for k in [1, 10, 257] {
                        let got = gpu
                            .search_batch(qv, k, FilterSpec::Shared(&f))
                            .expect("search");
                        for (q, got) in qs.chunks_exact(d).zip(&got) {
                            let want = oracle.search(q, k, Some(&f)).expect("search");
                            same(got, &want).unwrap_or_else(|e| {
                                panic!("{stage} {metric} {fraction} % k {k}: {e}")
                            });
                        }
                    }
                }
                let got = gpu.search_batch(qv, 50, FilterSpec::None).expect("search");
                for (q, got) in qs.chunks_exact(d).zip(&got) {
                    same(got, &oracle.search(q, 50, None).expect("search"))
                        .unwrap_or_else(|e| panic!("{stage} {metric} unfiltered: {e}"));
                }
                gpu.compact();
            }
        }
    }

    /// A `cuda` index checks a batch's values on the device; a batch at
    /// fault gets the error the oracle index gives (the first query at
    /// fault, its column and value, before K and the filter count), and the
    /// next batch is exact.
    #[test]
    fn bad_batches_get_the_host_error_on_the_gpu() {
        let Some(()) = device() else { return };
        let (n, d, nq) = (3_000usize, 24usize, 300usize);
        let data = corpora::shuffled_duplicates(3, n, d, 40);
        let rows = ArrayView2::from_shape((n, d), &data).expect("shape");
        let ids: Vec<u64> = (0..n as u64).map(|i| i * 2 + 5).collect();
        let mut gpu = Index::new(d, Metric::Cosine, IndexBackend::Cuda).expect("gpu");
        let mut oracle = Index::new(d, Metric::Cosine, IndexBackend::Oracle).expect("oracle");
        gpu.add(&ids, rows).expect("add");
        oracle.add(&ids, rows).expect("add");
        let qs = corpora::queries(9, nq, d, &[Kind::Uniform, Kind::SmallInt], &data);
        let mut nan = qs.clone();
        nan[211 * d + 7] = f32::NAN;
        let mut big = qs.clone();
        big[40 * d..41 * d].fill(1e16);
        let mut both = big.clone();
        both[250 * d + 1] = f32::INFINITY;
        let shared = Filter::new(ids.iter().copied().step_by(2));
        let per: Vec<Filter> = vec![Filter::default(); nq - 1];
        for (what, values) in [("nan", &nan), ("norm", &big), ("both", &both)] {
            let view = ArrayView2::from_shape((nq, d), values).expect("shape");
            for (k, filter) in [
                (10, FilterSpec::None),
                (10, FilterSpec::Shared(&shared)),
                (0, FilterSpec::None),
                (10, FilterSpec::PerQuery(&per)),
            ] {
                let want = oracle.search_batch(view, k, filter).expect_err(what);
                let got = gpu.search_batch(view, k, filter).expect_err(what);
                assert_eq!(got.to_string(), want.to_string(), "{what} k {k}");
                assert!(
                    matches!(got, topk_index::IndexError::Input(_)),
                    "{what}: {got}"
                );
            }
        }
        let view = ArrayView2::from_shape((nq, d), &qs).expect("shape");
        let got = gpu
            .search_batch(view, 10, FilterSpec::None)
            .expect("search");
        let want = oracle
            .search_batch(view, 10, FilterSpec::None)
            .expect("search");
        for (q, (g, w)) in got.iter().zip(&want).enumerate() {
            same(g, w).unwrap_or_else(|e| panic!("query {q} after the errors: {e}"));
        }
    }
}

//! Random histories on a sharded index and on one index over the same
//! content: every search of the set equals, bit for bit, the one index's
//! (docs/CONTRACTS.md §12), whatever the shard count, the shards' backends
//! and the history; failed calls change nothing on any shard.

use ndarray::ArrayView2;
use proptest::prelude::*;
use topk_core::{Dtype, Metric, MAX_ID};
use topk_index::{Filter, FilterSpec, Index, IndexBackend, IndexError, IndexOptions};
use topk_shard::{
    next_generation, shard_of, Manifest, SaveLock, ShardError, ShardSpec, ShardedIndex,
};
use topk_testkit::corpora::{self, Kind, Rng};
use topk_testkit::hits::{rows_of as rows, same_hits as same};

#[derive(Debug, Clone)]
enum Op {
    Add(usize),
    AddAuto(usize),
    Upsert(usize),
    Remove(usize),
    Compact,
    SaveOpen,
    /// An add that must fail (present id, repeated id or NaN at a position).
    BadAdd(u8),
    /// Search: filter shape, K, batch size (1 = single query).
    Search(u8, usize, usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (1usize..14).prop_map(Op::Add),
        1 => (1usize..4).prop_map(Op::AddAuto),
        2 => (1usize..8).prop_map(Op::Upsert),
        2 => (1usize..10).prop_map(Op::Remove),
        1 => Just(Op::Compact),
        1 => Just(Op::SaveOpen),
        1 => (0u8..3).prop_map(Op::BadAdd),
        5 => (0u8..5, 1usize..30, prop_oneof![Just(1usize), 2usize..5]).prop_map(|(f, k, q)| Op::Search(f, k, q)),
    ]
}

fn metric() -> impl Strategy<Value = Metric> {
    prop_oneof![Just(Metric::Dot), Just(Metric::Cosine), Just(Metric::L2)]
}

/// Small ids, ids at the top of the range and a strided block, shuffled.
fn id_pool(rng: &mut Rng) -> Vec<u64> {
    let mut pool: Vec<u64> = (0..40u64)
        .chain((0..16).map(|i| MAX_ID - 5 * i))
        .chain((0..16).map(|i| (1 << 33) + 64 * i))
        .collect();
    for i in (1..pool.len()).rev() {
        pool.swap(i, rng.below(i + 1));
    }
    pool
}

fn filter(shape: u8, live: &[u64], pool: &[u64], rng: &mut Rng) -> Filter {
    match shape {
        0 => Filter::default(),
        1 => Filter::new(live.iter().copied()),
        2 => Filter::new(live.iter().copied().filter(|_| rng.below(8) == 0)),
        3 => Filter::new(live.iter().copied().filter(|_| rng.below(5) < 3)),
        _ => Filter::new(
            pool.iter()
                .copied()
                .filter(|_| rng.below(3) == 0)
                .chain([MAX_ID + 1]),
        ),
    }
}

/// Runs `ops` on a set of shards built by `specs` and on one `cpu` index.
fn run_history(
    specs: &[ShardSpec],
    seed: u64,
    d: usize,
    metric: Metric,
    kinds: &[Kind],
    ops: &[Op],
) -> Result<(), String> {
    let e = |e: ShardError| e.to_string();
    let mut rng = Rng::new(seed);
    let pool = id_pool(&mut rng);
    let mut set = ShardedIndex::new(d, metric, specs).map_err(e)?;
    let mut one = Index::new(d, metric, IndexBackend::Cpu).map_err(|e| e.to_string())?;
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let mut earlier: Vec<f32> = Vec::new();
    let mut fresh = |rng: &mut Rng| {
        let v = corpora::vector_of(rng, kinds, d, &earlier);
        earlier.extend_from_slice(&v);
        v
    };
    for (step, op) in ops.iter().enumerate() {
        let ctx = |m: String| format!("step {step} {op:?}: {m}");
        match *op {
            Op::Add(n) => {
                let ids: Vec<u64> = pool
                    .iter()
                    .copied()
                    .filter(|&id| !one.contains(id))
                    .take(n)
                    .collect();
                let vs: Vec<Vec<f32>> = ids.iter().map(|_| fresh(&mut rng)).collect();
                let r = rows(&vs, d);
                one.add(&ids, r.view()).map_err(|e| ctx(e.to_string()))?;
                set.add(&ids, r.view()).map_err(|e| ctx(e.to_string()))?;
            }
            Op::AddAuto(n) => {
                let vs: Vec<Vec<f32>> = (0..n).map(|_| fresh(&mut rng)).collect();
                let r = rows(&vs, d);
                match (one.add_auto(r.view()), set.add_auto(r.view())) {
                    (Ok(a), Ok(b)) if a == b => {}
                    (Err(_), Err(ShardError::Index(IndexError::IdsExhausted { .. }))) => {}
                    (a, b) => return Err(ctx(format!("one index {a:?}, set {b:?}"))),
                }
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
                let r = rows(&vs, d);
                one.upsert(&ids, r.view()).map_err(|e| ctx(e.to_string()))?;
                set.upsert(&ids, r.view()).map_err(|e| ctx(e.to_string()))?;
            }
            Op::Remove(n) => {
                let ids: Vec<u64> = (0..n)
                    .map(|_| pool[rng.below(pool.len())])
                    .chain([u64::MAX])
                    .collect();
                let (a, b) = (one.remove(&ids), set.remove(&ids));
                if a != b {
                    return Err(ctx(format!("removed {b}, one index removed {a}")));
                }
            }
            Op::Compact => set.compact(),
            Op::SaveOpen => {
                let path = dir.path().join("set");
                set.save(&path).map_err(|e| ctx(e.to_string()))?;
                let back = ShardedIndex::open(&path, |i| specs[i].clone())
                    .map_err(|e| ctx(e.to_string()))?;
                let m = Manifest::read(&path).map_err(|e| ctx(e.to_string()))?;
                let on_disk = std::fs::read_dir(&path)
                    .map_err(|e| ctx(e.to_string()))?
                    .count();
                if on_disk != m.shards.len() + 2 {
                    return Err(ctx(format!(
                        "{on_disk} files for {} shards, a manifest and the save lock",
                        m.shards.len()
                    )));
                }
                set = back;
            }
            Op::BadAdd(kind) => {
                let Some(present) = one.ids().first().copied() else {
                    continue;
                };
                let new_ids: Vec<u64> = pool
                    .iter()
                    .copied()
                    .filter(|&id| !one.contains(id))
                    .take(3)
                    .collect();
                let mut ids = new_ids.clone();
                let mut vs: Vec<Vec<f32>> = ids.iter().map(|_| fresh(&mut rng)).collect();
                match kind {
                    0 => {
                        ids.push(present);
                        vs.push(fresh(&mut rng));
                    }
                    1 => match ids.first().copied() {
                        Some(first) => {
                            ids.push(first);
                            vs.push(fresh(&mut rng));
                        }
                        None => continue,
                    },
                    _ => {
                        let mut v = fresh(&mut rng);
                        v[d - 1] = f32::NAN;
                        ids.push(new_ids.first().map_or(0, |&i| i ^ 1).min(MAX_ID));
                        vs.push(v);
                    }
                }
                let r = rows(&vs, d);
                let before = (set.len(), set.ids());
                let (a, b) = (one.add(&ids, r.view()), set.add(&ids, r.view()));
                match (&a, &b) {
                    (Err(x), Err(ShardError::Index(y))) if x.to_string() == y.to_string() => {}
                    _ => {
                        return Err(ctx(format!(
                            "one index {a:?}, set {b:?} (errors must match)"
                        )))
                    }
                }
                if (set.len(), set.ids()) != before {
                    return Err(ctx("a failed add changed the set".to_owned()));
                }
            }
            Op::Search(shape, k, nq) => {
                let live = one.ids();
                let f = filter(shape, &live, &pool, &mut rng);
                let qs: Vec<Vec<f32>> = (0..nq).map(|_| fresh(&mut rng)).collect();
                if nq == 1 {
                    let fo = (shape > 0).then_some(&f);
                    let want = one.search(&qs[0], k, fo).map_err(|e| ctx(e.to_string()))?;
                    let got = set.search(&qs[0], k, fo).map_err(|e| ctx(e.to_string()))?;
                    same(&got, &want).map_err(ctx)?;
                } else {
                    let q = rows(&qs, d);
                    let per: Vec<Filter> = (0..nq)
                        .map(|_| filter(shape, &live, &pool, &mut rng))
                        .collect();
                    for spec in [
                        FilterSpec::None,
                        FilterSpec::Shared(&f),
                        FilterSpec::PerQuery(&per),
                    ] {
                        let want = one
                            .search_batch(q.view(), k, spec)
                            .map_err(|e| ctx(e.to_string()))?;
                        let got = set
                            .search_batch(q.view(), k, spec)
                            .map_err(|e| ctx(e.to_string()))?;
                        for (g, w) in got.iter().zip(&want) {
                            same(g, w).map_err(ctx)?;
                        }
                    }
                }
            }
        }
        if set.len() != one.len() {
            return Err(ctx(format!(
                "{} rows, one index has {}",
                set.len(),
                one.len()
            )));
        }
    }
    if set.ids() != one.ids() {
        return Err("the set's ids differ from the one index's".to_owned());
    }
    for (i, shard) in set.shards().iter().enumerate() {
        if let Some(id) = shard
            .ids()
            .into_iter()
            .find(|&id| shard_of(id, specs.len()) != i)
        {
            return Err(format!("id {id} sits on shard {i}"));
        }
    }
    Ok(())
}

fn host_specs() -> impl Strategy<Value = Vec<ShardSpec>> {
    prop::collection::vec(
        prop_oneof![Just(IndexBackend::Cpu), Just(IndexBackend::Oracle)].prop_map(ShardSpec::new),
        1..6,
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn a_set_of_host_shards_returns_the_bytes_of_one_index(
        seed in any::<u64>(),
        d in prop_oneof![1usize..6, Just(33usize)],
        metric in metric(),
        mask in any::<u8>(),
        specs in host_specs(),
        ops in prop::collection::vec(op(), 1..40),
    ) {
        let mut kinds = corpora::palette(mask & 0x7f);
        kinds.extend([Kind::SmallInt, Kind::Duplicate, Kind::Constant]);
        if let Err(e) = run_history(&specs, seed, d, metric, &kinds, &ops) {
            return Err(TestCaseError::fail(format!("seed {seed}, {} shards: {e}", specs.len())));
        }
    }
}

#[test]
fn input_errors_come_before_any_shard_and_name_the_call() {
    let mut set =
        ShardedIndex::uniform(2, Metric::Dot, 3, &ShardSpec::new(IndexBackend::Cpu)).expect("set");
    let r = ndarray::array![[1.0_f32, 0.0], [0.0, 1.0], [1.0, 1.0]];
    set.add(&[1, 2, 3], r.view()).expect("add");
    let bad = |set: &mut ShardedIndex, ids: &[u64], rows: ArrayView2<'_, f32>| {
        let e = set.add(ids, rows).expect_err("must fail").to_string();
        assert_eq!(set.ids(), vec![1, 2, 3], "{e}");
        e
    };
    assert!(bad(&mut set, &[7, 8, 2], r.view()).contains("id 2"));
    assert!(bad(&mut set, &[7, 8, 7], r.view()).contains("7"));
    assert!(bad(&mut set, &[7, MAX_ID + 1, 9], r.view()).contains(&(MAX_ID + 1).to_string()));
    let wide = ndarray::array![[1.0_f32, 0.0, 2.0]];
    assert!(bad(&mut set, &[7], wide.view()).contains('3'));
    let nan = ndarray::array![[1.0_f32, 0.0], [f32::NAN, 1.0]];
    assert!(bad(&mut set, &[7, 8], nan.view()).contains("row 1"));
    assert!(set.search(&[1.0, 0.0], 0, None).is_err());
    assert!(set.search(&[1.0], 3, None).is_err());
    assert!(matches!(
        ShardedIndex::new(2, Metric::Dot, &[]),
        Err(ShardError::NoShards)
    ));
}

#[test]
fn misplaced_and_mismatched_shards_are_refused() {
    let r = ndarray::array![[1.0_f32, 0.0]];
    // With two shards, id 0 belongs to shard shard_of(0, 2).
    let home = shard_of(0, 2);
    let mut shards = vec![
        Index::new(2, Metric::Dot, IndexBackend::Cpu).expect("index"),
        Index::new(2, Metric::Dot, IndexBackend::Cpu).expect("index"),
    ];
    shards[1 - home].add(&[0], r.view()).expect("add");
    match ShardedIndex::from_shards(shards) {
        Err(ShardError::Misplaced {
            id: 0, expected, ..
        }) => assert_eq!(expected, home),
        other => panic!("{other:?}"),
    }
    let mixed = vec![
        Index::new(2, Metric::Dot, IndexBackend::Cpu).expect("index"),
        Index::new(3, Metric::Dot, IndexBackend::Cpu).expect("index"),
    ];
    assert!(matches!(
        ShardedIndex::from_shards(mixed),
        Err(ShardError::ShardMismatch {
            shard: 1,
            what: "dimension",
            ..
        })
    ));
    // Shards of one set store one type.
    let half = IndexOptions::default().dtype(Dtype::F16);
    let f16 = Index::with_options(2, Metric::Dot, IndexBackend::Cpu, &half).expect("index");
    let f32 = Index::new(2, Metric::Dot, IndexBackend::Cpu).expect("index");
    let e = ShardedIndex::from_shards(vec![f16, f32]).expect_err("mixed types");
    assert!(
        matches!(
            e,
            ShardError::ShardMismatch {
                shard: 1,
                what: "storage type",
                ..
            }
        ),
        "{e:?}"
    );
    assert!(
        e.to_string().contains("storage type f32") && e.to_string().contains("f16"),
        "{e}"
    );
    let specs = [
        ShardSpec::new(IndexBackend::Cpu).options(half.clone()),
        ShardSpec::new(IndexBackend::Oracle),
    ];
    assert!(ShardedIndex::new(2, Metric::Dot, &specs).is_err());
}

/// A set of f16 shards answers like one f16 index of the same rows, and
/// reopens as f16.
#[test]
fn half_width_shards_answer_like_one_index() {
    let (n, d) = (3000usize, 12usize);
    let data = corpora::corpus(4, n, d, &[Kind::Uniform, Kind::SmallInt]);
    let view = ArrayView2::from_shape((n, d), &data).expect("shape");
    let ids: Vec<u64> = (0..n as u64).map(|i| i * 7 + 3).collect();
    let half = IndexOptions::default().dtype(Dtype::F16);
    let mut one = Index::with_options(d, Metric::L2, IndexBackend::Cpu, &half).expect("index");
    one.add(&ids, view).expect("add");
    let spec = ShardSpec::new(IndexBackend::Cpu).options(half);
    let mut set = ShardedIndex::uniform(d, Metric::L2, 3, &spec).expect("set");
    set.add(&ids, view).expect("add");
    let dir = tempfile::tempdir().expect("tempdir");
    set.save(dir.path()).expect("save");
    let back =
        ShardedIndex::open(dir.path(), |_| ShardSpec::new(IndexBackend::Oracle)).expect("open");
    assert!(back.shards().iter().all(|s| s.dtype() == Dtype::F16));
    for q in data.chunks_exact(d).take(4) {
        let want = one.search(q, 25, None).expect("search");
        same(&set.search(q, 25, None).expect("search"), &want).expect("set");
        same(&back.search(q, 25, None).expect("search"), &want).expect("reopened");
    }
}

/// A value an f16 shard cannot store is refused before any shard changes,
/// at its position in the call, as one f16 index refuses it.
#[test]
fn half_width_rules_are_checked_for_the_whole_call_first() {
    let half = IndexOptions::default().dtype(Dtype::F16);
    let spec = ShardSpec::new(IndexBackend::Cpu).options(half.clone());
    let mut set = ShardedIndex::uniform(2, Metric::Dot, 4, &spec).expect("set");
    let mut one = Index::with_options(2, Metric::Dot, IndexBackend::Cpu, &half).expect("index");
    let rows = [1.0_f32, 0.0, 1.0, 0.0, 1.0, 0.0, 7e4, 0.0];
    let view = ArrayView2::from_shape((4, 2), &rows).expect("shape");
    let ids = [0_u64, 1, 2, 3];
    let want = one
        .add(&ids, view)
        .expect_err("7e4 is past f16")
        .to_string();
    for upsert in [false, true] {
        let e = if upsert {
            set.upsert(&ids, view)
        } else {
            set.add(&ids, view)
        }
        .expect_err("7e4 is past f16");
        assert!(matches!(e, ShardError::Index(_)), "{e:?}");
        assert_eq!(e.to_string(), want);
        assert_eq!(set.len(), 0);
        assert!(set.shards().iter().all(|s| s.tombstones() == 0));
    }
    // Zero-width rows are refused by their width, before any id is made.
    let empty: [f32; 0] = [];
    let wide = ArrayView2::from_shape((1 << 40, 0), &empty).expect("shape");
    assert!(matches!(
        set.add_auto(wide),
        Err(ShardError::Index(IndexError::DimensionMismatch {
            expected: 2,
            got: 0
        }))
    ));
    assert!(matches!(
        one.add_auto(wide),
        Err(IndexError::DimensionMismatch {
            expected: 2,
            got: 0
        })
    ));
}

/// Saves of one folder from several threads at once leave one whole set:
/// no save deletes the files of another's manifest.
#[test]
fn concurrent_saves_of_one_folder_leave_a_whole_set() {
    let dir = tempfile::tempdir().expect("dir");
    let mut set =
        ShardedIndex::uniform(4, Metric::Dot, 3, &ShardSpec::new(IndexBackend::Cpu)).expect("set");
    let data = corpora::shuffled_duplicates(5, 300, 4, 30);
    let r = ArrayView2::from_shape((300, 4), &data).expect("shape");
    set.add(&(0..300).collect::<Vec<u64>>(), r).expect("add");
    let set = &set;
    std::thread::scope(|scope| {
        for _ in 0..4 {
            scope.spawn(|| {
                for _ in 0..5 {
                    set.save(dir.path()).expect("save");
                }
            });
        }
    });
    let m = Manifest::read(dir.path()).expect("manifest");
    assert_eq!(m.generation, 20);
    let back = ShardedIndex::open(dir.path(), |_| ShardSpec::new(IndexBackend::Cpu)).expect("open");
    let q = [0.5_f32, -1.0, 2.0, 0.25];
    same(
        &back.search(&q, 20, None).expect("search"),
        &set.search(&q, 20, None).expect("search"),
    )
    .expect("reopened");
    let mut files: Vec<String> = std::fs::read_dir(dir.path())
        .expect("list")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    let mut want: Vec<String> = m.shards.iter().map(|s| s.file.clone()).collect();
    want.extend([
        topk_shard::MANIFEST_FILE.to_owned(),
        topk_shard::SAVE_LOCK.to_owned(),
    ]);
    want.sort();
    assert_eq!(
        files, want,
        "only the last generation, its manifest and the lock stay"
    );
}

#[test]
fn a_save_waits_for_another_writers_lock() {
    let dir = tempfile::tempdir().expect("dir");
    let mut set =
        ShardedIndex::uniform(4, Metric::Dot, 2, &ShardSpec::new(IndexBackend::Cpu)).expect("set");
    let data = corpora::shuffled_duplicates(9, 40, 4, 5);
    let r = ArrayView2::from_shape((40, 4), &data).expect("shape");
    set.add(&(0..40).collect::<Vec<u64>>(), r).expect("add");
    // Another writer's save: the first free generation is 1 until it ends.
    let held = SaveLock::acquire(dir.path()).expect("lock");
    assert_eq!(next_generation(dir.path()).expect("generation"), 1);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::scope(|scope| {
        let set = &set;
        let path = dir.path();
        scope.spawn(move || {
            let saved = set.save(path);
            tx.send(saved.is_ok()).expect("send");
        });
        assert!(
            rx.recv_timeout(std::time::Duration::from_millis(500))
                .is_err(),
            "the save ran while another writer held the folder's lock"
        );
        assert!(!dir.path().join(topk_shard::MANIFEST_FILE).exists());
        drop(held);
        assert!(rx
            .recv_timeout(std::time::Duration::from_secs(60))
            .expect("the save ends once the lock is free"));
    });
    assert_eq!(Manifest::read(dir.path()).expect("manifest").generation, 1);
    assert_eq!(next_generation(dir.path()).expect("generation"), 2);
}

#[test]
fn damaged_sets_are_named_and_a_failed_save_keeps_the_old_one() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("set");
    let mut set = ShardedIndex::uniform(4, Metric::Cosine, 3, &ShardSpec::new(IndexBackend::Cpu))
        .expect("set");
    let data = corpora::shuffled_duplicates(3, 200, 4, 20);
    let r = ArrayView2::from_shape((200, 4), &data).expect("shape");
    set.add(&(0..200).collect::<Vec<u64>>(), r).expect("add");
    set.save(&path).expect("save");
    let spec = |_| ShardSpec::new(IndexBackend::Cpu);
    let q = [0.5_f32, -1.0, 2.0, 0.25];
    let want = set.search(&q, 10, None).expect("search");

    // A second save replaces the first generation's files.
    let gone: Vec<u64> = want.iter().take(3).map(|h| h.id).collect();
    assert_eq!(set.remove(&gone), 3);
    set.save(&path).expect("save again");
    let m = Manifest::read(&path).expect("manifest");
    assert_eq!(m.generation, 2);
    let back = ShardedIndex::open(&path, spec).expect("open");
    assert_eq!(back.len(), 197);

    let shard0 = path.join(&m.shards[0].file);
    let bytes = std::fs::read(&shard0).expect("read");
    // Truncated shard file: named, with its shard.
    std::fs::write(&shard0, &bytes[..bytes.len() / 2]).expect("truncate");
    let err = ShardedIndex::open(&path, spec)
        .expect_err("truncated")
        .to_string();
    assert!(err.starts_with("shard 0:"), "{err}");
    std::fs::write(&shard0, &bytes).expect("restore");
    // A shard file swapped for another shard's: the row count or the placement says so.
    std::fs::copy(path.join(&m.shards[1].file), &shard0).expect("swap");
    let err = ShardedIndex::open(&path, spec)
        .expect_err("swapped")
        .to_string();
    assert!(err.contains("shard 0"), "{err}");
    std::fs::write(&shard0, &bytes).expect("restore");
    // A missing shard file.
    std::fs::remove_file(path.join(&m.shards[2].file)).expect("remove");
    let err = ShardedIndex::open(&path, spec)
        .expect_err("missing")
        .to_string();
    assert!(err.starts_with("shard 2:"), "{err}");
    // Saved whole again, and the same bytes as the set in memory.
    set.save(&path).expect("save");
    let back = ShardedIndex::open(&path, spec).expect("open");
    same(
        &back.search(&q, 10, None).expect("search"),
        &set.search(&q, 10, None).expect("search"),
    )
    .expect("reopened set");
    assert_ne!(
        want,
        set.search(&q, 10, None).expect("search"),
        "the removals changed the answer"
    );
    // A set cannot be saved over a file.
    let file = dir.path().join("plain");
    std::fs::write(&file, b"x").expect("write");
    assert!(matches!(set.save(&file), Err(ShardError::Io { .. })));
}

/// `cuda` shards sharing one device, and a mix of `cuda` and `cpu` shards,
/// through the same histories. Runs where the build has the `cuda` feature
/// and the plugin finds a device; elsewhere it prints why and passes, unless
/// `TOPK_REQUIRE_GPU=1`.
#[cfg(feature = "cuda")]
mod cuda {
    use super::*;
    use topk_testkit::or_skip;

    fn device() -> Option<()> {
        or_skip(topk_cuda_loader::available().map(|_| ()))
    }

    /// Shard `i`'s spec: `cuda` on the devices of `TOPK_SHARD_DEVICES`
    /// (comma-separated ordinals, default `0`) in turn, so that the same
    /// tests run with every shard on one GPU or spread over several.
    fn gpu_shard(i: usize) -> ShardSpec {
        let devices: Vec<usize> = std::env::var("TOPK_SHARD_DEVICES")
            .ok()
            .map(|v| v.split(',').filter_map(|d| d.trim().parse().ok()).collect())
            .filter(|d: &Vec<usize>| !d.is_empty())
            .unwrap_or_else(|| vec![0]);
        ShardSpec::cuda(devices[i % devices.len()])
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

        #[test]
        fn gpu_shards_return_the_bytes_of_one_index(
            seed in any::<u64>(),
            d in prop_oneof![1usize..6, Just(33usize)],
            metric in metric(),
            mask in any::<u8>(),
            shards in 1usize..5,
            with_cpu in any::<bool>(),
            ops in prop::collection::vec(op(), 1..32),
        ) {
            let Some(()) = device() else { return Ok(()) };
            let mut specs: Vec<ShardSpec> = (0..shards).map(gpu_shard).collect();
            if with_cpu {
                specs.push(ShardSpec::new(IndexBackend::Cpu));
            }
            let mut kinds = corpora::palette(mask & 0x7f);
            kinds.extend([Kind::SmallInt, Kind::Duplicate, Kind::Constant]);
            if let Err(e) = run_history(&specs, seed, d, metric, &kinds, &ops) {
                return Err(TestCaseError::fail(format!("seed {seed}, {} shards: {e}", specs.len())));
            }
        }
    }

    /// Large enough for the device's grid-wide selection and both filter
    /// paths: 4 device shards against one `cpu` index.
    #[test]
    fn large_gpu_set_agrees_with_one_index() {
        let Some(()) = device() else { return };
        let (n, d) = (40_000usize, 24usize);
        let data = corpora::shuffled_duplicates(5, n, d, 500);
        let r = ArrayView2::from_shape((n, d), &data).expect("shape");
        let ids: Vec<u64> = (0..n as u64).map(|i| i * 7 + 3).collect();
        let qs = corpora::queries(9, 6, d, &[Kind::SmallInt], &data);
        let qv = ArrayView2::from_shape((6, d), &qs).expect("shape");
        for metric in Metric::ALL {
            let specs: Vec<ShardSpec> = (0..4).map(gpu_shard).collect();
            let mut set = ShardedIndex::new(d, metric, &specs).expect("set");
            set.add(&ids, r).expect("add");
            let mut one = Index::with_ids(&ids, r, metric, IndexBackend::Cpu).expect("one");
            let gone: Vec<u64> = ids.iter().copied().step_by(6).collect();
            assert_eq!(set.remove(&gone), one.remove(&gone));
            let f = Filter::new(ids.iter().copied().step_by(3));
            for k in [1, 100, 1000] {
                for spec in [FilterSpec::None, FilterSpec::Shared(&f)] {
                    let got = set.search_batch(qv, k, spec).expect("set");
                    let want = one.search_batch(qv, k, spec).expect("one");
                    for (g, w) in got.iter().zip(&want) {
                        same(g, w).unwrap_or_else(|e| panic!("{metric} k {k}: {e}"));
                    }
                }
                let got = set.search(&qs[..d], k, None).expect("set");
                same(&got, &one.search(&qs[..d], k, None).expect("one"))
                    .unwrap_or_else(|e| panic!("{metric} single k {k}: {e}"));
            }
        }
    }
}

/// A call larger than one grouping block (2^18 rows) is applied block by
/// block and still gives the one index's bytes; a bad row in its last block
/// is refused before any block changes a shard.
#[test]
fn calls_larger_than_a_block_are_whole() {
    let (n, d) = (300_000usize, 3usize);
    let data = corpora::shuffled_duplicates(11, n, d, 1000);
    let r = ArrayView2::from_shape((n, d), &data).expect("shape");
    let ids: Vec<u64> = (0..n as u64).rev().map(|i| i * 3).collect();
    let mut set =
        ShardedIndex::uniform(d, Metric::L2, 3, &ShardSpec::new(IndexBackend::Cpu)).expect("set");
    let mut bad = data.clone();
    bad[(n - 2) * d + 1] = f32::INFINITY;
    let bad = ArrayView2::from_shape((n, d), &bad).expect("shape");
    let err = set.add(&ids, bad).expect_err("infinite value").to_string();
    assert!(err.contains(&format!("row {}", n - 2)), "{err}");
    assert!(set.is_empty());
    set.add(&ids, r).expect("add");
    set.upsert(&ids[..n / 2], r.slice(ndarray::s![n / 2.., ..]))
        .expect("upsert");
    let mut one = Index::with_ids(&ids, r, Metric::L2, IndexBackend::Cpu).expect("one");
    one.upsert(&ids[..n / 2], r.slice(ndarray::s![n / 2.., ..]))
        .expect("upsert");
    assert_eq!(set.len(), n);
    for q in data.chunks_exact(d).step_by(50_000) {
        same(
            &set.search(q, 50, None).expect("set"),
            &one.search(q, 50, None).expect("one"),
        )
        .expect("same bytes");
    }
}

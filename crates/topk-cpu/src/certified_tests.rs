//! Tests of the certified GEMM batch path: bit for bit the oracle's bytes.
use ndarray::ArrayView2;
use proptest::prelude::*;
use topk_core::{Dtype, Metric, Neighbor, Retriever, RowStore};
use topk_testkit::corpora::{self, bitwise_diff, palette, Kind};

use super::{
    applies, cut, reaches, BatchGemm, Bounds, CertifiedRows, CosineBounds, DotBounds, Int8Rows,
    L2Bounds, QueryBound, Stats, MAX_DIM, MIN_INT8_VALUES, MIN_QUERIES,
};
use crate::{CorpusRef, CpuRetriever, Kernels, Oracle};

/// The certified path's answers for every query (forced, whatever the shape).
fn certified(cpu: &CpuRetriever, queries: &[f32], k: usize) -> (Vec<Vec<Neighbor>>, Stats) {
    let d = cpu.dim();
    let view = ArrayView2::from_shape((queries.len() / d, d), queries).unwrap();
    let batch = cpu.prepare_batch(view);
    let (sels, stats) = cpu.select_certified(&batch, k.min(cpu.len()));
    let out = sels
        .into_iter()
        .enumerate()
        .map(|(i, sel)| {
            let mut o = Vec::new();
            let (q, qn) = (batch.query(i), batch.norm(i));
            sel.finish(&mut o, |row| cpu.score_one(q, qn, row));
            o
        })
        .collect();
    (out, stats)
}

/// The oracle's answers.
fn oracle(data: &[f32], d: usize, metric: Metric, queries: &[f32], k: usize) -> Vec<Vec<Neighbor>> {
    let oracle = Oracle::from_rowmajor(data.to_vec(), d, metric).unwrap();
    queries
        .chunks_exact(d)
        .map(|q| oracle.search(q, k).unwrap())
        .collect()
}

/// Checks the forced certified path and the public batch against the
/// oracle, bit for bit, with every batch product this CPU runs; returns the
/// statistics of the last (the fastest).
fn check(
    data: &[f32],
    d: usize,
    metric: Metric,
    queries: &[f32],
    k: usize,
    kernels: Kernels,
) -> Result<Stats, TestCaseError> {
    let want = oracle(data, d, metric, queries, k);
    let mut stats = Stats::default();
    for gemm in BatchGemm::available() {
        stats = check_with(data, d, metric, queries, k, kernels, gemm, &want)?;
    }
    Ok(stats)
}

/// [`check`] with one batch product.
#[allow(clippy::too_many_arguments)]
fn check_with(
    data: &[f32],
    d: usize,
    metric: Metric,
    queries: &[f32],
    k: usize,
    kernels: Kernels,
    gemm: BatchGemm,
    want: &[Vec<Neighbor>],
) -> Result<Stats, TestCaseError> {
    let cpu = CpuRetriever::from_rowmajor(data.to_vec(), d, metric)
        .unwrap()
        .with_kernels(kernels)
        .with_batch_gemm(gemm)
        .unwrap();
    let n = cpu.len();
    let ctx = format!(
        "N={n} D={d} Q={} K={k} {metric} path={} gemm={gemm}",
        want.len(),
        kernels.path()
    );
    let (got, stats) = certified(&cpu, queries, k);
    prop_assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        if let Some(diff) = bitwise_diff(g, w) {
            return Err(TestCaseError::fail(format!(
                "{ctx} certified query {i}: {diff}"
            )));
        }
    }
    let view = ArrayView2::from_shape((want.len(), d), queries).unwrap();
    let public = cpu.search_batch(view, k).unwrap();
    for (i, (g, w)) in public.iter().zip(want).enumerate() {
        if let Some(diff) = bitwise_diff(g, w) {
            return Err(TestCaseError::fail(format!(
                "{ctx} batch query {i}: {diff}"
            )));
        }
    }
    Ok(stats)
}

fn metric() -> impl Strategy<Value = Metric> {
    prop_oneof![Just(Metric::Dot), Just(Metric::Cosine), Just(Metric::L2)]
}

/// `(N, D, Q, K)`: most cases small, a few up to N = 3000, D = 1100, Q = 300.
fn shape() -> impl Strategy<Value = (usize, usize, usize, usize)> {
    let n = prop_oneof![3 => 1usize..64, 3 => 64usize..700, 1 => 700usize..=3000];
    let d = prop_oneof![3 => 1usize..40, 3 => 40usize..200, 1 => 200usize..=1100];
    let q = prop_oneof![2 => 1usize..MIN_QUERIES, 3 => MIN_QUERIES..64, 1 => 64usize..=300];
    (n, d, q)
        .prop_filter("keep one case under ~1.5M corpus values", |(n, d, _)| {
            n * d <= 1_500_000
        })
        .prop_flat_map(|(n, d, q)| (Just(n), Just(d), Just(q), 1usize..=n + 3))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Random corpora of every accepted kind (ties, signed zeros,
    /// subnormals, constant rows, values at the overflow rule).
    #[test]
    fn certified_batches_match_the_oracle(
        (n, d, q, k) in shape(),
        metric in metric(),
        mask in any::<u8>(),
        seed in any::<u64>(),
    ) {
        let kinds = palette(mask & 0x7F);
        let data = corpora::corpus(seed, n, d, &kinds);
        let queries = corpora::queries(seed, q, d, &kinds, &data);
        check(&data, d, metric, &queries, k, Kernels::best())?;
    }

    /// Near ties: copies of a few rows, each moved by one ulp in one
    /// value, and their exact duplicates.
    #[test]
    fn near_ties_match_the_oracle(
        n in 2usize..1500,
        d in prop_oneof![1usize..40, 40usize..700],
        q in 1usize..80,
        k in 1usize..64,
        metric in metric(),
        seed in any::<u64>(),
    ) {
        let base = corpora::corpus(seed, 3, d, &[Kind::Uniform]);
        let mut rng = corpora::Rng::new(seed ^ 7);
        let mut data = Vec::with_capacity(n * d);
        for _ in 0..n {
            let b = rng.below(3);
            let mut row = base[b * d..(b + 1) * d].to_vec();
            let col = rng.below(d);
            row[col] = match rng.below(3) {
                0 => row[col].next_up(),
                1 => row[col].next_down(),
                _ => row[col],
            };
            data.extend_from_slice(&row);
        }
        let queries = corpora::queries(seed, q, d, &[Kind::Uniform], &data);
        check(&data, d, metric, &queries, k, Kernels::best())?;
    }
}

/// Checks a block's cut for threshold `t`: no row whose approximate dot is
/// at most the cut has an upper bound reaching `t`.
fn check_cut<B: Bounds>(
    bounds: &B,
    q: &QueryBound,
    t: f32,
    s: &[f32],
) -> Result<Option<f32>, TestCaseError> {
    let c = cut(bounds, q, t);
    if let Some(c) = c {
        for (i, &v) in s.iter().enumerate() {
            let hi = bounds.hi(q, v, i);
            if v <= c {
                prop_assert!(
                    !reaches(hi, t),
                    "row {i}: s {v} at most the cut {c}, yet hi {hi} reaches t {t}"
                );
            }
        }
    }
    Ok(c)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// The cut of every metric on random blocks, with the threshold at a
    /// row's own upper bound (the tightest tie) or anywhere between the
    /// rows' bounds, and approximate dots at and around the cut; with and
    /// without the int8 product's error terms.
    #[test]
    fn a_cut_leaves_out_only_rows_below_t(
        seed: u64,
        rows in 1usize..80,
        dim in 1usize..2000,
        scale in -40i32..40,
        pick in any::<prop::sample::Index>(),
        int8 in any::<bool>(),
    ) {
        let mut rng = corpora::Rng::new(seed);
        let f = 2_f32.powi(scale);
        let c = super::width_factor(dim);
        let norm: Vec<f32> = (0..rows).map(|_| (rng.unit().abs() + 0.01) * f).collect();
        let sq: Vec<f32> = norm.iter().map(|v| v * v).collect();
        let rn: Vec<f32> = norm
            .iter()
            .map(|&v| if rng.below(10) == 0 { 0.0 } else { v })
            .collect();
        let qb = (rng.unit().abs() + 0.01) * f;
        let mut s: Vec<f32> = (0..rows).map(|_| rng.unit() * qb * f).collect();
        // Int8 terms of the size the quantization gives: u ~ ‖x‖/64.
        let u1: Vec<f32> = norm.iter().map(|&v| v * rng.unit().abs() / 64.0).collect();
        let u2: Vec<f32> = norm.iter().map(|&v| v * (rng.unit().abs() + 0.5) / 64.0).collect();
        let terms = int8.then(|| Int8Rows::new(&u1, &u2));
        let dot = DotBounds::new(&norm).with_int8(terms);
        let l2 = L2Bounds::new(&sq, c).with_int8(terms);
        let cos = CosineBounds::new(&norm, &rn).with_int8(terms);
        let (a1, a2) = if int8 {
            (qb * rng.unit().abs(), qb * rng.unit().abs() / 128.0)
        } else {
            (0.0, 0.0)
        };
        let with = |a: f32, b: f32| QueryBound { a, b, a1, a2 };
        let (q_dot, q_l2, q_cos) = (with(c * qb, 0.0), with(qb * qb, 0.0), with(c * qb, qb));
        let i = pick.index(rows);
        for round in 0..3 {
            let t_dot = match round {
                0 => dot.hi(&q_dot, s[i], i),
                _ => s[i] * (1.0 + rng.unit() * 1e-3),
            };
            let found = check_cut(&dot, &q_dot, t_dot, &s)?;
            prop_assert!(found.is_some(), "dot: no cut for t {}", t_dot);
            if let Some(cut) = found {
                // Rows at and around the cut.
                s[i] = cut;
                check_cut(&dot, &q_dot, t_dot, &s)?;
                s[i] = cut.next_up();
            }
            let t_l2 = match round {
                0 => l2.hi(&q_l2, s[i], i),
                _ => 2.0 * s[i] - q_l2.a - sq[i] * (1.0 + rng.unit()),
            };
            let found = check_cut(&l2, &q_l2, t_l2, &s)?;
            prop_assert!(found.is_some(), "l2: no cut for t {}", t_l2);
            if let Some(cut) = found {
                s[i] = cut;
                check_cut(&l2, &q_l2, t_l2, &s)?;
            }
            let t_cos = match round {
                0 => cos.hi(&q_cos, s[i], i),
                _ => rng.unit().abs(),
            };
            let found = check_cut(&cos, &q_cos, t_cos, &s)?;
            let has_rows = rn.iter().any(|&v| v > 0.0);
            prop_assert!(
                found.is_some() || t_cos <= 0.0 || !has_rows,
                "cosine: no cut for t {}",
                t_cos
            );
            if let Some(cut) = found {
                s[i] = cut;
                check_cut(&cos, &q_cos, t_cos, &s)?;
            }
        }
        // No cut below -inf: every row is then tested.
        prop_assert_eq!(cut(&dot, &q_dot, f32::NEG_INFINITY), None);
    }
}

/// Every kernel path, on shapes with ragged chunks and several row blocks.
#[test]
fn every_kernel_path_matches_the_oracle() {
    for kernels in Kernels::all_available() {
        for (n, d, q, k, mask) in [
            (1300, 33, 40, 7, 0x01),
            (900, 97, 20, 100, 0x7F),
            (700, 1025, 17, 1, 0x03),
            (64, 5, 300, 64, 0x2F),
        ] {
            for metric in [Metric::Dot, Metric::Cosine, Metric::L2] {
                let kinds = palette(mask);
                let data = corpora::corpus(n as u64, n, d, &kinds);
                let queries = corpora::queries(d as u64, q, d, &kinds, &data);
                check(&data, d, metric, &queries, k, kernels).unwrap();
            }
        }
    }
}

/// A corpus of equal rows ties every row: no bound rules one out, every
/// row is scored canonically for every query, and the answers stay exact.
#[test]
fn equal_rows_are_all_scored_and_stay_exact() {
    let (n, d, q, k) = (4600, 24, 20, 1);
    let data: Vec<f32> = (0..n)
        .flat_map(|_| (0..d).map(|c| c as f32 * 0.25 - 1.0))
        .collect();
    let queries = corpora::queries(3, q, d, &[Kind::Uniform], &data);
    for metric in [Metric::Dot, Metric::Cosine, Metric::L2] {
        let stats = check(&data, d, metric, &queries, k, Kernels::best()).unwrap();
        assert_eq!(stats.rescored, q * n, "{metric}: every row scored");
    }
}

/// On ordinary rows the bounds rule out nearly every row, with either
/// product.
#[test]
fn ordinary_rows_are_mostly_ruled_out() {
    let (n, d, q, k) = (20_000, 64, 24, 10);
    let data = corpora::corpus(11, n, d, &[Kind::Uniform]);
    let queries = corpora::queries(12, q, d, &[Kind::Uniform], &data);
    let want = oracle(&data, d, Metric::Dot, &queries, k);
    for gemm in BatchGemm::available() {
        let cpu = CpuRetriever::from_rowmajor(data.clone(), d, Metric::Dot)
            .unwrap()
            .with_batch_gemm(gemm)
            .unwrap();
        let (got, stats) = certified(&cpu, &queries, k);
        assert!(
            stats.rescored < q * n / 10,
            "{gemm}: scored {} of {}",
            stats.rescored,
            q * n
        );
        for (g, w) in got.iter().zip(&want) {
            assert_eq!(bitwise_diff(g, w), None, "{gemm}");
        }
    }
}

/// The pieces share their thresholds, so which rows a piece offers depends
/// on timing; the answer must not. Rows of small integers (ties at the K-th
/// score) with duplicates, 80 row blocks, through pools of 1 to 8 threads:
/// the oracle's bytes every time.
#[test]
fn shared_thresholds_leave_the_answer_independent_of_the_pool() {
    let (n, d, q, k) = (40_000, 24, 40, 100);
    let kinds = [Kind::SmallInt, Kind::Uniform, Kind::Duplicate];
    let data = corpora::corpus(71, n, d, &kinds);
    let queries = corpora::queries(72, q, d, &kinds, &data);
    for metric in [Metric::Dot, Metric::Cosine, Metric::L2] {
        let want = oracle(&data, d, metric, &queries, k);
        for threads in [1, 2, 3, 8] {
            let cpu = CpuRetriever::from_rowmajor(data.clone(), d, metric)
                .unwrap()
                .with_threads(threads)
                .unwrap();
            for round in 0..2 {
                let (got, _) = certified(&cpu, &queries, k);
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    if let Some(diff) = bitwise_diff(g, w) {
                        panic!("{metric} threads {threads} round {round} query {i}: {diff}");
                    }
                }
            }
        }
    }
}

/// Rows a thousandth apart around one row: closer than the int8 product's
/// width, so under it nearly every row is scored canonically, but far apart
/// for the f32 product's. Both answers are the oracle's bytes.
#[test]
fn rows_within_the_int8_width_stay_exact() {
    let (d, k, n, q) = (32, 5, 5000, 20);
    let mut rng = corpora::Rng::new(91);
    let base: Vec<f32> = (0..d).map(|_| rng.unit()).collect();
    let data: Vec<f32> = (0..n)
        .flat_map(|_| {
            base.iter()
                .map(|&b| b + 1e-3 * rng.unit())
                .collect::<Vec<_>>()
        })
        .collect();
    let queries: Vec<f32> = (0..q * d).map(|_| rng.unit()).collect();
    for metric in [Metric::Dot, Metric::Cosine, Metric::L2] {
        let want = oracle(&data, d, metric, &queries, k);
        let mut scored = Vec::new();
        for gemm in BatchGemm::available() {
            let cpu = CpuRetriever::from_rowmajor(data.clone(), d, metric)
                .unwrap()
                .with_batch_gemm(gemm)
                .unwrap();
            let (got, stats) = certified(&cpu, &queries, k);
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                if let Some(diff) = bitwise_diff(g, w) {
                    panic!("{metric} {gemm} query {i}: {diff}");
                }
            }
            scored.push((gemm, stats.rescored));
        }
        // The f32 product separates the rows; the int8 one, where this CPU
        // has it, does not.
        assert!(scored[0].1 < q * n / 10, "{metric}: {scored:?}");
        if let Some(&(_, int8)) = scored.get(1) {
            assert!(int8 > q * n / 2, "{metric}: {scored:?}");
        }
    }
}

/// Single queries and batches under [`MIN_QUERIES`] take the int8 path over
/// [`MIN_INT8_VALUES`] corpus values or more once the row state exists:
/// rows of small integers (ties at the K-th score) with duplicates, f32 and
/// f16 storage, every metric, through `search` and batches of 2 and 5; the
/// oracle's bytes every time.
#[test]
fn single_queries_over_many_rows_match_the_oracle() {
    let d = 20;
    let n = MIN_INT8_VALUES / d + 77;
    assert!(applies(1, n, d, 100, BatchGemm::Int8));
    assert!(!applies(1, MIN_INT8_VALUES / d - 1, d, 1, BatchGemm::Int8));
    assert!(!applies(MIN_QUERIES - 1, n, d, 1, BatchGemm::F32));
    let kinds = [Kind::SmallInt, Kind::Uniform, Kind::Duplicate];
    let data = corpora::corpus(81, n, d, &kinds);
    let queries = corpora::queries(82, 7, d, &kinds, &data);
    let view = ArrayView2::from_shape((n, d), &data).unwrap();
    for dtype in [Dtype::F32, Dtype::F16] {
        for metric in [Metric::Dot, Metric::Cosine, Metric::L2] {
            let oracle = Oracle::with_dtype(view, metric, dtype).unwrap();
            for gemm in BatchGemm::available() {
                let cpu = CpuRetriever::with_dtype(view, metric, dtype)
                    .unwrap()
                    .with_batch_gemm(gemm)
                    .unwrap();
                // Before the row state exists small batches scan; a batch of
                // 16 or more, or `prepare_certified`, builds it.
                assert!(!cpu.takes_certified(1, 10));
                cpu.prepare_certified();
                assert_eq!(cpu.takes_certified(1, 10), gemm == BatchGemm::Int8);
                for k in [1, 10, 100] {
                    let want: Vec<Vec<Neighbor>> = queries
                        .chunks_exact(d)
                        .map(|q| oracle.search(q, k).unwrap())
                        .collect();
                    let ctx = format!("{dtype:?} {metric} {gemm} K={k}");
                    for (i, (q, w)) in queries.chunks_exact(d).zip(&want).enumerate() {
                        let got = cpu.search(q, k).unwrap();
                        if let Some(diff) = bitwise_diff(&got, w) {
                            panic!("{ctx} single query {i}: {diff}");
                        }
                    }
                    for size in [2, 5] {
                        let qs = &queries[..size * d];
                        let got = cpu
                            .search_batch(ArrayView2::from_shape((size, d), qs).unwrap(), k)
                            .unwrap();
                        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                            if let Some(diff) = bitwise_diff(g, w) {
                                panic!("{ctx} batch of {size}, query {i}: {diff}");
                            }
                        }
                    }
                }
            }
        }
    }
}

/// A row state kept up to date through appends, replaced rows and a
/// shortened corpus equals the state built from scratch over the result,
/// with either product and either storage.
#[test]
fn updated_row_state_equals_a_fresh_one() {
    let d = 37;
    let kinds = [Kind::Uniform, Kind::SmallInt, Kind::Duplicate];
    let fresh = |data: &[f32], dtype: Dtype, metric: Metric| {
        RowStore::from_f32(data.to_vec(), d, dtype).unwrap_or_else(|e| panic!("{metric}: {e}"))
    };
    let norms = |store: &RowStore| -> Vec<f32> {
        (0..store.len())
            .map(|r| Kernels::best().norm(&store.row(r)))
            .collect()
    };
    for gemm in BatchGemm::available() {
        for dtype in [Dtype::F32, Dtype::F16] {
            for metric in [Metric::Dot, Metric::Cosine] {
                // Runs `f` on the state and the corpus of `data` as stored,
                // then compares the state with one built from scratch.
                let step =
                    |state: &mut CertifiedRows,
                     data: &[f32],
                     what: &str,
                     f: &dyn Fn(&mut CertifiedRows, CorpusRef<'_>)| {
                        let store = fresh(data, dtype, metric);
                        let ns = norms(&store);
                        let corpus = CorpusRef::new(&store, metric, &ns).unwrap();
                        f(state, corpus);
                        let want = CertifiedRows::build(corpus, gemm).unwrap();
                        assert_eq!(*state, want, "{what}");
                    };
                let mut data = corpora::corpus(5, 1300, d, &kinds);
                let store = fresh(&data, dtype, metric);
                let ns = norms(&store);
                let corpus = CorpusRef::new(&store, metric, &ns).unwrap();
                let mut state = CertifiedRows::build(corpus, gemm).unwrap();
                // Appended rows: 1300 → 1900 crosses two 512-row blocks.
                data.extend(corpora::corpus(6, 600, d, &kinds));
                step(&mut state, &data, "appended", &|s, c| {
                    s.update_from(c, 1300)
                });
                // Rows replaced in place, two in one block.
                let replaced = [3_usize, 700, 701, 1899];
                let more = corpora::corpus(7, replaced.len(), d, &kinds);
                for (r, v) in replaced.iter().zip(more.chunks_exact(d)) {
                    data[r * d..(r + 1) * d].copy_from_slice(v);
                }
                step(&mut state, &data, "replaced", &|s, c| {
                    s.refresh_rows(c, &replaced)
                });
                // Rows dropped from 1000 on and the later ones moved up.
                data.drain(1000 * d..1200 * d);
                step(&mut state, &data, "compacted", &|s, c| {
                    s.update_from(c, 1000)
                });
                assert_eq!(state.len(), 1700);
            }
        }
    }
}

/// A borrowed cosine corpus needs one norm per row; a stale row state is
/// an error, not a wrong answer.
#[test]
fn mismatched_norms_and_stale_state_are_errors() {
    let d = 4;
    let data = corpora::corpus(8, 100, d, &[Kind::Uniform]);
    let store = RowStore::from_f32(data.clone(), d, Dtype::F32).unwrap();
    let err = CorpusRef::new(&store, Metric::Cosine, &[1.0; 99]).unwrap_err();
    assert!(
        err.to_string().contains("99 cosine row norms for 100"),
        "{err}"
    );
    let corpus = CorpusRef::new(&store, Metric::Dot, &[]).unwrap();
    let state = CertifiedRows::build(corpus, BatchGemm::F32).unwrap();
    let longer = RowStore::from_f32([data.clone(), data].concat(), d, Dtype::F32).unwrap();
    let corpus = CorpusRef::new(&longer, Metric::Dot, &[]).unwrap();
    let q = ndarray::Array2::<f32>::ones((1, d));
    let err = select_all(corpus, &state, q.view(), 3).unwrap_err();
    assert!(
        err.to_string()
            .contains("covers 100 rows, the corpus has 200"),
        "{err}"
    );
    // A state of another width or metric with the same row count: refused,
    // never a panic in the int8 product or bounds from other norms.
    let wide = RowStore::from_f32(
        corpora::corpus(9, 100, 2 * d, &[Kind::Uniform]),
        2 * d,
        Dtype::F32,
    )
    .unwrap();
    let wide = CorpusRef::new(&wide, Metric::Dot, &[]).unwrap();
    for gemm in [BatchGemm::F32, BatchGemm::Int8] {
        let Ok(other) = CertifiedRows::build(wide, gemm) else {
            continue; // this CPU does not run the int8 product
        };
        let q = ndarray::Array2::<f32>::ones((1, d));
        let corpus = CorpusRef::new(&store, Metric::Dot, &[]).unwrap();
        let err = select_all(corpus, &other, q.view(), 3).unwrap_err();
        assert!(
            err.to_string()
                .contains("built for D = 8 under dot, the corpus has D = 4 under dot"),
            "{err}"
        );
    }
    let norms: Vec<f32> = vec![1.0; 100];
    let cosine = CorpusRef::new(&store, Metric::Cosine, &norms).unwrap();
    let corpus = CorpusRef::new(&store, Metric::Dot, &[]).unwrap();
    let dot_state = CertifiedRows::build(corpus, BatchGemm::F32).unwrap();
    let q = ndarray::Array2::<f32>::ones((1, d));
    let err = select_all(cosine, &dot_state, q.view(), 3).unwrap_err();
    assert!(
        err.to_string()
            .contains("under dot, the corpus has D = 4 under cosine"),
        "{err}"
    );
}

#[test]
fn a_dimension_past_the_bounds_derivation_is_refused() {
    let d = MAX_DIM + 1;
    let store = RowStore::from_f32(vec![0.5; 2 * d], d, Dtype::F32).unwrap();
    let corpus = CorpusRef::new(&store, Metric::Dot, &[]).unwrap();
    let state = CertifiedRows::build(corpus, BatchGemm::F32).unwrap();
    let q = ndarray::Array2::<f32>::from_elem((1, d), 0.5);
    let err = select_all(corpus, &state, q.view(), 1).unwrap_err();
    assert!(err.to_string().contains("D <= 65536"), "{err}");
}

/// [`crate::select_certified`] of the top `k` of every row, on the best path.
fn select_all(
    corpus: CorpusRef<'_>,
    state: &CertifiedRows,
    queries: ArrayView2<'_, f32>,
    k: usize,
) -> topk_core::Result<Vec<crate::select::Selector>> {
    crate::select_certified(
        corpus,
        state,
        Kernels::best(),
        queries,
        k,
        |_, _| true,
        || crate::select::Selector::new(k),
    )
}

//! Every kernel path against topk-core's scalar reference, bit for bit, with
//! each path this CPU offers forced in turn.

use proptest::prelude::*;
use topk_core::{canon_dot as ref_dot, canon_norm as ref_norm, canon_sqdist as ref_sqdist, Metric};

use super::*;

use topk_testkit::corpora::{self as common, palette, vector_of, Kind, Rng};

/// The paths to test; fails when a path this CPU must offer is missing, so a
/// run cannot pass by testing less than it claims.
fn paths() -> Vec<Kernels> {
    let all = Kernels::all_available();
    let names: Vec<&str> = all.iter().map(|k| k.path().as_str()).collect();
    println!("kernel paths tested on this CPU: {}", names.join(", "));
    assert_eq!(all[0].path(), Path::Scalar);
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        assert!(names.contains(&"avx2"));
    }
    if std::env::var_os("TOPK_REQUIRE_AVX512").is_some_and(|v| v == "1") {
        assert!(
            names.contains(&"avx512"),
            "TOPK_REQUIRE_AVX512=1 but AVX-512F is not available"
        );
    }
    all
}

#[test]
fn reports_the_paths_it_tests() {
    let p = paths();
    assert!(p.contains(&Kernels::best()));
    for path in Path::ALL {
        assert_eq!(Kernels::new(path).is_ok(), path.is_available());
    }
}

#[test]
fn an_unavailable_path_is_a_typed_error() {
    for path in Path::ALL.into_iter().filter(|p| !p.is_available()) {
        let e = Kernels::new(path).unwrap_err();
        assert!(matches!(e, CpuError::PathUnavailable { path: p, .. } if p == path));
        assert!(e.to_string().contains(path.as_str()), "{e}");
    }
}

fn dims() -> impl Strategy<Value = usize> {
    prop_oneof![3 => 1usize..40, 2 => 40usize..200, 1 => 200usize..=1100]
}

fn check_pair(k: Kernels, a: &[f32], b: &[f32]) -> Result<(), TestCaseError> {
    let path = k.path();
    prop_assert_eq!(
        k.dot(a, b).to_bits(),
        ref_dot(a, b).to_bits(),
        "dot on {}",
        path
    );
    prop_assert_eq!(
        k.sqdist(a, b).to_bits(),
        ref_sqdist(a, b).to_bits(),
        "sqdist on {}",
        path
    );
    prop_assert_eq!(
        k.norm(a).to_bits(),
        ref_norm(a).to_bits(),
        "norm on {}",
        path
    );
    for m in Metric::ALL {
        let s = k.score_row(m, a, k.norm(a), b, k.norm(b));
        prop_assert_eq!(
            s.to_bits(),
            m.score_scalar(a, b).to_bits(),
            "{} on {}",
            m,
            path
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    /// The cut test of every path against the scalar one, on every length
    /// up to 64, with NaN, infinities, signed zeros and values at the cut.
    #[test]
    fn above_matches_the_scalar_test(seed: u64, len in 0usize..=64, pick in 0usize..64) {
        let mut rng = Rng::new(seed);
        let specials = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 0.0, -0.0, 1.0];
        let values: Vec<f32> = (0..len)
            .map(|_| match rng.below(4) {
                0 => specials[rng.below(specials.len())],
                _ => rng.unit(),
            })
            .collect();
        let cut = match values.get(pick) {
            Some(&v) if !v.is_nan() => v,
            _ => rng.unit(),
        };
        let want = above_scalar(&values, cut);
        for (i, &v) in values.iter().enumerate() {
            prop_assert_eq!(want >> i & 1 == 1, v.is_nan() || v > cut, "value {} against cut {}", v, cut);
        }
        prop_assert_eq!(want >> len.min(63) >> (len / 64), 0);
        for k in Kernels::all_available() {
            prop_assert_eq!(k.above(&values, cut), want, "path {}", k.path());
        }
    }

    #[test]
    fn pairs_match_the_reference(seed: u64, d in dims(), mask: u8) {
        let kinds = palette(mask);
        let mut rng = Rng::new(seed);
        let a = vector_of(&mut rng, &kinds, d, &[]);
        let b = vector_of(&mut rng, &kinds, d, &a);
        for k in Kernels::all_available() {
            check_pair(k, &a, &b)?;
        }
    }

    #[test]
    fn row_blocks_match_the_reference(seed: u64, d in dims(), n in 1usize..9, mask: u8) {
        let kinds = palette(mask);
        let mut rng = Rng::new(seed);
        let q = vector_of(&mut rng, &kinds, d, &[]);
        let rows = common::corpus(seed.rotate_left(7), n, d, &kinds);
        let norms: Vec<f32> = rows.chunks_exact(d).map(ref_norm).collect();
        for k in Kernels::all_available() {
            for m in Metric::ALL {
                let mut out = vec![0.0; n];
                k.score_rows(m, &q, ref_norm(&q), &rows, &norms, &mut out);
                for (i, (s, r)) in out.iter().zip(rows.chunks_exact(d)).enumerate() {
                    prop_assert_eq!(s.to_bits(), m.score_scalar(&q, r).to_bits(),
                        "row {} of {}, {} on {}", i, n, m, k.path());
                }
            }
        }
    }

    #[test]
    fn tiles_match_the_reference(seed: u64, d in dims(), nq in 1usize..=TILE_QUERIES, mask: u8) {
        let kinds = palette(mask);
        let data = common::corpus(seed, MAX_TILE_ROWS + TILE_QUERIES, d, &kinds);
        let vecs: Vec<&[f32]> = data.chunks_exact(d).collect();
        let (rows, qs) = vecs.split_at(MAX_TILE_ROWS);
        let qs = &qs[..nq];
        for k in Kernels::all_available() {
            for sq in [false, true] {
                let metric = if sq { Metric::L2 } else { Metric::Dot };
                let rows = &rows[..k.tile_rows(metric)];
                let mut out: TileOut = [[f32::NAN; TILE_QUERIES]; MAX_TILE_ROWS];
                k.tile(sq, rows, qs, &mut out);
                for (r, row) in rows.iter().enumerate() {
                    for (j, q) in qs.iter().enumerate() {
                        let want = if sq { ref_sqdist(q, row) } else { ref_dot(q, row) };
                        prop_assert_eq!(out[r][j].to_bits(), want.to_bits(),
                            "tile ({}, {}) sq={} on {}", r, j, sq, k.path());
                    }
                }
            }
        }
    }
}

/// The padding of a partial chunk (query `+0.0`, row `-0.0`) adds
/// `fma(+0, -0, p)`, which is `p` bit for bit for every `p`, `-0.0` included.
#[test]
fn padding_is_exact_for_every_partial_sum() {
    let partials = [
        0.0_f32,
        -0.0,
        1.0,
        -1.0,
        f32::from_bits(1),
        -f32::from_bits(1),
        f32::MIN_POSITIVE,
        f32::MAX,
        f32::INFINITY,
        f32::NEG_INFINITY,
    ];
    for p in partials {
        assert_eq!(
            QUERY_PAD.mul_add(ROW_PAD, p).to_bits(),
            p.to_bits(),
            "{p:e}"
        );
    }
    // Zero padding on both sides would not be: -0.0 turns into +0.0.
    assert_eq!(0.0_f32.mul_add(0.0, -0.0).to_bits(), 0.0_f32.to_bits());
}

/// Products that underflow to `-0.0` leave partial sums of `-0.0`; lanes the
/// tail does not reach must keep them, as the reference does, on every path
/// and in every kernel (pairs, rows, tiles).
#[test]
fn partial_sums_of_negative_zero_survive_the_padded_tail() {
    for d in [33, 34, 40, 63, 65, 100, 1000] {
        let q = vec![-1e-30_f32; d];
        let r = vec![1e-30_f32; d];
        let want = ref_dot(&q, &r);
        assert_eq!(want.to_bits(), (-0.0_f32).to_bits(), "d={d}");
        for k in paths() {
            let name = k.path();
            assert_eq!(k.dot(&q, &r).to_bits(), want.to_bits(), "dot d={d} {name}");
            assert_eq!(k.dot(&r, &q).to_bits(), want.to_bits(), "dot' d={d} {name}");
            let rows: Vec<f32> = r.iter().chain(&q).copied().collect();
            let mut out = [f32::NAN; 2];
            k.score_rows(Metric::Dot, &q, 0.0, &rows, &[0.0, 0.0], &mut out);
            assert_eq!(out[0].to_bits(), want.to_bits(), "rows d={d} {name}");
            assert_eq!(
                out[1].to_bits(),
                ref_dot(&q, &q).to_bits(),
                "rows d={d} {name}"
            );
            let tile_rows: Vec<&[f32]> = vec![&r; k.tile_rows(Metric::Dot)];
            let mut tile: TileOut = [[f32::NAN; TILE_QUERIES]; MAX_TILE_ROWS];
            k.tile(false, &tile_rows, &[&q, &r], &mut tile);
            for t in &tile[..tile_rows.len()] {
                assert_eq!(t[0].to_bits(), want.to_bits(), "tile d={d} {name}");
                assert_eq!(
                    t[1].to_bits(),
                    ref_dot(&r, &r).to_bits(),
                    "tile d={d} {name}"
                );
            }
        }
    }
}

/// The same through the retrievers: the fast CPU path returns the oracle's
/// bytes for a corpus whose scores are `-0.0`.
#[test]
fn a_negative_zero_score_is_the_oracles_on_the_fast_path() {
    let d = 40;
    let mut corpus = ndarray::Array2::<f32>::from_elem((5, d), 1e-30);
    corpus.row_mut(3).fill(-1e-30);
    let q = vec![-1e-30_f32; d];
    let fast = crate::CpuRetriever::new(corpus.view(), Metric::Dot).expect("fast");
    let oracle = crate::Oracle::new(corpus.view(), Metric::Dot).expect("oracle");
    use topk_core::Retriever as _;
    let (a, b) = (
        fast.search(&q, 5).expect("fast"),
        oracle.search(&q, 5).expect("oracle"),
    );
    let bits = |v: &[topk_core::Neighbor]| {
        v.iter()
            .map(|n| (n.index, n.score.to_bits()))
            .collect::<Vec<_>>()
    };
    assert_eq!(bits(&a), bits(&b));
    assert!(b.iter().any(|n| n.score.to_bits() == (-0.0_f32).to_bits()));
}

#[test]
fn zero_padding_keeps_negative_zero_inputs() {
    // Vectors of negative zeros whose length leaves a padded tail, on every path.
    for d in [1, 5, 31, 33, 63, 65, 100] {
        let neg = vec![-0.0_f32; d];
        let ones = vec![1.0_f32; d];
        for k in paths() {
            assert_eq!(
                k.dot(&neg, &ones).to_bits(),
                0.0_f32.to_bits(),
                "d={d} {}",
                k.path()
            );
            assert_eq!(k.dot(&neg, &ones).to_bits(), ref_dot(&neg, &ones).to_bits());
            assert_eq!(
                k.sqdist(&neg, &neg).to_bits(),
                ref_sqdist(&neg, &neg).to_bits()
            );
            // L2 of identical rows is the negated zero distance: -0.0 kept.
            let s = k.score_row(Metric::L2, &neg, 0.0, &neg, 0.0);
            assert_eq!(s.to_bits(), (-0.0_f32).to_bits());
        }
    }
}

/// Lane order, fused multiply-add and the butterfly each change the result of
/// a crafted vector; every path must reproduce the reference anyway.
#[test]
fn crafted_orders_agree_on_every_path() {
    let mut a = vec![0.0_f32; 70];
    a[0] = 1e8;
    a[1] = 1.0;
    a[32] = -1e8;
    a[64] = 3.0;
    a[17] = 1e-3;
    let x = 1.0_f32 + 2.0_f32.powi(-12);
    let mut b = vec![1.0_f32; 70];
    b[33] = x;
    a[33] = x;
    for k in paths() {
        assert_eq!(
            k.dot(&a, &b).to_bits(),
            ref_dot(&a, &b).to_bits(),
            "{}",
            k.path()
        );
        assert_eq!(
            k.sqdist(&a, &b).to_bits(),
            ref_sqdist(&a, &b).to_bits(),
            "{}",
            k.path()
        );
    }
}

#[test]
fn overflow_gives_the_reference_nan_and_infinities() {
    let big = vec![1e30_f32; 64];
    let mut mixed = big.clone();
    mixed[1] = -1e30;
    for k in paths() {
        for (a, b) in [(&big, &big), (&big, &mixed), (&mixed, &mixed)] {
            assert_eq!(
                k.dot(a, b).to_bits(),
                ref_dot(a, b).to_bits(),
                "{}",
                k.path()
            );
            assert_eq!(
                k.sqdist(a, b).to_bits(),
                ref_sqdist(a, b).to_bits(),
                "{}",
                k.path()
            );
        }
    }
}

#[test]
fn free_functions_use_the_best_path() {
    let a: Vec<f32> = (0..77).map(|i| i as f32 * 0.25 - 3.0).collect();
    let b: Vec<f32> = (0..77).map(|i| 1.0 / (i as f32 + 1.0)).collect();
    assert_eq!(canon_dot(&a, &b).to_bits(), ref_dot(&a, &b).to_bits());
    assert_eq!(canon_sqdist(&a, &b).to_bits(), ref_sqdist(&a, &b).to_bits());
    assert_eq!(canon_norm(&a).to_bits(), ref_norm(&a).to_bits());
    let s = score_row(Metric::Cosine, &a, canon_norm(&a), &b, canon_norm(&b));
    assert_eq!(s.to_bits(), Metric::Cosine.score_scalar(&a, &b).to_bits());
    let _ = Kind::Uniform;
}

#[test]
#[should_panic(expected = "length mismatch")]
fn mismatched_lengths_panic_like_the_reference() {
    Kernels::best().dot(&[1.0, 2.0], &[1.0]);
}

#[test]
fn rows_of_no_values_score_as_the_empty_pair() {
    for k in paths() {
        for metric in Metric::ALL {
            let mut out = [f32::NAN; 3];
            k.score_rows(metric, &[], 0.0, &[], &[0.0; 3], &mut out);
            let want = k.score_row(metric, &[], 0.0, &[], 0.0);
            assert!(
                out.iter().all(|o| o.to_bits() == want.to_bits()),
                "{metric} {out:?}"
            );
        }
    }
}

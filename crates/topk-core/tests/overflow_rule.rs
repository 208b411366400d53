//! The overflow rule (docs/CONTRACTS.md §4): a finite row and query that both
//! pass validation score finitely under every metric, the one exception being
//! cosine's documented `-inf` when a computed norm is zero. Huge values (near
//! `1e38`, `3e38`), values at the limit, tiny and subnormal values, mixed.

use proptest::prelude::*;
use topk_core::{canon_norm, validate, Error, Metric};

/// One value: zero, ordinary, huge, at the edge of the limit, tiny or subnormal.
fn value() -> impl Strategy<Value = f32> {
    prop_oneof![
        Just(0.0_f32),
        -1.0f32..1.0,
        (-1.0f32..1.0).prop_map(|v| v * 3e38),
        (-1.0f32..1.0).prop_map(|v| v * 1e38),
        (-1.0f32..1.0).prop_map(|v| v * 2.0_f32.powi(50)),
        (-1.0f32..1.0).prop_map(|v| v * 2.0_f32.powi(45)),
        (-1.0f32..1.0).prop_map(|v| v * 1e-20),
        (-1.0f32..1.0).prop_map(|v| v * 1e-38),
        (-(1i32 << 23)..(1i32 << 23))
            .prop_map(|m| f32::from_bits(m.unsigned_abs()) * m.signum() as f32),
    ]
}

/// A vector of `d` values; half of them scaled so that the squared norm sits
/// just below or above the limit.
fn vector(d: usize) -> impl Strategy<Value = Vec<f32>> {
    (prop::collection::vec(value(), d), 0u8..4, 0.9f64..1.1).prop_map(|(mut v, mode, f)| {
        if mode < 2 {
            let sq: f64 = v.iter().map(|&x| f64::from(x) * f64::from(x)).sum();
            if sq > 0.0 {
                let s = (validate::MAX_SQUARED_NORM / sq).sqrt() * f;
                for x in &mut v {
                    *x = (f64::from(*x) * s) as f32;
                }
            }
        }
        v
    })
}

fn pair() -> impl Strategy<Value = (Vec<f32>, Vec<f32>)> {
    (1usize..80).prop_flat_map(|d| (vector(d), vector(d)))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4096))]

    #[test]
    fn accepted_inputs_score_finitely_on_every_metric((q, x) in pair()) {
        let d = q.len();
        let accepted = validate::query(&q, d).is_ok() && validate::corpus(&x, d).is_ok();
        if !accepted {
            // Rejected inputs are rejected with a typed error, never a panic.
            for e in [validate::query(&q, d).err(), validate::corpus(&x, d).err()]
                .into_iter()
                .flatten()
            {
                prop_assert!(
                    matches!(e, Error::NormTooLarge { .. } | Error::NonFinite { .. }),
                    "{e:?}"
                );
            }
            return Ok(());
        }
        for metric in Metric::ALL {
            let s = metric.score_scalar(&q, &x);
            if metric == Metric::Cosine && canon_norm(&q) * canon_norm(&x) == 0.0 {
                prop_assert_eq!(s, f32::NEG_INFINITY);
            } else {
                prop_assert!(s.is_finite(), "{metric}: {s} for q = {q:?}, x = {x:?}");
            }
        }
    }

    #[test]
    fn rows_at_the_limit_score_finitely_against_each_other(
        d in 1usize..300,
        signs in prop::collection::vec(any::<bool>(), 300),
    ) {
        // The worst case of l2: opposite vectors of the largest admitted norm.
        let m = (validate::MAX_SQUARED_NORM / d as f64).sqrt() as f32;
        let m = if f64::from(m) * f64::from(m) * d as f64 > validate::MAX_SQUARED_NORM {
            f32::from_bits(m.to_bits() - 1)
        } else {
            m
        };
        let q: Vec<f32> = signs[..d].iter().map(|&s| if s { m } else { -m }).collect();
        let x: Vec<f32> = q.iter().map(|v| -v).collect();
        prop_assert!(validate::query(&q, d).is_ok());
        prop_assert!(validate::corpus(&x, d).is_ok());
        for metric in Metric::ALL {
            for (a, b) in [(&q, &x), (&q, &q)] {
                let s = metric.score_scalar(a, b);
                prop_assert!(s.is_finite(), "{metric}: {s} at D = {d}");
            }
        }
    }
}

#[test]
fn the_rows_of_the_report_are_rejected() {
    // Values near 3e38 made 17 dot scores inf and 60 NaN, and a cosine NaN.
    let row = vec![3e38_f32; 8];
    let e = validate::corpus(&row, 8).unwrap_err();
    assert!(matches!(e, Error::NormTooLarge { largest, .. } if largest == 3e38));
    let e = validate::query(&row, 8).unwrap_err();
    assert!(matches!(e, Error::NormTooLarge { .. }));
}

#[test]
fn subnormal_norms_give_a_finite_cosine_or_negative_infinity() {
    let tiny = f32::from_bits(1); // 2^-149
    for q in [
        vec![tiny; 4],
        vec![1e-23; 64],
        vec![1.5e-22; 64],
        vec![1e-19; 3],
    ] {
        for x in [
            vec![tiny; q.len()],
            vec![2.0_f32.powi(40); q.len()],
            q.clone(),
        ] {
            let s = Metric::Cosine.score_scalar(&q, &x);
            assert!(
                s.is_finite() || s == f32::NEG_INFINITY,
                "{s} for {q:?} and {x:?}"
            );
            if canon_norm(&q) * canon_norm(&x) != 0.0 {
                assert!(s.is_finite(), "{s}");
            }
        }
    }
}

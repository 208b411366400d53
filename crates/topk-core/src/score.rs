//! The canonical score (docs/CONTRACTS.md §2): the one summation order every backend
//! reproduces, so that CPU and GPU results agree to the bit.
//!
//! A dot product of length D is split over [`LANES`] = 32 partial sums, the
//! width of a CUDA warp: partial `j` accumulates `d = j, j + 32, j + 64, …` in
//! increasing order with one fused multiply-add per step. The 32 partials are
//! then combined by the butterfly a warp shuffle performs (steps 16, 8, 4, 2, 1).
//! The functions here are the plain scalar reference; SIMD and GPU code must
//! match them bit for bit and are tested against them.

/// Number of partial sums in the canonical order (one per warp lane).
pub const LANES: usize = 32;

/// The butterfly reduction of 32 partial sums: at step `s` in 16, 8, 4, 2, 1,
/// `p[j] = p[j] + p[j ^ s]`. Returns the value every lane ends with.
///
/// Only lanes `j < s` are kept at each step: lane `j + s` would compute the
/// same sum with the operands swapped, which IEEE addition makes identical.
#[inline]
pub fn butterfly(mut p: [f32; LANES]) -> f32 {
    let mut step = LANES / 2;
    while step > 0 {
        for j in 0..step {
            p[j] += p[j + step];
        }
        step /= 2;
    }
    p[0]
}

/// Canonical accumulation of `f(d)` terms: partial `d % 32` is updated by
/// `fma(x, y, p)` with `(x, y) = term(d)`, then the butterfly.
#[inline]
fn canon_accumulate(len: usize, term: impl Fn(usize) -> (f32, f32)) -> f32 {
    let mut p = [0.0_f32; LANES];
    for d in 0..len {
        let (x, y) = term(d);
        let j = d % LANES;
        p[j] = x.mul_add(y, p[j]);
    }
    butterfly(p)
}

/// Canonical inner product of two vectors of equal length.
///
/// # Panics
/// When the lengths differ: callers validate shapes first (see [`crate::validate`]).
pub fn canon_dot(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "canon_dot: length mismatch");
    canon_accumulate(a.len(), |d| (a[d], b[d]))
}

/// Canonical squared Euclidean distance: `t = r[d] - q[d]; p = fma(t, t, p)`.
///
/// # Panics
/// When the lengths differ.
pub fn canon_sqdist(q: &[f32], r: &[f32]) -> f32 {
    assert_eq!(q.len(), r.len(), "canon_sqdist: length mismatch");
    canon_accumulate(q.len(), |d| {
        let t = r[d] - q[d];
        (t, t)
    })
}

/// Canonical Euclidean norm: `sqrt(canon_dot(x, x))`, correctly rounded.
pub fn canon_norm(x: &[f32]) -> f32 {
    canon_dot(x, x).sqrt()
}

/// Cosine score from its parts: `dot / (qnorm * rnorm)`, or `-inf` when the
/// denominator is zero (a zero query or row, or norms whose product underflows).
#[inline]
pub fn cosine_from_parts(dot: f32, qnorm: f32, rnorm: f32) -> f32 {
    let den = qnorm * rnorm;
    if den == 0.0 {
        f32::NEG_INFINITY
    } else {
        dot / den
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The butterfly written the long way: all 32 lanes, simultaneous update.
    fn butterfly_all_lanes(p: [f32; LANES]) -> [f32; LANES] {
        let mut cur = p;
        for s in [16, 8, 4, 2, 1] {
            let prev = cur;
            for j in 0..LANES {
                cur[j] = prev[j] + prev[j ^ s];
            }
        }
        cur
    }

    proptest! {
        #[test]
        fn every_lane_ends_with_the_same_bits(p in prop::array::uniform32(-1e30f32..1e30)) {
            let all = butterfly_all_lanes(p);
            let r = butterfly(p);
            for v in all {
                prop_assert_eq!(v.to_bits(), r.to_bits());
            }
        }
    }

    #[test]
    fn short_vectors_use_only_their_lanes() {
        assert_eq!(canon_dot(&[2.0], &[3.0]), 6.0);
        assert_eq!(canon_sqdist(&[1.0, 1.0], &[4.0, 5.0]), 25.0);
        assert_eq!(canon_norm(&[3.0, 4.0]), 5.0);
    }

    #[test]
    fn partials_follow_lane_order_not_sequential_order() {
        // 1e8 in lane 0, then -1e8 in lane 0 again at d = 32, 1.0 in lane 1:
        // the lane-0 sum cancels exactly before the butterfly adds lane 1.
        let mut a = vec![0.0_f32; 33];
        a[0] = 1e8;
        a[1] = 1.0;
        a[32] = -1e8;
        let ones = vec![1.0_f32; 33];
        assert_eq!(canon_dot(&a, &ones), 1.0);
    }

    #[test]
    fn uses_a_fused_multiply_add() {
        // Lane 0 holds -1 after d = 0, then fma(x, x, -1) at d = 32. With
        // x = 1 + 2^-12, x*x = 1 + 2^-11 + 2^-24: rounding the product first
        // loses the 2^-24 term, the fused form keeps it.
        let x = 1.0_f32 + 2.0_f32.powi(-12);
        let mut a = vec![0.0_f32; 33];
        let mut b = vec![0.0_f32; 33];
        (a[0], b[0]) = (-1.0, 1.0);
        (a[32], b[32]) = (x, x);
        let expect = 2.0_f32.powi(-11) + 2.0_f32.powi(-24);
        assert_eq!(canon_dot(&a, &b), expect);
        assert_ne!(x * x - 1.0, expect);
    }

    #[test]
    fn cosine_zero_denominator_is_negative_infinity() {
        assert_eq!(cosine_from_parts(0.0, 0.0, 3.0), f32::NEG_INFINITY);
        assert_eq!(cosine_from_parts(1.0, 1e-30, 1e-30), f32::NEG_INFINITY);
        assert_eq!(cosine_from_parts(1.0, 2.0, 0.5), 1.0);
    }
}

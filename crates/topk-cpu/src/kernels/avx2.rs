//! AVX2 + FMA path: the 32 canonical partial sums live in four ymm registers,
//! register `g` holding lanes `8g .. 8g + 8`.
//!
//! Entry points are `unsafe fn`s whose one extra precondition is that the CPU
//! runs AVX2 and FMA; [`super::Kernels`] checks it once. Shapes are asserted
//! at entry, so the raw loads inside are in bounds.

use std::arch::x86_64::*;

use topk_core::LANES;

use super::{padded_tail, TileOut, QUERY_PAD, ROW_PAD, TILE_QUERIES};

/// f32 lanes per ymm register.
const W: usize = 8;
/// Registers per canonical chunk of 32 partial sums.
const GROUPS: usize = LANES / W;

/// One canonical step on 8 lanes: `fma(q, r, p)` for a dot product, or
/// `t = r - q; fma(t, t, p)` for a squared distance.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn step<const SQ: bool>(q: __m256, r: __m256, p: __m256) -> __m256 {
    if SQ {
        let t = _mm256_sub_ps(r, q);
        _mm256_fmadd_ps(t, t, p)
    } else {
        _mm256_fmadd_ps(q, r, p)
    }
}

/// Loads 8 values at `x[off..off + 8]`.
///
/// # Safety
/// `off + 8 <= x.len()`, and the CPU runs AVX2.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn load(x: &[f32], off: usize) -> __m256 {
    debug_assert!(off + W <= x.len());
    // SAFETY: in bounds by the caller's contract; loadu has no alignment need.
    unsafe { _mm256_loadu_ps(x.as_ptr().add(off)) }
}

/// Butterfly steps 4, 2, 1 over lanes 0..8, returning lane 0: `p[j] + p[j + s]`
/// keeps the reference's operand order.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) fn butterfly8(v: __m256) -> f32 {
    let x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let y = _mm_add_ps(x, _mm_movehl_ps(x, x));
    let z = _mm_add_ss(y, _mm_movehdup_ps(y));
    _mm_cvtss_f32(z)
}

/// The full butterfly (steps 16, 8, 4, 2, 1) over four registers of partials.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn butterfly(p: [__m256; GROUPS]) -> f32 {
    let lo = _mm256_add_ps(p[0], p[2]);
    let hi = _mm256_add_ps(p[1], p[3]);
    butterfly8(_mm256_add_ps(lo, hi))
}

/// Accumulates one 32-value chunk starting at `off` of `q` and `r`.
///
/// # Safety
/// `off + 32 <= len` for both slices; the CPU runs AVX2 and FMA.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn chunk<const SQ: bool>(q: &[f32], r: &[f32], off: usize, p: &mut [__m256; GROUPS]) {
    for (g, pg) in p.iter_mut().enumerate() {
        // SAFETY: off + 8g + 8 <= off + 32, in bounds by the caller's contract.
        let (qv, rv) = unsafe { (load(q, off + g * W), load(r, off + g * W)) };
        *pg = step::<SQ>(qv, rv, *pg);
    }
}

#[target_feature(enable = "avx2,fma")]
unsafe fn pair_impl<const SQ: bool>(q: &[f32], r: &[f32]) -> f32 {
    assert_eq!(q.len(), r.len());
    let full = q.len() / LANES;
    let mut p = [_mm256_setzero_ps(); GROUPS];
    for c in 0..full {
        // SAFETY: chunk c ends at 32(c + 1) <= 32 full <= len.
        unsafe { chunk::<SQ>(q, r, c * LANES, &mut p) };
    }
    if full * LANES < q.len() {
        let (tq, tr) = (padded_tail(q, QUERY_PAD), padded_tail(r, ROW_PAD));
        // SAFETY: the padded tails hold exactly one chunk.
        unsafe { chunk::<SQ>(&tq, &tr, 0, &mut p) };
    }
    butterfly(p)
}

/// Canonical dot (`sq = false`) or squared distance (`sq = true`) of one pair.
///
/// # Safety
/// The CPU runs AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn pair(sq: bool, q: &[f32], r: &[f32]) -> f32 {
    // SAFETY: same features as this function; `pair_impl` asserts the shape.
    unsafe {
        if sq {
            pair_impl::<true>(q, r)
        } else {
            pair_impl::<false>(q, r)
        }
    }
}

#[target_feature(enable = "avx2,fma")]
unsafe fn rows_impl<const SQ: bool>(q: &[f32], rows: &[f32], out: &mut [f32]) {
    let d = q.len();
    assert_eq!(rows.len(), out.len() * d);
    // One row at a time: a single sequential stream is what DRAM serves
    // best, and the four independent chains per row already
    // outrun memory.
    for (row, o) in rows.chunks_exact(d).zip(out.iter_mut()) {
        // SAFETY: same features; `row` has `d` values like `q`.
        *o = unsafe { pair_impl::<SQ>(q, row) };
    }
}

/// Raw canonical values of consecutive rows against one query.
///
/// # Safety
/// The CPU runs AVX2 and FMA. (`rows.len() == out.len() * q.len()` is asserted.)
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn rows(sq: bool, q: &[f32], rows: &[f32], out: &mut [f32]) {
    // SAFETY: same features as this function.
    unsafe {
        if sq {
            rows_impl::<true>(q, rows, out)
        } else {
            rows_impl::<false>(q, rows, out)
        }
    }
}

/// Padded last chunks of a tile's rows and queries, when D is not a multiple of 32.
type Tails<const R: usize, const Q: usize> = ([[f32; LANES]; R], [[f32; LANES]; Q]);

/// One register group `g` of an `R × Q` tile: for every pair, the 8 partial
/// sums of lanes `8g .. 8g + 8`. Those lanes depend only on the values
/// `d ≡ 8g .. 8g + 8 (mod 32)`, so the groups are computed one after another
/// with one accumulator per pair, which is what lets a 3 × 4 tile (12
/// accumulators) fit in the 16 ymm registers.
///
/// # Safety
/// The CPU runs AVX2 and FMA; `rows.len() == R`, `qs.len() == Q`, every
/// slice has `full * 32` values or more, and `g < 4`.
#[inline]
#[target_feature(enable = "avx2,fma")]
// Indices name registers of the tile (row r, query q); iterators would hide
// which accumulator each FMA feeds.
#[allow(clippy::needless_range_loop)]
unsafe fn group<const R: usize, const Q: usize, const SQ: bool>(
    rows: &[&[f32]],
    qs: &[&[f32]],
    full: usize,
    tails: Option<&Tails<R, Q>>,
    g: usize,
) -> [[__m256; Q]; R] {
    let mut acc = [[_mm256_setzero_ps(); Q]; R];
    for c in 0..full {
        let off = c * LANES + g * W;
        let mut rv = [_mm256_setzero_ps(); R];
        for r in 0..R {
            // SAFETY: off + 8 <= 32 full <= rows[r].len().
            rv[r] = unsafe { load(rows[r], off) };
        }
        for q in 0..Q {
            // SAFETY: as above, for qs[q].
            let qv = unsafe { load(qs[q], off) };
            for r in 0..R {
                acc[r][q] = step::<SQ>(qv, rv[r], acc[r][q]);
            }
        }
    }
    if let Some((rt, qt)) = tails {
        let off = g * W;
        let mut rv = [_mm256_setzero_ps(); R];
        for r in 0..R {
            // SAFETY: off + 8 <= 32, the length of a padded tail.
            rv[r] = unsafe { load(&rt[r], off) };
        }
        for q in 0..Q {
            // SAFETY: as above.
            let qv = unsafe { load(&qt[q], off) };
            for r in 0..R {
                acc[r][q] = step::<SQ>(qv, rv[r], acc[r][q]);
            }
        }
    }
    acc
}

/// An `R × Q` tile, group by group, folding the groups into the butterfly
/// as they complete so that only one extra register set is ever stored.
///
/// # Safety
/// The CPU runs AVX2 and FMA; `rows.len() == R`, `qs.len() == Q`, every slice
/// has the same length.
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::needless_range_loop)]
unsafe fn tile_impl<const R: usize, const Q: usize, const SQ: bool>(
    rows: &[&[f32]],
    qs: &[&[f32]],
    out: &mut TileOut,
) {
    assert!(rows.len() == R && qs.len() == Q);
    let d = qs[0].len();
    let full = d / LANES;
    let tails: Option<Tails<R, Q>> = (full * LANES < d).then(|| {
        let mut rt = [[0.0_f32; LANES]; R];
        for (t, r) in rt.iter_mut().zip(rows) {
            *t = padded_tail(r, ROW_PAD);
        }
        let mut qt = [[0.0_f32; LANES]; Q];
        for (t, q) in qt.iter_mut().zip(qs) {
            *t = padded_tail(q, QUERY_PAD);
        }
        (rt, qt)
    });
    let tails = tails.as_ref();
    // Butterfly step 16 pairs group 0 with 2 and group 1 with 3.
    // SAFETY: same features and shapes as this function; g < 4.
    let g0 = unsafe { group::<R, Q, SQ>(rows, qs, full, tails, 0) };
    // SAFETY: as above.
    let g2 = unsafe { group::<R, Q, SQ>(rows, qs, full, tails, 2) };
    let mut lo = [[_mm256_setzero_ps(); Q]; R];
    for r in 0..R {
        for q in 0..Q {
            lo[r][q] = _mm256_add_ps(g0[r][q], g2[r][q]);
        }
    }
    // SAFETY: as above.
    let g1 = unsafe { group::<R, Q, SQ>(rows, qs, full, tails, 1) };
    // SAFETY: as above.
    let g3 = unsafe { group::<R, Q, SQ>(rows, qs, full, tails, 3) };
    for r in 0..R {
        let mut s8 = [_mm256_setzero_ps(); Q];
        for q in 0..Q {
            let hi = _mm256_add_ps(g1[r][q], g3[r][q]);
            s8[q] = _mm256_add_ps(lo[r][q], hi);
        }
        if let Ok(four) = <[__m256; 4]>::try_from(&s8[..]) {
            out[r] = butterfly8x4(four);
        } else {
            for q in 0..Q {
                out[r][q] = butterfly8(s8[q]);
            }
        }
    }
}

/// [`butterfly8`] of four registers at once, sharing the shuffles: each add
/// still combines lane `j` (left) with lane `j + s` (right) of one register.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn butterfly8x4(v: [__m256; 4]) -> [f32; 4] {
    // Step 4: [v0.lo, v1.lo] + [v0.hi, v1.hi], likewise for v2, v3.
    let s01 = _mm256_add_ps(
        _mm256_permute2f128_ps::<0x20>(v[0], v[1]),
        _mm256_permute2f128_ps::<0x31>(v[0], v[1]),
    );
    let s23 = _mm256_add_ps(
        _mm256_permute2f128_ps::<0x20>(v[2], v[3]),
        _mm256_permute2f128_ps::<0x31>(v[2], v[3]),
    );
    // Step 2: lanes 0, 1 + lanes 2, 3 of each half.
    let u = _mm256_add_ps(
        _mm256_shuffle_ps::<0b01_00_01_00>(s01, s23),
        _mm256_shuffle_ps::<0b11_10_11_10>(s01, s23),
    );
    // u = [v0: a b, v2: a b | v1: a b, v3: a b]; step 1: a + b.
    let (x, y) = (_mm256_castps256_ps128(u), _mm256_extractf128_ps::<1>(u));
    let r = _mm_add_ps(
        _mm_shuffle_ps::<0b10_00_10_00>(x, y),
        _mm_shuffle_ps::<0b11_01_11_01>(x, y),
    );
    // r = [v0, v2, v1, v3].
    let r = _mm_shuffle_ps::<0b11_01_10_00>(r, r);
    let mut out = [0.0_f32; 4];
    // SAFETY: `out` holds exactly 4 f32.
    unsafe { _mm_storeu_ps(out.as_mut_ptr(), r) };
    out
}

/// Dispatches a tile to its monomorphised kernel (rows: 3 for a dot, 2 for a
/// squared distance, whose difference needs a spare register).
///
/// # Safety
/// The CPU runs AVX2 and FMA; `rows.len()` is 3 (dot) or 2 (`sq`),
/// `qs.len()` is in `1..=4`, and every slice has the same length.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn tile(sq: bool, rows: &[&[f32]], qs: &[&[f32]], out: &mut TileOut) {
    assert!(rows.len() == if sq { 2 } else { 3 } && (1..=TILE_QUERIES).contains(&qs.len()));
    // SAFETY: same features; the shapes are asserted above and by the caller.
    unsafe {
        match (sq, qs.len()) {
            (false, 1) => tile_impl::<3, 1, false>(rows, qs, out),
            (false, 2) => tile_impl::<3, 2, false>(rows, qs, out),
            (false, 3) => tile_impl::<3, 3, false>(rows, qs, out),
            (false, _) => tile_impl::<3, 4, false>(rows, qs, out),
            (true, 1) => tile_impl::<2, 1, true>(rows, qs, out),
            (true, 2) => tile_impl::<2, 2, true>(rows, qs, out),
            (true, 3) => tile_impl::<2, 3, true>(rows, qs, out),
            (true, _) => tile_impl::<2, 4, true>(rows, qs, out),
        }
    }
}

/// [`super::Kernels::above`] eight values a compare.
///
/// # Safety
/// The CPU runs AVX2; `values.len() <= 64`.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn above(values: &[f32], cut: f32) -> u64 {
    let c = _mm256_set1_ps(cut);
    let chunks = values.chunks_exact(W);
    let tail = chunks.remainder();
    let mut mask = 0_u64;
    for (i, v) in chunks.enumerate() {
        // SAFETY: `v` holds exactly W f32; loadu has no alignment need.
        let v = unsafe { _mm256_loadu_ps(v.as_ptr()) };
        // Not-less-or-equal, unordered: a NaN is set, like the scalar test.
        let m = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_NLE_UQ>(v, c)) as u32;
        mask |= u64::from(m) << (i * W);
    }
    if tail.is_empty() {
        mask
    } else {
        mask | super::above_scalar(tail, cut) << (values.len() - tail.len())
    }
}

//! AVX-512F path: the 32 canonical partial sums live in two zmm registers,
//! register `g` holding lanes `16g .. 16g + 16`. Same structure and contracts
//! as the AVX2 path; the butterfly finishes on the AVX2 helper once 8 lanes
//! remain.

use std::arch::x86_64::*;

use topk_core::LANES;

use super::avx2::butterfly8;
use super::{padded_tail, TileOut, QUERY_PAD, ROW_PAD, TILE_QUERIES};

/// f32 lanes per zmm register.
const W: usize = 16;
/// Registers per canonical chunk of 32 partial sums.
const GROUPS: usize = LANES / W;

/// One canonical step on 16 lanes (see the AVX2 path).
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
fn step<const SQ: bool>(q: __m512, r: __m512, p: __m512) -> __m512 {
    if SQ {
        let t = _mm512_sub_ps(r, q);
        _mm512_fmadd_ps(t, t, p)
    } else {
        _mm512_fmadd_ps(q, r, p)
    }
}

/// Loads 16 values at `x[off..off + 16]`.
///
/// # Safety
/// `off + 16 <= x.len()`, and the CPU runs AVX-512F.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn load(x: &[f32], off: usize) -> __m512 {
    debug_assert!(off + W <= x.len());
    // SAFETY: in bounds by the caller's contract; loadu has no alignment need.
    unsafe { _mm512_loadu_ps(x.as_ptr().add(off)) }
}

/// The full butterfly (steps 16, 8, 4, 2, 1) over two registers of partials.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
fn butterfly(p: [__m512; GROUPS]) -> f32 {
    let s16 = _mm512_add_ps(p[0], p[1]);
    let lo = _mm512_castps512_ps256(s16);
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(s16)));
    butterfly8(_mm256_add_ps(lo, hi))
}

/// Accumulates one 32-value chunk starting at `off` of `q` and `r`.
///
/// # Safety
/// `off + 32 <= len` for both slices; the CPU runs AVX-512F.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn chunk<const SQ: bool>(q: &[f32], r: &[f32], off: usize, p: &mut [__m512; GROUPS]) {
    for (g, pg) in p.iter_mut().enumerate() {
        // SAFETY: off + 16g + 16 <= off + 32, in bounds by the caller's contract.
        let (qv, rv) = unsafe { (load(q, off + g * W), load(r, off + g * W)) };
        *pg = step::<SQ>(qv, rv, *pg);
    }
}

#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn pair_impl<const SQ: bool>(q: &[f32], r: &[f32]) -> f32 {
    assert_eq!(q.len(), r.len());
    let full = q.len() / LANES;
    let mut p = [_mm512_setzero_ps(); GROUPS];
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
/// The CPU runs AVX-512F, AVX2 and FMA.
#[target_feature(enable = "avx512f,avx2,fma")]
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

#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn rows_impl<const SQ: bool>(q: &[f32], rows: &[f32], out: &mut [f32]) {
    let d = q.len();
    assert_eq!(rows.len(), out.len() * d);
    // One row at a time: a single sequential stream is what DRAM serves
    // best, and the two independent chains per row already
    // outrun memory.
    for (row, o) in rows.chunks_exact(d).zip(out.iter_mut()) {
        // SAFETY: same features; `row` has `d` values like `q`.
        *o = unsafe { pair_impl::<SQ>(q, row) };
    }
}

/// Raw canonical values of consecutive rows against one query.
///
/// # Safety
/// The CPU runs AVX-512F, AVX2 and FMA. (`rows.len() == out.len() * q.len()` is asserted.)
#[target_feature(enable = "avx512f,avx2,fma")]
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

/// An `R × Q` tile, one register group at a time (see the AVX2 path).
///
/// # Safety
/// The CPU runs AVX-512F; `rows.len() == R`, `qs.len() == Q`, every slice has
/// the same length.
#[target_feature(enable = "avx512f,avx2,fma")]
// Indices name registers of the tile (row r, query q, group g); iterators
// would hide which accumulator each FMA feeds.
#[allow(clippy::needless_range_loop)]
unsafe fn tile_impl<const R: usize, const Q: usize, const SQ: bool>(
    rows: &[&[f32]],
    qs: &[&[f32]],
    out: &mut TileOut,
) {
    assert!(rows.len() == R && qs.len() == Q);
    let d = qs[0].len();
    let full = d / LANES;
    let mut parts = [[[_mm512_setzero_ps(); GROUPS]; Q]; R];
    for g in 0..GROUPS {
        let mut acc = [[_mm512_setzero_ps(); Q]; R];
        for c in 0..full {
            let off = c * LANES + g * W;
            let mut rv = [_mm512_setzero_ps(); R];
            for r in 0..R {
                // SAFETY: off + 16 <= 32 full <= d = rows[r].len().
                rv[r] = unsafe { load(rows[r], off) };
            }
            for q in 0..Q {
                // SAFETY: as above, qs[q].len() = d.
                let qv = unsafe { load(qs[q], off) };
                for r in 0..R {
                    acc[r][q] = step::<SQ>(qv, rv[r], acc[r][q]);
                }
            }
        }
        if full * LANES < d {
            // Rebuilt per group: only vectors of D not a multiple of 32 get here.
            let mut rt = [[0.0_f32; LANES]; R];
            for (t, r) in rt.iter_mut().zip(rows) {
                *t = padded_tail(r, ROW_PAD);
            }
            let mut qt = [[0.0_f32; LANES]; Q];
            for (t, q) in qt.iter_mut().zip(qs) {
                *t = padded_tail(q, QUERY_PAD);
            }
            let off = g * W;
            let mut rv = [_mm512_setzero_ps(); R];
            for r in 0..R {
                // SAFETY: off + 16 <= 32, the length of a padded tail.
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
        for r in 0..R {
            for q in 0..Q {
                parts[r][q][g] = acc[r][q];
            }
        }
    }
    for r in 0..R {
        for q in 0..Q {
            out[r][q] = butterfly(parts[r][q]);
        }
    }
}

/// Dispatches a tile of 4 rows to its monomorphised kernel.
///
/// # Safety
/// The CPU runs AVX-512F, AVX2 and FMA; `rows.len()` is 4, `qs.len()` is in
/// `1..=4`, and every slice has the same length.
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) unsafe fn tile(sq: bool, rows: &[&[f32]], qs: &[&[f32]], out: &mut TileOut) {
    assert!(rows.len() == 4 && (1..=TILE_QUERIES).contains(&qs.len()));
    // SAFETY: same features; the shapes are asserted above and by the caller.
    unsafe {
        match (sq, qs.len()) {
            (false, 1) => tile_impl::<4, 1, false>(rows, qs, out),
            (false, 2) => tile_impl::<4, 2, false>(rows, qs, out),
            (false, 3) => tile_impl::<4, 3, false>(rows, qs, out),
            (false, _) => tile_impl::<4, 4, false>(rows, qs, out),
            (true, 1) => tile_impl::<4, 1, true>(rows, qs, out),
            (true, 2) => tile_impl::<4, 2, true>(rows, qs, out),
            (true, 3) => tile_impl::<4, 3, true>(rows, qs, out),
            (true, _) => tile_impl::<4, 4, true>(rows, qs, out),
        }
    }
}

/// [`super::Kernels::above`] sixteen values a compare.
///
/// # Safety
/// The CPU runs AVX-512F; `values.len() <= 64`.
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) unsafe fn above(values: &[f32], cut: f32) -> u64 {
    let c = _mm512_set1_ps(cut);
    let chunks = values.chunks_exact(W);
    let tail = chunks.remainder();
    let mut mask = 0_u64;
    for (i, v) in chunks.enumerate() {
        // SAFETY: `v` holds exactly W f32; loadu has no alignment need.
        let v = unsafe { _mm512_loadu_ps(v.as_ptr()) };
        // Not-less-or-equal, unordered: a NaN is set, like the scalar test.
        let m = _mm512_cmp_ps_mask::<_CMP_NLE_UQ>(v, c);
        mask |= u64::from(m) << (i * W);
    }
    if tail.is_empty() {
        mask
    } else {
        mask | super::above_scalar(tail, cut) << (values.len() - tail.len())
    }
}

//! Half-width stored rows (docs/CONTRACTS.md §14) widened to `f32` blocks
//! for the canonical kernels: F16C's `vcvtph2ps` for f16 and an AVX2 zero
//! extension and shift for bf16, eight values a step, where the CPU has them;
//! topk-core's conversions elsewhere.
//! Widening is exact either way, so the bits are the same.

use std::cell::RefCell;
use std::ops::Range;
use std::sync::OnceLock;

use topk_core::{Dtype, Metric, RowStore};

use super::Kernels;

/// Bytes of widened rows scored per kernel call on half-width storage: the
/// widened piece stays in L1 while it is scored (64 rows of D = 384, 98 KiB,
/// measured 1.4–1.7× the f32 time for f16 on a 2-core machine).
const WIDE_BYTES: usize = 16 << 10;

thread_local! {
    /// One widened row of a half-width store, for [`Kernels::score_stored_row`].
    static ROW: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

impl Kernels {
    /// [`Kernels::score_row`] of stored row `r` (its norm `row_norm`, read
    /// only for cosine): in place for `f32` storage, widened into a
    /// per-thread row otherwise.
    ///
    /// # Panics
    /// When `r` is past the end or the query has the wrong length.
    #[inline]
    pub fn score_stored_row(
        self,
        metric: Metric,
        query: &[f32],
        query_norm: f32,
        store: &RowStore,
        r: usize,
        row_norm: f32,
    ) -> f32 {
        let score = |row: &[f32]| self.score_row(metric, query, query_norm, row, row_norm);
        match store.as_f32() {
            Some(all) => score(&all[r * store.dim()..(r + 1) * store.dim()]),
            None => ROW.with_borrow_mut(|buf| score(rows_f32(store, r..r + 1, buf))),
        }
    }

    /// [`Kernels::score_rows`] over rows `range` of a store: `out[i]` is the
    /// score of row `range.start + i`; `row_norms` (of those rows) is read
    /// only for cosine. Half-width rows are widened into `scratch` a piece
    /// of at most 16 KiB at a time.
    ///
    /// # Panics
    /// As [`Kernels::score_rows`]: `out.len() != range.len()`, or for cosine
    /// `row_norms.len() != out.len()`.
    #[allow(clippy::too_many_arguments)]
    pub fn score_stored(
        self,
        metric: Metric,
        query: &[f32],
        query_norm: f32,
        store: &RowStore,
        range: Range<usize>,
        row_norms: &[f32],
        out: &mut [f32],
        scratch: &mut Vec<f32>,
    ) {
        if let Some(all) = store.as_f32() {
            let d = store.dim();
            let rows = &all[range.start * d..range.end * d];
            self.score_rows(metric, query, query_norm, rows, row_norms, out);
            return;
        }
        assert_eq!(
            out.len(),
            range.len(),
            "score_stored: {} scores for {} rows",
            out.len(),
            range.len()
        );
        let piece = (WIDE_BYTES / (4 * store.dim())).max(1);
        let mut r = range.start;
        while r < range.end {
            let e = (r + piece).min(range.end);
            let (i, j) = (r - range.start, e - range.start);
            let norms = if row_norms.is_empty() {
                row_norms
            } else {
                &row_norms[i..j]
            };
            let rows = rows_f32(store, r..e, scratch);
            self.score_rows(metric, query, query_norm, rows, norms, &mut out[i..j]);
            r = e;
        }
    }
}

/// Rows `range` of `store` as one `f32` block: the stored values for `f32`,
/// otherwise widened into `scratch`.
pub fn rows_f32<'a>(
    store: &'a RowStore,
    range: Range<usize>,
    scratch: &'a mut Vec<f32>,
) -> &'a [f32] {
    match store.as_bits16() {
        Some(bits) if has_simd(store.dtype()) => {
            let d = store.dim();
            let src = &bits[range.start * d..range.end * d];
            scratch.clear();
            scratch.resize(src.len(), 0.0);
            widen(store.dtype(), src, scratch);
            scratch
        }
        _ => store.rows_f32(range, scratch),
    }
}

/// Whether this CPU widens `dtype` with vector instructions: F16C (and AVX)
/// for f16, AVX2 for bf16 (detected once).
fn has_simd(dtype: Dtype) -> bool {
    static FEATURES: OnceLock<(bool, bool)> = OnceLock::new();
    let (f16c, avx2) = *FEATURES.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            (has!("f16c") && has!("avx"), has!("avx2"))
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            (false, false)
        }
    });
    match dtype {
        Dtype::F16 => f16c,
        Dtype::Bf16 => avx2,
        Dtype::F32 => false,
    }
}

/// `dst[i] = f32(src[i])` for the 16-bit values `src` of `dtype`; only
/// called after [`has_simd`] said yes.
fn widen(dtype: Dtype, src: &[u16], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len(), "widen: length mismatch");
    assert!(
        has_simd(dtype),
        "widen: no vector path for {dtype} on this CPU"
    );
    #[cfg(target_arch = "x86_64")]
    match dtype {
        // SAFETY: has_simd(F16) means F16C and AVX run here; the lengths are
        // equal (asserted above).
        Dtype::F16 => unsafe { widen_f16c(src, dst) },
        // SAFETY: has_simd(Bf16) means AVX2 runs here; lengths as above.
        _ => unsafe { widen_bf16_avx2(src, dst) },
    }
}

/// [`widen`] for bf16 on AVX2: eight values a step (zero-extend to 32 bits,
/// shift left by 16), the tail one by one.
///
/// # Safety
/// The CPU runs AVX2; `src.len() == dst.len()`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn widen_bf16_avx2(src: &[u16], dst: &mut [f32]) {
    use std::arch::x86_64::{
        __m128i, _mm256_castsi256_ps, _mm256_cvtepu16_epi32, _mm256_slli_epi32, _mm256_storeu_ps,
        _mm_loadu_si128,
    };
    let whole = src.len() / 8 * 8;
    for i in (0..whole).step_by(8) {
        // SAFETY: i + 8 <= whole <= src.len() == dst.len(), and the loads and
        // stores are unaligned.
        unsafe {
            let h = _mm_loadu_si128(src.as_ptr().add(i).cast::<__m128i>());
            let w = _mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h));
            _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_castsi256_ps(w));
        }
    }
    for (o, &h) in dst[whole..].iter_mut().zip(&src[whole..]) {
        *o = f32::from_bits(u32::from(h) << 16);
    }
}

/// [`widen`] for f16 on F16C: eight halves a step, the tail one by one.
///
/// # Safety
/// The CPU runs F16C and AVX; `src.len() == dst.len()`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "f16c,avx")]
unsafe fn widen_f16c(src: &[u16], dst: &mut [f32]) {
    use std::arch::x86_64::{__m128i, _mm256_cvtph_ps, _mm256_storeu_ps, _mm_loadu_si128};
    let whole = src.len() / 8 * 8;
    for i in (0..whole).step_by(8) {
        // SAFETY: i + 8 <= whole <= src.len() == dst.len(), and the loads and
        // stores are unaligned.
        unsafe {
            let h = _mm_loadu_si128(src.as_ptr().add(i).cast::<__m128i>());
            _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
        }
    }
    for (o, &h) in dst[whole..].iter_mut().zip(&src[whole..]) {
        *o = half::f16::from_bits(h).to_f32();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every finite value of `dtype` (a store holds no NaN or infinity)
    /// widens to the bits of the scalar conversion, at every tail length.
    fn every_finite_value_widens_like(dtype: Dtype, exponent: u16, scalar: fn(u16) -> f32) {
        if !has_simd(dtype) {
            eprintln!("skipping: this CPU has no vector path for {dtype} (the scalar one is used)");
            return;
        }
        let finite: Vec<u16> = (0..=u16::MAX)
            .filter(|b| b & exponent != exponent)
            .collect();
        let mut out = vec![0.0; finite.len()];
        widen(dtype, &finite, &mut out);
        for (&b, &w) in finite.iter().zip(&out) {
            assert_eq!(w.to_bits(), scalar(b).to_bits(), "{dtype} bits {b:#06x}");
        }
        for len in 0..20 {
            let mut o = vec![0.0; len];
            widen(dtype, &finite[1000..1000 + len], &mut o);
            assert_eq!(o, out[1000..1000 + len]);
        }
    }

    #[test]
    fn every_finite_half_widens_like_the_scalar_rule() {
        every_finite_value_widens_like(Dtype::F16, 0x7c00, |b| half::f16::from_bits(b).to_f32());
    }

    #[test]
    fn every_finite_bfloat16_widens_like_the_scalar_rule() {
        every_finite_value_widens_like(Dtype::Bf16, 0x7f80, |b| half::bf16::from_bits(b).to_f32());
    }

    #[test]
    fn stores_of_every_type_give_the_core_rows() {
        let data: Vec<f32> = (0..3 * 37).map(|i| (i as f32 - 50.0) * 0.731).collect();
        for dtype in Dtype::ALL {
            let store = RowStore::from_f32(data.clone(), 37, dtype).unwrap();
            let (mut a, mut b) = (Vec::new(), Vec::new());
            assert_eq!(
                rows_f32(&store, 1..3, &mut a),
                store.rows_f32(1..3, &mut b),
                "{dtype}"
            );
        }
    }
}

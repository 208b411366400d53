//! The integer product of the certified batch path's int8 bounds
//! ([`crate::certified`], docs/CONTRACTS.md §2.1): queries quantized to `i8`,
//! rows to `u8` (the `i8` code plus 128), their dot products summed exactly
//! in `i32` by AVX-512 VNNI (`vpdpbusd`: 64 byte products per instruction,
//! four times the multiply-adds of an f32 FMA), and each sum turned into an
//! approximate dot `fl(fl(fl(P)·1/sq)·1/sx)` in `f32` (`sq`, `sx` the
//! query's and the row's scales).
//!
//! Integer sums are exact in any order, so the product has no rounding to
//! bound but the conversion; the quantization error is bounded by the
//! caller from the codes' norms.
//!
//! # Layouts
//!
//! - Queries: `m` rows of `dp` codes (`dp`: `D` rounded up to a multiple of
//!   4, the padding zero), the row count padded to a multiple of
//!   [`TILE_QUERIES`] with zero rows.
//! - Rows: groups of [`GROUP_ROWS`] rows; within a group, for each step of 4
//!   dimensions, 4 panels of 16 rows of 4 bytes (256 bytes a step). Rows past
//!   the block's end hold the code 128 (a zero).
//!
//! Nothing here is canonical: the scores only decide which rows get a
//! canonical score.

/// Queries of one register tile.
pub(crate) const TILE_QUERIES: usize = 6;
/// Rows of one packed group (4 panels of 16).
pub(crate) const GROUP_ROWS: usize = 64;
/// Bytes of one 4-dimension step of a packed group.
const STEP_BYTES: usize = GROUP_ROWS * 4;

/// Whether this CPU runs the VNNI product.
pub(crate) fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vnni")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `dim` rounded up to a whole number of 4-byte steps.
pub(crate) fn padded_dim(dim: usize) -> usize {
    dim.div_ceil(4) * 4
}

/// Bytes of the packed rows of a block of `n` rows.
pub(crate) fn packed_len(n: usize, dp: usize) -> usize {
    n.div_ceil(GROUP_ROWS) * GROUP_ROWS * dp
}

/// Writes the `u8` codes (`code + 128`) of block row `row` into the packed
/// layout `out` (of [`packed_len`] bytes); `codes` holds `dp` values.
pub(crate) fn pack_row(out: &mut [u8], row: usize, dp: usize, codes: &[i8]) {
    let group = row / GROUP_ROWS;
    let lane = row % GROUP_ROWS; // panel * 16 + row within the panel
    let base = group * GROUP_ROWS * dp + lane * 4;
    for (s, c) in codes.chunks_exact(4).enumerate() {
        let at = base + s * STEP_BYTES;
        for (o, &v) in out[at..at + 4].iter_mut().zip(c) {
            *o = (v as u8) ^ 0x80; // v + 128 as u8
        }
    }
}

/// Exponent range of a vector's largest magnitude that the quantization
/// takes (`2^-60 ≤ max |x_d| < 2^61`): every scale and its inverse is then a
/// normal `f32`. Vectors outside it (or with subnormal values only) are
/// bounded by the f32 product instead.
const MAX_EXP: i32 = 60;
/// `1.5 · 2^23`: adding and subtracting it rounds an `f32` of magnitude
/// below `2^22` to the nearest integer, ties to even.
const ROUND: f32 = 12_582_912.0;

/// A vector's quantization: codes `a_d = round(fl(x_d · s))` in
/// `[-127, 127]` with the scale `s = fl(127 / max |x_d|)`, and the errors
/// `e_d = x_d · s − a_d` (real-valued; `|e_d|` is at most `1/2` plus the
/// rounding of `fl(x_d · s)`, and the bounds only use `Σ e_d²`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Quantized {
    /// `fl(1 / s)`: what the product multiplies the integer sums by.
    pub(crate) inv: f32,
    /// `Σ a_d²`, exact.
    pub(crate) code_sq: f64,
    /// An upper bound of `Σ e_d²`.
    pub(crate) err_sq: f64,
}

/// Quantizes `x` into `codes` (its first `x.len()` values; the rest are
/// zeroed) with the scale that maps its largest magnitude to 127; `None`
/// when that magnitude is outside the range the bounds are derived for (see
/// `MAX_EXP`). Input values are finite.
pub(crate) fn quantize(x: &[f32], codes: &mut [i8]) -> Option<Quantized> {
    assert!(
        codes.len() >= x.len(),
        "quantize: {} codes for {} values",
        codes.len(),
        x.len()
    );
    codes[x.len()..].fill(0);
    let max = x.iter().fold(0.0_f32, |m, &v| m.max(v.abs()));
    if max == 0.0 {
        codes[..x.len()].fill(0);
        return Some(Quantized {
            inv: 1.0,
            code_sq: 0.0,
            err_sq: 0.0,
        });
    }
    let biased = (max.to_bits() >> 23) as i32;
    let e = biased - 127;
    if biased == 0 || !(-MAX_EXP..=MAX_EXP).contains(&e) {
        return None;
    }
    // `s` and `1/s` lie in (2^-55, 2^68): normal. `fl(max·s) ≤ 127(1 + 2^-23)`
    // rounds to 127, so every code fits.
    let scale = 127.0 / max;
    let inv = 1.0 / scale;
    #[cfg(target_arch = "x86_64")]
    if available() {
        // SAFETY: AVX-512F and BW are available (checked just above).
        return Some(unsafe { vnni::quantize(x, scale, inv, &mut codes[..x.len()]) });
    }
    Some(quantize_with(x, scale, inv, &mut codes[..x.len()]))
}

/// The quantization loop: 16 lanes of integer and `f32` sums, so that the
/// compiler can keep them in vectors.
#[inline(always)]
fn quantize_with(x: &[f32], scale: f32, inv: f32, codes: &mut [i8]) -> Quantized {
    let mut csq = [0_i32; 16];
    let mut esq = [0.0_f32; 16];
    for (xc, cc) in x.chunks(16).zip(codes.chunks_mut(16)) {
        for (l, (&v, c)) in xc.iter().zip(cc.iter_mut()).enumerate() {
            let p = v * scale;
            let r = (p + ROUND) - ROUND;
            let a = r as i32;
            *c = a as i8;
            // `x_d·s − a_d` rounded once (a fused multiply-add): off by at
            // most 2^-24 of itself, or 2^-150 where it is subnormal.
            let err = v.mul_add(scale, -r);
            csq[l] += a * a;
            esq[l] += err * err;
        }
    }
    // Codes: at most 127² · 2^12 per lane (D ≤ 2^16), exact in i32.
    let code_sq = csq.iter().map(|&v| f64::from(v)).sum();
    // Errors: each one rounded once, each square once, summed in f32 over at
    // most D/16 + 16 ≤ 2^12 + 16 roundings: relative error below 2^-11,
    // covered by 2^-8; 2^-270 per value covers a subnormal error's 2^-150
    // (its square is below 2^-252).
    let e: f64 = esq.iter().map(|&v| f64::from(v)).sum();
    let err_sq = e * (1.0 + 1.0 / 256.0) + f64::from(x.len() as u32) * 2f64.powi(-270);
    Quantized {
        inv,
        code_sq,
        err_sq,
    }
}

/// The operands of one product: `m` queries of `dp` codes (padded to a
/// multiple of [`TILE_QUERIES`] rows), their code sums and scales, and a
/// packed block of `n` rows with their scales.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Operands<'a> {
    /// Queries (before padding).
    pub(crate) m: usize,
    /// Block rows.
    pub(crate) n: usize,
    /// Codes per vector (a multiple of 4).
    pub(crate) dp: usize,
    pub(crate) queries: &'a [i8],
    /// `Σ_d q_jd` per query, which removes the rows' offset of 128.
    pub(crate) qsum: &'a [i32],
    pub(crate) qscale: &'a [f32],
    /// The packed `x + 128`.
    pub(crate) rows: &'a [u8],
    pub(crate) xscale: &'a [f32],
}

impl Operands<'_> {
    /// Checks every length the kernel reads, and `out`'s.
    ///
    /// # Panics
    /// When one does not match the shape.
    fn check(&self, out: &[f32]) {
        let Operands { m, n, dp, .. } = *self;
        let mp = m.div_ceil(TILE_QUERIES) * TILE_QUERIES;
        assert!(
            dp % 4 == 0
                && self.queries.len() == mp * dp
                && self.qsum.len() >= m
                && self.qscale.len() >= m
                && self.rows.len() == packed_len(n, dp)
                && self.xscale.len() >= n
                && out.len() == m * n,
            "int8 product: m={m} n={n} dp={dp} against lengths {}, {}, {}, {}, {}, {}",
            self.queries.len(),
            self.qsum.len(),
            self.qscale.len(),
            self.rows.len(),
            self.xscale.len(),
            out.len()
        );
    }
}

/// `out[j * n + i] = fl(P_ji) · qscale[j] · xscale[i]` with `P_ji =
/// Σ_d q_jd · x_id` in exact integer arithmetic.
///
/// # Panics
/// When a slice does not match the shape, or the CPU lacks VNNI.
pub(crate) fn product(ops: Operands<'_>, out: &mut [f32]) {
    ops.check(out);
    assert!(available(), "int8 product: this CPU lacks AVX-512 VNNI");
    #[cfg(target_arch = "x86_64")]
    // SAFETY: VNNI, AVX-512F and BW are available (asserted above), and
    // `check` checks every length the kernel reads or writes.
    unsafe {
        vnni::product(ops, out);
    }
}

/// The same product in plain Rust, for tests.
#[cfg(test)]
pub(crate) fn product_scalar(ops: Operands<'_>, out: &mut [f32]) {
    ops.check(out);
    let Operands { m, n, dp, .. } = ops;
    for j in 0..m {
        for i in 0..n {
            let (group, lane) = (i / GROUP_ROWS, i % GROUP_ROWS);
            let mut acc: i32 = 0;
            for d in 0..dp {
                let at = group * GROUP_ROWS * dp + (d / 4) * STEP_BYTES + lane * 4 + d % 4;
                acc =
                    acc.wrapping_add(i32::from(ops.queries[j * dp + d]) * i32::from(ops.rows[at]));
            }
            let p = acc.wrapping_sub(ops.qsum[j].wrapping_mul(128));
            out[j * n + i] = p as f32 * ops.qscale[j] * ops.xscale[i];
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod vnni {
    use std::arch::x86_64::*;

    use super::{Operands, GROUP_ROWS, STEP_BYTES, TILE_QUERIES};

    /// See [`super::product`].
    ///
    /// # Safety
    /// AVX-512F, BW and VNNI must be available and the operands must pass
    /// [`Operands::check`] against `out`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub(super) unsafe fn product(ops: Operands<'_>, out: &mut [f32]) {
        let Operands {
            m,
            n,
            dp,
            queries,
            qsum,
            qscale,
            rows,
            xscale,
        } = ops;
        let steps = dp / 4;
        let groups = n.div_ceil(GROUP_ROWS);
        for g in 0..groups {
            let panel = rows[g * GROUP_ROWS * dp..(g + 1) * GROUP_ROWS * dp].as_ptr();
            let row0 = g * GROUP_ROWS;
            let live = (n - row0).min(GROUP_ROWS);
            // Row scales of the group, zero past the block's end.
            let mut xs = [0.0_f32; GROUP_ROWS];
            xs[..live].copy_from_slice(&xscale[row0..row0 + live]);
            let mut j0 = 0;
            while j0 < m {
                let t = (m - j0).min(TILE_QUERIES);
                let q = queries[j0 * dp..(j0 + TILE_QUERIES) * dp].as_ptr();
                let dst = Dst {
                    j0,
                    row0,
                    live,
                    xs: &xs,
                };
                // A tile as tall as the queries left, so that a single query
                // (or the batch's last few) multiplies only its own codes.
                // SAFETY: `panel` holds `steps` steps of STEP_BYTES and `q`
                // TILE_QUERIES ≥ t rows of `dp` codes (the caller's lengths).
                unsafe {
                    match t {
                        1 => dst.store(&tile::<1>(q, dp, panel, steps), qsum, qscale, n, out),
                        2 => dst.store(&tile::<2>(q, dp, panel, steps), qsum, qscale, n, out),
                        3 => dst.store(&tile::<3>(q, dp, panel, steps), qsum, qscale, n, out),
                        4 => dst.store(&tile::<4>(q, dp, panel, steps), qsum, qscale, n, out),
                        5 => dst.store(&tile::<5>(q, dp, panel, steps), qsum, qscale, n, out),
                        _ => dst.store(
                            &tile::<TILE_QUERIES>(q, dp, panel, steps),
                            qsum,
                            qscale,
                            n,
                            out,
                        ),
                    }
                }
                j0 += t;
            }
        }
    }

    /// Where one tile's sums go: queries from `j0`, the group's rows from
    /// `row0` (`live` of them) and their scales `xs` (zero past the end).
    struct Dst<'a> {
        j0: usize,
        row0: usize,
        live: usize,
        xs: &'a [f32; GROUP_ROWS],
    }

    impl Dst<'_> {
        /// Writes `fl(fl(P − 128 Σq)·qscale)·xscale` of every query of the
        /// tile into `out` (rows of `n`).
        ///
        /// # Safety
        /// AVX-512F must be available; `out` holds the tile's queries' rows
        /// (`j0 + acc.len() ≤ m`, `row0 + live ≤ n`).
        #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
        unsafe fn store(
            &self,
            acc: &[[__m512i; 4]],
            qsum: &[i32],
            qscale: &[f32],
            n: usize,
            out: &mut [f32],
        ) {
            let Dst { j0, row0, live, xs } = *self;
            for (t, row) in acc.iter().enumerate() {
                let j = j0 + t;
                let corr = _mm512_set1_epi32(qsum[j].wrapping_mul(128));
                let qs = _mm512_set1_ps(qscale[j]);
                let dst = &mut out[j * n + row0..j * n + row0 + live];
                for (p, &v) in row.iter().enumerate() {
                    let lanes = (live.saturating_sub(p * 16)).min(16);
                    if lanes == 0 {
                        break;
                    }
                    let s = _mm512_cvtepi32_ps(_mm512_sub_epi32(v, corr));
                    // SAFETY: `xs` holds 64 values; p < 4.
                    let x = unsafe { _mm512_loadu_ps(xs.as_ptr().add(p * 16)) };
                    let s = _mm512_mul_ps(_mm512_mul_ps(s, qs), x);
                    let mask: __mmask16 = if lanes == 16 {
                        0xFFFF
                    } else {
                        (1u16 << lanes) - 1
                    };
                    // SAFETY: the mask keeps the store inside `dst`
                    // (lanes ≤ its length past p * 16).
                    unsafe { _mm512_mask_storeu_ps(dst.as_mut_ptr().add(p * 16), mask, s) };
                }
            }
        }
    }

    /// See [`super::quantize`].
    ///
    /// # Safety
    /// AVX-512F and BW must be available.
    #[target_feature(enable = "avx512f,avx512bw,fma")]
    pub(super) unsafe fn quantize(
        x: &[f32],
        scale: f32,
        inv: f32,
        codes: &mut [i8],
    ) -> super::Quantized {
        super::quantize_with(x, scale, inv, codes)
    }

    /// The `i32` sums of `T` queries against one packed group:
    /// `acc[t][p]` holds rows `16p..16p + 16` for query `t`.
    ///
    /// # Safety
    /// `q` must point to `T` rows of `dp` codes and `panel` to `steps` steps
    /// of STEP_BYTES bytes; VNNI must be available.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    #[inline]
    unsafe fn tile<const T: usize>(
        q: *const i8,
        dp: usize,
        panel: *const u8,
        steps: usize,
    ) -> [[__m512i; 4]; T] {
        let mut acc = [[_mm512_setzero_si512(); 4]; T];
        for s in 0..steps {
            // SAFETY: s < steps, so the step's 256 bytes lie in the panel.
            let p = unsafe { panel.add(s * STEP_BYTES) };
            // SAFETY: the four 64-byte panels of that step.
            let r = unsafe {
                [
                    _mm512_loadu_si512(p.cast()),
                    _mm512_loadu_si512(p.add(64).cast()),
                    _mm512_loadu_si512(p.add(128).cast()),
                    _mm512_loadu_si512(p.add(192).cast()),
                ]
            };
            for (t, a) in acc.iter_mut().enumerate() {
                // SAFETY: 4 codes of query t at dimension 4s, inside its row.
                let w = unsafe { q.add(t * dp + s * 4).cast::<i32>().read_unaligned() };
                let b = _mm512_set1_epi32(w);
                for (av, &rv) in a.iter_mut().zip(&r) {
                    *av = _mm512_dpbusd_epi32(*av, rv, b);
                }
            }
        }
        acc
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(seed: &mut u64) -> u64 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        *seed >> 33
    }

    /// Random codes, every extreme included, over ragged shapes: the VNNI
    /// product equals the scalar one bit for bit.
    #[test]
    fn the_vnni_product_matches_the_scalar_one() {
        if !available() {
            assert!(
                std::env::var_os("TOPK_REQUIRE_AVX512").is_none_or(|v| v != "1"),
                "TOPK_REQUIRE_AVX512=1 but this CPU lacks AVX-512 VNNI"
            );
            eprintln!("skipped: this CPU lacks AVX-512 VNNI");
            return;
        }
        let mut seed = 7;
        for (m, n, d) in [
            (1_usize, 1_usize, 1_usize),
            (6, 64, 4),
            (7, 65, 9),
            (2, 64, 384),
            (3, 100, 100),
            (4, 128, 1024),
            (5, 63, 17),
            (11, 64, 64),
            (13, 200, 384),
            (25, 512, 1023),
        ] {
            let dp = padded_dim(d);
            let mp = m.div_ceil(TILE_QUERIES) * TILE_QUERIES;
            let mut queries = vec![0_i8; mp * dp];
            let mut qsum = vec![0_i32; m];
            for j in 0..m {
                for c in 0..d {
                    let v = match lcg(&mut seed) % 5 {
                        0 => -127,
                        1 => 127,
                        _ => (lcg(&mut seed) % 255) as i32 - 127,
                    };
                    queries[j * dp + c] = v as i8;
                    qsum[j] += v;
                }
            }
            let mut rows = vec![0x80_u8; packed_len(n, dp)];
            let mut codes = vec![0_i8; dp];
            for i in 0..n {
                for c in codes.iter_mut().take(d) {
                    *c = ((lcg(&mut seed) % 255) as i32 - 127) as i8;
                }
                pack_row(&mut rows, i, dp, &codes);
            }
            let qscale: Vec<f32> = (0..m).map(|j| 2f32.powi(j as i32 % 7 - 3)).collect();
            let xscale: Vec<f32> = (0..n).map(|i| 2f32.powi(i as i32 % 5 - 2)).collect();
            let ops = Operands {
                m,
                n,
                dp,
                queries: &queries,
                qsum: &qsum,
                qscale: &qscale,
                rows: &rows,
                xscale: &xscale,
            };
            let mut got = vec![f32::NAN; m * n];
            let mut want = vec![f32::NAN; m * n];
            product(ops, &mut got);
            product_scalar(ops, &mut want);
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(g.to_bits(), w.to_bits(), "m={m} n={n} d={d} at {i}");
            }
        }
    }
}

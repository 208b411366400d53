//! The int8 product's inputs: queries and row blocks quantized with the
//! scale that maps each vector's largest magnitude to 127, and the factors
//! of the product's error bound (docs/CONTRACTS.md §2.1, "The int8
//! product").
//!
//! With `q_d·sq = a_d + e_d` and `x_d·sx = b_d + f_d` (codes `a`, `b`, real
//! errors `e`, `f`), the exact integer sum `P = Σ a_d b_d` satisfies
//! `q·x·sq·sx − P = Σ (a_d f_d + e_d b_d + e_d f_d)`, at most
//! `‖a‖‖f‖ + ‖e‖(‖b‖ + ‖f‖)` by Cauchy–Schwarz. In the scores' units that is
//! `a1·u1 + a2·u2` with `a1 = ‖a‖/sq`, `a2 = ‖e‖/sq` per query and
//! `u1 = ‖f‖/sx`, `u2 = (‖b‖ + ‖f‖)/sx` per row, every norm rounded up.

use rayon::prelude::*;

use super::bounds::up;
use super::BLOCK_ROWS;
use crate::corpus::CorpusRef;
use crate::kernels::int8::{self, quantize, Operands, Quantized, TILE_QUERIES};

/// `1 + 2^-18`: the query factors' margin. It covers the roundings of the
/// factors (the inverse scales `fl(1/s)` and the products by them, two per
/// factor on each side), the three of evaluating `a1·u1 + a2·u2`, and the
/// conversion `fl(fl(fl(P)·iq)·ix)`'s five, at most `5u` times a quantity
/// below the bound plus `‖q‖‖x‖` (the latter covered by `C_D`): 12`u` in
/// all against the margin's 64`u`.
const MARGIN: f32 = 1.0 + 1.0 / 262_144.0;

/// Per query: `Σ a_d`, `fl(1/sq)` and `(a1, a2)`.
type QueryTerms = (i32, f32, (f32, f32));

/// The quantized queries of one batch.
#[derive(Debug)]
pub(super) struct QueryCodes {
    /// Codes per query (`D` rounded up to a multiple of 4).
    pub(super) dp: usize,
    /// `(Q + TILE_QUERIES) × dp` codes, the padding zero.
    codes: Vec<i8>,
    /// `Σ_d a_d` per query.
    sum: Vec<i32>,
    /// `fl(1/sq)` per query.
    scale: Vec<f32>,
    /// `(a1, a2)` per query.
    pub(super) factors: Vec<(f32, f32)>,
}

impl QueryCodes {
    /// Quantizes `q` queries of `dim` values; `None` where one lies outside
    /// the quantization's range (the batch then takes the f32 product).
    pub(super) fn of(data: &[f32], dim: usize) -> Option<QueryCodes> {
        let q = data.len() / dim;
        let dp = int8::padded_dim(dim);
        let mut codes = vec![0_i8; (q + TILE_QUERIES) * dp];
        let done: Option<Vec<QueryTerms>> = data
            .par_chunks(dim)
            .zip(codes.par_chunks_mut(dp))
            .map(|(x, c)| {
                let z = quantize(x, c)?;
                let sum = c.iter().map(|&v| i32::from(v)).sum();
                let inv = z.inv;
                let a1 = up(z.code_sq.sqrt()) * inv * MARGIN;
                let a2 = up(z.err_sq.sqrt()) * inv * MARGIN;
                Some((sum, inv, (a1.next_up(), a2.next_up())))
            })
            .collect();
        let done = done?;
        let mut sum = Vec::with_capacity(q);
        let mut scale = Vec::with_capacity(q);
        let mut factors = Vec::with_capacity(q);
        for (s, i, f) in done {
            sum.push(s);
            scale.push(i);
            factors.push(f);
        }
        Some(QueryCodes {
            dp,
            codes,
            sum,
            scale,
            factors,
        })
    }
}

/// The corpus quantized once for the int8 product, block by block (the
/// certified path's row blocks); a block with a row outside the
/// quantization's range is `None` and takes the f32 product. One byte per
/// stored value and three `f32` per row.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct CorpusCodes {
    blocks: Vec<Option<RowCodes>>,
}

impl CorpusCodes {
    /// Quantizes every block of [`BLOCK_ROWS`] rows of `corpus`, in parallel.
    pub(crate) fn of(corpus: CorpusRef<'_>) -> CorpusCodes {
        let mut codes = CorpusCodes { blocks: Vec::new() };
        codes.update_from(corpus, 0);
        codes
    }

    /// Quantizes again every block from the one holding row `first` on, for
    /// a corpus whose rows from `first` on changed, were appended or were
    /// dropped; the blocks before it are kept.
    pub(crate) fn update_from(&mut self, corpus: CorpusRef<'_>, first: usize) {
        let n = corpus.len();
        let b0 = (first / BLOCK_ROWS).min(self.blocks.len());
        self.blocks.truncate(b0);
        let more: Vec<Option<RowCodes>> = (b0..n.div_ceil(BLOCK_ROWS))
            .into_par_iter()
            .map_init(Vec::new, |wide, b| block_codes(corpus, b, wide))
            .collect();
        self.blocks.extend(more);
    }

    /// Quantizes again the blocks `blocks` (whose rows changed), in
    /// parallel.
    pub(crate) fn refresh_blocks(&mut self, corpus: CorpusRef<'_>, blocks: &[usize]) {
        let have = self.blocks.len();
        let fresh: Vec<(usize, Option<RowCodes>)> = blocks
            .par_iter()
            .filter(|&&b| b < have)
            .map_init(Vec::new, |wide, &b| (b, block_codes(corpus, b, wide)))
            .collect();
        for (b, codes) in fresh {
            self.blocks[b] = codes;
        }
    }

    /// Block `b`'s codes, `None` where it takes the f32 product.
    pub(super) fn block(&self, b: usize) -> Option<&RowCodes> {
        self.blocks.get(b).and_then(Option::as_ref)
    }
}

/// Block `b` of `corpus` quantized (`wide`: scratch for half-width rows).
fn block_codes(corpus: CorpusRef<'_>, b: usize, wide: &mut Vec<f32>) -> Option<RowCodes> {
    let n = corpus.len();
    let range = b * BLOCK_ROWS..((b + 1) * BLOCK_ROWS).min(n);
    RowCodes::of(corpus.rows(range, wide), corpus.dim())
}

/// One row block quantized and packed for the product, with its error
/// factors.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct RowCodes {
    packed: Vec<u8>,
    scale: Vec<f32>,
    pub(super) u1: Vec<f32>,
    pub(super) u2: Vec<f32>,
    n: usize,
}

impl RowCodes {
    /// Quantizes the rows of `block` (`dim` values each); `None` where one
    /// lies outside the quantization's range (the block then takes the f32
    /// product).
    pub(super) fn of(block: &[f32], dim: usize) -> Option<RowCodes> {
        let dp = int8::padded_dim(dim);
        let n = block.len() / dim;
        let mut codes = vec![0_i8; dp];
        let mut out = RowCodes {
            packed: vec![0x80; int8::packed_len(n, dp)],
            scale: Vec::with_capacity(n),
            u1: Vec::with_capacity(n),
            u2: Vec::with_capacity(n),
            n,
        };
        for (i, x) in block.chunks_exact(dim).enumerate() {
            let Quantized {
                inv,
                code_sq,
                err_sq,
            } = quantize(x, &mut codes)?;
            int8::pack_row(&mut out.packed, i, dp, &codes);
            let (b, f) = (code_sq.sqrt(), err_sq.sqrt());
            out.scale.push(inv);
            out.u1.push(up(f) * inv);
            out.u2.push(up(b + f) * inv);
        }
        Some(out)
    }

    /// `out[j * n + i]`: the approximate dots of queries `q0..q0 + m` of
    /// `queries` against this block's rows.
    pub(super) fn product(&self, queries: &QueryCodes, q0: usize, m: usize, out: &mut [f32]) {
        let dp = queries.dp;
        let mp = m.div_ceil(TILE_QUERIES) * TILE_QUERIES;
        let ops = Operands {
            m,
            n: self.n,
            dp,
            queries: &queries.codes[q0 * dp..(q0 + mp) * dp],
            qsum: &queries.sum[q0..q0 + m],
            qscale: &queries.scale[q0..q0 + m],
            rows: &self.packed,
            xscale: &self.scale,
        };
        // The library takes this path only where the CPU has VNNI
        // (`certified.rs`); tests elsewhere check the same exact integer
        // product in plain Rust.
        #[cfg(test)]
        if !int8::available() {
            return int8::product_scalar(ops, out);
        }
        int8::product(ops, out);
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use topk_testkit::corpora::{self, Kind, Rng};

    use super::{QueryCodes, RowCodes};
    use crate::kernels::int8;

    /// Vectors of one kind at scale `2^scale`: uniform; on (or within an ulp
    /// of) rounding ties, `(j + 1/2)/127` of the largest value; one large
    /// value among tiny ones; all equal.
    fn vectors(rng: &mut Rng, n: usize, d: usize, scale: i32, kind: usize) -> Vec<f32> {
        let f = 2_f32.powi(scale);
        (0..n * d)
            .map(|i| match kind {
                0 => rng.unit() * f,
                1 if i % d == 0 => f,
                1 => ((rng.below(254) as f32 - 127.0) + 0.5) / 127.0 * f,
                2 if i % d == 0 => f,
                2 => rng.unit() * f * 1e-6,
                _ => f * 0.75,
            })
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        /// The int8 product's approximate dot lies within `a1·u1 + a2·u2`
        /// of the exact dot (plus the conversion's `5u·|q·x|`, which `C_D`
        /// covers, and the subnormal term), at every scale and shape, on
        /// rounding ties and spikes: the derivation checked against `f64`.
        #[test]
        fn the_int8_error_bound_holds(
            seed: u64,
            m in 1usize..14,
            n in 1usize..150,
            d in 1usize..700,
            qscale in -55i32..50,
            xscale in -55i32..50,
            qkind in 0usize..4,
            xkind in 0usize..4,
        ) {
            let mut rng = Rng::new(seed);
            let q = vectors(&mut rng, m, d, qscale, qkind);
            let x = vectors(&mut rng, n, d, xscale, xkind);
            let queries = QueryCodes::of(&q, d).expect("in range");
            let rows = RowCodes::of(&x, d).expect("in range");
            let mut out = vec![f32::NAN; m * n];
            rows.product(&queries, 0, m, &mut out);
            for j in 0..m {
                let (a1, a2) = queries.factors[j];
                for i in 0..n {
                    let (qv, xv) = (&q[j * d..(j + 1) * d], &x[i * d..(i + 1) * d]);
                    let exact: f64 = qv.iter().zip(xv).map(|(&a, &b)| f64::from(a) * f64::from(b)).sum();
                    let mag: f64 = qv.iter().zip(xv).map(|(&a, &b)| (f64::from(a) * f64::from(b)).abs()).sum();
                    let bound = f64::from(a1) * f64::from(rows.u1[i]) + f64::from(a2) * f64::from(rows.u2[i]);
                    let conv = 5.0 * 2f64.powi(-24) * exact.abs();
                    let slack = conv + mag * 2f64.powi(-50) + 2f64.powi(-140);
                    let err = (f64::from(out[j * n + i]) - exact).abs();
                    prop_assert!(
                        err <= bound + slack,
                        "query {j} row {i}: |s̃ − q·x| = {err:e} above {bound:e} (s̃ {}, q·x {exact:e})",
                        out[j * n + i]
                    );
                }
            }
        }
    }

    /// On uniform rows the width is a few percent of `‖q‖‖x‖`: tight enough
    /// for the cut to leave out nearly every row.
    #[test]
    fn the_width_is_a_few_percent() {
        let d = 384;
        let q = corpora::corpus(1, 4, d, &[Kind::Uniform]);
        let x = corpora::corpus(2, 64, d, &[Kind::Uniform]);
        let queries = QueryCodes::of(&q, d).unwrap();
        let rows = RowCodes::of(&x, d).unwrap();
        let norm = |v: &[f32]| {
            v.iter()
                .map(|&a| f64::from(a) * f64::from(a))
                .sum::<f64>()
                .sqrt()
        };
        for (j, &(a1, a2)) in queries.factors.iter().enumerate() {
            for i in 0..64 {
                let w = f64::from(a1 * rows.u1[i] + a2 * rows.u2[i]);
                let rel = w / (norm(&q[j * d..(j + 1) * d]) * norm(&x[i * d..(i + 1) * d]));
                assert!(rel < 0.02, "query {j} row {i}: width {rel} of ‖q‖‖x‖");
            }
        }
    }

    /// Largest magnitudes outside `[2^-60, 2^61)` are not quantized: such
    /// a batch or block takes the f32 product.
    #[test]
    fn out_of_range_vectors_are_left_to_the_f32_product() {
        let d = 8;
        for v in [2_f32.powi(-61), 1e-40, 2_f32.powi(62)] {
            let mut x = vec![0.25_f32; 3 * d];
            x[d..2 * d].fill(v);
            assert!(QueryCodes::of(&x, d).is_none(), "{v:e}");
            assert!(RowCodes::of(&x, d).is_none(), "{v:e}");
        }
        let mut codes = vec![0_i8; int8::padded_dim(d)];
        let z = int8::quantize(&[0.0; 8], &mut codes).unwrap();
        assert_eq!((z.inv, z.code_sq, z.err_sq), (1.0, 0.0, 0.0));
        assert!(int8::quantize(&[2_f32.powi(-60); 8], &mut codes).is_some());
    }
}

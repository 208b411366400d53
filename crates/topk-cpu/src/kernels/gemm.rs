//! The GEMM of the certified batch path ([`crate::certified`]): approximate
//! dot products of a block of queries against a block of rows, through
//! `faer`'s single-threaded matrix product, in whatever summation order it
//! picks. Nothing here is canonical; the bounds of `crate::certified` hold for
//! any order of a classical (non-Strassen) product.

use faer::linalg::matmul::matmul;
use faer::{Accum, MatMut, MatRef, Par};

/// `out[i * n + j] ≈ Σ_d a[i * k + d] · b[j * k + d]`: the `m × n` product
/// of an `m × k` row-major block `a` and the transpose of an `n × k`
/// row-major block `b`, on the calling thread.
///
/// # Panics
/// When a slice's length does not match its shape (callers size them).
pub(crate) fn gemm_nt(a: &[f32], b: &[f32], m: usize, n: usize, k: usize, out: &mut [f32]) {
    assert!(
        a.len() == m * k && b.len() == n * k && out.len() == m * n,
        "gemm_nt: shapes {m}×{k}, {n}×{k}, {m}×{n} against lengths {}, {}, {}",
        a.len(),
        b.len(),
        out.len()
    );
    let lhs = MatRef::from_row_major_slice(a, m, k);
    let rhs = MatRef::from_row_major_slice(b, n, k).transpose();
    let dst = MatMut::from_row_major_slice_mut(out, m, n);
    // Threads come from rayon around this call (row blocks), not from faer.
    matmul(dst, Accum::Replace, lhs, rhs, 1.0, Par::Seq);
}

#[cfg(test)]
mod tests {
    use super::gemm_nt;

    #[test]
    fn small_integer_products_are_exact() {
        // Integers this small make every product and sum exact in any order.
        let (m, n, k) = (3, 5, 7);
        let a: Vec<f32> = (0..m * k).map(|i| (i % 5) as f32 - 2.0).collect();
        let b: Vec<f32> = (0..n * k).map(|i| (i % 3) as f32 - 1.0).collect();
        let mut out = vec![f32::NAN; m * n];
        gemm_nt(&a, &b, m, n, k, &mut out);
        for i in 0..m {
            for j in 0..n {
                let want: f32 = (0..k).map(|d| a[i * k + d] * b[j * k + d]).sum();
                assert_eq!(out[i * n + j], want, "({i}, {j})");
            }
        }
    }

    #[test]
    fn an_empty_inner_dimension_gives_zeros() {
        let mut out = vec![f32::NAN; 6];
        gemm_nt(&[], &[], 2, 3, 0, &mut out);
        assert_eq!(out, vec![0.0; 6]);
    }
}

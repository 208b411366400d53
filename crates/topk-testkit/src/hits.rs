//! Hit lists compared bit for bit, and rows built from vectors: what the
//! index and sharded-index history tests share.

use ndarray::Array2;
use topk_core::Hit;

/// `Ok` when `got` and `want` hold the same ids in the same order with the
/// same score bits (`-0.0` and `+0.0` differ); otherwise the first
/// difference, in words.
pub fn same_hits(got: &[Hit], want: &[Hit]) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!(
            "{} hits, expected {}: {got:?} vs {want:?}",
            got.len(),
            want.len()
        ));
    }
    for (rank, (g, w)) in got.iter().zip(want).enumerate() {
        if g.id != w.id || g.score.to_bits() != w.score.to_bits() {
            return Err(format!("rank {rank}: got {g:?}, expected {w:?}"));
        }
    }
    Ok(())
}

/// The `N × d` matrix of `vectors` (each `d` long); `0 × d` when they do
/// not make one.
pub fn rows_of(vectors: &[Vec<f32>], d: usize) -> Array2<f32> {
    let flat: Vec<f32> = vectors.iter().flatten().copied().collect();
    Array2::from_shape_vec((vectors.len(), d), flat).unwrap_or_else(|_| Array2::zeros((0, d)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn score_bits_and_order_count() {
        let a = [Hit::new(1, 0.0), Hit::new(2, 1.0)];
        assert!(same_hits(&a, &a).is_ok());
        assert!(same_hits(&a, &[Hit::new(1, -0.0), Hit::new(2, 1.0)]).is_err());
        assert!(same_hits(&a, &a[..1]).is_err());
        assert_eq!(rows_of(&[vec![1.0, 2.0], vec![3.0, 4.0]], 2).dim(), (2, 2));
        assert_eq!(rows_of(&[vec![1.0]], 2).dim(), (0, 2));
    }
}

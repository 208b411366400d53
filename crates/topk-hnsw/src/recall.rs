//! Recall of approximate results against exact ground truth.
//!
//! `recall@k` is the fraction of the true `k` nearest rows that a search
//! returned among its first `k`, averaged over queries. The ground truth is
//! a list of row ids per query, best first: the exact oracle's answer, or
//! rows of an `.ivecs`/`.npy` file read through topk-io (whose readers honour
//! the per-row header of `.ivecs`, the mistake that invalidated earlier
//! published recall figures).

use topk_core::Neighbor;

use crate::error::{HnswError, Result};

/// Mean `recall@k` of `results` (one list per query, best first) against
/// `ground_truth` (one id list per query, best first, at least `k` long).
///
/// Errors when the two lists cover different numbers of queries, when
/// `k = 0`, or when a ground-truth row is shorter than `k`.
pub fn recall_at_k<T: AsRef<[u32]>>(
    results: &[Vec<Neighbor>],
    ground_truth: &[T],
    k: usize,
) -> Result<f64> {
    if results.len() != ground_truth.len() {
        return Err(HnswError::RecallShape {
            results: results.len(),
            truth: ground_truth.len(),
        });
    }
    if k == 0 {
        return Err(topk_core::Error::ZeroK.into());
    }
    if results.is_empty() {
        return Ok(1.0);
    }
    let mut hits = 0usize;
    // Sized by the truth lists, not by `k` (which may be any value).
    let mut truth: Vec<u32> = Vec::new();
    for (q, (res, gt)) in results.iter().zip(ground_truth).enumerate() {
        let gt = gt.as_ref();
        if gt.len() < k {
            return Err(HnswError::TruthTooShort {
                query: q,
                have: gt.len(),
                k,
            });
        }
        truth.clear();
        truth.extend_from_slice(&gt[..k]);
        truth.sort_unstable();
        hits += res
            .iter()
            .take(k)
            .filter(|n| truth.binary_search(&n.index).is_ok())
            .count();
    }
    Ok(hits as f64 / (results.len() * k) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn res(ids: &[u32]) -> Vec<Neighbor> {
        ids.iter().map(|&i| Neighbor::new(i, 0.0)).collect()
    }

    #[test]
    fn counts_overlap_of_the_first_k() {
        let results = vec![res(&[1, 2, 3]), res(&[7, 8, 9])];
        let truth = vec![vec![3, 2, 1, 0], vec![7, 0, 0, 0]];
        // k = 3: query 0 has 3 of {3, 2, 1}, query 1 has 1 of {7, 0}.
        assert_eq!(recall_at_k(&results, &truth, 3).unwrap(), 4.0 / 6.0);
        // k = 2: {1, 2} vs {3, 2} and {7, 8} vs {7, 0}: one hit each.
        assert_eq!(recall_at_k(&results, &truth, 2).unwrap(), 2.0 / 4.0);
    }

    #[test]
    fn shape_errors_name_the_values() {
        let e = recall_at_k(&[res(&[1])], &[vec![1u32], vec![2]], 1).unwrap_err();
        assert!(
            matches!(
                e,
                HnswError::RecallShape {
                    results: 1,
                    truth: 2
                }
            ),
            "{e}"
        );
        let e = recall_at_k(&[res(&[1])], &[vec![1u32]], 2).unwrap_err();
        assert!(
            matches!(
                e,
                HnswError::TruthTooShort {
                    query: 0,
                    have: 1,
                    k: 2
                }
            ),
            "{e}"
        );
        let e = recall_at_k(&[res(&[1])], &[vec![1u32]], 0).unwrap_err();
        assert!(matches!(e, HnswError::Input(topk_core::Error::ZeroK)));
        // Any k past the truth is that error, never an allocation of k.
        for k in [usize::MAX, 1 << 40] {
            let e = recall_at_k(&[res(&[])], &[vec![0u32]], k).unwrap_err();
            assert!(matches!(e, HnswError::TruthTooShort { have: 1, .. }), "{e}");
        }
    }
}

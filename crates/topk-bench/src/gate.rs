//! The correctness gate: before a configuration is timed, its answers are
//! compared with a reference bit for bit (row indices and score bits). A
//! configuration that fails is reported with `correct = false` and never timed.
//!
//! References are computed once per corpus with the largest K of the sweep:
//! the result order is total (docs/CONTRACTS.md §3), so the best `k` rows are always
//! the first `k` of the best `K ≥ k`, and one oracle pass serves every K.

use std::fmt;

use ndarray::ArrayView2;
use rayon::prelude::*;
use topk_core::{Metric, Neighbor, Retriever};

use crate::error::Result;

/// Expected answers for the first `answers.len()` queries of a workload.
#[derive(Debug, Clone, PartialEq)]
pub struct Reference {
    /// Who computed them (`oracle`, `cpu`), for the record's `gate` field.
    pub label: String,
    /// Neighbours best first, computed with `k_max` results.
    pub answers: Vec<Vec<Neighbor>>,
    /// The K the answers were computed with.
    pub k_max: usize,
}

impl Reference {
    /// Answers the first `count` rows of `queries` with `retriever` at `k_max`,
    /// queries in parallel (the oracle is single-threaded per query).
    pub fn compute(
        label: &str,
        retriever: &dyn Retriever,
        queries: ArrayView2<'_, f32>,
        count: usize,
        k_max: usize,
    ) -> Result<Reference> {
        let count = count.min(queries.nrows());
        let answers = (0..count)
            .into_par_iter()
            .map(|i| {
                let row = queries.row(i).to_vec();
                retriever.search(&row, k_max)
            })
            .collect::<topk_core::Result<Vec<_>>>()?;
        Ok(Reference {
            label: label.to_owned(),
            answers,
            k_max,
        })
    }

    /// Answers the first `count` rows of `queries` through the backend's batch
    /// path (used for a multi-threaded backend, whose batch search is fast).
    pub fn compute_batch(
        label: &str,
        retriever: &dyn Retriever,
        queries: ArrayView2<'_, f32>,
        count: usize,
        k_max: usize,
    ) -> Result<Reference> {
        let count = count.min(queries.nrows());
        let answers = retriever.search_batch(queries.slice(ndarray::s![..count, ..]), k_max)?;
        Ok(Reference {
            label: label.to_owned(),
            answers,
            k_max,
        })
    }

    /// The references' summary for a record: `oracle:4` for the oracle on
    /// the first 4 queries, several joined with `+`. A single-query
    /// configuration gates every referenced query; a batch only those inside it.
    pub fn describe(refs: &[&Reference], batch: usize) -> String {
        refs.iter()
            .map(|r| {
                let checked = if batch == 1 {
                    r.answers.len()
                } else {
                    r.answers.len().min(batch)
                };
                format!("{}:{checked}", r.label)
            })
            .collect::<Vec<_>>()
            .join("+")
    }
}

/// The first difference between an answer and its reference.
#[derive(Debug, Clone, PartialEq)]
pub struct Mismatch {
    /// Query number within the batch.
    pub query: usize,
    /// Which reference disagreed.
    pub reference: String,
    /// Rank of the first difference (0 = best), or `None` for a length difference.
    pub rank: Option<usize>,
    /// What the reference has there.
    pub expected: Option<Neighbor>,
    /// What the backend returned there.
    pub got: Option<Neighbor>,
    /// Lengths of the two answers.
    pub lengths: (usize, usize),
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let show = |n: &Option<Neighbor>| match n {
            Some(n) => format!(
                "(index {}, score {:e} bits {:#010x})",
                n.index,
                n.score,
                n.score.to_bits()
            ),
            None => "nothing".to_owned(),
        };
        match self.rank {
            Some(rank) => write!(
                f,
                "query {} differs from the {} at rank {rank}: expected {}, got {}",
                self.query,
                self.reference,
                show(&self.expected),
                show(&self.got)
            ),
            None => write!(
                f,
                "query {} returned {} neighbours, the {} {}",
                self.query, self.lengths.1, self.reference, self.lengths.0
            ),
        }
    }
}

/// Compares one answer with the best `k` of a reference answer, bitwise.
pub fn compare_one(
    expected_full: &[Neighbor],
    got: &[Neighbor],
    k: usize,
    query: usize,
    reference: &str,
) -> Result<(), Mismatch> {
    let expected = &expected_full[..k.min(expected_full.len())];
    let same =
        |a: &Neighbor, b: &Neighbor| a.index == b.index && a.score.to_bits() == b.score.to_bits();
    if let Some(rank) = expected.iter().zip(got).position(|(a, b)| !same(a, b)) {
        return Err(Mismatch {
            query,
            reference: reference.to_owned(),
            rank: Some(rank),
            expected: Some(expected[rank]),
            got: Some(got[rank]),
            lengths: (expected.len(), got.len()),
        });
    }
    if expected.len() != got.len() {
        return Err(Mismatch {
            query,
            reference: reference.to_owned(),
            rank: None,
            expected: None,
            got: None,
            lengths: (expected.len(), got.len()),
        });
    }
    Ok(())
}

/// Checks every answer that a reference covers.
///
/// `answers[i]` answers query `i`; a reference computed for fewer queries
/// checks only those. Every reference must have been computed with a K of at
/// least `k` (or all N rows).
pub fn check(answers: &[Vec<Neighbor>], k: usize, refs: &[&Reference]) -> Result<(), Mismatch> {
    for r in refs {
        for (i, (exp, got)) in r.answers.iter().zip(answers).enumerate() {
            compare_one(exp, got, k, i, &r.label)?;
        }
    }
    Ok(())
}

/// Mean recall@k of `answers` against the references' best `k` (the
/// fraction of the exact top-k row ids found), over every referenced query.
/// 1.0 when every answer holds the exact rows (ties make any order count).
pub fn recall(answers: &[Vec<Neighbor>], k: usize, refs: &[&Reference]) -> f64 {
    let mut sum = 0.0;
    let mut count = 0usize;
    for r in refs {
        for (exp, got) in r.answers.iter().zip(answers) {
            let truth: std::collections::HashSet<u32> =
                exp.iter().take(k).map(|n| n.index).collect();
            if truth.is_empty() {
                continue;
            }
            let found = got
                .iter()
                .take(k)
                .filter(|n| truth.contains(&n.index))
                .count();
            sum += found as f64 / truth.len() as f64;
            count += 1;
        }
    }
    if count == 0 {
        0.0
    } else {
        sum / count as f64
    }
}

/// The scalar oracle over a corpus view, built for one gate and then dropped
/// (it owns a copy of the corpus).
pub fn oracle(corpus: ArrayView2<'_, f32>, metric: Metric) -> Result<topk_cpu::Oracle> {
    Ok(topk_cpu::Oracle::new(corpus, metric)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nb(i: u32, s: f32) -> Neighbor {
        Neighbor::new(i, s)
    }

    #[test]
    fn prefix_of_larger_k_matches() {
        let full = vec![nb(3, 0.9), nb(1, 0.5), nb(2, 0.1)];
        compare_one(&full, &full[..2], 2, 0, "oracle").unwrap();
        compare_one(&full, &full, 10, 0, "oracle").unwrap();
    }

    #[test]
    fn score_bits_not_closeness() {
        let full = vec![nb(3, 0.9), nb(1, 0.5)];
        let got = vec![nb(3, 0.9), nb(1, f32::from_bits(0.5f32.to_bits() + 1))];
        let m = compare_one(&full, &got, 2, 7, "oracle").unwrap_err();
        assert_eq!((m.query, m.rank), (7, Some(1)));
        assert!(m.to_string().contains("query 7"), "{m}");
    }

    #[test]
    fn negative_zero_differs_from_zero_in_bits() {
        let m = compare_one(&[nb(0, 0.0)], &[nb(0, -0.0)], 1, 0, "oracle").unwrap_err();
        assert_eq!(m.rank, Some(0));
    }

    #[test]
    fn short_answer_is_caught() {
        let full = vec![nb(3, 0.9), nb(1, 0.5)];
        let m = compare_one(&full, &full[..1], 2, 0, "oracle").unwrap_err();
        assert_eq!((m.rank, m.lengths), (None, (2, 1)));
        assert!(m.to_string().contains("returned 1 neighbours"), "{m}");
    }

    #[test]
    fn recall_counts_found_rows() {
        let r = Reference {
            label: "oracle".into(),
            answers: vec![vec![nb(1, 0.9), nb(2, 0.8), nb(3, 0.7), nb(4, 0.6)]],
            k_max: 4,
        };
        let got = vec![vec![nb(2, 0.8), nb(9, 0.75), nb(1, 0.9)]];
        assert!((recall(&got, 3, &[&r]) - 2.0 / 3.0).abs() < 1e-12);
        assert_eq!(recall(&[r.answers[0].clone()], 4, &[&r]), 1.0);
    }

    #[test]
    fn check_covers_only_referenced_queries() {
        let r = Reference {
            label: "oracle".into(),
            answers: vec![vec![nb(0, 1.0)]],
            k_max: 1,
        };
        let answers = vec![vec![nb(0, 1.0)], vec![nb(5, 2.0)]];
        check(&answers, 1, &[&r]).unwrap();
        assert_eq!(Reference::describe(&[&r], 2), "oracle:1");
        let four = Reference {
            answers: vec![vec![nb(0, 1.0)]; 4],
            ..r
        };
        assert_eq!(Reference::describe(&[&four], 1), "oracle:4");
        assert_eq!(Reference::describe(&[&four], 2), "oracle:2");
    }
}

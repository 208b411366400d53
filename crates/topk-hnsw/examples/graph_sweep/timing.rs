//! Timing of one measurement point: consecutive batches after a warm-up,
//! latency statistics, and each timed result compared with the one-call
//! pass of the same method.

use std::time::Instant;

use serde_json::json;
use topk_core::Neighbor;
use topk_hnsw::recall_at_k;

use crate::args::Args;
use crate::data::Dataset;
use crate::graph::GraphSearcher;
use crate::report::{failed, Point, Sink, Summary};
use crate::{AnyResult, CPU_HNSW};

/// Ids of each result list.
pub(crate) fn ids(v: &[Vec<Neighbor>]) -> Vec<Vec<u32>> {
    v.iter()
        .map(|r| r.iter().map(|n| n.index).collect())
        .collect()
}

/// Queries whose id lists differ, and whose (id, score bits) lists differ.
pub(crate) fn differ(a: &[Vec<Neighbor>], b: &[Vec<Neighbor>]) -> (usize, usize) {
    let mut by_ids = 0;
    let mut by_bits = 0;
    for (x, y) in a.iter().zip(b) {
        let same_ids = x.len() == y.len() && x.iter().zip(y).all(|(p, q)| p.index == q.index);
        let same_bits = same_ids
            && x.iter()
                .zip(y)
                .all(|(p, q)| p.score.to_bits() == q.score.to_bits());
        by_ids += usize::from(!same_ids);
        by_bits += usize::from(!same_bits);
    }
    by_ids += a.len().abs_diff(b.len());
    by_bits += a.len().abs_diff(b.len());
    (by_ids, by_bits)
}

/// Latencies of a point's timed batches and its results per query.
struct Timed {
    warmup: usize,
    lat_s: Vec<f64>,
    queries: usize,
    /// Results of every query a timed batch covered (first time covered).
    results: Vec<Option<Vec<Neighbor>>>,
}

/// Runs `search` over consecutive batches of `b` queries: `warmup` untimed
/// batches from the end of the query set, then timed batches from its start
/// until at least `min_reps` ran and either `budget_s` is spent or every
/// batch of the set ran once.
fn time_point(
    nq: usize,
    b: usize,
    a: &Args,
    search: &mut dyn FnMut(usize, usize) -> AnyResult<Vec<Vec<Neighbor>>>,
) -> AnyResult<Timed> {
    let slices = (nq / b).max(1);
    let range = |i: usize| {
        let lo = (i % slices) * b;
        (lo, (lo + b).min(nq))
    };
    // Small batches warm up on at least 100 queries.
    let warmup = a.warmup.max(100usize.div_ceil(b).min(slices));
    for w in 0..warmup {
        let (lo, hi) = range(slices - 1 - (w % slices));
        search(lo, hi)?;
    }
    let mut t = Timed {
        warmup,
        lat_s: Vec::new(),
        queries: 0,
        results: vec![None; nq],
    };
    let started = Instant::now();
    let mut rep = 0;
    loop {
        let (lo, hi) = range(rep);
        let t0 = Instant::now();
        let out = search(lo, hi)?;
        t.lat_s.push(t0.elapsed().as_secs_f64());
        t.queries += hi - lo;
        for (slot, r) in t.results[lo..hi].iter_mut().zip(out) {
            if slot.is_none() {
                *slot = Some(r);
            }
        }
        rep += 1;
        if rep >= a.min_reps && (started.elapsed().as_secs_f64() >= a.budget_s || rep >= slices) {
            break;
        }
    }
    Ok(t)
}

/// Median and p90 of `v` (sorted here).
fn median_p90(v: &mut [f64]) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    let n = v.len();
    let med = if n % 2 == 1 {
        v[n / 2]
    } else {
        0.5 * (v[n / 2 - 1] + v[n / 2])
    };
    let p90 = v[((0.9 * n as f64).ceil() as usize).clamp(1, n) - 1];
    (med, p90)
}

/// Everything one data set's part of the sweep needs.
pub(crate) struct Ctx<'a> {
    pub(crate) a: &'a Args,
    pub(crate) ds: &'a Dataset,
    pub(crate) truth: Vec<Vec<u32>>,
    pub(crate) started: Instant,
}

impl Ctx<'_> {
    fn out_of_time(&self) -> bool {
        self.started.elapsed().as_secs_f64() > self.a.deadline_s
    }

    /// Times one point and records it: `full` is the one-call pass of the
    /// same method and `ef`, against which every timed batch is compared.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn point(
        &self,
        sink: &mut Sink,
        sum: &mut Summary,
        method: &'static str,
        b: usize,
        ef: Option<usize>,
        full: &[Vec<Neighbor>],
        walks: Option<&GraphSearcher<'_>>,
        search: &mut dyn FnMut(usize, usize) -> AnyResult<Vec<Vec<Neighbor>>>,
    ) -> AnyResult<()> {
        let nq = self.ds.queries.nrows();
        let base = json!({
            "dataset": self.ds.name, "method": method, "batch": b, "ef": ef, "k": self.a.k,
            "n": self.ds.corpus.nrows(), "d": self.ds.corpus.ncols(),
            "metric": self.ds.metric.as_str(), "m": self.a.m,
            "ef_construction": self.a.ef_construction,
        });
        if self.out_of_time() {
            let mut rec = base;
            rec["what"] = "skipped".into();
            rec["reason"] = format!("past --deadline-s {}", self.a.deadline_s).into();
            sink.emit(&rec)?;
            sum.skipped += 1;
            return Ok(());
        }
        if let Some(w) = walks {
            w.take_counts();
        }
        let mut t = match time_point(nq, b, self.a, search) {
            Ok(t) => t,
            Err(e) => {
                let what = format!("{method} batch {b} ef {ef:?}");
                return failed(sink, sum, &self.ds.name, &what, &e);
            }
        };
        let covered: Vec<usize> = (0..nq).filter(|&i| t.results[i].is_some()).collect();
        let got: Vec<Vec<Neighbor>> = covered
            .iter()
            .filter_map(|&i| t.results[i].take())
            .collect();
        let want: Vec<Vec<Neighbor>> = covered.iter().map(|&i| full[i].clone()).collect();
        let truth: Vec<&[u32]> = covered.iter().map(|&i| self.truth[i].as_slice()).collect();
        let recall_timed = recall_at_k(&got, &truth, self.a.k)?;
        let recall = recall_at_k(full, &self.truth, self.a.k)?;
        let (ids_differ, bits_differ) = differ(&got, &want);
        let total_s: f64 = t.lat_s.iter().sum();
        let qps = t.queries as f64 / total_s;
        let reps = t.lat_s.len();
        let (med, p90) = median_p90(&mut t.lat_s);
        let mut rec = base;
        rec["what"] = "search".into();
        rec["qps"] = qps.into();
        rec["latency_median_ms"] = (med * 1e3).into();
        rec["latency_p90_ms"] = (p90 * 1e3).into();
        rec["reps"] = reps.into();
        rec["warmup_batches"] = t.warmup.into();
        rec["queries_timed"] = t.queries.into();
        rec["distinct_queries_timed"] = covered.len().into();
        rec["recall"] = recall.into();
        rec["recall_timed_queries"] = recall_timed.into();
        rec["differs_from_one_call_ids"] = ids_differ.into();
        rec["differs_from_one_call_bits"] = bits_differ.into();
        if let Some(w) = walks {
            // Warm-up included: which side answered, over every call of the point.
            let (dev, host) = w.take_counts();
            rec["device_walks"] = dev.into();
            rec["host_answers"] = host.into();
            *sum.host_answers.entry(method).or_default() += host;
        }
        rec["threads"] = match (method, b) {
            (CPU_HNSW, 1) => 1,
            (CPU_HNSW, _) => rayon::current_num_threads(),
            _ => 1,
        }
        .into();
        sink.emit(&rec)?;
        let e = sum.batch_differs.entry(method).or_default();
        e.0 += ids_differ;
        e.1 += covered.len();
        sum.points.push(Point {
            method,
            batch: b,
            ef,
            qps,
            median_ms: med * 1e3,
            p90_ms: p90 * 1e3,
            recall,
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[test]
    fn median_and_p90_of_ten() {
        let mut v: Vec<f64> = (1..=10).rev().map(f64::from).collect();
        assert_eq!(median_p90(&mut v), (5.5, 9.0));
        let mut one = vec![2.0];
        assert_eq!(median_p90(&mut one), (2.0, 2.0));
    }

    #[test]
    fn time_point_covers_each_batch_once_after_warm_up_from_the_end() {
        let a = Args::parse_from(["graph_sweep", "--budget-s", "1000", "--min-reps", "1"]);
        let mut calls = Vec::new();
        let mut search = |lo: usize, hi: usize| -> AnyResult<Vec<Vec<Neighbor>>> {
            calls.push((lo, hi));
            Ok((lo..hi)
                .map(|i| vec![Neighbor::new(i as u32, 0.0)])
                .collect())
        };
        let t = time_point(10, 3, &a, &mut search).unwrap();
        // 3 slices of 3: warm-up max(2, min(ceil(100 / 3), 3)) = 3 batches,
        // last slice first, then each slice once.
        assert_eq!(t.warmup, 3);
        assert_eq!(calls, [(6, 9), (3, 6), (0, 3), (0, 3), (3, 6), (6, 9)]);
        assert_eq!((t.lat_s.len(), t.queries), (3, 9));
        let covered: Vec<Option<u32>> = t
            .results
            .iter()
            .map(|r| r.as_ref().map(|v| v[0].index))
            .collect();
        let mut want: Vec<Option<u32>> = (0..9).map(Some).collect();
        want.push(None);
        assert_eq!(covered, want);
    }

    #[test]
    fn differ_counts_ids_and_bits() {
        let a = vec![
            vec![Neighbor::new(1, 1.0)],
            vec![Neighbor::new(2, 2.0)],
            vec![Neighbor::new(3, 3.0)],
        ];
        let b = vec![
            vec![Neighbor::new(1, 1.0)],
            vec![Neighbor::new(2, -2.0)],
            vec![Neighbor::new(4, 3.0)],
        ];
        assert_eq!(differ(&a, &b), (1, 2));
        assert_eq!(differ(&a, &a[..2]), (1, 1));
    }
}

//! Measuring one configuration on one timed path: the correctness gate
//! first, then warm-up and trials, producing one [`Record`].

use ndarray::{s, ArrayView2};
use topk_core::{Neighbor, Retriever};

use crate::config::{RunConfig, TimedPath};
use crate::error::Result;
use crate::gate::{self, Reference};
use crate::record::Record;
use crate::stats::{time_trials_prepared, Summary};

/// Something that answers queries end to end: one call per timed trial.
pub trait Searcher {
    /// Answers the rows of `queries` (one row: a single-query search; more:
    /// a batch), replacing `out` with one answer per row. `first` is the
    /// position of the first row in the plan's query pool (a path that keeps
    /// the pool on the device uses it instead of the host values).
    fn answer(
        &mut self,
        first: usize,
        queries: ArrayView2<'_, f32>,
        k: usize,
        out: &mut Vec<Vec<Neighbor>>,
    ) -> Result<()>;

    /// Untimed work before the call that answers the query at pool position
    /// `first`: the device path writes that query into its reused device
    /// buffer here, as a model would write its output. Nothing by default.
    fn prepare(&mut self, first: usize) -> Result<()> {
        let _ = first;
        Ok(())
    }
}

/// A host-side retriever: `search_into` for one query (its buffer reused
/// across trials), `search_batch` for several.
///
/// This is also the GPU-resident path when the retriever is the CUDA engine:
/// its `search_into` moves the query to the device and the results back.
pub struct HostSearch<'r> {
    retriever: &'r dyn Retriever,
    row: Vec<f32>,
}

impl<'r> HostSearch<'r> {
    /// Wraps a retriever.
    pub fn new(retriever: &'r dyn Retriever) -> Self {
        HostSearch {
            retriever,
            row: Vec::with_capacity(retriever.dim()),
        }
    }
}

impl Searcher for HostSearch<'_> {
    fn answer(
        &mut self,
        _first: usize,
        queries: ArrayView2<'_, f32>,
        k: usize,
        out: &mut Vec<Vec<Neighbor>>,
    ) -> Result<()> {
        if queries.nrows() == 1 {
            out.resize_with(1, Vec::new);
            let row = queries.row(0);
            let q = match row.as_slice() {
                Some(q) => q,
                None => {
                    self.row.clear();
                    self.row.extend(row.iter().copied());
                    &self.row
                }
            };
            self.retriever.search_into(q, k, &mut out[0])?;
        } else {
            *out = self.retriever.search_batch(queries, k)?;
        }
        Ok(())
    }
}

/// Everything [`measure`] needs besides the searcher.
#[derive(Debug, Clone, Copy)]
pub struct Plan<'a> {
    /// The configuration (its backend, sizes and trial counts).
    pub cfg: &'a RunConfig,
    /// Which path is timed.
    pub path: TimedPath,
    /// The query pool: single-query trials rotate through its rows, a batch
    /// uses its first `cfg.batch` rows.
    pub queries: ArrayView2<'a, f32>,
    /// References the answers must equal before timing starts.
    pub refs: &'a [&'a Reference],
    /// Where the data came from, for the record.
    pub data: &'a str,
    /// Memory bandwidth for the floor, bytes per second.
    pub bandwidth: Option<f64>,
    /// An approximate backend (HNSW): its recall@K against the references is
    /// recorded instead of the bit-exact gate, and it is timed either way.
    pub approximate: bool,
}

/// A record for `plan` with every field except the measurements.
pub fn blank_record(plan: &Plan<'_>) -> Record {
    let cfg = plan.cfg;
    let mut r = Record {
        n: cfg.n,
        d: cfg.d,
        k: cfg.k,
        batch: cfg.batch,
        metric: cfg.metric.as_str().to_owned(),
        backend: cfg.backend.as_str().to_owned(),
        path: plan.path.as_str().to_owned(),
        trials: cfg.trials,
        warmup: cfg.warmup,
        seed: cfg.seed,
        median_ms: None,
        min_ms: None,
        max_ms: None,
        p90_ms: None,
        correct: None,
        recall: None,
        floor_ms: None,
        bandwidth_gbs: None,
        qps: None,
        gate: Some(Reference::describe(plan.refs, cfg.batch)),
        data: Some(plan.data.to_owned()),
        error: None,
    };
    if let Some(b) = plan.bandwidth {
        r.set_floor(b);
    }
    r
}

/// A failed record for a path that could not be set up (never timed).
pub fn failed(plan: &Plan<'_>, e: &dyn std::fmt::Display) -> Record {
    let mut rec = blank_record(plan);
    rec.correct = Some(false);
    rec.error = Some(e.to_string());
    rec
}

/// Gates `searcher` against the plan's references and, when it passes, times it.
///
/// A wrong answer or a backend error during the gate gives a record with
/// `correct = false` and the reason in `error`, without timing. An error
/// during the trials (after a passing gate) keeps `correct = true`, leaves the
/// timings empty and names the error.
pub fn measure(plan: &Plan<'_>, searcher: &mut dyn Searcher) -> Record {
    let cfg = plan.cfg;
    let mut rec = blank_record(plan);
    let pool = plan.queries.nrows();
    if pool == 0 || pool < cfg.batch {
        rec.correct = Some(false);
        rec.error = Some(format!(
            "the query pool has {pool} queries, the batch needs {}",
            cfg.batch
        ));
        return rec;
    }

    if plan.refs.iter().all(|r| r.answers.is_empty()) {
        rec.correct = Some(false);
        rec.error = Some("no reference answers to check against".to_owned());
        return rec;
    }

    let mut out = Vec::new();
    let answers = match gate_answers(plan, searcher, &mut out) {
        Ok(a) => a,
        Err(e) => {
            tracing::warn!(n = cfg.n, d = cfg.d, k = cfg.k, path = %plan.path, "gate failed: {e}");
            rec.correct = Some(false);
            rec.error = Some(e.to_string());
            return rec;
        }
    };
    if plan.approximate {
        rec.correct = None;
        rec.recall = Some(gate::recall(&answers, cfg.k, plan.refs));
        rec.gate = rec.gate.map(|g| format!("recall vs {g}"));
    } else if let Err(m) = gate::check(&answers, cfg.k, plan.refs) {
        tracing::warn!(n = cfg.n, d = cfg.d, k = cfg.k, path = %plan.path, "wrong answer: {m}");
        rec.correct = Some(false);
        rec.error = Some(m.to_string());
        return rec;
    } else {
        rec.correct = Some(true);
    }

    let batch = cfg.batch;
    let first = |i: usize| if batch == 1 { i % pool } else { 0 };
    let times = time_trials_prepared(
        cfg.warmup,
        cfg.trials,
        searcher,
        |searcher, i| searcher.prepare(first(i)),
        |searcher, i| {
            let start = first(i);
            searcher.answer(
                start,
                plan.queries.slice(s![start..start + batch, ..]),
                cfg.k,
                &mut out,
            )
        },
    );
    match times.map(|t| Summary::of(&t)) {
        Ok(Some(summary)) => rec.set_timing(&summary),
        Ok(None) => rec.error = Some("no usable trial times".to_owned()),
        Err(e) => rec.error = Some(format!("failed while timing: {e}")),
    }
    rec
}

/// The answers the gate checks: each referenced query on its own for a
/// single-query configuration, the first batch for a batch configuration.
fn gate_answers(
    plan: &Plan<'_>,
    searcher: &mut dyn Searcher,
    out: &mut Vec<Vec<Neighbor>>,
) -> Result<Vec<Vec<Neighbor>>> {
    let cfg = plan.cfg;
    if cfg.batch == 1 {
        let count = plan
            .refs
            .iter()
            .map(|r| r.answers.len())
            .max()
            .unwrap_or(0)
            .min(plan.queries.nrows());
        let mut answers = Vec::with_capacity(count);
        for i in 0..count {
            searcher.prepare(i)?;
            searcher.answer(i, plan.queries.slice(s![i..i + 1, ..]), cfg.k, out)?;
            answers.push(out.first().cloned().unwrap_or_default());
        }
        Ok(answers)
    } else {
        searcher.prepare(0)?;
        searcher.answer(0, plan.queries.slice(s![..cfg.batch, ..]), cfg.k, out)?;
        Ok(std::mem::take(out))
    }
}

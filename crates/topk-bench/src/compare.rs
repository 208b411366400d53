//! The CPU comparison: topk's `CpuRetriever` single-query latency and batch
//! throughput on this machine, with the host memory bandwidth measured in the
//! same run, on data written as `.npy` for the numpy / faiss-cpu anchors
//! (`bench/anchors/cpu_anchors.py`) to time next.

use std::path::Path;
use std::time::Instant;

use ndarray::s;
use topk_core::Metric;

use crate::backends;
use crate::config::{Backend, RunConfig, TimedPath};
use crate::data;
use crate::environment::Environment;
use crate::error::{BenchError, Result};
use crate::gate::{self, Reference};
use crate::manifest::{AnchorConfig, Manifest};
use crate::membw;
use crate::record::ResultsWriter;
use crate::run::{measure, HostSearch, Plan};

/// The grid of the comparison.
#[derive(Debug, Clone, PartialEq)]
pub struct CompareSpec {
    /// Corpus sizes.
    pub ns: Vec<usize>,
    /// Dimensions.
    pub ds: Vec<usize>,
    /// Neighbours per query.
    pub ks: Vec<usize>,
    /// Queries of the throughput measurement.
    pub batch: usize,
    /// Seed of the data.
    pub seed: u64,
}

impl CompareSpec {
    /// N ∈ {100k, 1M}, D ∈ {384, 1024}, K ∈ {8, 100}, Q = 1000.
    pub fn full() -> CompareSpec {
        CompareSpec {
            ns: vec![100_000, 1_000_000],
            ds: vec![384, 1024],
            ks: vec![8, 100],
            batch: 1000,
            seed: 42,
        }
    }

    /// A few seconds' worth, to check the tooling.
    pub fn quick() -> CompareSpec {
        CompareSpec {
            ns: vec![20_000],
            ds: vec![384],
            ks: vec![8],
            batch: 100,
            seed: 42,
        }
    }

    /// `(trials, warmup)` for a configuration: long batches are timed once or
    /// twice without warm-up (one 1M × 1024 batch of 1000 queries takes most
    /// of a minute on 2 cores, long enough to be its own steady state).
    pub fn trials(&self, n: usize, d: usize, batch: usize) -> (usize, usize) {
        let work = n.saturating_mul(d).saturating_mul(batch);
        if batch == 1 {
            if work >= 1 << 28 {
                (10, 2)
            } else {
                (20, 3)
            }
        } else if work >= 1 << 39 {
            (1, 0)
        } else if work >= 1 << 37 {
            (2, 0)
        } else {
            (3, 1)
        }
    }

    /// Every configuration, single queries then batches.
    pub fn configs(&self) -> Vec<RunConfig> {
        let mut out = Vec::new();
        for &d in &self.ds {
            for &n in &self.ns {
                for batch in [1, self.batch] {
                    for &k in &self.ks {
                        let (trials, warmup) = self.trials(n, d, batch);
                        out.push(RunConfig {
                            n,
                            d,
                            k,
                            trials,
                            warmup,
                            seed: self.seed,
                            metric: Metric::Dot,
                            backend: Backend::Cpu,
                            batch,
                        });
                    }
                }
            }
        }
        out
    }
}

/// Runs topk's side of the comparison: writes the data and manifest into
/// `data_dir`, the environment and records into `out`. Returns the records written.
pub fn run(spec: &CompareSpec, out: &Path, data_dir: &Path, progress: bool) -> Result<usize> {
    let configs = spec.configs();
    for c in &configs {
        c.validate()?;
    }
    std::fs::create_dir_all(out).map_err(|e| BenchError::io(out, e))?;
    let mut env = Environment::read();
    env.write(out)?;
    let mut writer = ResultsWriter::create(out, true)?;

    let t = Instant::now();
    let bw = membw::measure(1 << 30, 5);
    tracing::info!(
        read_gbs = bw.read_bytes_per_s / 1e9,
        copy_gbs = bw.copy_bytes_per_s / 1e9,
        secs = t.elapsed().as_secs_f64(),
        "host bandwidth"
    );
    env.host_bandwidth = Some(bw);
    env.write(out)?;

    let n_max = spec.ns.iter().copied().max().unwrap_or(0);
    let mut manifest = Manifest::new(spec.seed, "dot", n_max, &spec.ds);
    manifest.configs = configs
        .iter()
        .map(|c| AnchorConfig {
            n: c.n,
            d: c.d,
            k: c.k,
            batch: c.batch,
            trials: c.trials,
            warmup: c.warmup,
        })
        .collect();
    manifest.write(data_dir)?;

    let bar = if progress {
        indicatif::ProgressBar::new(configs.len() as u64)
    } else {
        indicatif::ProgressBar::hidden()
    };
    let k_max = spec.ks.iter().copied().max().unwrap_or(1);
    let mut written = 0;
    // On a shared machine one measurement can catch a busy moment; the floor
    // is a lower bound on time, so it uses the best bandwidth seen so far
    // (measured again before each D).
    let mut bw = bw;
    for &d in &spec.ds {
        let again = membw::measure(1 << 30, 3);
        if again.read_bytes_per_s > bw.read_bytes_per_s {
            bw = again;
            env.host_bandwidth = Some(bw);
            env.write(out)?;
        }
        let corpus = data::gaussian(n_max, d, spec.seed);
        let queries = data::gaussian_queries(spec.batch, d, spec.seed);
        let (c, q) = Manifest::file_names(d);
        data::write_npy(&data_dir.join(c), corpus.view())?;
        data::write_npy(&data_dir.join(q), queries.view())?;
        for &n in &spec.ns {
            let view = corpus.slice(s![..n, ..]);
            let reference = {
                let oracle = gate::oracle(view, Metric::Dot)?;
                Reference::compute(
                    "oracle",
                    &oracle,
                    queries.view(),
                    crate::campaign::ORACLE_GATE_QUERIES,
                    k_max,
                )?
            };
            let cpu = backends::host(Backend::Cpu, view, Metric::Dot)?;
            let refs = [&reference];
            for cfg in configs.iter().filter(|c| c.n == n && c.d == d) {
                bar.set_message(format!("N={n} D={d} K={} Q={}", cfg.k, cfg.batch));
                let plan = Plan {
                    cfg,
                    path: TimedPath::Cpu,
                    queries: queries.view(),
                    refs: &refs,
                    data: "gaussian",
                    bandwidth: Some(bw.read_bytes_per_s),
                    approximate: false,
                };
                writer.write(&measure(&plan, &mut HostSearch::new(cpu.as_ref())))?;
                written += 1;
                bar.inc(1);
            }
        }
    }
    bar.finish_and_clear();
    writer.finish()?;
    env.mark_end();
    env.write(out)?;
    Ok(written)
}

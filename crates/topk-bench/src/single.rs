//! One configuration from the command line: data (synthetic or files), the
//! oracle reference, the backend, and one record per timed path.

use std::path::PathBuf;

use ndarray::{s, Array2};

use crate::backends;
use crate::config::{Backend, RunConfig, TimedPath};
use crate::data;
use crate::error::{BenchError, Result};
use crate::gate::{self, Reference};
use crate::gpu::Gpu;
use crate::membw;
use crate::record::Record;
use crate::run::{failed, measure, HostSearch, Plan};

/// A single run as the command line describes it.
#[derive(Debug, Clone)]
pub struct SingleRun {
    /// The configuration; with files, `n` and `d` are checked against them.
    pub cfg: RunConfig,
    /// Whether `--n` was given (with a corpus file: use that prefix).
    pub n_given: bool,
    /// Whether `--d` was given (with a corpus file: must match).
    pub d_given: bool,
    /// Corpus file instead of Gaussian rows.
    pub corpus: Option<PathBuf>,
    /// Query file (defaults to Gaussian queries of the corpus's D).
    pub queries: Option<PathBuf>,
    /// Queries the oracle checks before timing.
    pub gate_queries: usize,
    /// Size of the query pool single-query trials rotate through.
    pub query_pool: usize,
    /// Measure the memory bandwidth for the floor.
    pub floor: bool,
    /// Graph parameters when the backend is `hnsw`.
    pub hnsw: topk::HnswParams,
}

/// The corpus and queries a run searches.
struct Workload {
    corpus: Array2<f32>,
    queries: Array2<f32>,
    label: String,
}

fn workload(run: &SingleRun) -> Result<(RunConfig, Workload)> {
    let mut cfg = run.cfg.clone();
    let (corpus, label) = match &run.corpus {
        Some(path) => {
            let m = data::load(path)?;
            if run.d_given && m.ncols() != cfg.d {
                return Err(BenchError::flag(
                    "d",
                    cfg.d,
                    format!("{} has D = {}", path.display(), m.ncols()),
                ));
            }
            if run.n_given && cfg.n > m.nrows() {
                return Err(BenchError::flag(
                    "n",
                    cfg.n,
                    format!("{} has only {} rows", path.display(), m.nrows()),
                ));
            }
            let n = if run.n_given { cfg.n } else { m.nrows() };
            cfg.n = n;
            cfg.d = m.ncols();
            let m = if n < m.nrows() {
                m.slice(s![..n, ..]).to_owned()
            } else {
                m
            };
            (m, data::label(path))
        }
        None => {
            cfg.validate()?;
            (
                data::gaussian(cfg.n, cfg.d, cfg.seed),
                "gaussian".to_owned(),
            )
        }
    };
    cfg.validate()?;
    let pool = run.query_pool.max(cfg.batch).max(1);
    let queries = match &run.queries {
        Some(path) => {
            let q = data::load(path)?;
            if q.ncols() != cfg.d {
                return Err(BenchError::DimensionMismatch {
                    corpus: cfg.d,
                    queries: q.ncols(),
                });
            }
            if q.nrows() < cfg.batch {
                return Err(BenchError::flag(
                    "batch",
                    cfg.batch,
                    format!("{} holds only {} queries", path.display(), q.nrows()),
                ));
            }
            q
        }
        None => data::gaussian_queries(pool, cfg.d, cfg.seed),
    };
    Ok((
        cfg,
        Workload {
            corpus,
            queries,
            label,
        },
    ))
}

/// Runs the configuration: one record for a host backend; for `cuda`, the
/// resident path plus, for a single query, the device-query path and the CPU
/// round trip, or for a batch, the CPU backend's host batch. `hnsw` is
/// approximate: its record carries recall@K against the oracle instead of
/// the bit-exact verdict.
pub fn run(run: &SingleRun) -> Result<Vec<Record>> {
    run.cfg.validate_flags_only()?;
    if run.gate_queries == 0 {
        return Err(BenchError::flag(
            "gate-queries",
            0,
            "the oracle must check at least one query",
        ));
    }
    // Refuse unavailable backends before generating any data.
    match run.cfg.backend {
        Backend::Cuda if !cfg!(feature = "cuda") => return Err(BenchError::NoCuda),
        _ => {}
    }
    let (cfg, w) = workload(run)?;
    let corpus = w.corpus.view();
    let queries = w.queries.view();

    let reference = {
        let oracle = gate::oracle(corpus, cfg.metric)?;
        Reference::compute("oracle", &oracle, queries, run.gate_queries, cfg.k)?
    };
    let refs = [&reference];

    match cfg.backend {
        Backend::Cuda => {
            let cpu = backends::host(Backend::Cpu, corpus, cfg.metric)?;
            let gpu = Gpu::new(corpus, cfg.metric, cfg.k, cfg.batch)?;
            let bw = if run.floor {
                Some(Gpu::d2d_bandwidth()?)
            } else {
                None
            };
            let cpu_cfg = RunConfig {
                backend: Backend::Cpu,
                ..cfg.clone()
            };
            let plan = |path, cfg| Plan {
                cfg,
                path,
                queries,
                refs: &refs,
                data: &w.label,
                bandwidth: bw,
                approximate: false,
            };
            let mut records = vec![measure(
                &plan(TimedPath::Resident, &cfg),
                &mut gpu.resident(),
            )];
            if cfg.batch == 1 {
                let p = plan(TimedPath::Device, &cfg);
                records.push(match gpu.device(queries) {
                    Ok(mut s) => measure(&p, &mut s),
                    Err(e) => failed(&p, &e),
                });
                let p = plan(TimedPath::CpuRoundtrip, &cfg);
                records.push(match gpu.roundtrip(cpu.as_ref(), queries, cfg.k) {
                    Ok(mut s) => measure(&p, &mut s),
                    Err(e) => failed(&p, &e),
                });
            } else {
                let p = plan(TimedPath::Cpu, &cpu_cfg);
                records.push(measure(&p, &mut HostSearch::new(cpu.as_ref())));
            }
            Ok(records)
        }
        backend => {
            let r = if backend == Backend::Hnsw {
                backends::hnsw(corpus, cfg.metric, run.hnsw)?
            } else {
                backends::host(backend, corpus, cfg.metric)?
            };
            let bw = run
                .floor
                .then(|| membw::measure(1 << 29, 3).read_bytes_per_s);
            let plan = Plan {
                cfg: &cfg,
                path: TimedPath::Cpu,
                queries,
                refs: &refs,
                data: &w.label,
                bandwidth: bw,
                approximate: backend == Backend::Hnsw,
            };
            Ok(vec![measure(&plan, &mut HostSearch::new(r.as_ref()))])
        }
    }
}

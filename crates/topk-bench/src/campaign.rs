//! The campaign of docs/CONTRACTS.md §6 in one process: every (N, D, K) and the batch
//! sweep, gated against the oracle, timed on the GPU-resident path, the
//! device-query path and the CPU round-trip baseline (batches: the resident
//! path, the batch already on the device and the CPU backend's host batch),
//! or on the CPU path alone with
//! `--backend cpu`, written row by row to `results.jsonl` / `results.csv`.
//!
//! Each D's largest corpus is generated once; smaller N are its prefixes.
//! The corpus and queries are also written as `.npy` files so that the
//! anchors (torch, numpy, faiss) load the very same bytes.

use std::path::{Path, PathBuf};
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};
use ndarray::{s, ArrayView2};
use topk_core::{Metric, Retriever};

use crate::backends;
use crate::config::{validate_shape, Backend, RunConfig, TimedPath};
use crate::data;
use crate::environment::Environment;
use crate::error::{BenchError, Result};
use crate::gate::{self, Reference};
use crate::gpu::Gpu;
use crate::manifest::{AnchorConfig, Manifest};
use crate::membw;
use crate::record::{Record, ResultsWriter};
use crate::run::{blank_record, failed, measure, HostSearch, Plan};

/// Queries the oracle checks for every single-query configuration.
pub const ORACLE_GATE_QUERIES: usize = 4;

/// The sweep a campaign runs.
#[derive(Debug, Clone, PartialEq)]
pub struct Spec {
    /// Corpus sizes.
    pub ns: Vec<usize>,
    /// Dimensions.
    pub ds: Vec<usize>,
    /// K of the single-query grid.
    pub ks: Vec<usize>,
    /// Extra K run at every (N, D) (the selection stress case).
    pub extra_ks: Vec<usize>,
    /// Batch sizes (beyond 1) of the batch sweep.
    pub batches: Vec<usize>,
    /// K of the batch sweep.
    pub batch_k: usize,
    /// Queries generated per D; single-query trials rotate through them.
    pub query_pool: usize,
    /// Seed of corpus and queries.
    pub seed: u64,
    /// Metric (docs/CONTRACTS.md §6: dot on L2-normalised rows).
    pub metric: Metric,
    /// Timed trials of a GPU single query.
    pub gpu_trials: usize,
    /// Warm-up runs of a GPU single query.
    pub gpu_warmup: usize,
    /// Upper bound on CPU trials (big configs use fewer, see [`cpu_trials`]).
    pub cpu_trials: usize,
}

impl Spec {
    /// The full campaign: 45 configs + K = 1000 at each (N, D), and the batch
    /// sweep Q ∈ {1, 16, 256} (Q = 1 is the single-query grid) at K = 100.
    pub fn full() -> Spec {
        Spec {
            ns: vec![10_000, 50_000, 100_000, 500_000, 1_000_000],
            ds: vec![384, 768, 1024],
            ks: vec![8, 32, 100],
            extra_ks: vec![1000],
            batches: vec![16, 256],
            batch_k: 100,
            query_pool: 256,
            seed: 42,
            metric: Metric::Dot,
            gpu_trials: 50,
            gpu_warmup: 5,
            cpu_trials: 20,
        }
    }

    /// A small subset that finishes in seconds (smoke test of the tooling).
    pub fn quick() -> Spec {
        Spec {
            ns: vec![10_000, 50_000],
            ds: vec![384],
            ks: vec![8, 100],
            extra_ks: vec![1000],
            batches: vec![16],
            batch_k: 100,
            query_pool: 32,
            seed: 42,
            metric: Metric::Dot,
            gpu_trials: 20,
            gpu_warmup: 3,
            cpu_trials: 10,
        }
    }

    /// Checks the sweep's shapes before anything is generated.
    pub fn validate(&self) -> Result<()> {
        let empty = |flag: &'static str, v: &[usize]| {
            if v.is_empty() || v.contains(&0) {
                Err(BenchError::flag(
                    flag,
                    format!("{v:?}"),
                    "needs at least one value, none zero",
                ))
            } else {
                Ok(())
            }
        };
        empty("ns", &self.ns)?;
        empty("ds", &self.ds)?;
        empty("ks", &self.ks)?;
        for &n in &self.ns {
            for &d in &self.ds {
                validate_shape(n, d)?;
            }
        }
        if self.batches.iter().any(|&b| b < 2 || b > self.query_pool) {
            return Err(BenchError::flag(
                "batches",
                format!("{:?}", self.batches),
                format!(
                    "each batch must be between 2 and the query pool ({})",
                    self.query_pool
                ),
            ));
        }
        if self.gpu_trials < 20 {
            return Err(BenchError::flag(
                "gpu-trials",
                self.gpu_trials,
                "at least 20",
            ));
        }
        if self.cpu_trials == 0 {
            return Err(BenchError::flag("cpu-trials", 0, "at least 1"));
        }
        Ok(())
    }

    /// Every configuration of one (N, D), single queries first.
    pub fn configs(&self, n: usize, d: usize, backend: Backend) -> Vec<RunConfig> {
        let mut ks: Vec<usize> = self.ks.iter().chain(&self.extra_ks).copied().collect();
        ks.sort_unstable();
        ks.dedup();
        let base = RunConfig {
            n,
            d,
            k: 0,
            trials: self.gpu_trials,
            warmup: self.gpu_warmup,
            seed: self.seed,
            metric: self.metric,
            backend,
            batch: 1,
        };
        let mut out: Vec<RunConfig> = ks
            .iter()
            .map(|&k| RunConfig { k, ..base.clone() })
            .collect();
        out.extend(self.batches.iter().map(|&batch| RunConfig {
            k: self.batch_k,
            batch,
            ..base.clone()
        }));
        out
    }

    /// The largest K of one (N, D): what the oracle reference is computed with.
    pub fn k_max(&self) -> usize {
        self.ks
            .iter()
            .chain(&self.extra_ks)
            .copied()
            .chain(std::iter::once(self.batch_k))
            .max()
            .unwrap_or(1)
    }

    /// The manifest the anchors read: the same grid with GPU trial counts.
    pub fn manifest(&self, n_max: usize) -> Manifest {
        let mut m = Manifest::new(self.seed, self.metric.as_str(), n_max, &self.ds);
        for &d in &self.ds {
            for &n in &self.ns {
                m.configs
                    .extend(
                        self.configs(n, d, Backend::Cuda)
                            .into_iter()
                            .map(|c| AnchorConfig {
                                n: c.n,
                                d: c.d,
                                k: c.k,
                                batch: c.batch,
                                trials: c.trials,
                                warmup: c.warmup,
                            }),
                    );
            }
        }
        m
    }

    /// Records a campaign produces per (N, D) for a backend.
    pub fn records_per_group(&self, backend: Backend) -> usize {
        self.configs(1, 1, backend)
            .iter()
            .map(|c| match (backend, c.batch) {
                (Backend::Cuda, _) => 3,
                _ => 1,
            })
            .sum()
    }
}

/// Trials and warm-up for a CPU-timed configuration, fewer for big ones so
/// the whole campaign stays within minutes: `(trials, warmup)`.
pub fn cpu_trials(n: usize, d: usize, batch: usize, max_trials: usize) -> (usize, usize) {
    let work = n.saturating_mul(d).saturating_mul(batch);
    let (t, w) = if work >= 1 << 30 {
        (3, 1)
    } else if work >= 1 << 26 {
        (5, 1)
    } else {
        (20, 3)
    };
    (t.min(max_trials).max(1), w)
}

/// Where a campaign writes and what it runs.
#[derive(Debug, Clone)]
pub struct Options {
    /// Results folder.
    pub out: PathBuf,
    /// Folder for the `.npy` corpus/query files (default `out/data`); `None`
    /// writes none.
    pub data_dir: Option<PathBuf>,
    /// The sweep.
    pub spec: Spec,
    /// `cuda` (resident, device query, round trip) or `cpu` / `oracle` (host path only).
    pub backend: Backend,
    /// Whether to echo `TOPK_BENCH_JSON` lines on stdout.
    pub echo: bool,
    /// Whether to draw a progress bar (stderr).
    pub progress: bool,
    /// The torch anchor script to run on the data after the campaign (same
    /// process tree, same device), writing `out/anchors/torch.jsonl`.
    pub torch: Option<PathBuf>,
    /// Python interpreter for the anchor.
    pub python: String,
    /// Delete the data folder when done (it holds gigabytes).
    pub clean_data: bool,
}

/// Runs the campaign; returns the number of records written.
pub fn run(opts: &Options) -> Result<usize> {
    let spec = &opts.spec;
    spec.validate()?;
    if opts.backend == Backend::Hnsw {
        return Err(BenchError::BackendUnavailable {
            backend: "hnsw",
            reason: "the campaign times exact backends; time HNSW with `topk_bench --backend hnsw`"
                .into(),
        });
    }
    if opts.backend == Backend::Cuda && !cfg!(feature = "cuda") {
        return Err(BenchError::NoCuda);
    }
    std::fs::create_dir_all(&opts.out).map_err(|e| BenchError::io(&opts.out, e))?;
    let mut env = Environment::read();
    env.write(&opts.out)?;
    let mut writer = ResultsWriter::create(&opts.out, opts.echo)?;

    // Bandwidths for the floors, measured once in this process.
    let host_bw = membw::measure(1 << 30, 5);
    env.host_bandwidth = Some(host_bw);
    let gpu_bw = if opts.backend == Backend::Cuda {
        let b = Gpu::d2d_bandwidth()?;
        env.d2d_bytes_per_s = Some(b);
        env.device = Gpu::device_json();
        Some(b)
    } else {
        None
    };
    env.write(&opts.out)?;
    tracing::info!(
        host_read_gbs = host_bw.read_bytes_per_s / 1e9,
        d2d_gbs = gpu_bw.map(|b| b / 1e9),
        "bandwidths measured"
    );

    let n_max = spec.ns.iter().copied().max().unwrap_or(0);
    if let Some(dir) = &opts.data_dir {
        spec.manifest(n_max).write(dir)?;
    }
    let total = spec.ns.len() * spec.ds.len() * spec.records_per_group(opts.backend);
    let bar = progress_bar(total as u64, opts.progress);
    let mut written = 0usize;
    let started = Instant::now();

    for &d in &spec.ds {
        bar.set_message(format!("generating {n_max}×{d}"));
        let t = Instant::now();
        let corpus = data::gaussian(n_max, d, spec.seed);
        let queries = data::gaussian_queries(spec.query_pool, d, spec.seed);
        tracing::info!(
            n = n_max,
            d,
            secs = t.elapsed().as_secs_f64(),
            "generated corpus"
        );
        if let Some(dir) = &opts.data_dir {
            let (c, q) = Manifest::file_names(d);
            data::write_npy(&dir.join(c), corpus.view())?;
            data::write_npy(&dir.join(q), queries.view())?;
        }
        let mut ns = spec.ns.clone();
        ns.sort_unstable();
        for n in ns {
            let view = corpus.slice(s![..n, ..]);
            let group = Group {
                spec,
                backend: opts.backend,
                corpus: view,
                queries: queries.view(),
                host_bw: host_bw.read_bytes_per_s,
                gpu_bw,
            };
            bar.set_message(format!("N={n} D={d}"));
            group.run(&mut |rec: Record| {
                writer.write(&rec)?;
                written += 1;
                bar.inc(1);
                Ok(())
            })?;
        }
    }
    bar.finish_with_message(format!(
        "{written} records in {:.0} s",
        started.elapsed().as_secs_f64()
    ));
    writer.finish()?;
    env.mark_end();
    env.write(&opts.out)?;

    if let (Some(script), Some(dir)) = (&opts.torch, &opts.data_dir) {
        run_anchor(
            &opts.python,
            script,
            dir,
            &opts.out.join("anchors").join("torch.jsonl"),
        );
    }
    if opts.clean_data {
        if let Some(dir) = &opts.data_dir {
            std::fs::remove_dir_all(dir).map_err(|e| BenchError::io(dir, e))?;
        }
    }
    Ok(written)
}

/// Runs an anchor script on the data folder. Its failure is logged, not
/// fatal: the campaign's own rows are already written.
fn run_anchor(python: &str, script: &Path, data: &Path, out: &Path) {
    if let Some(dir) = out.parent() {
        if let Err(e) = std::fs::create_dir_all(dir) {
            tracing::error!("{}: {e}", dir.display());
            return;
        }
    }
    let t = Instant::now();
    let status = std::process::Command::new(python)
        .arg(script)
        .arg("--data")
        .arg(data)
        .arg("--out")
        .arg(out)
        .status();
    match status {
        Ok(s) if s.success() => tracing::info!(
            secs = t.elapsed().as_secs_f64(),
            "anchor {} wrote {}",
            script.display(),
            out.display()
        ),
        Ok(s) => tracing::error!("anchor {} failed: {s}", script.display()),
        Err(e) => tracing::error!("anchor {} could not start: {e}", script.display()),
    }
}

fn progress_bar(total: u64, visible: bool) -> ProgressBar {
    if !visible {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    if let Ok(style) =
        ProgressStyle::with_template("{elapsed_precise} [{bar:40}] {pos}/{len} {msg}")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    bar
}

/// One (N, D): references, backends, and every configuration's records.
struct Group<'a> {
    spec: &'a Spec,
    backend: Backend,
    corpus: ArrayView2<'a, f32>,
    queries: ArrayView2<'a, f32>,
    host_bw: f64,
    gpu_bw: Option<f64>,
}

impl Group<'_> {
    fn run(&self, emit: &mut dyn FnMut(Record) -> Result<()>) -> Result<()> {
        let (n, d) = self.corpus.dim();
        let spec = self.spec;
        let configs = spec.configs(n, d, self.backend);
        let max_batch = spec.batches.iter().copied().max().unwrap_or(1);

        // The oracle owns a copy of the corpus: build it, answer, drop it,
        // so the group never holds more than one extra copy at a time.
        let t = Instant::now();
        let oracle_ref = {
            let oracle = gate::oracle(self.corpus, spec.metric)?;
            Reference::compute(
                "oracle",
                &oracle,
                self.queries,
                ORACLE_GATE_QUERIES,
                spec.k_max(),
            )?
        };
        tracing::info!(n, d, secs = t.elapsed().as_secs_f64(), "oracle reference");

        let cpu = backends::host(Backend::Cpu, self.corpus, spec.metric);
        let cpu = match cpu {
            Ok(c) => c,
            Err(e) => return self.fail_all(&configs, &e.to_string(), emit),
        };

        match self.backend {
            Backend::Cuda => self.run_gpu(&configs, &oracle_ref, cpu.as_ref(), max_batch, emit),
            _ => {
                let own;
                let host: &dyn Retriever = if self.backend == Backend::Cpu {
                    cpu.as_ref()
                } else {
                    drop(cpu);
                    own = match backends::host(self.backend, self.corpus, spec.metric) {
                        Ok(r) => r,
                        Err(e) => return self.fail_all(&configs, &e.to_string(), emit),
                    };
                    own.as_ref()
                };
                for cfg in &configs {
                    let cfg = self.cpu_cfg(cfg, self.backend);
                    let refs = [&oracle_ref];
                    let plan = self.plan(&cfg, TimedPath::Cpu, &refs, Some(self.host_bw));
                    emit(measure(&plan, &mut HostSearch::new(host)))?;
                }
                Ok(())
            }
        }
    }

    fn run_gpu(
        &self,
        configs: &[RunConfig],
        oracle_ref: &Reference,
        cpu: &dyn Retriever,
        max_batch: usize,
        emit: &mut dyn FnMut(Record) -> Result<()>,
    ) -> Result<()> {
        let (n, d) = self.corpus.dim();
        let spec = self.spec;
        // Batches are checked in full against the CPU backend (bit-identical
        // to the oracle by its own tests, and fast enough for 256 queries of
        // 1M rows), on top of the oracle on the first queries.
        let batch_ref = if spec.batches.is_empty() {
            None
        } else {
            let t = Instant::now();
            let r = Reference::compute_batch("cpu", cpu, self.queries, max_batch, spec.batch_k)?;
            tracing::info!(
                n,
                d,
                secs = t.elapsed().as_secs_f64(),
                "cpu batch reference"
            );
            Some(r)
        };
        let gpu = match Gpu::new(self.corpus, spec.metric, spec.k_max(), max_batch) {
            Ok(g) => g,
            Err(e) => return self.fail_all(configs, &e.to_string(), emit),
        };
        let k_max = spec.k_max();
        let mut device = gpu.device(self.queries);
        let mut trip = gpu.roundtrip(cpu, self.queries, k_max);
        for cfg in configs {
            let mut refs: Vec<&Reference> = vec![oracle_ref];
            if cfg.batch > 1 {
                refs.extend(batch_ref.as_ref());
            }
            let plan = self.plan(cfg, TimedPath::Resident, &refs, self.gpu_bw);
            emit(measure(&plan, &mut gpu.resident()))?;

            // The CPU paths are checked against the oracle only: checking the
            // CPU backend against itself would prove nothing.
            let cpu_refs = [oracle_ref];
            let plan = self.plan(cfg, TimedPath::Device, &refs, self.gpu_bw);
            emit(match &mut device {
                Ok(dev) => measure(&plan, dev),
                Err(e) => failed(&plan, e),
            })?;
            if cfg.batch == 1 {
                let rt_cfg = self.cpu_cfg(cfg, Backend::Cuda);
                let plan = self.plan(&rt_cfg, TimedPath::CpuRoundtrip, &cpu_refs, self.gpu_bw);
                emit(match &mut trip {
                    Ok(t) => measure(&plan, t),
                    Err(e) => failed(&plan, e),
                })?;
            } else {
                // A batch's transfers are negligible next to its CPU work, and
                // the round-trip helper is single-query: time the CPU batch on
                // the host.
                let host_cfg = self.cpu_cfg(cfg, Backend::Cpu);
                let plan = self.plan(&host_cfg, TimedPath::Cpu, &cpu_refs, self.gpu_bw);
                emit(measure(&plan, &mut HostSearch::new(cpu)))?;
            }
        }
        Ok(())
    }

    /// A configuration timed on the CPU: fewer trials for big ones.
    fn cpu_cfg(&self, cfg: &RunConfig, backend: Backend) -> RunConfig {
        let (trials, warmup) = cpu_trials(cfg.n, cfg.d, cfg.batch, self.spec.cpu_trials);
        RunConfig {
            trials,
            warmup,
            backend,
            ..cfg.clone()
        }
    }

    fn plan<'p>(
        &'p self,
        cfg: &'p RunConfig,
        path: TimedPath,
        refs: &'p [&'p Reference],
        bandwidth: Option<f64>,
    ) -> Plan<'p> {
        Plan {
            cfg,
            path,
            queries: self.queries,
            refs,
            data: "gaussian",
            bandwidth,
            approximate: false,
        }
    }

    /// Emits a failed record for every configuration (a backend that could
    /// not be built fails its whole group, and the campaign goes on).
    fn fail_all(
        &self,
        configs: &[RunConfig],
        why: &str,
        emit: &mut dyn FnMut(Record) -> Result<()>,
    ) -> Result<()> {
        tracing::warn!(
            "group N={} D={} failed: {why}",
            self.corpus.nrows(),
            self.corpus.ncols()
        );
        for cfg in configs {
            let paths: &[TimedPath] = match (self.backend, cfg.batch) {
                (Backend::Cuda, 1) => &[
                    TimedPath::Resident,
                    TimedPath::Device,
                    TimedPath::CpuRoundtrip,
                ],
                (Backend::Cuda, _) => &[TimedPath::Resident, TimedPath::Device, TimedPath::Cpu],
                _ => &[TimedPath::Cpu],
            };
            for &path in paths {
                let cfg = match path {
                    TimedPath::Cpu => self.cpu_cfg(cfg, Backend::Cpu),
                    TimedPath::CpuRoundtrip => self.cpu_cfg(cfg, Backend::Cuda),
                    _ => cfg.clone(),
                };
                let plan = self.plan(&cfg, path, &[], None);
                let mut rec = blank_record(&plan);
                rec.correct = Some(false);
                rec.error = Some(why.to_owned());
                emit(rec)?;
            }
        }
        Ok(())
    }
}

/// The default data folder of a results folder.
pub fn default_data_dir(out: &Path) -> PathBuf {
    out.join("data")
}

//! The GPU graph-search sweep: GPU graph search, CPU HNSW and the exact GPU
//! engine side by side, on one graph, in one process.
//!
//! For each data set (the seeded Gaussian-cluster corpus, and the MiniLM set
//! when `--minilm DIR` names it):
//!
//! 1. the exact GPU engine uploads the corpus and answers every query with
//!    K = `--k`: the ground truth (exact, bit-identical to the CPU oracle);
//! 2. the graph is built, timed, on every host thread
//!    (`Hnsw::build_parallel`'s build) and by each GPU build of
//!    `--gpu-build` (default: `Hnsw::build_batched_gpu`), with the same
//!    parameters; each graph's recall@k is measured at every
//!    `ef` of the sweep;
//! 3. for every batch size and `ef`: QPS and per-batch latency (median and
//!    p90 over repetitions after a warm-up) of GPU graph search on the CPU
//!    graph, CPU HNSW (all threads for batches, one thread one query at a
//!    time for batch 1), and the exact GPU engine (one point per batch
//!    size), each with its recall@k;
//! 4. checks: GPU graph search returns the CPU HNSW results on the same
//!    graph, and a query's GPU result does not depend on the batch it is in
//!    (every timed batch is compared with the one-call pass over all
//!    queries).
//!
//! Writes `raw.jsonl` (one line per measurement), `table.md`,
//! `recall_qps.svg` / `.png` (and `recall_qps_minilm.*`) and
//! `environment.json` under `--out`. `--cpu-only` skips every GPU part
//! (ground truth from the CPU oracle) for a machine without a GPU. A part
//! that fails (the GPU build, a graph upload, a point) is recorded in
//! `raw.jsonl` and `table.md` and the rest of the sweep goes on; past
//! `--deadline-s` the remaining points are skipped, so the outputs are
//! always written. The defaults (1M × 384, both sets) take about four
//! minutes on an H200 with a 16-core host.
//!
//! ```text
//! cargo run --release -p topk-hnsw --features cuda --example graph_sweep -- --out graph-sweep
//! cargo run --release -p topk-hnsw --features cuda --example graph_sweep -- --n 20000 --queries 1000 --cpu-only --budget-s 0.3 --out /tmp/gs
//! ```

mod args;
mod data;
mod graph;
mod plot;
mod report;
mod sweep;
mod timing;

use std::fs::File;
use std::io::BufWriter;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;

use crate::args::{check_args, Args};
use crate::data::{gauss, read_minilm, Dataset};
use crate::plot::plot;
use crate::report::{environment, table, Sink};
use crate::sweep::run_dataset;

/// The target of every log line, whichever module writes it: the example's
/// name, as `RUST_LOG=graph_sweep=…` filters expect.
pub(crate) const LOG: &str = "graph_sweep";

pub(crate) type AnyResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// GPU graph search over the CPU-built graph.
pub(crate) const GPU_GRAPH: &str = "gpu-graph";
/// GPU graph search over the GPU-built graph (batch sizes 1 and the largest).
pub(crate) const GPU_GRAPH_GPU_BUILT: &str = "gpu-graph (gpu-built graph)";
/// GPU graph search over the CPU-built graph expanding `--walk-width`
/// nodes per step (run when the width is above 1).
pub(crate) const GPU_GRAPH_WIDE: &str = "gpu-graph (wide)";
/// topk-hnsw's CPU search over the CPU-built graph.
pub(crate) const CPU_HNSW: &str = "cpu-hnsw";
/// The exact GPU engine.
pub(crate) const EXACT_GPU: &str = "exact-gpu";

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("graph_sweep: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(a: Args) -> AnyResult<()> {
    check_args(&a)?;
    let started = Instant::now();
    let threads = if a.threads == 0 {
        std::thread::available_parallelism().map_or(1, |p| p.get())
    } else {
        a.threads
    };
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build_global()?;
    std::fs::create_dir_all(&a.out)?;
    let mut sink = Sink {
        file: BufWriter::new(File::create(a.out.join("raw.jsonl"))?),
    };
    let mut env = environment(&a, threads);

    let mut datasets: Vec<Dataset> = Vec::new();
    // The small set first: its numbers are in even if the large one runs
    // out of time.
    if let Some(dir) = &a.minilm {
        match read_minilm(dir, a.minilm_metric) {
            Ok(ds) => datasets.push(ds),
            Err(e) => {
                tracing::warn!("MiniLM set skipped: {e}");
                sink.emit(&json!({"what": "dataset_skipped", "dataset": "minilm", "path": dir.display().to_string(), "reason": e.to_string()}))?;
            }
        }
    }
    if !a.no_gauss {
        datasets.push(gauss(&a)?);
    }

    let mut summaries = Vec::new();
    let mut devices = Vec::new();
    for ds in &datasets {
        let s = run_dataset(&a, ds, threads, started, &mut sink, &mut devices)?;
        summaries.push(s);
    }
    if let Some(dev) = devices.first() {
        env["device"] = dev.clone();
    }
    env["seconds"] = started.elapsed().as_secs_f64().into();
    std::fs::write(
        a.out.join("environment.json"),
        serde_json::to_string_pretty(&env)?,
    )?;
    std::fs::write(a.out.join("table.md"), table(&a, &summaries))?;
    for s in &summaries {
        let stem = if s.dataset.starts_with("minilm") {
            "recall_qps_minilm"
        } else {
            "recall_qps"
        };
        plot(&a.out, stem, s, a.recall_target)?;
    }
    tracing::info!(
        "wrote {} in {:.0} s",
        a.out.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

pub(crate) fn spinner(msg: &'static str) -> ProgressBar {
    let pb = ProgressBar::new_spinner();
    pb.set_message(msg);
    pb.enable_steady_tick(Duration::from_millis(200));
    pb
}

pub(crate) fn bar(len: u64, what: &str) -> ProgressBar {
    let pb = ProgressBar::new(len);
    let style = ProgressStyle::with_template(&format!(
        "{what} [{{elapsed_precise}}] {{bar:40}} {{pos}}/{{len}} {{msg}}"
    ))
    .unwrap_or_else(|_| ProgressStyle::default_bar());
    pb.set_style(style);
    pb
}

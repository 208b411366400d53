//! The command line of `topk_demo`.

use std::path::PathBuf;

use clap::{Parser, ValueEnum};
use topk_core::Metric;

use topk::Backend;

const ABOUT: &str = "Exact top-K vector retrieval, bit-identical on every backend.";

const LONG_ABOUT: &str = "\
Exact top-K vector retrieval, bit-identical on every backend.

With no arguments, runs the smoke story: a seeded corpus of 4,096 Gaussian rows
(D = 128, L2-normalised), 16 Gaussian queries, K = 8, and prints the neighbours
of the first queries together with the backend that ran.

With --corpus and --queries it searches your own files (.npy float32 in C order,
.fvecs, or .bvecs) and can write every result with --out.";

const AFTER_HELP: &str = "\
Examples:
  topk_demo
  topk_demo --backend oracle --n 10000 --d 384 --k 10
  topk_demo --corpus corpus.npy --queries queries.fvecs --k 100 --metric cosine --out hits.jsonl
  topk_demo --corpus corpus.npy --queries queries.npy --out hits.npy   # also writes hits.scores.npy

Timings are logged on stderr at info level; set RUST_LOG=warn to silence them.";

/// Arguments of `topk_demo`.
#[derive(Debug, Parser)]
#[command(name = "topk_demo", version, about = ABOUT, long_about = LONG_ABOUT, after_help = AFTER_HELP)]
pub struct Args {
    /// Corpus rows: .npy (float32, C order), .fvecs or .bvecs.
    #[arg(long, value_name = "FILE", requires = "queries")]
    pub corpus: Option<PathBuf>,

    /// Query rows, same formats; every query needs the corpus's D.
    #[arg(long, value_name = "FILE", requires = "corpus")]
    pub queries: Option<PathBuf>,

    /// Neighbours per query (K > N returns all N rows).
    #[arg(short, long, default_value_t = 8)]
    pub k: usize,

    /// Similarity: inner product, cosine, or (negated squared) Euclidean distance.
    #[arg(long, value_enum, default_value_t = MetricArg::Dot)]
    pub metric: MetricArg,

    /// Which engine answers.
    #[arg(long, value_enum, default_value_t = Backend::Cpu)]
    pub backend: Backend,

    /// Write every result: FILE.jsonl (one line per query) or FILE.npy
    /// (uint32 indices, Q x K) plus FILE.scores.npy (float32 scores, Q x K).
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,

    /// Synthetic story: corpus rows.
    #[arg(long, default_value_t = 4096, conflicts_with = "corpus")]
    pub n: usize,

    /// Synthetic story: values per row.
    #[arg(long, default_value_t = 128, conflicts_with = "corpus")]
    pub d: usize,

    /// Synthetic story: number of queries.
    #[arg(long, default_value_t = 16, conflicts_with = "corpus")]
    pub nq: usize,

    /// Synthetic story: seed of the corpus and query rows.
    #[arg(long, default_value_t = 42, conflicts_with = "corpus")]
    pub seed: u64,

    /// HNSW (`--backend hnsw`): links per node on the upper layers (M); layer 0 keeps 2M.
    #[arg(long, default_value_t = 16)]
    pub m: usize,

    /// HNSW: beam width while building the graph.
    #[arg(long, default_value_t = 100)]
    pub ef_construction: usize,

    /// HNSW: beam width of a search (values below K are raised to K).
    #[arg(long, default_value_t = 64)]
    pub ef: usize,

    /// How many queries to print the neighbours of.
    #[arg(long, default_value_t = 3, value_name = "QUERIES")]
    pub show: usize,
}

impl Args {
    /// The HNSW parameters of `--m`, `--ef-construction` and `--ef`.
    pub fn hnsw_params(&self) -> topk::HnswParams {
        topk::HnswParams {
            m: self.m,
            ef_construction: self.ef_construction,
            ef_search: self.ef,
            ..topk::HnswParams::default()
        }
    }
}

/// The metric names accepted on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum MetricArg {
    /// Inner product (higher is closer).
    Dot,
    /// Cosine similarity.
    Cosine,
    /// Euclidean: results show the squared distance.
    L2,
}

impl From<MetricArg> for Metric {
    fn from(m: MetricArg) -> Metric {
        match m {
            MetricArg::Dot => Metric::Dot,
            MetricArg::Cosine => Metric::Cosine,
            MetricArg::L2 => Metric::L2,
        }
    }
}

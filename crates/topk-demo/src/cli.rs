//! The command line of `topk_demo`.

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};
use topk_core::Metric;

use topk::Backend;

const ABOUT: &str = "Exact top-K vector retrieval, bit-identical on every backend.";

const LONG_ABOUT: &str = "\
Exact top-K vector retrieval, bit-identical on every backend.

With no arguments, runs the smoke story: a seeded corpus of 4,096 Gaussian rows
(D = 128, L2-normalised), 16 Gaussian queries, K = 8, and prints the neighbours
of the first queries together with the backend that ran.

With --corpus and --queries it searches your own files (.npy float32 in C order,
.fvecs, or .bvecs) and can write every result with --out.

`topk_demo index ...` builds, changes, searches and describes index files
(external ids, add / remove, filtered search); see `topk_demo index --help`.";

const AFTER_HELP: &str = "\
Examples:
  topk_demo
  topk_demo --backend oracle --n 10000 --d 384 --k 10
  topk_demo --corpus corpus.npy --queries queries.fvecs --k 100 --metric cosine --out hits.jsonl
  topk_demo --corpus corpus.npy --queries queries.npy --out hits.npy   # also writes hits.scores.npy
  topk_demo index build --corpus corpus.npy --ids ids.npy --metric cosine --out docs.topkidx
  topk_demo index search --index docs.topkidx --queries queries.npy --filter allowed.npy --k 10
  topk_demo index build --corpus corpus.npy --backend hnsw --out docs.hnsw.topkidx
  topk_demo index search --index docs.hnsw.topkidx --queries queries.npy --k 10 --recall-sample 100

Timings are logged on stderr at info level; set RUST_LOG=warn to silence them.
Long steps (loading, building, uploading, saving) show progress on stderr when it
is a terminal; --no-progress turns it off.";

/// Arguments of `topk_demo`.
#[derive(Debug, Parser)]
#[command(
    name = "topk_demo",
    version,
    about = ABOUT,
    long_about = LONG_ABOUT,
    after_help = AFTER_HELP
)]
pub struct Args {
    /// Index files (docs/CONTRACTS.md §10); without a command, the search story.
    #[command(subcommand)]
    pub command: Option<Command>,

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
    #[arg(long, value_enum, ignore_case = true, default_value_t = MetricArg::Dot)]
    pub metric: MetricArg,

    /// Which engine answers.
    #[arg(long, value_enum, ignore_case = true, default_value_t = Backend::Cpu)]
    pub backend: Backend,

    /// How the corpus is stored: f16 and bf16 round each value once and
    /// search the stored values exactly (docs/CONTRACTS.md §14); cpu and
    /// oracle hold them at half the bytes.
    #[arg(long, value_enum, ignore_case = true, default_value_t = DtypeArg::F32)]
    pub dtype: DtypeArg,

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

    /// HNSW: after the search, compare the results of N sampled queries
    /// (seeded) with exact search and print recall@K in the report. The
    /// corpus is then held twice in memory (the index's copy and the exact
    /// search's).
    #[arg(long, value_name = "N")]
    pub recall_sample: Option<usize>,

    /// How many queries to print the neighbours of.
    #[arg(long, default_value_t = 3, value_name = "QUERIES")]
    pub show: usize,

    /// Show no progress on stderr. Progress bars are drawn on stderr only
    /// when it is a terminal; when stderr is a file or a pipe, the HNSW build
    /// logs an info line every 10 % instead. Stdout carries only the report.
    #[arg(long, global = true)]
    pub no_progress: bool,
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
    #[value(alias = "ip", alias = "inner")]
    Dot,
    /// Cosine similarity.
    #[value(alias = "cos")]
    Cosine,
    /// Euclidean: results show the squared distance.
    #[value(alias = "euclidean")]
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

/// The commands of `topk_demo`.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Build, change, search and describe index files.
    #[command(subcommand)]
    Index(IndexCommand),
}

/// `topk_demo index ...`: index files, saved atomically after every change.
///
/// Id files (`--ids`, `--filter`) are `.npy` of uint32, int32, int64 or
/// uint64 of any shape (`np.save("ids.npy", np.arange(n))` saves one axis),
/// or `.ivecs`; every value of the file is one id, in row-major order.
#[derive(Debug, Subcommand)]
pub enum IndexCommand {
    /// Builds an index file from a corpus file (ids 0..N-1 without --ids).
    Build {
        /// Corpus rows: .npy (float32, C order), .fvecs or .bvecs.
        #[arg(long, value_name = "FILE")]
        corpus: PathBuf,
        /// One id per corpus row.
        #[arg(long, value_name = "FILE")]
        ids: Option<PathBuf>,
        /// Similarity of the index's searches.
        #[arg(long, value_enum, ignore_case = true, default_value_t = MetricArg::Dot)]
        metric: MetricArg,
        /// The index file to write.
        #[arg(long, value_name = "FILE")]
        out: PathBuf,
        /// `hnsw` builds an HNSW graph and saves it in the file; the exact
        /// backends save the rows only.
        #[arg(long, value_enum, ignore_case = true, default_value_t = IndexBackendArg::Cpu)]
        backend: IndexBackendArg,
        /// HNSW: links per node on the upper layers (M); layer 0 keeps 2M.
        #[arg(long, default_value_t = 16)]
        m: usize,
        /// HNSW: beam width while building the graph.
        #[arg(long, default_value_t = 100)]
        ef_construction: usize,
        /// HNSW: beam width of later searches, saved in the file (values
        /// below K are raised to K).
        #[arg(long, default_value_t = 64)]
        ef: usize,
        /// How the rows are stored: f16 and bf16 take half the bytes, each
        /// value rounded once; searches are exact over the stored values
        /// (docs/CONTRACTS.md §14). The file keeps the type.
        #[arg(long, value_enum, ignore_case = true, default_value_t = DtypeArg::F32)]
        dtype: DtypeArg,
    },
    /// Adds rows to an index file (ids after the largest one without --ids).
    Add {
        /// The index file, rewritten in place.
        #[arg(long, value_name = "FILE")]
        index: PathBuf,
        /// Rows to add, same formats as a corpus.
        #[arg(long, value_name = "FILE")]
        rows: PathBuf,
        /// One id per row.
        #[arg(long, value_name = "FILE")]
        ids: Option<PathBuf>,
        /// Replace the rows of ids already present instead of refusing them.
        #[arg(long, requires = "ids")]
        upsert: bool,
    },
    /// Removes ids from an index file (absent ids are ignored).
    Remove {
        /// The index file, rewritten in place.
        #[arg(long, value_name = "FILE")]
        index: PathBuf,
        /// The ids to remove.
        #[arg(long, value_name = "FILE")]
        ids: PathBuf,
    },
    /// Searches an index file, optionally among the ids of a filter file only.
    Search {
        /// The index file.
        #[arg(long, value_name = "FILE")]
        index: PathBuf,
        /// Query rows, same formats as a corpus.
        #[arg(long, value_name = "FILE")]
        queries: PathBuf,
        /// Allowed ids, shared by every query.
        #[arg(long, value_name = "FILE")]
        filter: Option<PathBuf>,
        /// Neighbours per query.
        #[arg(short, long, default_value_t = 8)]
        k: usize,
        /// Which engine answers: hnsw when the file holds a graph, cpu
        /// otherwise, unless given.
        #[arg(long, value_enum, ignore_case = true)]
        backend: Option<IndexBackendArg>,
        /// HNSW: beam width of this search (the file's by default).
        #[arg(long)]
        ef: Option<usize>,
        /// Compare the results of N sampled queries (seeded) with exact
        /// search on the same file and print recall@K on stderr and in the
        /// report. The file's rows are then held twice in memory.
        #[arg(long, value_name = "N")]
        recall_sample: Option<usize>,
        /// How many queries to print the neighbours of.
        #[arg(long, default_value_t = 3, value_name = "QUERIES")]
        show: usize,
    },
    /// Describes an index file: rows, dimension, metric.
    Info {
        /// The index file.
        #[arg(long, value_name = "FILE")]
        index: PathBuf,
    },
}

/// The storage types of an index file's rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DtypeArg {
    /// 4-byte IEEE single, as given.
    #[value(alias = "float32", alias = "fp32")]
    F32,
    /// 2-byte IEEE half (values up to 65504).
    #[value(alias = "float16", alias = "fp16", alias = "half")]
    F16,
    /// 2-byte bfloat16 (the range of f32, 8 significant bits).
    #[value(alias = "bfloat16")]
    Bf16,
}

impl From<DtypeArg> for topk::Dtype {
    fn from(d: DtypeArg) -> topk::Dtype {
        match d {
            DtypeArg::F32 => topk::Dtype::F32,
            DtypeArg::F16 => topk::Dtype::F16,
            DtypeArg::Bf16 => topk::Dtype::Bf16,
        }
    }
}

/// The backends an index file opens on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum IndexBackendArg {
    /// SIMD kernels on every core.
    Cpu,
    /// The scalar reference.
    Oracle,
    /// An HNSW graph: approximate, exact under very selective filters.
    Hnsw,
}

impl From<IndexBackendArg> for topk::IndexBackend {
    fn from(b: IndexBackendArg) -> topk::IndexBackend {
        match b {
            IndexBackendArg::Cpu => topk::IndexBackend::Cpu,
            IndexBackendArg::Oracle => topk::IndexBackend::Oracle,
            IndexBackendArg::Hnsw => topk::IndexBackend::Hnsw,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every name the core types parse (docs/CONTRACTS.md: any case, the
    /// aliases) is accepted on the command line and means the same.
    #[test]
    fn the_command_line_takes_every_name_the_core_types_take() {
        for name in [
            "dot",
            "ip",
            "inner",
            "IP",
            "cosine",
            "cos",
            "Cosine",
            "l2",
            "euclidean",
            "L2",
        ] {
            let want: Metric = name.parse().expect("core name");
            let got = MetricArg::from_str(name, true).expect("command-line name");
            assert_eq!(Metric::from(got), want, "{name}");
            let args = Args::try_parse_from(["topk_demo", "--metric", name]).expect(name);
            assert_eq!(Metric::from(args.metric), want, "{name}");
        }
        for name in [
            "f32", "float32", "fp32", "F32", "f16", "float16", "fp16", "half", "bf16", "bfloat16",
            "BF16",
        ] {
            let want: topk::Dtype = name.parse().expect("core name");
            let args = Args::try_parse_from(["topk_demo", "--dtype", name]).expect(name);
            assert_eq!(topk::Dtype::from(args.dtype), want, "{name}");
        }
        for name in ["cpu", "CPU", "Oracle", "gpu", "CUDA", "hnsw"] {
            let want: Backend = name.parse().expect("core name");
            let args = Args::try_parse_from(["topk_demo", "--backend", name]).expect(name);
            assert_eq!(args.backend, want, "{name}");
        }
        assert!(Args::try_parse_from(["topk_demo", "--metric", "hamming"]).is_err());
    }
}

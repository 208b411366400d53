//! `topk_bench`: one configuration from flags, or a subcommand (the
//! campaign, the CPU comparison, joining, tables and plots).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use topk::HnswParams;
use topk_bench::campaign::{self, Spec};
use topk_bench::compare::{self, CompareSpec};
use topk_bench::config::{Backend, RunConfig};
use topk_bench::error::{BenchError, Result};
use topk_bench::join;
use topk_bench::plot;
use topk_bench::single::{self, SingleRun};
use topk_bench::table::{self, RunFacts};
use topk_core::Metric;

/// Exact top-K retrieval benchmarks: every configuration is checked against
/// the scalar oracle bit for bit before it is timed.
///
/// Without a subcommand, runs one configuration and prints one
/// `TOPK_BENCH_JSON {...}` line per timed path (two for `--backend cuda`:
/// GPU-resident and the CPU round-trip baseline). Exit status: 0 when every
/// path was exact, 2 when a path failed the correctness check (it is then not
/// timed), 1 on an error. `--backend hnsw` is approximate: it is timed
/// whatever its answers, and its line carries recall@K against the oracle.
#[derive(Parser, Debug)]
#[command(name = "topk_bench", version, args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Args, Debug)]
struct RunArgs {
    /// Corpus rows (with --corpus: use this many leading rows; default all).
    #[arg(long)]
    n: Option<usize>,
    /// Values per row (with --corpus: must match the file).
    #[arg(long)]
    d: Option<usize>,
    /// Neighbours per query.
    #[arg(long, default_value_t = 100)]
    k: usize,
    /// Timed trials (the statistics are over these).
    #[arg(long, default_value_t = 20)]
    trials: usize,
    /// Untimed runs before the trials.
    #[arg(long, default_value_t = 3)]
    warmup: usize,
    /// Seed of the Gaussian corpus and queries.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// dot, cosine or l2.
    #[arg(long, default_value = "dot")]
    metric: String,
    /// cpu, cuda, oracle or hnsw.
    #[arg(long, default_value = "cpu")]
    backend: String,
    /// Queries per call (1: single-query search; more: one batch call).
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// Corpus file (.npy, .fvecs, .bvecs) instead of Gaussian rows.
    #[arg(long)]
    corpus: Option<PathBuf>,
    /// Query file (default: Gaussian queries of the corpus's D).
    #[arg(long)]
    queries: Option<PathBuf>,
    /// Queries the oracle checks before timing.
    #[arg(long, default_value_t = 4)]
    gate_queries: usize,
    /// Gaussian queries generated (single-query trials rotate through them).
    #[arg(long, default_value_t = 64)]
    query_pool: usize,
    /// Skip measuring the memory bandwidth (no floor in the record).
    #[arg(long)]
    no_floor: bool,
    /// HNSW: links per node.
    #[arg(long, default_value_t = HnswParams::default().m)]
    m: usize,
    /// HNSW: beam width while building.
    #[arg(long, default_value_t = HnswParams::default().ef_construction)]
    ef_construction: usize,
    /// HNSW: beam width of a search.
    #[arg(long, default_value_t = HnswParams::default().ef_search)]
    ef: usize,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// The docs/CONTRACTS.md §6 campaign in one process: results.jsonl, results.csv,
    /// environment.json and the .npy data the anchors load.
    Campaign {
        /// Results folder.
        #[arg(long)]
        out: PathBuf,
        /// A small subset (seconds), to check the tooling.
        #[arg(long)]
        quick: bool,
        /// Where the .npy corpus/queries go (default OUT/data).
        #[arg(long)]
        data: Option<PathBuf>,
        /// Write no .npy data.
        #[arg(long, conflicts_with = "data")]
        no_data: bool,
        /// cuda (resident + CPU round trip; the default in CUDA builds) or cpu.
        #[arg(long)]
        backend: Option<String>,
        /// No progress bar.
        #[arg(long)]
        no_progress: bool,
        /// After the campaign, run this torch anchor script on the same data
        /// (writes OUT/anchors/torch.jsonl; then OUT/joined.csv is written).
        #[arg(long)]
        torch: Option<PathBuf>,
        /// Python interpreter for --torch.
        #[arg(long, default_value = "python3")]
        python: String,
        /// Delete the data folder at the end (it holds gigabytes).
        #[arg(long)]
        clean_data: bool,
    },
    /// topk's side of the CPU comparison (numpy / faiss-cpu run next, on the same files).
    CpuCompare {
        /// Results folder.
        #[arg(long)]
        out: PathBuf,
        /// Where the .npy corpus/queries and manifest go.
        #[arg(long)]
        data: PathBuf,
        /// A small subset (seconds).
        #[arg(long)]
        quick: bool,
    },
    /// Join results.jsonl with anchors/*.jsonl into joined.csv.
    Join {
        /// Results folder.
        dir: PathBuf,
    },
    /// Draw the plots of a results folder into DIR/plots (PNG + SVG).
    Plot {
        /// Results folder.
        dir: PathBuf,
    },
    /// Write the headline markdown table of a results folder (into a README
    /// between its bench-table markers, or to stdout).
    Table {
        /// Results folder.
        dir: PathBuf,
        /// README to update between `<!-- bench-table:start -->` and `<!-- bench-table:end -->`.
        #[arg(long)]
        readme: Option<PathBuf>,
        /// How the folder is named in the table's first line (default: DIR as given).
        #[arg(long)]
        source: Option<String>,
    },
    /// Write DIR/table.md: the CPU comparison table of a cpu-compare folder.
    CpuTable {
        /// Results folder.
        dir: PathBuf,
        /// Notes printed under the heading.
        #[arg(long, default_value = "")]
        notes: String,
    },
    /// 1M–20M rows on the GPU: one engine, one `cuda` index and sets of
    /// `cuda` shards, timed and checked bit for bit (OUT/scale.jsonl, OUT/scale.md).
    Scale {
        /// Results folder.
        #[arg(long)]
        out: PathBuf,
        /// Corpus sizes, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "1000000")]
        ns: Vec<usize>,
        /// Dimensions, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "1024")]
        ds: Vec<usize>,
        /// Shard counts of the sharded sets (none: engine and index only).
        #[arg(long, value_delimiter = ',', default_value = "2,4")]
        shards: Vec<usize>,
        /// Device ordinals the shards go to, in turn.
        #[arg(long, value_delimiter = ',', default_value = "0")]
        devices: Vec<usize>,
        /// K.
        #[arg(long, default_value_t = 100)]
        k: usize,
        /// Batch size.
        #[arg(long, default_value_t = 256)]
        batch: usize,
        /// Timed single queries.
        #[arg(long, default_value_t = 100)]
        trials: usize,
        /// Timed batches.
        #[arg(long, default_value_t = 10)]
        batch_trials: usize,
        /// Queries checked bit for bit against the CPU backend.
        #[arg(long, default_value_t = 4)]
        check: usize,
        /// No sharded sets above this many rows.
        #[arg(long, default_value_t = usize::MAX)]
        shard_max_rows: usize,
    },
    /// Measure this machine's memory bandwidth (read pass and copy).
    Membw {
        /// Buffer size in MiB.
        #[arg(long, default_value_t = 1024)]
        mib: usize,
    },
}

fn parse_run(a: &RunArgs) -> Result<SingleRun> {
    let metric: Metric = a.metric.parse()?;
    let backend: Backend = a.backend.parse()?;
    let def = RunConfig::default();
    Ok(SingleRun {
        cfg: RunConfig {
            n: a.n.unwrap_or(def.n),
            d: a.d.unwrap_or(def.d),
            k: a.k,
            trials: a.trials,
            warmup: a.warmup,
            seed: a.seed,
            metric,
            backend,
            batch: a.batch,
        },
        n_given: a.n.is_some(),
        d_given: a.d.is_some(),
        corpus: a.corpus.clone(),
        queries: a.queries.clone(),
        gate_queries: a.gate_queries,
        query_pool: a.query_pool,
        floor: !a.no_floor,
        hnsw: HnswParams {
            m: a.m,
            ef_construction: a.ef_construction,
            ef_search: a.ef,
            ..HnswParams::default()
        },
    })
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match dispatch(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn dispatch(cli: Cli) -> Result<ExitCode> {
    let Some(cmd) = cli.command else {
        let run = parse_run(&cli.run)?;
        if run.corpus.is_none() && run.queries.is_some() {
            return Err(BenchError::flag(
                "queries",
                run.queries
                    .as_ref()
                    .map(|p| p.display().to_string())
                    .unwrap_or_default(),
                "query files go with a --corpus file",
            ));
        }
        let records = single::run(&run)?;
        let mut all_exact = true;
        for r in &records {
            println!("{}", r.to_line());
            all_exact &= r.correct == Some(true) || (r.correct.is_none() && r.recall.is_some());
        }
        return Ok(if all_exact {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(2)
        });
    };
    match cmd {
        Command::Campaign {
            out,
            quick,
            data,
            no_data,
            backend,
            no_progress,
            torch,
            python,
            clean_data,
        } => {
            let backend = match backend {
                Some(b) => b.parse()?,
                None if cfg!(feature = "cuda") => Backend::Cuda,
                None => Backend::Cpu,
            };
            let data_dir = if no_data {
                None
            } else {
                Some(data.unwrap_or_else(|| campaign::default_data_dir(&out)))
            };
            let opts = campaign::Options {
                out: out.clone(),
                data_dir,
                spec: if quick { Spec::quick() } else { Spec::full() },
                backend,
                echo: true,
                progress: !no_progress,
                torch,
                python,
                clean_data,
            };
            let n = campaign::run(&opts)?;
            let rows = join::join_dir(&out)?;
            eprintln!(
                "{n} records, {} joined rows in {}",
                rows.len(),
                out.display()
            );
        }
        Command::CpuCompare { out, data, quick } => {
            let spec = if quick {
                CompareSpec::quick()
            } else {
                CompareSpec::full()
            };
            let n = compare::run(&spec, &out, &data, true)?;
            eprintln!("{n} records in {}", out.display());
        }
        Command::Join { dir } => {
            let rows = join::join_dir(&dir)?;
            eprintln!(
                "{} rows in {}",
                rows.len(),
                dir.join("joined.csv").display()
            );
        }
        Command::Plot { dir } => {
            let rows = join::join_dir(&dir)?;
            for f in plot::plot_dir(&dir, &rows)? {
                println!("{}", f.display());
            }
        }
        Command::Table {
            dir,
            readme,
            source,
        } => {
            let rows = join::join_dir(&dir)?;
            let source = source.unwrap_or_else(|| dir.display().to_string());
            let md = table::headline(&rows, &RunFacts::read(&dir), &source);
            match readme {
                Some(p) => {
                    table::update_readme(&p, &md)?;
                    eprintln!("updated {}", p.display());
                }
                None => print!("{md}"),
            }
        }
        Command::CpuTable { dir, notes } => {
            let rows = join::join_dir(&dir)?;
            let md = table::cpu_compare(&rows, &RunFacts::read(&dir), &notes);
            let path = dir.join("table.md");
            topk_bench::record::write_whole(&path, md.as_bytes())?;
            print!("{md}");
        }
        Command::Scale {
            out,
            ns,
            ds,
            shards,
            devices,
            k,
            batch,
            trials,
            batch_trials,
            check,
            shard_max_rows,
        } => {
            for (flag, v) in [("ns", &ns), ("ds", &ds), ("devices", &devices)] {
                if v.is_empty() {
                    return Err(BenchError::flag(flag, "", "needs at least one value"));
                }
            }
            for &n in &ns {
                for &d in &ds {
                    topk_bench::config::validate_shape(n, d)?;
                }
            }
            if k == 0 || batch == 0 || trials == 0 || batch_trials == 0 || shards.contains(&0) {
                return Err(BenchError::flag(
                    "k/batch/trials/batch-trials/shards",
                    format!("{k}/{batch}/{trials}/{batch_trials}/{shards:?}"),
                    "each at least 1",
                ));
            }
            let spec = topk_bench::scale::ScaleSpec {
                ns,
                ds,
                shards,
                devices,
                k,
                batch,
                trials,
                batch_trials,
                check,
                shard_max_rows,
            };
            let bw = topk_bench::gpu::Gpu::d2d_bandwidth().ok();
            let records = topk_bench::scale::run(&spec, &out, bw)?;
            println!("{} measurements in {}", records.len(), out.display());
        }
        Command::Membw { mib } => {
            if mib == 0 {
                return Err(BenchError::flag("mib", mib, "at least 1"));
            }
            let bw = topk_bench::membw::measure(mib << 20, 5);
            println!(
                "{}",
                serde_json::to_string(&bw).unwrap_or_else(|_| "{}".into())
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

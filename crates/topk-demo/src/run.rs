//! One run of the demo: load (or synthesise) the data, build the backend,
//! search every query, show the first answers and write them all.

use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use ndarray::{Array2, ArrayView2, Axis};
use topk_core::{validate, Metric, Neighbor, Retriever};
use topk_io::synth::Stream;
use tracing::info;

use crate::cli::Args;
use crate::error::DemoError;
use crate::output;
use crate::progress::{Progress, Step};

/// Seed of the queries `--recall-sample` picks: the same sample every run.
pub(crate) const RECALL_SEED: u64 = 0x7e57_5eed;

/// Queries per backend call: large enough for a backend's batch path to pay
/// off, small enough that the progress bar moves.
const CHUNK: usize = 256;

/// Corpus and queries, with a description of where each came from.
struct Inputs {
    corpus: Array2<f32>,
    corpus_origin: String,
    queries: Array2<f32>,
    queries_origin: String,
    synthetic: bool,
}

/// Runs the demo and prints its report on stdout.
pub fn run(args: &Args) -> Result<(), DemoError> {
    // Before any loading: a bad K or output name should not wait for a large corpus.
    validate::k(args.k, usize::MAX).map_err(DemoError::Parameter)?;
    let pending = match &args.out {
        Some(out) => {
            let format = topk_io::results::ResultFormat::require(out)?;
            // A search over a large corpus should not end in "no such directory".
            if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
                if !dir.is_dir() {
                    return Err(DemoError::OutputFolder {
                        dir: dir.to_path_buf(),
                        out: out.clone(),
                    });
                }
            }
            let inputs: Vec<&Path> = [&args.corpus, &args.queries]
                .into_iter()
                .flatten()
                .map(|p| p.as_path())
                .collect();
            output::check_not_input(out, &inputs)?;
            if format == topk_io::results::ResultFormat::Npy {
                // Only .npy output writes the scores beside it.
                output::check_not_input(&topk_io::scores_path(out), &inputs)?;
            }
            // The temporary output files are created now, so that an output
            // that cannot be written (/proc, a directory of that name, a
            // read-only folder) is found before the search, not after it.
            Some(topk_io::ResultFiles::create(out)?)
        }
        None => None,
    };
    // An engine that cannot run here is named before a large corpus is read.
    args.backend
        .available()
        .map_err(|source| DemoError::Unavailable {
            backend: args.backend,
            source,
        })?;
    let metric = Metric::from(args.metric);
    let progress = Progress::new(args.no_progress);
    let inputs = load(args, progress)?;
    let (n, d) = inputs.corpus.dim();
    if inputs.queries.ncols() != d {
        return Err(DemoError::DimensionMismatch {
            queries: inputs.queries_origin,
            queries_dim: inputs.queries.ncols(),
            corpus: inputs.corpus_origin,
            corpus_dim: d,
        });
    }
    // The whole batch is checked here so that an error names the query's
    // position in the file, not in a chunk.
    validate::queries(inputs.queries.view(), d).map_err(|source| DemoError::Queries {
        origin: inputs.queries_origin.clone(),
        source,
    })?;

    let started = Instant::now();
    let step = build_step(progress, args.backend, n);
    let reporter = step.clone();
    let options = topk::Options::new()
        .dtype(args.dtype.into())
        .hnsw(args.hnsw_params())
        .progress(topk::BuildProgress::new(move |rows| {
            reporter.set(rows as u64)
        }));
    // Recall is measured against the corpus: the HNSW index gets a copy of it.
    let (retriever, exact_corpus) = match args.recall_sample {
        Some(_) => (
            topk::open(args.backend, inputs.corpus.view(), metric, &options),
            Some(inputs.corpus),
        ),
        None => (
            topk::open(args.backend, inputs.corpus, metric, &options),
            None,
        ),
    };
    step.finish();
    let retriever =
        retriever.map_err(|source| DemoError::open(args.backend, &inputs.corpus_origin, source))?;
    let build_time = started.elapsed();
    info!(
        backend = retriever.backend(), n, d, %metric,
        ms = ms(build_time), "built the backend"
    );

    let started = Instant::now();
    let results =
        search_all(&*retriever, inputs.queries.view(), args.k, progress).map_err(|source| {
            DemoError::Search {
                backend: retriever.backend(),
                source,
            }
        })?;
    let search_time = started.elapsed();
    let q = results.len();
    info!(
        backend = retriever.backend(),
        queries = q,
        k = args.k,
        ms = ms(search_time),
        qps = qps(q, search_time),
        "searched"
    );

    // The results are written (and in place) before the report is printed:
    // a reader of stdout that goes away must not cost them.
    // Every query has min(K, N) results: the width of a .npy output, also
    // when there are no queries.
    let k = validate::k(args.k, n).map_err(DemoError::Parameter)?;
    let written = match pending {
        Some(files) => {
            let files = files.write(&results, k)?;
            for f in &files {
                info!(path = %f.display(), "wrote results");
            }
            Some(files)
        }
        None => None,
    };

    let recall = match (args.recall_sample, exact_corpus) {
        (Some(sample), Some(corpus)) => Some(recall(
            corpus,
            metric,
            args.dtype.into(),
            inputs.queries.view(),
            &results,
            args.k,
            sample,
            progress,
        )?),
        _ => {
            if args.backend == topk::Backend::Hnsw {
                info!(
                    "recall of --backend hnsw is unmeasured: --recall-sample N compares \
                     N sampled queries with exact search"
                );
            }
            None
        }
    };

    let mut text = report(
        &*retriever,
        &inputs.corpus_origin,
        &inputs.queries_origin,
        inputs.synthetic,
        args,
        &results,
        (build_time, search_time),
    );
    if let Some(r) = &recall {
        let _ = writeln!(
            text,
            "recall@{} over {} sampled queries: {:.3}",
            args.k, r.queries, r.value
        );
    }
    if let Some(files) = &written {
        let _ = writeln!(
            text,
            "wrote {} queries x {} neighbours to {}",
            q,
            k,
            files
                .iter()
                .map(|f| f.display().to_string())
                .collect::<Vec<_>>()
                .join(" and ")
        );
    }
    output::print(&text);
    Ok(())
}

/// What `--recall-sample` measured.
struct Recall {
    /// Queries compared.
    queries: usize,
    /// Mean over them of the share of the exact top-K found.
    value: f64,
}

/// The progress of building `backend` over `n` rows: rows inserted for
/// HNSW, a spinner for the others.
fn build_step(progress: Progress, backend: topk::Backend, n: usize) -> Step {
    match backend {
        topk::Backend::Hnsw => progress.bar(n as u64, "rows", "building the HNSW graph"),
        topk::Backend::Cuda => progress.spinner("uploading the corpus to the GPU"),
        topk::Backend::Cpu | topk::Backend::Oracle => {
            progress.spinner(format!("building the {backend} backend"))
        }
    }
}

/// Recall@K of `results` over `sample` queries picked with [`RECALL_SEED`]
/// (all of them when there are fewer), against exact search over `corpus`
/// on the cpu backend.
#[allow(clippy::too_many_arguments)]
fn recall(
    corpus: Array2<f32>,
    metric: Metric,
    dtype: topk::Dtype,
    queries: ArrayView2<'_, f32>,
    results: &[Vec<Neighbor>],
    k: usize,
    sample: usize,
    progress: Progress,
) -> Result<Recall, DemoError> {
    let picked = sample_rows(queries.nrows(), sample, RECALL_SEED);
    let started = Instant::now();
    let step = progress.spinner(format!("exact search of {} sampled queries", picked.len()));
    // Exact over the same stored values as the index being measured.
    let exact = topk::open(
        topk::Backend::Cpu,
        corpus,
        metric,
        &topk::Options::new().dtype(dtype),
    )
    .map_err(|source| DemoError::open(topk::Backend::Cpu, "the recall check", source))
    .and_then(|cpu| {
        cpu.search_batch(queries.select(Axis(0), &picked).view(), k)
            .map_err(|source| DemoError::Search {
                backend: cpu.backend(),
                source,
            })
    });
    step.finish();
    let exact = exact?;
    let (mut found, mut wanted) = (0usize, 0usize);
    for (&q, truth) in picked.iter().zip(&exact) {
        let got = &results[q];
        wanted += truth.len();
        found += truth
            .iter()
            .filter(|t| got.iter().any(|g| g.index == t.index))
            .count();
    }
    let value = if wanted == 0 {
        1.0
    } else {
        found as f64 / wanted as f64
    };
    info!(
        queries = picked.len(),
        k,
        recall = value,
        ms = ms(started.elapsed()),
        "measured recall against exact search"
    );
    Ok(Recall {
        queries: picked.len(),
        value,
    })
}

/// `min(sample, rows)` distinct row numbers below `rows`, in increasing
/// order, the same for the same seed (a partial Fisher-Yates shuffle).
pub(crate) fn sample_rows(rows: usize, sample: usize, seed: u64) -> Vec<usize> {
    let mut all: Vec<usize> = (0..rows).collect();
    if sample >= rows {
        return all;
    }
    let mut state = seed;
    for i in 0..sample {
        let r = splitmix64(&mut state);
        // Below rows - i: the modulo bias is negligible for a sample.
        let j = i + (r % (rows - i) as u64) as usize;
        all.swap(i, j);
    }
    all.truncate(sample);
    all.sort_unstable();
    all
}

/// The SplitMix64 generator: one 64-bit draw.
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Reads the files named on the command line, or makes the synthetic story's rows.
fn load(args: &Args, progress: Progress) -> Result<Inputs, DemoError> {
    match (&args.corpus, &args.queries) {
        (Some(corpus), Some(queries)) => Ok(Inputs {
            corpus: read(corpus, "corpus", progress)?,
            corpus_origin: corpus.display().to_string(),
            queries: read(queries, "queries", progress)?,
            queries_origin: queries.display().to_string(),
            synthetic: false,
        }),
        // clap makes each of --corpus and --queries require the other.
        _ => {
            let (n, d, seed) = (args.n, args.d, args.seed);
            let fits = |rows: usize| {
                rows.checked_mul(d)
                    .and_then(|v| v.checked_mul(size_of::<f32>()))
                    .is_some_and(|b| b <= isize::MAX as usize)
            };
            for (what, flag, rows) in [("corpus", "--n", n), ("query set", "--nq", args.nq)] {
                if !fits(rows) {
                    return Err(DemoError::SyntheticTooLarge {
                        what,
                        flag,
                        rows,
                        d,
                    });
                }
            }
            let started = Instant::now();
            let corpus = synthetic(Stream::Corpus, n, d, seed, "corpus")?;
            let queries = synthetic(Stream::Queries, args.nq, d, seed, "queries")?;
            info!(
                n,
                d,
                queries = args.nq,
                seed,
                ms = ms(started.elapsed()),
                "generated synthetic rows"
            );
            Ok(Inputs {
                corpus,
                corpus_origin: format!("(synthetic, seed {seed})"),
                queries,
                queries_origin: format!("(synthetic, seed {seed})"),
                synthetic: true,
            })
        }
    }
}

/// `rows × d` rows of the synthetic story; an allocation that fails is an
/// error naming the bytes, not an abort.
fn synthetic(
    stream: Stream,
    rows: usize,
    d: usize,
    seed: u64,
    what: &'static str,
) -> Result<Array2<f32>, DemoError> {
    let count = rows.checked_mul(d);
    let oom = || DemoError::OutOfMemory {
        what,
        bytes: (rows as u64)
            .saturating_mul(d as u64)
            .saturating_mul(size_of::<f32>() as u64),
    };
    let count = count.ok_or_else(oom)?;
    let mut values = Vec::new();
    topk_io::memory::reserve(&mut values, count).map_err(|_| oom())?;
    values.resize(count, 0.0_f32);
    topk_io::synth::fill_rows(stream, d, seed, true, &mut values);
    Array2::from_shape_vec((rows, d), values).map_err(|_| oom())
}

fn read(path: &Path, what: &str, progress: Progress) -> Result<Array2<f32>, DemoError> {
    let started = Instant::now();
    let step = match std::fs::metadata(path) {
        Ok(meta) => progress.spinner(format!(
            "loading {what} {} ({})",
            path.display(),
            indicatif::HumanBytes(meta.len())
        )),
        Err(_) => progress.spinner(format!("loading {what} {}", path.display())),
    };
    let m = topk_io::read_matrix(path);
    step.finish();
    let m = m?;
    info!(
        path = %path.display(), rows = m.nrows(), dim = m.ncols(),
        ms = ms(started.elapsed()), "loaded {what}"
    );
    Ok(m)
}

/// Searches every query in chunks, with a progress bar on a terminal.
fn search_all(
    retriever: &dyn Retriever,
    queries: ArrayView2<'_, f32>,
    k: usize,
    progress: Progress,
) -> topk_core::Result<Vec<Vec<Neighbor>>> {
    let q = queries.nrows();
    let bar = if q > CHUNK && progress.enabled() {
        // Drawn on stderr only when it is a terminal, so logs and pipes stay clean.
        let bar = ProgressBar::with_draw_target(Some(q as u64), ProgressDrawTarget::stderr());
        if let Ok(style) = ProgressStyle::with_template(
            "{elapsed_precise} [{bar:40}] {pos}/{len} queries ({per_sec}, eta {eta})",
        ) {
            bar.set_style(style.progress_chars("=> "));
        }
        bar
    } else {
        ProgressBar::hidden()
    };
    let mut results = Vec::with_capacity(q);
    for chunk in queries.axis_chunks_iter(Axis(0), CHUNK) {
        results.extend(retriever.search_batch(chunk, k)?);
        bar.inc(chunk.nrows() as u64);
    }
    bar.finish_and_clear();
    Ok(results)
}

/// The human-readable report: what ran, on what, how fast, and the first answers.
fn report(
    retriever: &dyn Retriever,
    corpus_origin: &str,
    queries_origin: &str,
    synthetic: bool,
    args: &Args,
    results: &[Vec<Neighbor>],
    (build, search): (Duration, Duration),
) -> String {
    let metric = retriever.metric();
    let q = results.len();
    let mut s = String::new();
    // Writing to a String cannot fail; the results are ignored for that reason.
    if synthetic {
        let _ = writeln!(
            s,
            "topk smoke story: {} Gaussian rows (seed {}, L2-normalised), {} queries",
            retriever.len(),
            args.seed,
            q
        );
    }
    let _ = writeln!(s, "backend   {}", retriever.backend());
    if args.dtype != crate::cli::DtypeArg::F32 {
        let dtype: topk::Dtype = args.dtype.into();
        let _ = writeln!(
            s,
            "storage   {dtype} (each value rounded once; exact over the stored values)"
        );
    }
    let _ = writeln!(
        s,
        "corpus    {corpus_origin}: N = {}, D = {}",
        retriever.len(),
        retriever.dim()
    );
    let _ = writeln!(s, "queries   {queries_origin}: {q}");
    let _ = writeln!(s, "search    K = {}, metric = {metric}", args.k);
    let _ = writeln!(
        s,
        "time      build {:.1} ms, search {:.1} ms ({:.0} queries/s)",
        ms(build),
        ms(search),
        qps(q, search)
    );
    let value_name = match metric {
        Metric::L2 => "sq. distance",
        Metric::Dot | Metric::Cosine => "score",
    };
    for (i, hits) in results.iter().take(args.show).enumerate() {
        let _ = writeln!(s, "\nquery {i}");
        let _ = writeln!(s, "  {:>4}  {:>10}  {:>14}", "rank", "index", value_name);
        for (rank, n) in hits.iter().enumerate() {
            let _ = writeln!(
                s,
                "  {:>4}  {:>10}  {:>14.6}",
                rank + 1,
                n.index,
                metric.display_value(n.score)
            );
        }
    }
    if args.show > 0 && q > args.show && args.out.is_none() {
        let _ = writeln!(
            s,
            "\n({} of {q} queries shown; --out FILE writes them all)",
            args.show.min(q)
        );
    }
    s
}

/// Milliseconds, to the microsecond (log lines stay readable).
fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

/// Queries per second, rounded to a whole query.
fn qps(q: usize, d: Duration) -> f64 {
    let secs = d.as_secs_f64();
    if secs > 0.0 {
        (q as f64 / secs).round()
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sample_is_seeded_distinct_and_sorted() {
        let a = sample_rows(1000, 100, RECALL_SEED);
        assert_eq!(a, sample_rows(1000, 100, RECALL_SEED));
        assert_ne!(a, sample_rows(1000, 100, RECALL_SEED + 1));
        assert_eq!(a.len(), 100);
        assert!(a.windows(2).all(|w| w[0] < w[1]), "{a:?}");
        assert!(a.iter().all(|&r| r < 1000));
    }

    #[test]
    fn a_sample_beyond_the_queries_takes_them_all() {
        assert_eq!(sample_rows(5, 5, 1), vec![0, 1, 2, 3, 4]);
        assert_eq!(sample_rows(5, 50, 1), vec![0, 1, 2, 3, 4]);
        assert_eq!(sample_rows(0, 3, 1), Vec::<usize>::new());
    }
}

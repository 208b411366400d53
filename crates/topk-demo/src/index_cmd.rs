//! `topk_demo index ...`: build, change, search and describe index files
//! (docs/CONTRACTS.md §10). Every change opens the file, applies the change
//! and saves it atomically, so an interrupted command leaves the old file.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Instant;

use ndarray::{Array2, Axis};
use topk::index::ProgressHook;
use topk::{Filter, Hit, Index, IndexBackend, IndexOptions};
use topk_core::validate;
use tracing::info;

use crate::cli::IndexCommand;
use crate::error::DemoError;
use crate::progress::{Progress, Step};
use crate::run::{sample_rows, RECALL_SEED};

/// Runs one index command and prints its report on stdout.
pub fn run(cmd: &IndexCommand, progress: Progress) -> Result<(), DemoError> {
    let report = match cmd {
        IndexCommand::Build {
            corpus,
            ids,
            metric,
            out,
            backend,
            m,
            ef_construction,
            ef,
            dtype,
        } => {
            // Before a long build: an output that would replace an input, or
            // whose folder is missing, is refused now.
            let inputs: Vec<&Path> = std::iter::once(corpus.as_path())
                .chain(ids.as_deref())
                .collect();
            crate::output::check_not_input(out, &inputs)?;
            if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
                if !dir.is_dir() {
                    return Err(DemoError::OutputFolder {
                        dir: dir.to_path_buf(),
                        out: out.clone(),
                    });
                }
            }
            crate::output::check_writable(out)?;
            let rows = read_rows(corpus, progress)?;
            let ids = match ids {
                Some(p) => ids_for(p, rows.nrows(), corpus)?,
                None => (0..rows.nrows() as u64).collect(),
            };
            let backend: IndexBackend = (*backend).into();
            let started = Instant::now();
            let step = if backend == IndexBackend::Hnsw {
                progress.bar(rows.nrows() as u64, "rows", "building the HNSW graph")
            } else {
                progress.spinner(format!("building an index of {} rows", rows.nrows()))
            };
            let params = topk::HnswParams {
                m: *m,
                ef_construction: *ef_construction,
                ef_search: *ef,
                ..topk::HnswParams::default()
            };
            let options = with_progress(
                IndexOptions::default().hnsw(params).dtype((*dtype).into()),
                &step,
            );
            let index = Index::with_options(rows.ncols(), (*metric).into(), backend, &options)
                .and_then(|mut index| index.add(&ids, rows.view()).map(|()| index));
            step.finish();
            let index = index?;
            info!(rows = index.len(), ms = ms(started), "index built");
            save(&index, out, progress)?;
            describe(&index, out)
        }
        IndexCommand::Add {
            index: path,
            rows,
            ids,
            upsert,
        } => {
            let mut index = open(path, None, progress)?;
            let new = read_rows(rows, progress)?;
            let before = index.len();
            match ids {
                Some(p) => {
                    let ids = ids_for(p, new.nrows(), rows)?;
                    if *upsert {
                        index.upsert(&ids, new.view())?;
                    } else {
                        index.add(&ids, new.view())?;
                    }
                }
                None => {
                    index.add_auto(new.view())?;
                }
            }
            save(&index, path, progress)?;
            format!(
                "{} rows given, {} rows now ({} new)\n{}",
                new.nrows(),
                index.len(),
                index.len() - before,
                describe(&index, path)
            )
        }
        IndexCommand::Remove { index: path, ids } => {
            let mut index = open(path, None, progress)?;
            let ids = read_ids(ids)?;
            let removed = index.remove(&ids);
            save(&index, path, progress)?;
            format!(
                "removed {removed} of {} ids given\n{}",
                ids.len(),
                describe(&index, path)
            )
        }
        IndexCommand::Search {
            index: path,
            queries,
            filter,
            k,
            backend,
            ef,
            recall_sample,
            show,
        } => {
            if *recall_sample == Some(0) {
                return Err(DemoError::RecallSampleZero);
            }
            // Before the index is opened (which may build a graph): a bad K
            // or --ef, or --ef for an exact search, is refused now.
            validate::k(*k, usize::MAX).map_err(DemoError::Parameter)?;
            // Silently ignoring --ef on an exact search would hide a mistake.
            let hnsw_only = |b: IndexBackend| DemoError::HnswOnlyFlag {
                flag: "--ef",
                backend: b.to_string(),
            };
            let backend: Option<IndexBackend> = backend.map(Into::into);
            if let Some(ef) = ef {
                // A backend given, and the value itself, need no file.
                if let Some(b) = backend.filter(|&b| b != IndexBackend::Hnsw) {
                    return Err(hnsw_only(b));
                }
                topk::HnswParams {
                    ef_search: *ef,
                    ..topk::HnswParams::default()
                }
                .validate()
                .map_err(topk::IndexError::from)?;
            }
            let (chosen, info) = choose(path, backend)?;
            if ef.is_some() && chosen != IndexBackend::Hnsw {
                return Err(hnsw_only(chosen));
            }
            let mut index = open_as(path, chosen, &info, progress)?;
            if let Some(ef) = ef {
                index.set_ef(*ef)?;
            }
            let qs = read_rows(queries, progress)?;
            let filter = match filter {
                Some(p) => Some(Filter::new(read_ids(p)?)),
                None => None,
            };
            let spec = match &filter {
                Some(f) => topk::FilterSpec::Shared(f),
                None => topk::FilterSpec::None,
            };
            let started = Instant::now();
            let hits = index.search_batch(qs.view(), *k, spec)?;
            info!(queries = qs.nrows(), k, ms = ms(started), backend = %index.backend(), "searched");
            let mut out = String::new();
            for (q, hs) in hits.iter().enumerate().take(*show) {
                let _ = writeln!(out, "query {q}:");
                for (rank, h) in hs.iter().enumerate() {
                    let value = index.metric().display_value(h.score);
                    let _ = writeln!(out, "  {rank:>3}  id {:<20} {value}", h.id);
                }
            }
            let _ = write!(
                out,
                "{} queries, K = {k}, {} index rows{}, backend {}",
                qs.nrows(),
                index.len(),
                filter
                    .as_ref()
                    .map_or(String::new(), |f| format!(", filter of {} ids", f.len())),
                index.backend()
            );
            match recall_sample {
                Some(sample) => {
                    let r = recall(path, &qs, spec, &hits, *k, *sample, progress)?;
                    let line = format!(
                        "recall@{k} over {} sampled queries against exact search: {:.3}",
                        r.0, r.1
                    );
                    eprintln!("{line}");
                    let _ = write!(out, "\n{line}");
                }
                None if index.backend() == IndexBackend::Hnsw => info!(
                    "recall of the hnsw search is unmeasured: --recall-sample N compares \
                     N sampled queries with exact search"
                ),
                None => {}
            }
            out
        }
        IndexCommand::Info { index: path } => describe(&open(path, None, progress)?, path),
    };
    // The index file is already written; a closed stdout only loses the report.
    crate::output::print(&format!("{report}\n"));
    Ok(())
}

fn ms(since: Instant) -> f64 {
    (since.elapsed().as_secs_f64() * 1e4).round() / 10.0
}

fn describe(index: &Index, path: &Path) -> String {
    let graph = if index.has_graph() {
        let p = index.options().hnsw;
        format!(
            ", hnsw graph (M = {}, ef_construction = {}, ef = {})",
            p.m, p.ef_construction, p.ef_search
        )
    } else {
        String::new()
    };
    let storage = match index.dtype() {
        topk::Dtype::F32 => String::new(),
        d => format!(", {d} rows ({} bytes)", index.stored_bytes()),
    };
    format!(
        "{}: {} rows, D = {}, metric {}{storage}{graph}",
        path.display(),
        index.len(),
        index.dim(),
        index.metric()
    )
}

/// `options` reporting an HNSW build's rows to `step`.
fn with_progress(options: IndexOptions, step: &Step) -> IndexOptions {
    let reporter = step.clone();
    options.progress(ProgressHook::new(move |rows| reporter.set(rows as u64)))
}

/// Recall@K of `hits` on `sample` queries picked with [`RECALL_SEED`] (all of
/// them when there are fewer), against exact search (`cpu`) of the index
/// file at `path` under the same filter: (queries compared, recall).
fn recall(
    path: &Path,
    queries: &Array2<f32>,
    filter: topk::FilterSpec<'_>,
    hits: &[Vec<Hit>],
    k: usize,
    sample: usize,
    progress: Progress,
) -> Result<(usize, f64), DemoError> {
    let exact = open(path, Some(IndexBackend::Cpu), progress)?;
    let picked = sample_rows(queries.nrows(), sample, RECALL_SEED);
    let started = Instant::now();
    let step = progress.spinner(format!("exact search of {} sampled queries", picked.len()));
    let truth = exact.search_batch(queries.select(Axis(0), &picked).view(), k, filter);
    step.finish();
    let truth = truth?;
    let (mut found, mut wanted) = (0usize, 0usize);
    for (&q, want) in picked.iter().zip(&truth) {
        wanted += want.len();
        found += want
            .iter()
            .filter(|t| hits[q].iter().any(|h| h.id == t.id))
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
        ms = ms(started),
        "measured recall against exact search"
    );
    Ok((picked.len(), value))
}

fn read_rows(path: &Path, progress: Progress) -> Result<Array2<f32>, DemoError> {
    let started = Instant::now();
    let step = progress.spinner(format!("loading {}", path.display()));
    let rows = topk_io::read_matrix(path);
    step.finish();
    let rows = rows?;
    info!(file = %path.display(), rows = rows.nrows(), ms = ms(started), "rows read");
    Ok(rows)
}

/// Every value of an id file, in row-major order.
fn read_ids(path: &Path) -> Result<Vec<u64>, DemoError> {
    Ok(topk_io::read_row_ids(path)?)
}

/// The ids of `path`, one per row of `rows_of`.
fn ids_for(path: &Path, rows: usize, rows_of: &Path) -> Result<Vec<u64>, DemoError> {
    let ids = read_ids(path)?;
    if ids.len() != rows {
        return Err(DemoError::IdCount {
            ids: path.display().to_string(),
            got: ids.len(),
            rows,
            what: rows_of.display().to_string(),
        });
    }
    Ok(ids)
}

/// Opens the index file at `path` on `backend`; without one, on `hnsw` when
/// the file holds a graph (so that changes keep it) and on `cpu` otherwise.
fn open(
    path: &Path,
    backend: Option<IndexBackend>,
    progress: Progress,
) -> Result<Index, DemoError> {
    let (backend, info) = choose(path, backend)?;
    open_as(path, backend, &info, progress)
}

/// The backend [`open`] uses for the file at `path` (`backend`, or the
/// file's own choice), with the file's header.
fn choose(
    path: &Path,
    backend: Option<IndexBackend>,
) -> Result<(IndexBackend, topk::index::FileInfo), DemoError> {
    let info = Index::file_info(path)?;
    let backend = match backend {
        Some(b) => b,
        None if info.graph => IndexBackend::Hnsw,
        None => IndexBackend::Cpu,
    };
    Ok((backend, info))
}

/// [`open`] with the backend chosen and the header read.
fn open_as(
    path: &Path,
    backend: IndexBackend,
    info: &topk::index::FileInfo,
    progress: Progress,
) -> Result<Index, DemoError> {
    let started = Instant::now();
    // A file without a graph opened on hnsw builds one: its rows are counted.
    let (step, options) = if backend == IndexBackend::Hnsw && !info.graph {
        let bar = progress.bar(info.rows, "rows", "building the HNSW graph");
        let options = with_progress(IndexOptions::default(), &bar);
        (bar, options)
    } else {
        let spinner = progress.spinner(format!("opening {}", path.display()));
        (spinner, IndexOptions::default())
    };
    let index = Index::open_with_options(path, backend, &options);
    step.finish();
    let index = index?;
    info!(file = %path.display(), rows = index.len(), ms = ms(started), "index opened");
    Ok(index)
}

fn save(index: &Index, path: &Path, progress: Progress) -> Result<(), DemoError> {
    let started = Instant::now();
    let step = progress.spinner(format!("saving {}", path.display()));
    let saved = index.save(path);
    step.finish();
    saved?;
    info!(file = %path.display(), rows = index.len(), ms = ms(started), "index saved");
    Ok(())
}

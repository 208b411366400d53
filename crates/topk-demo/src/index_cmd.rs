//! `topk_demo index ...`: build, change, search and describe index files
//! (docs/CONTRACTS.md §10). Every change opens the file, applies the change
//! and saves it atomically, so an interrupted command leaves the old file.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;
use std::time::Instant;

use ndarray::Array2;
use topk::{Filter, Index, IndexBackend};
use tracing::info;

use crate::cli::IndexCommand;
use crate::error::DemoError;
use crate::progress::Progress;

/// Runs one index command and prints its report on stdout.
pub fn run(cmd: &IndexCommand, progress: Progress) -> Result<(), DemoError> {
    let report = match cmd {
        IndexCommand::Build {
            corpus,
            ids,
            metric,
            out,
        } => {
            let rows = read_rows(corpus, progress)?;
            let ids = match ids {
                Some(p) => ids_for(p, rows.nrows(), corpus)?,
                None => (0..rows.nrows() as u64).collect(),
            };
            let started = Instant::now();
            let step = progress.spinner(format!("building an index of {} rows", rows.nrows()));
            let index = Index::with_ids(&ids, rows.view(), (*metric).into(), IndexBackend::Cpu);
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
            let mut index = open(path, IndexBackend::Cpu, progress)?;
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
            let mut index = open(path, IndexBackend::Cpu, progress)?;
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
            show,
        } => {
            let index = open(path, (*backend).into(), progress)?;
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
                "{} queries, K = {k}, {} index rows{}",
                qs.nrows(),
                index.len(),
                filter
                    .as_ref()
                    .map_or(String::new(), |f| format!(", filter of {} ids", f.len()))
            );
            out
        }
        IndexCommand::Info { index: path } => {
            describe(&open(path, IndexBackend::Cpu, progress)?, path)
        }
    };
    let mut stdout = std::io::stdout().lock();
    if let Err(e) = writeln!(stdout, "{report}").and_then(|()| stdout.flush()) {
        // The index file is already written; only the report is lost.
        tracing::warn!(error = %e, "could not write the report to stdout");
    }
    Ok(())
}

fn ms(since: Instant) -> f64 {
    (since.elapsed().as_secs_f64() * 1e4).round() / 10.0
}

fn describe(index: &Index, path: &Path) -> String {
    format!(
        "{}: {} rows, D = {}, metric {}",
        path.display(),
        index.len(),
        index.dim(),
        index.metric()
    )
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
    Ok(topk_io::read_ids(path)?
        .iter()
        .map(|&id| u64::from(id))
        .collect())
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

fn open(path: &Path, backend: IndexBackend, progress: Progress) -> Result<Index, DemoError> {
    let started = Instant::now();
    let step = progress.spinner(format!("opening {}", path.display()));
    let index = Index::open(path, backend);
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

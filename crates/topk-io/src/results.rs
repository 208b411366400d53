//! Search results on disk, in the two shapes tools downstream want.
//!
//! - `.jsonl`: one line per query, `{"query":q,"indices":[...],"scores":[...]}`,
//!   best first. Scores are written in the shortest decimal form that reads
//!   back to the same `f32`; a non-finite score (cosine against a zero row
//!   scores `-inf`) is written as the string `"-inf"`, `"inf"` or `"nan"`,
//!   since JSON has no literal for it.
//! - `.npy`: `FILE.npy` holds the indices (`uint32`, `Q × K`) and
//!   `FILE.scores.npy` the scores (`float32`, `Q × K`), row `q` answering query `q`.

use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use ndarray::Array2;
use serde_json::Value;
use topk_core::Neighbor;

use crate::error::{Error, Result};
use crate::fsutil::{commit_all, open_regular, AtomicFile};
use crate::npy::{read_npy_f32, read_npy_u32, write_npy_to};

/// How a result file is laid out, chosen by its extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResultFormat {
    /// One JSON object per line.
    Jsonl,
    /// An index matrix and a sibling score matrix.
    Npy,
}

impl ResultFormat {
    /// The format a path's extension names (case-insensitive), or `None`.
    pub fn of(path: &Path) -> Option<ResultFormat> {
        match path.extension()?.to_str()?.to_ascii_lowercase().as_str() {
            "jsonl" => Some(ResultFormat::Jsonl),
            "npy" => Some(ResultFormat::Npy),
            _ => None,
        }
    }

    /// Like [`ResultFormat::of`], but an unknown extension is an error naming the file.
    pub fn require(path: &Path) -> Result<ResultFormat> {
        ResultFormat::of(path).ok_or_else(|| Error::UnknownFormat {
            path: path.to_owned(),
            expected: ".jsonl or .npy",
        })
    }
}

/// The score file beside an index file: `out.npy` → `out.scores.npy`.
pub fn scores_path(path: impl AsRef<Path>) -> PathBuf {
    let path = path.as_ref();
    let mut name = path.file_stem().unwrap_or_default().to_owned();
    name.push(".scores.npy");
    path.with_file_name(name)
}

/// Writes results in the format the extension names and returns the files
/// written (see [`ResultFiles`]: complete or not at all).
pub fn write_results(path: impl AsRef<Path>, results: &[Vec<Neighbor>]) -> Result<Vec<PathBuf>> {
    let k = results.first().map_or(0, Vec::len);
    ResultFiles::create(path)?.write(results, k)
}

/// Result files created before a search and filled after it.
///
/// [`ResultFiles::create`] makes the temporary files beside the final names,
/// so that an output that cannot be written (a missing or read-only folder,
/// `/proc`, a directory of that name) is found before any work.
/// [`ResultFiles::write`] fills them, flushes them to disk and renames them
/// into place: for `.npy` both files are complete before either is renamed,
/// and the scores file is renamed first, so the index file a reader opens
/// always has its scores beside it. When anything fails, the temporary files
/// are removed and a previous output at those paths is left as it was.
#[derive(Debug)]
pub struct ResultFiles {
    format: ResultFormat,
    /// The final paths: the index (or `.jsonl`) file first.
    paths: Vec<PathBuf>,
    /// The temporary files, in rename order.
    files: Vec<AtomicFile>,
}

impl ResultFiles {
    /// Creates the temporary file(s) for results at `path`.
    pub fn create(path: impl AsRef<Path>) -> Result<ResultFiles> {
        let path = path.as_ref();
        let format = ResultFormat::require(path)?;
        let paths = match format {
            ResultFormat::Jsonl => vec![path.to_owned()],
            ResultFormat::Npy => vec![path.to_owned(), scores_path(path)],
        };
        // Renamed last: the index file.
        let files = paths
            .iter()
            .rev()
            .map(|p| AtomicFile::create(p))
            .collect::<Result<Vec<_>>>()?;
        Ok(ResultFiles {
            format,
            paths,
            files,
        })
    }

    /// The files these results will be written to (`.npy`: indices, then scores).
    pub fn paths(&self) -> &[PathBuf] {
        &self.paths
    }

    /// Writes the results and puts the files in place; returns their paths.
    ///
    /// `k` is the number of results of every query (`min(K, N)`): the width
    /// of the `.npy` matrices, also when there are no queries (shape `(0, k)`).
    /// A query with another number of results is an error for `.npy`.
    pub fn write(mut self, results: &[Vec<Neighbor>], k: usize) -> Result<Vec<PathBuf>> {
        match self.format {
            ResultFormat::Jsonl => {
                let file = &mut self.files[0];
                write_jsonl_to(file.writer(), &self.paths[0], results)?;
            }
            ResultFormat::Npy => {
                let (indices, scores) = matrices(&self.paths[0], results, k)?;
                let [scores_file, index_file] = &mut self.files[..] else {
                    return Err(Error::Unwritable {
                        path: self.paths[0].clone(),
                        reason: "expected an index and a score file".to_owned(),
                    });
                };
                write_npy_to(index_file.writer(), &self.paths[0], indices.view())?;
                write_npy_to(scores_file.writer(), &self.paths[1], scores.view())?;
            }
        }
        commit_all(self.files)?;
        Ok(self.paths)
    }
}

/// The index and score matrices of `results`, `Q × k`.
fn matrices(
    path: &Path,
    results: &[Vec<Neighbor>],
    k: usize,
) -> Result<(Array2<u32>, Array2<f32>)> {
    if let Some((q, hits)) = results.iter().enumerate().find(|(_, h)| h.len() != k) {
        return Err(Error::Unwritable {
            path: path.to_owned(),
            reason: format!(
                "query {q} has {} results, not {k}; a matrix needs equal rows",
                hits.len()
            ),
        });
    }
    let q = results.len();
    let indices = Array2::from_shape_fn((q, k), |(i, j)| results[i][j].index);
    let scores = Array2::from_shape_fn((q, k), |(i, j)| results[i][j].score);
    Ok((indices, scores))
}

/// Reads results written by [`write_results`].
pub fn read_results(path: impl AsRef<Path>) -> Result<Vec<Vec<Neighbor>>> {
    let path = path.as_ref();
    match ResultFormat::require(path)? {
        ResultFormat::Jsonl => read_results_jsonl(path),
        ResultFormat::Npy => read_results_npy(path),
    }
}

/// Writes one JSON line per query (complete or not at all).
pub fn write_results_jsonl(path: impl AsRef<Path>, results: &[Vec<Neighbor>]) -> Result<()> {
    let path = path.as_ref();
    let mut file = AtomicFile::create(path)?;
    write_jsonl_to(file.writer(), path, results)?;
    file.commit()
}

/// Writes the `.jsonl` lines of `results` to `out`; errors name `path`.
pub(crate) fn write_jsonl_to<W: Write>(
    mut out: W,
    path: &Path,
    results: &[Vec<Neighbor>],
) -> Result<()> {
    let mut line = String::new();
    for (q, hits) in results.iter().enumerate() {
        line.clear();
        // Writing to a String cannot fail; the results are ignored for that reason.
        let _ = write!(line, "{{\"query\":{q},\"indices\":[");
        for (i, n) in hits.iter().enumerate() {
            let sep = if i == 0 { "" } else { "," };
            let _ = write!(line, "{sep}{}", n.index);
        }
        line.push_str("],\"scores\":[");
        for (i, n) in hits.iter().enumerate() {
            let sep = if i == 0 { "" } else { "," };
            let _ = write!(line, "{sep}{}", json_score(n.score));
        }
        line.push_str("]}\n");
        out.write_all(line.as_bytes())
            .map_err(Error::io(path, "write"))?;
    }
    out.flush().map_err(Error::io(path, "write"))?;
    Ok(())
}

/// Shortest round-trip text of a finite score; a JSON string otherwise.
fn json_score(s: f32) -> String {
    if s.is_finite() {
        // `Debug` prints the shortest digits that parse back to the same f32,
        // switching to exponent form for tiny and huge magnitudes: valid JSON.
        format!("{s:?}")
    } else if s.is_nan() {
        "\"nan\"".to_owned()
    } else if s > 0.0 {
        "\"inf\"".to_owned()
    } else {
        "\"-inf\"".to_owned()
    }
}

/// Reads a `.jsonl` result file; line `q` must carry `"query": q`.
pub fn read_results_jsonl(path: impl AsRef<Path>) -> Result<Vec<Vec<Neighbor>>> {
    let path = path.as_ref();
    let (file, _) = open_regular(path)?;
    let mut results = Vec::new();
    for (i, line) in BufReader::new(file).lines().enumerate() {
        let line = line.map_err(Error::io(path, "read"))?;
        if line.trim().is_empty() {
            continue;
        }
        let bad = |reason: String| Error::Jsonl {
            path: path.to_owned(),
            line: i + 1,
            reason,
        };
        let value: Value = serde_json::from_str(&line).map_err(|e| bad(e.to_string()))?;
        let query = value.get("query").and_then(Value::as_u64);
        if query != Some(results.len() as u64) {
            return Err(bad(format!(
                "expected \"query\": {}, found {}",
                results.len(),
                value.get("query").unwrap_or(&Value::Null)
            )));
        }
        let array = |key: &str| {
            value
                .get(key)
                .and_then(Value::as_array)
                .ok_or_else(|| bad(format!("missing array \"{key}\"")))
        };
        let indices = array("indices")?;
        let scores = array("scores")?;
        if indices.len() != scores.len() {
            return Err(bad(format!(
                "{} indices but {} scores",
                indices.len(),
                scores.len()
            )));
        }
        let hits = indices
            .iter()
            .zip(scores)
            .map(|(index, score)| {
                let index = index
                    .as_u64()
                    .and_then(|v| u32::try_from(v).ok())
                    .ok_or_else(|| bad(format!("index {index} is not a u32")))?;
                let score = parse_score(score).ok_or_else(|| bad(format!("bad score {score}")))?;
                Ok(Neighbor::new(index, score))
            })
            .collect::<Result<Vec<_>>>()?;
        results.push(hits);
    }
    Ok(results)
}

fn parse_score(v: &Value) -> Option<f32> {
    match v {
        // Via the text: a number with at most 9 significant digits survives
        // f64 exactly as written, and `str::parse::<f32>` rounds once, correctly.
        Value::Number(n) => n.to_string().parse().ok(),
        Value::String(s) => match s.as_str() {
            "inf" => Some(f32::INFINITY),
            "-inf" => Some(f32::NEG_INFINITY),
            "nan" => Some(f32::NAN),
            _ => None,
        },
        _ => None,
    }
}

/// Writes indices to `path` and scores to [`scores_path`]`(path)`; returns the latter.
///
/// Every query must have the same number of results (a search returns
/// `min(K, N)` for each); both files appear together or neither does.
pub fn write_results_npy(path: impl AsRef<Path>, results: &[Vec<Neighbor>]) -> Result<PathBuf> {
    let path = path.as_ref();
    if ResultFormat::of(path) != Some(ResultFormat::Npy) {
        return Err(Error::UnknownFormat {
            path: path.to_owned(),
            expected: ".npy",
        });
    }
    let k = results.first().map_or(0, Vec::len);
    let mut paths = ResultFiles::create(path)?.write(results, k)?;
    paths.pop().ok_or_else(|| Error::Unwritable {
        path: path.to_owned(),
        reason: "no score file was written".to_owned(),
    })
}

/// Reads the index matrix at `path` and the score matrix beside it.
pub fn read_results_npy(path: impl AsRef<Path>) -> Result<Vec<Vec<Neighbor>>> {
    let path = path.as_ref();
    let scores_file = scores_path(path);
    let indices = read_npy_u32(path)?;
    let scores = read_npy_f32(&scores_file)?;
    if indices.dim() != scores.dim() {
        return Err(Error::ShapeMismatch {
            path: scores_file,
            found: scores.shape().to_vec(),
            other: path.to_owned(),
            expected: indices.shape().to_vec(),
        });
    }
    // A zero-width pair holds no bytes whatever its row count: the outer
    // list (24 bytes a query) is reserved as any other allocation would be.
    let mut out = Vec::new();
    crate::memory::reserve(&mut out, indices.nrows()).map_err(|bytes| Error::OutOfMemory {
        path: path.to_owned(),
        bytes,
    })?;
    out.extend(indices.outer_iter().zip(scores.outer_iter()).map(|(i, s)| {
        i.iter()
            .zip(s)
            .map(|(&i, &s)| Neighbor::new(i, s))
            .collect()
    }));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A disk that fills up after `room` bytes.
    struct FullDisk {
        room: usize,
    }

    impl Write for FullDisk {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            if self.room == 0 {
                return Err(std::io::Error::from_raw_os_error(28)); // ENOSPC
            }
            let n = buf.len().min(self.room);
            self.room -= n;
            Ok(n)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn hits(q: usize) -> Vec<Vec<Neighbor>> {
        (0..q)
            .map(|i| vec![Neighbor::new(i as u32, 0.5), Neighbor::new(0, -1.0)])
            .collect()
    }

    #[test]
    fn full_disk_during_a_jsonl_write_is_an_error_naming_the_file() {
        let p = Path::new("r.jsonl");
        let e = write_jsonl_to(FullDisk { room: 100 }, p, &hits(2000)).unwrap_err();
        assert!(
            matches!(&e, Error::Io { op: "write", source, .. } if source.raw_os_error() == Some(28)),
            "{e:?}"
        );
        assert!(e.to_string().contains("r.jsonl"), "{e}");
    }

    #[test]
    fn full_disk_during_a_npy_write_is_an_error_naming_the_file() {
        let p = Path::new("r.scores.npy");
        let (_, scores) = matrices(p, &hits(2000), 2).unwrap();
        let e = write_npy_to(FullDisk { room: 300 }, p, scores.view()).unwrap_err();
        assert!(matches!(e, Error::Io { op: "write", .. }), "{e:?}");
    }
}

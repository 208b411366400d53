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
use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};

use ndarray::Array2;
use serde_json::Value;
use topk_core::Neighbor;

use crate::error::{Error, Result};
use crate::npy::{read_npy_f32, read_npy_u32, write_npy_f32, write_npy_u32};

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

/// Writes results in the format the extension names and returns the files written.
pub fn write_results(path: impl AsRef<Path>, results: &[Vec<Neighbor>]) -> Result<Vec<PathBuf>> {
    let path = path.as_ref();
    match ResultFormat::require(path)? {
        ResultFormat::Jsonl => {
            write_results_jsonl(path, results)?;
            Ok(vec![path.to_owned()])
        }
        ResultFormat::Npy => {
            let scores = write_results_npy(path, results)?;
            Ok(vec![path.to_owned(), scores])
        }
    }
}

/// Reads results written by [`write_results`].
pub fn read_results(path: impl AsRef<Path>) -> Result<Vec<Vec<Neighbor>>> {
    let path = path.as_ref();
    match ResultFormat::require(path)? {
        ResultFormat::Jsonl => read_results_jsonl(path),
        ResultFormat::Npy => read_results_npy(path),
    }
}

/// Writes one JSON line per query.
pub fn write_results_jsonl(path: impl AsRef<Path>, results: &[Vec<Neighbor>]) -> Result<()> {
    let path = path.as_ref();
    let file = File::create(path).map_err(Error::io(path, "create"))?;
    let mut out = BufWriter::new(file);
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
    let file = File::open(path).map_err(Error::io(path, "open"))?;
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
/// `min(K, N)` for each).
pub fn write_results_npy(path: impl AsRef<Path>, results: &[Vec<Neighbor>]) -> Result<PathBuf> {
    let path = path.as_ref();
    let k = results.first().map_or(0, Vec::len);
    if let Some((q, hits)) = results.iter().enumerate().find(|(_, h)| h.len() != k) {
        return Err(Error::Unwritable {
            path: path.to_owned(),
            reason: format!(
                "query {q} has {} results but query 0 has {k}; a matrix needs equal rows",
                hits.len()
            ),
        });
    }
    let q = results.len();
    let indices = Array2::from_shape_fn((q, k), |(i, j)| results[i][j].index);
    let scores = Array2::from_shape_fn((q, k), |(i, j)| results[i][j].score);
    let scores_file = scores_path(path);
    write_npy_u32(path, indices.view())?;
    write_npy_f32(&scores_file, scores.view())?;
    Ok(scores_file)
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
    Ok(indices
        .outer_iter()
        .zip(scores.outer_iter())
        .map(|(i, s)| {
            i.iter()
                .zip(s)
                .map(|(&i, &s)| Neighbor::new(i, s))
                .collect()
        })
        .collect())
}

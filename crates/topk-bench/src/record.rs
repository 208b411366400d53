//! The result record: one JSON line per measured configuration, the same
//! schema for our backends and for the anchors (torch, numpy, faiss), and its
//! CSV form.
//!
//! Records are written as they finish (each line flushed), so a campaign that
//! is interrupted keeps every row it completed.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{BenchError, Result};
use crate::stats::Summary;

/// The prefix of every result line on stdout.
pub const JSON_PREFIX: &str = "TOPK_BENCH_JSON ";

/// One measured configuration.
///
/// Timing fields are `None` (JSON `null`) for a configuration that failed its
/// correctness check: such a configuration is never timed. `correct` is `None`
/// only for anchors, which use another summation order and so cannot be
/// bit-identical.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// Corpus rows.
    pub n: usize,
    /// Values per row.
    pub d: usize,
    /// Neighbours per query.
    pub k: usize,
    /// Queries per call.
    pub batch: usize,
    /// `dot`, `cosine` or `l2`.
    pub metric: String,
    /// Who answered: `cuda`, `cpu`, `oracle`, `hnsw`, or an anchor
    /// (`torch`, `numpy`, `faiss-1t`, `faiss-2t`).
    pub backend: String,
    /// `resident`, `cpu_roundtrip` or `cpu`.
    pub path: String,
    /// Timed trials.
    pub trials: usize,
    /// Untimed warm-up runs.
    pub warmup: usize,
    /// Seed of the data.
    pub seed: u64,
    /// Median time of one call, ms.
    pub median_ms: Option<f64>,
    /// Fastest call, ms.
    pub min_ms: Option<f64>,
    /// Slowest call, ms.
    pub max_ms: Option<f64>,
    /// 90th percentile, ms.
    pub p90_ms: Option<f64>,
    /// Whether the answers equal the oracle's bit for bit (`None` for an
    /// approximate backend or an anchor: see `recall`).
    pub correct: Option<bool>,
    /// Recall@K against the oracle on the gate queries, for an approximate
    /// backend (HNSW), which is timed whatever its recall.
    #[serde(default)]
    pub recall: Option<f64>,
    /// The memory floor of one query, `N·D·4 / bandwidth`, ms.
    #[serde(default)]
    pub floor_ms: Option<f64>,
    /// The bandwidth the floor uses, GB/s (1e9 bytes per second).
    #[serde(default)]
    pub bandwidth_gbs: Option<f64>,
    /// Queries per second at the median (`batch / median`).
    #[serde(default)]
    pub qps: Option<f64>,
    /// What the correctness check compared.
    #[serde(default)]
    pub gate: Option<String>,
    /// Where the data came from (`gaussian` or a file name).
    #[serde(default)]
    pub data: Option<String>,
    /// Why the configuration failed, when it did.
    #[serde(default)]
    pub error: Option<String>,
}

impl Record {
    /// Fills the timing fields (and `qps`) from a summary.
    pub fn set_timing(&mut self, s: &Summary) {
        self.median_ms = Some(s.median_ms);
        self.min_ms = Some(s.min_ms);
        self.max_ms = Some(s.max_ms);
        self.p90_ms = Some(s.p90_ms);
        self.qps = (s.median_ms > 0.0).then(|| self.batch as f64 / (s.median_ms / 1e3));
    }

    /// Sets the floor from a bandwidth in bytes per second (one pass over
    /// the corpus per call, so a batch has the same floor as one query).
    pub fn set_floor(&mut self, bandwidth_bytes_per_s: f64) {
        if bandwidth_bytes_per_s > 0.0 && bandwidth_bytes_per_s.is_finite() {
            let bytes = (self.n * self.d * 4) as f64;
            self.floor_ms = Some(bytes / bandwidth_bytes_per_s * 1e3);
            self.bandwidth_gbs = Some(bandwidth_bytes_per_s / 1e9);
        }
    }

    /// The JSON object on one line.
    pub fn to_json(&self) -> String {
        // A struct of plain fields always serialises; fall back to an empty
        // object rather than panicking if that ever changed.
        serde_json::to_string(self).unwrap_or_else(|_| "{}".to_owned())
    }

    /// The stdout form: `TOPK_BENCH_JSON {...}`.
    pub fn to_line(&self) -> String {
        format!("{JSON_PREFIX}{}", self.to_json())
    }

    /// Parses a JSON object, with or without the stdout prefix.
    pub fn parse(line: &str) -> serde_json::Result<Record> {
        let line = line.trim();
        serde_json::from_str(
            line.strip_prefix(JSON_PREFIX.trim_end())
                .unwrap_or(line)
                .trim(),
        )
    }

    /// The CSV row, in [`CSV_HEADER`] order.
    pub fn to_csv(&self) -> String {
        let f = |v: Option<f64>| v.map(|x| format!("{x}")).unwrap_or_default();
        let b = |v: Option<bool>| v.map(|x| x.to_string()).unwrap_or_default();
        let s = |v: &Option<String>| v.as_deref().map(csv_field).unwrap_or_default();
        [
            self.n.to_string(),
            self.d.to_string(),
            self.k.to_string(),
            self.batch.to_string(),
            csv_field(&self.metric),
            csv_field(&self.backend),
            csv_field(&self.path),
            self.trials.to_string(),
            self.warmup.to_string(),
            self.seed.to_string(),
            f(self.median_ms),
            f(self.min_ms),
            f(self.max_ms),
            f(self.p90_ms),
            b(self.correct),
            f(self.recall),
            f(self.floor_ms),
            f(self.bandwidth_gbs),
            f(self.qps),
            s(&self.gate),
            s(&self.data),
            s(&self.error),
        ]
        .join(",")
    }
}

/// Column names of `results.csv`.
pub const CSV_HEADER: &str = "n,d,k,batch,metric,backend,path,trials,warmup,seed,median_ms,min_ms,max_ms,p90_ms,correct,recall,floor_ms,bandwidth_gbs,qps,gate,data,error";

/// Quotes a CSV field when it holds a comma, quote or line break (RFC 4180).
pub fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_owned()
    }
}

/// Appends records to `results.jsonl.partial` and `results.csv.partial` in
/// a folder, one flushed line at a time, and echoes each as a
/// `TOPK_BENCH_JSON` line; [`ResultsWriter::finish`] renames them to
/// `results.jsonl` and `results.csv`. A run that fails leaves the results of
/// an earlier run whole, and its own records in the `.partial` files.
#[derive(Debug)]
pub struct ResultsWriter {
    jsonl: File,
    csv: File,
    dir: PathBuf,
    echo: bool,
}

impl ResultsWriter {
    /// Creates (truncating) `dir/results.jsonl.partial` and
    /// `dir/results.csv.partial`.
    pub fn create(dir: &Path, echo: bool) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(|e| BenchError::io(dir, e))?;
        let jp = dir.join(RESULTS_JSONL).with_extension(PARTIAL_JSONL);
        let cp = dir.join(RESULTS_CSV).with_extension(PARTIAL_CSV);
        let jsonl = File::create(&jp).map_err(|e| BenchError::io(&jp, e))?;
        let mut csv = File::create(&cp).map_err(|e| BenchError::io(&cp, e))?;
        writeln!(csv, "{CSV_HEADER}").map_err(|e| BenchError::io(&cp, e))?;
        Ok(ResultsWriter {
            jsonl,
            csv,
            dir: dir.to_path_buf(),
            echo,
        })
    }

    /// Writes one record to both files (and stdout when echoing).
    pub fn write(&mut self, r: &Record) -> Result<()> {
        if self.echo {
            println!("{}", r.to_line());
        }
        let jp = self.dir.join(RESULTS_JSONL).with_extension(PARTIAL_JSONL);
        let cp = self.dir.join(RESULTS_CSV).with_extension(PARTIAL_CSV);
        writeln!(self.jsonl, "{}", r.to_json()).map_err(|e| BenchError::io(&jp, e))?;
        self.jsonl.flush().map_err(|e| BenchError::io(&jp, e))?;
        writeln!(self.csv, "{}", r.to_csv()).map_err(|e| BenchError::io(&cp, e))?;
        self.csv.flush().map_err(|e| BenchError::io(&cp, e))?;
        Ok(())
    }

    /// Syncs both files and renames them over `results.jsonl` and
    /// `results.csv` (each whole, the old one until then).
    pub fn finish(self) -> Result<()> {
        for (file, name, partial) in [
            (&self.jsonl, RESULTS_JSONL, PARTIAL_JSONL),
            (&self.csv, RESULTS_CSV, PARTIAL_CSV),
        ] {
            let done = self.dir.join(name);
            let from = done.with_extension(partial);
            file.sync_all().map_err(|e| BenchError::io(&from, e))?;
            std::fs::rename(&from, &done).map_err(|e| BenchError::io(&done, e))?;
            topk_io::sync_folder_of(&done);
        }
        Ok(())
    }
}

/// [`topk_io::write_whole`], its error naming `path`.
pub fn write_whole(path: &Path, bytes: &[u8]) -> Result<()> {
    topk_io::write_whole(path, bytes).map_err(|e| BenchError::io(path, e))
}

/// The results of a run, one JSON record a line.
pub const RESULTS_JSONL: &str = "results.jsonl";
/// The results of a run, as CSV.
pub const RESULTS_CSV: &str = "results.csv";
const PARTIAL_JSONL: &str = "jsonl.partial";
const PARTIAL_CSV: &str = "csv.partial";

/// Reads every record of a JSON-lines file. Blank lines and lines that are
/// not JSON objects (log lines captured with the output) are skipped; a line
/// that looks like a record but does not parse is an error naming the line.
pub fn read_jsonl(path: &Path) -> Result<Vec<Record>> {
    let file = File::open(path).map_err(|e| BenchError::io(path, e))?;
    let mut out = Vec::new();
    for (i, line) in BufReader::new(file).lines().enumerate() {
        let line = line.map_err(|e| BenchError::io(path, e))?;
        let body = line.trim();
        let body = body
            .strip_prefix(JSON_PREFIX.trim_end())
            .unwrap_or(body)
            .trim();
        if !body.starts_with('{') {
            continue;
        }
        let rec = Record::parse(body).map_err(|source| BenchError::BadRecord {
            path: path.to_path_buf(),
            line: i + 1,
            source,
        })?;
        out.push(rec);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn sample() -> Record {
        Record {
            n: 1000,
            d: 384,
            k: 8,
            batch: 1,
            metric: "dot".into(),
            backend: "cpu".into(),
            path: "cpu".into(),
            trials: 20,
            warmup: 3,
            seed: 42,
            median_ms: Some(0.5),
            min_ms: Some(0.25),
            max_ms: Some(1.0),
            p90_ms: Some(0.75),
            correct: Some(true),
            recall: None,
            floor_ms: None,
            bandwidth_gbs: None,
            qps: Some(2000.0),
            gate: Some("oracle:1".into()),
            data: Some("gaussian".into()),
            error: None,
        }
    }

    #[test]
    fn json_round_trips_with_and_without_prefix() {
        let r = sample();
        assert_eq!(Record::parse(&r.to_line()).unwrap(), r);
        assert_eq!(Record::parse(&r.to_json()).unwrap(), r);
    }

    #[test]
    fn csv_row_matches_header_and_quotes() {
        let mut r = sample();
        r.error = Some("mismatch at rank 3, \"index\" 7".into());
        let row = r.to_csv();
        assert!(
            row.ends_with("\"mismatch at rank 3, \"\"index\"\" 7\""),
            "{row}"
        );
        // Unquoted fields before the quoted one line up with the header.
        let head: Vec<&str> = CSV_HEADER.split(',').collect();
        let cells: Vec<&str> = row.split(',').collect();
        assert_eq!(cells[..19].len(), head[..19].len());
        assert_eq!(cells[0], "1000");
        assert_eq!(cells[14], "true");
        assert_eq!(cells[16], "", "absent floor is an empty cell");
    }
}

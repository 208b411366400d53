//! Joining our records with the anchors' (torch, numpy, faiss) by
//! configuration `(n, d, k, batch)`, into one row per configuration with
//! every contender's median and the ratios against ours.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::error::{BenchError, Result};
use crate::record::{csv_field, read_jsonl, Record};

/// The configuration a row is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Key {
    /// Corpus rows.
    pub n: usize,
    /// Values per row.
    pub d: usize,
    /// Neighbours per query.
    pub k: usize,
    /// Queries per call.
    pub batch: usize,
}

/// Contender label of our GPU-resident path.
pub const TOPK_GPU: &str = "topk";
/// Contender label of our GPU path with the query already on the device.
pub const TOPK_DEVICE: &str = "topk_device";
/// Contender label of the CPU round-trip baseline.
pub const CPU_ROUNDTRIP: &str = "cpu_roundtrip";
/// Contender label of our CPU backend on host queries.
pub const TOPK_CPU: &str = "topk_cpu";
/// Contender label of torch's batches with TF32 tensor-core products (inexact).
pub const TORCH_TF32: &str = "torch_tf32";
/// Contender label of torch's batches over a bf16 copy of the corpus (inexact).
pub const TORCH_BF16: &str = "torch_bf16";

/// The contender name of a record: ours are `topk` (GPU-resident),
/// `cpu_roundtrip` and `topk_cpu`; an anchor is its backend name.
pub fn contender(r: &Record) -> String {
    match (r.backend.as_str(), r.path.as_str()) {
        ("cuda", "resident") => TOPK_GPU.to_owned(),
        ("cuda", "device") => TOPK_DEVICE.to_owned(),
        ("cuda", "cpu_roundtrip") => CPU_ROUNDTRIP.to_owned(),
        ("cpu", _) => TOPK_CPU.to_owned(),
        (b, _) => b.to_owned(),
    }
}

/// One configuration with every contender that ran it.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// The configuration.
    pub key: Key,
    /// Median ms per contender (timed records only).
    pub median_ms: BTreeMap<String, f64>,
    /// Queries per second per contender.
    pub qps: BTreeMap<String, f64>,
    /// Memory floor, ms (from our records).
    pub floor_ms: Option<f64>,
    /// Whether every one of our records for this configuration was exact
    /// (`None` when none of ours ran it).
    pub exact: Option<bool>,
    /// Errors of our records, joined.
    pub errors: Vec<String>,
}

impl Row {
    /// Our headline contender in this row: the GPU path when present, else the CPU one.
    pub fn ours(&self) -> Option<(&'static str, f64)> {
        [TOPK_GPU, TOPK_CPU]
            .into_iter()
            .find_map(|c| self.median_ms.get(c).map(|&m| (c, m)))
    }

    /// The CPU baseline of this row: the round trip for a single query, the
    /// host batch for a batch (the round-trip helper is single-query).
    pub fn cpu_baseline(&self) -> Option<(&'static str, f64)> {
        [CPU_ROUNDTRIP, TOPK_CPU]
            .into_iter()
            .filter(|c| self.ours().is_some_and(|(o, _)| o != *c))
            .find_map(|c| self.median_ms.get(c).map(|&m| (c, m)))
    }

    /// `other / ours` (above 1: ours is faster).
    pub fn speedup_vs(&self, other: &str) -> Option<f64> {
        let (_, ours) = self.ours()?;
        let o = *self.median_ms.get(other)?;
        (ours > 0.0).then(|| o / ours)
    }
}

fn is_ours(r: &Record) -> bool {
    matches!(r.backend.as_str(), "cuda" | "cpu" | "oracle" | "hnsw")
}

/// Joins records into rows sorted by (n, d, k, batch). When a contender has
/// several timed records for one key (a re-run appended), the last one wins.
pub fn join(records: &[Record]) -> Vec<Row> {
    let mut rows: BTreeMap<Key, Row> = BTreeMap::new();
    for r in records {
        let key = Key {
            n: r.n,
            d: r.d,
            k: r.k,
            batch: r.batch,
        };
        let row = rows.entry(key).or_insert_with(|| Row {
            key,
            median_ms: BTreeMap::new(),
            qps: BTreeMap::new(),
            floor_ms: None,
            exact: None,
            errors: Vec::new(),
        });
        let c = contender(r);
        if is_ours(r) {
            let ok = r.correct == Some(true);
            row.exact = Some(row.exact.unwrap_or(true) && ok);
            if let Some(e) = &r.error {
                row.errors.push(format!("{c}: {e}"));
            }
            if r.floor_ms.is_some() {
                row.floor_ms = r.floor_ms;
            }
        }
        let usable = r.correct != Some(false);
        if let (true, Some(m)) = (usable, r.median_ms) {
            row.median_ms.insert(c.clone(), m);
            if let Some(q) = r.qps {
                row.qps.insert(c, q);
            }
        }
    }
    rows.into_values().collect()
}

/// Reads `dir/results.jsonl` and every `dir/anchors/*.jsonl`.
pub fn read_dir_records(dir: &Path) -> Result<Vec<Record>> {
    let main = dir.join("results.jsonl");
    let mut out = if main.exists() {
        read_jsonl(&main)?
    } else {
        Vec::new()
    };
    for f in anchor_files(dir)? {
        out.extend(read_jsonl(&f)?);
    }
    if out.is_empty() {
        return Err(BenchError::NoResults {
            path: dir.to_path_buf(),
            what: "results.jsonl or anchors/*.jsonl".into(),
        });
    }
    Ok(out)
}

/// The anchor result files of a results folder, sorted by name.
pub fn anchor_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let adir = dir.join("anchors");
    if !adir.is_dir() {
        return Ok(Vec::new());
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(&adir)
        .map_err(|e| BenchError::io(&adir, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .collect();
    files.sort();
    Ok(files)
}

/// All contender names present in the rows, ours first.
pub fn contenders(rows: &[Row]) -> Vec<String> {
    let mut all: Vec<String> = rows
        .iter()
        .flat_map(|r| r.median_ms.keys().cloned())
        .collect();
    all.sort();
    all.dedup();
    let rank = |c: &str| match c {
        TOPK_GPU => 0,
        TOPK_DEVICE => 1,
        TOPK_CPU => 2,
        CPU_ROUNDTRIP => 3,
        "torch" => 4,
        TORCH_TF32 => 5,
        TORCH_BF16 => 6,
        _ => 7,
    };
    all.sort_by_key(|c| (rank(c), c.clone()));
    all
}

/// The joined table as CSV: key, floor, exactness, each contender's median
/// and QPS, ours over the floor, and each other contender's time over ours.
pub fn to_csv(rows: &[Row]) -> String {
    let cs = contenders(rows);
    let mut out = String::from("n,d,k,batch,floor_ms,exact");
    for c in &cs {
        let _ = write!(out, ",{c}_ms,{c}_qps");
    }
    out.push_str(",ours,ours_over_floor");
    for c in &cs {
        let _ = write!(out, ",speedup_vs_{c}");
    }
    out.push_str(",errors\n");
    let f = |v: Option<f64>| v.map(|x| format!("{x}")).unwrap_or_default();
    for r in rows {
        let _ = write!(
            out,
            "{},{},{},{},{},{}",
            r.key.n,
            r.key.d,
            r.key.k,
            r.key.batch,
            f(r.floor_ms),
            r.exact.map(|b| b.to_string()).unwrap_or_default()
        );
        for c in &cs {
            let _ = write!(
                out,
                ",{},{}",
                f(r.median_ms.get(c).copied()),
                f(r.qps.get(c).copied())
            );
        }
        let ours = r.ours();
        let over = match (ours, r.floor_ms) {
            (Some((_, m)), Some(fl)) if fl > 0.0 => Some(m / fl),
            _ => None,
        };
        let _ = write!(out, ",{},{}", ours.map(|o| o.0).unwrap_or(""), f(over));
        for c in &cs {
            let _ = write!(out, ",{}", f(r.speedup_vs(c)));
        }
        let _ = writeln!(out, ",{}", csv_field(&r.errors.join("; ")));
    }
    out
}

/// Joins a results folder and writes `dir/joined.csv`; returns the rows.
pub fn join_dir(dir: &Path) -> Result<Vec<Row>> {
    let rows = join(&read_dir_records(dir)?);
    let path = dir.join("joined.csv");
    crate::record::write_whole(&path, to_csv(&rows).as_bytes())?;
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(backend: &str, path: &str, k: usize, ms: Option<f64>, correct: Option<bool>) -> Record {
        Record {
            n: 1000,
            d: 64,
            k,
            batch: 1,
            metric: "dot".into(),
            backend: backend.into(),
            path: path.into(),
            trials: 20,
            warmup: 2,
            seed: 1,
            median_ms: ms,
            min_ms: ms,
            max_ms: ms,
            p90_ms: ms,
            correct,
            recall: None,
            floor_ms: Some(0.01),
            bandwidth_gbs: None,
            qps: ms.map(|m| 1e3 / m),
            gate: None,
            data: None,
            error: (correct == Some(false)).then(|| "wrong".to_owned()),
        }
    }

    #[test]
    fn joins_by_key_and_computes_ratios() {
        let rows = join(&[
            rec("cuda", "resident", 8, Some(0.02), Some(true)),
            rec("cuda", "cpu_roundtrip", 8, Some(0.5), Some(true)),
            rec("torch", "resident", 8, Some(0.1), None),
            rec("torch", "resident", 100, Some(0.1), None),
        ]);
        assert_eq!(rows.len(), 2);
        let r = &rows[0];
        assert_eq!(r.key.k, 8);
        assert_eq!(r.ours(), Some((TOPK_GPU, 0.02)));
        assert!((r.speedup_vs("torch").unwrap() - 5.0).abs() < 1e-12);
        assert_eq!(r.exact, Some(true));
        // K = 100 has only the anchor: no "ours", no exactness claim.
        assert_eq!(rows[1].ours(), None);
        assert_eq!(rows[1].exact, None);
    }

    #[test]
    fn failed_config_is_not_exact_and_not_timed() {
        let rows = join(&[
            rec("cuda", "resident", 8, None, Some(false)),
            rec("cuda", "cpu_roundtrip", 8, Some(0.5), Some(true)),
        ]);
        assert_eq!(rows[0].exact, Some(false));
        assert!(!rows[0].median_ms.contains_key(TOPK_GPU));
        assert_eq!(rows[0].errors, vec!["topk: wrong".to_owned()]);
    }

    #[test]
    fn csv_has_one_line_per_row_and_ratio_columns() {
        let rows = join(&[
            rec("cpu", "cpu", 8, Some(2.0), Some(true)),
            rec("faiss-1t", "cpu", 8, Some(4.0), None),
        ]);
        let csv = to_csv(&rows);
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines.len(), 2);
        let head: Vec<&str> = lines[0].split(',').collect();
        let cells: Vec<&str> = lines[1].split(',').collect();
        assert_eq!(head.len(), cells.len());
        let at = |name: &str| cells[head.iter().position(|h| *h == name).unwrap()];
        assert_eq!(at("speedup_vs_faiss-1t"), "2");
        assert_eq!(at("ours"), TOPK_CPU);
        assert_eq!(at("ours_over_floor"), "200");
    }
}

//! The data folder's `manifest.json`: which `.npy` files hold each D's corpus
//! and queries, and the configurations (with trial counts) the anchors should
//! time on them, so the Python anchors run exactly our sweep on our bytes.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{BenchError, Result};

/// One configuration an anchor times.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AnchorConfig {
    /// Corpus rows (a prefix of the D's corpus file).
    pub n: usize,
    /// Values per row.
    pub d: usize,
    /// Neighbours per query.
    pub k: usize,
    /// Queries per call (the first `batch` rows of the query file).
    pub batch: usize,
    /// Timed trials.
    pub trials: usize,
    /// Untimed warm-up runs.
    pub warmup: usize,
}

/// The manifest of a data folder.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// Seed of the Gaussian data.
    pub seed: u64,
    /// Metric of the sweep (the anchors implement `dot`).
    pub metric: String,
    /// Rows of each corpus file.
    pub n_max: usize,
    /// Corpus file name (in the data folder) per D.
    pub corpus: BTreeMap<usize, String>,
    /// Query file name per D.
    pub queries: BTreeMap<usize, String>,
    /// The configurations to time.
    pub configs: Vec<AnchorConfig>,
    /// What the files hold.
    pub layout: String,
}

impl Manifest {
    /// The file names used for dimension `d`.
    pub fn file_names(d: usize) -> (String, String) {
        (format!("corpus_d{d}.npy"), format!("queries_d{d}.npy"))
    }

    /// An empty manifest for a sweep.
    pub fn new(seed: u64, metric: &str, n_max: usize, ds: &[usize]) -> Manifest {
        let mut corpus = BTreeMap::new();
        let mut queries = BTreeMap::new();
        for &d in ds {
            let (c, q) = Self::file_names(d);
            corpus.insert(d, c);
            queries.insert(d, q);
        }
        Manifest {
            seed,
            metric: metric.to_owned(),
            n_max,
            corpus,
            queries,
            configs: Vec::new(),
            layout: "C-order float32 .npy; L2-normalised Gaussian rows; an N-row corpus is the \
                     first N rows of the file; a batch of Q queries is the first Q rows"
                .to_owned(),
        }
    }

    /// Writes `dir/manifest.json`.
    pub fn write(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(|e| BenchError::io(dir, e))?;
        let path = dir.join("manifest.json");
        let text = serde_json::to_string_pretty(self).unwrap_or_else(|_| "{}".to_owned());
        crate::record::write_whole(&path, (text + "\n").as_bytes())
    }

    /// Reads `dir/manifest.json`.
    pub fn read(dir: &Path) -> Result<Manifest> {
        let path = dir.join("manifest.json");
        let text = std::fs::read_to_string(&path).map_err(|e| BenchError::io(&path, e))?;
        serde_json::from_str(&text).map_err(|source| BenchError::BadRecord {
            path,
            line: 1,
            source,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_through_a_folder() {
        let dir = tempfile::tempdir().unwrap();
        let mut m = Manifest::new(7, "dot", 1000, &[384, 1024]);
        m.configs.push(AnchorConfig {
            n: 1000,
            d: 384,
            k: 8,
            batch: 1,
            trials: 20,
            warmup: 3,
        });
        m.write(dir.path()).unwrap();
        assert_eq!(Manifest::read(dir.path()).unwrap(), m);
        assert_eq!(m.corpus[&1024], "corpus_d1024.npy");
    }
}

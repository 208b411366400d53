//! What one benchmark run measures, and the checks on every flag.
//!
//! A [`RunConfig`] is validated once, before any data is generated, so a bad
//! flag costs nothing and names its value.

use std::fmt;

use serde::{Deserialize, Serialize};
use topk_core::Metric;

use crate::error::{BenchError, Result};

/// Largest D the harness accepts. Larger vectors are outside the project's
/// scope (embeddings are 384–1024 wide) and a typo like `--d 10240000`
/// should fail before allocating gigabytes.
pub const MAX_DIM: usize = 16_384;

/// Largest corpus, in values (N·D): 128 GiB of f32, above one H200's
/// memory (a guard against typos such as `--n 1e10`, not a real limit).
pub const MAX_VALUES: usize = 1 << 35;

/// Largest batch a run times.
pub const MAX_BATCH: usize = 65_536;

/// Largest number of timed trials (a guard against typos, not a real limit).
pub const MAX_TRIALS: usize = 1_000_000;

/// The backend a run measures: the facade's one list of backends.
pub use topk::Backend;

/// Which end-to-end path a timing covers (docs/CONTRACTS.md §6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TimedPath {
    /// GPU-resident: query host→device, score, select, results device→host.
    Resident,
    /// GPU with the query already on the device: score, select, results
    /// device→host.
    Device,
    /// The CPU round-trip baseline: query device→host, CPU score + select,
    /// results host→device.
    CpuRoundtrip,
    /// A host backend answering a host query.
    Cpu,
}

impl TimedPath {
    /// The name used in result lines.
    pub fn as_str(self) -> &'static str {
        match self {
            TimedPath::Resident => "resident",
            TimedPath::Device => "device",
            TimedPath::CpuRoundtrip => "cpu_roundtrip",
            TimedPath::Cpu => "cpu",
        }
    }
}

impl fmt::Display for TimedPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One benchmark configuration: what to search, how, and how often.
#[derive(Debug, Clone, PartialEq)]
pub struct RunConfig {
    /// Corpus rows, N.
    pub n: usize,
    /// Values per row, D.
    pub d: usize,
    /// Neighbours per query, K.
    pub k: usize,
    /// Timed trials; the statistics are over these.
    pub trials: usize,
    /// Untimed runs before the trials.
    pub warmup: usize,
    /// Seed of the synthetic data.
    pub seed: u64,
    /// Similarity measure.
    pub metric: Metric,
    /// Backend measured.
    pub backend: Backend,
    /// Queries per call: 1 is a single-query search, more uses `search_batch`.
    pub batch: usize,
}

impl Default for RunConfig {
    fn default() -> Self {
        RunConfig {
            n: 100_000,
            d: 384,
            k: 100,
            trials: 20,
            warmup: 3,
            seed: 42,
            metric: Metric::Dot,
            backend: Backend::Cpu,
            batch: 1,
        }
    }
}

impl RunConfig {
    /// Checks every field, returning the first bad one as a typed error.
    pub fn validate(&self) -> Result<()> {
        validate_shape(self.n, self.d)?;
        self.validate_flags_only()
    }

    /// Checks everything but the corpus shape (which a data file may set).
    pub fn validate_flags_only(&self) -> Result<()> {
        if self.k == 0 {
            return Err(BenchError::flag(
                "k",
                self.k,
                "ask for at least one neighbour",
            ));
        }
        if self.trials == 0 || self.trials > MAX_TRIALS {
            return Err(BenchError::flag(
                "trials",
                self.trials,
                format!("must be between 1 and {MAX_TRIALS}"),
            ));
        }
        if self.warmup > MAX_TRIALS {
            return Err(BenchError::flag(
                "warmup",
                self.warmup,
                format!("must be at most {MAX_TRIALS}"),
            ));
        }
        if self.batch == 0 || self.batch > MAX_BATCH {
            return Err(BenchError::flag(
                "batch",
                self.batch,
                format!("must be between 1 and {MAX_BATCH}"),
            ));
        }
        Ok(())
    }

    /// Results per query: `min(K, N)`.
    pub fn results_per_query(&self) -> usize {
        self.k.min(self.n)
    }
}

/// Checks a corpus shape: N ≥ 1, 1 ≤ D ≤ [`MAX_DIM`], N·D ≤ [`MAX_VALUES`],
/// N within the u32 index range.
pub fn validate_shape(n: usize, d: usize) -> Result<()> {
    if n == 0 {
        return Err(BenchError::flag(
            "n",
            n,
            "the corpus needs at least one row",
        ));
    }
    if n > topk_core::validate::MAX_ROWS {
        return Err(BenchError::flag(
            "n",
            n,
            format!(
                "at most {} rows (indices are u32)",
                topk_core::validate::MAX_ROWS
            ),
        ));
    }
    if d == 0 {
        return Err(BenchError::flag("d", d, "vectors need at least one value"));
    }
    if d > MAX_DIM {
        return Err(BenchError::flag(
            "d",
            d,
            format!("too large: the harness accepts D up to {MAX_DIM}"),
        ));
    }
    match n.checked_mul(d) {
        Some(v) if v <= MAX_VALUES => Ok(()),
        _ => Err(BenchError::flag(
            "n",
            n,
            format!(
                "N·D = {n}·{d} values exceeds the harness limit of {MAX_VALUES} (128 GiB of f32)"
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        RunConfig::default().validate().unwrap();
    }

    #[test]
    fn backend_names_round_trip() {
        for backend in Backend::ALL {
            assert_eq!(backend.as_str().parse::<Backend>().unwrap(), backend);
        }
        let err = "faiss".parse::<Backend>().unwrap_err();
        assert!(err.to_string().contains("`faiss`"), "{err}");
    }
}

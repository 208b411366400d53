//! The data a run searches: seeded Gaussian rows (L2-normalised) or
//! corpus/query files, all through topk-io (the project's one home for file
//! formats and the synthetic generator).
//!
//! Synthetic corpora derive row `i` from `(seed, i)`, so an N-row corpus is
//! the prefix of any larger one with the same seed: a campaign generates the
//! largest corpus of each D once and slices it.

use std::path::Path;

use ndarray::Array2;

use crate::error::{BenchError, Result};

/// Row-major Gaussian rows, each L2-normalised, reproducible from `seed`.
pub fn gaussian(n: usize, d: usize, seed: u64) -> Array2<f32> {
    topk_io::synth::gaussian_rows(n, d, seed, true)
}

/// The query pool that goes with a corpus of seed `seed` (its own stream:
/// no query is a corpus row).
pub fn gaussian_queries(count: usize, d: usize, seed: u64) -> Array2<f32> {
    topk_io::synth::gaussian_queries(count, d, seed, true)
}

/// Reads a matrix file (`.npy`, `.fvecs`, `.bvecs`) as f32 rows.
pub fn load(path: &Path) -> Result<Array2<f32>> {
    topk_io::read_matrix(path).map_err(|e| BenchError::data(path, e))
}

/// Writes rows as a C-order f32 `.npy` file (what the Python anchors load).
pub fn write_npy(path: &Path, rows: ndarray::ArrayView2<'_, f32>) -> Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| BenchError::io(dir, e))?;
    }
    topk_io::write_npy_f32(path, rows).map_err(|e| BenchError::data(path, e))
}

/// A short label of a data file for the record: its file name.
pub fn label(path: &Path) -> String {
    path.file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string())
}

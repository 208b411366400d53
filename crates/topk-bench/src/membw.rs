//! Host memory bandwidth, measured in the same process as the CPU timings
//! so that the CPU floor (`N·D·4 bytes / bandwidth`) belongs to the same run.
//!
//! A single query reads the corpus once and writes almost nothing, so the
//! floor uses a parallel read pass over a buffer far larger than any cache.
//! A copy figure (read + write counted) is reported too, for comparison with
//! the GPU's device-to-device copy.

use std::hint::black_box;
use std::time::Instant;

use rayon::prelude::*;
use serde::Serialize;

/// Measured host bandwidths, bytes per second.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct HostBandwidth {
    /// Parallel read pass (best of the repeats).
    pub read_bytes_per_s: f64,
    /// Parallel copy, read and write bytes both counted (best of the repeats).
    pub copy_bytes_per_s: f64,
    /// Buffer size used, bytes.
    pub buffer_bytes: usize,
    /// Threads that ran the passes.
    pub threads: usize,
}

/// Measures with a buffer of `bytes` (rounded down to whole 8-byte words) and
/// `repeats` timed passes of each kind after one untimed pass.
pub fn measure(bytes: usize, repeats: usize) -> HostBandwidth {
    let words = (bytes / 8).max(1 << 16);
    // Distinct non-zero contents so that no page is shared or compressed.
    let src: Vec<u64> = (0..words as u64)
        .into_par_iter()
        .map(|i| i ^ 0x9e37)
        .collect();
    let mut dst = vec![0u64; words];
    let chunk = 1 << 16;

    let read = |src: &[u64]| {
        src.par_chunks(chunk)
            .map(|c| c.iter().fold(0u64, |a, &x| a.wrapping_add(x)))
            .reduce(|| 0, u64::wrapping_add)
    };
    let mut best_read = f64::INFINITY;
    black_box(read(&src));
    for _ in 0..repeats.max(1) {
        let t = Instant::now();
        black_box(read(black_box(&src)));
        best_read = best_read.min(t.elapsed().as_secs_f64());
    }

    let mut best_copy = f64::INFINITY;
    for rep in 0..=repeats.max(1) {
        let t = Instant::now();
        dst.par_chunks_mut(chunk)
            .zip(src.par_chunks(chunk))
            .for_each(|(d, s)| d.copy_from_slice(s));
        black_box(&mut dst);
        if rep > 0 {
            best_copy = best_copy.min(t.elapsed().as_secs_f64());
        }
    }

    let b = (words * 8) as f64;
    HostBandwidth {
        read_bytes_per_s: b / best_read,
        copy_bytes_per_s: 2.0 * b / best_copy,
        buffer_bytes: words * 8,
        threads: rayon::current_num_threads(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn small_buffer_gives_positive_finite_figures() {
        let bw = super::measure(1 << 20, 1);
        assert!(bw.read_bytes_per_s.is_finite() && bw.read_bytes_per_s > 0.0);
        assert!(bw.copy_bytes_per_s.is_finite() && bw.copy_bytes_per_s > 0.0);
        assert_eq!(bw.buffer_bytes, 1 << 20);
    }
}

//! The canonical primitives (docs/CONTRACTS.md §2) on the widest vector unit the CPU
//! offers, chosen at run time, bit-identical to topk-core's scalar reference.
//!
//! Every instruction-set path keeps the 32 partial sums of the canonical order
//! in vector registers (lane `j` holds `p[j]`), so the sums happen in exactly
//! the reference's order and the butterfly runs in registers:
//!
//! | [`Path`] | partial sums | batch tile (rows × queries) |
//! | --- | --- | --- |
//! | `Scalar` | topk-core's reference, no second copy | 1 × 1 |
//! | `Avx2` (AVX2 + FMA) | 4 ymm registers | 3 × 4 (dot), 2 × 4 (L2) |
//! | `Avx512` (AVX-512F) | 2 zmm registers | 4 × 4 |
//!
//! The last, partial chunk of a vector is padded: the query's tail with
//! `+0.0`, the row's with `-0.0`. A padded step of a dot product adds
//! `fma(+0, -0, p) = -0 + p`, which is `p` bit for bit for every `p`, `-0.0`
//! included (a partial sum is `-0.0` when a tiny negative product underflows;
//! padding both with `+0.0` would turn it into `+0.0`, which the reference,
//! never stepping that lane, keeps). A padded step of a squared distance adds
//! `(-0 - +0)^2 = +0` to a partial sum that is never `-0.0` (it starts at
//! `+0.0` and adds squares).
//!
//! [`Kernels`] is a token that proves its path runs on this CPU; it is the
//! only way into the unsafe code, which lives in this module alone.

use std::fmt;
use std::sync::OnceLock;

use topk_core::{cosine_from_parts, Metric, LANES};

use crate::error::CpuError;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
pub(crate) mod gemm;
pub(crate) mod int8;
mod widen;

pub use widen::rows_f32;

/// Most queries scored together by one batch tile.
pub(crate) const TILE_QUERIES: usize = 4;
/// Most rows scored together by one batch tile, over every path.
pub(crate) const MAX_TILE_ROWS: usize = 4;
/// Raw results of one tile: `out[r][q]`.
pub(crate) type TileOut = [[f32; TILE_QUERIES]; MAX_TILE_ROWS];

/// An implementation of the canonical primitives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Path {
    /// topk-core's scalar reference; runs everywhere.
    Scalar,
    /// x86-64 AVX2 with FMA: four 8-lane registers of partial sums.
    Avx2,
    /// x86-64 AVX-512F: two 16-lane registers of partial sums.
    Avx512,
}

impl Path {
    /// Every path, fastest last.
    pub const ALL: [Path; 3] = [Path::Scalar, Path::Avx2, Path::Avx512];

    /// Lowercase name ("scalar", "avx2", "avx512").
    pub fn as_str(self) -> &'static str {
        match self {
            Path::Scalar => "scalar",
            Path::Avx2 => "avx2",
            Path::Avx512 => "avx512",
        }
    }

    /// Whether this CPU can run the path.
    pub fn is_available(self) -> bool {
        match self {
            Path::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Path::Avx2 => {
                std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
            }
            #[cfg(target_arch = "x86_64")]
            Path::Avx512 => {
                std::arch::is_x86_feature_detected!("avx512f")
                    && std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
            }
            #[cfg(not(target_arch = "x86_64"))]
            Path::Avx2 | Path::Avx512 => false,
        }
    }

    /// The paths this CPU can run, scalar first.
    pub fn available() -> Vec<Path> {
        Path::ALL.into_iter().filter(|p| p.is_available()).collect()
    }

    /// The fastest path this CPU can run (detected once).
    pub fn best() -> Path {
        static BEST: OnceLock<Path> = OnceLock::new();
        *BEST.get_or_init(|| {
            let best = Path::ALL
                .into_iter()
                .rev()
                .find(|p| p.is_available())
                .unwrap_or(Path::Scalar);
            tracing::debug!(path = best.as_str(), "canonical kernels selected");
            best
        })
    }
}

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The canonical primitives on one [`Path`], which this CPU is known to run.
///
/// Obtained from [`Kernels::best`] or, to force a path (tests, comparisons),
/// from [`Kernels::new`], which refuses a path the CPU lacks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Kernels {
    path: Path,
}

impl Default for Kernels {
    fn default() -> Self {
        Kernels::best()
    }
}

impl Kernels {
    /// The fastest path of this CPU.
    pub fn best() -> Kernels {
        Kernels { path: Path::best() }
    }

    /// A forced path, or [`CpuError::PathUnavailable`] when this CPU cannot run it.
    pub fn new(path: Path) -> Result<Kernels, CpuError> {
        if path.is_available() {
            Ok(Kernels { path })
        } else {
            Err(CpuError::PathUnavailable {
                path,
                available: Path::available()
                    .iter()
                    .map(|p| p.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            })
        }
    }

    /// Every path this CPU runs, scalar first: one tester for all of them.
    pub fn all_available() -> Vec<Kernels> {
        Path::available()
            .into_iter()
            .map(|path| Kernels { path })
            .collect()
    }

    /// The path these kernels run.
    pub fn path(self) -> Path {
        self.path
    }

    /// Canonical inner product, bit-identical to [`topk_core::canon_dot`].
    ///
    /// # Panics
    /// When the lengths differ (shapes are validated before scoring).
    #[inline]
    pub fn dot(self, a: &[f32], b: &[f32]) -> f32 {
        assert_eq!(a.len(), b.len(), "canon_dot: length mismatch");
        self.pair(false, a, b)
    }

    /// Canonical squared distance, bit-identical to [`topk_core::canon_sqdist`].
    ///
    /// # Panics
    /// When the lengths differ.
    #[inline]
    pub fn sqdist(self, q: &[f32], r: &[f32]) -> f32 {
        assert_eq!(q.len(), r.len(), "canon_sqdist: length mismatch");
        self.pair(true, q, r)
    }

    /// Canonical norm `sqrt(dot(x, x))`, bit-identical to [`topk_core::canon_norm`].
    #[inline]
    pub fn norm(self, x: &[f32]) -> f32 {
        self.dot(x, x).sqrt()
    }

    /// The score of one row under `metric`, bit-identical to
    /// [`Metric::score_scalar`]. The norms are those of [`Kernels::norm`] and
    /// are read only for [`Metric::Cosine`]; precompute them once per row and
    /// query.
    ///
    /// # Panics
    /// When the lengths differ.
    #[inline]
    pub fn score_row(
        self,
        metric: Metric,
        query: &[f32],
        query_norm: f32,
        row: &[f32],
        row_norm: f32,
    ) -> f32 {
        match metric {
            Metric::Dot => self.dot(query, row),
            Metric::Cosine => cosine_from_parts(self.dot(query, row), query_norm, row_norm),
            Metric::L2 => -self.sqdist(query, row),
        }
    }

    /// Scores consecutive rows of a row-major block: `out[i]` is the score of
    /// `rows[i * D .. (i + 1) * D]` with `D = query.len()`. `row_norms[i]` is
    /// read only for cosine (pass `&[]` otherwise).
    ///
    /// # Panics
    /// When `rows.len() != out.len() * query.len()`, or for cosine when
    /// `row_norms.len() != out.len()`.
    pub fn score_rows(
        self,
        metric: Metric,
        query: &[f32],
        query_norm: f32,
        rows: &[f32],
        row_norms: &[f32],
        out: &mut [f32],
    ) {
        let d = query.len();
        assert_eq!(
            rows.len(),
            out.len() * d,
            "score_rows: a block of {} values is not {} rows of D = {d}",
            rows.len(),
            out.len()
        );
        if d == 0 {
            // Rows of no values (no chunks to step through): each scores as
            // the empty pair does.
            for (i, o) in out.iter_mut().enumerate() {
                let norm = row_norms.get(i).copied().unwrap_or(0.0);
                *o = self.score_row(metric, query, query_norm, &[], norm);
            }
            return;
        }
        let sq = metric == Metric::L2;
        match self.path {
            Path::Scalar => {
                for (o, row) in out.iter_mut().zip(rows.chunks_exact(d)) {
                    *o = self.pair(sq, query, row);
                }
            }
            // SAFETY: a `Kernels` of this path exists only where the CPU runs
            // AVX2 and FMA (checked in `Kernels::new` / `Path::best`), and the
            // assert above gives `rows` exactly `out.len()` rows of `d` values.
            #[cfg(target_arch = "x86_64")]
            Path::Avx2 => unsafe { avx2::rows(sq, query, rows, out) },
            // SAFETY: as above, for AVX-512F.
            #[cfg(target_arch = "x86_64")]
            Path::Avx512 => unsafe { avx512::rows(sq, query, rows, out) },
            #[cfg(not(target_arch = "x86_64"))]
            Path::Avx2 | Path::Avx512 => unreachable!("x86 paths are never available here"),
        }
        match metric {
            Metric::Dot => {}
            Metric::L2 => out.iter_mut().for_each(|s| *s = -*s),
            Metric::Cosine => {
                assert_eq!(row_norms.len(), out.len(), "score_rows: one norm per row");
                for (s, &rn) in out.iter_mut().zip(row_norms) {
                    *s = cosine_from_parts(*s, query_norm, rn);
                }
            }
        }
    }

    /// Rows per batch tile for `metric` on this path.
    pub(crate) fn tile_rows(self, metric: Metric) -> usize {
        let sq = metric == Metric::L2;
        match self.path {
            Path::Scalar => 1,
            Path::Avx2 if sq => 2,
            Path::Avx2 => 3,
            Path::Avx512 => 4,
        }
    }

    /// Raw canonical values (dot, or squared distance when `sq`) of every
    /// pair of a tile: `out[r][q]` for `rows[r]` and `queries[q]`.
    ///
    /// `rows.len()` must equal [`Kernels::tile_rows`] (callers pad a short
    /// tile by repeating a row), `queries.len()` must lie in
    /// `1..=TILE_QUERIES`, and every slice must have the same length.
    pub(crate) fn tile(self, sq: bool, rows: &[&[f32]], queries: &[&[f32]], out: &mut TileOut) {
        let d = queries[0].len();
        assert!(
            (1..=TILE_QUERIES).contains(&queries.len())
                && rows.len() <= MAX_TILE_ROWS
                && rows.iter().chain(queries).all(|v| v.len() == d),
            "tile: bad shape"
        );
        match self.path {
            Path::Scalar => {
                for (o, row) in out.iter_mut().zip(rows) {
                    for (v, q) in o.iter_mut().zip(queries) {
                        *v = self.pair(sq, q, row);
                    }
                }
            }
            // SAFETY: the path is available (see `score_rows`) and the assert
            // above checks the shapes `avx2::tile` relies on.
            #[cfg(target_arch = "x86_64")]
            Path::Avx2 => unsafe { avx2::tile(sq, rows, queries, out) },
            // SAFETY: as above, for AVX-512F.
            #[cfg(target_arch = "x86_64")]
            Path::Avx512 => unsafe { avx512::tile(sq, rows, queries, out) },
            #[cfg(not(target_arch = "x86_64"))]
            Path::Avx2 | Path::Avx512 => unreachable!("x86 paths are never available here"),
        }
    }

    /// Bit `i` of the result is set where `values[i]` is not at most `cut`
    /// (`!(v <= cut)`, so a NaN is set too), for up to 64 values; the
    /// certified scan's test of a row against its block's bound.
    ///
    /// # Panics
    /// When `values` holds more than 64 values.
    #[inline]
    pub(crate) fn above(self, values: &[f32], cut: f32) -> u64 {
        assert!(
            values.len() <= 64,
            "above: {} values, at most 64",
            values.len()
        );
        match self.path {
            Path::Scalar => above_scalar(values, cut),
            // SAFETY: the path is available (see `score_rows`); the assert
            // above bounds the length `avx2::above` reads.
            #[cfg(target_arch = "x86_64")]
            Path::Avx2 => unsafe { avx2::above(values, cut) },
            // SAFETY: as above, for AVX-512F.
            #[cfg(target_arch = "x86_64")]
            Path::Avx512 => unsafe { avx512::above(values, cut) },
            #[cfg(not(target_arch = "x86_64"))]
            Path::Avx2 | Path::Avx512 => unreachable!("x86 paths are never available here"),
        }
    }

    /// One canonical dot (or squared distance when `sq`) of equal-length slices.
    #[inline]
    fn pair(self, sq: bool, q: &[f32], r: &[f32]) -> f32 {
        debug_assert_eq!(q.len(), r.len());
        match (self.path, sq) {
            (Path::Scalar, false) => topk_core::canon_dot(q, r),
            (Path::Scalar, true) => topk_core::canon_sqdist(q, r),
            // SAFETY: the path is available (see `score_rows`) and both public
            // callers assert equal lengths.
            #[cfg(target_arch = "x86_64")]
            (Path::Avx2, _) => unsafe { avx2::pair(sq, q, r) },
            // SAFETY: as above, for AVX-512F.
            #[cfg(target_arch = "x86_64")]
            (Path::Avx512, _) => unsafe { avx512::pair(sq, q, r) },
            #[cfg(not(target_arch = "x86_64"))]
            (Path::Avx2 | Path::Avx512, _) => unreachable!("x86 paths are never available here"),
        }
    }
}

/// Turns a raw canonical value into the score of `metric` (the same rule as
/// [`Kernels::score_row`]).
#[inline]
pub(crate) fn finish(metric: Metric, raw: f32, query_norm: f32, row_norm: f32) -> f32 {
    match metric {
        Metric::Dot => raw,
        Metric::Cosine => cosine_from_parts(raw, query_norm, row_norm),
        Metric::L2 => -raw,
    }
}

/// The padding of a query's last, partial chunk.
pub(crate) const QUERY_PAD: f32 = 0.0;
/// The padding of a row's last, partial chunk: `-0.0`, so that a padded step
/// `fma(+0, -0, p)` leaves every partial sum `p` as it is (module docs).
pub(crate) const ROW_PAD: f32 = -0.0;

/// Copies the last, partial canonical chunk of `x` into a buffer padded with
/// `pad` ([`QUERY_PAD`] for a query, [`ROW_PAD`] for a row).
#[inline]
pub(crate) fn padded_tail(x: &[f32], pad: f32) -> [f32; LANES] {
    let full = x.len() / LANES * LANES;
    let mut t = [pad; LANES];
    t[..x.len() - full].copy_from_slice(&x[full..]);
    t
}

/// [`Kernels::dot`] on the fastest path.
#[inline]
pub fn canon_dot(a: &[f32], b: &[f32]) -> f32 {
    Kernels::best().dot(a, b)
}

/// [`Kernels::sqdist`] on the fastest path.
#[inline]
pub fn canon_sqdist(q: &[f32], r: &[f32]) -> f32 {
    Kernels::best().sqdist(q, r)
}

/// [`Kernels::norm`] on the fastest path.
#[inline]
pub fn canon_norm(x: &[f32]) -> f32 {
    Kernels::best().norm(x)
}

/// [`Kernels::score_row`] on the fastest path.
#[inline]
pub fn score_row(
    metric: Metric,
    query: &[f32],
    query_norm: f32,
    row: &[f32],
    row_norm: f32,
) -> f32 {
    Kernels::best().score_row(metric, query, query_norm, row, row_norm)
}

/// [`Kernels::above`] one value at a time; also the vector paths' tail.
#[inline]
pub(crate) fn above_scalar(values: &[f32], cut: f32) -> u64 {
    values
        .iter()
        .enumerate()
        .fold(0, |m, (i, &v)| m | (u64::from(v.is_nan() || v > cut) << i))
}

#[cfg(test)]
mod tests;

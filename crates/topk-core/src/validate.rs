//! The input rules (docs/CONTRACTS.md §4), checked once at the boundary of
//! every backend so that the hot paths can assume well-formed data.
//!
//! Besides shapes and finiteness, the overflow rule: every corpus row and
//! every query has a squared norm of at most [`MAX_SQUARED_NORM`] = 2^100 and
//! at most [`MAX_DIM`] values. Under that rule no score of any metric (dot,
//! cosine, l2), computed in the canonical order, can be NaN or infinite,
//! except the documented `-inf` of cosine against a vector whose computed
//! norm is zero. docs/CONTRACTS.md §4.1 holds the derivation.

use ndarray::ArrayView2;

use crate::error::{Error, Located, Result};

/// Largest corpus a retriever accepts: row indices are `u32`, and
/// `u32::MAX` is kept free as a sentinel for padding.
pub const MAX_ROWS: usize = u32::MAX as usize;

/// Largest number of values per vector: the bound of the overflow rule's
/// derivation (a row of this length is 16 GiB).
pub const MAX_DIM: usize = u32::MAX as usize;

/// Largest squared Euclidean norm of a corpus row or a query, `2^100`
/// (a norm of `2^50`, about `1.13e15`). The sum is taken in `f64`, where
/// every square is exact; its rounding (relative `2^-21` at most) is far
/// inside the margin of the derivation in docs/CONTRACTS.md §4.1.
pub const MAX_SQUARED_NORM: f64 = (1u128 << 100) as f64;

/// Checks a row-major corpus buffer of `n = data.len() / dim` rows and returns `n`.
///
/// Rejects `dim = 0` or above [`MAX_DIM`], an empty buffer, a length that is
/// not a whole number of rows, more than [`MAX_ROWS`] rows, any NaN or
/// infinity (naming row and column), and any row whose squared norm exceeds
/// [`MAX_SQUARED_NORM`] (naming the row and its largest value).
pub fn corpus(data: &[f32], dim: usize) -> Result<usize> {
    let n = corpus_shape(data.len(), dim)?;
    corpus_values(data, dim)?;
    Ok(n)
}

/// The shape rules of [`corpus`] alone, for `len` row-major values of
/// `dim`-value rows: returns N. A caller that checks the values in parts as
/// it copies them (the GPU engine's staged upload) checks the shape first.
pub fn corpus_shape(len: usize, dim: usize) -> Result<usize> {
    self::dim(dim)?;
    if len == 0 {
        return Err(Error::EmptyCorpus);
    }
    if len % dim != 0 {
        return Err(Error::RaggedCorpus { len, dim });
    }
    let n = len / dim;
    if n > MAX_ROWS {
        return Err(Error::TooManyRows { n, max: MAX_ROWS });
    }
    Ok(n)
}

/// The value rules of [`corpus`] alone (finiteness, the overflow rule) for
/// whole `dim`-value rows; errors name rows counted from the start of `data`.
pub fn corpus_values(data: &[f32], dim: usize) -> Result<()> {
    self::dim(dim)?;
    bounded(data, dim, Located::Row)
}

/// The value rules of [`corpus`] for whole `dim`-value rows whose first row
/// is corpus row `first_row`, so that errors name the row in the whole corpus.
pub fn corpus_values_from(data: &[f32], dim: usize, first_row: usize) -> Result<()> {
    self::dim(dim)?;
    bounded(data, dim, |i| Located::Row(first_row + i))
}

/// Checks an `N × D` corpus view (any layout) by the rules of [`corpus`] and
/// returns `(n, d)`.
pub fn corpus_view(rows: ArrayView2<'_, f32>) -> Result<(usize, usize)> {
    let (n, d) = rows.dim();
    self::dim(d)?;
    if n == 0 {
        return Err(Error::EmptyCorpus);
    }
    if n > MAX_ROWS {
        return Err(Error::TooManyRows { n, max: MAX_ROWS });
    }
    bounded_view(rows, Located::Row)?;
    Ok((n, d))
}

/// Checks one query against the corpus dimension.
pub fn query(q: &[f32], dim: usize) -> Result<()> {
    query_at(q, dim, 0)
}

/// Checks query number `which` of a batch against the corpus dimension, its
/// values for finiteness and its squared norm against [`MAX_SQUARED_NORM`].
pub fn query_at(q: &[f32], dim: usize, which: usize) -> Result<()> {
    if q.len() != dim {
        return Err(Error::DimensionMismatch {
            what: format!("query {which}"),
            expected: dim,
            got: q.len(),
        });
    }
    bounded(q, dim, |_| Located::Query(which))
}

/// Checks a row-major buffer of queries of `dim` values each, query by
/// query as [`query_at`] does, and returns how many it holds.
pub fn queries_rowmajor(queries: &[f32], dim: usize) -> Result<usize> {
    self::dim(dim)?;
    if queries.len() % dim != 0 {
        return Err(Error::DimensionMismatch {
            what: format!("a batch buffer of {} values", queries.len()),
            expected: dim,
            got: queries.len() % dim,
        });
    }
    for (i, q) in queries.chunks_exact(dim).enumerate() {
        query_at(q, dim, i)?;
    }
    Ok(queries.len() / dim)
}

/// Checks a `Q × D` batch of queries (any layout).
pub fn queries(qs: ArrayView2<'_, f32>, dim: usize) -> Result<()> {
    if qs.ncols() != dim {
        return Err(Error::DimensionMismatch {
            what: format!("a batch of {} queries", qs.nrows()),
            expected: dim,
            got: qs.ncols(),
        });
    }
    bounded_view(qs, Located::Query)
}

/// Searches a `Q × D` batch of any layout with `search`, which takes its
/// values row-major and checks them itself (a GPU engine, on the device)
/// with the same rules: the host reads them only where the error order
/// needs it. A wrong width or K = 0 is checked here first (values before K,
/// as [`queries`] then [`k`] do), and a batch `search` refuses (`refused`)
/// gets [`queries`]' own error, the one every backend gives for this view
/// (a non-finite value before a large norm, the first query at fault).
pub fn queries_checked_by<T, E: From<Error>>(
    qs: ArrayView2<'_, f32>,
    dim: usize,
    k: usize,
    search: impl FnOnce(&[f32]) -> std::result::Result<T, E>,
    refused: impl Fn(&E) -> bool,
) -> std::result::Result<T, E> {
    if qs.ncols() != dim || k == 0 {
        queries(qs, dim)?;
    }
    let found = match qs.as_slice() {
        Some(flat) => search(flat),
        None => search(&qs.iter().copied().collect::<Vec<f32>>()),
    };
    match found {
        Err(e) if refused(&e) => Err(queries(qs, dim).err().map_or(e, E::from)),
        found => found,
    }
}

/// Checks K and returns the number of results a search yields: `min(k, n)`.
pub fn k(k: usize, n: usize) -> Result<usize> {
    if k == 0 {
        return Err(Error::ZeroK);
    }
    Ok(k.min(n))
}

/// Rejects a dimension of 0 or above [`MAX_DIM`]: the rule every corpus,
/// index and engine applies to D before anything is allocated.
pub fn dim(dim: usize) -> Result<()> {
    if dim == 0 {
        return Err(Error::ZeroDimension);
    }
    if dim > MAX_DIM {
        return Err(Error::DimensionTooLarge { dim, max: MAX_DIM });
    }
    Ok(())
}

/// The bits of an IEEE single whose exponent field is all ones (inf or NaN).
const EXP: u32 = 0x7f80_0000;

/// The largest `|v|` of `data` as the bits of a non-negative `f32`; at least
/// [`EXP`] when some value is NaN or infinite. On non-negative floats the
/// order of the bits is the order of the values, so an integer maximum finds
/// both the largest magnitude and any non-finite value. Blocks are folded
/// without an early exit so that the loop vectorises; finite data, the
/// common case, reads every value anyway.
fn max_abs_bits(data: &[f32]) -> u32 {
    data.chunks(256)
        .map(|block| {
            block
                .iter()
                .fold(0u32, |m, v| m.max(v.to_bits() & 0x7fff_ffff))
        })
        .fold(0, u32::max)
}

/// The largest biased exponent field `E` that lets any row of `dim` values
/// pass without a closer look. A value with exponent field `E` has
/// `|v| < 2^(E - 126)`, so `D` such values square-sum below
/// `D · 2^(2E - 252)`, which is at most `2^100` when
/// `E ≤ 126 + (100 − ⌈log2 D⌉) / 2`. Infinities and NaN (`E = 255`) are
/// always above it.
fn quick_exponent(dim: usize) -> i32 {
    let log2_dim = usize::BITS - dim.max(1).saturating_sub(1).leading_zeros();
    126 + (100 - log2_dim as i32) / 2
}

/// Whether some value of `data` has an exponent field above `e`. The
/// exponent fields compare as signed integers (they are below 2^31), and the
/// blocks fold without an early exit, so the loop vectorises with the
/// instructions every x86-64 has; it is the whole cost of validating
/// ordinary data.
fn any_exponent_above(data: &[f32], e: i32) -> bool {
    let limit = e << 23;
    data.chunks(256).any(|block| {
        block.iter().fold(0u32, |above, v| {
            above | u32::from(((v.to_bits() & EXP) as i32) > limit)
        }) != 0
    })
}

/// Whether `dim` values of magnitude at most `largest` are sure to keep the
/// squared norm within [`MAX_SQUARED_NORM`]: `D · max² ≤ 2^100`.
fn within_bound(largest: f32, dim: usize) -> bool {
    let m = f64::from(largest);
    m * m * dim as f64 <= MAX_SQUARED_NORM
}

/// The input rule for a contiguous buffer of rows of `dim` values: every value
/// finite, then every row's squared norm within [`MAX_SQUARED_NORM`].
///
/// One pass over the data decides the common case (the largest magnitude is
/// small enough for any row); only when it is not are the rows summed.
fn bounded(data: &[f32], dim: usize, at: impl Fn(usize) -> Located) -> Result<()> {
    if !any_exponent_above(data, quick_exponent(dim)) {
        return Ok(());
    }
    let bits = max_abs_bits(data);
    if bits >= EXP {
        let pos = data.iter().position(|v| !v.is_finite()).unwrap_or(0);
        return Err(Error::NonFinite {
            at: at(pos / dim),
            column: pos % dim,
            value: data[pos],
        });
    }
    if within_bound(f32::from_bits(bits), dim) {
        return Ok(());
    }
    for (i, row) in data.chunks_exact(dim).enumerate() {
        norm_rule(row, || at(i))?;
    }
    Ok(())
}

/// The overflow rule for one finite row: its squared norm, summed in `f64`
/// (every square exact), must not exceed [`MAX_SQUARED_NORM`].
fn norm_rule(row: &[f32], at: impl FnOnce() -> Located) -> Result<()> {
    if within_bound(f32::from_bits(max_abs_bits(row)), row.len()) {
        return Ok(());
    }
    let squared_norm: f64 = row.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
    if squared_norm <= MAX_SQUARED_NORM {
        return Ok(());
    }
    let (column, largest) = row
        .iter()
        .copied()
        .enumerate()
        .fold((0, 0.0_f32), |best, (j, v)| {
            if v.abs() > best.1.abs() {
                (j, v)
            } else {
                best
            }
        });
    Err(Error::NormTooLarge {
        at: at(),
        squared_norm,
        largest,
        column,
        max: MAX_SQUARED_NORM,
    })
}

/// [`bounded`] for a view of any layout, row by row (logical rows and columns).
fn bounded_view(view: ArrayView2<'_, f32>, at: impl Fn(usize) -> Located) -> Result<()> {
    let dim = view.ncols();
    if dim == 0 {
        return Ok(());
    }
    if let Some(data) = view.as_slice() {
        return bounded(data, dim, at);
    }
    // A strided row is gathered into one reused buffer of D values.
    let mut buf = Vec::new();
    for (i, row) in view.outer_iter().enumerate() {
        match row.as_slice() {
            Some(values) => bounded(values, dim, |_| at(i))?,
            None => {
                buf.clear();
                buf.extend(row.iter().copied());
                bounded(&buf, dim, |_| at(i))?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::Array2;

    fn message(e: &Error) -> String {
        e.to_string()
    }

    #[test]
    fn zero_dimension() {
        let e = corpus(&[1.0], 0).unwrap_err();
        assert!(matches!(e, Error::ZeroDimension));
        assert!(message(&e).contains("D = 0"));
    }

    #[test]
    fn empty_corpus() {
        let e = corpus(&[], 4).unwrap_err();
        assert!(matches!(e, Error::EmptyCorpus));
        assert!(message(&e).contains("N = 0"));
        let e = corpus_view(Array2::<f32>::zeros((0, 3)).view()).unwrap_err();
        assert!(matches!(e, Error::EmptyCorpus));
    }

    #[test]
    fn ragged_corpus_names_length_and_dim() {
        let e = corpus(&[1.0; 7], 3).unwrap_err();
        assert!(matches!(e, Error::RaggedCorpus { len: 7, dim: 3 }));
        assert!(message(&e).contains('7') && message(&e).contains("D = 3"));
    }

    #[test]
    fn non_finite_corpus_value_names_row_and_column() {
        let mut data = vec![0.5_f32; 12];
        data[7] = f32::NAN;
        let e = corpus(&data, 3).unwrap_err();
        assert!(matches!(
            e,
            Error::NonFinite {
                at: Located::Row(2),
                column: 1,
                ..
            }
        ));
        let m = message(&e);
        assert!(
            m.contains("corpus row 2") && m.contains("column 1") && m.contains("NaN"),
            "{m}"
        );

        data[7] = 1.0;
        data[11] = f32::NEG_INFINITY;
        let m = message(&corpus(&data, 3).unwrap_err());
        assert!(
            m.contains("row 3") && m.contains("column 2") && m.contains("-inf"),
            "{m}"
        );
    }

    #[test]
    fn non_finite_view_names_row_and_column() {
        let mut a = Array2::<f32>::ones((4, 5));
        a[[3, 4]] = f32::INFINITY;
        let e = corpus_view(a.view()).unwrap_err();
        assert!(matches!(
            e,
            Error::NonFinite {
                at: Located::Row(3),
                column: 4,
                ..
            }
        ));
        // A transposed (column-major) view is checked by logical position.
        let t = a.t();
        let e = corpus_view(t).unwrap_err();
        assert!(matches!(
            e,
            Error::NonFinite {
                at: Located::Row(4),
                column: 3,
                ..
            }
        ));
    }

    #[test]
    fn query_dimension_mismatch_names_both_sizes() {
        let e = query(&[1.0; 5], 4).unwrap_err();
        assert!(matches!(
            e,
            Error::DimensionMismatch {
                expected: 4,
                got: 5,
                ..
            }
        ));
        let m = message(&e);
        assert!(m.contains("5 values") && m.contains("D = 4"), "{m}");
    }

    #[test]
    fn non_finite_query_names_query_and_column() {
        let e = query_at(&[1.0, f32::INFINITY], 2, 6).unwrap_err();
        assert!(matches!(
            e,
            Error::NonFinite {
                at: Located::Query(6),
                column: 1,
                ..
            }
        ));
        assert!(message(&e).contains("query 6"));
        let mut qs = Array2::<f32>::zeros((3, 2));
        qs[[2, 0]] = f32::NAN;
        let e = queries(qs.view(), 2).unwrap_err();
        assert!(matches!(
            e,
            Error::NonFinite {
                at: Located::Query(2),
                column: 0,
                ..
            }
        ));
        let e = queries(qs.view(), 3).unwrap_err();
        assert!(matches!(
            e,
            Error::DimensionMismatch {
                expected: 3,
                got: 2,
                ..
            }
        ));
    }

    #[test]
    fn norm_above_the_limit_names_row_and_largest_value() {
        // The rows of values near 3e38 that made dot scores inf and NaN.
        let mut data = vec![1.0_f32; 12];
        data[7] = -3e38;
        let e = corpus(&data, 4).unwrap_err();
        assert!(
            matches!(
                e,
                Error::NormTooLarge {
                    at: Located::Row(1),
                    column: 3,
                    largest,
                    ..
                } if largest == -3e38
            ),
            "{e:?}"
        );
        let m = message(&e);
        assert!(
            m.contains("corpus row 1") && m.contains("-3e38") && m.contains("2^100"),
            "{m}"
        );
        let e = corpus_view(Array2::from_shape_vec((3, 4), data).unwrap().t()).unwrap_err();
        assert!(matches!(
            e,
            Error::NormTooLarge {
                at: Located::Row(3),
                column: 1,
                ..
            }
        ));
    }

    #[test]
    fn norm_exactly_at_the_limit_passes_and_one_ulp_more_fails() {
        let top = 2.0_f32.powi(50);
        assert_eq!(f64::from(top) * f64::from(top), MAX_SQUARED_NORM);
        corpus(&[top, 0.0], 2).unwrap();
        query(&[0.0, -top], 2).unwrap();
        let over = f32::from_bits(top.to_bits() + 1);
        let e = corpus(&[0.0, over], 2).unwrap_err();
        assert!(matches!(
            e,
            Error::NormTooLarge {
                at: Located::Row(0),
                column: 1,
                ..
            }
        ));
        // Four values of 2^49 square-sum to the limit too; a fifth tips it.
        let half = 2.0_f32.powi(49);
        corpus(&[half; 4], 4).unwrap();
        assert!(corpus(&[half; 5], 5).is_err());
    }

    #[test]
    fn norm_above_the_limit_in_a_query_names_the_query() {
        let e = query_at(&[1e20, 1.0], 2, 5).unwrap_err();
        assert!(matches!(
            e,
            Error::NormTooLarge {
                at: Located::Query(5),
                column: 0,
                ..
            }
        ));
        assert!(message(&e).contains("query 5"), "{}", message(&e));
        let mut qs = Array2::<f32>::zeros((3, 2));
        qs[[2, 1]] = 2e15;
        let e = queries(qs.view(), 2).unwrap_err();
        assert!(matches!(
            e,
            Error::NormTooLarge {
                at: Located::Query(2),
                column: 1,
                ..
            }
        ));
    }

    #[test]
    fn non_finite_is_reported_before_a_large_norm() {
        let e = corpus(&[3e38, 1.0, 1.0, f32::NAN], 2).unwrap_err();
        assert!(matches!(
            e,
            Error::NonFinite {
                at: Located::Row(1),
                column: 1,
                ..
            }
        ));
    }

    #[test]
    fn the_quick_exponent_admits_only_rows_inside_the_limit() {
        for dim in [1usize, 2, 3, 384, 1024, 1 << 20, MAX_DIM] {
            let e = quick_exponent(dim);
            // The largest value with that exponent field, D times, stays
            // inside the limit; the check cannot pass a row the rule rejects.
            let top = f64::from(f32::from_bits(((e as u32) << 23) | 0x007f_ffff));
            assert!(top * top * dim as f64 <= MAX_SQUARED_NORM, "dim {dim}");
            assert!(!any_exponent_above(&[top as f32, -(top as f32)], e));
            let above = f32::from_bits((e as u32 + 1) << 23);
            assert!(any_exponent_above(&[0.0, above], e));
            assert!(any_exponent_above(&[f32::NAN], e));
            assert!(any_exponent_above(&[f32::NEG_INFINITY], e));
        }
    }

    #[test]
    fn rowmajor_queries_name_the_buffer_or_the_query() {
        assert_eq!(queries_rowmajor(&[1.0, 2.0, 3.0, 4.0], 2).unwrap(), 2);
        assert_eq!(queries_rowmajor(&[], 2).unwrap(), 0);
        let e = queries_rowmajor(&[1.0, 2.0, 3.0], 2).unwrap_err();
        assert!(message(&e).contains("a batch buffer of 3 values"), "{e}");
        let e = queries_rowmajor(&[1.0, 2.0, f32::NAN, 4.0], 2).unwrap_err();
        assert!(
            matches!(
                e,
                Error::NonFinite {
                    at: Located::Query(1),
                    column: 0,
                    ..
                }
            ),
            "{e:?}"
        );
    }

    #[test]
    fn dimension_above_the_limit_is_rejected() {
        let e = corpus(&[], MAX_DIM + 1).unwrap_err();
        assert!(matches!(e, Error::DimensionTooLarge { dim, .. } if dim == MAX_DIM + 1));
        assert!(message(&e).contains(&(MAX_DIM + 1).to_string()));
        let e = corpus_view(Array2::<f32>::zeros((0, MAX_DIM + 1)).view()).unwrap_err();
        assert!(matches!(e, Error::DimensionTooLarge { .. }));
    }

    #[test]
    fn k_zero_is_rejected_and_large_k_clamps() {
        let e = k(0, 10).unwrap_err();
        assert!(matches!(e, Error::ZeroK));
        assert!(message(&e).contains("K = 0"));
        assert_eq!(k(15, 10).unwrap(), 10);
        assert_eq!(k(3, 10).unwrap(), 3);
    }

    /// A backend that checks values itself is handed the row-major values
    /// only when no earlier error is due, and a batch it refuses gets the
    /// host check's error for the view.
    #[test]
    fn queries_checked_by_keeps_the_host_errors_and_their_order() {
        use std::cell::Cell;
        let calls = Cell::new(0);
        // Two columns of a 3 × 4 buffer: a strided view.
        let mut data = [1.0_f32; 12];
        data[2 * 4] = 1e30; // row 2: a norm over the bound
        let view =
            ArrayView2::from_shape(ndarray::ShapeBuilder::strides((3, 2), (4, 1)), &data[..10])
                .unwrap();
        let search = |flat: &[f32]| -> std::result::Result<usize, Error> {
            calls.set(calls.get() + 1);
            assert_eq!(flat.len(), 6, "row-major values of the view");
            Err(Error::ZeroK)
        };
        let e = queries_checked_by(view, 2, 5, search, |_| true).unwrap_err();
        assert!(
            matches!(
                e,
                Error::NormTooLarge {
                    at: Located::Query(2),
                    ..
                }
            ),
            "{e}"
        );
        assert_eq!(calls.get(), 1);
        // A refusal the host check does not confirm stays the backend's.
        let fine = ArrayView2::from_shape((3, 4), &[0.5_f32; 12]).unwrap();
        let e = queries_checked_by(fine, 4, 5, search_ok_len(12, &calls), |_| true).unwrap_err();
        assert!(matches!(e, Error::ZeroK), "{e}");
        // A wrong width, or bad values with K = 0, never reach the backend.
        let before = calls.get();
        let e = queries_checked_by(fine, 3, 5, search_ok_len(12, &calls), |_| true).unwrap_err();
        assert!(matches!(e, Error::DimensionMismatch { .. }), "{e}");
        let e = queries_checked_by(view, 2, 0, search_ok_len(6, &calls), |_| true).unwrap_err();
        assert!(matches!(e, Error::NormTooLarge { .. }), "{e}");
        assert_eq!(calls.get(), before);
        let got = queries_checked_by(fine, 4, 5, |f| Ok::<_, Error>(f.len()), |_| true);
        assert_eq!(got.unwrap(), 12);
    }

    /// A stand-in backend that counts its calls, checks the length it is
    /// handed and refuses.
    fn search_ok_len(
        len: usize,
        calls: &std::cell::Cell<usize>,
    ) -> impl FnOnce(&[f32]) -> std::result::Result<usize, Error> + '_ {
        move |flat| {
            calls.set(calls.get() + 1);
            assert_eq!(flat.len(), len);
            Err(Error::ZeroK)
        }
    }
}

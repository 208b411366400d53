//! The input rules (DESIGN.md §4), checked once at the boundary of every
//! backend so that the hot paths can assume well-formed data.

use ndarray::ArrayView2;

use crate::error::{Error, Located, Result};

/// Largest corpus a retriever accepts: row indices are `u32`, and
/// `u32::MAX` is kept free as a sentinel for padding.
pub const MAX_ROWS: usize = u32::MAX as usize;

/// Checks a row-major corpus buffer of `n = data.len() / dim` rows and returns `n`.
///
/// Rejects `dim = 0`, an empty buffer, a length that is not a whole number of
/// rows, more than [`MAX_ROWS`] rows, and any NaN or infinity (naming row and column).
pub fn corpus(data: &[f32], dim: usize) -> Result<usize> {
    if dim == 0 {
        return Err(Error::ZeroDimension);
    }
    if data.is_empty() {
        return Err(Error::EmptyCorpus);
    }
    if data.len() % dim != 0 {
        return Err(Error::RaggedCorpus {
            len: data.len(),
            dim,
        });
    }
    let n = data.len() / dim;
    if n > MAX_ROWS {
        return Err(Error::TooManyRows { n, max: MAX_ROWS });
    }
    finite(data, dim, Located::Row)?;
    Ok(n)
}

/// Checks an `N × D` corpus view (any layout) and returns `(n, d)`.
pub fn corpus_view(rows: ArrayView2<'_, f32>) -> Result<(usize, usize)> {
    let (n, d) = rows.dim();
    if d == 0 {
        return Err(Error::ZeroDimension);
    }
    if n == 0 {
        return Err(Error::EmptyCorpus);
    }
    if n > MAX_ROWS {
        return Err(Error::TooManyRows { n, max: MAX_ROWS });
    }
    finite_view(rows, Located::Row)?;
    Ok((n, d))
}

/// Checks one query against the corpus dimension.
pub fn query(q: &[f32], dim: usize) -> Result<()> {
    query_at(q, dim, 0)
}

/// Checks query number `which` of a batch against the corpus dimension.
pub fn query_at(q: &[f32], dim: usize, which: usize) -> Result<()> {
    if q.len() != dim {
        return Err(Error::DimensionMismatch {
            what: format!("query {which}"),
            expected: dim,
            got: q.len(),
        });
    }
    finite(q, dim, |_| Located::Query(which))
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
    finite_view(qs, Located::Query)
}

/// Checks K and returns the number of results a search yields: `min(k, n)`.
pub fn k(k: usize, n: usize) -> Result<usize> {
    if k == 0 {
        return Err(Error::ZeroK);
    }
    Ok(k.min(n))
}

/// The first non-finite value of a view of any layout, by logical row and column.
fn finite_view(view: ArrayView2<'_, f32>, at: impl Fn(usize) -> Located) -> Result<()> {
    for (i, row) in view.outer_iter().enumerate() {
        if row.as_slice().is_some_and(all_finite) {
            continue;
        }
        if let Some((column, &value)) = row.iter().enumerate().find(|(_, v)| !v.is_finite()) {
            return Err(Error::NonFinite {
                at: at(i),
                column,
                value,
            });
        }
    }
    Ok(())
}

/// Whether every value is finite. Blocks of values are folded without an
/// early exit, so the loop vectorises (an `all` that stops at the first
/// failure does not); finite data, the common case, reads every value anyway.
fn all_finite(data: &[f32]) -> bool {
    const EXP: u32 = 0x7f80_0000;
    data.chunks(256).all(|block| {
        block
            .iter()
            .fold(0u32, |bad, v| bad | u32::from(v.to_bits() & EXP == EXP))
            == 0
    })
}

fn finite(data: &[f32], dim: usize, at: impl Fn(usize) -> Located) -> Result<()> {
    if all_finite(data) {
        return Ok(());
    }
    let pos = data.iter().position(|v| !v.is_finite()).unwrap_or(0);
    Err(Error::NonFinite {
        at: at(pos / dim),
        column: pos % dim,
        value: data[pos],
    })
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
    fn k_zero_is_rejected_and_large_k_clamps() {
        let e = k(0, 10).unwrap_err();
        assert!(matches!(e, Error::ZeroK));
        assert!(message(&e).contains("K = 0"));
        assert_eq!(k(15, 10).unwrap(), 10);
        assert_eq!(k(3, 10).unwrap(), 3);
    }
}

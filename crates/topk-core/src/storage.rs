//! Half-width corpus storage (docs/CONTRACTS.md §14).
//!
//! A corpus may store its values as `f32`, `f16` (IEEE binary16) or `bf16`
//! (the upper half of a binary32). Values arrive as `f32` and are rounded
//! once, at ingest, to the nearest value of the storage type (ties to even).
//! Every search then widens each stored value to `f32`, which is exact for
//! both half types, and scores the widened row in the canonical order (§2).
//! So a half-width corpus is searched exactly: its results are the `f32`
//! results of the corpus of widened values, with the same bytes on every
//! backend. Queries stay `f32`.
//!
//! ```
//! use topk_core::{Dtype, RowStore};
//!
//! let rows = RowStore::from_f32(vec![1.0, 0.1, 3.0, 65504.0], 2, Dtype::F16)?;
//! assert_eq!(rows.dtype(), Dtype::F16);
//! assert_eq!(rows.row(0), vec![1.0, Dtype::F16.round(0.1)]);
//! assert_eq!(Dtype::F16.round(0.1), 0.099975586);
//! assert!(RowStore::from_f32(vec![1.0e5, 0.0], 2, Dtype::F16).is_err());
//! # Ok::<(), topk_core::Error>(())
//! ```

use std::borrow::Cow;
use std::fmt;
use std::ops::Range;
use std::str::FromStr;

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

use crate::error::{Error, Located, Result};
use crate::validate;

/// How a corpus stores its values.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Dtype {
    /// IEEE binary32, as given: 4 bytes per value.
    #[default]
    F32,
    /// IEEE binary16: 2 bytes per value, 11 significant bits, finite values
    /// up to 65504.
    F16,
    /// bfloat16, the upper 16 bits of a binary32: 2 bytes per value, 8
    /// significant bits, the range of `f32`.
    Bf16,
}

impl Dtype {
    /// Every storage type.
    pub const ALL: [Dtype; 3] = [Dtype::F32, Dtype::F16, Dtype::Bf16];

    /// Lowercase name: "f32", "f16", "bf16".
    pub fn as_str(self) -> &'static str {
        match self {
            Dtype::F32 => "f32",
            Dtype::F16 => "f16",
            Dtype::Bf16 => "bf16",
        }
    }

    /// Bytes per stored value.
    pub fn bytes(self) -> usize {
        match self {
            Dtype::F32 => 4,
            Dtype::F16 | Dtype::Bf16 => 2,
        }
    }

    /// The code of this type in file headers: 0, 1, 2.
    pub fn code(self) -> u8 {
        match self {
            Dtype::F32 => 0,
            Dtype::F16 => 1,
            Dtype::Bf16 => 2,
        }
    }

    /// The type of a file-header code, if it is one.
    pub fn from_code(code: u8) -> Option<Dtype> {
        Dtype::ALL.into_iter().find(|d| d.code() == code)
    }

    /// The largest finite stored value.
    pub fn max(self) -> f32 {
        match self {
            Dtype::F32 => f32::MAX,
            Dtype::F16 => f16::MAX.to_f32(),
            Dtype::Bf16 => bf16::MAX.to_f32(),
        }
    }

    /// The `f32` that `x` is searched as once stored: `x` rounded to this
    /// type (nearest, ties to even) and widened back, which is exact.
    pub fn round(self, x: f32) -> f32 {
        match self {
            Dtype::F32 => x,
            Dtype::F16 => f16::from_f32(x).to_f32(),
            Dtype::Bf16 => bf16::from_f32(x).to_f32(),
        }
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Dtype {
    type Err = Error;

    /// Parses "f32" (also "float32", "fp32"), "f16" ("float16", "fp16",
    /// "half") or "bf16" ("bfloat16"), case-insensitive.
    fn from_str(s: &str) -> Result<Dtype> {
        match s.to_ascii_lowercase().as_str() {
            "f32" | "float32" | "fp32" => Ok(Dtype::F32),
            "f16" | "float16" | "fp16" | "half" => Ok(Dtype::F16),
            "bf16" | "bfloat16" => Ok(Dtype::Bf16),
            _ => Err(Error::InvalidParameter {
                name: "dtype",
                value: s.to_owned(),
                reason: "expected f32, f16 or bf16".to_owned(),
            }),
        }
    }
}

/// The stored values, by type.
#[derive(Debug, Clone, PartialEq)]
enum Values {
    F32(Vec<f32>),
    F16(Vec<f16>),
    Bf16(Vec<bf16>),
}

/// Values converted per step of an ingest: the widened copy that the input
/// rules check stays small.
const CHUNK_VALUES: usize = 1 << 14;

/// The rows of a corpus, row-major, stored at one [`Dtype`].
///
/// Every way in checks what it stores: the values must be finite and fit the
/// type, and the widened rows must keep the overflow rule (§4.1), so a
/// backend may score stored rows without further checks.
///
/// The row accessors (`row`, `rows_f32`, `widen_into`, `copy_row`,
/// `row_le_bytes`, `set_row_checked`) panic on a row past the end, as slice
/// indexing does; `set_row` returns an error instead.
#[derive(Debug, Clone, PartialEq)]
pub struct RowStore {
    dim: usize,
    values: Values,
}

impl RowStore {
    /// An empty store of `dim`-value rows. `dim` must be at least 1.
    pub fn empty(dim: usize, dtype: Dtype) -> Result<RowStore> {
        validate::dim(dim)?;
        let values = match dtype {
            Dtype::F32 => Values::F32(Vec::new()),
            Dtype::F16 => Values::F16(Vec::new()),
            Dtype::Bf16 => Values::Bf16(Vec::new()),
        };
        Ok(RowStore { dim, values })
    }

    /// A validated corpus of `data.len() / dim` rows (§4), stored as `dtype`.
    /// An `f32` buffer is kept without a copy.
    pub fn from_f32(data: Vec<f32>, dim: usize, dtype: Dtype) -> Result<RowStore> {
        if dtype == Dtype::F32 {
            validate::corpus(&data, dim)?;
            return Ok(RowStore {
                dim,
                values: Values::F32(data),
            });
        }
        validate::corpus_shape(data.len(), dim)?;
        let mut store = RowStore::empty(dim, dtype)?;
        store.reserve(data.len() / dim);
        store.push_rows(&data)?;
        Ok(store)
    }

    /// The storage type.
    pub fn dtype(&self) -> Dtype {
        match self.values {
            Values::F32(_) => Dtype::F32,
            Values::F16(_) => Dtype::F16,
            Values::Bf16(_) => Dtype::Bf16,
        }
    }

    /// Values per row.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Stored values (rows × dim).
    pub fn values(&self) -> usize {
        match &self.values {
            Values::F32(v) => v.len(),
            Values::F16(v) => v.len(),
            Values::Bf16(v) => v.len(),
        }
    }

    /// Stored rows.
    pub fn len(&self) -> usize {
        self.values() / self.dim
    }

    /// Whether no row is stored.
    pub fn is_empty(&self) -> bool {
        self.values() == 0
    }

    /// Bytes the stored values take.
    pub fn bytes(&self) -> usize {
        self.values() * self.dtype().bytes()
    }

    /// The stored values when the type is `f32`.
    pub fn as_f32(&self) -> Option<&[f32]> {
        match &self.values {
            Values::F32(v) => Some(v),
            _ => None,
        }
    }

    /// The raw bits of the stored values when the type is 16 bits wide.
    pub fn as_bits16(&self) -> Option<&[u16]> {
        match &self.values {
            Values::F32(_) => None,
            Values::F16(v) => Some(v.reinterpret_cast()),
            Values::Bf16(v) => Some(v.reinterpret_cast()),
        }
    }

    /// Reserves room for `rows` more rows.
    pub fn reserve(&mut self, rows: usize) {
        let n = rows.saturating_mul(self.dim);
        match &mut self.values {
            Values::F32(v) => v.reserve(n),
            Values::F16(v) => v.reserve(n),
            Values::Bf16(v) => v.reserve(n),
        }
    }

    /// Widens rows `range` into `out` (cleared first).
    pub fn widen_into(&self, range: Range<usize>, out: &mut Vec<f32>) {
        let vals = range.start * self.dim..range.end * self.dim;
        out.clear();
        match &self.values {
            Values::F32(v) => out.extend_from_slice(&v[vals]),
            Values::F16(v) => {
                out.resize(vals.len(), 0.0);
                v[vals].convert_to_f32_slice(out);
            }
            Values::Bf16(v) => {
                out.extend(
                    v[vals]
                        .iter()
                        .map(|b| f32::from_bits(u32::from(b.to_bits()) << 16)),
                );
            }
        }
    }

    /// Rows `range` as `f32`: the stored values themselves for `f32`,
    /// otherwise widened into `scratch`.
    pub fn rows_f32<'a>(&'a self, range: Range<usize>, scratch: &'a mut Vec<f32>) -> &'a [f32] {
        match &self.values {
            Values::F32(v) => &v[range.start * self.dim..range.end * self.dim],
            _ => {
                self.widen_into(range, scratch);
                scratch
            }
        }
    }

    /// Row `r` as `f32` (borrowed for `f32` storage).
    pub fn row(&self, r: usize) -> Cow<'_, [f32]> {
        match &self.values {
            Values::F32(v) => Cow::Borrowed(&v[r * self.dim..(r + 1) * self.dim]),
            _ => {
                let mut out = Vec::with_capacity(self.dim);
                self.widen_into(r..r + 1, &mut out);
                Cow::Owned(out)
            }
        }
    }

    /// Every row widened to `f32`.
    pub fn to_f32(&self) -> Vec<f32> {
        let mut out = Vec::new();
        self.widen_into(0..self.len(), &mut out);
        out
    }

    /// Appends whole rows given as `f32`, all or nothing: on error nothing is
    /// stored. Checks the input rules on the values as stored (they must be
    /// finite, fit the type, and keep the overflow rule once widened);
    /// errors name rows counting from the first appended row's index in
    /// the store.
    pub fn push_rows(&mut self, rows: &[f32]) -> Result<()> {
        if rows.len() % self.dim != 0 {
            return Err(Error::RaggedCorpus {
                len: rows.len(),
                dim: self.dim,
            });
        }
        let first = self.len();
        let (dim, before) = (self.dim, self.values());
        let result = match &mut self.values {
            Values::F32(v) => {
                validate::corpus_values_from(rows, dim, first).map(|()| v.extend_from_slice(rows))
            }
            Values::F16(v) => push_narrowed(v, rows, dim, first, Dtype::F16, f16::from_f32, |h| {
                h.to_f32()
            }),
            Values::Bf16(v) => {
                push_narrowed(v, rows, dim, first, Dtype::Bf16, bf16::from_f32, |b| {
                    b.to_f32()
                })
            }
        };
        if result.is_err() {
            self.truncate(before / dim);
        }
        result
    }

    /// Overwrites row `r` (an existing row) with `row`, checked as
    /// [`RowStore::push_rows`] checks; on error the row is unchanged.
    pub fn set_row(&mut self, r: usize, row: &[f32]) -> Result<()> {
        if row.len() != self.dim {
            return Err(Error::DimensionMismatch {
                what: format!("row {r}"),
                expected: self.dim,
                got: row.len(),
            });
        }
        if r >= self.len() {
            return Err(Error::InvalidParameter {
                name: "row",
                value: r.to_string(),
                reason: format!("the store holds {} rows", self.len()),
            });
        }
        let mut one = RowStore::empty(self.dim, self.dtype())?;
        one.push_rows(row).map_err(|e| e.at_row(r))?;
        self.set_row_checked(r, &one.to_f32());
        Ok(())
    }

    /// Appends rows that already hold values of this type, widened: values
    /// a [`RowStore::push_rows`] of this type accepted and widened back (or,
    /// for `f32`, values that passed the input rules). Narrowing them again
    /// is exact, so nothing is checked and nothing can fail.
    pub fn push_checked(&mut self, rows: &[f32]) {
        debug_assert_eq!(rows.len() % self.dim, 0);
        match &mut self.values {
            Values::F32(v) => v.extend_from_slice(rows),
            Values::F16(v) => {
                let start = v.len();
                v.resize(start + rows.len(), f16::ZERO);
                v[start..].convert_from_f32_slice(rows);
            }
            Values::Bf16(v) => v.extend(rows.iter().map(|&x| bf16::from_f32(x))),
        }
    }

    /// Overwrites row `r` with a row of this type's values, widened (see
    /// [`RowStore::push_checked`]).
    pub fn set_row_checked(&mut self, r: usize, row: &[f32]) {
        debug_assert_eq!(row.len(), self.dim);
        let vals = r * self.dim..(r + 1) * self.dim;
        match &mut self.values {
            Values::F32(v) => v[vals].copy_from_slice(row),
            Values::F16(v) => v[vals].convert_from_f32_slice(row),
            Values::Bf16(v) => v[vals]
                .iter_mut()
                .zip(row)
                .for_each(|(o, &x)| *o = bf16::from_f32(x)),
        }
    }

    /// Copies stored row `from` over row `to` (no conversion).
    pub fn copy_row(&mut self, from: usize, to: usize) {
        let d = self.dim;
        let src = from * d..(from + 1) * d;
        match &mut self.values {
            Values::F32(v) => v.copy_within(src, to * d),
            Values::F16(v) => v.copy_within(src, to * d),
            Values::Bf16(v) => v.copy_within(src, to * d),
        }
    }

    /// Keeps the first `rows` rows.
    pub fn truncate(&mut self, rows: usize) {
        let n = rows * self.dim;
        match &mut self.values {
            Values::F32(v) => v.truncate(n),
            Values::F16(v) => v.truncate(n),
            Values::Bf16(v) => v.truncate(n),
        }
    }

    /// Appends row `r` of the store as little-endian bytes of its type.
    pub fn row_le_bytes(&self, r: usize, out: &mut Vec<u8>) {
        let vals = r * self.dim..(r + 1) * self.dim;
        match &self.values {
            Values::F32(v) => v[vals]
                .iter()
                .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
            Values::F16(v) => v[vals]
                .iter()
                .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
            Values::Bf16(v) => v[vals]
                .iter()
                .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        }
    }

    /// Appends values from little-endian bytes of the store's type (a whole
    /// number of values), without checks: the caller checks the rows with
    /// [`RowStore::check`] once they are complete.
    pub fn extend_le_bytes(&mut self, bytes: &[u8]) {
        match &mut self.values {
            Values::F32(v) => v.extend(
                bytes
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            ),
            Values::F16(v) => v.extend(
                bytes
                    .chunks_exact(2)
                    .map(|b| f16::from_le_bytes([b[0], b[1]])),
            ),
            Values::Bf16(v) => v.extend(
                bytes
                    .chunks_exact(2)
                    .map(|b| bf16::from_le_bytes([b[0], b[1]])),
            ),
        }
    }

    /// Checks every stored row by the input rules (§4) as widened: for
    /// stores filled by [`RowStore::extend_le_bytes`] (a file).
    pub fn check(&self) -> Result<()> {
        if self.values() % self.dim != 0 {
            return Err(Error::RaggedCorpus {
                len: self.values(),
                dim: self.dim,
            });
        }
        if let Values::F32(v) = &self.values {
            return validate::corpus_values(v, self.dim);
        }
        let rows_per_chunk = (CHUNK_VALUES / self.dim).max(1);
        let mut buf = Vec::new();
        let mut r = 0;
        while r < self.len() {
            let end = (r + rows_per_chunk).min(self.len());
            self.widen_into(r..end, &mut buf);
            validate::corpus_values_from(&buf, self.dim, r)?;
            r = end;
        }
        Ok(())
    }
}

/// Narrows `rows` chunk by chunk onto `out`, checking each chunk as stored.
/// On error `out` may hold a partial chunk; the caller truncates.
fn push_narrowed<T: Copy>(
    out: &mut Vec<T>,
    rows: &[f32],
    dim: usize,
    first_row: usize,
    dtype: Dtype,
    narrow: impl Fn(f32) -> T,
    widen: impl Fn(T) -> f32,
) -> Result<()> {
    let rows_per_chunk = (CHUNK_VALUES / dim).max(1);
    let mut wide = Vec::with_capacity(rows_per_chunk * dim);
    for (c, chunk) in rows.chunks(rows_per_chunk * dim).enumerate() {
        let row0 = first_row + c * rows_per_chunk;
        let start = out.len();
        out.extend(chunk.iter().map(|&x| narrow(x)));
        wide.clear();
        wide.extend(out[start..].iter().map(|&h| widen(h)));
        // A stored NaN or infinity came from a non-finite input (named as
        // given) or from a finite one the type cannot hold.
        if let Some(pos) = wide.iter().position(|w| !w.is_finite()) {
            let (at, column, value) = (Located::Row(row0 + pos / dim), pos % dim, chunk[pos]);
            return Err(if value.is_finite() {
                Error::NotRepresentable {
                    at,
                    column,
                    value,
                    dtype,
                    max: dtype.max(),
                }
            } else {
                Error::NonFinite { at, column, value }
            });
        }
        validate::corpus_values_from(&wide, dim, row0)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_codes_round_trip() {
        for d in Dtype::ALL {
            assert_eq!(d.as_str().parse::<Dtype>().unwrap(), d);
            assert_eq!(Dtype::from_code(d.code()), Some(d));
        }
        assert_eq!("BFloat16".parse::<Dtype>().unwrap(), Dtype::Bf16);
        assert_eq!("half".parse::<Dtype>().unwrap(), Dtype::F16);
        let e = "f64".parse::<Dtype>().unwrap_err().to_string();
        assert!(e.contains("f64") && e.contains("bf16"), "{e}");
        assert_eq!(Dtype::from_code(3), None);
    }

    #[test]
    fn rounding_is_nearest_even_and_widening_exact() {
        // 1 + 2^-11 lies halfway between two f16 values: ties to even (1.0).
        assert_eq!(Dtype::F16.round(1.0 + 2f32.powi(-11)), 1.0);
        assert_eq!(
            Dtype::F16.round(1.0 + 3.0 * 2f32.powi(-11)),
            1.0 + 2.0 * 2f32.powi(-10)
        );
        // bf16 keeps 8 significant bits: 1 + 2^-8 ties to 1, 1 + 3·2^-8 to 1 + 2^-6.
        assert_eq!(Dtype::Bf16.round(1.0 + 2f32.powi(-8)), 1.0);
        assert_eq!(
            Dtype::Bf16.round(1.0 + 3.0 * 2f32.powi(-8)),
            1.0 + 2f32.powi(-6)
        );
        // Subnormal halves widen exactly.
        let tiny = 2f32.powi(-24);
        assert_eq!(Dtype::F16.round(tiny), tiny);
        assert_eq!(Dtype::F16.round(-0.0).to_bits(), (-0.0f32).to_bits());
        for d in Dtype::ALL {
            for x in [0.1_f32, -3.75, 1e-3, 1234.5, 6e4] {
                let r = d.round(x);
                assert_eq!(d.round(r), r, "{d} rounding is idempotent at {x}");
            }
        }
    }

    #[test]
    fn stores_widen_to_rounded_values() {
        let data: Vec<f32> = (0..64).map(|i| (i as f32 - 31.5) * 0.37).collect();
        for d in Dtype::ALL {
            let s = RowStore::from_f32(data.clone(), 8, d).unwrap();
            assert_eq!(s.len(), 8);
            assert_eq!(s.bytes(), 64 * d.bytes());
            let want: Vec<f32> = data.iter().map(|&x| d.round(x)).collect();
            assert_eq!(s.to_f32(), want);
            assert_eq!(&*s.row(3), &want[24..32]);
            let mut scratch = Vec::new();
            assert_eq!(s.rows_f32(2..5, &mut scratch), &want[16..40]);
            let mut bytes = Vec::new();
            for r in 0..s.len() {
                s.row_le_bytes(r, &mut bytes);
            }
            let mut back = RowStore::empty(8, d).unwrap();
            back.extend_le_bytes(&bytes);
            back.check().unwrap();
            assert_eq!(back, s);
        }
    }

    #[test]
    fn f16_overflow_is_named_and_stores_nothing() {
        let mut s = RowStore::from_f32(vec![1.0, 2.0], 2, Dtype::F16).unwrap();
        let e = s.push_rows(&[0.0, 0.0, 3.0, 65520.0]).unwrap_err();
        assert!(
            matches!(
                e,
                Error::NotRepresentable {
                    at: Located::Row(2),
                    column: 1,
                    dtype: Dtype::F16,
                    ..
                }
            ),
            "{e:?}"
        );
        let m = e.to_string();
        assert!(m.contains("65520") || m.contains("6.552e4"), "{m}");
        assert_eq!(s.len(), 1, "a failed push stores nothing");
        // 65519 rounds down to the largest finite f16.
        s.push_rows(&[65519.0, -65519.0]).unwrap();
        assert_eq!(&*s.row(1), &[65504.0, -65504.0]);
        let e = s.set_row(2, &[1.0, 1.0]).unwrap_err();
        assert!(
            e.to_string().contains("row = 2") && e.to_string().contains("2 rows"),
            "{e}"
        );
        let e = s.set_row(0, &[1.0, 7e4]).unwrap_err();
        assert!(matches!(
            e,
            Error::NotRepresentable {
                at: Located::Row(0),
                column: 1,
                ..
            }
        ));
        assert_eq!(&*s.row(0), &[1.0, 2.0], "a failed overwrite keeps the row");
    }

    #[test]
    fn non_finite_and_norm_rules_hold_on_stored_values() {
        for d in [Dtype::F16, Dtype::Bf16] {
            let e = RowStore::from_f32(vec![1.0, f32::NAN], 2, d).unwrap_err();
            assert!(matches!(e, Error::NonFinite { column: 1, .. }), "{e:?}");
        }
        // bf16 keeps the range of f32: the overflow rule (2^100) applies to
        // the widened values.
        let big = 2f32.powi(50);
        let e = RowStore::from_f32(vec![big, big], 2, Dtype::Bf16).unwrap_err();
        assert!(matches!(e, Error::NormTooLarge { .. }), "{e:?}");
        let mut s = RowStore::empty(2, Dtype::Bf16).unwrap();
        s.push_rows(&[big, 0.0]).unwrap();
        assert_eq!(s.len(), 1);
    }
}

//! One conformance test for every backend: the input rules of
//! `docs/CONTRACTS.md §4` and, for exact backends, bit-identical answers to
//! [`topk_cpu::Oracle`] (`§2`, `§3`) on tie-rich and adversarial corpora,
//! under every metric, single and batched.
//!
//! A backend is a [`Subject`]: a label, whether it is exact, and how to open
//! it over a row-major corpus. [`crate::Label`] names the backends of this
//! workspace on each of their paths (CPU kernels, GPU plan paths) and builds
//! their subjects; any other way of opening one (the `topk` facade) wraps
//! its own constructor in [`Subject::exact`]. [`conformance`] panics with the
//! label, the case and the first difference.
//!
//! A subject that stores its corpus at half width ([`Subject::stored_as`],
//! docs/CONTRACTS.md §14) is held to the oracle over the rounded values:
//! every value rounded to the type by the scalar rule ([`Dtype::round`]) and
//! widened back. Its f16 corpora are first clamped to ±65504, the f16 range
//! (a larger value is a rejection, checked among the corpus rules); a
//! corpus whose rounded values break the overflow rule must be rejected.

use std::fmt;

use ndarray::{Array2, ArrayView2};
use topk_core::{cmp_rank, Dtype, Error, Located, Metric, Neighbor, Result, Retriever};
use topk_cpu::Oracle;

use crate::corpora::{bitwise_diff, corpus, palette, queries, shuffled_duplicates, Kind, KINDS};

/// How a subject opens: a row-major corpus of `data.len() / dim` rows.
pub type OpenFn<'a> = dyn Fn(Vec<f32>, usize, Metric) -> Result<Box<dyn Retriever>> + 'a;

/// A backend under test.
pub struct Subject<'a> {
    label: String,
    exact: bool,
    dtype: Dtype,
    open: Box<OpenFn<'a>>,
    after: Option<Box<dyn Fn() -> std::result::Result<(), String> + 'a>>,
}

impl<'a> Subject<'a> {
    /// An exact backend: every answer must equal the oracle's, bit for bit.
    pub fn exact(
        label: impl Into<String>,
        open: impl Fn(Vec<f32>, usize, Metric) -> Result<Box<dyn Retriever>> + 'a,
    ) -> Self {
        Subject {
            label: label.into(),
            exact: true,
            dtype: Dtype::F32,
            open: Box::new(open),
            after: None,
        }
    }

    /// An approximate backend: the input rules hold, and every answer has
    /// `min(K, N)` distinct rows, best first, each with its canonical score.
    pub fn approximate(
        label: impl Into<String>,
        open: impl Fn(Vec<f32>, usize, Metric) -> Result<Box<dyn Retriever>> + 'a,
    ) -> Self {
        Subject {
            exact: false,
            ..Subject::exact(label, open)
        }
    }

    /// The subject stores its corpus as `dtype`: answers are compared with
    /// the oracle over the rounded values.
    pub fn stored_as(mut self, dtype: Dtype) -> Self {
        self.dtype = dtype;
        self
    }

    /// The storage type the subject declared.
    pub fn dtype(&self) -> Dtype {
        self.dtype
    }

    /// What the agreement suite feeds the subject: `data` itself, clamped to
    /// the f16 range for an f16 subject.
    fn input(&self, data: &[f32]) -> Vec<f32> {
        match self.dtype {
            Dtype::F16 => {
                let max = Dtype::F16.max();
                data.iter().map(|&x| x.clamp(-max, max)).collect()
            }
            _ => data.to_vec(),
        }
    }

    /// The corpus the oracle is built over: `input` rounded to the type.
    fn reference(&self, input: &[f32]) -> Vec<f32> {
        input.iter().map(|&x| self.dtype.round(x)).collect()
    }

    /// A final check after every case has run (say, that a forced path ran).
    pub fn after(mut self, check: impl Fn() -> std::result::Result<(), String> + 'a) -> Self {
        self.after = Some(Box::new(check));
        self
    }

    /// The label failures name.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// Opens the backend over `data` (`dim` values a row) under `metric`.
    pub fn open(&self, data: Vec<f32>, dim: usize, metric: Metric) -> Result<Box<dyn Retriever>> {
        (self.open)(data, dim, metric)
    }

    /// Runs the final check given to [`Subject::after`], if any.
    pub fn finish(&self) -> std::result::Result<(), String> {
        match &self.after {
            Some(after) => after().map_err(|why| format!("{}: {why}", self.label)),
            None => Ok(()),
        }
    }
}

impl fmt::Debug for Subject<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Subject")
            .field("label", &self.label)
            .field("exact", &self.exact)
            .finish_non_exhaustive()
    }
}

/// What a conformance run covered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Coverage {
    /// Corpora (shape, palette, metric) searched.
    pub corpora: usize,
    /// Result lists compared (single and batched queries).
    pub answers: usize,
    /// Rejected inputs checked.
    pub rejections: usize,
}

/// Runs every input rule and every agreement case through `subject`,
/// panicking at the first failure with the label and the case.
pub fn conformance(subject: &Subject<'_>) -> Coverage {
    let mut cov = Coverage::default();
    for metric in Metric::ALL {
        corpus_rules(subject, metric, &mut cov);
        search_rules(subject, metric, &mut cov);
    }
    for case in cases() {
        for metric in Metric::ALL {
            agreement(subject, &case, metric, &mut cov);
        }
    }
    if let Err(why) = subject.finish() {
        panic!("{why}");
    }
    cov
}

/// Checks a rejection: the error matches `want` and its message names `parts`.
fn rejects<T>(
    label: &str,
    what: &str,
    got: Result<T>,
    want: impl Fn(&Error) -> bool,
    parts: &[&str],
    cov: &mut Coverage,
) {
    let e = match got {
        Ok(_) => panic!("{label}: {what} was accepted"),
        Err(e) => e,
    };
    assert!(want(&e), "{label}: {what}: unexpected error {e:?}");
    let msg = e.to_string();
    for p in parts {
        assert!(
            msg.contains(p),
            "{label}: {what}: message {msg:?} does not name {p:?}"
        );
    }
    cov.rejections += 1;
}

/// The corpus rules, at construction.
fn corpus_rules(s: &Subject<'_>, metric: Metric, cov: &mut Coverage) {
    let l = format!("{} ({metric})", s.label);
    let zero = |e: &Error| matches!(e, Error::ZeroDimension);
    rejects(
        &l,
        "D = 0",
        s.open(vec![1.0; 4], 0, metric),
        zero,
        &["D = 0"],
        cov,
    );
    let empty = |e: &Error| matches!(e, Error::EmptyCorpus);
    rejects(
        &l,
        "an empty corpus",
        s.open(Vec::new(), 3, metric),
        empty,
        &["N = 0"],
        cov,
    );
    let ragged = |e: &Error| matches!(e, Error::RaggedCorpus { len: 7, dim: 3 });
    rejects(
        &l,
        "7 values of D = 3",
        s.open(vec![1.0; 7], 3, metric),
        ragged,
        &["7", "D = 3"],
        cov,
    );
    for (bad, name) in [
        (f32::NAN, "NaN"),
        (f32::INFINITY, "inf"),
        (f32::NEG_INFINITY, "-inf"),
    ] {
        let mut data = vec![0.5_f32; 12];
        data[2 * 4 + 1] = bad;
        let at = |e: &Error| matches!(e, Error::NonFinite { at: Located::Row(2), column: 1, value } if value.to_bits() == bad.to_bits());
        let what = format!("a corpus holding {name}");
        rejects(
            &l,
            &what,
            s.open(data, 4, metric),
            at,
            &["row 2", "column 1", name],
            cov,
        );
    }
    // The overflow rule: a row of squared norm above 2^100 (4 · (2^50)² = 2^102).
    let mut data = vec![0.5_f32; 12];
    data[4..8].fill((1u64 << 50) as f32);
    let norm = |e: &Error| {
        matches!(
            e,
            Error::NormTooLarge {
                at: Located::Row(1),
                ..
            }
        )
    };
    let what = "a row of squared norm 2^102";
    if s.dtype == Dtype::F16 {
        // 2^50 is beyond the f16 range: rejected before the norm is taken.
        let wide = |e: &Error| {
            matches!(
                e,
                Error::NotRepresentable {
                    at: Located::Row(1),
                    column: 0,
                    dtype: Dtype::F16,
                    ..
                }
            )
        };
        rejects(
            &l,
            what,
            s.open(data, 4, metric),
            wide,
            &["corpus row 1", "f16"],
            cov,
        );
    } else {
        rejects(
            &l,
            what,
            s.open(data, 4, metric),
            norm,
            &["corpus row 1", "2^100"],
            cov,
        );
    }
    // A finite value the storage type cannot hold.
    let too_wide = match s.dtype {
        Dtype::F32 => None,
        Dtype::F16 => Some(65520.0_f32),
        Dtype::Bf16 => Some(f32::MAX),
    };
    if let Some(v) = too_wide {
        let mut data = vec![0.5_f32; 12];
        data[2 * 4 + 3] = -v;
        let dtype = s.dtype;
        let at = |e: &Error| matches!(e, Error::NotRepresentable { at: Located::Row(2), column: 3, dtype: t, .. } if *t == dtype);
        let what = format!("a value of {:e} stored as {dtype}", -v);
        rejects(
            &l,
            &what,
            s.open(data, 4, metric),
            at,
            &["corpus row 2", "column 3", dtype.as_str()],
            cov,
        );
    }
}

/// The query and K rules on a valid index, which must keep answering after them.
fn search_rules(s: &Subject<'_>, metric: Metric, cov: &mut Coverage) {
    let l = format!("{} ({metric})", s.label);
    let (n, d) = (5, 4);
    let data = corpus(11, n, d, &[Kind::Uniform]);
    let r = match s.open(data.clone(), d, metric) {
        Ok(r) => r,
        Err(e) => panic!("{l}: a valid 5 x 4 corpus was rejected: {e}"),
    };
    assert_eq!(
        (r.len(), r.dim(), r.metric(), r.is_empty()),
        (n, d, metric, false),
        "{l}"
    );
    let q = vec![0.25_f32, -0.5, 1.0, 0.0];
    for len in [0, 3, 5] {
        let short = vec![0.5; len];
        let dim = |e: &Error| matches!(e, Error::DimensionMismatch { expected: 4, got, .. } if *got == len);
        let what = format!("a query of {len} values");
        rejects(&l, &what, r.search(&short, 3), dim, &["D = 4"], cov);
    }
    rejects(
        &l,
        "K = 0",
        r.search(&q, 0),
        |e| matches!(e, Error::ZeroK),
        &["K = 0"],
        cov,
    );
    for (bad, name) in [
        (f32::NAN, "NaN"),
        (f32::INFINITY, "inf"),
        (f32::NEG_INFINITY, "-inf"),
    ] {
        let mut bad_q = q.clone();
        bad_q[2] = bad;
        let at = |e: &Error| {
            matches!(
                e,
                Error::NonFinite {
                    at: Located::Query(0),
                    column: 2,
                    ..
                }
            )
        };
        let what = format!("a query holding {name}");
        rejects(
            &l,
            &what,
            r.search(&bad_q, 3),
            at,
            &["query 0", "column 2", name],
            cov,
        );
    }
    let loud = vec![(1u64 << 50) as f32; 4];
    let norm = |e: &Error| {
        matches!(
            e,
            Error::NormTooLarge {
                at: Located::Query(0),
                ..
            }
        )
    };
    let what = "a query of squared norm 2^102";
    rejects(
        &l,
        what,
        r.search(&loud, 3),
        norm,
        &["query 0", "2^100"],
        cov,
    );

    let qs = Array2::from_shape_fn((3, d), |(i, j)| (i * d + j) as f32 * 0.125 - 0.5);
    let wide = Array2::<f32>::zeros((3, d + 1));
    let dim = |e: &Error| {
        matches!(
            e,
            Error::DimensionMismatch {
                expected: 4,
                got: 5,
                ..
            }
        )
    };
    rejects(
        &l,
        "a batch of width 5",
        r.search_batch(wide.view(), 2),
        dim,
        &["D = 4"],
        cov,
    );
    let mut nan = qs.clone();
    nan[[2, 1]] = f32::NAN;
    let at = |e: &Error| {
        matches!(
            e,
            Error::NonFinite {
                at: Located::Query(2),
                column: 1,
                ..
            }
        )
    };
    rejects(
        &l,
        "NaN in query 2 of a batch",
        r.search_batch(nan.view(), 2),
        at,
        &["query 2"],
        cov,
    );
    let zero_k = r.search_batch(qs.view(), 0);
    rejects(
        &l,
        "K = 0 for a batch",
        zero_k,
        |e| matches!(e, Error::ZeroK),
        &["K = 0"],
        cov,
    );

    // After every rejection the index still answers, K > N returns all N rows,
    // a reused buffer is replaced, and an empty batch has no answers.
    let oracle =
        Oracle::from_rowmajor(s.reference(&data), d, metric).unwrap_or_else(|e| panic!("{l}: {e}"));
    let got = ok(&l, "K = N + 3", r.search(&q, n + 3));
    assert_eq!(got.len(), n, "{l}: K > N must return all N rows");
    if s.exact {
        same(
            &l,
            "K = N + 3",
            &got,
            &ok(&l, "oracle", oracle.search(&q, n + 3)),
        );
    }
    let mut buf = vec![Neighbor::new(99, 1.0); 9];
    ok(&l, "search_into", r.search_into(&q, 2, &mut buf));
    same(
        &l,
        "search_into over a used buffer",
        &buf,
        &ok(&l, "search", r.search(&q, 2)),
    );
    let none = ok(
        &l,
        "an empty batch",
        r.search_batch(Array2::zeros((0, d)).view(), 2),
    );
    assert!(
        none.is_empty(),
        "{l}: an empty batch gave {} answers",
        none.len()
    );
    cov.answers += 3;
}

fn ok<T>(label: &str, what: &str, r: Result<T>) -> T {
    r.unwrap_or_else(|e| panic!("{label}: {what} failed: {e}"))
}

fn same(label: &str, what: &str, got: &[Neighbor], want: &[Neighbor]) {
    if let Some(diff) = bitwise_diff(got, want) {
        panic!("{label}: {what}: {diff}");
    }
}

/// One corpus of the agreement suite.
struct Case {
    name: String,
    data: Vec<f32>,
    dim: usize,
    queries: usize,
}

/// The agreement corpora: each kind alone, all kinds mixed at a few shapes,
/// shuffled duplicates, the smallest shapes, and one row wider than the GPU's
/// single-query limit of 16,384 values.
fn cases() -> Vec<Case> {
    let mut out = Vec::new();
    let mut add = |name: String, data: Vec<f32>, dim: usize, queries: usize| {
        out.push(Case {
            name,
            data,
            dim,
            queries,
        });
    };
    for (i, kind) in KINDS.iter().enumerate() {
        let seed = 100 + i as u64;
        add(
            format!("{kind:?} 257 x 33"),
            corpus(seed, 257, 33, &[*kind]),
            33,
            6,
        );
    }
    let all = palette(0x7f);
    add("mixed 1 x 1".into(), corpus(1, 1, 1, &all), 1, 4);
    add("mixed 7 x 3".into(), corpus(2, 7, 3, &all), 3, 6);
    add("mixed 1000 x 64".into(), corpus(3, 1000, 64, &all), 64, 6);
    add(
        "mixed 2500 x 130".into(),
        corpus(4, 2500, 130, &all),
        130,
        6,
    );
    add(
        "ties 3000 x 8".into(),
        corpus(5, 3000, 8, &palette(0b0000_1110)),
        8,
        8,
    );
    add(
        "shuffled duplicates 600 x 16".into(),
        shuffled_duplicates(6, 600, 16, 5),
        16,
        6,
    );
    add(
        "mixed 40 x 16400".into(),
        corpus(7, 40, 16_400, &palette(0b0010_0011)),
        16_400,
        2,
    );
    out
}

/// The subject's answers on one corpus against the oracle's: each query
/// alone, the whole batch, and the batch in column-major layout.
fn agreement(s: &Subject<'_>, case: &Case, metric: Metric, cov: &mut Coverage) {
    let l = format!("{} ({metric}, {})", s.label, case.name);
    let (d, n) = (case.dim, case.data.len() / case.dim);
    let input = s.input(&case.data);
    let oracle = match Oracle::from_rowmajor(s.reference(&input), d, metric) {
        Ok(o) => o,
        Err(want) => {
            // Rounding pushed a row over the overflow rule: the subject, which
            // checks its stored values, must refuse the corpus too.
            match s.open(input, d, metric) {
                Err(got) if std::mem::discriminant(&got) == std::mem::discriminant(&want) => {
                    cov.rejections += 1;
                    return;
                }
                Err(got) => panic!("{l}: expected {want}, got {got}"),
                Ok(_) => panic!("{l}: accepted a corpus whose stored values break a rule: {want}"),
            }
        }
    };
    let r = ok(&l, "open", s.open(input, d, metric));
    let kinds = palette(0x7f);
    let qdata = queries(n as u64 ^ d as u64, case.queries, d, &kinds, &case.data);
    let qs = ArrayView2::from_shape((case.queries, d), &qdata[..])
        .unwrap_or_else(|e| panic!("{l}: queries: {e}"));
    let mut ks = vec![1, 10, 100, n, n + 5];
    ks.retain(|&k| k <= n + 5);
    ks.sort_unstable();
    ks.dedup();
    // The full ranking, for the canonical scores of an approximate answer.
    let every = if s.exact {
        Vec::new()
    } else {
        ok(&l, "oracle", oracle.search_batch(qs, n))
    };
    for k in ks {
        let want = ok(&l, "oracle", oracle.search_batch(qs, k));
        let batch = ok(&l, &format!("batch K = {k}"), r.search_batch(qs, k));
        assert_eq!(batch.len(), case.queries, "{l}: batch K = {k}: answers");
        for (i, q) in qs.outer_iter().enumerate() {
            let q = q.to_vec();
            let what = format!("query {i}, K = {k}");
            let single = ok(&l, &what, r.search(&q, k));
            if s.exact {
                same(&l, &what, &single, &want[i]);
                same(&l, &format!("batch {what}"), &batch[i], &want[i]);
            } else {
                plausible(&l, &what, &single, k.min(n), &every[i]);
                plausible(&l, &format!("batch {what}"), &batch[i], k.min(n), &every[i]);
            }
            cov.answers += 2;
        }
    }
    if s.exact {
        // A column-major batch answers by logical rows.
        let t = qs.t().to_owned();
        let want = ok(&l, "oracle", oracle.search_batch(qs, 10));
        let got = ok(&l, "column-major batch", r.search_batch(t.t(), 10));
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            same(&l, &format!("column-major batch query {i}"), g, w);
        }
        cov.answers += got.len();
    }
    cov.corpora += 1;
}

/// An approximate answer: `len` distinct rows, best first, each with the bits
/// of its canonical score (taken from the oracle's full ranking `every`).
fn plausible(label: &str, what: &str, got: &[Neighbor], len: usize, every: &[Neighbor]) {
    assert_eq!(got.len(), len, "{label}: {what}: result count");
    assert!(
        got.windows(2).all(|w| cmp_rank(&w[0], &w[1]).is_lt()),
        "{label}: {what}: results not strictly best first: {got:?}"
    );
    let mut score = vec![None; every.len()];
    for nb in every {
        score[nb.index as usize] = Some(nb.score.to_bits());
    }
    for nb in got {
        let want = score.get(nb.index as usize).copied().flatten();
        assert_eq!(
            Some(nb.score.to_bits()),
            want,
            "{label}: {what}: row {} has score {:e}, not its canonical score",
            nb.index,
            nb.score
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Label;

    #[test]
    fn the_oracle_conforms() {
        let cov = conformance(&Label::Oracle.subject());
        assert_eq!(cov.corpora, cases().len() * Metric::ALL.len(), "{cov:?}");
        assert!(cov.answers > 1000 && cov.rejections > 40, "{cov:?}");
    }

    #[test]
    fn a_wrong_backend_is_caught() {
        // Drops the last result of every answer with K > 1.
        struct Short(Oracle);
        impl Retriever for Short {
            fn backend(&self) -> &'static str {
                "short"
            }
            fn len(&self) -> usize {
                self.0.len()
            }
            fn dim(&self) -> usize {
                self.0.dim()
            }
            fn metric(&self) -> Metric {
                self.0.metric()
            }
            fn search_into(&self, q: &[f32], k: usize, out: &mut Vec<Neighbor>) -> Result<()> {
                self.0.search_into(q, k, out)?;
                if k > 1 && out.len() > 1 {
                    out.pop();
                }
                Ok(())
            }
        }
        let s = Subject::exact("short", |data, dim, metric| {
            Ok(Box::new(Short(Oracle::from_rowmajor(data, dim, metric)?)))
        });
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| conformance(&s)));
        assert!(caught.is_err(), "a backend that drops results passed");
    }
}

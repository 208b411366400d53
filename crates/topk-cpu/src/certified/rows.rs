//! The certified path's per-corpus state ([`CertifiedRows`]) and the entry
//! point for corpora held elsewhere ([`select_certified`]): what an index
//! whose rows change keeps beside them (docs/CONTRACTS.md §2.1, §10).

use ndarray::ArrayView2;
use topk_core::{validate, Result};

use super::{BatchGemm, BoundNorms, CertifiedPick, CorpusCodes, Engine, BLOCK_ROWS};
use crate::batch::Batch;
use crate::corpus::CorpusRef;
use crate::error::CpuError;
use crate::kernels::Kernels;

/// The certified path's state for one corpus, kept beside its rows: the
/// rows' upward norms and, for the int8 product, their codes. A
/// [`CpuRetriever`](crate::CpuRetriever) builds its own on first use; a
/// corpus held elsewhere that changes (an index's rows) keeps one and
/// updates it with its rows ([`CertifiedRows::update_from`],
/// [`CertifiedRows::refresh_rows`]), so that searches never quantize rows
/// that did not change.
#[derive(Debug, Clone, PartialEq)]
pub struct CertifiedRows {
    gemm: BatchGemm,
    /// The width and metric of the corpus it was built for.
    dim: usize,
    metric: topk_core::Metric,
    norms: BoundNorms,
    codes: Option<CorpusCodes>,
}

impl CertifiedRows {
    /// The state of every row of `corpus` for the product `gemm` (the int8
    /// one quantizes every row: one pass over the rows, in parallel).
    ///
    /// # Errors
    /// [`CpuError::BatchGemmUnavailable`] when this CPU does not run `gemm`.
    pub fn build(corpus: CorpusRef<'_>, gemm: BatchGemm) -> Result<CertifiedRows> {
        Ok(CertifiedRows::of(corpus, gemm.check()?))
    }

    /// [`CertifiedRows::build`] for a product this CPU runs.
    pub(crate) fn of(corpus: CorpusRef<'_>, gemm: BatchGemm) -> CertifiedRows {
        CertifiedRows {
            gemm,
            dim: corpus.dim(),
            metric: corpus.metric(),
            norms: BoundNorms::of_corpus(corpus, 0),
            codes: (gemm == BatchGemm::Int8).then(|| CorpusCodes::of(corpus)),
        }
    }

    /// Brings the state up to date after the rows from `first` on changed,
    /// were appended or were dropped (the corpus is now `corpus`); the state
    /// of the rows before `first` is kept.
    pub fn update_from(&mut self, corpus: CorpusRef<'_>, first: usize) {
        let first = first.min(self.norms.len());
        self.norms.truncate(first);
        self.norms.extend(BoundNorms::of_corpus(corpus, first));
        if let Some(codes) = &mut self.codes {
            codes.update_from(corpus, first);
        }
    }

    /// Brings the state of `rows` up to date after their values changed
    /// (each row block holding one is quantized again, once).
    pub fn refresh_rows(&mut self, corpus: CorpusRef<'_>, rows: &[usize]) {
        let n = self.norms.len().min(corpus.len());
        let mut wide = Vec::new();
        for &r in rows.iter().filter(|&&r| r < n) {
            let one = BoundNorms::of(corpus.rows(r..r + 1, &mut wide), corpus.dim());
            self.norms.set(r, one);
        }
        if let Some(codes) = &mut self.codes {
            let mut blocks: Vec<usize> = rows
                .iter()
                .filter(|&&r| r < n)
                .map(|r| r / BLOCK_ROWS)
                .collect();
            blocks.sort_unstable();
            blocks.dedup();
            codes.refresh_blocks(corpus, &blocks);
        }
    }

    /// The product behind the bounds.
    pub fn gemm(&self) -> BatchGemm {
        self.gemm
    }

    /// Rows covered.
    pub fn len(&self) -> usize {
        self.norms.len()
    }

    /// Whether no row is covered.
    pub fn is_empty(&self) -> bool {
        self.norms.len() == 0
    }

    /// The engine over `corpus`.
    pub(super) fn engine<'a>(&'a self, corpus: CorpusRef<'a>, kernels: Kernels) -> Engine<'a> {
        Engine {
            corpus,
            kernels,
            norms: &self.norms,
            codes: self.codes.as_ref(),
        }
    }
}

/// Searches every query of `queries` (`Q × D`, any layout) on the certified
/// path over the rows of `corpus` that `admit(query, row)` lets through, and
/// returns one `pick()` per query holding the best `k` of them under its own
/// order (canonical scores, docs/CONTRACTS.md §2.1). `rows` must be the
/// state of `corpus` as it is now; `kernels` scores the rows the bounds
/// keep (any path gives the same bits). Runs on the current rayon pool.
///
/// # Errors
/// The §4 errors of the queries and `k`, and
/// [`CpuError::StaleRows`] when `rows` does not cover the corpus's rows,
/// [`CpuError::ForeignRows`] when it was built for another D or metric;
/// `InvalidParameter` above D = 2^16, where the bound is not derived.
pub fn select_certified<P: CertifiedPick>(
    corpus: CorpusRef<'_>,
    rows: &CertifiedRows,
    kernels: Kernels,
    queries: ArrayView2<'_, f32>,
    k: usize,
    admit: impl Fn(usize, u32) -> bool + Sync,
    pick: impl Fn() -> P,
) -> Result<Vec<P>> {
    validate::queries(queries, corpus.dim())?;
    if k == 0 {
        return Err(topk_core::Error::ZeroK);
    }
    if corpus.dim() > super::MAX_DIM {
        // The bound (and the int8 product's 32-bit sums) hold to D = 2^16.
        return Err(topk_core::Error::InvalidParameter {
            name: "dim",
            value: corpus.dim().to_string(),
            reason: format!(
                "the certified path's bound is derived for D <= {}",
                super::MAX_DIM
            ),
        });
    }
    if rows.dim != corpus.dim() || rows.metric != corpus.metric() {
        return Err(CpuError::ForeignRows {
            state_dim: rows.dim,
            state_metric: rows.metric,
            dim: corpus.dim(),
            metric: corpus.metric(),
        }
        .into());
    }
    if rows.len() != corpus.len() {
        return Err(CpuError::StaleRows {
            covered: rows.len(),
            rows: corpus.len(),
        }
        .into());
    }
    if queries.nrows() == 0 {
        return Ok(Vec::new());
    }
    let batch = Batch::new(queries, corpus.metric(), kernels);
    Ok(rows
        .engine(corpus, kernels)
        .select(&batch, k, admit, pick)
        .0)
}

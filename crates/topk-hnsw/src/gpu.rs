//! GPU-batched distances (feature `cuda`): the walk stays on the host, the
//! distance arithmetic goes to topk-cuda's resident corpus.
//!
//! Every expansion of a walk (greedy descent on the upper layers and the
//! beam search of layer 0, during search and during construction) collects
//! the node's unvisited neighbours and scores them in one
//! [`CudaRetriever::score_ids`] launch. The corpus is uploaded once, with
//! the engine; a launch moves the query and the ids in and the scores out.
//! The GPU computes the canonical score, so it returns the CPU's bits and
//! the walk visits the same nodes in the same order: a sequential build
//! through the GPU yields the byte-identical graph, and a search the
//! identical results (both tested on the device).
//!
//! One query in flight pays a launch and a synchronisation per expansion.
//! [`Hnsw::search_batch_gpu`] keeps many queries in flight instead: each
//! runs its walk on its own host thread, and a batcher thread merges the
//! pending expansions of up to 64 queries into one launch.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Mutex};

use ndarray::ArrayView2;
use topk_core::{validate, Metric, Neighbor};
use topk_cuda::{CudaError, CudaRetriever};

use crate::build::{build, Mode, ScorerSource};
use crate::error::{HnswError, Result};
use crate::index::Hnsw;
use crate::params::{check_ef, HnswParams};
use crate::search::Scorer;
use crate::vectors::Vectors;

/// Queries per `score_ids` launch (the engine's documented ceiling).
const MAX_QUERIES_PER_LAUNCH: usize = 64;

impl From<CudaError> for HnswError {
    fn from(e: CudaError) -> Self {
        HnswError::Gpu {
            source: Box::new(e),
        }
    }
}

/// The engine must hold exactly this corpus under this metric.
fn check_engine(gpu: &CudaRetriever, v: &Vectors) -> Result<()> {
    use topk_core::Retriever;
    if gpu.len() != v.len() || gpu.dim() != v.dim() || gpu.metric() != v.metric() {
        return Err(HnswError::GpuMismatch {
            engine: format!("{} x {} {}", gpu.len(), gpu.dim(), gpu.metric()),
            index: format!("{} x {} {}", v.len(), v.dim(), v.metric()),
        });
    }
    Ok(())
}

/// Scores up to 16 rows spread over the corpus on both sides and compares
/// the bits: an engine loaded with other rows (same shape) would otherwise
/// steer the walk with foreign distances without any error.
fn spot_check(gpu: &CudaRetriever, v: &Vectors) -> Result<()> {
    let n = v.len();
    let step = n.div_ceil(16).max(1);
    let ids: Vec<u32> = (0..n).step_by(step).map(|i| i as u32).collect();
    let q = v.row_query(0);
    let mut got = vec![0.0_f32; ids.len()];
    gpu.score_ids(q.values, &ids, &[0, ids.len()], &mut got)?;
    for (&id, &g) in ids.iter().zip(&got) {
        let want = v.score(q, id);
        if g.to_bits() != want.to_bits() {
            return Err(HnswError::GpuMismatch {
                engine: format!("row 0 vs row {id} scores {g}"),
                index: format!("{want} on the CPU"),
            });
        }
    }
    Ok(())
}

/// One query, one launch per expansion (chunked at the engine's capacity).
struct DirectScorer<'a> {
    gpu: &'a CudaRetriever,
    query: &'a [f32],
}

impl Scorer for DirectScorer<'_> {
    fn score_ids(&mut self, ids: &[u32], out: &mut [f32]) -> Result<()> {
        let cap = self.gpu.options().max_gather.max(1);
        for (chunk, o) in ids.chunks(cap).zip(out.chunks_mut(cap)) {
            self.gpu
                .score_ids(self.query, chunk, &[0, chunk.len()], o)?;
        }
        Ok(())
    }
}

/// Construction through the GPU: the node being inserted is the query.
struct GpuSource<'a> {
    vectors: &'a Vectors,
    gpu: &'a CudaRetriever,
}

impl ScorerSource for GpuSource<'_> {
    type Scorer<'s>
        = DirectScorer<'s>
    where
        Self: 's;

    fn for_row(&self, row: u32) -> Result<DirectScorer<'_>> {
        Ok(DirectScorer {
            gpu: self.gpu,
            query: self.vectors.row(row),
        })
    }
}

impl Hnsw {
    /// Builds an index whose layer searches score through `gpu`, an engine
    /// already holding the same rows (`CudaRetriever::from_rowmajor(data, dim,
    /// metric, ..)`). Sequential builds are byte-identical to [`Hnsw::build`].
    pub fn build_gpu(
        data: &[f32],
        dim: usize,
        metric: Metric,
        params: HnswParams,
        gpu: &CudaRetriever,
        parallel: bool,
    ) -> Result<Self> {
        params.validate()?;
        validate::corpus(data, dim)?;
        let vectors = Vectors::new(data.to_vec(), dim, metric);
        check_engine(gpu, &vectors)?;
        spot_check(gpu, &vectors)?;
        let mode = if parallel {
            Mode::Parallel
        } else {
            Mode::Sequential
        };
        let graph = build(
            &vectors,
            &GpuSource {
                vectors: &vectors,
                gpu,
            },
            params,
            mode,
        )?;
        Ok(Hnsw::from_parts(params, vectors, graph))
    }

    /// [`Hnsw::search_with_ef`] with distances from `gpu` (one launch per
    /// expansion). Same results as the CPU path.
    pub fn search_gpu(
        &self,
        gpu: &CudaRetriever,
        query: &[f32],
        k: usize,
        ef: usize,
        out: &mut Vec<Neighbor>,
    ) -> Result<()> {
        validate::query(query, self.vectors.dim())?;
        validate::k(k, self.vectors.len())?;
        check_ef(ef)?;
        check_engine(gpu, &self.vectors)?;
        let mut scorer = DirectScorer { gpu, query };
        let mut sc = self.pool.take();
        let r = self.search_scored(&mut scorer, k, ef, &mut sc, out);
        self.pool.put(sc);
        r
    }

    /// Searches a `Q × D` batch with `in_flight` walks running at once, their
    /// expansions merged into shared launches. Same results as the CPU path.
    pub fn search_batch_gpu(
        &self,
        gpu: &CudaRetriever,
        queries: ArrayView2<'_, f32>,
        k: usize,
        ef: usize,
        in_flight: usize,
    ) -> Result<Vec<Vec<Neighbor>>> {
        let dim = self.vectors.dim();
        validate::queries(queries, dim)?;
        validate::k(k, self.vectors.len())?;
        check_ef(ef)?;
        if in_flight == 0 {
            return Err(HnswError::InvalidParameter {
                name: "in_flight",
                value: 0,
                reason: "at least one query must be in flight",
            });
        }
        check_engine(gpu, &self.vectors)?;
        spot_check(gpu, &self.vectors)?;
        let nq = queries.nrows();
        let flat: Vec<f32> = queries.iter().copied().collect();
        let max_q = gpu.options().max_batch.clamp(1, MAX_QUERIES_PER_LAUNCH);
        let max_ids = gpu.options().max_gather.max(1);
        let failure: Mutex<Option<HnswError>> = Mutex::new(None);
        let next = AtomicUsize::new(0);
        let results: Mutex<Vec<Option<Vec<Neighbor>>>> = Mutex::new(vec![None; nq]);

        std::thread::scope(|s| {
            let (tx, rx) = mpsc::channel::<Request>();
            s.spawn(|| batcher(gpu, &flat, dim, rx, max_q, max_ids, &failure));
            for _ in 0..in_flight.min(nq) {
                let tx = tx.clone();
                let (failure, next, results) = (&failure, &next, &results);
                s.spawn(move || {
                    let (reply_tx, reply_rx) = mpsc::channel();
                    let mut sc = self.pool.take();
                    let mut out = Vec::new();
                    loop {
                        let qi = next.fetch_add(1, Ordering::Relaxed);
                        if qi >= nq {
                            break;
                        }
                        let mut scorer = BatchedScorer {
                            query: qi,
                            tx: &tx,
                            reply_tx: &reply_tx,
                            reply_rx: &reply_rx,
                            max_ids,
                        };
                        match self.search_scored(&mut scorer, k, ef, &mut sc, &mut out) {
                            Ok(()) => {
                                lock(results)[qi] = Some(out.clone());
                            }
                            Err(e) => {
                                lock(failure).get_or_insert(e);
                                next.store(nq, Ordering::Relaxed);
                                break;
                            }
                        }
                    }
                    self.pool.put(sc);
                });
            }
            // The batcher ends when the last worker drops its sender.
            drop(tx);
        });

        if let Some(e) = failure.into_inner().unwrap_or_else(|p| p.into_inner()) {
            return Err(e);
        }
        results
            .into_inner()
            .unwrap_or_else(|p| p.into_inner())
            .into_iter()
            .enumerate()
            .map(|(i, r)| {
                r.ok_or_else(|| HnswError::GpuBatch {
                    what: format!("query {i} produced no result"),
                })
            })
            .collect()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One expansion waiting for its scores.
struct Request {
    query: usize,
    ids: Vec<u32>,
    /// `None` when the launch failed (the error is in the shared slot).
    reply: mpsc::Sender<Option<Vec<f32>>>,
}

/// A walk's scorer that queues its expansions for the batcher.
struct BatchedScorer<'a> {
    query: usize,
    tx: &'a mpsc::Sender<Request>,
    reply_tx: &'a mpsc::Sender<Option<Vec<f32>>>,
    reply_rx: &'a mpsc::Receiver<Option<Vec<f32>>>,
    max_ids: usize,
}

impl Scorer for BatchedScorer<'_> {
    fn score_ids(&mut self, ids: &[u32], out: &mut [f32]) -> Result<()> {
        for (chunk, o) in ids.chunks(self.max_ids).zip(out.chunks_mut(self.max_ids)) {
            let req = Request {
                query: self.query,
                ids: chunk.to_vec(),
                reply: self.reply_tx.clone(),
            };
            let lost = || HnswError::GpuBatch {
                what: "the batcher stopped".to_owned(),
            };
            self.tx.send(req).map_err(|_| lost())?;
            match self.reply_rx.recv().map_err(|_| lost())? {
                Some(scores) => o.copy_from_slice(&scores),
                None => {
                    return Err(HnswError::GpuBatch {
                        what: "a shared launch failed".to_owned(),
                    })
                }
            }
        }
        Ok(())
    }
}

/// Merges whatever expansions are waiting (up to `max_q` queries and
/// `max_ids` ids) into one launch, until every walk has finished.
fn batcher(
    gpu: &CudaRetriever,
    queries: &[f32],
    dim: usize,
    rx: mpsc::Receiver<Request>,
    max_q: usize,
    max_ids: usize,
    failure: &Mutex<Option<HnswError>>,
) {
    let mut pending: Option<Request> = None;
    let mut batch: Vec<Request> = Vec::with_capacity(max_q);
    let (mut qbuf, mut ids, mut offsets, mut out) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    loop {
        let first = match pending.take() {
            Some(r) => r,
            None => match rx.recv() {
                Ok(r) => r,
                Err(_) => return,
            },
        };
        let mut total = first.ids.len();
        batch.clear();
        batch.push(first);
        while batch.len() < max_q {
            match rx.try_recv() {
                Ok(r) if total + r.ids.len() > max_ids => {
                    pending = Some(r);
                    break;
                }
                Ok(r) => {
                    total += r.ids.len();
                    batch.push(r);
                }
                Err(_) => break,
            }
        }
        qbuf.clear();
        ids.clear();
        offsets.clear();
        offsets.push(0);
        for r in &batch {
            qbuf.extend_from_slice(&queries[r.query * dim..(r.query + 1) * dim]);
            ids.extend_from_slice(&r.ids);
            offsets.push(ids.len());
        }
        out.clear();
        out.resize(ids.len(), 0.0);
        match gpu.score_ids(&qbuf, &ids, &offsets, &mut out) {
            Ok(()) => {
                for (i, r) in batch.iter().enumerate() {
                    let _ = r.reply.send(Some(out[offsets[i]..offsets[i + 1]].to_vec()));
                }
            }
            Err(e) => {
                lock(failure).get_or_insert(e.into());
                for r in &batch {
                    let _ = r.reply.send(None);
                }
            }
        }
    }
}

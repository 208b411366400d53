//! Many walks in flight against one batch-scoring engine.
//!
//! A walk scores one expansion at a time and cannot go on before the scores
//! are back, so a device that is fast per launch but slow per round trip
//! (a GPU) is kept busy by running many walks at once: each query walks on
//! its own host thread and queues its expansions; one batcher thread takes
//! whatever is queued (up to the engine's query and id limits), scores it in
//! one call, and hands each walk its slice of the scores. The walks
//! themselves are unchanged, so the results are those of the sequential
//! search whenever the engine returns the canonical scores.
//!
//! The engine is a trait so that this machinery is exercised without a GPU:
//! the CPU corpus implements it too, and the tests below compare both paths.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Mutex};

use ndarray::ArrayView2;
use topk_core::{validate, Neighbor};

use crate::error::{HnswError, Result};
use crate::index::Hnsw;
use crate::params::check_ef;
use crate::search::Scorer;
use crate::vectors::Vectors;

/// Scores many queries' listed rows in one call.
pub(crate) trait BatchEngine: Sync {
    /// Most queries per call.
    fn max_queries(&self) -> usize;
    /// Most ids per call.
    fn max_ids(&self) -> usize;
    /// Query `i` (row `i` of row-major `queries`) against
    /// `ids[offsets[i]..offsets[i + 1]]`, into the same positions of `out`.
    fn score_batch(
        &self,
        queries: &[f32],
        ids: &[u32],
        offsets: &[usize],
        out: &mut [f32],
    ) -> Result<()>;
}

/// The host corpus as an engine: the reference the batched machinery is
/// tested against where no GPU is present.
impl BatchEngine for Vectors {
    fn max_queries(&self) -> usize {
        64
    }

    fn max_ids(&self) -> usize {
        // Small on purpose: merged calls hit the limit and exercise the
        // splitting and carry-over paths that a GPU meets at scale.
        512
    }

    fn score_batch(
        &self,
        queries: &[f32],
        ids: &[u32],
        offsets: &[usize],
        out: &mut [f32],
    ) -> Result<()> {
        for (i, q) in queries.chunks_exact(self.dim()).enumerate() {
            let (a, b) = (offsets[i], offsets[i + 1]);
            self.score_ids(self.query(q), &ids[a..b], &mut out[a..b]);
        }
        Ok(())
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Hnsw {
    /// Searches a `Q × D` batch with `in_flight` walks at once, scoring their
    /// expansions through `engine` in merged calls.
    pub(crate) fn search_in_flight<E: BatchEngine>(
        &self,
        engine: &E,
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
        let nq = queries.nrows();
        let flat: Vec<f32> = queries.iter().copied().collect();
        let max_ids = engine.max_ids().max(1);
        let failure: Mutex<Option<HnswError>> = Mutex::new(None);
        let next = AtomicUsize::new(0);
        let results: Mutex<Vec<Option<Vec<Neighbor>>>> = Mutex::new(vec![None; nq]);

        std::thread::scope(|s| {
            let (tx, rx) = mpsc::channel::<Request>();
            s.spawn(|| batcher(engine, &flat, dim, rx, &failure));
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
                            Ok(()) => lock(results)[qi] = Some(out.clone()),
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
            // The batcher ends when the last walk drops its sender.
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

/// One expansion waiting for its scores.
struct Request {
    query: usize,
    ids: Vec<u32>,
    /// `None` when the merged call failed (the error is in the shared slot).
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
        let lost = |what: &str| HnswError::GpuBatch {
            what: what.to_owned(),
        };
        for (chunk, o) in ids.chunks(self.max_ids).zip(out.chunks_mut(self.max_ids)) {
            let req = Request {
                query: self.query,
                ids: chunk.to_vec(),
                reply: self.reply_tx.clone(),
            };
            self.tx.send(req).map_err(|_| lost("the batcher stopped"))?;
            match self
                .reply_rx
                .recv()
                .map_err(|_| lost("the batcher stopped"))?
            {
                Some(scores) => o.copy_from_slice(&scores),
                None => return Err(lost("a merged scoring call failed")),
            }
        }
        Ok(())
    }
}

/// Merges whatever expansions are waiting (within the engine's limits) into
/// one call, until every walk has finished.
fn batcher<E: BatchEngine>(
    engine: &E,
    queries: &[f32],
    dim: usize,
    rx: mpsc::Receiver<Request>,
    failure: &Mutex<Option<HnswError>>,
) {
    let (max_q, max_ids) = (engine.max_queries().max(1), engine.max_ids().max(1));
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
        match engine.score_batch(&qbuf, &ids, &offsets, &mut out) {
            Ok(()) => {
                for (i, r) in batch.iter().enumerate() {
                    // A walk that gave up has dropped its receiver; nothing to do.
                    let _ = r.reply.send(Some(out[offsets[i]..offsets[i + 1]].to_vec()));
                }
            }
            Err(e) => {
                lock(failure).get_or_insert(e);
                for r in &batch {
                    let _ = r.reply.send(None);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::HnswParams;
    use crate::synth;
    use topk_core::Metric;

    fn bits(v: &[Neighbor]) -> Vec<(u32, u32)> {
        v.iter().map(|n| (n.index, n.score.to_bits())).collect()
    }

    #[test]
    fn walks_in_flight_return_the_sequential_results() {
        let dim = 16;
        let data = synth::gaussian_clusters(3_000, dim, 12, 0.6, 4);
        let queries = synth::cluster_queries(120, dim, 12, 0.6, 4);
        let qs = ArrayView2::from_shape((120, dim), &queries[..]).unwrap();
        for metric in Metric::ALL {
            let params = HnswParams {
                m: 8,
                ef_construction: 40,
                ef_search: 30,
                seed: 2,
                parallel: false,
            };
            let index = Hnsw::build(&data, dim, metric, params).unwrap();
            let want = index.search_batch_with_ef(qs, 10, 30).unwrap();
            for in_flight in [1, 7, 200] {
                let got = index
                    .search_in_flight(&index.vectors, qs, 10, 30, in_flight)
                    .unwrap();
                assert_eq!(got.len(), want.len());
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(
                        bits(g),
                        bits(w),
                        "{metric}, {in_flight} in flight, query {i}"
                    );
                }
            }
            // A beam as wide as the corpus scores every row, in requests
            // larger than one merged call's id limit.
            let wide = index
                .search_in_flight(&index.vectors, qs.slice(ndarray::s![..3, ..]), 5, 5_000, 2)
                .unwrap();
            let exact = index
                .search_batch_with_ef(qs.slice(ndarray::s![..3, ..]), 5, 5_000)
                .unwrap();
            assert_eq!(
                wide.iter().map(|v| bits(v)).collect::<Vec<_>>(),
                exact.iter().map(|v| bits(v)).collect::<Vec<_>>()
            );
        }
    }

    #[test]
    fn zero_walks_in_flight_is_a_typed_error() {
        let index = Hnsw::build(&[1.0, 2.0], 1, Metric::L2, HnswParams::default()).unwrap();
        let qs = ndarray::Array2::<f32>::zeros((1, 1));
        let e = index
            .search_in_flight(&index.vectors, qs.view(), 1, 4, 0)
            .unwrap_err();
        assert!(
            matches!(
                e,
                HnswError::InvalidParameter {
                    name: "in_flight",
                    ..
                }
            ),
            "{e}"
        );
    }
}

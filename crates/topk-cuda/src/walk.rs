//! A layered graph resident beside the corpus, and the device walk over it
//! (`kernels/walk.cu`): topk-hnsw's GPU graph search, every query of a batch
//! searched by one block in one launch (docs/CONTRACTS.md §13).

use std::sync::{Arc, Mutex};

use cust::memory::{DeviceBuffer, LockedBuffer};
use cust::stream::{Stream, StreamFlags};
use topk_core::{validate, Dtype, Neighbor};

use crate::device::{pinned, Ctx, DevNeighbor, OwnedDevice};
use crate::driver::{alloc, DevSlice};
use crate::engine::Engine;
use crate::error::{CudaError, DriverResult};
use crate::launch::{self, PruneArgs, Queue, WalkArgs, WalkGraph};
use crate::walk_layout::{GraphLayout, WalkQueries, WalkStatus};

/// Queries per launch: bounds the staging buffers of a very large batch.
const WALK_CHUNK: usize = 1 << 16;
/// Beam room per `ef` with an allow-list (disallowed nodes that still
/// route the walk share the beam with the allowed ones).
const FILTERED_CAP_FACTOR: usize = 4;

/// A graph uploaded with [`crate::CudaRetriever::upload_graph`]: its lists
/// in device memory next to the engine's corpus, and the staging buffers of
/// its walks.
pub struct DeviceGraph {
    pub(crate) layer0: OwnedDevice<u32>,
    upper: OwnedDevice<u32>,
    upper_off: OwnedDevice<u32>,
    pub(crate) m0: usize,
    m: usize,
    entry: u32,
    top: usize,
    pub(crate) n: usize,
    pub(crate) device: usize,
    scratch: Mutex<Option<Scratch>>,
    // Declared last: the scratch's buffers free with this context current.
    pub(crate) ctx: Arc<Ctx>,
}

impl std::fmt::Debug for DeviceGraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceGraph")
            .field("n", &self.n)
            .field("m0", &self.m0)
            .field("m", &self.m)
            .field("entry", &self.entry)
            .field("top", &self.top)
            .finish()
    }
}

impl DeviceGraph {
    /// Nodes of the graph (the engine's rows).
    pub fn len(&self) -> usize {
        self.n
    }

    /// Always false: a graph has at least one node.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }
}

impl Drop for DeviceGraph {
    fn drop(&mut self) {
        if let Err(e) = self.ctx.make_current() {
            tracing::warn!("topk-cuda: could not make the context current to free: {e}");
        }
        self.scratch
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take();
    }
}

/// Staging of one walk launch, grown to the largest chunk seen.
struct Scratch {
    stream: Stream,
    queries: DeviceBuffer<f32>,
    q_host: LockedBuffer<f32>,
    qrows: DeviceBuffer<u32>,
    qrows_host: LockedBuffer<u32>,
    out: DeviceBuffer<DevNeighbor>,
    out_host: LockedBuffer<DevNeighbor>,
    status: DeviceBuffer<u32>,
    status_host: LockedBuffer<u32>,
    allow: DeviceBuffer<u32>,
    allow_host: LockedBuffer<u32>,
    /// The selection's lists, scores and counts (`WalkSelect`).
    kept: DeviceBuffer<u32>,
    kept_host: LockedBuffer<u32>,
    kept_scores: DeviceBuffer<f32>,
    kept_scores_host: LockedBuffer<f32>,
    kept_counts: DeviceBuffer<u32>,
    kept_counts_host: LockedBuffer<u32>,
}

/// The neighbour selection run on the results of every finished walk of
/// corpus rows, each row the base of its job (topk-hnsw's batched build):
/// at most `cap` of a walk's results kept (kernels/prune.cuh), into `lists`
/// (`cap` slots per query), their scores against the row into `scores`,
/// their count into `counts` (0 for a walk that did not finish).
pub(crate) struct WalkSelect<'o> {
    pub(crate) cap: usize,
    pub(crate) lists: &'o mut Vec<u32>,
    pub(crate) scores: &'o mut Vec<f32>,
    pub(crate) counts: &'o mut Vec<u32>,
}

impl Scratch {
    fn new(
        values: usize,
        results: usize,
        nq: usize,
        words: usize,
        kept: usize,
    ) -> Result<Self, CudaError> {
        Ok(Scratch {
            stream: Stream::new(StreamFlags::NON_BLOCKING, None).op("cuStreamCreate")?,
            queries: alloc("walk queries", values)?,
            q_host: pinned(values)?,
            qrows: alloc("walk query rows", nq)?,
            qrows_host: pinned(nq)?,
            out: alloc("walk results", results)?,
            out_host: pinned(results)?,
            status: alloc("walk status", nq)?,
            status_host: pinned(nq)?,
            allow: alloc("walk allow-list", words)?,
            allow_host: pinned(words)?,
            kept: alloc("selected lists", kept)?,
            kept_host: pinned(kept)?,
            kept_scores: alloc("selected scores", kept)?,
            kept_scores_host: pinned(kept)?,
            kept_counts: alloc("selected counts", nq)?,
            kept_counts_host: pinned(nq)?,
        })
    }

    fn fits(&self, values: usize, results: usize, nq: usize, words: usize, kept: usize) -> bool {
        self.kept.len() >= kept
            && self.queries.len() >= values
            && self.qrows.len() >= nq
            && self.out.len() >= results
            && self.status.len() >= nq
            && self.allow.len() >= words
    }
}

/// Seen-set slots of a walk of beam width `ef`: about 16 per beam node,
/// between 1,024 and 16,384 (a fuller table only costs second scorings).
fn table_slots(ef: usize) -> usize {
    (ef * 16).clamp(1 << 10, 1 << 14).next_power_of_two()
}

impl Engine {
    /// Checks `layout` against this engine's rows and uploads it.
    pub(crate) fn upload_graph(&self, layout: &GraphLayout<'_>) -> Result<DeviceGraph, CudaError> {
        if self.dtype() != Dtype::F32 {
            return Err(CudaError::BadGraph {
                reason: format!(
                    "the graph walk reads f32 rows; this corpus stores {}",
                    self.dtype()
                ),
            });
        }
        layout.check(self.len())?;
        let ctx = self.ctx();
        Ok(DeviceGraph {
            layer0: OwnedDevice::from_slice(ctx, layout.layer0)?,
            // A graph of one layer still passes a valid (unread) pointer.
            upper: OwnedDevice::from_slice(
                ctx,
                if layout.upper.is_empty() {
                    &[0]
                } else {
                    layout.upper
                },
            )?,
            upper_off: OwnedDevice::from_slice(ctx, layout.upper_offset)?,
            m0: layout.m0,
            m: layout.m,
            entry: layout.entry,
            top: layout.top(),
            n: self.len(),
            device: self.config.device,
            scratch: Mutex::new(None),
            ctx: Arc::clone(ctx),
        })
    }

    /// Walks `graph` for every row-major query: `want` results per query
    /// (into `hits`, `want` per query, valid where the status is
    /// [`WalkStatus::Done`]) with beam width `ef`, over the nodes whose bit
    /// is set in `allow` (`ceil(n / 32)` words) or all of them. With
    /// `select` (queries that are corpus rows, no allow-list) the results
    /// stay on the device and only the selection's lists come back; `hits`
    /// is left empty.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn walk_graph(
        &self,
        graph: &DeviceGraph,
        queries: WalkQueries<'_>,
        ef: usize,
        width: usize,
        want: usize,
        allow: Option<&[u32]>,
        hits: &mut Vec<Neighbor>,
        status: &mut Vec<WalkStatus>,
        mut select: Option<WalkSelect<'_>>,
    ) -> Result<(), CudaError> {
        let (n, d) = (self.len(), self.dim());
        if graph.device != self.config.device || graph.n != n {
            return Err(CudaError::InvalidOption {
                name: "graph nodes",
                value: graph.n,
                reason: "the graph was uploaded for another engine",
            });
        }
        let nq = match queries {
            WalkQueries::Values(v) => validate::queries_rowmajor(v, d)?,
            WalkQueries::Rows(rows) => {
                if let Some(bad) = crate::prune::out_of_range(rows, n) {
                    return Err(CudaError::InvalidOption {
                        name: "walk query row",
                        value: bad as usize,
                        reason: "must be a row of the engine's corpus",
                    });
                }
                rows.len()
            }
        };
        validate::k(want, n)?;
        if ef < want || ef > u32::MAX as usize {
            return Err(CudaError::InvalidOption {
                name: "ef",
                value: ef,
                reason: "must be at least the number of results asked for",
            });
        }
        let words = n.div_ceil(32);
        if let Some(a) = allow {
            if a.len() != words {
                return Err(CudaError::InvalidOption {
                    name: "allow-list words",
                    value: a.len(),
                    reason: "must be ceil(n / 32), one bit per node",
                });
            }
        }
        if let Some(sel) = &select {
            if !matches!(queries, WalkQueries::Rows(_)) || allow.is_some() {
                return Err(CudaError::InvalidOption {
                    name: "walk selection",
                    value: sel.cap,
                    reason: "needs corpus rows as the queries and no allow-list",
                });
            }
            if sel.cap == 0 || sel.cap > launch::PRUNE_MAX_CAP || want > launch::PRUNE_MAX_CANDS {
                return Err(CudaError::InvalidOption {
                    name: "walk selection",
                    value: sel.cap,
                    reason: "keeps 1 ..= 128 of at most 2,048 results",
                });
            }
        }
        hits.clear();
        status.clear();
        if let Some(sel) = select.as_mut() {
            sel.lists.clear();
            sel.scores.clear();
            sel.counts.clear();
        }
        if nq == 0 {
            return Ok(());
        }
        let cap = if allow.is_some() {
            ef.saturating_mul(FILTERED_CAP_FACTOR)
        } else {
            ef
        };
        let chunk = nq.min(WALK_CHUNK);
        let mut guard = graph.scratch.lock().unwrap_or_else(|p| p.into_inner());
        graph.ctx.make_current()?;
        let values = match queries {
            WalkQueries::Values(_) => chunk * d,
            WalkQueries::Rows(_) => 1,
        };
        let results = chunk * want;
        let allow_words = if allow.is_some() { words } else { 1 };
        let kept = select.as_ref().map_or(1, |sel| chunk * sel.cap);
        let sc = match &mut *guard {
            Some(s) if s.fits(values, results, chunk, allow_words, kept) => s,
            slot => {
                // The old buffers go before the larger ones are allocated.
                *slot = None;
                slot.insert(Scratch::new(values, results, chunk, allow_words, kept)?)
            }
        };
        let s = Queue::Stream(sc.stream.as_inner());
        if let Some(a) = allow {
            sc.allow_host.as_mut_slice()[..words].copy_from_slice(a);
            let dst = DevSlice::of(&sc.allow).range("walk allow-list", 0, words)?;
            launch::h2d(s, dst, &sc.allow_host, 0, words)?;
        }
        hits.reserve(nq * want);
        status.reserve(nq);
        for c in 0..nq.div_ceil(chunk) {
            let (at, cq) = (c * chunk, chunk.min(nq - c * chunk));
            let qdev = DevSlice::of(&sc.queries);
            let qrows = match queries {
                WalkQueries::Values(v) => {
                    let part = &v[at * d..(at + cq) * d];
                    sc.q_host.as_mut_slice()[..part.len()].copy_from_slice(part);
                    let dst = qdev.range("walk queries", 0, part.len())?;
                    launch::h2d(s, dst, &sc.q_host, 0, part.len())?;
                    None
                }
                WalkQueries::Rows(rows) => {
                    sc.qrows_host.as_mut_slice()[..cq].copy_from_slice(&rows[at..at + cq]);
                    let dst = DevSlice::of(&sc.qrows).range("walk query rows", 0, cq)?;
                    launch::h2d(s, dst, &sc.qrows_host, 0, cq)?;
                    Some(dst)
                }
            };
            let out = DevSlice::of(&sc.out).range("walk results", 0, cq * want)?;
            let st = DevSlice::of(&sc.status).range("walk status", 0, cq)?;
            let args = WalkArgs {
                corpus: self.corpus.view().as_f32("graph corpus")?,
                rnorm: DevSlice::of(&self.rnorm),
                n: n as u32,
                d: d as u32,
                queries: qdev,
                qrows,
                nq: cq as u32,
                graph: WalkGraph {
                    layer0: graph.layer0.view(),
                    m0: graph.m0 as u32,
                    upper: graph.upper.view(),
                    upper_off: graph.upper_off.view(),
                    m: graph.m as u32,
                    entry: graph.entry,
                    top: graph.top as u32,
                },
                allow: match allow {
                    Some(_) => Some(DevSlice::of(&sc.allow).range("walk allow-list", 0, words)?),
                    None => None,
                },
                ef: ef as u32,
                width: width as u32,
                want: want as u32,
                cap: cap.min(u32::MAX as usize) as u32,
                table_slots: table_slots(ef) as u32,
                seen: self.config.tuning.walk_seen,
                threads: self.config.tuning.walk_threads,
                out,
                status: st,
            };
            self.kernels.walk(s, self.metric(), &args)?;
            if let (Some(sel), Some(base)) = (select.as_mut(), qrows) {
                let kept = cq * sel.cap;
                let lists = DevSlice::of(&sc.kept).range("selected lists", 0, kept)?;
                let scores = DevSlice::of(&sc.kept_scores).range("selected scores", 0, kept)?;
                let counts = DevSlice::of(&sc.kept_counts).range("selected counts", 0, cq)?;
                let prune = PruneArgs {
                    corpus: args.corpus,
                    rnorm: args.rnorm,
                    n: n as u32,
                    d: d as u32,
                    base,
                    off: None,
                    uniform: want as u32,
                    cands: out.words(),
                    stride: 2,
                    status: Some(st),
                    jobs: cq as u32,
                    max_cands: want as u32,
                    cap: sel.cap as u32,
                    out: lists,
                    out_scores: Some(scores),
                    counts,
                };
                self.kernels.prune(s, self.metric(), &prune)?;
                launch::d2h(s, &mut sc.kept_host, lists)?;
                launch::d2h(s, &mut sc.kept_scores_host, scores)?;
                launch::d2h(s, &mut sc.kept_counts_host, counts)?;
            } else {
                launch::d2h(s, &mut sc.out_host, out)?;
            }
            launch::d2h(s, &mut sc.status_host, st)?;
            sc.stream.synchronize().op("cuStreamSynchronize")?;
            tracing::trace!(chunk = c, queries = cq, "walk chunk done");
            match select.as_mut() {
                Some(sel) => {
                    let kept = cq * sel.cap;
                    sel.lists
                        .extend_from_slice(&sc.kept_host.as_slice()[..kept]);
                    sel.scores
                        .extend_from_slice(&sc.kept_scores_host.as_slice()[..kept]);
                    sel.counts
                        .extend_from_slice(&sc.kept_counts_host.as_slice()[..cq]);
                }
                None => hits.extend(
                    sc.out_host.as_slice()[..cq * want]
                        .iter()
                        .map(|h| Neighbor::new(h.index, h.score)),
                ),
            }
            status.extend(
                sc.status_host.as_slice()[..cq]
                    .iter()
                    .map(|&code| WalkStatus::from_code(code)),
            );
        }
        Ok(())
    }
}

impl Engine {
    /// [`Engine::walk_graph`] of corpus rows with the selection of each
    /// finished walk ([`WalkSelect`]).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn walk_select_rows(
        &self,
        graph: &DeviceGraph,
        rows: &[u32],
        ef: usize,
        want: usize,
        cap: usize,
        lists: &mut Vec<u32>,
        scores: &mut Vec<f32>,
        counts: &mut Vec<u32>,
        status: &mut Vec<WalkStatus>,
    ) -> Result<(), CudaError> {
        let select = WalkSelect {
            cap,
            lists,
            scores,
            counts,
        };
        let mut hits = Vec::new();
        self.walk_graph(
            graph,
            WalkQueries::Rows(rows),
            ef,
            1,
            want,
            None,
            &mut hits,
            status,
            Some(select),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seen_tables_are_powers_of_two_in_range() {
        for ef in [1, 10, 64, 100, 1000, 5000] {
            let t = table_slots(ef);
            assert!(
                t.is_power_of_two() && (1024..=16384).contains(&t),
                "{ef}: {t}"
            );
        }
        assert_eq!(table_slots(64), 1024);
        assert_eq!(table_slots(100), 2048);
    }

    #[test]
    fn walk_status_codes_mirror_the_kernel() {
        let src = include_str!("../../../kernels/walk.cu");
        let code = |name: &str| {
            src.lines()
                .find_map(|l| l.strip_prefix(&format!("#define {name} ")))
                .and_then(|v| v.trim().trim_end_matches('u').parse::<u32>().ok())
                .unwrap_or_else(|| panic!("{name} not defined in walk.cu"))
        };
        assert_eq!(
            WalkStatus::from_code(code("WALK_STATUS_OK")),
            WalkStatus::Done
        );
        assert_eq!(
            WalkStatus::from_code(code("WALK_STATUS_OVERFLOW")),
            WalkStatus::Overflow
        );
        assert_eq!(
            WalkStatus::from_code(code("WALK_STATUS_SHORT")),
            WalkStatus::Short
        );
    }
}

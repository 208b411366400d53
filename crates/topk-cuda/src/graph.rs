//! The per-slot cache of query graphs: a single query's whole sequence
//! (query in, kernels, results out) built once per K and query source and
//! replayed with one launch, and the wait for its results by polling the
//! result header in mapped host memory.

use std::sync::atomic::Ordering;

use crate::device::DevNeighbor;
use crate::driver::{self, DPtr, DevSlice};
use crate::engine::Engine;
use crate::error::{CudaError, DriverResult};
use crate::launch::{self, GraphBuild, Queue, Replay, STATUS_PENDING};
use crate::slot::Slot;

/// Where the query of a graph comes from: the slot's pinned staging buffer
/// (copied in by the graph), or a device buffer of the caller's, read in
/// place at the address the graph was built for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum QuerySource {
    Host,
    Device(DPtr),
}

/// A graph is built for one K and one query source.
pub(crate) type GraphKey = (usize, QuerySource);

/// Query graphs kept per slot (one per K and query source in use).
const MAX_REPLAYS: usize = 8;
/// Device queries remembered until their second use, when they get a graph:
/// a caller that reuses a few query buffers gets graphs, one that cycles
/// through many never pays for building graphs it would not reuse.
const MAX_DEVICE_SEEN: usize = 4;

/// A slot's graphs and the device queries it has seen once.
#[derive(Default)]
pub(crate) struct GraphCache {
    /// Built query graphs by key (`None`: the driver could not build one),
    /// at most `MAX_REPLAYS`, oldest first.
    replays: Vec<(GraphKey, Option<Replay>)>,
    /// Device queries seen once and not yet given a graph, at most
    /// `MAX_DEVICE_SEEN`, oldest first.
    device_seen: Vec<GraphKey>,
}

impl GraphCache {
    /// Whether a device query with `key` should replay a graph: it has one,
    /// or this is the second use of its buffer since it was last seen (see
    /// `MAX_DEVICE_SEEN`); a first use is remembered.
    pub(crate) fn device_graph_wanted(&mut self, key: GraphKey) -> bool {
        let built = self.replays.iter().any(|(kk, _)| *kk == key);
        second_use(&mut self.device_seen, built, key)
    }
}

/// The rule of [`GraphCache::device_graph_wanted`] on the remembered keys
/// `seen` (at most `MAX_DEVICE_SEEN`, oldest first): true for a key with a
/// graph (`built`) or seen once before (then forgotten); otherwise the key
/// is remembered, dropping the oldest, and the answer is false.
fn second_use(seen: &mut Vec<GraphKey>, built: bool, key: GraphKey) -> bool {
    if built {
        return true;
    }
    if let Some(i) = seen.iter().position(|kk| *kk == key) {
        seen.remove(i);
        return true;
    }
    if seen.len() >= MAX_DEVICE_SEEN {
        seen.remove(0);
    }
    seen.push(key);
    false
}

impl Engine {
    /// One query with `key` as the slot's graph ([`Self::replay`]), waited
    /// for until its results are in `out_host`; false (nothing queued) where
    /// no graph could be built. `device` is the caller's query for a
    /// [`QuerySource::Device`] key.
    ///
    /// With results mapped into host memory the first row's header is
    /// marked pending before the launch and then polled: the selection
    /// writes it last, after a system-scope fence, so the rows are complete
    /// as soon as it changes, without waiting for the kernel to exit and the
    /// stream to report it. (The previous query on the slot wrote its
    /// header last too, so nothing overwrites the mark but this query's
    /// selection.) The stream is queried every 64 polls, so a failed launch
    /// still ends the wait with its error. Otherwise the stream is
    /// synchronised. Work the kernel does after the header (its blocks
    /// exiting) finishes before anything queued next on the slot's stream.
    pub(crate) fn run_graph(
        &self,
        slot: &mut Slot,
        key: GraphKey,
        device: Option<DevSlice<'_, f32>>,
    ) -> Result<bool, CudaError> {
        if slot.mapped() {
            slot.out_host.as_mut_slice()[0] = DevNeighbor::new(STATUS_PENDING, 0.0);
        }
        if !self.replay(slot, key, device)? {
            return Ok(false);
        }
        if !slot.mapped() {
            slot.stream.synchronize().op("cuStreamSynchronize")?;
            return Ok(true);
        }
        let mut polls: u32 = 0;
        loop {
            polls = polls.wrapping_add(1);
            // Whether the stream has finished, asked every 64 polls; the
            // header is read after the answer, so a finished stream with no
            // header is a real absence.
            let finished = polls % 64 == 0 && driver::stream_done(&slot.stream)?;
            if driver::read_header(&slot.out_host) != STATUS_PENDING {
                // The rows were written before the header.
                std::sync::atomic::fence(Ordering::Acquire);
                return Ok(true);
            }
            if finished {
                return Err(CudaError::Driver {
                    op: "topk_select",
                    reason: "the query's kernels finished without writing its results".to_owned(),
                });
            }
            std::hint::spin_loop();
        }
    }

    /// Queues the slot's query graph for `key`, built on first use, and
    /// returns true; false where the driver could not build it (remembered,
    /// and logged at debug level): the caller then queues the steps itself.
    fn replay(
        &self,
        slot: &mut Slot,
        key: GraphKey,
        device: Option<DevSlice<'_, f32>>,
    ) -> Result<bool, CudaError> {
        let i = match slot.graphs.replays.iter().position(|(kk, _)| *kk == key) {
            Some(i) => i,
            None => {
                if slot.graphs.replays.len() >= MAX_REPLAYS {
                    // The last launch may still be finishing after its
                    // results (`run_graph`): let it end before a graph
                    // is destroyed (rare: only past MAX_REPLAYS keys).
                    slot.stream.synchronize().op("cuStreamSynchronize")?;
                    slot.graphs.replays.remove(0);
                }
                let replay = self
                    .build_graph(slot, key, device)
                    .map_err(|e| {
                        tracing::debug!(?key, "query graph not built ({e}); queueing its steps")
                    })
                    .ok();
                slot.graphs.replays.push((key, replay));
                slot.graphs.replays.len() - 1
            }
        };
        match &slot.graphs.replays[i].1 {
            Some(r) => r.launch(slot.stream.as_inner()).map(|()| true),
            None => Ok(false),
        }
    }

    /// One query with `k` on `slot`'s buffers as a graph: for a host query
    /// the copy from the pinned staging buffer (or the fetch from it where
    /// it is mapped), then every kernel (reading a device query where it
    /// lies), then the result copy.
    fn build_graph(
        &self,
        slot: &mut Slot,
        key: GraphKey,
        device: Option<DevSlice<'_, f32>>,
    ) -> Result<Replay, CudaError> {
        let (k, source) = key;
        let graph = GraphBuild::new()?;
        let s = Queue::Graph(&graph);
        let d = self.dim();
        let query = match (source, device) {
            (QuerySource::Host, _) => {
                let dst = slot.queries_at(d, 0, 1)?;
                match slot.q_mapped {
                    Some(src) => self.kernels.fetch_query(s, src, dst, d as u32)?,
                    None => launch::h2d(s, dst, &slot.q_host, 0, d)?,
                }
                dst
            }
            // The caller's buffer of d floats: replayed only for a query of
            // that length at this very address (`search_device`).
            (QuerySource::Device(p), Some(view)) if view.ptr() == p => view,
            (QuerySource::Device(_), _) => {
                return Err(CudaError::Driver {
                    op: "cuGraphAddKernelNode",
                    reason: "a device query graph needs the query's buffer".to_owned(),
                })
            }
        };
        let plan = self.planner.canonical(k, 1);
        self.enqueue_marked(slot, s, plan, query, 0, 1, k, &mut |_| Ok(()))?;
        Self::copy_results(slot, s, 1, k)?;
        graph.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(k: usize, p: DPtr) -> GraphKey {
        (k, QuerySource::Device(p))
    }

    #[test]
    fn a_device_buffer_gets_a_graph_on_its_second_use() {
        let mut seen = Vec::new();
        assert!(!second_use(&mut seen, false, dev(10, 0x1000)));
        assert!(second_use(&mut seen, false, dev(10, 0x1000)));
        assert!(seen.is_empty());
        // Another K is another graph.
        assert!(!second_use(&mut seen, false, dev(11, 0x1000)));
        // A built graph is always replayed and nothing is remembered.
        assert!(second_use(&mut seen, true, dev(10, 0x1000)));
        assert_eq!(seen, vec![dev(11, 0x1000)]);
    }

    #[test]
    fn a_caller_cycling_through_many_buffers_never_builds_graphs() {
        let mut seen = Vec::new();
        for round in 0..3 {
            for b in 0..(MAX_DEVICE_SEEN as u64 + 1) {
                let key = dev(10, 0x1000 * (b + 1));
                assert!(
                    !second_use(&mut seen, false, key),
                    "round {round} buffer {b}"
                );
                assert!(seen.len() <= MAX_DEVICE_SEEN);
            }
        }
        // Up to MAX_DEVICE_SEEN buffers in turn do get graphs.
        let mut seen = Vec::new();
        let keys: Vec<GraphKey> = (0..MAX_DEVICE_SEEN as u64)
            .map(|b| dev(10, 0x1000 * (b + 1)))
            .collect();
        assert!(keys.iter().all(|&k| !second_use(&mut seen, false, k)));
        assert!(keys.iter().all(|&k| second_use(&mut seen, false, k)));
    }
}

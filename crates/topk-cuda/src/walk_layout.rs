//! The layered graph [`crate::CudaRetriever::upload_graph`] takes, and the
//! host check that makes every read of the device walk land inside it.
//!
//! The layout is topk-hnsw's (crates/topk-hnsw/src/graph.rs): layer 0 is one
//! block of `1 + m0` slots per node (a count, then the neighbour ids); a node
//! on layers `1..=L` owns `L` consecutive blocks of `1 + m` slots in a second
//! array, the first at `upper_offset[node]`.

use crate::error::CudaError;

/// Largest neighbour-list capacity (`m0`, `m`) the device walk takes.
pub const MAX_WALK_DEGREE: usize = 128;

/// A layered proximity graph over rows `0..n` of an engine, borrowed for
/// the upload.
#[derive(Debug, Clone, Copy)]
pub struct GraphLayout<'a> {
    /// `n × (1 + m0)` slots: per node, the count of its layer-0 neighbours,
    /// then their ids.
    pub layer0: &'a [u32],
    /// Capacity of a layer-0 list.
    pub m0: usize,
    /// The upper layers' blocks of `1 + m` slots.
    pub upper: &'a [u32],
    /// Per node, the start of its first upper block in `upper`.
    pub upper_offset: &'a [u32],
    /// Per node, its top layer.
    pub levels: &'a [u8],
    /// Capacity of an upper-layer list.
    pub m: usize,
    /// The node every walk starts from (on the top layer).
    pub entry: u32,
}

/// The queries of a graph walk: row-major values of the corpus dimension,
/// or rows of the engine's own corpus (each below its row count), read in
/// place on the device.
#[derive(Debug, Clone, Copy)]
pub enum WalkQueries<'a> {
    /// `nq × D` values, row-major.
    Values(&'a [f32]),
    /// Corpus row ids.
    Rows(&'a [u32]),
}

/// Jobs of the batched build's neighbour selection
/// ([`crate::CudaRetriever::prune_lists`]): job `j` is node `base[j]` and
/// its candidates `candidates[offsets[j] .. offsets[j + 1]]`, distinct rows
/// of the engine's corpus.
#[derive(Debug, Clone, Copy)]
pub struct PruneJobs<'a> {
    /// The node of each job.
    pub base: &'a [u32],
    /// `base.len() + 1` increasing offsets into `candidates`, from 0.
    pub offsets: &'a [u32],
    /// Every job's candidates, one after the other.
    pub candidates: &'a [u32],
}

/// How the device ended the walk of one query.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WalkStatus {
    /// The walk finished; its results are the answer.
    Done,
    /// The beam needed more room than the device gives it (only with an
    /// allow-list that excludes many of the nodes it reached): the caller
    /// must run this query's walk on the host.
    Overflow,
    /// The walk ended with fewer allowed nodes than asked for: the caller
    /// completes this query on the host.
    Short,
}

impl WalkStatus {
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn from_code(code: u32) -> Self {
        match code {
            0 => WalkStatus::Done,
            1 => WalkStatus::Overflow,
            _ => WalkStatus::Short,
        }
    }
}

fn bad(reason: String) -> CudaError {
    CudaError::BadGraph { reason }
}

impl GraphLayout<'_> {
    /// The highest layer (the entry node's).
    pub fn top(&self) -> usize {
        self.levels
            .get(self.entry as usize)
            .map_or(0, |&l| usize::from(l))
    }

    /// Checks that this is a graph over `n` nodes that the walk can read
    /// without leaving it: the array sizes, every count within its list's
    /// capacity, every id below `n`, every upper block inside `upper`, every
    /// neighbour on layer `l` a node of layer `l` or above, the entry on the
    /// top layer, and `m0`, `m` at most [`MAX_WALK_DEGREE`].
    pub fn check(&self, n: usize) -> Result<(), CudaError> {
        if n == 0 || n >= u32::MAX as usize {
            return Err(bad(format!("{n} nodes: need 1 ..= 2^32 - 2")));
        }
        for (name, cap) in [("m0", self.m0), ("m", self.m)] {
            if cap == 0 || cap > MAX_WALK_DEGREE {
                return Err(bad(format!(
                    "{name} = {cap}: the device walk takes lists of 1..={MAX_WALK_DEGREE}"
                )));
            }
        }
        let want0 = n * (1 + self.m0);
        if self.layer0.len() != want0 {
            return Err(bad(format!(
                "layer 0 has {} slots; {n} nodes of 1 + m0 = {} need {want0}",
                self.layer0.len(),
                1 + self.m0
            )));
        }
        for (name, len) in [
            ("upper offsets", self.upper_offset.len()),
            ("levels", self.levels.len()),
        ] {
            if len != n {
                return Err(bad(format!("{len} {name} for {n} nodes")));
            }
        }
        if self.upper.len() >= u32::MAX as usize {
            return Err(bad(format!(
                "{} upper-layer slots: at most 2^32 - 2",
                self.upper.len()
            )));
        }
        if self.entry as usize >= n {
            return Err(bad(format!(
                "entry node {} of a graph of {n} nodes",
                self.entry
            )));
        }
        let top = self.top();
        if let Some((node, &l)) = self
            .levels
            .iter()
            .enumerate()
            .find(|(_, &l)| usize::from(l) > top)
        {
            return Err(bad(format!(
                "node {node} is on layer {l}, above the entry's top layer {top}"
            )));
        }
        let stride = 1 + self.m;
        for node in 0..n {
            let list = &self.layer0[node * (1 + self.m0)..(node + 1) * (1 + self.m0)];
            self.check_list(n, node, 0, list, self.m0)?;
            let levels = usize::from(self.levels[node]);
            let start = self.upper_offset[node] as usize;
            let end = start + levels * stride;
            if levels > 0 && end > self.upper.len() {
                return Err(bad(format!(
                    "node {node}'s {levels} upper blocks end at slot {end}, past the {} slots",
                    self.upper.len()
                )));
            }
            for level in 1..=levels {
                let at = start + (level - 1) * stride;
                self.check_list(n, node, level, &self.upper[at..at + stride], self.m)?;
            }
        }
        Ok(())
    }

    fn check_list(
        &self,
        n: usize,
        node: usize,
        level: usize,
        list: &[u32],
        cap: usize,
    ) -> Result<(), CudaError> {
        let count = list[0] as usize;
        if count > cap {
            return Err(bad(format!(
                "node {node} has {count} neighbours on layer {level}, capacity {cap}"
            )));
        }
        for &id in &list[1..1 + count] {
            if id as usize >= n {
                return Err(bad(format!(
                    "node {node} lists neighbour {id} on layer {level}, past the {n} nodes"
                )));
            }
            if level > 0 && usize::from(self.levels[id as usize]) < level {
                return Err(bad(format!(
                    "node {node} lists neighbour {id} on layer {level}, but {id} tops out at layer {}",
                    self.levels[id as usize]
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Three nodes, m0 = 2, m = 1: node 2 on layer 1 (the entry), 0 and 1
    /// on layer 0 only.
    fn parts() -> (Vec<u32>, Vec<u32>, Vec<u32>, Vec<u8>) {
        let layer0 = vec![2, 1, 2, 1, 0, 0, 1, 0, 0];
        let upper = vec![0, 0];
        (layer0, upper, vec![0, 0, 0], vec![0, 0, 1])
    }

    fn layout<'a>(p: &'a (Vec<u32>, Vec<u32>, Vec<u32>, Vec<u8>)) -> GraphLayout<'a> {
        GraphLayout {
            layer0: &p.0,
            m0: 2,
            upper: &p.1,
            upper_offset: &p.2,
            levels: &p.3,
            m: 1,
            entry: 2,
        }
    }

    fn reason(e: CudaError) -> String {
        match e {
            CudaError::BadGraph { reason } => reason,
            other => panic!("expected BadGraph, got {other:?}"),
        }
    }

    #[test]
    fn a_well_formed_graph_passes() {
        let p = parts();
        layout(&p).check(3).unwrap();
        assert_eq!(layout(&p).top(), 1);
    }

    #[test]
    fn every_malformation_is_named() {
        let p = parts();
        assert!(reason(layout(&p).check(4).unwrap_err()).contains("layer 0 has 9 slots"));
        let mut q = parts();
        q.0[3] = 3;
        assert!(reason(layout(&q).check(3).unwrap_err()).contains("3 neighbours on layer 0"));
        let mut q = parts();
        q.0[1] = 7;
        assert!(reason(layout(&q).check(3).unwrap_err()).contains("neighbour 7"));
        let mut q = parts();
        q.2[2] = 1;
        assert!(reason(layout(&q).check(3).unwrap_err()).contains("upper blocks end at slot 3"));
        let mut q = parts();
        q.1 = vec![1, 0];
        assert!(reason(layout(&q).check(3).unwrap_err()).contains("tops out at layer 0"));
        let mut q = parts();
        q.3[0] = 2;
        assert!(reason(layout(&q).check(3).unwrap_err()).contains("above the entry's top layer"));
        let mut l = layout(&p);
        l.entry = 3;
        assert!(reason(l.check(3).unwrap_err()).contains("entry node 3"));
        let mut l = layout(&p);
        l.m0 = 200;
        assert!(reason(l.check(3).unwrap_err()).contains("m0 = 200"));
        assert!(reason(layout(&p).check(0).unwrap_err()).contains("0 nodes"));
        assert!(reason(
            GraphLayout {
                levels: &p.3[..2],
                ..layout(&p)
            }
            .check(3)
            .unwrap_err()
        )
        .contains("2 levels for 3 nodes"));
    }
}

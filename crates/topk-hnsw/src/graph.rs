//! Neighbour-list storage: flat arrays, one fixed-size block per node and layer.
//!
//! Layer 0 holds every node, so its lists live in one array with a stride of
//! `1 + m0` slots (a count, then the ids): node `i`'s list starts at
//! `i · (1 + m0)`, with no indirection, as in hnswlib. Upper layers hold few
//! nodes; a node on layers `1..=L` owns `L` consecutive blocks of `1 + m`
//! slots in a second array, located through a per-node offset.
//!
//! The storage is generic over the slot type: the builder writes through
//! `AtomicU32` slots (so that parallel insertion stays in safe Rust, with a
//! lock per node serialising writers), and the finished index reads plain `u32`.

use std::sync::atomic::{AtomicU32, Ordering};

/// One slot of a neighbour list.
pub(crate) trait Slot: Send + Sync {
    fn get(&self) -> u32;
}

impl Slot for u32 {
    #[inline]
    fn get(&self) -> u32 {
        *self
    }
}

impl Slot for AtomicU32 {
    #[inline]
    fn get(&self) -> u32 {
        // Pairs with the release store of the count in `Links::<AtomicU32>::set`.
        self.load(Ordering::Acquire)
    }
}

/// Where each node's lists sit; derived from the node levels alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Layout {
    pub(crate) m: usize,
    pub(crate) m0: usize,
    pub(crate) levels: Vec<u8>,
    /// Start of node `i`'s first upper-layer block in the upper array.
    upper_offset: Vec<usize>,
    upper_len: usize,
}

impl Layout {
    pub(crate) fn new(m: usize, m0: usize, levels: Vec<u8>) -> Self {
        let mut upper_offset = Vec::with_capacity(levels.len());
        let mut at = 0usize;
        for &l in &levels {
            upper_offset.push(at);
            at += usize::from(l) * (1 + m);
        }
        Layout {
            m,
            m0,
            levels,
            upper_offset,
            upper_len: at,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.levels.len()
    }

    /// Appends a node on `level`; its upper blocks go after every existing one.
    pub(crate) fn push(&mut self, level: u8) {
        self.upper_offset.push(self.upper_len);
        self.upper_len += usize::from(level) * (1 + self.m);
        self.levels.push(level);
    }

    pub(crate) fn layer0_len(&self) -> usize {
        self.levels.len() * (1 + self.m0)
    }

    pub(crate) fn upper_len(&self) -> usize {
        self.upper_len
    }

    /// Per node, the start of its first upper-layer block (what the GPU
    /// walk's upload sends).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn upper_offsets(&self) -> &[usize] {
        &self.upper_offset
    }

    /// Capacity of a list on `level`.
    #[inline]
    pub(crate) fn cap(&self, level: usize) -> usize {
        if level == 0 {
            self.m0
        } else {
            self.m
        }
    }

    #[inline]
    pub(crate) fn level(&self, node: u32) -> usize {
        usize::from(self.levels[node as usize])
    }
}

/// Neighbour lists of every node on every layer.
#[derive(Debug, Clone)]
pub(crate) struct Links<S> {
    pub(crate) layout: Layout,
    pub(crate) layer0: Vec<S>,
    pub(crate) upper: Vec<S>,
}

impl<S: Slot> Links<S> {
    /// The block (count slot + capacity id slots) of `node` on `level`.
    /// `level` must not exceed the node's level.
    #[inline]
    fn block(&self, node: u32, level: usize) -> &[S] {
        if level == 0 {
            let stride = 1 + self.layout.m0;
            let start = node as usize * stride;
            &self.layer0[start..start + stride]
        } else {
            let stride = 1 + self.layout.m;
            let start = self.layout.upper_offset[node as usize] + (level - 1) * stride;
            &self.upper[start..start + stride]
        }
    }

    /// Copies the neighbours of `node` on `level` into `out` (replacing it).
    ///
    /// Copying keeps a concurrent writer from changing the list under the
    /// caller; the count is clamped so a torn read can never index past the block.
    #[inline]
    pub(crate) fn neighbours_into(&self, node: u32, level: usize, out: &mut Vec<u32>) {
        let block = self.block(node, level);
        let count = (block[0].get() as usize).min(block.len() - 1);
        out.clear();
        out.extend(block[1..1 + count].iter().map(Slot::get));
    }
}

impl Links<u32> {
    /// The count slot of a list as stored, before clamping (for file checks).
    pub(crate) fn stored_count(&self, node: u32, level: usize) -> usize {
        self.block(node, level)[0] as usize
    }

    /// Replaces the list of `node` on `level` (at most the layer's capacity).
    pub(crate) fn set(&mut self, node: u32, level: usize, ids: &[u32]) {
        let block = self.block_mut(node, level);
        debug_assert!(ids.len() < block.len());
        let count = ids.len().min(block.len() - 1);
        block[1..1 + count].copy_from_slice(&ids[..count]);
        block[0] = count as u32;
    }

    /// The layer-0 blocks (count slot + `m0` id slots) of `nodes`, which
    /// must be strictly increasing, each one mutable on its own (so that
    /// they can be filled in parallel).
    pub(crate) fn layer0_blocks_mut(&mut self, nodes: &[u32]) -> Vec<&mut [u32]> {
        debug_assert!(nodes.windows(2).all(|w| w[0] < w[1]));
        let stride = 1 + self.layout.m0;
        let mut out = Vec::with_capacity(nodes.len());
        let (mut rest, mut at) = (&mut self.layer0[..], 0usize);
        for &v in nodes {
            let start = v as usize * stride;
            let (_, tail) = std::mem::take(&mut rest).split_at_mut(start - at);
            let (block, tail) = tail.split_at_mut(stride);
            out.push(block);
            rest = tail;
            at = start + stride;
        }
        out
    }

    /// Appends a node on `level` with empty lists.
    pub(crate) fn push_node(&mut self, level: u8) {
        self.layout.push(level);
        self.layer0.resize(self.layout.layer0_len(), 0);
        self.upper.resize(self.layout.upper_len(), 0);
    }

    fn block_mut(&mut self, node: u32, level: usize) -> &mut [u32] {
        if level == 0 {
            let stride = 1 + self.layout.m0;
            let start = node as usize * stride;
            &mut self.layer0[start..start + stride]
        } else {
            let stride = 1 + self.layout.m;
            let start = self.layout.upper_offset[node as usize] + (level - 1) * stride;
            &mut self.upper[start..start + stride]
        }
    }

    /// The neighbours of `node` on `level`, borrowed (finished index only).
    #[inline]
    pub(crate) fn neighbours(&self, node: u32, level: usize) -> &[u32] {
        let block = self.block(node, level);
        let count = (block[0] as usize).min(block.len() - 1);
        &block[1..1 + count]
    }
}

impl Links<AtomicU32> {
    /// Empty lists for the given layout.
    pub(crate) fn empty(layout: Layout) -> Self {
        let layer0 = (0..layout.layer0_len())
            .map(|_| AtomicU32::new(0))
            .collect();
        let upper = (0..layout.upper_len()).map(|_| AtomicU32::new(0)).collect();
        Links {
            layout,
            layer0,
            upper,
        }
    }

    /// Replaces the list of `node` on `level`. Callers hold the node's lock, so
    /// writers never interleave; readers copy without it (see `neighbours_into`).
    pub(crate) fn set(&self, node: u32, level: usize, ids: &[u32]) {
        let block = self.block(node, level);
        debug_assert!(ids.len() < block.len());
        for (slot, &id) in block[1..].iter().zip(ids) {
            slot.store(id, Ordering::Relaxed);
        }
        block[0].store(ids.len() as u32, Ordering::Release);
    }

    /// The finished, plain-integer storage.
    pub(crate) fn freeze(self) -> Links<u32> {
        Links {
            layout: self.layout,
            layer0: self.layer0.into_iter().map(AtomicU32::into_inner).collect(),
            upper: self.upper.into_iter().map(AtomicU32::into_inner).collect(),
        }
    }
}

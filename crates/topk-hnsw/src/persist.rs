//! Saving and loading an index: one self-contained little-endian file.
//!
//! The file stores the corpus rows with the graph, so loading needs nothing
//! else and can never pair a graph with the wrong corpus (the failure mode of
//! index files that reference external data). Cosine row norms are not
//! stored: they are recomputed from the rows with the canonical score.
//!
//! | offset | size | field |
//! | --- | --- | --- |
//! | 0 | 8 | magic `TOPKHNSW` |
//! | 8 | 4 | format version (2; version 1 files are still read) |
//! | 12 | 4 | metric (0 dot, 1 cosine, 2 l2) |
//! | 16 | 8 × 7 | dim, n, m, m0, ef_construction, ef_search, seed |
//! | 72 | 4 + 4 | entry node, top layer |
//! | 80 | 8 + 8 | upper-layer slot count, payload length in bytes |
//! | 96 | 4 | CRC-32 of bytes 0..96 |
//! | 100 | payload | levels (n × u8), layer-0 slots (n·(1+m0) × u32), upper slots (u32), rows (n·dim × f32), then the lifecycle section |
//! | end − 4 | 4 | CRC-32 of the payload |
//!
//! The lifecycle section (version 2) closes the payload: the level
//! generator's state (u64), the number of deleted slots `f` (u64), and the
//! deleted slots in reuse order (`f` × u32). It holds the deletion marks (a
//! slot is deleted exactly when it is listed) and the free-slot order, so a
//! loaded index answers and inserts exactly as the saved one would. A
//! version 1 file has no such section; it opens as an index without
//! deletions whose level stream continues after the build's `n` draws (the
//! state a version 1 writer had).
//!
//! Loading checks, in order: magic, version, header checksum, the header's
//! declared sizes against each other and against the file length, the
//! payload checksum, and then every structural invariant the search relies
//! on (list counts within capacity, ids in range, each neighbour present on
//! the layer it is linked on, the entry on the top layer, finite rows). A
//! file that fails any check is a typed error; none can cause a panic or an
//! index that answers wrongly.

use std::io::Read;
use std::path::Path;

use topk_core::{validate, Metric};

use crate::build::Graph;
use crate::error::{HnswError, Result};
use crate::graph::{Layout, Links};
use crate::index::Hnsw;
use crate::params::{rng_after, HnswParams, SplitMix64, MAX_LEVEL};
use crate::vectors::Vectors;

/// First bytes of every index file.
pub const MAGIC: &[u8; 8] = b"TOPKHNSW";
/// The format version this build writes; it reads this one and version 1.
pub const FORMAT_VERSION: u32 = 2;
/// Bytes of the lifecycle section before its slot list.
const LIFECYCLE_FIXED: u64 = 16;
const HEADER_LEN: usize = 96;
const PAYLOAD_START: usize = HEADER_LEN + 4;

fn metric_code(m: Metric) -> u32 {
    m as u32
}

/// The checks that need only the header (`head`, the file's first bytes)
/// and the file's length `got`: the magic, the version, the header's CRC,
/// and the length the header declares.
fn check_head(head: &[u8], got: u64) -> Result<()> {
    let magic_len = head.len().min(MAGIC.len());
    if head[..magic_len] != MAGIC[..magic_len] {
        return Err(HnswError::BadMagic {
            found: head[..magic_len].to_vec(),
            expected: MAGIC,
        });
    }
    if got < (PAYLOAD_START + 4) as u64 || head.len() < PAYLOAD_START {
        return Err(HnswError::Truncated {
            expected: (PAYLOAD_START + 4) as u64,
            got,
        });
    }
    let version = u32_at(head, MAGIC.len());
    if version != FORMAT_VERSION && version != 1 {
        return Err(HnswError::UnsupportedVersion {
            found: version,
            supported: FORMAT_VERSION,
        });
    }
    let stored = u32_at(head, HEADER_LEN);
    let computed = crc32fast::hash(&head[..HEADER_LEN]);
    if stored != computed {
        return Err(HnswError::ChecksumMismatch {
            part: "header",
            stored,
            computed,
        });
    }
    let payload_len = u64::from_le_bytes(
        head[HEADER_LEN - 8..HEADER_LEN]
            .try_into()
            .map_err(|_| corrupt("header too short".to_owned()))?,
    );
    let total = (PAYLOAD_START as u64)
        .checked_add(payload_len)
        .and_then(|t| t.checked_add(4))
        .ok_or_else(|| corrupt(format!("payload length {payload_len} overflows")))?;
    if got < total {
        return Err(HnswError::Truncated {
            expected: total,
            got,
        });
    }
    if got > total {
        return Err(HnswError::TrailingBytes {
            expected: total,
            extra: got - total,
        });
    }
    Ok(())
}

fn metric_from_code(c: u32) -> Option<Metric> {
    Metric::ALL.into_iter().find(|m| *m as u32 == c)
}

impl Hnsw {
    /// Writes the index to `path` as one checksummed file, atomically: a
    /// temporary file in the same folder is written, synced and renamed over
    /// `path`, so a failure (a full disk) leaves any previous file in place.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let io = |source| HnswError::Io {
            path: path.to_path_buf(),
            source,
        };
        topk_io::write_whole(path, &self.to_bytes()).map_err(io)
    }

    /// Reads an index written by [`Hnsw::save`]. A path that is not a
    /// regular file (a FIFO, a folder) is refused without blocking.
    pub fn load(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let io = |source| HnswError::Io {
            path: path.to_path_buf(),
            source,
        };
        let in_file = |e: HnswError| HnswError::File {
            path: path.to_path_buf(),
            source: Box::new(e),
        };
        let (file, len) = topk_io::open_regular_file(path).map_err(io)?;
        // The header first: a file that is not an index, or whose length is
        // not the one its header declares, is refused before the rest is
        // read (a 100 GiB file of something else costs no memory).
        let mut head = Vec::with_capacity(PAYLOAD_START);
        (&file)
            .take(PAYLOAD_START as u64)
            .read_to_end(&mut head)
            .map_err(io)?;
        check_head(&head, len).map_err(in_file)?;
        let mut bytes = Vec::new();
        let count = usize::try_from(len).unwrap_or(usize::MAX);
        topk_io::memory::reserve(&mut bytes, count).map_err(|want| {
            io(std::io::Error::new(
                std::io::ErrorKind::OutOfMemory,
                format!("{want} bytes do not fit in this machine's memory"),
            ))
        })?;
        bytes.extend_from_slice(&head);
        (&file).read_to_end(&mut bytes).map_err(io)?;
        Self::from_bytes(&bytes).map_err(in_file)
    }

    /// The file image of the index.
    pub fn to_bytes(&self) -> Vec<u8> {
        let links = &self.graph.links;
        let layout = &links.layout;
        let n = layout.len();
        let dim = self.vectors.dim();
        let payload_len = n
            + 4 * (links.layer0.len() + links.upper.len())
            + 4 * n * dim
            + LIFECYCLE_FIXED as usize
            + 4 * self.free.len();
        let mut out = Vec::with_capacity(PAYLOAD_START + payload_len + 4);

        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        out.extend_from_slice(&metric_code(self.vectors.metric()).to_le_bytes());
        for v in [
            dim,
            n,
            self.params.m,
            layout.m0,
            self.params.ef_construction,
            self.params.ef_search,
        ] {
            out.extend_from_slice(&(v as u64).to_le_bytes());
        }
        out.extend_from_slice(&self.params.seed.to_le_bytes());
        out.extend_from_slice(&self.graph.entry.to_le_bytes());
        out.extend_from_slice(&(self.graph.max_level as u32).to_le_bytes());
        out.extend_from_slice(&(links.upper.len() as u64).to_le_bytes());
        out.extend_from_slice(&(payload_len as u64).to_le_bytes());
        debug_assert_eq!(out.len(), HEADER_LEN);
        let header_crc = crc32fast::hash(&out);
        out.extend_from_slice(&header_crc.to_le_bytes());

        out.extend_from_slice(&layout.levels);
        for &s in links.layer0.iter().chain(&links.upper) {
            out.extend_from_slice(&s.to_le_bytes());
        }
        for &v in self.vectors.data() {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&self.rng.state().to_le_bytes());
        out.extend_from_slice(&(self.free.len() as u64).to_le_bytes());
        for &slot in &self.free {
            out.extend_from_slice(&slot.to_le_bytes());
        }
        let payload_crc = crc32fast::hash(&out[PAYLOAD_START..]);
        out.extend_from_slice(&payload_crc.to_le_bytes());
        out
    }

    /// Parses and checks a file image (see the module docs for the checks).
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        // The magic, version, header CRC and declared length.
        check_head(bytes, bytes.len() as u64)?;
        let mut h = Reader::new(&bytes[..PAYLOAD_START]);
        h.skip(MAGIC.len());
        let version = h.u32();

        let metric_raw = h.u32();
        let metric = metric_from_code(metric_raw)
            .ok_or_else(|| corrupt(format!("unknown metric code {metric_raw}")))?;
        let dim = h.u64();
        let n = h.u64();
        let m = h.u64();
        let m0 = h.u64();
        let ef_construction = h.u64();
        let ef_search = h.u64();
        let seed = h.u64();
        let entry = h.u32();
        let max_level = h.u32() as usize;
        let upper_len = h.u64();
        let payload_len = h.u64();

        let params = HnswParams {
            m: to_usize(m, "m")?,
            ef_construction: to_usize(ef_construction, "ef_construction")?,
            ef_search: to_usize(ef_search, "ef_search")?,
            seed,
            ..HnswParams::default()
        };
        params
            .validate()
            .map_err(|e| corrupt(format!("stored parameters rejected: {e}")))?;
        if m0 != 2 * m {
            return Err(corrupt(format!("m0 = {m0} is not 2·m = {}", 2 * m)));
        }
        if dim == 0 || n == 0 || n > validate::MAX_ROWS as u64 {
            return Err(corrupt(format!("corpus shape n = {n}, dim = {dim}")));
        }
        if max_level > MAX_LEVEL {
            return Err(corrupt(format!(
                "top layer {max_level} exceeds {MAX_LEVEL}"
            )));
        }
        let expected_payload = (|| {
            let layer0 = n.checked_mul(m0.checked_add(1)?)?;
            let slots = layer0.checked_add(upper_len)?.checked_mul(4)?;
            let rows = n.checked_mul(dim)?.checked_mul(4)?;
            n.checked_add(slots)?.checked_add(rows)
        })()
        .ok_or_else(|| corrupt(format!("sizes overflow: n = {n}, dim = {dim}, m0 = {m0}")))?;
        // Version 2 appends the lifecycle section, whose slot list is sized
        // by the payload length (its stored count is checked against it).
        let free_len = if version == 1 {
            if expected_payload != payload_len {
                return Err(corrupt(format!(
                    "payload length {payload_len} does not match the {expected_payload} bytes its sizes imply"
                )));
            }
            0
        } else {
            let fixed = expected_payload
                .checked_add(LIFECYCLE_FIXED)
                .ok_or_else(|| corrupt(format!("sizes overflow: n = {n}, dim = {dim}")))?;
            if payload_len < fixed
                || (payload_len - fixed) % 4 != 0
                || (payload_len - fixed) / 4 > n
            {
                return Err(corrupt(format!(
                    "payload length {payload_len} does not match the {fixed} bytes its sizes imply plus 4 per deleted slot (at most n = {n})"
                )));
            }
            (payload_len - fixed) / 4
        };
        // From here every size fits in memory: the file holds them all
        // (its length is the declared one, checked above).
        let end = bytes.len() - 4;
        let stored = u32_at(bytes, end);
        let computed = crc32fast::hash(&bytes[PAYLOAD_START..end]);
        if stored != computed {
            return Err(HnswError::ChecksumMismatch {
                part: "payload",
                stored,
                computed,
            });
        }

        let (n, dim, m0) = (n as usize, dim as usize, m0 as usize);
        let mut p = Reader::new(&bytes[PAYLOAD_START..end]);
        let levels = p.take(n).to_vec();
        let layout = Layout::new(params.m, m0, levels);
        if layout.upper_len() as u64 != upper_len {
            return Err(corrupt(format!(
                "upper-layer slot count {upper_len} does not match the {} the levels imply",
                layout.upper_len()
            )));
        }
        let layer0 = p.u32s(layout.layer0_len());
        let upper = p.u32s(layout.upper_len());
        let data = p.f32s(n * dim);
        let (rng_state, free) = if version == 1 {
            (rng_after(params.seed, n).state(), Vec::new())
        } else {
            let state = p.u64();
            let stored = p.u64();
            if stored != free_len {
                return Err(corrupt(format!(
                    "{stored} deleted slots declared, the payload holds {free_len}"
                )));
            }
            (state, p.u32s(free_len as usize))
        };
        let links = Links {
            layout,
            layer0,
            upper,
        };
        check_graph(&links, entry, max_level)?;
        validate::corpus(&data, dim).map_err(|e| corrupt(format!("stored rows: {e}")))?;
        let vectors = Vectors::new(data, dim, metric);
        let graph = Graph {
            links,
            entry,
            max_level,
        };
        let mut index = Hnsw::from_parts(params, vectors, graph);
        index.rng = SplitMix64::new(rng_state);
        for &slot in &free {
            let fresh = (slot as usize) < n && !index.deleted.contains(slot);
            if !fresh {
                return Err(corrupt(format!(
                    "deleted slot {slot} is out of range (n = {n}) or listed twice"
                )));
            }
            index.deleted.insert(slot);
        }
        index.deleted_count = free.len();
        index.free = free;
        Ok(index)
    }
}

/// The invariants a search relies on to never index out of bounds.
fn check_graph(links: &Links<u32>, entry: u32, max_level: usize) -> Result<()> {
    let layout = &links.layout;
    let n = layout.len();
    if entry as usize >= n {
        return Err(corrupt(format!("entry node {entry} is not below n = {n}")));
    }
    if layout.level(entry) != max_level {
        return Err(corrupt(format!(
            "entry node {entry} is on layer {}, the top layer is {max_level}",
            layout.level(entry)
        )));
    }
    for node in 0..n as u32 {
        let level = layout.level(node);
        if level > max_level {
            return Err(corrupt(format!(
                "node {node} is on layer {level}, above the top layer {max_level}"
            )));
        }
        for l in 0..=level {
            let cap = layout.cap(l);
            let count = links.stored_count(node, l);
            if count > cap {
                return Err(corrupt(format!(
                    "node {node} has {count} links on layer {l}, capacity {cap}"
                )));
            }
            for &e in links.neighbours(node, l) {
                if e as usize >= n || e == node || layout.level(e) < l {
                    return Err(corrupt(format!(
                        "node {node} links to {e} on layer {l}, which is not a node there"
                    )));
                }
            }
        }
    }
    Ok(())
}

fn corrupt(what: String) -> HnswError {
    HnswError::Corrupt { what }
}

fn to_usize(v: u64, name: &str) -> Result<usize> {
    usize::try_from(v).map_err(|_| corrupt(format!("{name} = {v} does not fit this platform")))
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&bytes[at..at + 4]);
    u32::from_le_bytes(b)
}

/// A cursor over bytes whose length the caller has already checked.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Reader { bytes, at: 0 }
    }

    fn skip(&mut self, len: usize) {
        self.at += len;
    }

    fn take(&mut self, len: usize) -> &'a [u8] {
        let s = &self.bytes[self.at..self.at + len];
        self.at += len;
        s
    }

    fn u32(&mut self) -> u32 {
        let mut b = [0u8; 4];
        b.copy_from_slice(self.take(4));
        u32::from_le_bytes(b)
    }

    fn u64(&mut self) -> u64 {
        let mut b = [0u8; 8];
        b.copy_from_slice(self.take(8));
        u64::from_le_bytes(b)
    }

    fn u32s(&mut self, count: usize) -> Vec<u32> {
        self.take(count * 4)
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }

    fn f32s(&mut self, count: usize) -> Vec<f32> {
        self.take(count * 4)
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }
}

//! The index file (docs/CONTRACTS.md §10): a compacted snapshot of the live
//! rows, versioned, checksummed per 1 MiB block, written atomically and
//! streamed back block by block into its final buffers; an `hnsw` index adds
//! its graph in a checksummed section after them (version 2); rows stored
//! at half width (docs/CONTRACTS.md §14) are written as they are stored,
//! with the type in the header (version 3).

use std::fs::File;
use std::io::{BufWriter, Read, Seek, SeekFrom, Write};
use std::path::Path;

use topk_core::{validate, Dtype, Error as CoreError, Located, Metric, RowStore, MAX_ID};

use crate::error::IndexError;
use crate::index::{full_bitset, Index};
use crate::options::{IndexBackend, IndexOptions};

/// The first eight bytes of every index file.
pub const MAGIC: [u8; 8] = *b"TOPKIDX1";
/// The newest format version this build writes; it reads every version from
/// 1 (a version 1 file is a version 2 file without a graph section). An
/// index of `f32` rows is written as version 2, so older builds read it; a
/// half-width index is version 3, whose header adds the storage type.
pub const VERSION: u32 = 3;
/// The first eight bytes of the graph section.
const GRAPH_MAGIC: [u8; 8] = *b"TOPKGRPH";
/// Bytes of the graph section before its body: the magic and the body length.
const GRAPH_HEADER: u64 = 16;
/// Bytes before the payload.
const HEADER: u64 = 48;
/// Bytes of the header the header checksum covers.
const HEADER_SUMMED: usize = 40;
/// Payload bytes per checksummed block (a multiple of 8, so no id or value
/// straddles two blocks).
const BLOCK: usize = 1 << 20;

fn metric_code(m: Metric) -> u32 {
    match m {
        Metric::Dot => 0,
        Metric::Cosine => 1,
        Metric::L2 => 2,
    }
}

/// A writer that checksums every [`BLOCK`] bytes of what passes through it.
struct Summed<W: Write> {
    inner: W,
    crc: crc32fast::Hasher,
    in_block: usize,
    sums: Vec<u32>,
}

impl<W: Write> Summed<W> {
    fn put(&mut self, mut bytes: &[u8]) -> std::io::Result<()> {
        self.inner.write_all(bytes)?;
        while !bytes.is_empty() {
            let take = (BLOCK - self.in_block).min(bytes.len());
            self.crc.update(&bytes[..take]);
            self.in_block += take;
            bytes = &bytes[take..];
            if self.in_block == BLOCK {
                self.close_block();
            }
        }
        Ok(())
    }

    fn close_block(&mut self) {
        let crc = std::mem::take(&mut self.crc);
        self.sums.push(crc.finalize());
        self.in_block = 0;
    }
}

impl Index {
    /// Saves the live rows, their ids, the metric and (on `hnsw`) the graph
    /// to `path`, atomically:
    /// a temporary file in the same folder is written, synced and renamed
    /// over `path`, so a failure leaves any previous file in place. The
    /// index itself is not changed (tombstones are simply not written).
    pub fn save(&self, path: impl AsRef<Path>) -> Result<(), IndexError> {
        let path = path.as_ref();
        // A fresh name created exclusively: two saves of one path never
        // share a temporary file, and a planted file or link is not followed.
        let (tmp, file) = topk_io::create_temp_beside(path).map_err(|source| IndexError::Io {
            path: path.to_owned(),
            op: "create a temporary file beside",
            source,
        })?;
        // Errors name `path`, the file the caller asked for: the temporary
        // one is deleted on failure.
        let result = self.write_to(path, file).and_then(|()| {
            std::fs::rename(&tmp, path).map_err(|source| IndexError::Io {
                path: path.to_owned(),
                op: "rename the temporary file over",
                source,
            })
        });
        if result.is_err() {
            // Best effort: the write's error is the one to report.
            let _ = std::fs::remove_file(&tmp);
            return result;
        }
        topk_io::sync_folder_of(path);
        tracing::debug!(file = %path.display(), rows = self.len(), "index saved");
        Ok(())
    }

    fn write_to(&self, target: &Path, file: File) -> Result<(), IndexError> {
        let io = |op: &'static str| io_error(target, op);
        let live: Vec<usize> = (0..self.ids.len()).filter(|&r| self.is_live(r)).collect();
        let (n, d) = (live.len() as u64, self.dim as u64);
        let dtype = self.data.dtype();
        let payload = 8 * n + dtype.bytes() as u64 * n * d;
        // The metric field's second byte holds the storage type (version 3).
        let (version, kind) = match dtype {
            Dtype::F32 => (2u32, metric_code(self.metric)),
            _ => (3, metric_code(self.metric) | u32::from(dtype.code()) << 8),
        };
        let mut header = Vec::with_capacity(HEADER as usize);
        header.extend_from_slice(&MAGIC);
        header.extend_from_slice(&version.to_le_bytes());
        header.extend_from_slice(&kind.to_le_bytes());
        header.extend_from_slice(&d.to_le_bytes());
        header.extend_from_slice(&n.to_le_bytes());
        header.extend_from_slice(&payload.to_le_bytes());
        let crc = crc32fast::hash(&header);
        header.extend_from_slice(&crc.to_le_bytes());
        header.extend_from_slice(&[0; 4]);
        let mut out = BufWriter::with_capacity(BLOCK, file);
        out.write_all(&header).map_err(io("write"))?;
        let mut w = Summed {
            inner: out,
            crc: crc32fast::Hasher::new(),
            in_block: 0,
            sums: Vec::new(),
        };
        let mut buf: Vec<u8> = Vec::with_capacity(BLOCK);
        for &r in &live {
            buf.extend_from_slice(&self.ids[r].to_le_bytes());
            if buf.len() >= BLOCK - 8 {
                w.put(&buf).map_err(io("write"))?;
                buf.clear();
            }
        }
        for &r in &live {
            self.data.row_le_bytes(r, &mut buf);
            if buf.len() >= BLOCK {
                w.put(&buf).map_err(io("write"))?;
                buf.clear();
            }
        }
        w.put(&buf).map_err(io("write"))?;
        if w.in_block > 0 {
            w.close_block();
        }
        let table: Vec<u8> = w.sums.iter().flat_map(|s| s.to_le_bytes()).collect();
        let mut out = w.inner;
        out.write_all(&table).map_err(io("write"))?;
        out.write_all(&crc32fast::hash(&table).to_le_bytes())
            .map_err(io("write"))?;
        if let Some((slots, graph)) = self.graph_section() {
            let body = (slots.len() + graph.len()) as u64;
            let mut crc = crc32fast::Hasher::new();
            crc.update(&slots);
            crc.update(&graph);
            out.write_all(&GRAPH_MAGIC).map_err(io("write"))?;
            out.write_all(&body.to_le_bytes()).map_err(io("write"))?;
            out.write_all(&slots).map_err(io("write"))?;
            out.write_all(&graph).map_err(io("write"))?;
            out.write_all(&crc.finalize().to_le_bytes())
                .map_err(io("write"))?;
        }
        let file = out.into_inner().map_err(|e| io("write")(e.into_error()))?;
        file.sync_all().map_err(io("sync"))?;
        Ok(())
    }

    /// Opens a file written by [`Index::save`] (by any backend) for
    /// `backend`. Every check of docs/CONTRACTS.md §10 runs before the index
    /// exists; a failing one is a typed error naming the offset.
    ///
    /// On `hnsw`, the file's graph is used when it has one (checked against
    /// the rows); otherwise a graph is built with the default parameters. The
    /// other backends skip a graph section unread.
    pub fn open(path: impl AsRef<Path>, backend: IndexBackend) -> Result<Index, IndexError> {
        Index::open_with_options(path, backend, &IndexOptions::default())
    }

    /// [`Index::open`] with `options`: on `hnsw`, a file without a graph gets
    /// one built with `options.hnsw`, reporting to `options.progress`; a
    /// file's own graph keeps the parameters it was built with.
    pub fn open_with_options(
        path: impl AsRef<Path>,
        backend: IndexBackend,
        options: &IndexOptions,
    ) -> Result<Index, IndexError> {
        let path = path.as_ref();
        // Before any reading: a backend switched to later uses them too.
        options.check()?;
        let io = |op: &'static str| io_error(path, op);
        let (mut file, len) = topk_io::open_regular_file(path).map_err(io("open"))?;
        let truncated = |expected: u64| truncated_at(path, len, expected);
        let corrupt = |offset: u64, reason: String| corrupt_at(path, offset, reason);
        let Header {
            version,
            metric,
            dtype,
            d,
            n,
            payload,
            table_at,
            end,
        } = read_header(path, &mut file, len)?;
        let width = dtype.bytes() as u64;
        let blocks = payload.div_ceil(BLOCK as u64);
        // The graph section: where its body starts and its length.
        let mut graph: Option<(u64, u64)> = None;
        if len > end && version >= 2 {
            // Bytes that do not start a graph section are trailing bytes; a
            // section cut short is a truncated file.
            let avail = (len - end).min(GRAPH_HEADER) as usize;
            let mut head = [0u8; GRAPH_HEADER as usize];
            file.seek(SeekFrom::Start(end)).map_err(io("seek in"))?;
            file.read_exact(&mut head[..avail]).map_err(io("read"))?;
            let magic = avail.min(GRAPH_MAGIC.len());
            if head[..magic] != GRAPH_MAGIC[..magic] {
                return Err(IndexError::TrailingBytes {
                    path: path.to_owned(),
                    end,
                    extra: len - end,
                });
            }
            if avail < GRAPH_HEADER as usize {
                return Err(truncated(end + GRAPH_HEADER));
            }
            let mut b = [0u8; 8];
            b.copy_from_slice(&head[8..]);
            let body = u64::from_le_bytes(b);
            let graph_end = body.checked_add(end + GRAPH_HEADER + 4).ok_or_else(|| {
                corrupt(end + 8, format!("graph section length {body} overflows"))
            })?;
            if len < graph_end {
                return Err(truncated(graph_end));
            }
            graph = Some((end + GRAPH_HEADER, body));
        }
        let file_end = graph.map_or(end, |(at, body)| at + body + 4);
        if len > file_end {
            return Err(IndexError::TrailingBytes {
                path: path.to_owned(),
                end: file_end,
                extra: len - file_end,
            });
        }
        file.seek(SeekFrom::Start(table_at))
            .map_err(io("seek in"))?;
        let mut table = vec![0u8; 4 * blocks as usize + 4];
        file.read_exact(&mut table).map_err(io("read"))?;
        let (sums, table_crc) = table.split_at(4 * blocks as usize);
        if crc32fast::hash(sums).to_le_bytes() != table_crc {
            return Err(IndexError::Checksum {
                path: path.to_owned(),
                start: table_at,
                end: end - 4,
            });
        }
        // The lengths now match the file, so these allocations are bounded by it.
        let (n, d) = (n as usize, d as usize);
        let mut ids: Vec<u64> = Vec::with_capacity(n);
        let mut data = RowStore::empty(d, dtype)?;
        data.reserve(n);
        file.seek(SeekFrom::Start(HEADER)).map_err(io("seek in"))?;
        let ids_bytes = 8 * n as u64;
        let mut block = vec![0u8; BLOCK];
        for (b, sum) in sums.chunks_exact(4).enumerate() {
            let start = b as u64 * BLOCK as u64;
            let size = (payload - start).min(BLOCK as u64) as usize;
            let bytes = &mut block[..size];
            file.read_exact(bytes).map_err(io("read"))?;
            if crc32fast::hash(bytes).to_le_bytes() != sum {
                return Err(IndexError::Checksum {
                    path: path.to_owned(),
                    start: HEADER + start,
                    end: HEADER + start + size as u64,
                });
            }
            let split = ids_bytes.saturating_sub(start).min(size as u64) as usize;
            let (id_part, row_part) = bytes.split_at(split);
            ids.extend(id_part.chunks_exact(8).map(|c| {
                let mut v = [0u8; 8];
                v.copy_from_slice(c);
                u64::from_le_bytes(v)
            }));
            data.extend_le_bytes(row_part);
        }
        let rows_at = HEADER + ids_bytes;
        let mut seen: std::collections::HashMap<u64, u64> =
            std::collections::HashMap::with_capacity(n);
        for (i, &id) in ids.iter().enumerate() {
            let at = HEADER + 8 * i as u64;
            if id > MAX_ID {
                return Err(corrupt(
                    at,
                    format!("id {id} is above the largest id {MAX_ID}"),
                ));
            }
            if let Some(first) = seen.insert(id, at) {
                return Err(corrupt(
                    at,
                    format!("id {id} repeats the id at offset {first}"),
                ));
            }
        }
        if n > 0 {
            if let Err(e) = data.check() {
                let value_at = |r: usize, c: usize| rows_at + width * (r * d + c) as u64;
                let offset = match &e {
                    CoreError::NonFinite {
                        at: Located::Row(r),
                        column,
                        ..
                    } => value_at(*r, *column),
                    CoreError::NormTooLarge {
                        at: Located::Row(r),
                        ..
                    } => value_at(*r, 0),
                    _ => rows_at,
                };
                return Err(corrupt(offset, e.to_string()));
            }
        }
        let mut index = Index::new(d, metric, backend)?;
        if metric == Metric::Cosine {
            let k = index.kernels;
            let mut wide = Vec::new();
            for r0 in (0..n).step_by(NORM_ROWS) {
                let rows = data.rows_f32(r0..(r0 + NORM_ROWS).min(n), &mut wide);
                index.norms.extend(rows.chunks_exact(d).map(|r| k.norm(r)));
            }
        }
        index.rows_of = ids.iter().enumerate().map(|(r, &id)| (id, r)).collect();
        index.largest = ids.iter().max().copied();
        index.live = full_bitset(n);
        index.data = data;
        index.ids = ids;
        index.sort_by_id();
        index.options = options.clone().dtype(dtype);
        if backend == IndexBackend::Hnsw {
            match graph {
                Some((at, body_len)) => {
                    // The length was checked against the file, so this is bounded by it.
                    let mut body = vec![0u8; body_len as usize + 4];
                    file.seek(SeekFrom::Start(at)).map_err(io("seek in"))?;
                    file.read_exact(&mut body).map_err(io("read"))?;
                    let (body, sum) = body.split_at(body_len as usize);
                    if crc32fast::hash(body).to_le_bytes() != sum {
                        return Err(IndexError::Checksum {
                            path: path.to_owned(),
                            start: at,
                            end: at + body_len,
                        });
                    }
                    index
                        .restore_graph(body, at)
                        .map_err(|(offset, reason)| corrupt(offset, reason))?;
                }
                None => index.build_graph()?,
            }
        }
        tracing::debug!(file = %path.display(), rows = n, dim = d, graph = index.has_graph(), "index opened");
        index.sync_device()?;
        Ok(index)
    }
}

/// What the header of an index file declares, read by [`Index::file_info`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct FileInfo {
    /// The format version.
    pub version: u32,
    /// Live rows.
    pub rows: u64,
    /// Values per row.
    pub dim: u64,
    /// Whether an `hnsw` graph section follows the rows.
    pub graph: bool,
    /// How the rows are stored.
    pub dtype: Dtype,
}

impl Index {
    /// The header of the index file at `path` and whether it holds an
    /// `hnsw` graph section, without reading its rows. The header gets every
    /// check [`Index::open`] makes of it (magic, version, checksum, the zero
    /// field, codes, sizes against the file's length); the rows, ids and
    /// their checksums are left to `open`.
    pub fn file_info(path: impl AsRef<Path>) -> Result<FileInfo, IndexError> {
        let path = path.as_ref();
        let io = |op: &'static str| io_error(path, op);
        let (mut file, len) = topk_io::open_regular_file(path).map_err(io("open"))?;
        let head = read_header(path, &mut file, len)?;
        let mut graph = false;
        if head.version >= 2 && head.end.saturating_add(8) <= len {
            let mut magic = [0u8; 8];
            file.seek(SeekFrom::Start(head.end))
                .map_err(io("seek in"))?;
            file.read_exact(&mut magic).map_err(io("read"))?;
            graph = magic == GRAPH_MAGIC;
        }
        Ok(FileInfo {
            version: head.version,
            rows: head.n,
            dim: head.d,
            graph,
            dtype: head.dtype,
        })
    }
}

/// The error of I/O operation `op` on the index file `path`.
fn io_error<'a>(
    path: &'a Path,
    op: &'static str,
) -> impl FnOnce(std::io::Error) -> IndexError + 'a {
    move |source| IndexError::Io {
        path: path.to_owned(),
        op,
        source,
    }
}

/// The index file `path`, `len` bytes, ends before `expected`.
fn truncated_at(path: &Path, len: u64, expected: u64) -> IndexError {
    IndexError::Truncated {
        path: path.to_owned(),
        len,
        expected,
    }
}

/// The bytes at `offset` of the index file `path` break the format.
fn corrupt_at(path: &Path, offset: u64, reason: String) -> IndexError {
    IndexError::Corrupt {
        path: path.to_owned(),
        offset,
        reason,
    }
}

/// What an index file's header declares, checked ([`read_header`]).
struct Header {
    version: u32,
    metric: Metric,
    dtype: Dtype,
    d: u64,
    n: u64,
    payload: u64,
    /// Where the block checksum table starts.
    table_at: u64,
    /// Where the exact index's bytes end (E of docs/CONTRACTS.md §10).
    end: u64,
}

/// Reads and checks the 48-byte header of the index file `file` (`len`
/// bytes, at offset 0): the magic, the version, the header checksum, the
/// zero field, the metric and storage codes, D, and the payload length
/// against N, D and the file's length. [`Index::open`] and
/// [`Index::file_info`] both start here.
fn read_header(path: &Path, file: &mut std::fs::File, len: u64) -> Result<Header, IndexError> {
    let io = |op: &'static str| io_error(path, op);
    let truncated = |expected: u64| truncated_at(path, len, expected);
    let corrupt = |offset: u64, reason: String| corrupt_at(path, offset, reason);
    if len < HEADER {
        if len >= 8 {
            let mut magic = [0u8; 8];
            file.read_exact(&mut magic).map_err(io("read"))?;
            check_magic(path, &magic)?;
        }
        return Err(truncated(HEADER));
    }
    let mut header = [0u8; HEADER as usize];
    file.read_exact(&mut header).map_err(io("read"))?;
    check_magic(path, &header[..8])?;
    let u32_at =
        |o: usize| u32::from_le_bytes([header[o], header[o + 1], header[o + 2], header[o + 3]]);
    let u64_at = |o: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&header[o..o + 8]);
        u64::from_le_bytes(b)
    };
    let version = u32_at(8);
    if version == 0 || version > VERSION {
        return Err(IndexError::UnsupportedVersion {
            path: path.to_owned(),
            version,
            supported: VERSION,
        });
    }
    if crc32fast::hash(&header[..HEADER_SUMMED]) != u32_at(40) {
        return Err(IndexError::Checksum {
            path: path.to_owned(),
            start: 0,
            end: HEADER_SUMMED as u64,
        });
    }
    let zero = u32_at(44);
    if zero != 0 {
        return Err(corrupt(
            44,
            format!("the field at bytes 44..48 is {zero:#x}, expected zero"),
        ));
    }
    let kind = u32_at(12);
    let metric = match kind & 0xff {
        0 => Metric::Dot,
        1 => Metric::Cosine,
        2 => Metric::L2,
        m => return Err(corrupt(12, format!("metric code {m}, expected 0, 1 or 2"))),
    };
    let dtype = file_dtype(version, kind).map_err(|reason| corrupt(12, reason))?;
    let width = dtype.bytes() as u64;
    let (d, n, payload) = (u64_at(16), u64_at(24), u64_at(32));
    if d == 0 || d > validate::MAX_DIM as u64 {
        return Err(corrupt(
            16,
            format!("dimension {d} outside 1..={}", validate::MAX_DIM),
        ));
    }
    let want = n
        .checked_mul(d)
        .and_then(|nd| nd.checked_mul(width))
        .and_then(|v| v.checked_add(n.checked_mul(8)?));
    if want != Some(payload) {
        return Err(corrupt(
            32,
            format!(
                "payload length {payload} is not 8 N + {width} N D for N = {n}, D = {d} ({dtype} rows)"
            ),
        ));
    }
    let blocks = payload.div_ceil(BLOCK as u64);
    let sizes = HEADER
        .checked_add(payload)
        .and_then(|table_at| Some((table_at, table_at.checked_add(4 * blocks + 4)?)));
    let Some((table_at, end)) = sizes else {
        return Err(corrupt(
            32,
            format!("payload length {payload} does not fit in a file"),
        ));
    };
    if len < end {
        return Err(truncated(end));
    }
    Ok(Header {
        version,
        metric,
        dtype,
        d,
        n,
        payload,
        table_at,
        end,
    })
}

/// Rows whose cosine norms are computed per step as a half-width file opens.
const NORM_ROWS: usize = 4096;

/// The storage type of a file: `f32` before version 3; in version 3 the
/// second byte of the metric field (the upper two bytes are zero).
fn file_dtype(version: u32, kind: u32) -> Result<Dtype, String> {
    if version < 3 {
        if kind > 0xff {
            return Err(format!(
                "metric field {kind:#x} has bits above its first byte"
            ));
        }
        return Ok(Dtype::F32);
    }
    if kind > 0xffff {
        return Err(format!(
            "metric field {kind:#x} has bits above its second byte"
        ));
    }
    let code = (kind >> 8) as u8;
    Dtype::from_code(code)
        .ok_or_else(|| format!("storage type code {code}, expected 0 (f32), 1 (f16) or 2 (bf16)"))
}

fn check_magic(path: &Path, found: &[u8]) -> Result<(), IndexError> {
    if found == MAGIC {
        return Ok(());
    }
    Err(IndexError::BadMagic {
        path: path.to_owned(),
        found: found.escape_ascii().to_string(),
    })
}

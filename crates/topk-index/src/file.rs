//! The index file (docs/CONTRACTS.md §10): a compacted snapshot of the live
//! rows, versioned, checksummed per 1 MiB block, written atomically and
//! streamed back block by block into its final buffers.

use std::fs::File;
use std::io::{BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use topk_core::{validate, Error as CoreError, Located, Metric, MAX_ID};

use crate::error::IndexError;
use crate::index::{full_bitset, Index, IndexBackend};

/// The first eight bytes of every index file.
pub const MAGIC: [u8; 8] = *b"TOPKIDX1";
/// The format version this build writes and reads.
pub const VERSION: u32 = 1;
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

/// The temporary file a save writes before renaming it over `path`: in the
/// same folder, so the rename never crosses file systems.
pub(crate) fn temp_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.{}.tmp", std::process::id()))
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
    /// Saves the live rows, their ids and the metric to `path`, atomically:
    /// a temporary file in the same folder is written, synced and renamed
    /// over `path`, so a failure leaves any previous file in place. The
    /// index itself is not changed (tombstones are simply not written).
    pub fn save(&self, path: impl AsRef<Path>) -> Result<(), IndexError> {
        let path = path.as_ref();
        let tmp = temp_path(path);
        let result = self.write_to(&tmp).and_then(|()| {
            std::fs::rename(&tmp, path).map_err(|source| IndexError::Io {
                path: path.to_owned(),
                op: "rename the temporary file over",
                source,
            })
        });
        if result.is_err() {
            // The temporary may not exist (creating it failed); nothing to report.
            let _ = std::fs::remove_file(&tmp);
            return result;
        }
        // Make the rename durable; a folder that cannot be synced (some file
        // systems refuse) leaves a complete file, so it is only logged.
        let dir = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        if let Err(e) = File::open(dir).and_then(|d| d.sync_all()) {
            tracing::warn!(folder = %dir.display(), error = %e, "could not sync the folder after saving");
        }
        tracing::debug!(file = %path.display(), rows = self.len(), "index saved");
        Ok(())
    }

    fn write_to(&self, tmp: &Path) -> Result<(), IndexError> {
        let io = |op: &'static str| {
            move |source| IndexError::Io {
                path: tmp.to_owned(),
                op,
                source,
            }
        };
        let file = File::create(tmp).map_err(io("create"))?;
        let live: Vec<usize> = (0..self.ids.len()).filter(|&r| self.is_live(r)).collect();
        let (n, d) = (live.len() as u64, self.dim as u64);
        let payload = 8 * n + 4 * n * d;
        let mut header = Vec::with_capacity(HEADER as usize);
        header.extend_from_slice(&MAGIC);
        header.extend_from_slice(&VERSION.to_le_bytes());
        header.extend_from_slice(&metric_code(self.metric).to_le_bytes());
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
            for v in self.row(r) {
                buf.extend_from_slice(&v.to_le_bytes());
                if buf.len() >= BLOCK - 4 {
                    w.put(&buf).map_err(io("write"))?;
                    buf.clear();
                }
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
        let file = out.into_inner().map_err(|e| io("write")(e.into_error()))?;
        file.sync_all().map_err(io("sync"))?;
        Ok(())
    }

    /// Opens a file written by [`Index::save`] (by either backend) for
    /// `backend`. Every check of docs/CONTRACTS.md §10 runs before the index
    /// exists; a failing one is a typed error naming the offset.
    pub fn open(path: impl AsRef<Path>, backend: IndexBackend) -> Result<Index, IndexError> {
        let path = path.as_ref();
        let io = |op: &'static str| {
            move |source| IndexError::Io {
                path: path.to_owned(),
                op,
                source,
            }
        };
        let mut file = File::open(path).map_err(io("open"))?;
        let len = file.metadata().map_err(io("read the length of"))?.len();
        let truncated = |expected: u64| IndexError::Truncated {
            path: path.to_owned(),
            len,
            expected,
        };
        let corrupt = |offset: u64, reason: String| IndexError::Corrupt {
            path: path.to_owned(),
            offset,
            reason,
        };
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
        if version != VERSION {
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
        let metric = match u32_at(12) {
            0 => Metric::Dot,
            1 => Metric::Cosine,
            2 => Metric::L2,
            m => return Err(corrupt(12, format!("metric code {m}, expected 0, 1 or 2"))),
        };
        let (d, n, payload) = (u64_at(16), u64_at(24), u64_at(32));
        if d == 0 || d > validate::MAX_DIM as u64 {
            return Err(corrupt(
                16,
                format!("dimension {d} outside 1..={}", validate::MAX_DIM),
            ));
        }
        let want = n
            .checked_mul(d)
            .and_then(|nd| nd.checked_mul(4))
            .and_then(|v| v.checked_add(n.checked_mul(8)?));
        if want != Some(payload) {
            return Err(corrupt(
                32,
                format!("payload length {payload} is not 8 N + 4 N D for N = {n}, D = {d}"),
            ));
        }
        let blocks = payload.div_ceil(BLOCK as u64);
        let table_at = HEADER + payload;
        let end = table_at + 4 * blocks + 4;
        if len < end {
            return Err(truncated(end));
        }
        if len > end {
            return Err(IndexError::TrailingBytes {
                path: path.to_owned(),
                end,
                extra: len - end,
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
        let mut data: Vec<f32> = Vec::with_capacity(n * d);
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
            data.extend(
                row_part
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
            );
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
            if let Err(e) = validate::corpus(&data, d) {
                let value_at = |r: usize, c: usize| rows_at + 4 * (r * d + c) as u64;
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
            index.norms = data.chunks_exact(d).map(|r| k.norm(r)).collect();
        }
        index.rows_of = ids.iter().enumerate().map(|(r, &id)| (id, r)).collect();
        index.live = full_bitset(n);
        index.data = data;
        index.ids = ids;
        index.sort_by_id();
        tracing::debug!(file = %path.display(), rows = n, dim = d, "index opened");
        Ok(index)
    }
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

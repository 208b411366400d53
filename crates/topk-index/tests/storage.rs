//! Half-width rows in the lifecycle index (docs/CONTRACTS.md §10, §14): the
//! type is chosen at construction, kept by every mutation and by the file
//! (version 3, rows written as stored), and every backend answers over the
//! stored values.

use std::path::Path;

use ndarray::{Array2, ArrayView2};
use topk_core::{Dtype, Error as CoreError, Located, Metric};
use topk_index::{Index, IndexBackend, IndexError, IndexOptions};
use topk_testkit::corpora::{self, palette};
use topk_testkit::files::crc32;
use topk_testkit::hits::same_hits as same;

fn rows(n: usize, d: usize, seed: u64) -> Array2<f32> {
    Array2::from_shape_vec((n, d), corpora::corpus(seed, n, d, &palette(0b11))).expect("shape")
}

fn index(dtype: Dtype, backend: IndexBackend, data: ArrayView2<'_, f32>) -> Index {
    let options = IndexOptions::default().dtype(dtype);
    let mut ix =
        Index::with_options(data.ncols(), Metric::Cosine, backend, &options).expect("index");
    let ids: Vec<u64> = (0..data.nrows() as u64).map(|i| 1000 + 3 * i).collect();
    ix.add(&ids, data).expect("add");
    ix
}

/// The f32 oracle over the same rows rounded to `dtype`.
fn truth(dtype: Dtype, data: ArrayView2<'_, f32>) -> Index {
    let rounded = data.mapv(|x| dtype.round(x));
    index(Dtype::F32, IndexBackend::Oracle, rounded.view())
}

/// `got` and `want` answer the first `queries` rows of `data` alike, K = k.
fn same_searches(
    got: &Index,
    want: &Index,
    data: ArrayView2<'_, f32>,
    queries: usize,
    k: usize,
    ctx: &str,
) {
    for q in data.outer_iter().take(queries) {
        let q = q.to_vec();
        same(
            &got.search(&q, k, None).expect("search"),
            &want.search(&q, k, None).expect("search"),
        )
        .unwrap_or_else(|e| panic!("{ctx}: {e}"));
    }
}

#[test]
fn every_host_backend_answers_over_the_stored_values() {
    let data = rows(3000, 24, 1);
    for dtype in [Dtype::F16, Dtype::Bf16] {
        let want = truth(dtype, data.view());
        for backend in [IndexBackend::Cpu, IndexBackend::Oracle] {
            let ix = index(dtype, backend, data.view());
            assert_eq!(ix.dtype(), dtype);
            assert_eq!(ix.stored_bytes(), 3000 * 24 * 2);
            let got = ix.get(1003).expect("live");
            let stored: Vec<f32> = data.row(1).iter().map(|&x| dtype.round(x)).collect();
            assert_eq!(
                &*got,
                &stored[..],
                "{dtype} {backend}: get returns the stored values"
            );
            same_searches(
                &ix,
                &want,
                data.view(),
                5,
                20,
                &format!("{dtype} {backend}"),
            );
        }
        // The approximate backend searches the same stored values: its
        // scores are the exact scores of the rows it returns.
        let hnsw = index(dtype, IndexBackend::Hnsw, data.view());
        let q = data.row(7).to_vec();
        let exact = want.search(&q, 3000, None).expect("search");
        for hit in hnsw.search(&q, 10, None).expect("search") {
            let w = exact.iter().find(|h| h.id == hit.id).expect("a stored id");
            assert_eq!(w.score.to_bits(), hit.score.to_bits(), "{dtype} hnsw");
        }
    }
}

#[test]
fn files_keep_the_type_at_half_the_bytes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = rows(700, 33, 2);
    for dtype in Dtype::ALL {
        let mut ix = index(dtype, IndexBackend::Cpu, data.view());
        // Tombstones and an upsert before saving: the file holds live rows.
        ix.remove(&[1000, 1006]);
        let fresh = rows(2, 33, 9);
        ix.upsert(&[1003, 5], fresh.view()).expect("upsert");
        let path = dir.path().join(format!("{dtype}.topkidx"));
        ix.save(&path).expect("save");
        let n = ix.len() as u64;
        let payload = 8 * n + dtype.bytes() as u64 * n * 33;
        let blocks = payload.div_ceil(1 << 20);
        let len = std::fs::metadata(&path).expect("stat").len();
        assert_eq!(len, 48 + payload + 4 * blocks + 4, "{dtype}");
        let info = Index::file_info(&path).expect("info");
        assert_eq!(info.dtype, dtype);
        assert_eq!(info.version, if dtype == Dtype::F32 { 2 } else { 3 });
        for backend in [IndexBackend::Cpu, IndexBackend::Oracle, IndexBackend::Hnsw] {
            let back = Index::open(&path, backend).expect("open");
            assert_eq!(back.dtype(), dtype, "{backend}");
            assert_eq!(back.ids(), ix.ids());
            for id in ix.ids() {
                assert_eq!(back.get(id), ix.get(id), "{dtype} {backend} id {id}");
            }
            if backend != IndexBackend::Hnsw {
                let q = data.row(3).to_vec();
                same(
                    &back.search(&q, 50, None).expect("search"),
                    &ix.search(&q, 50, None).expect("search"),
                )
                .unwrap_or_else(|e| panic!("{dtype} {backend}: {e}"));
            }
        }
        // A reopened index keeps storing its type.
        let mut back = Index::open(&path, IndexBackend::Cpu).expect("open");
        back.add(&[7], fresh.slice(ndarray::s![0..1, ..]))
            .expect("add");
        assert_eq!(back.stored_bytes(), back.len() * 33 * dtype.bytes());
        assert_eq!(back.get(7).expect("live").len(), 33);
    }
}

/// An `hnsw` index of half-width rows saves its graph beside the 16-bit
/// rows and reopens with it: the graph's rows are the widened stored rows.
#[test]
fn an_hnsw_graph_over_half_width_rows_round_trips() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = rows(800, 16, 6);
    for dtype in [Dtype::F16, Dtype::Bf16] {
        let mut ix = index(dtype, IndexBackend::Hnsw, data.view());
        ix.remove(&[1000, 1003]);
        let path = dir.path().join(format!("g-{dtype}.topkidx"));
        ix.save(&path).expect("save");
        let info = Index::file_info(&path).expect("info");
        assert!(
            info.graph && info.dtype == dtype && info.version == 3,
            "{info:?}"
        );
        let back = Index::open(&path, IndexBackend::Hnsw).expect("open with its graph");
        assert_eq!(back.dtype(), dtype);
        same_searches(&back, &ix, data.view(), 6, 10, &format!("{dtype}"));
    }
}

#[test]
fn values_the_type_cannot_hold_are_named_and_change_nothing() {
    let data = rows(10, 4, 3);
    let mut ix = index(Dtype::F16, IndexBackend::Cpu, data.view());
    let before = ix.search(&[1.0, 0.0, 0.0, 0.0], 10, None).expect("search");
    let mut bad = rows(3, 4, 4);
    bad[[2, 1]] = 1.0e5;
    for result in [
        ix.add(&[1, 2, 3], bad.view()),
        ix.upsert(&[1000, 2, 3], bad.view()),
    ] {
        let e = result.expect_err("an f16 overflow");
        assert!(
            matches!(
                e,
                IndexError::Input(CoreError::NotRepresentable {
                    at: Located::Row(2),
                    column: 1,
                    dtype: Dtype::F16,
                    ..
                })
            ),
            "{e:?}"
        );
        let m = e.to_string();
        assert!(
            m.contains("row 2") && m.contains("column 1") && m.contains("f16"),
            "{m}"
        );
    }
    assert_eq!(ix.len(), 10);
    assert_eq!(
        ix.search(&[1.0, 0.0, 0.0, 0.0], 10, None).expect("search"),
        before
    );
    // The same rows fit bf16.
    let mut wide = index(Dtype::Bf16, IndexBackend::Cpu, data.view());
    wide.add(&[1, 2, 3], bad.view()).expect("bf16 holds 1e5");
    assert_eq!(wide.get(3).expect("live")[1], Dtype::Bf16.round(1.0e5));
}

/// `bytes` with its header field at 8..16 (version, metric field) replaced
/// and the header checksum fixed.
fn with_header(bytes: &[u8], version: u32, kind: u32) -> Vec<u8> {
    let mut b = bytes.to_vec();
    b[8..12].copy_from_slice(&version.to_le_bytes());
    b[12..16].copy_from_slice(&kind.to_le_bytes());
    let crc = crc32(&b[..40]);
    b[40..44].copy_from_slice(&crc.to_le_bytes());
    b
}

fn open_bytes(dir: &Path, bytes: &[u8]) -> Result<Index, IndexError> {
    let p = dir.join("edited.topkidx");
    std::fs::write(&p, bytes).expect("write");
    Index::open(&p, IndexBackend::Cpu)
}

#[test]
fn bad_type_fields_are_named_with_their_offset() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = rows(5, 4, 5);
    let path = dir.path().join("h.topkidx");
    index(Dtype::F16, IndexBackend::Cpu, data.view())
        .save(&path)
        .expect("save");
    let bytes = std::fs::read(&path).expect("read");
    // Metric 1 (cosine), type code 1 (f16), version 3.
    assert_eq!(&bytes[8..16], &[3, 0, 0, 0, 1, 1, 0, 0]);
    let cases = [
        (with_header(&bytes, 3, 1 | 7 << 8), "storage type code 7"),
        (
            with_header(&bytes, 3, 1 | 1 << 8 | 1 << 16),
            "bits above its second byte",
        ),
        (
            with_header(&bytes, 2, 1 | 1 << 8),
            "bits above its first byte",
        ),
        // Declared f32: the payload is too short for 4-byte values.
        (with_header(&bytes, 3, 1), "is not 8 N + 4 N D"),
        // Declared bf16: same length, so the f16 bits are read as bf16 and
        // opened (the checksums hold); a type cannot be told from its bits.
    ];
    for (bad, want) in &cases {
        let e = open_bytes(dir.path(), bad).expect_err(want);
        assert!(e.to_string().contains(want), "{want}: {e}");
        assert!(matches!(e, IndexError::Corrupt { .. }), "{e:?}");
    }
    let as_bf16 = open_bytes(dir.path(), &with_header(&bytes, 3, 1 | 2 << 8)).expect("bf16 header");
    assert_eq!(as_bf16.dtype(), Dtype::Bf16);
    // A truncated half-width file names where it ends.
    let e = open_bytes(dir.path(), &bytes[..bytes.len() - 10]).expect_err("truncated");
    assert!(matches!(e, IndexError::Truncated { .. }), "{e:?}");
}

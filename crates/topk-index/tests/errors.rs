//! Every error of the index, with its message, and the guarantee that a
//! failed mutation or save changes nothing (docs/CONTRACTS.md §10).

use std::path::Path;

use ndarray::{array, Array2, ArrayView2};
use topk_core::{Error as CoreError, Hit, Metric, MAX_ID};
use topk_index::{Filter, FilterSpec, Index, IndexBackend, IndexError};
use topk_testkit::files::crc32;

fn small() -> Index {
    let rows = array![[1.0_f32, 0.0], [0.0, 1.0], [0.6, 0.8]];
    Index::with_ids(&[10, 20, 30], rows.view(), Metric::Dot, IndexBackend::Cpu).expect("index")
}

fn row(v: [f32; 2]) -> Array2<f32> {
    Array2::from_shape_vec((1, 2), v.to_vec()).expect("shape")
}

/// The index answers exactly as before (a failed call changed nothing).
fn unchanged(ix: &Index) {
    assert_eq!(ix.len(), 3);
    assert_eq!(
        ix.search(&[0.0, 2.0], 5, None).expect("search"),
        vec![Hit::new(20, 2.0), Hit::new(30, 1.6), Hit::new(10, 0.0)]
    );
}

#[test]
fn duplicate_id_within_a_call_names_it_and_both_positions() {
    let mut ix = small();
    let rows = array![[1.0_f32, 1.0], [2.0, 2.0], [3.0, 3.0]];
    let err = ix.add(&[40, 41, 40], rows.view()).expect_err("duplicate");
    assert!(matches!(
        err,
        IndexError::DuplicateInCall {
            id: 40,
            first: 0,
            second: 2
        }
    ));
    assert_eq!(
        err.to_string(),
        "id 40 is given twice in one call, at positions 0 and 2"
    );
    let err = ix
        .upsert(&[40, 40, 41], rows.view())
        .expect_err("duplicate");
    assert!(matches!(
        err,
        IndexError::DuplicateInCall {
            id: 40,
            first: 0,
            second: 1
        }
    ));
    unchanged(&ix);
}

#[test]
fn id_already_present_names_it_and_adds_nothing() {
    let mut ix = small();
    let rows = array![[5.0_f32, 5.0], [1.0, 1.0]];
    let err = ix.add(&[50, 20], rows.view()).expect_err("present");
    assert_eq!(
        err.to_string(),
        "id 20 at position 1 is already in the index (use upsert to replace it)"
    );
    assert!(!ix.contains(50), "all or nothing");
    unchanged(&ix);
}

#[test]
fn id_above_the_limit_names_it() {
    let mut ix = small();
    let err = ix
        .add(&[MAX_ID + 1], row([1.0, 1.0]).view())
        .expect_err("too large");
    assert_eq!(
        err.to_string(),
        "id 9223372036854775808 at position 0 is above the largest id 9223372036854775807 (2^63 - 1)"
    );
    ix.add(&[MAX_ID], row([0.0, 1.0]).view())
        .expect("MAX_ID itself is an id");
    let err = ix.add_auto(row([1.0, 1.0]).view()).expect_err("exhausted");
    assert_eq!(
        err.to_string(),
        "no room for 1 more ids after the largest id 9223372036854775807: ids stop at 2^63 - 1"
    );
}

#[test]
fn dimension_and_count_mismatches_name_both_sizes() {
    let mut ix = small();
    let err = ix
        .add(&[1], array![[1.0_f32, 2.0, 3.0]].view())
        .expect_err("width");
    assert_eq!(
        err.to_string(),
        "dimension mismatch: rows of 3 values were given, the index has D = 2"
    );
    let err = ix
        .upsert(&[1, 2], row([1.0, 1.0]).view())
        .expect_err("count");
    assert_eq!(
        err.to_string(),
        "2 ids for 1 rows: give exactly one id per row"
    );
    let err = ix.search(&[1.0], 1, None).expect_err("query width");
    assert!(matches!(
        err,
        IndexError::Input(CoreError::DimensionMismatch {
            expected: 2,
            got: 1,
            ..
        })
    ));
    let err = ix.search(&[1.0, 1.0], 0, None).expect_err("k = 0");
    assert!(matches!(err, IndexError::Input(CoreError::ZeroK)));
    let err = ix.add(&[7], row([f32::NAN, 1.0]).view()).expect_err("nan");
    assert!(
        err.to_string()
            .contains("non-finite value NaN at corpus row 0, column 0"),
        "{err}"
    );
    let err = Index::new(0, Metric::Dot, IndexBackend::Cpu).expect_err("zero dim");
    assert!(matches!(err, IndexError::Input(CoreError::ZeroDimension)));
    let qs = array![[1.0_f32, 0.0], [0.0, 1.0]];
    let err = ix
        .search_batch(qs.view(), 1, FilterSpec::PerQuery(&[Filter::default()]))
        .expect_err("filter count");
    assert_eq!(
        err.to_string(),
        "1 filters for 2 queries: give one filter per query"
    );
    unchanged(&ix);
}

/// A saved file of a few rows, its bytes and the folder holding it.
fn saved() -> (tempfile::TempDir, std::path::PathBuf, Vec<u8>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("small.topkidx");
    small().save(&path).expect("save");
    let bytes = std::fs::read(&path).expect("read");
    (dir, path, bytes)
}

fn open_bytes(dir: &Path, bytes: &[u8]) -> Result<Index, IndexError> {
    let p = dir.join("edited.topkidx");
    std::fs::write(&p, bytes).expect("write");
    Index::open(&p, IndexBackend::Oracle)
}

#[test]
fn a_saved_file_opens_on_either_backend_with_the_same_answers() {
    let (_dir, path, bytes) = saved();
    // 48 header bytes, 3 ids, 3 rows of 2 values, one block checksum, the table's.
    assert_eq!(bytes.len(), 48 + 3 * 8 + 3 * 2 * 4 + 4 + 4);
    for backend in IndexBackend::ALL {
        match Index::open(&path, backend) {
            Ok(ix) => unchanged(&ix),
            // Without a GPU (or the engine's plugin) the cuda backend says
            // why; that it opens and answers the same where it can runs in
            // the GPU tests (tests/lifecycle.rs, feature `cuda`).
            Err(e @ IndexError::Cuda { .. }) if backend == IndexBackend::Cuda => {
                assert!(e.to_string().starts_with("cuda backend: "), "{e}");
            }
            Err(e) => panic!("{backend}: {e}"),
        }
    }
}

#[test]
fn without_a_gpu_the_cuda_backend_says_why_and_the_host_backends_refuse_device_queries() {
    match Index::new(2, Metric::Dot, IndexBackend::Cuda) {
        Ok(_) => {}
        Err(e) => panic!("an empty index needs no device: {e}"),
    }
    if topk_cuda_loader::available().is_err() {
        let e = Index::with_options(2, Metric::Dot, IndexBackend::Cuda, &Default::default())
            .expect_err("no device here");
        assert!(e.to_string().starts_with("cuda backend: "), "{e}");
    }
    let ix = Index::new(2, Metric::Dot, IndexBackend::Cpu).unwrap();
    let e = ix
        .search_device(0x1000, 1, 1, FilterSpec::None, 0)
        .expect_err("a cpu index takes host queries");
    assert!(e.to_string().contains("need the cuda backend"), "{e}");
}

#[test]
fn truncated_files_name_the_offset_where_they_end() {
    let (dir, _path, bytes) = saved();
    for cut in [0, 5, 8, 40, 47, 48, 60, bytes.len() - 5, bytes.len() - 1] {
        match open_bytes(dir.path(), &bytes[..cut]) {
            Err(e @ IndexError::Truncated { len, .. }) => {
                assert_eq!(len, cut as u64);
                assert!(
                    e.to_string()
                        .contains(&format!("the file ends at offset {cut}")),
                    "{e}"
                );
            }
            other => panic!("cut at {cut}: {other:?}"),
        }
    }
    let mut longer = bytes.clone();
    longer.push(0);
    let err = open_bytes(dir.path(), &longer).expect_err("trailing");
    assert!(
        err.to_string()
            .contains("1 unexpected bytes after the end of the index at offset"),
        "{err}"
    );
}

#[test]
fn a_flipped_byte_is_a_checksum_error_naming_its_range() {
    let (dir, _path, bytes) = saved();
    let payload_end = bytes.len() as u64 - 8;
    for at in [20usize, 50, 48 + 24 + 3, bytes.len() - 6, bytes.len() - 2] {
        let mut bad = bytes.clone();
        bad[at] ^= 0x10;
        match open_bytes(dir.path(), &bad) {
            Err(e @ IndexError::Checksum { start, end, .. }) => {
                assert!(
                    (start..end).contains(&(at as u64)) || at as u64 >= end,
                    "{at}: {e}"
                );
                assert!(e
                    .to_string()
                    .contains(&format!("checksum mismatch over bytes {start}..{end}")));
            }
            // A flip inside the declared sizes can make the lengths disagree
            // before the checksum is read: also a typed error.
            Err(IndexError::Corrupt { offset, .. }) if at < 48 => assert!(offset <= 40),
            other => panic!("flip at {at}: {other:?}"),
        }
    }
    // The payload flip names exactly the payload's block.
    let mut bad = bytes.clone();
    bad[50] ^= 1;
    let err = open_bytes(dir.path(), &bad).expect_err("flip");
    assert!(
        matches!(err, IndexError::Checksum { start: 48, end, .. } if end == payload_end),
        "{err}"
    );
}

#[test]
fn wrong_magic_and_future_versions_are_named() {
    let (dir, _path, bytes) = saved();
    let mut bad = bytes.clone();
    bad[..8].copy_from_slice(b"TOPKHNSW");
    let err = open_bytes(dir.path(), &bad).expect_err("magic");
    assert!(
        err.to_string()
            .contains("not a topk index file: found TOPKHNSW at offset 0, expected \"TOPKIDX1\""),
        "{err}"
    );
    for version in [0u32, 4] {
        let mut bad = bytes.clone();
        bad[8..12].copy_from_slice(&version.to_le_bytes());
        let err = open_bytes(dir.path(), &bad).expect_err("version");
        assert!(
            err.to_string().contains(&format!(
                "format version {version} at offset 8 is not supported (this build reads versions 1 to 3)"
            )),
            "{err}"
        );
    }
}

#[test]
fn a_version_1_file_still_opens() {
    let (dir, _path, mut bytes) = saved();
    assert_eq!(bytes[8..12], 2u32.to_le_bytes());
    bytes[8..12].copy_from_slice(&1u32.to_le_bytes());
    let crc = crc32(&bytes[..40]);
    bytes[40..44].copy_from_slice(&crc.to_le_bytes());
    unchanged(&open_bytes(dir.path(), &bytes).expect("version 1"));
    // Version 1 has no graph section: any byte after the table is trailing.
    bytes.extend_from_slice(b"TOPKGRPH");
    let err = open_bytes(dir.path(), &bytes).expect_err("trailing");
    assert!(
        err.to_string()
            .contains("8 unexpected bytes after the end of the index at offset"),
        "{err}"
    );
}

#[test]
fn checksummed_but_impossible_values_name_their_offset() {
    let (dir, _path, bytes) = saved();
    // Write a valid file whose rows break the input rules by editing the
    // bytes and fixing the checksums the way a writer would.
    let fix = |mut b: Vec<u8>| {
        let crc = crc32(&b[..40]);
        b[40..44].copy_from_slice(&crc.to_le_bytes());
        let payload_end = b.len() - 8;
        let block = crc32(&b[48..payload_end]);
        b[payload_end..payload_end + 4].copy_from_slice(&block.to_le_bytes());
        let table = crc32(&b[payload_end..payload_end + 4]);
        let n = b.len();
        b[n - 4..].copy_from_slice(&table.to_le_bytes());
        b
    };
    let mut dup = bytes.clone();
    dup[56..64].copy_from_slice(&10u64.to_le_bytes());
    let err = open_bytes(dir.path(), &fix(dup)).expect_err("duplicate id");
    assert_eq!(
        err.to_string()
            .split(": ")
            .skip(1)
            .collect::<Vec<_>>()
            .join(": "),
        "corrupt at offset 56: id 10 repeats the id at offset 48"
    );
    let mut nan = bytes.clone();
    let value = 48 + 24 + 4 * 3;
    nan[value..value + 4].copy_from_slice(&f32::NAN.to_le_bytes());
    let err = open_bytes(dir.path(), &fix(nan)).expect_err("nan row");
    assert!(
        err.to_string().contains(&format!(
            "corrupt at offset {value}: non-finite value NaN at corpus row 1, column 1"
        )),
        "{err}"
    );
    let mut metric = bytes.clone();
    metric[12..16].copy_from_slice(&9u32.to_le_bytes());
    let err = open_bytes(dir.path(), &fix(metric)).expect_err("metric");
    assert!(
        err.to_string()
            .contains("corrupt at offset 12: metric code 9"),
        "{err}"
    );
}

#[test]
fn a_header_whose_sizes_overflow_is_corrupt() {
    let (dir, _path, mut bytes) = saved();
    // D = 1 and N with 8 N + 4 N D = 2^64 - 4: the payload check passes in
    // u64 and the header, payload and table no longer fit in one.
    let n: u64 = 0x1555_5555_5555_5555;
    let payload: u64 = 12 * n;
    assert_eq!(payload, 0xFFFF_FFFF_FFFF_FFFC);
    bytes[16..24].copy_from_slice(&1u64.to_le_bytes());
    bytes[24..32].copy_from_slice(&n.to_le_bytes());
    bytes[32..40].copy_from_slice(&payload.to_le_bytes());
    let crc = crc32(&bytes[..40]);
    bytes[40..44].copy_from_slice(&crc.to_le_bytes());
    let err = open_bytes(dir.path(), &bytes).expect_err("overflow");
    assert!(
        err.to_string()
            .contains("corrupt at offset 32: payload length 18446744073709551612 does not fit"),
        "{err}"
    );
}

#[test]
fn the_zero_field_and_a_header_that_lies_are_refused_by_open_and_file_info() {
    let (dir, _path, bytes) = saved();
    // Bytes 44..48 are not under the header checksum: checked on their own.
    let mut zero = bytes.clone();
    zero[45] = 0xFF;
    let err = open_bytes(dir.path(), &zero).expect_err("zero field");
    assert!(
        err.to_string()
            .contains("corrupt at offset 44: the field at bytes 44..48 is 0xff00, expected zero"),
        "{err}"
    );
    let file = dir.path().join("zero.topkidx");
    std::fs::write(&file, &zero).expect("write");
    let err = Index::file_info(&file).expect_err("file_info of the zero field");
    assert!(
        matches!(err, IndexError::Corrupt { offset: 44, .. }),
        "{err}"
    );
    // file_info checks the header checksum and the sizes too.
    let mut flipped = bytes.clone();
    flipped[20] ^= 1;
    std::fs::write(&file, &flipped).expect("write");
    let err = Index::file_info(&file).expect_err("file_info of a bad checksum");
    assert!(
        matches!(
            err,
            IndexError::Checksum {
                start: 0,
                end: 40,
                ..
            }
        ),
        "{err}"
    );
    std::fs::write(&file, &bytes[..bytes.len() - 1]).expect("write");
    let err = Index::file_info(&file).expect_err("file_info of a short file");
    assert!(matches!(err, IndexError::Truncated { .. }), "{err}");
    std::fs::write(&file, &bytes).expect("write");
    let info = Index::file_info(&file).expect("file_info of the saved file");
    assert!(!info.graph);
}

/// The names in `dir`, sorted.
fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("list")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[cfg(unix)]
#[test]
fn a_save_that_runs_out_of_space_keeps_the_previous_file() {
    const NAME: &str = "a_save_that_runs_out_of_space_keeps_the_previous_file";
    if !topk_testkit::files::full_disk_child(NAME) {
        return;
    }
    // In a child whose files stop at 512 bytes: the small index fits.
    let (dir, path, bytes) = saved();
    assert!(bytes.len() < 512, "{} bytes", bytes.len());
    let mut big = small();
    let ids: Vec<u64> = (100..1100).collect();
    big.add(&ids, Array2::from_elem((1000, 2), 0.25).view())
        .expect("add");
    let err = big.save(&path).expect_err("no room");
    // Named by the file asked for, not the deleted temporary one.
    assert!(
        matches!(&err, IndexError::Io { path: p, .. } if *p == path),
        "{err}"
    );
    assert_eq!(
        std::fs::read(&path).expect("read"),
        bytes,
        "previous file intact"
    );
    unchanged(&Index::open(&path, IndexBackend::Cpu).expect("open"));
    assert_eq!(
        names_in(dir.path()),
        ["small.topkidx"],
        "no temporary file left"
    );
}

#[test]
fn a_save_refused_before_writing_keeps_the_previous_file() {
    let (dir, path, bytes) = saved();
    // A save under a name of 255 bytes (the longest a folder entry takes)
    // has a shortened temporary name and succeeds.
    let long = dir.path().join("x".repeat(255));
    small().save(&long).expect("save under a long name");
    unchanged(&Index::open(&long, IndexBackend::Cpu).expect("open"));
    std::fs::remove_file(&long).expect("rm");
    // A path whose folder is a file: nothing can be created there.
    let err = small()
        .save(path.join("inner.topkidx"))
        .expect_err("not a folder");
    assert!(
        matches!(
            err,
            IndexError::Io {
                op: "create a temporary file beside",
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("inner.topkidx"), "{err}");
    assert_eq!(std::fs::read(&path).expect("read"), bytes);
    assert_eq!(names_in(dir.path()), ["small.topkidx"]);
}

#[test]
fn concurrent_saves_of_one_path_each_leave_a_whole_file() {
    let (dir, path, _) = saved();
    let indexes: Vec<Index> = (0..8u64)
        .map(|t| {
            let mut ix = small();
            let ids: Vec<u64> = (0..200).map(|i| 1000 * (t + 1) + i).collect();
            ix.add(&ids, Array2::from_elem((200, 2), t as f32).view())
                .expect("add");
            ix
        })
        .collect();
    std::thread::scope(|s| {
        for ix in &indexes {
            let path = &path;
            s.spawn(move || {
                for _ in 0..5 {
                    ix.save(path).expect("save");
                    // Whatever save landed last, the file is one whole index.
                    let back = Index::open(path, IndexBackend::Cpu).expect("open");
                    assert_eq!(back.len(), 203);
                }
            });
        }
    });
    let back = Index::open(&path, IndexBackend::Cpu).expect("open");
    assert!(indexes.iter().any(|ix| ix.ids() == back.ids()));
    assert_eq!(names_in(dir.path()), ["small.topkidx"]);
}

#[cfg(unix)]
#[test]
fn a_fifo_is_refused_without_blocking() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fifo = dir.path().join("pipe.topkidx");
    topk_testkit::files::mkfifo(&fifo);
    let err = Index::open(&fifo, IndexBackend::Cpu).expect_err("a FIFO");
    assert!(err.to_string().contains("is a FIFO"), "{err}");
    let err = Index::file_info(&fifo).expect_err("a FIFO");
    assert!(err.to_string().contains("is a FIFO"), "{err}");
    let err = Index::open(dir.path(), IndexBackend::Cpu).expect_err("a folder");
    assert!(err.to_string().contains("is a directory"), "{err}");
}

#[test]
fn saving_writes_live_rows_only_and_leaves_the_index_as_it_was() {
    let mut ix = small();
    ix.add(
        &[1, 2, 3, 4, 5, 6, 7, 8, 9],
        Array2::from_elem((9, 2), 0.5).view(),
    )
    .expect("add");
    assert_eq!(ix.remove(&[1, 2]), 2);
    assert_eq!(ix.tombstones(), 2);
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("t.topkidx");
    ix.save(&path).expect("save");
    assert_eq!(ix.tombstones(), 2);
    let back = Index::open(&path, IndexBackend::Cpu).expect("open");
    assert_eq!(back.tombstones(), 0);
    assert_eq!(back.ids(), ix.ids());
    assert_eq!(
        std::fs::metadata(&path).expect("meta").len(),
        48 + 10 * 8 + 10 * 2 * 4 + 8
    );
}

#[test]
fn files_of_several_blocks_round_trip_and_name_the_bad_block() {
    let (n, d) = (20_000usize, 16usize);
    let data: Vec<f32> = (0..n * d)
        .map(|v| ((v * 7919) % 1000) as f32 / 100.0 - 5.0)
        .collect();
    let rows = ArrayView2::from_shape((n, d), &data).expect("shape");
    let ids: Vec<u64> = (0..n as u64).map(|i| MAX_ID - 2 * i).collect();
    let ix = Index::with_ids(&ids, rows, Metric::Cosine, IndexBackend::Cpu).expect("index");
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("big.topkidx");
    ix.save(&path).expect("save");
    let back = Index::open(&path, IndexBackend::Oracle).expect("open");
    assert_eq!(back.ids(), ix.ids());
    for &id in ids.iter().step_by(997) {
        assert_eq!(back.get(id), ix.get(id));
    }
    let q = &data[..d];
    let got = back.search(q, 20, None).expect("search");
    let want = ix.search(q, 20, None).expect("search");
    assert_eq!(
        got.iter()
            .map(|h| (h.id, h.score.to_bits()))
            .collect::<Vec<_>>(),
        want.iter()
            .map(|h| (h.id, h.score.to_bits()))
            .collect::<Vec<_>>()
    );
    let mut bytes = std::fs::read(&path).expect("read");
    let payload = (8 * n + 4 * n * d) as u64;
    let second = 48 + (1u64 << 20);
    bytes[second as usize + 100] ^= 4;
    let err = open_bytes(dir.path(), &bytes).expect_err("flip");
    assert!(
        matches!(err, IndexError::Checksum { start, end, .. } if start == second && end == 48 + payload),
        "{err}"
    );
}

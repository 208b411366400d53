//! One test per way a file can be wrong: each gives its own typed error,
//! naming the file and, where the contents are at fault, the offset and row.

use std::path::{Path, PathBuf};

use ndarray::{array, Array2};
use tempfile::TempDir;
use topk_core::Neighbor;
mod common;
use common::npy;

use topk_io::{
    read_fvecs, read_ids, read_matrix, read_npy_f32, results, write_fvecs, write_ivecs, write_npy,
    write_npy_f32, write_vecs, Error, MappedMatrix,
};

fn dir() -> TempDir {
    tempfile::tempdir().unwrap()
}

fn file(dir: &TempDir, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.path().join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// The error's message names the file; returns the message for further checks.
fn names_file(e: &Error, path: &Path) -> String {
    let m = e.to_string();
    assert!(m.contains(&path.display().to_string()), "{m}");
    assert_eq!(e.path(), path);
    m
}

const F4_2X3: &str = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";

#[test]
fn well_formed_handmade_npy_reads() {
    let dir = dir();
    let p = file(
        &dir,
        "ok.npy",
        &npy(F4_2X3, &f32_bytes(&[1., 2., 3., 4., 5., 6.])),
    );
    assert_eq!(
        read_npy_f32(&p).unwrap(),
        array![[1., 2., 3.], [4., 5., 6.]]
    );
}

// ---- the file as a whole ---------------------------------------------------

#[test]
fn missing_file() {
    let dir = dir();
    let p = dir.path().join("absent.npy");
    let e = read_matrix(&p).unwrap_err();
    let m = names_file(&e, &p);
    assert!(
        matches!(&e, Error::Io { op: "open", source, .. } if source.kind() == std::io::ErrorKind::NotFound)
    );
    assert!(m.contains("cannot open"), "{m}");
}

#[test]
fn directory_instead_of_file() {
    let dir = dir();
    let p = dir.path().join("d.fvecs");
    std::fs::create_dir(&p).unwrap();
    let e = read_matrix(&p).unwrap_err();
    assert!(
        matches!(e, Error::NotAFile { .. } | Error::Io { .. }),
        "{e}"
    );
    names_file(&e, &p);
}

#[test]
fn empty_file() {
    let dir = dir();
    for name in ["e.npy", "e.fvecs", "e.bvecs"] {
        let p = file(&dir, name, b"");
        let e = read_matrix(&p).unwrap_err();
        assert!(matches!(e, Error::Empty { .. }), "{name}: {e}");
        assert!(names_file(&e, &p).contains("empty"));
    }
    let p = file(&dir, "e.ivecs", b"");
    assert!(matches!(read_ids(&p), Err(Error::Empty { .. })));
}

#[test]
fn unknown_extension() {
    let dir = dir();
    let p = file(&dir, "rows.csv", b"1,2,3\n");
    let e = read_matrix(&p).unwrap_err();
    assert!(matches!(e, Error::UnknownFormat { .. }), "{e}");
    assert!(names_file(&e, &p).contains(".fvecs"));
    let e = write_npy_f32(dir.path().join("x"), Array2::zeros((1, 1)).view());
    assert!(e.is_ok(), "write_npy does not care about the extension");
    let e =
        topk_io::write_matrix(dir.path().join("x.txt"), Array2::zeros((1, 1)).view()).unwrap_err();
    assert!(matches!(e, Error::UnknownFormat { .. }), "{e}");
}

#[cfg(unix)]
#[test]
fn non_utf8_path_of_a_missing_file() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let dir = dir();
    let p = dir.path().join(OsStr::from_bytes(b"\xff\xfe.npy"));
    let e = read_matrix(&p).unwrap_err();
    assert!(matches!(e, Error::Io { op: "open", .. }), "{e}");
    // The message shows the path lossily instead of failing to format.
    assert!(e.to_string().contains('\u{FFFD}'), "{e}");
}

// ---- .npy headers ------------------------------------------------------------

#[test]
fn npy_bad_magic() {
    let dir = dir();
    let p = file(&dir, "m.npy", b"PK\x03\x04 this is a zip, not an npy file");
    let e = read_npy_f32(&p).unwrap_err();
    assert!(matches!(e, Error::NpyHeader { offset: 0, .. }), "{e}");
    assert!(names_file(&e, &p).contains("not an .npy file"));
}

#[test]
fn npy_header_cut_short() {
    let dir = dir();
    let whole = npy(F4_2X3, &f32_bytes(&[0.0; 6]));
    let p = file(&dir, "h.npy", &whole[..30]);
    let e = read_npy_f32(&p).unwrap_err();
    assert!(matches!(e, Error::NpyHeader { offset: 30, .. }), "{e}");
    assert!(names_file(&e, &p).contains("ends at byte 30"));
}

#[test]
fn npy_header_declaring_more_bytes_than_the_file_has() {
    // A version-2 header declaring 4 GiB in a 12-byte file is refused from
    // the file's length, before anything of that size is allocated.
    let dir = dir();
    let p = file(&dir, "big.npy", b"\x93NUMPY\x02\x00\xff\xff\xff\xff");
    let e = read_npy_f32(&p).unwrap_err();
    assert!(matches!(e, Error::NpyHeader { offset: 12, .. }), "{e}");
    let m = names_file(&e, &p);
    assert!(m.contains("declares 4294967307 bytes"), "{m}");
    let e = topk_io::Mapped::<f32>::open_npy(&p).unwrap_err();
    assert!(matches!(e, Error::NpyHeader { offset: 12, .. }), "{e}");
    // Version 1 the same way: 65,545 bytes declared, 40 present.
    let mut v1 = npy(F4_2X3, &[]);
    v1.truncate(40);
    v1[8..10].copy_from_slice(&u16::MAX.to_le_bytes());
    let p = file(&dir, "big1.npy", &v1);
    let e = read_npy_f32(&p).unwrap_err();
    assert!(names_file(&e, &p).contains("declares 65545 bytes"), "{e}");
}

#[test]
fn bvecs_first_row_declaring_two_gigabytes_is_truncated() {
    let dir = dir();
    let p = file(&dir, "huge.bvecs", &[0xff, 0xff, 0xff, 0x7f, 0, 0, 0, 0]);
    let e = read_matrix(&p).unwrap_err();
    assert!(matches!(e, Error::Truncated { row: 0, .. }), "{e}");
}

#[test]
fn zero_width_results_of_2_to_the_62_rows_are_refused_not_allocated() {
    let dir = dir();
    let shape = "'shape': (4611686018427387904, 0), }";
    let idx = npy(
        &format!("{{'descr': '<u4', 'fortran_order': False, {shape}"),
        &[],
    );
    let sc = npy(
        &format!("{{'descr': '<f4', 'fortran_order': False, {shape}"),
        &[],
    );
    let p = file(&dir, "r.npy", &idx);
    file(&dir, "r.scores.npy", &sc);
    let e = results::read_results(&p).unwrap_err();
    assert!(matches!(e, Error::OutOfMemory { .. }), "{e}");
}

#[test]
fn npy_unknown_version() {
    let dir = dir();
    let mut bytes = npy(F4_2X3, &f32_bytes(&[0.0; 6]));
    bytes[6] = 9;
    let p = file(&dir, "v.npy", &bytes);
    let e = read_npy_f32(&p).unwrap_err();
    assert!(matches!(e, Error::NpyHeader { offset: 6, .. }), "{e}");
    assert!(names_file(&e, &p).contains("9.0"));
}

#[test]
fn npy_header_dictionary_unparsable() {
    let dir = dir();
    let bytes = npy(
        "{'descr': '<f4', 'fortran_order': Nope, 'shape': (2, 3), }",
        &[0; 24],
    );
    let p = file(&dir, "d.npy", &bytes);
    let e = read_npy_f32(&p).unwrap_err();
    assert!(matches!(e, Error::NpyHeader { offset: 10, .. }), "{e}");
    names_file(&e, &p);
}

#[test]
fn npy_wrong_dtype() {
    let dir = dir();
    let p = file(
        &dir,
        "f8.npy",
        &npy(
            "{'descr': '<f8', 'fortran_order': False, 'shape': (2, 3), }",
            &[0; 48],
        ),
    );
    let e = read_npy_f32(&p).unwrap_err();
    assert!(
        matches!(&e, Error::Dtype { found, .. } if found == "float64 ('<f8')"),
        "{e}"
    );
    let m = names_file(&e, &p);
    assert!(m.contains("float32") && m.contains("float64"), "{m}");
}

#[test]
fn npy_big_endian_float32() {
    let dir = dir();
    let p = file(
        &dir,
        "be.npy",
        &npy(
            "{'descr': '>f4', 'fortran_order': False, 'shape': (2, 3), }",
            &[0; 24],
        ),
    );
    let e = read_npy_f32(&p).unwrap_err();
    assert!(matches!(e, Error::Dtype { .. }), "{e}");
    assert!(names_file(&e, &p).contains("big-endian float32"));
}

#[test]
fn npy_structured_dtype() {
    let dir = dir();
    let p = file(
        &dir,
        "s.npy",
        &npy(
            "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2, 3), }",
            &[0; 24],
        ),
    );
    let e = read_npy_f32(&p).unwrap_err();
    assert!(matches!(e, Error::Dtype { .. }), "{e}");
    names_file(&e, &p);
}

#[test]
fn npy_fortran_order() {
    let dir = dir();
    let p = file(
        &dir,
        "f.npy",
        &npy(
            "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }",
            &[0; 24],
        ),
    );
    let e = read_npy_f32(&p).unwrap_err();
    assert!(matches!(e, Error::FortranOrder { .. }), "{e}");
    assert!(names_file(&e, &p).contains("Fortran"));
    // With a single row both orders are the same bytes, so that file is fine.
    let p = file(
        &dir,
        "f1.npy",
        &npy(
            "{'descr': '<f4', 'fortran_order': True, 'shape': (1, 3), }",
            &f32_bytes(&[1., 2., 3.]),
        ),
    );
    assert_eq!(read_npy_f32(&p).unwrap(), array![[1., 2., 3.]]);
}

#[test]
fn npy_not_two_dimensional() {
    let dir = dir();
    for (shape, n) in [("(6,)", 6), ("(1, 2, 3)", 6), ("()", 1)] {
        let dict = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {shape}, }}");
        let p = file(&dir, "n.npy", &npy(&dict, &vec![0; 4 * n]));
        let e = read_npy_f32(&p).unwrap_err();
        assert!(matches!(e, Error::Ndim { .. }), "{shape}: {e}");
        assert!(names_file(&e, &p).contains("2-D"));
    }
}

#[test]
fn npy_shape_too_large_to_address() {
    let dir = dir();
    let dict = format!(
        "{{'descr': '<f4', 'fortran_order': False, 'shape': ({}, 8), }}",
        u64::MAX / 4
    );
    let p = file(&dir, "big.npy", &npy(&dict, &[0; 64]));
    let e = read_npy_f32(&p).unwrap_err();
    assert!(matches!(e, Error::TooLarge { .. }), "{e}");
    names_file(&e, &p);
    // Zero bytes of data, but a row count no array can have.
    let dict = format!(
        "{{'descr': '<f4', 'fortran_order': False, 'shape': ({}, 0), }}",
        u64::MAX
    );
    let p = file(&dir, "rows.npy", &npy(&dict, &[]));
    let e = read_npy_f32(&p).unwrap_err();
    assert!(matches!(e, Error::TooLarge { .. }), "{e}");
}

// ---- .npy data ---------------------------------------------------------------

#[test]
fn npy_truncated_data() {
    let dir = dir();
    let bytes = npy(F4_2X3, &f32_bytes(&[0.0; 6]));
    let cut = bytes.len() - 5; // inside row 1 (the second row)
    let p = file(&dir, "t.npy", &bytes[..cut]);
    let e = read_npy_f32(&p).unwrap_err();
    let header = (bytes.len() - 24) as u64;
    assert!(
        matches!(e, Error::Truncated { row: 1, offset, needed, len, .. }
            if offset == header + 12 && needed == header + 24 && len == cut as u64),
        "{e}"
    );
    let m = names_file(&e, &p);
    let at = format!("byte {}", header + 12);
    assert!(m.contains("row 1") && m.contains(&at), "{m}");
}

#[test]
fn npy_trailing_bytes() {
    let dir = dir();
    let mut bytes = npy(F4_2X3, &f32_bytes(&[0.0; 6]));
    let end = bytes.len() as u64;
    bytes.extend_from_slice(&[1, 2, 3]);
    let p = file(&dir, "x.npy", &bytes);
    let e = read_npy_f32(&p).unwrap_err();
    assert!(
        matches!(e, Error::TrailingBytes { offset, extra: 3, .. } if offset == end),
        "{e}"
    );
    names_file(&e, &p);
}

#[test]
fn npy_data_at_an_unaligned_offset_is_copied_not_refused() {
    // A header padded to an odd length: legal numpy syntax (numpy reads it),
    // but no f32 view of a mapping can start there, so the values are copied.
    let dir = dir();
    let mut header = F4_2X3.to_owned();
    header.push('\n');
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend_from_slice(&(header.len() as u16).to_le_bytes());
    bytes.extend_from_slice(header.as_bytes());
    assert_ne!(bytes.len() % 4, 0, "the test needs an unaligned header");
    let values = [1.0_f32, -2.0, 3.5, 4.0, 5.0, -6.25];
    bytes.extend_from_slice(&f32_bytes(&values));
    let p = file(&dir, "a.npy", &bytes);
    let expect = ndarray::Array2::from_shape_vec((2, 3), values.to_vec()).unwrap();
    assert_eq!(read_npy_f32(&p).unwrap(), expect);
    assert_eq!(read_matrix(&p).unwrap(), expect);
    let mapped = topk_io::MappedMatrix::open(&p).unwrap();
    assert_eq!(mapped.view(), expect.view());
    assert_eq!(mapped.row(1), Some(&values[3..]));
}

// ---- .?vecs ------------------------------------------------------------------

fn fvecs_file(dir: &TempDir, name: &str, rows: usize, d: usize) -> (PathBuf, Vec<u8>) {
    let p = dir.path().join(name);
    let a = Array2::from_shape_fn((rows, d), |(i, j)| (i * d + j) as f32);
    write_fvecs(&p, a.view()).unwrap();
    let bytes = std::fs::read(&p).unwrap();
    (p, bytes)
}

#[test]
fn vecs_inconsistent_row_dimension() {
    let dir = dir();
    let (p, mut bytes) = fvecs_file(&dir, "r.fvecs", 5, 4);
    // Row 3 starts at 3 * (4 + 16) = 60; its field now says 5.
    bytes[60..64].copy_from_slice(&5_i32.to_le_bytes());
    std::fs::write(&p, &bytes).unwrap();
    let e = read_fvecs(&p).unwrap_err();
    assert!(
        matches!(
            e,
            Error::RowDimension {
                row: 3,
                offset: 60,
                expected: 4,
                found: 5,
                ..
            }
        ),
        "{e}"
    );
    let m = names_file(&e, &p);
    assert!(m.contains("row 3") && m.contains("byte 60"), "{m}");
}

#[test]
fn vecs_inconsistent_last_row_is_caught() {
    // The bug class of readers that trust row 0: a change only in the last row.
    let dir = dir();
    let (p, mut bytes) = fvecs_file(&dir, "last.fvecs", 3, 2);
    let last = 2 * 12;
    bytes[last..last + 4].copy_from_slice(&(-2_i32).to_le_bytes());
    std::fs::write(&p, &bytes).unwrap();
    let e = MappedMatrix::open(&p).unwrap_err();
    assert!(
        matches!(
            e,
            Error::RowDimension {
                row: 2,
                found: -2,
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn vecs_truncated_inside_a_row() {
    let dir = dir();
    let (p, bytes) = fvecs_file(&dir, "t.fvecs", 4, 3);
    std::fs::write(&p, &bytes[..bytes.len() - 2]).unwrap();
    let e = read_fvecs(&p).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Truncated {
                row: 3,
                offset: 48,
                needed: 64,
                len: 62,
                ..
            }
        ),
        "{e}"
    );
    names_file(&e, &p);
}

#[test]
fn vecs_truncated_inside_a_dimension_field() {
    let dir = dir();
    let (p, mut bytes) = fvecs_file(&dir, "f.fvecs", 2, 3);
    bytes.extend_from_slice(&[3, 0]);
    std::fs::write(&p, &bytes).unwrap();
    let e = read_fvecs(&p).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Truncated {
                row: 2,
                offset: 32,
                needed: 36,
                len: 34,
                ..
            }
        ),
        "{e}"
    );
    let p = file(&dir, "tiny.fvecs", &[1, 0]);
    let e = read_fvecs(&p).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Truncated {
                row: 0,
                needed: 4,
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn vecs_first_dimension_not_positive() {
    let dir = dir();
    for d in [0_i32, -7] {
        let mut bytes = d.to_le_bytes().to_vec();
        bytes.extend_from_slice(&[0; 16]);
        let p = file(&dir, "z.fvecs", &bytes);
        let e = read_fvecs(&p).unwrap_err();
        assert!(
            matches!(e, Error::BadDimension { found, .. } if found == d),
            "{e}"
        );
        names_file(&e, &p);
    }
}

#[test]
fn ivecs_read_as_floats() {
    let dir = dir();
    let p = dir.path().join("gt.ivecs");
    write_ivecs(&p, array![[1, 2]].view()).unwrap();
    let e = read_matrix(&p).unwrap_err();
    assert!(matches!(e, Error::Dtype { .. }), "{e}");
    assert!(names_file(&e, &p).contains("int32"));
    let e = MappedMatrix::open(&p).unwrap_err();
    assert!(matches!(e, Error::Dtype { .. }), "{e}");
}

#[test]
fn negative_id() {
    let dir = dir();
    let p = dir.path().join("gt.ivecs");
    write_ivecs(&p, array![[1, 2], [3, -4]].view()).unwrap();
    let e = read_ids(&p).unwrap_err();
    assert!(
        matches!(
            e,
            Error::OutOfRange {
                row: 1,
                column: 1,
                value: -4,
                ..
            }
        ),
        "{e}"
    );
    let p = dir.path().join("gt.npy");
    write_npy(&p, array![[0_i64, 1 << 40]].view()).unwrap();
    let e = read_ids(&p).unwrap_err();
    assert!(
        matches!(
            e,
            Error::OutOfRange {
                row: 0,
                column: 1,
                ..
            }
        ),
        "{e}"
    );
    let p = dir.path().join("gt_f.npy");
    write_npy_f32(&p, array![[0.0_f32]].view()).unwrap();
    let e = read_ids(&p).unwrap_err();
    assert!(matches!(e, Error::Dtype { .. }), "{e}");
}

// ---- writing -----------------------------------------------------------------

#[test]
fn vecs_cannot_hold_empty_shapes() {
    let dir = dir();
    let p = dir.path().join("w.fvecs");
    let e = write_vecs(&p, Array2::<f32>::zeros((0, 3)).view()).unwrap_err();
    assert!(matches!(e, Error::Unwritable { .. }), "{e}");
    let e = write_vecs(&p, Array2::<f32>::zeros((3, 0)).view()).unwrap_err();
    assert!(matches!(e, Error::Unwritable { .. }), "{e}");
    assert!(names_file(&e, &p).contains("dimension 0"));
}

#[test]
fn write_into_missing_directory() {
    let dir = dir();
    let p = dir.path().join("no/such/dir/a.npy");
    let e = write_npy_f32(&p, Array2::zeros((1, 1)).view()).unwrap_err();
    assert!(matches!(e, Error::Io { op: "create", .. }), "{e}");
    names_file(&e, &p);
}

// ---- result files ------------------------------------------------------------

#[test]
fn results_npy_with_mismatched_score_file() {
    let dir = dir();
    let p = dir.path().join("r.npy");
    let results = vec![vec![Neighbor::new(1, 1.0)]];
    topk_io::write_results(&p, &results).unwrap();
    write_npy_f32(topk_io::scores_path(&p), Array2::zeros((2, 1)).view()).unwrap();
    let e = topk_io::read_results(&p).unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch { .. }), "{e}");
}

#[test]
fn results_npy_need_equal_rows() {
    let dir = dir();
    let p = dir.path().join("r.npy");
    let results = vec![vec![Neighbor::new(1, 1.0)], vec![]];
    let e = topk_io::write_results(&p, &results).unwrap_err();
    assert!(matches!(e, Error::Unwritable { .. }), "{e}");
    assert!(e.to_string().contains("query 1"), "{e}");
}

#[test]
fn results_jsonl_bad_line() {
    let dir = dir();
    let p = file(
        &dir,
        "r.jsonl",
        b"{\"query\":0,\"indices\":[1],\"scores\":[0.5]}\n{\"query\":1,\"indices\":[1,2],\"scores\":[0.5]}\n",
    );
    let e = results::read_results_jsonl(&p).unwrap_err();
    assert!(matches!(e, Error::Jsonl { line: 2, .. }), "{e}");
    let p = file(
        &dir,
        "s.jsonl",
        b"{\"query\":0,\"indices\":[1],\"scores\":[\"x\"]}\n",
    );
    let e = results::read_results_jsonl(&p).unwrap_err();
    assert!(matches!(e, Error::Jsonl { line: 1, .. }), "{e}");
    let p = file(&dir, "t.jsonl", b"not json\n");
    assert!(matches!(
        results::read_results_jsonl(&p),
        Err(Error::Jsonl { line: 1, .. })
    ));
}

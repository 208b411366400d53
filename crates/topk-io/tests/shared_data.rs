//! The real embeddings in `shared/data/minilm-docs-20k`, written by numpy:
//! the `.npy` and `.?vecs` copies of each array must agree bit for bit.
//! Skipped, with a message, where the data is absent (a failure under
//! `TOPK_REQUIRE_DATA=1`).

use std::path::PathBuf;

use topk_io::{
    npy_info, read_fvecs, read_ids, read_ivecs, read_matrix, read_npy_f32, read_npy_i32,
    MappedMatrix,
};

/// `../shared/data/minilm-docs-20k` from the repository root, or `None`
/// (with a message) where it is absent and `TOPK_REQUIRE_DATA=1` is not set.
fn data_dir() -> Option<PathBuf> {
    topk_testkit::shared_data("minilm-docs-20k")
}

#[test]
fn queries_fvecs_equal_queries_npy() {
    let Some(dir) = data_dir() else { return };
    let npy = read_npy_f32(dir.join("queries.npy")).unwrap();
    let fvecs = read_fvecs(dir.join("queries.fvecs")).unwrap();
    assert_eq!(npy.dim(), (500, 384));
    assert_eq!(fvecs.dim(), npy.dim());
    assert!(npy
        .iter()
        .zip(&fvecs)
        .all(|(a, b)| a.to_bits() == b.to_bits()));
    // The mapped view of the .fvecs file is strided over the row fields.
    let mapped = MappedMatrix::open(dir.join("queries.fvecs")).unwrap();
    assert_eq!(mapped.view(), npy.view());
    assert_eq!(mapped.row(499).unwrap(), &npy.row(499).to_vec()[..]);
}

#[test]
fn ground_truth_ivecs_equal_ground_truth_npy() {
    let Some(dir) = data_dir() else { return };
    // numpy saved the ids as int32.
    assert_eq!(npy_info(dir.join("gt_top100.npy")).unwrap().descr, "<i4");
    let npy = read_npy_i32(dir.join("gt_top100.npy")).unwrap();
    let ivecs = read_ivecs(dir.join("gt_top100.ivecs")).unwrap();
    assert_eq!(npy.dim(), (500, 100));
    assert_eq!(npy, ivecs);
    let ids = read_ids(dir.join("gt_top100.npy")).unwrap();
    assert_eq!(ids, read_ids(dir.join("gt_top100.ivecs")).unwrap());
    assert!(ids.iter().all(|&i| i < 20_000));
}

#[test]
fn corpus_maps_and_reads_the_same() {
    let Some(dir) = data_dir() else { return };
    let path = dir.join("corpus.npy");
    let mapped = MappedMatrix::open(&path).unwrap();
    assert_eq!((mapped.rows(), mapped.dim()), (20_000, 384));
    let owned = read_matrix(&path).unwrap();
    assert_eq!(mapped.view(), owned.view());
    // The rows are L2-normalised embeddings.
    for i in [0, 9_999, 19_999] {
        let norm = topk_core::canon_norm(mapped.row(i).unwrap());
        assert!((norm - 1.0).abs() < 1e-3, "row {i}: norm {norm}");
    }
}

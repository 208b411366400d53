//! Round trips through every format: what is written reads back bit for bit,
//! through the owned readers and the memory-mapped views alike.

use ndarray::{Array2, ArrayView2};
use proptest::prelude::*;
use tempfile::TempDir;
use topk_core::Neighbor;
mod common;
use common::npy;

use topk_io::{
    read_bvecs, read_fvecs, read_ids, read_ivecs, read_matrix, read_npy_f32, read_npy_i32,
    read_npy_u32, results, write_bvecs, write_fvecs, write_ivecs, write_matrix, write_npy,
    write_npy_f32, write_npy_i32, write_npy_u32, Format, Mapped, MappedMatrix,
};

fn dir() -> TempDir {
    tempfile::tempdir().unwrap()
}

fn bits(a: ArrayView2<'_, f32>) -> Vec<u32> {
    a.iter().map(|v| v.to_bits()).collect()
}

/// Values with the awkward cases in them: signed zeros, subnormals, extremes.
fn special_f32() -> impl Strategy<Value = f32> + Clone {
    prop_oneof![
        4 => -1e3_f32..1e3,
        1 => Just(-0.0_f32),
        1 => Just(f32::MIN_POSITIVE / 4.0),
        1 => Just(f32::MAX),
        1 => Just(f32::MIN),
        1 => any::<f32>().prop_filter("finite", |v| v.is_finite()),
    ]
}

fn matrix<T: std::fmt::Debug + Clone>(
    elem: impl Strategy<Value = T> + Clone,
    max_rows: usize,
) -> impl Strategy<Value = Array2<T>> {
    (1..max_rows, 1..40usize).prop_flat_map(move |(n, d)| {
        prop::collection::vec(elem.clone(), n * d)
            .prop_map(move |v| Array2::from_shape_vec((n, d), v).unwrap())
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn npy_f32_roundtrip(a in matrix(special_f32(), 30)) {
        let dir = dir();
        let p = dir.path().join("a.npy");
        write_npy_f32(&p, a.view()).unwrap();
        let back = read_npy_f32(&p).unwrap();
        prop_assert_eq!(back.dim(), a.dim());
        prop_assert_eq!(bits(back.view()), bits(a.view()));
        let mapped = MappedMatrix::open(&p).unwrap();
        prop_assert_eq!(mapped.format(), Format::Npy);
        prop_assert_eq!(bits(mapped.view()), bits(a.view()));
        for i in 0..a.nrows() {
            prop_assert_eq!(mapped.row(i).unwrap(), &a.row(i).to_vec()[..]);
        }
        prop_assert!(mapped.row(a.nrows()).is_none());
    }

    #[test]
    fn fvecs_roundtrip(a in matrix(special_f32(), 30)) {
        let dir = dir();
        let p = dir.path().join("a.fvecs");
        write_fvecs(&p, a.view()).unwrap();
        prop_assert_eq!(
            std::fs::metadata(&p).unwrap().len() as usize,
            a.nrows() * (4 + 4 * a.ncols())
        );
        let back = read_fvecs(&p).unwrap();
        prop_assert_eq!(bits(back.view()), bits(a.view()));
        prop_assert!(back.is_standard_layout());
        let mapped = MappedMatrix::open(&p).unwrap();
        prop_assert_eq!((mapped.rows(), mapped.dim()), a.dim());
        prop_assert_eq!(bits(mapped.view()), bits(a.view()));
        let last = a.nrows() - 1;
        prop_assert_eq!(mapped.row(last).unwrap(), &a.row(last).to_vec()[..]);
    }

    #[test]
    fn ivecs_and_int_npy_roundtrip(a in matrix(any::<i32>(), 30)) {
        let dir = dir();
        let v = dir.path().join("a.ivecs");
        write_ivecs(&v, a.view()).unwrap();
        prop_assert_eq!(read_ivecs(&v).unwrap(), a.clone());
        let n = dir.path().join("a.npy");
        write_npy_i32(&n, a.view()).unwrap();
        prop_assert_eq!(read_npy_i32(&n).unwrap(), a.clone());
        prop_assert_eq!(Mapped::<i32>::open(&v).unwrap().to_array(), a);
    }

    #[test]
    fn bvecs_roundtrip(a in matrix(any::<u8>(), 30)) {
        let dir = dir();
        let p = dir.path().join("a.bvecs");
        write_bvecs(&p, a.view()).unwrap();
        prop_assert_eq!(read_bvecs(&p).unwrap(), a.clone());
        // Rows of 4 + d bytes: the mapped view is strided and unaligned-safe for u8.
        let mapped = Mapped::<u8>::open(&p).unwrap();
        prop_assert_eq!(mapped.view(), a.view());
        prop_assert_eq!(read_matrix(&p).unwrap(), a.mapv(f32::from));
    }

    #[test]
    fn results_roundtrip(
        scores in prop::collection::vec(special_f32(), 1..60),
        k in 1..6usize,
    ) {
        let q = scores.len() / k;
        prop_assume!(q > 0);
        let results: Vec<Vec<Neighbor>> = (0..q)
            .map(|i| (0..k).map(|j| Neighbor::new((i * 31 + j) as u32, scores[i * k + j])).collect())
            .collect();
        let dir = dir();
        for name in ["r.jsonl", "r.npy"] {
            let p = dir.path().join(name);
            topk_io::write_results(&p, &results).unwrap();
            let back = topk_io::read_results(&p).unwrap();
            prop_assert_eq!(back.len(), q);
            for (a, b) in back.iter().zip(&results) {
                prop_assert_eq!(a.len(), b.len());
                for (x, y) in a.iter().zip(b) {
                    prop_assert_eq!(x.index, y.index);
                    prop_assert_eq!(x.score.to_bits(), y.score.to_bits(), "{} in {}", y.score, name);
                }
            }
        }
    }
}

#[test]
fn transposed_views_are_written_in_c_order() {
    let dir = dir();
    let a = Array2::from_shape_fn((3, 5), |(i, j)| (i * 10 + j) as f32);
    let t = a.t();
    for name in ["t.npy", "t.fvecs"] {
        let p = dir.path().join(name);
        write_matrix(&p, t).unwrap();
        assert_eq!(read_matrix(&p).unwrap(), t.to_owned(), "{name}");
    }
    let info = topk_io::npy_info(dir.path().join("t.npy")).unwrap();
    assert!(!info.fortran_order);
    assert_eq!(info.shape, vec![5, 3]);
    assert_eq!(info.descr, "<f4");
    assert_eq!(info.data_offset % 64, 0);
}

#[test]
fn npy_with_zero_rows_roundtrips() {
    let dir = dir();
    let p = dir.path().join("empty.npy");
    let a = Array2::<f32>::zeros((0, 7));
    write_npy(&p, a.view()).unwrap();
    assert_eq!(read_npy_f32(&p).unwrap().dim(), (0, 7));
    let m = MappedMatrix::open(&p).unwrap();
    assert_eq!((m.rows(), m.dim()), (0, 7));
    assert!(m.row(0).is_none());
}

#[test]
fn ids_read_from_every_integer_format() {
    let dir = dir();
    let ids = Array2::from_shape_fn((4, 3), |(i, j)| (i * 3 + j) as u32 * 1000);
    let as_i32 = ids.mapv(|v| v as i32);
    let p = dir.path().join("gt.ivecs");
    write_ivecs(&p, as_i32.view()).unwrap();
    assert_eq!(read_ids(&p).unwrap(), ids);
    let p = dir.path().join("gt_i4.npy");
    write_npy_i32(&p, as_i32.view()).unwrap();
    assert_eq!(read_ids(&p).unwrap(), ids);
    let p = dir.path().join("gt_u4.npy");
    write_npy_u32(&p, ids.view()).unwrap();
    assert_eq!(read_ids(&p).unwrap(), ids);
    assert_eq!(read_npy_u32(&p).unwrap(), ids);
    let p = dir.path().join("gt_i8.npy");
    write_npy(&p, ids.mapv(i64::from).view()).unwrap();
    assert_eq!(read_ids(&p).unwrap(), ids);
}

#[test]
fn row_ids_are_every_value_in_row_major_order_whatever_the_shape() {
    let dir = dir();
    let ids = Array2::from_shape_fn((4, 3), |(i, j)| (i * 3 + j) as u32 * 1000);
    let flat: Vec<u64> = ids.iter().map(|&v| u64::from(v)).collect();
    let p = dir.path().join("ids.ivecs");
    write_ivecs(&p, ids.mapv(|v| v as i32).view()).unwrap();
    assert_eq!(topk_io::read_row_ids(&p).unwrap(), flat);
    let p = dir.path().join("ids_u4.npy");
    write_npy_u32(&p, ids.view()).unwrap();
    assert_eq!(topk_io::read_row_ids(&p).unwrap(), flat);
    // Above u32 (and i64) from uint64; one axis; a scalar.
    let big = [0u64, 1 << 40, u64::MAX];
    let p = dir.path().join("ids_u8.npy");
    write_npy(&p, ndarray::arr2(&[big]).view()).unwrap();
    assert_eq!(topk_io::read_row_ids(&p).unwrap(), big);
    let p = dir.path().join("one_axis.npy");
    let data: Vec<u8> = [7i32, 8, 9].iter().flat_map(|v| v.to_le_bytes()).collect();
    std::fs::write(
        &p,
        npy(
            "{'descr': '<i4', 'fortran_order': False, 'shape': (3,), }",
            &data,
        ),
    )
    .unwrap();
    assert_eq!(topk_io::read_row_ids(&p).unwrap(), [7, 8, 9]);
    let p = dir.path().join("scalar.npy");
    std::fs::write(
        &p,
        npy(
            "{'descr': '<i8', 'fortran_order': False, 'shape': (), }",
            &42i64.to_le_bytes(),
        ),
    )
    .unwrap();
    assert_eq!(topk_io::read_row_ids(&p).unwrap(), [42]);
    // Column-major values of a 2 x 2 array would come in another order.
    let p = dir.path().join("fortran.npy");
    let data: Vec<u8> = [1i32, 2, 3, 4]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    std::fs::write(
        &p,
        npy(
            "{'descr': '<i4', 'fortran_order': True, 'shape': (2, 2), }",
            &data,
        ),
    )
    .unwrap();
    let e = topk_io::read_row_ids(&p).unwrap_err();
    assert!(matches!(e, topk_io::Error::FortranOrder { .. }), "{e}");
    // One axis in Fortran order is the same bytes.
    std::fs::write(
        &p,
        npy(
            "{'descr': '<i4', 'fortran_order': True, 'shape': (4,), }",
            &data,
        ),
    )
    .unwrap();
    assert_eq!(topk_io::read_row_ids(&p).unwrap(), [1, 2, 3, 4]);
}

#[test]
fn jsonl_lines_have_the_documented_shape() {
    let dir = dir();
    let p = dir.path().join("r.jsonl");
    let results = vec![
        vec![Neighbor::new(7, 0.5), Neighbor::new(2, f32::NEG_INFINITY)],
        vec![Neighbor::new(1, 0.1), Neighbor::new(0, -0.0)],
    ];
    results::write_results_jsonl(&p, &results).unwrap();
    let text = std::fs::read_to_string(&p).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines,
        [
            r#"{"query":0,"indices":[7,2],"scores":[0.5,"-inf"]}"#,
            r#"{"query":1,"indices":[1,0],"scores":[0.1,-0.0]}"#,
        ]
    );
}

#[test]
fn npy_results_write_a_sibling_score_file() {
    let dir = dir();
    let p = dir.path().join("hits.npy");
    let results = vec![vec![Neighbor::new(3, 1.5), Neighbor::new(9, 0.25)]];
    let files = topk_io::write_results(&p, &results).unwrap();
    assert_eq!(files, vec![p.clone(), dir.path().join("hits.scores.npy")]);
    assert_eq!(topk_io::scores_path(&p), dir.path().join("hits.scores.npy"));
    assert_eq!(read_npy_u32(&p).unwrap(), ndarray::array![[3_u32, 9]]);
    assert_eq!(
        read_npy_f32(dir.path().join("hits.scores.npy")).unwrap(),
        ndarray::array![[1.5_f32, 0.25]]
    );
}

#[cfg(unix)]
#[test]
fn non_utf8_paths_work() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let dir = dir();
    let p = dir.path().join(OsStr::from_bytes(b"caf\xe9.fvecs"));
    let a = ndarray::array![[1.0_f32, -2.0]];
    write_matrix(&p, a.view()).unwrap();
    assert_eq!(read_matrix(&p).unwrap(), a);
}

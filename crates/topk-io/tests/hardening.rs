//! Inputs that are not regular files, and outputs that are written completely
//! or not at all: each test is named after what it caught.

use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

use ndarray::Array2;
use topk_core::Neighbor;
use topk_io::{read_matrix, read_results, write_matrix, Error, MappedMatrix, ResultFiles};

fn results(q: usize, k: usize) -> Vec<Vec<Neighbor>> {
    (0..q)
        .map(|i| {
            (0..k)
                .map(|j| Neighbor::new((i * k + j) as u32, -(j as f32)))
                .collect()
        })
        .collect()
}

/// Runs `f` on another thread; fails (instead of hanging) after ten seconds.
fn within_10s<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(10))
        .expect("the call blocked for 10 s")
}

fn not_a_file(path: &Path, kind: &str) {
    let p = path.to_owned();
    let e = within_10s(move || read_matrix(&p).unwrap_err());
    assert!(matches!(e, Error::NotAFile { .. }), "{e:?}");
    let m = e.to_string();
    assert!(
        m.contains(kind) && m.contains(&*path.to_string_lossy()),
        "{m}"
    );
    let p = path.to_owned();
    let e = within_10s(move || MappedMatrix::open(&p).unwrap_err());
    assert!(e.to_string().contains(kind), "{e}");
}

#[cfg(unix)]
#[test]
fn fifo_as_input_is_refused_without_blocking() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("corpus.npy");
    let status = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("mkfifo runs");
    assert!(status.success());
    not_a_file(&fifo, "is a FIFO");
}

#[cfg(unix)]
#[test]
fn dev_zero_linked_as_npy_is_a_character_device() {
    let dir = tempfile::tempdir().unwrap();
    let link = dir.path().join("x.npy");
    std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
    not_a_file(&link, "is a character device");
}

#[test]
fn directory_named_like_a_corpus_is_a_directory() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["c.npy", "c.fvecs", "c"] {
        let d = dir.path().join(name);
        std::fs::create_dir(&d).unwrap();
        let e = read_matrix(&d).unwrap_err();
        assert!(e.to_string().contains("is a directory"), "{e}");
    }
}

#[test]
fn failed_npy_write_keeps_the_previous_pair_and_leaves_no_temporary_file() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("r.npy");
    let good = results(3, 2);
    topk_io::write_results(&out, &good).unwrap();
    // Ragged results cannot be a matrix: the write fails after the temporary
    // files exist, and must leave the earlier pair as it was.
    let mut ragged = results(4, 2);
    ragged[2].pop();
    let e = ResultFiles::create(&out)
        .unwrap()
        .write(&ragged, 2)
        .unwrap_err();
    assert!(e.to_string().contains("query 2"), "{e}");
    assert_eq!(read_results(&out).unwrap(), good);
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
}

#[test]
fn a_failed_second_rename_puts_the_first_file_back() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("r.npy");
    let scores = topk_io::scores_path(&out);
    topk_io::write_results(&out, &results(3, 2)).unwrap();
    let old_scores = std::fs::read(&scores).unwrap();
    let files = ResultFiles::create(&out).unwrap();
    // The index file's name becomes a folder with a file in it after the
    // check: the scores are renamed first, the index rename then fails.
    std::fs::remove_file(&out).unwrap();
    std::fs::create_dir(&out).unwrap();
    std::fs::write(out.join("keep"), b"x").unwrap();
    let e = files.write(&results(5, 2), 2).unwrap_err();
    assert!(matches!(e, Error::Io { .. }), "{e}");
    assert_eq!(
        std::fs::read(&scores).unwrap(),
        old_scores,
        "scores put back"
    );
    assert!(out.join("keep").exists());
    let mut names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["r.npy", "r.scores.npy"], "no temporary file left");
}

#[test]
fn a_failed_second_rename_removes_a_first_file_that_was_new() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("r.npy");
    let files = ResultFiles::create(&out).unwrap();
    std::fs::create_dir(&out).unwrap();
    std::fs::write(out.join("keep"), b"x").unwrap();
    files.write(&results(5, 2), 2).unwrap_err();
    assert!(!topk_io::scores_path(&out).exists(), "neither file appears");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
}

#[test]
fn dropped_result_files_leave_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let files = ResultFiles::create(dir.path().join("r.npy")).unwrap();
    assert_eq!(files.paths().len(), 2);
    drop(files);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn zero_queries_write_a_npy_of_shape_0_by_k() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("r.npy");
    ResultFiles::create(&out).unwrap().write(&[], 7).unwrap();
    assert_eq!(topk_io::read_npy_u32(&out).unwrap().dim(), (0, 7));
    assert_eq!(
        topk_io::read_npy_f32(topk_io::scores_path(&out))
            .unwrap()
            .dim(),
        (0, 7)
    );
}

#[test]
fn output_that_is_a_directory_is_found_before_writing() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["x.jsonl", "x.npy", "y.scores.npy"] {
        std::fs::create_dir(dir.path().join(name)).unwrap();
    }
    for out in ["x.jsonl", "x.npy", "y.npy"] {
        let e = ResultFiles::create(dir.path().join(out)).unwrap_err();
        assert!(e.to_string().contains("is a directory"), "{out}: {e}");
    }
}

#[cfg(target_os = "linux")]
#[test]
fn output_under_proc_is_found_before_writing() {
    let e = ResultFiles::create("/proc/x.jsonl").unwrap_err();
    assert!(matches!(e, Error::Io { op: "create", .. }), "{e:?}");
    assert!(e.to_string().contains("/proc/x.jsonl"), "{e}");
}

#[test]
fn matrix_write_replaces_the_previous_file_whole() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("m.npy");
    write_matrix(&p, Array2::<f32>::ones((4, 3)).view()).unwrap();
    let b = Array2::<f32>::zeros((2, 5));
    write_matrix(&p, b.view()).unwrap();
    assert_eq!(read_matrix(&p).unwrap(), b);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
}

#[test]
fn bvecs_are_widened_row_by_row() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("b.bvecs");
    let bytes = ndarray::array![[0u8, 7, 255], [1, 2, 3]];
    topk_io::write_bvecs(&p, bytes.view()).unwrap();
    assert_eq!(read_matrix(&p).unwrap(), bytes.mapv(f32::from));
}

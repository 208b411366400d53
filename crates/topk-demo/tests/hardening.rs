//! What a new user broke, each case named after what it caught: a closed
//! stdout, inputs that are not regular files, a full disk, `--out` naming an
//! input, huge sizes and values, flags of another backend, outputs that can
//! only fail at the end, zero queries and unaligned `.npy` data.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use ndarray::Array2;
use tempfile::TempDir;

mod common;
use common::{exe, fails_with, stderr};

fn command<I, S>(args: I) -> Command
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let mut c = Command::new(exe());
    c.args(args).env("RUST_LOG", "info");
    c
}

/// Runs the demo, killing it (and failing) after 60 seconds.
fn run_with_timeout(mut c: Command) -> Output {
    let mut child = c
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the demo binary runs");
    let started = Instant::now();
    loop {
        if child.try_wait().expect("wait on the demo").is_some() {
            return child.wait_with_output().expect("collect the demo's output");
        }
        if started.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the demo ran for 60 s: it hangs");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn demo<I, S>(args: I) -> Output
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    run_with_timeout(command(args))
}

/// A finished run that never searched (the search logs "searched").
fn did_not_search(o: &Output) {
    let err = stderr(o);
    assert!(!err.contains("searched"), "the search ran: {err}");
}

struct Files {
    dir: TempDir,
    corpus: PathBuf,
    queries: PathBuf,
}

impl Files {
    fn new(n: usize, d: usize, q: usize) -> Files {
        let dir = tempfile::tempdir().unwrap();
        let corpus = dir.path().join("c.npy");
        let queries = dir.path().join("q.npy");
        topk_io::write_matrix(
            &corpus,
            topk_io::synth::gaussian_rows(n, d, 5, false).view(),
        )
        .unwrap();
        topk_io::write_matrix(
            &queries,
            topk_io::synth::gaussian_queries(q, d, 5, false).view(),
        )
        .unwrap();
        Files {
            dir,
            corpus,
            queries,
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn args(&self, out: &Path) -> Vec<std::ffi::OsString> {
        vec![
            "--corpus".into(),
            self.corpus.clone().into(),
            "--queries".into(),
            self.queries.clone().into(),
            "--out".into(),
            out.into(),
        ]
    }
}

fn names_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

// ---- 1. a closed stdout ---------------------------------------------------

#[test]
fn stdout_pipe_closed_by_its_reader_keeps_results_and_exits_quietly() {
    let f = Files::new(300, 8, 40);
    for out in ["r.jsonl", "r.npy"] {
        let out = f.path(out);
        let mut child = command(f.args(&out))
            .args(["--show", "40"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // The reader goes away before the demo writes: `| true`.
        drop(child.stdout.take());
        let o = child.wait_with_output().unwrap();
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(0), "{err}");
        assert!(!err.contains("panicked"), "{err}");
        let results = topk_io::read_results(&out).unwrap();
        assert_eq!(results.len(), 40);
        assert!(results.iter().all(|r| r.len() == 8));
    }
}

#[cfg(target_os = "linux")]
#[test]
fn stdout_on_dev_full_keeps_results_and_exits_quietly() {
    let f = Files::new(300, 8, 40);
    let out = f.path("r.npy");
    let o = command(f.args(&out))
        .stdout(std::fs::File::create("/dev/full").unwrap())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(err.contains("could not write the report"), "{err}");
    assert_eq!(topk_io::read_results(&out).unwrap().len(), 40);
}

// ---- 2. inputs that are not regular files ---------------------------------

#[cfg(unix)]
#[test]
fn fifo_as_corpus_is_refused_without_hanging() {
    let f = Files::new(20, 4, 2);
    let fifo = f.path("fifo.npy");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let o = demo([
        OsStr::new("--corpus"),
        fifo.as_os_str(),
        OsStr::new("--queries"),
        f.queries.as_os_str(),
    ]);
    fails_with(&o, &["fifo.npy", "is a FIFO"]);
}

#[cfg(unix)]
#[test]
fn dev_zero_linked_as_npy_is_a_character_device() {
    let f = Files::new(20, 4, 2);
    let link = f.path("x.npy");
    std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
    let o = demo([
        OsStr::new("--corpus"),
        f.corpus.as_os_str(),
        OsStr::new("--queries"),
        link.as_os_str(),
    ]);
    fails_with(&o, &["x.npy", "is a character device"]);
}

#[test]
fn directory_as_corpus_is_a_directory() {
    let f = Files::new(20, 4, 2);
    let d = f.path("d.npy");
    std::fs::create_dir(&d).unwrap();
    let o = demo([
        OsStr::new("--corpus"),
        d.as_os_str(),
        OsStr::new("--queries"),
        f.queries.as_os_str(),
    ]);
    fails_with(&o, &["d.npy", "is a directory"]);
}

// ---- 3. a full disk ---------------------------------------------------------

/// A 64 KiB tmpfs, unmounted on drop; `None` (with the reason printed) where
/// mounting is not possible (not root, no mount namespace rights).
struct TinyDisk {
    dir: TempDir,
}

impl TinyDisk {
    fn mount() -> Option<TinyDisk> {
        let dir = tempfile::tempdir().ok()?;
        let o = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=64k", "tmpfs"])
            .arg(dir.path())
            .output();
        match o {
            Ok(o) if o.status.success() => Some(TinyDisk { dir }),
            Ok(o) => {
                println!(
                    "skipped: cannot mount a tmpfs: {}",
                    String::from_utf8_lossy(&o.stderr).trim()
                );
                None
            }
            Err(e) => {
                println!("skipped: cannot run mount: {e}");
                None
            }
        }
    }
}

impl Drop for TinyDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.dir.path()).status();
    }
}

#[test]
fn full_disk_leaves_the_previous_output_whole_and_no_partial_file() {
    let Some(disk) = TinyDisk::mount() else {
        return;
    };
    let small = Files::new(200, 8, 3);
    // 2000 queries x K = 8 do not fit in 64 KiB, in either format.
    let large = Files::new(200, 8, 2000);
    for name in ["r.jsonl", "r.npy"] {
        let out = disk.dir.path().join(name);
        let o = demo(small.args(&out));
        assert!(o.status.success(), "{}", stderr(&o));
        let before = topk_io::read_results(&out).unwrap();
        let files_before = names_in(disk.dir.path());
        let o = demo(large.args(&out));
        fails_with(&o, &[name]);
        assert!(stderr(&o).contains("No space left"), "{}", stderr(&o));
        assert_eq!(topk_io::read_results(&out).unwrap(), before, "{name}");
        assert_eq!(names_in(disk.dir.path()), files_before, "{name}");
    }
}

// ---- 4. --out naming an input ---------------------------------------------

#[test]
fn out_equal_to_an_input_is_refused_before_any_work() {
    let f = Files::new(50, 4, 3);
    let corpus_bytes = std::fs::read(&f.corpus).unwrap();
    // The corpus itself, the queries through `..`, and through a symlink.
    std::fs::create_dir(f.path("sub")).unwrap();
    let link = f.path("link.npy");
    #[cfg(unix)]
    std::os::unix::fs::symlink(&f.corpus, &link).unwrap();
    #[cfg(not(unix))]
    std::fs::hard_link(&f.corpus, &link).unwrap();
    for out in [f.corpus.clone(), f.path("sub/../q.npy"), link] {
        let o = demo(f.args(&out));
        fails_with(&o, &["would overwrite the input"]);
        did_not_search(&o);
    }
    // Through the scores sibling: --out x.npy with the corpus at x.scores.npy.
    let sibling = f.path("x.scores.npy");
    std::fs::copy(&f.corpus, &sibling).unwrap();
    let o = demo([
        OsStr::new("--corpus"),
        sibling.as_os_str(),
        OsStr::new("--queries"),
        f.queries.as_os_str(),
        OsStr::new("--out"),
        f.path("x.npy").as_os_str(),
    ]);
    fails_with(&o, &["x.scores.npy", "would overwrite the input"]);
    assert_eq!(std::fs::read(&f.corpus).unwrap(), corpus_bytes);
    assert_eq!(std::fs::read(&sibling).unwrap(), corpus_bytes);
}

// ---- 5. allocation ----------------------------------------------------------

#[test]
fn synthetic_size_too_large_to_allocate_is_an_error_not_an_abort() {
    let o = demo(["--n", "1099511627776", "--d", "1"]);
    fails_with(&o, &["cannot allocate 4398046511104 bytes", "corpus"]);
    // n * d overflows usize.
    let o = demo(["--n", "9223372036854775807", "--d", "4"]);
    fails_with(&o, &["--n 9223372036854775807", "--d 4"]);
}

// ---- 6. the overflow rule ---------------------------------------------------

#[test]
fn values_near_3e38_are_rejected_by_the_overflow_rule() {
    let f = Files::new(20, 8, 2);
    let mut corpus = topk_io::read_matrix(&f.corpus).unwrap();
    corpus.row_mut(5).fill(3e38);
    topk_io::write_matrix(&f.corpus, corpus.view()).unwrap();
    for metric in ["dot", "cosine", "l2"] {
        let mut args = f.args(&f.path("r.jsonl"));
        args.extend(["--metric".into(), metric.into()]);
        let o = demo(args);
        fails_with(&o, &["corpus row 5", "3e38", "2^100"]);
    }
}

// ---- 8. flags of another backend, outputs, zero queries, unaligned data ----

#[test]
fn hnsw_flags_with_another_backend_are_an_error() {
    for flag in ["--m", "--ef-construction", "--ef"] {
        let o = demo([flag, "0", "--backend", "cpu"]);
        fails_with(&o, &[flag, "only applies to --backend hnsw"]);
        did_not_search(&o);
    }
    let o = demo(["--m", "8", "--backend", "hnsw", "--n", "300", "--d", "8"]);
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn outputs_that_cannot_be_written_are_found_before_the_search() {
    let f = Files::new(50, 4, 3);
    std::fs::create_dir(f.path("x.jsonl")).unwrap();
    let o = demo(f.args(&f.path("x.jsonl")));
    fails_with(&o, &["x.jsonl", "is a directory"]);
    did_not_search(&o);
    #[cfg(target_os = "linux")]
    {
        let o = demo(f.args(Path::new("/proc/x.jsonl")));
        fails_with(&o, &["/proc/x.jsonl"]);
        did_not_search(&o);
    }
}

#[test]
fn zero_queries_write_a_npy_of_shape_0_by_k() {
    let f = Files::new(50, 4, 1);
    topk_io::write_matrix(&f.queries, Array2::<f32>::zeros((0, 4)).view()).unwrap();
    let out = f.path("r.npy");
    let mut args = f.args(&out);
    args.extend(["--k".into(), "5".into()]);
    let o = demo(args);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(topk_io::read_npy_u32(&out).unwrap().dim(), (0, 5));
    assert_eq!(
        topk_io::read_npy_f32(f.path("r.scores.npy")).unwrap().dim(),
        (0, 5)
    );
}

#[test]
fn npy_data_at_a_non_16_byte_offset_is_read() {
    let f = Files::new(50, 3, 2);
    // A version-1 header padded to an odd length: numpy reads such a file.
    let header = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }\n";
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend_from_slice(&(header.len() as u16).to_le_bytes());
    bytes.extend_from_slice(header.as_bytes());
    assert_ne!(bytes.len() % 16, 0);
    for v in [1.0_f32, 0.0, 0.0, 0.0, 1.0, 0.0] {
        bytes.extend_from_slice(&v.to_le_bytes());
    }
    std::fs::write(&f.queries, &bytes).unwrap();
    let out = f.path("r.jsonl");
    let o = demo(f.args(&out));
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(topk_io::read_results(&out).unwrap().len(), 2);
}

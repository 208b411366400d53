//! Progress on stderr never touches the report on stdout, and
//! `--recall-sample` measures the recall of `--backend hnsw` against exact
//! search.

use std::ffi::OsStr;
use std::process::{Command, Stdio};

mod common;
use common::{demo, exe, fails_with, stderr, stdout};

/// The report with its one line of timings, which differ from run to run,
/// masked.
fn masked(report: &str) -> String {
    report
        .lines()
        .map(|l| {
            if l.starts_with("time      ") {
                "time      (masked)"
            } else {
                l
            }
        })
        .map(|l| format!("{l}\n"))
        .collect()
}

/// The recall value of the report's `recall@K over Q sampled queries: R` line.
fn recall_line(report: &str, k: usize, queries: usize) -> f64 {
    let prefix = format!("recall@{k} over {queries} sampled queries: ");
    let line = report
        .lines()
        .find(|l| l.starts_with(&prefix))
        .unwrap_or_else(|| panic!("no `{prefix}` line in:\n{report}"));
    line[prefix.len()..]
        .parse()
        .unwrap_or_else(|e| panic!("{line}: {e}"))
}

/// The smoke story's report, timings masked, as the demo printed it before
/// progress reporting existed.
const SMOKE_STORY: &str = include_str!("data/smoke_story.txt");

#[test]
fn progress_leaves_the_smoke_story_report_unchanged() {
    let plain = demo::<[&str; 0], &str>([]);
    assert!(plain.status.success(), "{}", stderr(&plain));
    assert_eq!(masked(&stdout(&plain)), SMOKE_STORY);

    let quiet = demo(["--no-progress"]);
    assert!(quiet.status.success(), "{}", stderr(&quiet));
    assert_eq!(masked(&stdout(&quiet)), SMOKE_STORY);

    // Stderr sent nowhere at all: the report is still the same.
    let o = Command::new(exe())
        .env("RUST_LOG", "info")
        .stderr(Stdio::null())
        .output()
        .expect("the demo binary runs");
    assert!(o.status.success());
    assert_eq!(masked(&stdout(&o)), SMOKE_STORY);
}

#[test]
fn no_progress_is_accepted_by_the_index_commands() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("c.npy");
    let index = dir.path().join("c.topkidx");
    topk_io::write_matrix(
        &corpus,
        topk_io::synth::gaussian_rows(40, 6, 3, false).view(),
    )
    .unwrap();
    let build = |extra: &[&str]| {
        let mut args: Vec<&OsStr> = vec![
            OsStr::new("index"),
            OsStr::new("build"),
            OsStr::new("--corpus"),
            corpus.as_os_str(),
            OsStr::new("--out"),
            index.as_os_str(),
        ];
        args.extend(extra.iter().map(OsStr::new));
        let o = demo(args);
        assert!(o.status.success(), "{}", stderr(&o));
        stdout(&o)
    };
    assert_eq!(build(&[]), build(&["--no-progress"]));
}

#[test]
fn a_long_hnsw_build_logs_its_progress_when_stderr_is_not_a_terminal() {
    let o = demo([
        "--backend",
        "hnsw",
        "--n",
        "3000",
        "--d",
        "8",
        "--show",
        "0",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("building the HNSW graph: 1024 of 3000 rows"),
        "{err}"
    );
    let quiet = demo([
        "--backend",
        "hnsw",
        "--n",
        "3000",
        "--d",
        "8",
        "--show",
        "0",
        "--no-progress",
    ]);
    assert!(quiet.status.success(), "{}", stderr(&quiet));
    let err = stderr(&quiet);
    assert!(!err.contains("building the HNSW graph"), "{err}");
    assert_eq!(masked(&stdout(&o)), masked(&stdout(&quiet)));
}

#[test]
fn recall_is_exact_on_a_corpus_the_beam_covers() {
    // 50 rows and ef = 64: every search visits the whole graph.
    let o = demo([
        "--backend",
        "hnsw",
        "--n",
        "50",
        "--d",
        "8",
        "--nq",
        "20",
        "--ef",
        "64",
        "--k",
        "10",
        "--recall-sample",
        "12",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert_eq!(recall_line(&out, 10, 12), 1.0, "{out}");
    assert!(
        out.contains("recall@10 over 12 sampled queries: 1.000\n"),
        "{out}"
    );
    assert!(!stderr(&o).contains("unmeasured"), "{}", stderr(&o));
}

#[test]
fn recall_is_a_share_and_the_sample_is_capped_at_the_queries() {
    // A narrow beam over a sparse graph: recall may fall below 1.
    let o = demo([
        "--backend",
        "hnsw",
        "--n",
        "3000",
        "--d",
        "32",
        "--nq",
        "30",
        "--m",
        "2",
        "--ef-construction",
        "4",
        "--ef",
        "1",
        "--k",
        "10",
        "--recall-sample",
        "1000",
        "--no-progress",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let r = recall_line(&stdout(&o), 10, 30);
    assert!((0.0..=1.0).contains(&r), "recall {r}");
}

#[test]
fn recall_sample_over_files() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("c.fvecs");
    let queries = dir.path().join("q.npy");
    topk_io::write_matrix(
        &corpus,
        topk_io::synth::gaussian_rows(40, 5, 9, false).view(),
    )
    .unwrap();
    topk_io::write_matrix(
        &queries,
        topk_io::synth::gaussian_queries(7, 5, 9, false).view(),
    )
    .unwrap();
    let o = demo([
        OsStr::new("--backend"),
        OsStr::new("hnsw"),
        OsStr::new("--corpus"),
        corpus.as_os_str(),
        OsStr::new("--queries"),
        queries.as_os_str(),
        OsStr::new("--metric"),
        OsStr::new("l2"),
        OsStr::new("--k"),
        OsStr::new("5"),
        OsStr::new("--recall-sample"),
        OsStr::new("3"),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(recall_line(&stdout(&o), 5, 3), 1.0, "{}", stdout(&o));
}

#[test]
fn hnsw_without_recall_sample_says_recall_is_unmeasured() {
    let o = demo(["--backend", "hnsw", "--n", "60", "--d", "4"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    assert_eq!(
        err.lines()
            .filter(|l| l.contains("recall of --backend hnsw is unmeasured")
                && l.contains("--recall-sample N"))
            .count(),
        1,
        "{err}"
    );
    assert!(!stdout(&o).contains("recall@"), "{}", stdout(&o));
}

#[test]
fn recall_sample_zero_is_an_error() {
    let o = demo(["--backend", "hnsw", "--n", "60", "--recall-sample", "0"]);
    fails_with(&o, &["--recall-sample 0", "at least one query"]);
    assert!(o.stdout.is_empty());
}

#[test]
fn recall_sample_with_an_exact_backend_is_an_error() {
    for backend in ["cpu", "oracle"] {
        let o = demo(["--backend", backend, "--recall-sample", "10"]);
        fails_with(
            &o,
            &[
                "--recall-sample only applies to --backend hnsw",
                &format!("the backend is {backend}"),
            ],
        );
        assert!(o.stdout.is_empty());
    }
    // The default backend is cpu.
    let o = demo(["--recall-sample", "10"]);
    fails_with(&o, &["--recall-sample only applies to --backend hnsw"]);
}

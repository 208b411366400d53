//! The `topk_demo` binary end to end: the smoke story, files in and results
//! out (checked against the oracle, bit for bit), and every bad input
//! refused with a message that names the problem.

use std::path::{Path, PathBuf};

use ndarray::Array2;
use tempfile::TempDir;
use topk_core::{Metric, Neighbor, Retriever};
use topk_cpu::Oracle;

mod common;
use common::{demo, fails_with, stderr, stdout};

/// A corpus (n >= 8) with exact ties (row 3 duplicated) and its queries.
fn fixture(n: usize, d: usize, q: usize) -> (Array2<f32>, Array2<f32>) {
    let mut corpus = topk_io::synth::gaussian_rows(n, d, 7, false);
    let dup = corpus.row(3).to_owned();
    for r in [n / 3, n / 2, n - 1] {
        corpus.row_mut(r).assign(&dup);
    }
    let mut queries = topk_io::synth::gaussian_queries(q, d, 7, false);
    // A query equal to a duplicated row: its best scores tie.
    queries.row_mut(0).assign(&dup);
    (corpus, queries)
}

struct Files {
    _dir: TempDir,
    corpus: PathBuf,
    queries: PathBuf,
    dir: PathBuf,
}

impl Files {
    /// `topk_demo --corpus C --queries Q [--out OUT] FLAGS...` over these files.
    fn run(&self, out: Option<&Path>, flags: &[&str]) -> std::process::Output {
        let mut args = path_arg("--corpus", &self.corpus).to_vec();
        args.extend(path_arg("--queries", &self.queries));
        if let Some(out) = out {
            args.extend(path_arg("--out", out));
        }
        args.extend(flags.iter().map(Into::into));
        demo(args)
    }
}

fn write_fixture(corpus: &Array2<f32>, queries: &Array2<f32>, c: &str, q: &str) -> Files {
    let dir = tempfile::tempdir().unwrap();
    let corpus_path = dir.path().join(c);
    let queries_path = dir.path().join(q);
    topk_io::write_matrix(&corpus_path, corpus.view()).unwrap();
    topk_io::write_matrix(&queries_path, queries.view()).unwrap();
    Files {
        dir: dir.path().to_owned(),
        _dir: dir,
        corpus: corpus_path,
        queries: queries_path,
    }
}

fn oracle(
    corpus: &Array2<f32>,
    queries: &Array2<f32>,
    metric: Metric,
    k: usize,
) -> Vec<Vec<Neighbor>> {
    Oracle::new(corpus.view(), metric)
        .unwrap()
        .search_batch(queries.view(), k)
        .unwrap()
}

fn assert_same_bits(got: &[Vec<Neighbor>], want: &[Vec<Neighbor>], label: &str) {
    assert_eq!(got.len(), want.len(), "{label}: query count");
    for (q, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.len(), w.len(), "{label}: query {q} result count");
        for (rank, (a, b)) in g.iter().zip(w).enumerate() {
            assert_eq!(
                (a.index, a.score.to_bits()),
                (b.index, b.score.to_bits()),
                "{label}: query {q}, rank {rank}: got {a:?}, want {b:?}"
            );
        }
    }
}

/// The results the demo wrote to `out` (`.npy` indices and `.scores.npy`
/// beside them), `q` queries of `k` results.
fn read_npy_results(out: &Path, q: usize, k: usize) -> Vec<Vec<Neighbor>> {
    let indices = topk_io::read_npy_u32(out).unwrap();
    let scores = topk_io::read_npy_f32(out.with_extension("scores.npy")).unwrap();
    assert_eq!((indices.dim(), scores.dim()), ((q, k), (q, k)));
    (0..q)
        .map(|i| {
            (0..k)
                .map(|j| Neighbor::new(indices[[i, j]], scores[[i, j]]))
                .collect()
        })
        .collect()
}

fn path_arg(flag: &str, p: &Path) -> [std::ffi::OsString; 2] {
    [flag.into(), p.as_os_str().to_owned()]
}

// ---- the smoke story -------------------------------------------------------

#[test]
fn no_arguments_tells_the_smoke_story() {
    let o = demo::<[&str; 0], &str>([]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("backend   cpu"), "{out}");
    assert!(out.contains("N = 4096, D = 128"), "{out}");
    assert!(out.contains("K = 8, metric = dot"), "{out}");
    for q in 0..3 {
        assert!(out.contains(&format!("\nquery {q}\n")), "{out}");
    }
    // 3 queries shown, 8 neighbours each: rank lines "     1  ..." to "     8  ...".
    let ranks = out
        .lines()
        .filter(|l| l.split_whitespace().count() == 3 && l.starts_with("     "))
        .count();
    assert_eq!(ranks, 24, "{out}");
    // Timings are logged at info level on stderr.
    let err = stderr(&o);
    assert!(err.contains("searched") && err.contains("ms="), "{err}");
}

#[test]
fn the_story_is_seeded_and_backends_agree() {
    let args = [
        "--n", "700", "--d", "24", "--nq", "5", "--show", "5", "--seed", "3",
    ];
    let table = |backend: &str| {
        let o = demo(args.iter().copied().chain(["--backend", backend]));
        assert!(o.status.success(), "{}", stderr(&o));
        let out = stdout(&o);
        assert!(out.contains(&format!("backend   {backend}")), "{out}");
        out.lines()
            .filter(|l| l.starts_with("  "))
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    let cpu = table("cpu");
    assert_eq!(cpu.len(), 5 * 9, "a header and 8 rows per query");
    assert_eq!(cpu, table("cpu"), "same seed, same answers");
    assert_eq!(
        cpu,
        table("oracle"),
        "the fast path prints the oracle's answers"
    );
}

#[test]
fn help_describes_the_options() {
    let o = demo(["--help"]);
    assert!(o.status.success());
    let out = stdout(&o);
    for flag in [
        "--corpus",
        "--queries",
        "--k",
        "--metric",
        "--backend",
        "--out",
        "--seed",
        "--n",
        "--d",
    ] {
        assert!(out.contains(flag), "{flag} missing from --help:\n{out}");
    }
    assert!(out.contains("4,096") && out.contains("scores.npy"), "{out}");
}

// ---- files in, results out -----------------------------------------------------

#[test]
fn jsonl_results_equal_the_oracle_for_every_metric() {
    let (corpus, queries) = fixture(300, 24, 20);
    let f = write_fixture(&corpus, &queries, "corpus.npy", "queries.fvecs");
    for metric in Metric::ALL {
        for backend in ["cpu", "oracle"] {
            let out = f.dir.join(format!("{metric}-{backend}.jsonl"));
            let o = f.run(
                Some(&out),
                &[
                    "--k",
                    "7",
                    "--metric",
                    metric.as_str(),
                    "--backend",
                    backend,
                ],
            );
            assert!(o.status.success(), "{metric}/{backend}: {}", stderr(&o));
            let got = topk_io::results::read_results_jsonl(&out).unwrap();
            assert_same_bits(
                &got,
                &oracle(&corpus, &queries, metric, 7),
                &format!("{metric}/{backend}"),
            );
            // Each line has the documented keys in the documented order.
            let text = std::fs::read_to_string(&out).unwrap();
            assert_eq!(text.lines().count(), 20);
            assert!(text.starts_with("{\"query\":0,\"indices\":["), "{text}");
        }
    }
}

#[test]
fn npy_results_equal_the_oracle() {
    let (corpus, queries) = fixture(257, 33, 600);
    let f = write_fixture(&corpus, &queries, "corpus.fvecs", "queries.npy");
    let out = f.dir.join("hits.npy");
    let o = f.run(Some(&out), &["--k", "12", "--metric", "l2"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("hits.scores.npy"), "{}", stdout(&o));
    let got = read_npy_results(&out, 600, 12);
    assert_same_bits(&got, &oracle(&corpus, &queries, Metric::L2, 12), "npy/l2");
}

/// `--dtype f16` / `bf16`: the results are the oracle's over the rounded
/// corpus, bit for bit, on both exact backends, and the report says so.
#[test]
fn half_width_storage_results_equal_the_oracle_over_rounded_rows() {
    let (corpus, queries) = fixture(300, 20, 40);
    let f = write_fixture(&corpus, &queries, "corpus.npy", "queries.npy");
    for (flag, dtype) in [
        ("f16", topk_core::Dtype::F16),
        ("bf16", topk_core::Dtype::Bf16),
    ] {
        let rounded = corpus.mapv(|x| dtype.round(x));
        let want = oracle(&rounded, &queries, Metric::Cosine, 9);
        for backend in ["cpu", "oracle"] {
            let out = f.dir.join(format!("{flag}-{backend}.npy"));
            let o = f.run(
                Some(&out),
                &[
                    "--k",
                    "9",
                    "--metric",
                    "cosine",
                    "--dtype",
                    flag,
                    "--backend",
                    backend,
                ],
            );
            assert!(o.status.success(), "{}", stderr(&o));
            assert!(
                stdout(&o).contains(&format!("storage   {flag}")),
                "{}",
                stdout(&o)
            );
            let got = read_npy_results(&out, 40, 9);
            assert_same_bits(&got, &want, &format!("{flag}/{backend}"));
        }
    }
}

#[test]
fn k_beyond_n_returns_every_row() {
    let (corpus, queries) = fixture(12, 5, 3);
    let f = write_fixture(&corpus, &queries, "c.npy", "q.npy");
    let out = f.dir.join("all.jsonl");
    let o = f.run(Some(&out), &["--k", "1000"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let got = topk_io::read_results(&out).unwrap();
    assert!(got.iter().all(|hits| hits.len() == 12));
    assert_same_bits(&got, &oracle(&corpus, &queries, Metric::Dot, 1000), "k>n");
}

// ---- bad inputs ------------------------------------------------------------------

#[test]
fn corpus_and_queries_of_different_dimension() {
    let (corpus, _) = fixture(20, 6, 1);
    let queries = Array2::<f32>::ones((2, 5));
    let f = write_fixture(&corpus, &queries, "c.npy", "q.npy");
    let o = f.run(None, &[]);
    fails_with(&o, &["D = 5", "D = 6", "q.npy", "c.npy"]);
}

#[test]
fn k_zero() {
    let o = demo(["--k", "0"]);
    fails_with(&o, &["K = 0"]);
}

#[test]
fn nan_in_the_corpus_file() {
    let (mut corpus, queries) = fixture(20, 6, 2);
    corpus[[13, 4]] = f32::NAN;
    let f = write_fixture(&corpus, &queries, "c.fvecs", "q.npy");
    let o = f.run(None, &[]);
    fails_with(&o, &["c.fvecs", "NaN", "row 13", "column 4"]);
}

#[test]
fn infinity_in_the_queries_file() {
    let (corpus, mut queries) = fixture(20, 6, 2000);
    queries[[1500, 2]] = f32::NEG_INFINITY;
    let f = write_fixture(&corpus, &queries, "c.npy", "q.npy");
    let o = f.run(None, &[]);
    // The position is in the file, not in a chunk of the batch.
    fails_with(&o, &["q.npy", "-inf", "query 1500", "column 2"]);
}

#[test]
fn truncated_corpus_file() {
    let (corpus, queries) = fixture(20, 6, 2);
    let f = write_fixture(&corpus, &queries, "c.fvecs", "q.npy");
    let bytes = std::fs::read(&f.corpus).unwrap();
    std::fs::write(&f.corpus, &bytes[..bytes.len() - 3]).unwrap();
    let o = f.run(None, &[]);
    fails_with(&o, &["c.fvecs", "truncated", "row 19"]);
}

#[test]
fn missing_queries_file() {
    let (corpus, queries) = fixture(20, 6, 2);
    let f = write_fixture(&corpus, &queries, "c.npy", "q.npy");
    let absent = f.dir.join("absent.npy");
    let o = demo(
        path_arg("--corpus", &f.corpus)
            .into_iter()
            .chain(path_arg("--queries", &absent)),
    );
    fails_with(&o, &["absent.npy", "cannot open"]);
}

#[test]
fn integer_npy_corpus() {
    let (corpus, queries) = fixture(20, 6, 2);
    let f = write_fixture(&corpus, &queries, "c.npy", "q.npy");
    topk_io::write_npy_i32(&f.corpus, corpus.mapv(|v| v as i32).view()).unwrap();
    let o = f.run(None, &[]);
    fails_with(&o, &["c.npy", "int32", "float32"]);
}

#[test]
fn jsonl_output_beside_a_scores_named_input() {
    // Only .npy output writes `NAME.scores.npy`: a .jsonl output next to an
    // input of that name is fine, and the input is untouched.
    let (corpus, queries) = fixture(20, 6, 2);
    let f = write_fixture(&corpus, &queries, "c.npy", "hits.scores.npy");
    let before = std::fs::read(&f.queries).expect("read");
    let out = f.dir.join("hits.jsonl");
    let o = f.run(Some(&out), &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(out.exists());
    assert_eq!(std::fs::read(&f.queries).expect("read"), before);
    let npy = f.dir.join("hits.npy");
    let o = f.run(Some(&npy), &[]);
    fails_with(&o, &["hits.scores.npy", "would overwrite the input"]);
}

#[test]
fn too_many_synthetic_queries_name_nq() {
    let o = demo(["--nq", "4611686018427387904", "--d", "8"]);
    fails_with(&o, &["synthetic query set", "--nq 4611686018427387904"]);
    let o = demo(["--n", "4611686018427387904", "--d", "8"]);
    fails_with(&o, &["synthetic corpus", "--n 4611686018427387904"]);
}

#[test]
fn unknown_output_extension() {
    let (corpus, queries) = fixture(20, 6, 2);
    let f = write_fixture(&corpus, &queries, "c.npy", "q.npy");
    let out = f.dir.join("hits.csv");
    let o = f.run(Some(&out), &[]);
    fails_with(&o, &["hits.csv", ".jsonl or .npy"]);
}

#[test]
#[cfg(not(feature = "cuda"))]
fn cuda_backend_without_the_feature() {
    let o = demo(["--backend", "cuda", "--n", "64", "--d", "8"]);
    fails_with(&o, &["no CUDA support", "--features cuda"]);
    // Said before any input is read: the missing files are never reached.
    let o = demo([
        "--backend",
        "cuda",
        "--corpus",
        "/nonexistent/c.npy",
        "--queries",
        "/nonexistent/q.npy",
    ]);
    fails_with(&o, &["cuda backend", "no CUDA support"]);
    assert!(!String::from_utf8_lossy(&o.stderr).contains("nonexistent"));
}

/// With the GPU engine built in, the demo either runs on the device (and says
/// so) or, on a machine without a driver or device, fails with the reason.
#[test]
#[cfg(feature = "cuda")]
fn cuda_backend_runs_or_names_the_missing_device() {
    let o = demo(["--backend", "cuda", "--n", "512", "--d", "40"]);
    let stdout = String::from_utf8_lossy(&o.stdout);
    let stderr = String::from_utf8_lossy(&o.stderr);
    if o.status.success() {
        assert!(stdout.contains("cuda"), "{stdout}");
    } else {
        assert!(
            std::env::var("TOPK_REQUIRE_GPU").as_deref() != Ok("1"),
            "TOPK_REQUIRE_GPU=1 but the cuda backend failed: {stderr}"
        );
        // A missing plugin, driver or device: the facade says which.
        fails_with(&o, &["cuda backend: ", "backend `cuda`"]);
    }
}

#[test]
fn corpus_without_queries_is_a_usage_error() {
    let o = demo(["--corpus", "c.npy"]);
    assert_eq!(o.status.code(), Some(2), "clap's usage-error status");
    assert!(stderr(&o).contains("--queries"), "{}", stderr(&o));
}

#[test]
fn empty_synthetic_corpus() {
    let o = demo(["--n", "0"]);
    fails_with(&o, &["empty corpus"]);
}

#[test]
fn real_embeddings_match_their_ground_truth() {
    // shared/data/minilm-docs-20k, `../shared/data` from the repository root.
    let Some(dir) = topk_testkit::shared_data("minilm-docs-20k") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("hits.npy");
    let o = demo(
        path_arg("--corpus", &dir.join("corpus.npy"))
            .into_iter()
            .chain(path_arg("--queries", &dir.join("queries.fvecs")))
            .chain(path_arg("--out", &out))
            .chain(["--k", "10"].map(Into::into)),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("N = 20000, D = 384"), "{}", stdout(&o));
    let got = topk_io::read_npy_u32(&out).unwrap();
    let truth = topk_io::read_ids(dir.join("gt_top100.ivecs")).unwrap();
    // The ground truth is ranked in float64; on this data no top-10 pair is
    // close enough for f32 rounding to reorder it, so the lists are equal.
    assert_eq!(got.dim(), (500, 10));
    for q in 0..500 {
        assert_eq!(got.row(q), truth.slice(ndarray::s![q, ..10]), "query {q}");
    }
}

#[test]
fn missing_output_folder_is_reported_before_the_search() {
    let o = demo([
        "--n",
        "64",
        "--d",
        "8",
        "--out",
        "/nonexistent-topk-dir/hits.jsonl",
    ]);
    fails_with(
        &o,
        &["output folder", "/nonexistent-topk-dir", "does not exist"],
    );
    // Nothing was searched: the report of the smoke story never started.
    assert!(!String::from_utf8_lossy(&o.stdout).contains("neighbours"));
}

//! The `topk_bench` binary end to end: flag validation, the JSON line schema,
//! file inputs, and the results-folder subcommands.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use topk_bench::record::{Record, JSON_PREFIX};

/// The binary under test: where cargo built it, or, in the GPU bundle (no
/// cargo there), beside this test executable.
fn exe() -> PathBuf {
    let built = PathBuf::from(env!("CARGO_BIN_EXE_topk_bench"));
    if built.is_file() {
        return built;
    }
    std::env::current_exe()
        .ok()
        .and_then(|t| t.parent().map(|d| d.join("topk_bench")))
        .filter(|p| p.is_file())
        .unwrap_or(built)
}

fn bench(args: &[&str]) -> Output {
    Command::new(exe())
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("topk_bench runs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn records(o: &Output) -> Vec<Record> {
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter(|l| l.starts_with(JSON_PREFIX))
        .map(|l| Record::parse(l).expect("a record line parses"))
        .collect()
}

/// Runs with bad flags: exit status 1 and a message naming the value.
fn rejects(args: &[&str], needle: &str) {
    let o = bench(args);
    assert_eq!(o.status.code(), Some(1), "{args:?}: {}", stderr(&o));
    let e = stderr(&o);
    assert!(e.contains(needle), "{args:?}: expected `{needle}` in: {e}");
    assert!(!e.contains("panicked"), "{e}");
    assert!(records(&o).is_empty(), "nothing is timed");
}

#[test]
fn every_bad_flag_has_a_clear_error() {
    rejects(&["--n", "0"], "invalid --n 0");
    rejects(&["--n", "100", "--k", "0"], "invalid --k 0");
    rejects(&["--n", "100", "--d", "0"], "invalid --d 0");
    rejects(
        &["--n", "100", "--d", "100000"],
        "invalid --d 100000: too large",
    );
    rejects(&["--n", "4294967296", "--d", "8"], "invalid --n 4294967296");
    rejects(&["--n", "100", "--trials", "0"], "invalid --trials 0");
    rejects(&["--n", "100", "--batch", "0"], "invalid --batch 0");
    rejects(
        &["--n", "100", "--gate-queries", "0"],
        "invalid --gate-queries 0",
    );
    rejects(
        &["--n", "100", "--backend", "faiss"],
        "unknown backend `faiss`",
    );
    rejects(
        &["--n", "100", "--metric", "manhattan"],
        "invalid metric = manhattan",
    );
    rejects(
        &["--n", "100", "--backend", "hnsw", "--m", "1"],
        "invalid HNSW parameter m = 1",
    );
    rejects(
        &["--queries", "q.npy"],
        "query files go with a --corpus file",
    );
    rejects(
        &["--corpus", "/nonexistent/corpus.npy"],
        "/nonexistent/corpus.npy",
    );
    rejects(&["plot", "/nonexistent/results"], "/nonexistent/results");
}

#[cfg(not(feature = "cuda"))]
#[test]
fn cuda_without_the_feature_says_how_to_get_it() {
    rejects(
        &["--n", "100", "--backend", "cuda"],
        "this build has no CUDA support; rebuild with --features cuda",
    );
    rejects(
        &[
            "campaign",
            "--out",
            "/tmp/never-written",
            "--backend",
            "cuda",
        ],
        "rebuild with --features cuda",
    );
}

/// On a GPU (the bundle sets TOPK_REQUIRE_GPU=1, where skipping is a
/// failure): every GPU path passes the bitwise gate and is timed.
#[cfg(feature = "cuda")]
#[test]
fn cuda_paths_are_gated_and_timed() {
    let single = bench(&[
        "--backend",
        "cuda",
        "--n",
        "5000",
        "--d",
        "100",
        "--k",
        "50",
        "--trials",
        "5",
        "--metric",
        "cosine",
    ]);
    let e = stderr(&single);
    if !single.status.success() && e.contains("no CUDA") {
        assert_ne!(
            std::env::var("TOPK_REQUIRE_GPU").as_deref(),
            Ok("1"),
            "TOPK_REQUIRE_GPU=1 but: {e}"
        );
        eprintln!("skipping: {e}");
        return;
    }
    assert!(single.status.success(), "{e}");
    let r = records(&single);
    let paths: Vec<&str> = r.iter().map(|r| r.path.as_str()).collect();
    assert_eq!(paths, ["resident", "device", "cpu_roundtrip"]);
    for rec in &r {
        assert_eq!(rec.correct, Some(true), "{rec:?}");
        assert!(rec.median_ms.is_some() && rec.floor_ms.is_some(), "{rec:?}");
    }
    let batch = bench(&[
        "--backend",
        "cuda",
        "--n",
        "5000",
        "--d",
        "100",
        "--k",
        "3000",
        "--trials",
        "3",
        "--batch",
        "8",
    ]);
    assert!(batch.status.success(), "{}", stderr(&batch));
    let r = records(&batch);
    let paths: Vec<(&str, &str)> = r
        .iter()
        .map(|r| (r.backend.as_str(), r.path.as_str()))
        .collect();
    assert_eq!(paths, [("cuda", "resident"), ("cpu", "cpu")]);
    assert!(r.iter().all(|r| r.correct == Some(true)), "{r:?}");
}

#[test]
fn json_line_has_every_design_field() {
    let o = bench(&[
        "--n",
        "700",
        "--d",
        "40",
        "--k",
        "7",
        "--trials",
        "3",
        "--warmup",
        "1",
        "--seed",
        "9",
        "--no-floor",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    let line = out
        .lines()
        .find(|l| l.starts_with(JSON_PREFIX))
        .expect("one result line");
    let v: serde_json::Value =
        serde_json::from_str(line.strip_prefix(JSON_PREFIX).unwrap()).unwrap();
    for (field, expected) in [
        ("n", serde_json::json!(700)),
        ("d", serde_json::json!(40)),
        ("k", serde_json::json!(7)),
        ("batch", serde_json::json!(1)),
        ("metric", serde_json::json!("dot")),
        ("backend", serde_json::json!("cpu")),
        ("path", serde_json::json!("cpu")),
        ("trials", serde_json::json!(3)),
        ("warmup", serde_json::json!(1)),
        ("seed", serde_json::json!(9)),
        ("correct", serde_json::json!(true)),
    ] {
        assert_eq!(v[field], expected, "field {field} in {line}");
    }
    for field in ["median_ms", "min_ms", "max_ms", "p90_ms", "qps"] {
        assert!(
            v[field].as_f64().is_some_and(|x| x > 0.0),
            "{field} in {line}"
        );
    }
    let (min, med, max) = (
        v["min_ms"].as_f64().unwrap(),
        v["median_ms"].as_f64().unwrap(),
        v["max_ms"].as_f64().unwrap(),
    );
    assert!(min <= med && med <= max, "{line}");
    assert!(
        v["floor_ms"].is_null(),
        "--no-floor leaves the floor unknown"
    );
    assert_eq!(v["gate"], "oracle:4");
}

#[test]
fn oracle_backend_batch_and_metrics_run() {
    for metric in ["dot", "cosine", "l2"] {
        let o = bench(&[
            "--n",
            "300",
            "--d",
            "33",
            "--k",
            "400",
            "--trials",
            "2",
            "--warmup",
            "0",
            "--backend",
            "oracle",
            "--metric",
            metric,
            "--batch",
            "5",
            "--no-floor",
        ]);
        assert!(o.status.success(), "{metric}: {}", stderr(&o));
        let r = records(&o);
        assert_eq!(r.len(), 1);
        assert_eq!(
            (r[0].backend.as_str(), r[0].batch, r[0].correct),
            ("oracle", 5, Some(true))
        );
        assert_eq!(r[0].metric, metric);
    }
}

#[test]
fn hnsw_is_timed_with_its_recall() {
    let o = bench(&[
        "--n",
        "2000",
        "--d",
        "16",
        "--k",
        "10",
        "--trials",
        "3",
        "--backend",
        "hnsw",
        "--ef",
        "200",
        "--no-floor",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let r = &records(&o)[0];
    assert_eq!((r.backend.as_str(), r.correct), ("hnsw", None));
    let recall = r.recall.expect("a recall figure");
    assert!(recall > 0.8 && recall <= 1.0, "{recall}");
    assert!(r.median_ms.is_some(), "timed whatever its recall");
    assert!(r.gate.as_deref().unwrap().starts_with("recall vs oracle"));
}

#[test]
fn corpus_and_query_files_are_searched() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = topk_io::synth::gaussian_rows(500, 24, 3, true);
    let queries = topk_io::synth::gaussian_queries(6, 24, 3, true);
    let cp = dir.path().join("corpus.npy");
    let qp = dir.path().join("queries.fvecs");
    topk_io::write_npy_f32(&cp, corpus.view()).unwrap();
    topk_io::write_fvecs(&qp, queries.view()).unwrap();
    let (c, q) = (cp.to_str().unwrap(), qp.to_str().unwrap());

    let o = bench(&[
        "--corpus",
        c,
        "--queries",
        q,
        "--k",
        "5",
        "--trials",
        "2",
        "--no-floor",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let r = records(&o);
    assert_eq!((r[0].n, r[0].d, r[0].correct), (500, 24, Some(true)));
    assert_eq!(r[0].data.as_deref(), Some("corpus.npy"));

    // A prefix of the file, and a D that does not match it.
    let o = bench(&[
        "--corpus",
        c,
        "--n",
        "100",
        "--k",
        "5",
        "--trials",
        "2",
        "--no-floor",
    ]);
    assert_eq!(records(&o)[0].n, 100, "{}", stderr(&o));
    rejects(&["--corpus", c, "--d", "25"], "has D = 24");
    rejects(&["--corpus", c, "--n", "501"], "has only 500 rows");
    let other = dir.path().join("q7.npy");
    topk_io::write_npy_f32(
        &other,
        topk_io::synth::gaussian_queries(3, 7, 1, true).view(),
    )
    .unwrap();
    rejects(
        &["--corpus", c, "--queries", other.to_str().unwrap()],
        "the corpus has D = 24 but the queries have D = 7",
    );
}

#[test]
fn quick_cpu_campaign_then_join_table_and_plots() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let o = bench(&[
        "campaign",
        "--out",
        out.to_str().unwrap(),
        "--quick",
        "--backend",
        "cpu",
        "--no-progress",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let lines = std::fs::read_to_string(out.join("results.jsonl")).unwrap();
    // Quick spec: N ∈ {10k, 50k} × D = 384 × K ∈ {8, 100, 1000} + one batch of 16.
    assert_eq!(lines.lines().count(), 8);
    assert_eq!(records(&o).len(), 8, "every record is echoed");
    let csv = std::fs::read_to_string(out.join("results.csv")).unwrap();
    assert_eq!(csv.lines().count(), 9, "header + 8 rows");
    for f in ["environment.json", "joined.csv", "data/manifest.json"] {
        assert!(out.join(f).is_file(), "{f}");
    }
    let corpus = topk_io::read_npy_f32(out.join("data/corpus_d384.npy")).unwrap();
    assert_eq!(corpus.dim(), (50_000, 384));
    // The file holds exactly the generator's rows: the anchors read the same bytes.
    let expect = topk_io::synth::gaussian_rows(3, 384, 42, true);
    assert_eq!(corpus.slice(ndarray::s![..3, ..]), expect);
    let env: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("environment.json")).unwrap())
            .unwrap();
    assert!(env["host_bandwidth"]["read_bytes_per_s"].as_f64().unwrap() > 0.0);

    let o = bench(&["plot", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    // No rival ran in a CPU-only campaign, so there is no speedup heatmap.
    assert!(!out.join("plots/speedup_heatmap.png").exists());
    for stem in ["latency_k8", "latency_k100", "latency_k1000", "floor"] {
        for ext in ["png", "svg"] {
            let p = out.join("plots").join(format!("{stem}.{ext}"));
            assert!(nonempty(&p), "{}", p.display());
        }
    }
    let readme = dir.path().join("README.md");
    std::fs::write(
        &readme,
        "intro\n<!-- bench-table:start -->\n<!-- bench-table:end -->\nend\n",
    )
    .unwrap();
    let o = bench(&[
        "table",
        out.to_str().unwrap(),
        "--readme",
        readme.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = std::fs::read_to_string(&readme).unwrap();
    assert!(text.starts_with("intro\n") && text.ends_with("<!-- bench-table:end -->\nend\n"));
    assert!(text.contains("| 50k | 384 |"), "{text}");
    assert!(text.contains("Caveats"), "{text}");
}

fn nonempty(p: &Path) -> bool {
    std::fs::metadata(p).is_ok_and(|m| m.len() > 100)
}

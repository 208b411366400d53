//! `topk_demo index ...` on the `hnsw` backend: a graph built and saved by
//! `index build --backend hnsw`, kept through `add` / `remove`, searched by
//! default on a file that holds one, and `--recall-sample` measuring recall
//! against exact search of the same file.

use std::ffi::OsString;
use std::path::Path;

use ndarray::Array2;
use topk::{Filter, FilterSpec, Hit, Index, IndexBackend};

mod common;
use common::{demo, fails_with, stderr, stdout};

fn ok(o: &std::process::Output) -> String {
    assert!(o.status.success(), "status {:?}: {}", o.status, stderr(o));
    stdout(o)
}

fn uniform(n: usize, d: usize, seed: u64) -> Array2<f32> {
    let mut state = seed;
    Array2::from_shape_fn((n, d), |_| {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    })
}

fn args(list: &[&dyn AsRef<std::ffi::OsStr>]) -> Vec<OsString> {
    list.iter().map(|a| a.as_ref().to_owned()).collect()
}

/// Recall@K of `got` against `want`, as the report prints it.
fn recall(got: &[Vec<Hit>], want: &[Vec<Hit>]) -> String {
    let wanted: usize = want.iter().map(Vec::len).sum();
    let found: usize = got
        .iter()
        .zip(want)
        .map(|(g, w)| w.iter().filter(|t| g.iter().any(|h| h.id == t.id)).count())
        .sum();
    format!("{:.3}", found as f64 / wanted as f64)
}

fn search(index: &Path, queries: &Path, extra: &[&str]) -> std::process::Output {
    let mut a = args(&[
        &"index",
        &"search",
        &"--index",
        &index,
        &"--queries",
        &queries,
    ]);
    a.extend(extra.iter().map(OsString::from));
    demo(a)
}

#[test]
fn an_hnsw_file_keeps_its_graph_and_reports_recall() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = |name: &str| dir.path().join(name);
    let (n, d, q) = (3000, 8, 40);
    topk_io::write_matrix(p("corpus.npy"), uniform(n, d, 1).view()).expect("corpus");
    let queries = uniform(q, d, 2);
    topk_io::write_matrix(p("q.npy"), queries.view()).expect("queries");
    let idx = p("g.topkidx");
    let o = demo(args(&[
        &"index",
        &"build",
        &"--corpus",
        &p("corpus.npy"),
        &"--out",
        &idx,
        &"--backend",
        &"hnsw",
        &"--m",
        &"6",
        &"--ef-construction",
        &"24",
        &"--ef",
        &"12",
    ]));
    assert!(
        ok(&o).contains(&format!(
            "{n} rows, D = {d}, metric dot, hnsw graph (M = 6, ef_construction = 24, ef = 12)"
        )),
        "{}",
        stdout(&o)
    );
    assert!(Index::file_info(&idx).expect("info").graph);

    // Without --backend a file with a graph is searched on hnsw.
    let o = search(
        &idx,
        &p("q.npy"),
        &["--k", "10", "--recall-sample", "1000", "--show", "0"],
    );
    let out = ok(&o);
    let graph = Index::open(&idx, IndexBackend::Hnsw).expect("open");
    let exact = Index::open(&idx, IndexBackend::Cpu).expect("open");
    let got = graph
        .search_batch(queries.view(), 10, FilterSpec::None)
        .expect("hnsw");
    let want = exact
        .search_batch(queries.view(), 10, FilterSpec::None)
        .expect("cpu");
    let line = format!(
        "recall@10 over {q} sampled queries against exact search: {}",
        recall(&got, &want)
    );
    assert!(out.contains(&line), "{out}");
    assert!(out.contains("backend hnsw"), "{out}");
    assert!(stderr(&o).contains(&line), "{}", stderr(&o));

    // A filter of 1 % of the ids: scored exactly, so recall is 1.
    let allowed: Vec<u32> = (0..n as u32).step_by(100).collect();
    let a = Array2::from_shape_vec((allowed.len(), 1), allowed.clone()).expect("shape");
    topk_io::write_npy_u32(p("allow.npy"), a.view()).expect("ids");
    let o = search(
        &idx,
        &p("q.npy"),
        &[
            "--k",
            "5",
            "--recall-sample",
            "7",
            "--filter",
            p("allow.npy").to_str().expect("utf-8"),
        ],
    );
    assert!(
        ok(&o).contains("recall@5 over 7 sampled queries against exact search: 1.000"),
        "{}",
        stdout(&o)
    );
    let f = Filter::new(allowed.iter().map(|&i| u64::from(i)));
    assert_eq!(
        graph
            .search_batch(queries.view(), 5, FilterSpec::Shared(&f))
            .expect("hnsw"),
        exact
            .search_batch(queries.view(), 5, FilterSpec::Shared(&f))
            .expect("cpu")
    );

    // Adding and removing rows keeps the graph in the file.
    topk_io::write_matrix(p("more.npy"), uniform(10, d, 3).view()).expect("rows");
    let o = demo(args(&[
        &"index",
        &"add",
        &"--index",
        &idx,
        &"--rows",
        &p("more.npy"),
    ]));
    assert!(ok(&o).contains("3010 rows now (10 new)"), "{}", stdout(&o));
    let gone = Array2::from_shape_vec((2, 1), vec![0u32, 3005]).expect("shape");
    topk_io::write_npy_u32(p("gone.npy"), gone.view()).expect("ids");
    let o = demo(args(&[
        &"index",
        &"remove",
        &"--index",
        &idx,
        &"--ids",
        &p("gone.npy"),
    ]));
    assert!(
        ok(&o).contains("removed 2 of 2 ids given"),
        "{}",
        stdout(&o)
    );
    assert!(Index::file_info(&idx).expect("info").graph);
    let o = demo(args(&[&"index", &"info", &"--index", &idx]));
    assert!(
        ok(&o).contains("3008 rows, D = 8, metric dot, hnsw graph (M = 6"),
        "{}",
        stdout(&o)
    );

    // The exact backends still answer exactly from the same file.
    let o = search(
        &idx,
        &p("q.npy"),
        &["--k", "3", "--backend", "cpu", "--recall-sample", "5"],
    );
    let out = ok(&o);
    assert!(out.contains("backend cpu"), "{out}");
    assert!(out.contains("against exact search: 1.000"), "{out}");

    let o = search(&idx, &p("q.npy"), &["--ef", "0"]);
    fails_with(&o, &["ef", "at least 1"]);
}

#[test]
fn a_file_without_a_graph_is_searched_on_hnsw_by_building_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = |name: &str| dir.path().join(name);
    let (n, d) = (2000, 4);
    topk_io::write_matrix(p("corpus.npy"), uniform(n, d, 5).view()).expect("corpus");
    let queries = uniform(5, d, 6);
    topk_io::write_matrix(p("q.npy"), queries.view()).expect("queries");
    let idx = p("plain.topkidx");
    let o = demo(args(&[
        &"index",
        &"build",
        &"--corpus",
        &p("corpus.npy"),
        &"--out",
        &idx,
    ]));
    assert!(!ok(&o).contains("hnsw graph"), "{}", stdout(&o));
    assert!(!Index::file_info(&idx).expect("info").graph);
    let o = search(
        &idx,
        &p("q.npy"),
        &["--k", "4", "--backend", "hnsw", "--recall-sample", "5"],
    );
    let out = ok(&o);
    assert!(
        out.contains("5 queries, K = 4, 2000 index rows, backend hnsw"),
        "{out}"
    );
    assert!(
        out.contains("recall@4 over 5 sampled queries against exact search: "),
        "{out}"
    );
    // Searching builds a graph in memory only: the file is unchanged.
    assert!(!Index::file_info(&idx).expect("info").graph);
}

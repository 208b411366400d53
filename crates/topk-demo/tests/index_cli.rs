//! `topk_demo index ...` end to end: build, add, remove, search with a filter
//! file and info on saved index files, every answer equal to an in-process
//! `topk::Index` holding the same content, and bad inputs named.

use std::ffi::OsStr;
use std::path::Path;
use std::process::{Command, Output};

use ndarray::Array2;
use topk::{Filter, FilterSpec, Hit, Index, IndexBackend, Metric};

mod common;
use common::exe;

fn demo<I, S>(args: I) -> Output
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    Command::new(exe())
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("the demo binary runs")
}

fn ok(o: &Output) -> String {
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "status {:?}: {err}", o.status);
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn fails_with(o: &Output, needle: &str) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(err.contains(needle), "`{needle}` missing from: {err}");
}

/// Rows of small integers: many exact ties, so the id tiebreak shows.
fn rows(n: usize, d: usize, seed: usize) -> Array2<f32> {
    Array2::from_shape_fn((n, d), |(i, j)| (((i + seed) * 7 + j * 3) % 5) as f32 - 2.0)
}

fn write_ids(path: &Path, ids: &[u32]) {
    let a = Array2::from_shape_vec((ids.len(), 1), ids.to_vec()).expect("shape");
    topk_io::write_npy_u32(path, a.view()).expect("write ids");
}

/// The report `index search` prints for these hits.
fn report(hits: &[Vec<Hit>], metric: Metric) -> String {
    let mut out = String::new();
    for (q, hs) in hits.iter().enumerate() {
        out.push_str(&format!("query {q}:\n"));
        for (rank, h) in hs.iter().enumerate() {
            let value = metric.display_value(h.score);
            out.push_str(&format!("  {rank:>3}  id {:<20} {value}\n", h.id));
        }
    }
    out
}

#[test]
fn build_add_remove_search_and_info_agree_with_an_in_process_index() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = |name: &str| dir.path().join(name);
    let (n, d) = (40, 6);
    let corpus = rows(n, d, 0);
    topk_io::write_matrix(p("corpus.npy"), corpus.view()).expect("corpus");
    let ids: Vec<u32> = (0..n as u32).map(|i| (i * 37) % 101 + 1000).collect();
    write_ids(&p("ids.npy"), &ids);
    let idx = p("docs.topkidx");
    let o = demo([
        OsStr::new("index"),
        OsStr::new("build"),
        OsStr::new("--corpus"),
        p("corpus.npy").as_os_str(),
        OsStr::new("--ids"),
        p("ids.npy").as_os_str(),
        OsStr::new("--metric"),
        OsStr::new("cosine"),
        OsStr::new("--out"),
        idx.as_os_str(),
    ]);
    assert!(ok(&o).contains(&format!("{n} rows, D = {d}, metric cosine")));

    // Add 5 rows under ids of a file, then 3 under the next ids.
    let more = rows(5, d, 3);
    topk_io::write_matrix(p("more.npy"), more.view()).expect("rows");
    write_ids(&p("more_ids.npy"), &[1, 2, 3, 4, 5]);
    let add = |rows: &str, ids: Option<&str>| {
        let mut a = vec![
            "index".into(),
            "add".into(),
            "--index".into(),
            idx.clone().into_os_string(),
            "--rows".into(),
            p(rows).into_os_string(),
        ];
        if let Some(i) = ids {
            a.push("--ids".into());
            a.push(p(i).into_os_string());
        }
        demo(a)
    };
    assert!(ok(&add("more.npy", Some("more_ids.npy"))).contains("45 rows now (5 new)"));
    let auto = rows(3, d, 9);
    topk_io::write_matrix(p("auto.npy"), auto.view()).expect("rows");
    ok(&add("auto.npy", None));
    // An id already present is refused, and the file keeps its rows.
    fails_with(
        &add("more.npy", Some("more_ids.npy")),
        "id 1 at position 0 is already in the index",
    );

    write_ids(&p("gone.npy"), &[1000, 2, 77]);
    let o = demo([
        OsStr::new("index"),
        OsStr::new("remove"),
        OsStr::new("--index"),
        idx.as_os_str(),
        OsStr::new("--ids"),
        p("gone.npy").as_os_str(),
    ]);
    assert!(ok(&o).contains("removed 2 of 3 ids given"));

    // The same content, built in process.
    let mut want = Index::with_ids(
        &ids.iter().map(|&i| u64::from(i)).collect::<Vec<_>>(),
        corpus.view(),
        Metric::Cosine,
        IndexBackend::Oracle,
    )
    .expect("index");
    want.add(&[1, 2, 3, 4, 5], more.view()).expect("add");
    want.add_auto(auto.view()).expect("add");
    want.remove(&[1000, 2, 77]);

    let queries = rows(4, d, 1);
    topk_io::write_matrix(p("q.npy"), queries.view()).expect("queries");
    let allowed: Vec<u32> = ids.iter().copied().step_by(3).chain([3, 4, 9999]).collect();
    write_ids(&p("allow.npy"), &allowed);
    for backend in ["cpu", "oracle"] {
        let o = demo([
            OsStr::new("index"),
            OsStr::new("search"),
            OsStr::new("--index"),
            idx.as_os_str(),
            OsStr::new("--queries"),
            p("q.npy").as_os_str(),
            OsStr::new("--filter"),
            p("allow.npy").as_os_str(),
            OsStr::new("--k"),
            OsStr::new("7"),
            OsStr::new("--show"),
            OsStr::new("4"),
            OsStr::new("--backend"),
            OsStr::new(backend),
        ]);
        let f = Filter::new(allowed.iter().map(|&i| u64::from(i)));
        let hits = want
            .search_batch(queries.view(), 7, FilterSpec::Shared(&f))
            .expect("search");
        let out = ok(&o);
        assert!(
            out.starts_with(&report(&hits, Metric::Cosine)),
            "{backend}:\n{out}"
        );
        assert!(out.contains(&format!(
            "4 queries, K = 7, {} index rows, filter of",
            want.len()
        )));
    }
    let o = demo([
        OsStr::new("index"),
        OsStr::new("info"),
        OsStr::new("--index"),
        idx.as_os_str(),
    ]);
    assert!(ok(&o).contains(&format!("{} rows, D = {d}, metric cosine", want.len())));
    assert_eq!(want.len(), n + 5 + 3 - 2);
}

/// `--dtype f16` stores half-width rows: info says so, the file is about
/// half the size, and searches equal an in-process f16 index.
#[test]
fn half_width_index_files() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = |name: &str| dir.path().join(name);
    let (n, d) = (300, 16);
    let corpus =
        Array2::from_shape_fn((n, d), |(i, j)| ((i * 13 + j * 7) % 23) as f32 * 0.37 - 4.0);
    topk_io::write_matrix(p("corpus.npy"), corpus.view()).expect("corpus");
    let build = |dtype: &str, out: &str| {
        demo([
            "index",
            "build",
            "--corpus",
            p("corpus.npy").to_str().unwrap(),
            "--metric",
            "l2",
            "--dtype",
            dtype,
            "--out",
            p(out).to_str().unwrap(),
        ])
    };
    assert!(ok(&build("f16", "h.topkidx")).contains(&format!("f16 rows ({} bytes)", n * d * 2)));
    ok(&build("f32", "f.topkidx"));
    let (half, full) = (
        std::fs::metadata(p("h.topkidx")).expect("stat").len(),
        std::fs::metadata(p("f.topkidx")).expect("stat").len(),
    );
    assert!(half * 10 < full * 6, "{half} vs {full}");
    let info = ok(&demo([
        "index",
        "info",
        "--index",
        p("h.topkidx").to_str().unwrap(),
    ]));
    assert!(info.contains("f16 rows"), "{info}");
    topk_io::write_matrix(p("q.npy"), corpus.slice(ndarray::s![0..3, ..])).expect("queries");
    let got = ok(&demo([
        "index",
        "search",
        "--index",
        p("h.topkidx").to_str().unwrap(),
        "--queries",
        p("q.npy").to_str().unwrap(),
        "-k",
        "5",
    ]));
    let options = topk::IndexOptions::default().dtype(topk::Dtype::F16);
    let mut want = Index::with_options(d, Metric::L2, IndexBackend::Cpu, &options).expect("index");
    let ids: Vec<u64> = (0..n as u64).collect();
    want.add(&ids, corpus.view()).expect("add");
    let hits = want
        .search_batch(corpus.slice(ndarray::s![0..3, ..]), 5, FilterSpec::None)
        .expect("search");
    assert!(got.contains(&report(&hits, Metric::L2)), "{got}");
    // A value f16 cannot hold is named, and no file is written.
    let mut loud = corpus.clone();
    loud[[7, 3]] = 1.0e6;
    topk_io::write_matrix(p("loud.npy"), loud.view()).expect("corpus");
    let o = demo([
        "index",
        "build",
        "--corpus",
        p("loud.npy").to_str().unwrap(),
        "--dtype",
        "f16",
        "--out",
        p("loud.topkidx").to_str().unwrap(),
    ]);
    fails_with(&o, "corpus row 7, column 3");
    assert!(!p("loud.topkidx").exists());
}

#[test]
fn bad_index_files_and_id_counts_are_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    let corpus = rows(10, 4, 0);
    let c = dir.path().join("c.npy");
    topk_io::write_matrix(&c, corpus.view()).expect("corpus");
    let ids = dir.path().join("ids.npy");
    write_ids(&ids, &[1, 2, 3]);
    let idx = dir.path().join("x.topkidx");
    let build = |with_ids: bool| {
        let mut a: Vec<std::ffi::OsString> = vec![
            "index".into(),
            "build".into(),
            "--corpus".into(),
            c.clone().into(),
            "--out".into(),
            idx.clone().into(),
        ];
        if with_ids {
            a.extend(["--ids".into(), ids.clone().into()]);
        }
        demo(a)
    };
    fails_with(&build(true), "has 3 ids for the 10 rows of");
    ok(&build(false));
    let bytes = std::fs::read(&idx).expect("read");
    std::fs::write(&idx, &bytes[..bytes.len() - 3]).expect("truncate");
    let o = demo([
        OsStr::new("index"),
        OsStr::new("info"),
        OsStr::new("--index"),
        idx.as_os_str(),
    ]);
    fails_with(
        &o,
        &format!("truncated: the file ends at offset {}", bytes.len() - 3),
    );
    let o = demo([
        OsStr::new("index"),
        OsStr::new("info"),
        OsStr::new("--index"),
        c.as_os_str(),
    ]);
    fails_with(&o, "not a topk index file");
}

/// A `.npy` of one axis, as `np.save("ids.npy", np.array(ids, dtype))`
/// writes it (`descr` `<i8` or `<u8`).
fn write_ids_1d(path: &Path, descr: &str, ids: &[u64]) {
    let mut dict = format!(
        "{{'descr': '{descr}', 'fortran_order': False, 'shape': ({},), }}",
        ids.len()
    );
    while (10 + dict.len() + 1) % 64 != 0 {
        dict.push(' ');
    }
    dict.push('\n');
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend_from_slice(&u16::try_from(dict.len()).expect("short").to_le_bytes());
    bytes.extend_from_slice(dict.as_bytes());
    for &id in ids {
        bytes.extend_from_slice(&id.to_le_bytes());
    }
    std::fs::write(path, bytes).expect("write ids");
}

#[test]
fn one_axis_and_64_bit_id_files_build_remove_and_filter() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = |name: &str| dir.path().join(name);
    let (n, d) = (6, 3);
    let corpus = rows(n, d, 1);
    topk_io::write_matrix(p("corpus.npy"), corpus.view()).expect("corpus");
    topk_io::write_matrix(p("q.npy"), rows(2, d, 4).view()).expect("queries");
    let big = 5_000_000_000u64;
    let ids: Vec<u64> = vec![0, 1, 2, big, big + 1, topk::MAX_ID];
    for descr in ["<i8", "<u8"] {
        write_ids_1d(&p("ids.npy"), descr, &ids);
        let idx = p("big.topkidx");
        ok(&demo([
            OsStr::new("index"),
            OsStr::new("build"),
            OsStr::new("--corpus"),
            p("corpus.npy").as_os_str(),
            OsStr::new("--ids"),
            p("ids.npy").as_os_str(),
            OsStr::new("--out"),
            idx.as_os_str(),
        ]));
        write_ids_1d(&p("gone.npy"), descr, &[big]);
        let out = ok(&demo([
            OsStr::new("index"),
            OsStr::new("remove"),
            OsStr::new("--index"),
            idx.as_os_str(),
            OsStr::new("--ids"),
            p("gone.npy").as_os_str(),
        ]));
        assert!(out.contains("removed 1 of 1 ids given"), "{out}");
        write_ids_1d(&p("allowed.npy"), descr, &[big, big + 1, topk::MAX_ID]);
        let out = ok(&demo([
            OsStr::new("index"),
            OsStr::new("search"),
            OsStr::new("--index"),
            idx.as_os_str(),
            OsStr::new("--queries"),
            p("q.npy").as_os_str(),
            OsStr::new("--filter"),
            p("allowed.npy").as_os_str(),
            OsStr::new("--k"),
            OsStr::new("5"),
        ]));
        // The same content in process: ids as given, `big` removed.
        let mut expect = Index::new(d, Metric::Dot, IndexBackend::Cpu).expect("index");
        expect.add(&ids, corpus.view()).expect("add");
        assert_eq!(expect.remove(&[big]), 1);
        let allowed = Filter::new(vec![big, big + 1, topk::MAX_ID]);
        let hits = expect
            .search_batch(rows(2, d, 4).view(), 5, FilterSpec::Shared(&allowed))
            .expect("search");
        assert!(hits.iter().all(|h| h.len() == 2), "{hits:?}");
        assert!(
            out.starts_with(&report(&hits, Metric::Dot)),
            "{descr}: {out}"
        );
    }
    // A negative id is named with its position.
    write_ids_1d(&p("neg.npy"), "<i8", &[0, 1, 2, u64::MAX, 4, 5]);
    fails_with(
        &demo([
            OsStr::new("index"),
            OsStr::new("build"),
            OsStr::new("--corpus"),
            p("corpus.npy").as_os_str(),
            OsStr::new("--ids"),
            p("neg.npy").as_os_str(),
            OsStr::new("--out"),
            p("neg.topkidx").as_os_str(),
        ]),
        "value -1 at row 3, column 0 does not fit in u64",
    );
    assert!(!p("neg.topkidx").exists());
}

#[test]
fn index_build_never_replaces_its_inputs_and_checks_the_folder_first() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = |name: &str| dir.path().join(name);
    topk_io::write_matrix(p("corpus.npy"), rows(5, 2, 0).view()).expect("corpus");
    write_ids(&p("ids.npy"), &[5, 6, 7, 8, 9]);
    let corpus_bytes = std::fs::read(p("corpus.npy")).expect("read");
    let ids_bytes = std::fs::read(p("ids.npy")).expect("read");
    for out in ["corpus.npy", "ids.npy", "./corpus.npy"] {
        fails_with(
            &demo([
                OsStr::new("index"),
                OsStr::new("build"),
                OsStr::new("--corpus"),
                p("corpus.npy").as_os_str(),
                OsStr::new("--ids"),
                p("ids.npy").as_os_str(),
                OsStr::new("--out"),
                dir.path().join(out).as_os_str(),
            ]),
            "would overwrite the input",
        );
    }
    assert_eq!(std::fs::read(p("corpus.npy")).expect("read"), corpus_bytes);
    assert_eq!(std::fs::read(p("ids.npy")).expect("read"), ids_bytes);
    let build = |corpus: &Path, out: &Path| {
        demo([
            OsStr::new("index"),
            OsStr::new("build"),
            OsStr::new("--corpus"),
            corpus.as_os_str(),
            OsStr::new("--out"),
            out.as_os_str(),
        ])
    };
    let o = build(&p("corpus.npy"), &p("missing/x.topkidx"));
    fails_with(&o, "missing");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("index built"), "{err}");
    // An --out that can never be written is refused before the corpus is
    // read (the corpus named here does not exist).
    std::fs::create_dir(p("a-folder.topkidx")).expect("mkdir");
    let o = build(&p("absent.npy"), &p("a-folder.topkidx"));
    fails_with(&o, "cannot be written: it is a folder");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let ro = p("read-only");
        std::fs::create_dir(&ro).expect("mkdir");
        std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o555)).expect("chmod");
        // Root writes anywhere: the check only means something for others.
        if std::fs::File::create(ro.join("probe")).is_err() {
            let o = build(&p("absent.npy"), &ro.join("x.topkidx"));
            fails_with(&o, "cannot be written");
        }
        std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
}

#[test]
fn flags_are_checked_before_any_work() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = |name: &str| dir.path().join(name);
    topk_io::write_matrix(p("corpus.npy"), rows(5, 2, 0).view()).expect("corpus");
    topk_io::write_matrix(p("q.npy"), rows(2, 2, 3).view()).expect("queries");
    let idx = p("x.topkidx");
    let build = |extra: &[&str]| {
        let mut args = vec![
            OsStr::new("index"),
            OsStr::new("build"),
            OsStr::new("--corpus"),
            p("corpus.npy").into_os_string().leak(),
            OsStr::new("--out"),
            idx.as_os_str(),
        ];
        args.extend(extra.iter().map(OsStr::new));
        demo(args)
    };
    for flag in ["--m", "--ef-construction", "--ef"] {
        fails_with(
            &build(&["--backend", "cpu", flag, "8"]),
            &format!("{flag} only applies to --backend hnsw (the backend is cpu)"),
        );
        assert!(!idx.exists());
    }
    ok(&build(&[]));
    let search = |extra: &[&str]| {
        let mut args = vec![
            OsStr::new("index"),
            OsStr::new("search"),
            OsStr::new("--index"),
            idx.as_os_str(),
            OsStr::new("--queries"),
            p("q.npy").into_os_string().leak(),
        ];
        args.extend(extra.iter().map(OsStr::new));
        demo(args)
    };
    fails_with(
        &search(&["--recall-sample", "0"]),
        "--recall-sample 0 measures nothing",
    );
    fails_with(
        &search(&["--ef", "40"]),
        "--ef only applies to --backend hnsw",
    );
    // K and --ef are checked before the file is opened (on hnsw, opening a
    // file without a graph builds one): a missing file is never reached.
    let absent = |extra: &[&str]| {
        let mut args = vec!["index", "search", "--index", "/nonexistent/x.topkidx"];
        args.extend(["--queries", "/nonexistent/q.npy"]);
        args.extend(extra);
        demo(args)
    };
    fails_with(&absent(&["--k", "0"]), "invalid K = 0");
    fails_with(
        &absent(&["--backend", "cpu", "--ef", "40"]),
        "--ef only applies to --backend hnsw (the backend is cpu)",
    );
    let o = absent(&["--backend", "hnsw", "--ef", "0"]);
    fails_with(&o, "must be at least 1 (values below k are raised to k)");
    assert!(!String::from_utf8_lossy(&o.stderr).contains("nonexistent"));
    // On an exact backend the recall sample is measured (and is 1).
    assert!(ok(&search(&["--recall-sample", "2"])).contains("against exact search: 1.000"));
    // `--no-progress` goes before or after the command; a flag of the search
    // story beside an index command is named.
    let info = |before: &[&str]| {
        let mut args: Vec<&OsStr> = before.iter().map(OsStr::new).collect();
        args.extend([
            OsStr::new("index"),
            OsStr::new("info"),
            OsStr::new("--index"),
            idx.as_os_str(),
        ]);
        demo(args)
    };
    assert!(ok(&info(&["--no-progress"])).contains("5 rows"));
    fails_with(
        &info(&["--k", "3"]),
        "--k is a flag of the search story (no command); `topk_demo index info` does not take it",
    );
}

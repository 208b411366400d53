//! The lifecycle benchmark of the `cuda` backend: building and growing a
//! resident index, removing from it, filtered search at several
//! selectivities (single queries and batches), save and open (with and
//! without the upload), against the raw reads and writes of the same bytes.
//! One JSON object per line on stdout; progress on stderr.
//!
//! The corpus is written to `<dir>/corpus.f32` (row-major, little-endian)
//! and the filters to `<dir>/filter_<permille>.u64` so that the torch
//! anchors (`bench/gpu/lifecycle_anchors.py`) time the same data in the
//! same run.
//!
//! `cargo run --release -p topk-index --example gpu_lifecycle -- --help`

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use ndarray::ArrayView2;
use serde_json::json;
use topk_core::Metric;
use topk_index::{Filter, FilterSpec, Index, IndexBackend, IndexOptions};

struct Args {
    n: usize,
    d: usize,
    add: usize,
    k: usize,
    batch: usize,
    reps: usize,
    dir: PathBuf,
}

fn usage() -> ! {
    eprintln!(
        "usage: gpu_lifecycle [--n ROWS] [--d DIM] [--add ROWS] [--k K] [--batch Q] [--reps R] --dir DIR"
    );
    std::process::exit(2)
}

fn parse() -> Args {
    let mut a = Args {
        n: 1_000_000,
        d: 1024,
        add: 100_000,
        k: 100,
        batch: 256,
        reps: 20,
        dir: PathBuf::new(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().unwrap_or_else(|| usage());
        let num = |s: String| s.parse::<usize>().unwrap_or_else(|_| usage());
        match flag.as_str() {
            "--n" => a.n = num(value()),
            "--d" => a.d = num(value()),
            "--add" => a.add = num(value()),
            "--k" => a.k = num(value()),
            "--batch" => a.batch = num(value()),
            "--reps" => a.reps = num(value()),
            "--dir" => a.dir = PathBuf::from(value()),
            _ => usage(),
        }
    }
    if a.dir.as_os_str().is_empty() {
        usage()
    }
    a
}

/// Deterministic values in [-1, 1) from a 64-bit mix of the position.
fn values(seed: u64, count: usize) -> Vec<f32> {
    (0..count as u64)
        .map(|i| {
            let mut x = (i ^ seed.rotate_left(17)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            x ^= x >> 31;
            x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
            x ^= x >> 29;
            ((x >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn timed<T>(f: impl FnOnce() -> T) -> (T, f64) {
    let t = Instant::now();
    let out = f();
    (out, t.elapsed().as_secs_f64())
}

fn emit(line: serde_json::Value) {
    println!("{line}");
    let _ = std::io::stdout().flush();
}

fn to_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a = parse();
    std::fs::create_dir_all(&a.dir)?;
    let (n, d) = (a.n, a.d);
    eprintln!("generating {n} x {d} rows and {} more", a.add);
    let corpus = values(1, n * d);
    let extra = values(2, a.add * d);
    let queries = values(3, a.batch * d);
    let (_, write_s) = timed(|| std::fs::write(a.dir.join("corpus.f32"), to_bytes(&corpus)));
    std::fs::write(a.dir.join("extra.f32"), to_bytes(&extra))?;
    std::fs::write(a.dir.join("queries.f32"), to_bytes(&queries))?;
    emit(json!({"what": "raw write", "bytes": n * d * 4, "s": write_s}));

    // Ids: the even numbers, so the added rows (odd ids) land between them.
    let ids: Vec<u64> = (0..n as u64).map(|i| 2 * i).collect();
    let rows = ArrayView2::from_shape((n, d), &corpus)?;
    let options = IndexOptions::default().capacity(n);
    eprintln!("building the cuda index");
    let (index, build_s) = timed(|| -> Result<Index, topk_index::IndexError> {
        let mut ix = Index::with_options(d, Metric::Dot, IndexBackend::Cuda, &options)?;
        ix.add(&ids, rows)?;
        Ok(ix)
    });
    let mut index = index?;
    emit(
        json!({"what": "build (add of every row into an empty cuda index)", "rows": n, "bytes": n * d * 4, "s": build_s}),
    );

    // Adds past the reserved capacity: above the largest id (appended) and
    // between existing ids (merged on the device).
    let top: Vec<u64> = (0..a.add as u64).map(|i| 2 * n as u64 + i).collect();
    let extra_rows = ArrayView2::from_shape((a.add, d), &extra)?;
    let (r, s) = timed(|| index.add(&top, extra_rows));
    r?;
    emit(
        json!({"what": "add above the largest id (grows capacity by a device copy)", "rows": a.add, "bytes": a.add * d * 4, "s": s}),
    );
    let gone = index.remove(&top);
    assert_eq!(gone, a.add);
    index.compact();
    let (r, s) = timed(|| index.add(&top, extra_rows));
    r?;
    emit(
        json!({"what": "add above the largest id (within capacity)", "rows": a.add, "bytes": a.add * d * 4, "s": s}),
    );
    let between: Vec<u64> = (0..a.add as u64).map(|i| 2 * i + 1).collect();
    let (r, s) = timed(|| index.add(&between, extra_rows));
    r?;
    emit(
        json!({"what": "add between existing ids (device merge)", "rows": a.add, "bytes": a.add * d * 4, "s": s}),
    );
    let (gone, s) = timed(|| {
        let mut all = top.clone();
        all.extend_from_slice(&between);
        index.remove(&all)
    });
    emit(json!({"what": "remove", "rows": gone, "s": s}));
    let (_, s) = timed(|| index.compact());
    emit(json!({"what": "compact", "s": s}));

    let q1 = &queries[..d];
    let qv = ArrayView2::from_shape((a.batch, d), &queries)?;
    let single = |f: Option<&Filter>| -> Result<f64, topk_index::IndexError> {
        index.search(q1, a.k, f)?;
        let mut t = Vec::with_capacity(a.reps);
        for _ in 0..a.reps {
            let (r, s) = timed(|| index.search(q1, a.k, f));
            r?;
            t.push(s);
        }
        Ok(median(t))
    };
    let unfiltered = single(None)?;
    let mut rows_out = Vec::new();
    for permille in [1000usize, 100, 10, 1] {
        let mut kept: Vec<u64> = ids
            .iter()
            .copied()
            .filter(|&id| (id / 2).wrapping_mul(0x9E37_79B9) % 1000 < permille as u64)
            .collect();
        kept.sort_unstable();
        std::fs::write(
            a.dir.join(format!("filter_{permille}.u64")),
            kept.iter()
                .flat_map(|x| x.to_le_bytes())
                .collect::<Vec<u8>>(),
        )?;
        let f = Filter::new(kept.iter().copied());
        let s = single(Some(&f))?;
        rows_out.push((permille, f, s));
        emit(
            json!({"what": "search", "queries": 1, "k": a.k, "allowed_permille": permille, "s": s, "unfiltered_s": unfiltered, "ratio": s / unfiltered}),
        );
    }
    let batch = |f: FilterSpec<'_>| -> Result<f64, topk_index::IndexError> {
        index.search_batch(qv, a.k, f)?;
        let mut t = Vec::with_capacity(a.reps);
        for _ in 0..a.reps.min(10) {
            let (r, s) = timed(|| index.search_batch(qv, a.k, f));
            r?;
            t.push(s);
        }
        Ok(median(t))
    };
    let unfiltered_b = batch(FilterSpec::None)?;
    for (permille, f, _) in &rows_out {
        let s = batch(FilterSpec::Shared(f))?;
        emit(
            json!({"what": "search", "queries": a.batch, "k": a.k, "allowed_permille": permille, "s": s, "unfiltered_s": unfiltered_b, "ratio": s / unfiltered_b}),
        );
    }
    emit(json!({"what": "search unfiltered", "queries": 1, "k": a.k, "s": unfiltered}));
    emit(json!({"what": "search unfiltered", "queries": a.batch, "k": a.k, "s": unfiltered_b}));

    let path = a.dir.join("index.topkidx");
    let (r, s) = timed(|| index.save(&path));
    r?;
    let bytes = std::fs::metadata(&path)?.len();
    emit(json!({"what": "save", "bytes": bytes, "s": s}));
    drop(index);
    let (r, s) = timed(|| std::fs::read(&path).map(|v| v.len()));
    r?;
    emit(json!({"what": "raw read of the saved file", "bytes": bytes, "s": s}));
    let (r, s) = timed(|| Index::open(&path, IndexBackend::Cpu));
    drop(r?);
    emit(json!({"what": "open (cpu)", "bytes": bytes, "s": s}));
    let (r, s) = timed(|| Index::open(&path, IndexBackend::Cuda));
    drop(r?);
    emit(json!({"what": "open + upload (cuda)", "bytes": bytes, "s": s}));
    Ok(())
}

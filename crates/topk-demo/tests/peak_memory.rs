//! Peak memory of a file-backed corpus: the corpus is read once into the
//! buffer the backend keeps (no mapping and owned copy alive together), so a
//! `--backend cpu` run over a 1 GB `.npy` corpus peaks at no more than 1.15
//! times the file's size. Measured with GNU time's maximum resident set
//! size; skipped, with the reason printed, where `/usr/bin/time` is missing.
//! bench/memory/peak_rss.sh is the same measurement as a script.

use std::io::Write;
use std::path::Path;
use std::process::Command;

mod common;
use common::exe;

/// Writes a `.npy` of `blocks` copies of `block` (rows of `dim` float32).
fn write_npy(path: &Path, block: &[f32], dim: usize, blocks: usize) {
    let rows = block.len() / dim * blocks;
    let mut header =
        format!("{{'descr': '<f4', 'fortran_order': False, 'shape': ({rows}, {dim}), }}");
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    f.write_all(b"\x93NUMPY\x01\x00").unwrap();
    f.write_all(&(header.len() as u16).to_le_bytes()).unwrap();
    f.write_all(header.as_bytes()).unwrap();
    let bytes: Vec<u8> = block.iter().flat_map(|v| v.to_le_bytes()).collect();
    for _ in 0..blocks {
        f.write_all(&bytes).unwrap();
    }
    f.flush().unwrap();
}

#[test]
fn peak_memory_of_a_1gb_npy_corpus_is_at_most_1_15_times_the_file() {
    let time = Path::new("/usr/bin/time");
    if !time.is_file() {
        println!("skipped: no /usr/bin/time to measure the peak resident set size");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (corpus, queries) = (dir.path().join("c.npy"), dir.path().join("q.npy"));
    let d = 384;
    // 171 blocks of 4,096 rows: 700,416 x 384 float32, 1.08 GB.
    let block = topk_io::synth::gaussian_rows(4096, d, 1, false);
    write_npy(&corpus, block.as_slice().unwrap(), d, 171);
    let q = topk_io::synth::gaussian_queries(10, d, 1, false);
    write_npy(&queries, q.as_slice().unwrap(), d, 1);
    let o = Command::new(time)
        .arg("-v")
        .arg(exe())
        .args(["--backend", "cpu", "--k", "10", "--corpus"])
        .arg(&corpus)
        .arg("--queries")
        .arg(&queries)
        .arg("--out")
        .arg(dir.path().join("r.npy"))
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    let kib: u64 = err
        .lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("Maximum resident set size (kbytes): ")
        })
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no maximum resident set size in {err}"));
    let file = std::fs::metadata(&corpus).unwrap().len();
    let ratio = (kib * 1024) as f64 / file as f64;
    println!(
        "peak RSS {} KiB for a {file}-byte corpus: {ratio:.3} x",
        kib
    );
    assert!(ratio <= 1.15, "peak RSS is {ratio:.3} x the corpus file");
}

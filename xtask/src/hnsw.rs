//! `cargo xtask hnsw-bench`: topk-hnsw against hnswlib and faiss
//! `IndexHNSWFlat` on identical files, into `bench/results/hnsw-cpu-<date>/`.
//!
//! Builds the `hnsw_sweep` example in release, makes sure the pinned anchor
//! venv exists, and hands over to `bench/hnsw/compare.py`, which generates the
//! Gaussian-cluster set once (through the sweep binary, so the files come from
//! topk-io), runs every library and writes CSV, environment and plots.

use std::process::Command;

use crate::util::{anchor_venv, root, run, XResult};

/// Runs the comparison; extra arguments go to `compare.py` (`--out DIR`,
/// `--repeats N`, `--gauss-n N`, `--libraries a,b`).
pub fn hnsw_bench_cmd(args: &[String]) -> XResult<()> {
    let python = anchor_venv()?;
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    run(Command::new(cargo).current_dir(root()).args([
        "build",
        "--release",
        "-p",
        "topk-hnsw",
        "--example",
        "hnsw_sweep",
    ]))?;
    let bin = root().join("target/release/examples/hnsw_sweep");
    let gauss_n = args
        .iter()
        .position(|a| a == "--gauss-n")
        .and_then(|i| args.get(i + 1))
        .map_or("100000", String::as_str);
    let gauss = root().join(format!("target/hnsw-data/gauss-{gauss_n}-d128"));
    let mut cmd = Command::new(python);
    cmd.current_dir(root())
        .arg(root().join("bench/hnsw/compare.py"))
        .arg("--sweep-bin")
        .arg(bin)
        .arg("--minilm")
        .arg(root().join("../shared/data/minilm-docs-20k"))
        .arg("--gauss")
        .arg(gauss)
        .args(args);
    run(&mut cmd)
}

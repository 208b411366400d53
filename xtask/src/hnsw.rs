//! `cargo xtask hnsw-bench`: topk-hnsw against hnswlib and faiss
//! `IndexHNSWFlat` on identical files, into
//! `bench/results/<machine>/<date>-<commit>/`.
//!
//! Builds the `hnsw_sweep` example in release, makes sure the pinned anchor
//! venv exists, and hands over to `bench/hnsw/compare.py`, which generates the
//! Gaussian-cluster set once (through the sweep binary, so the files come from
//! topk-io), runs every library and writes CSV, environment and plots.

use std::path::PathBuf;
use std::process::Command;

use crate::util::{anchor_venv, cargo_target_dir, results_dir, root, run, XResult};

/// Flags of `cargo xtask hnsw-bench`; each given one is passed on to
/// `bench/hnsw/compare.py`, whose defaults apply to the others.
#[derive(clap::Args)]
pub struct HnswBenchArgs {
    /// Results folder [default: bench/results/<machine>/<date>-<commit>].
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Passes over the query set per ef; QPS is the best pass [compare.py: 3].
    #[arg(long, value_name = "N")]
    repeats: Option<u32>,
    /// Rows of the Gaussian-cluster set (generated once under target/hnsw-data).
    #[arg(long, value_name = "N", default_value_t = 100_000)]
    gauss_n: u64,
    /// Comma-separated libraries to run [compare.py: topk-hnsw,hnswlib,faiss].
    #[arg(long, value_name = "A,B")]
    libraries: Option<String>,
    /// HNSW M (links per node) [compare.py: 16].
    #[arg(long, value_name = "M")]
    m: Option<u32>,
    /// HNSW ef_construction [compare.py: 100].
    #[arg(long, value_name = "EF")]
    ef_construction: Option<u32>,
    /// Neighbours per query whose recall is measured [compare.py: 10].
    #[arg(long, value_name = "K")]
    k: Option<u32>,
    /// Seed of the builds [compare.py: 100].
    #[arg(long, value_name = "SEED")]
    seed: Option<u64>,
}

/// Runs the comparison.
pub fn hnsw_bench_cmd(args: &HnswBenchArgs) -> XResult<()> {
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
    let bin = cargo_target_dir().join("release/examples/hnsw_sweep");
    let gauss_n = args.gauss_n;
    let gauss = root().join(format!("target/hnsw-data/gauss-{gauss_n}-d128"));
    let out = args.out.clone().unwrap_or_else(results_dir);
    let mut cmd = Command::new(python);
    cmd.current_dir(root())
        .arg(root().join("bench/hnsw/compare.py"))
        .arg("--sweep-bin")
        .arg(bin)
        .arg("--minilm")
        .arg(root().join("../shared/data/minilm-docs-20k"))
        .arg("--gauss")
        .arg(gauss)
        .arg("--gauss-n")
        .arg(gauss_n.to_string())
        .arg("--out")
        .arg(out);
    let optional = [
        ("--repeats", args.repeats.map(|v| v.to_string())),
        ("--libraries", args.libraries.clone()),
        ("--m", args.m.map(|v| v.to_string())),
        (
            "--ef-construction",
            args.ef_construction.map(|v| v.to_string()),
        ),
        ("--k", args.k.map(|v| v.to_string())),
        ("--seed", args.seed.map(|v| v.to_string())),
    ];
    for (flag, value) in optional {
        if let Some(v) = value {
            cmd.arg(flag).arg(v);
        }
    }
    run(&mut cmd)
}

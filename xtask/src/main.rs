//! Project automation: `cargo xtask <command>`.
//!
//! Everything the project needs beyond `cargo build`/`cargo test` lives here
//! rather than in shell scripts, so it runs the same on every machine with Rust.
//! Each command is its own module; `main` only dispatches.

use std::process::ExitCode;

mod bench;
mod bundle;
mod cuda;
mod hnsw;
mod ptx;
mod util;

const HELP: &str = "\
cargo xtask <command>

commands:
  anchor-venv     create target/anchor-venv with the pinned numpy / faiss-cpu / hnswlib
  cuda-toolchain  install the pinned nvcc and a link-time libcuda under target/
  gpu-bundle      build gpu-bundle/: release GPU/CPU test binaries, CUDA binaries, PTX, anchors and run.sh
  ptx             compile kernels/*.cu to the committed kernels/*.ptx (`--check`: fail when stale)
  cuda-test       clippy + tests of every crate's `cuda` feature (links here; skips device cases without a GPU)
  bench           run the benchmark campaign here (`--quick`, `--cuda`, `--out DIR`), then plots + table
  plots DIR       draw the plots of a results folder into DIR/plots (PNG + SVG)
  bench-table DIR write the headline table of a results folder into README.md (`--readme FILE`)
  cpu-compare     topk CPU vs numpy / faiss-cpu on this machine into bench/results/cpu-<date>/ (`--quick`)
  hnsw-bench      topk-hnsw vs hnswlib / faiss HNSW (build, recall@10, 1-thread QPS) into bench/results/hnsw-cpu-<date>/
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some((cmd, rest)) = args.split_first() else {
        eprint!("{HELP}");
        return ExitCode::FAILURE;
    };
    let result = match cmd.as_str() {
        "anchor-venv" => util::anchor_venv().map(|p| println!("{}", p.display())),
        "cuda-toolchain" => cuda::toolchain_cmd(),
        "cuda-test" => cuda::test_cmd(rest),
        "ptx" => ptx::ptx_cmd(rest),
        "gpu-bundle" => bundle::bundle_cmd(),
        "bench" => bench::bench_cmd(rest),
        "plots" => bench::plots_cmd(rest),
        "bench-table" => bench::table_cmd(rest),
        "cpu-compare" => bench::cpu_compare_cmd(rest),
        "hnsw-bench" => hnsw::hnsw_bench_cmd(rest),
        "help" | "-h" | "--help" => {
            print!("{HELP}");
            Ok(())
        }
        other => Err(format!("unknown xtask command `{other}`\n\n{HELP}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask {cmd}: {e}");
            ExitCode::FAILURE
        }
    }
}

//! Project automation: `cargo xtask <command>`.
//!
//! Everything the project needs beyond `cargo build`/`cargo test` lives here
//! rather than in shell scripts, so it runs the same on every machine with Rust.
//! Each command is its own module; `main` parses the command line (clap) and
//! dispatches. `cargo xtask --help` and `cargo xtask <command> --help` list
//! the commands and their flags.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

mod bench;
mod bundle;
mod cuda;
mod hnsw;
mod lifecycle;
mod ptx;
mod pytest;
mod util;

/// Project automation for the topk workspace.
#[derive(Parser)]
#[command(name = "cargo xtask", bin_name = "cargo xtask")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

/// The xtask commands.
#[derive(Subcommand)]
enum Cmd {
    /// Create target/anchor-venv with the pinned numpy / faiss-cpu / hnswlib
    /// of bench/anchors/requirements.txt and print its python.
    AnchorVenv,
    /// Install the pinned nvcc (13.0 wheels) and, where no NVIDIA driver is
    /// installed, a link-time libcuda under target/; print the environment to
    /// export.
    CudaToolchain,
    /// Build gpu-bundle/: release GPU and CPU test binaries, CUDA binaries,
    /// PTX, anchors and run.sh, for a GPU machine without Rust.
    GpuBundle(bundle::BundleArgs),
    /// Compile kernels/*.cu with the pinned nvcc into the committed
    /// kernels/*.ptx.
    Ptx(PtxArgs),
    /// Clippy and tests of every crate's `cuda` feature (links here; device
    /// cases skip with a printed reason on a machine without a GPU).
    CudaTest(CudaTestArgs),
    /// Run the benchmark campaign on this machine, then its plots and table.
    Bench(bench::BenchArgs),
    /// Join a results folder with its anchors and draw its plots into
    /// DIR/plots (PNG + SVG).
    Plots(PlotsArgs),
    /// Write the headline table of a results folder into README.md between
    /// its markers.
    BenchTable(bench::TableArgs),
    /// topk's CPU backend against numpy and faiss-cpu on this machine, into
    /// bench/results/<machine>/<date>-<commit>/.
    CpuCompare(bench::CpuCompareArgs),
    /// topk-hnsw against hnswlib and faiss IndexHNSWFlat (build time,
    /// recall@10, one-thread QPS), into bench/results/<machine>/<date>-<commit>/.
    HnswBench(hnsw::HnswBenchArgs),
    /// Every test of the project: `cargo test --workspace`, then the Python
    /// package's ruff and pytest (LangChain's standard suite included) in
    /// target/py-venv, built from the pins of crates/topk-py/requirements-test.txt.
    Test(pytest::TestArgs),
    /// topk's lifecycle (filtered exact and graph search, add / remove,
    /// save / open) against faiss-cpu and hnswlib, interleaved in one run,
    /// into bench/results/<machine>/<date>-<commit>/lifecycle/.
    LifecycleBench(lifecycle::LifecycleArgs),
}

/// Flags of `cargo xtask ptx`.
#[derive(Args)]
struct PtxArgs {
    /// Compile nothing (no nvcc needed): fail when a committed .ptx is missing
    /// or older than its sources.
    #[arg(long)]
    check: bool,
}

/// Flags of `cargo xtask cuda-test`.
#[derive(Args)]
struct CudaTestArgs {
    /// Extra arguments for `cargo test` (after the package and feature flags),
    /// e.g. `-- --test-threads=1`.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    extra: Vec<String>,
}

/// Arguments of `cargo xtask plots`.
#[derive(Args)]
struct PlotsArgs {
    /// The results folder (the one holding results.jsonl).
    dir: PathBuf,
}

impl Cmd {
    /// The command's name as typed, for error messages.
    fn name(&self) -> &'static str {
        match self {
            Cmd::AnchorVenv => "anchor-venv",
            Cmd::CudaToolchain => "cuda-toolchain",
            Cmd::GpuBundle(_) => "gpu-bundle",
            Cmd::Ptx(_) => "ptx",
            Cmd::CudaTest(_) => "cuda-test",
            Cmd::Bench(_) => "bench",
            Cmd::Plots(_) => "plots",
            Cmd::BenchTable(_) => "bench-table",
            Cmd::CpuCompare(_) => "cpu-compare",
            Cmd::HnswBench(_) => "hnsw-bench",
            Cmd::Test(_) => "test",
            Cmd::LifecycleBench(_) => "lifecycle-bench",
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let name = cli.command.name();
    let result = match cli.command {
        Cmd::AnchorVenv => util::anchor_venv().map(|p| println!("{}", p.display())),
        Cmd::CudaToolchain => cuda::toolchain_cmd(),
        Cmd::CudaTest(a) => cuda::test_cmd(&a.extra),
        Cmd::Ptx(a) => ptx::ptx_cmd(a.check),
        Cmd::GpuBundle(a) => bundle::bundle_cmd(&a),
        Cmd::Bench(a) => bench::bench_cmd(&a),
        Cmd::Plots(a) => bench::plots_cmd(&a.dir),
        Cmd::BenchTable(a) => bench::table_cmd(&a),
        Cmd::CpuCompare(a) => bench::cpu_compare_cmd(&a),
        Cmd::HnswBench(a) => hnsw::hnsw_bench_cmd(&a),
        Cmd::Test(a) => pytest::test_cmd(&a),
        Cmd::LifecycleBench(a) => lifecycle::lifecycle_cmd(&a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask {name}: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn every_command_answers_help() {
        for cmd in [
            "anchor-venv",
            "cuda-toolchain",
            "gpu-bundle",
            "ptx",
            "cuda-test",
            "bench",
            "plots",
            "bench-table",
            "cpu-compare",
            "hnsw-bench",
            "test",
            "lifecycle-bench",
        ] {
            let err = Cli::try_parse_from(["cargo xtask", cmd, "--help"])
                .err()
                .map(|e| e.kind());
            assert_eq!(err, Some(clap::error::ErrorKind::DisplayHelp), "{cmd}");
        }
    }

    #[test]
    fn cuda_test_passes_extra_arguments_through() {
        let cli = Cli::try_parse_from(["x", "cuda-test", "--release", "--", "--test-threads=1"]);
        let extra = match cli.map(|c| c.command) {
            Ok(Cmd::CudaTest(a)) => a.extra,
            _ => Vec::new(),
        };
        assert_eq!(extra, ["--release", "--", "--test-threads=1"]);
    }
}

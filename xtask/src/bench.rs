//! The benchmark commands: the campaign (`bench`), its plots and README table
//! (`plots`, `bench-table`), and the CPU comparison against numpy / faiss-cpu
//! (`cpu-compare`). Each builds `topk_bench` in release and drives it; the
//! GPU bundle runs the same binary's `campaign --torch …` on the H200.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::cuda;
use crate::util::{anchor_venv, cargo_target_dir, results_dir, root, run, today, XResult};

/// Builds `topk_bench` in release (with CUDA when asked) and returns its path.
fn build_bench(with_cuda: bool) -> XResult<PathBuf> {
    let mut cmd = Command::new(cuda::cargo());
    cmd.current_dir(root()).args([
        "build",
        "--release",
        "-p",
        "topk-bench",
        "--bin",
        "topk_bench",
    ]);
    if with_cuda {
        cmd.args(["--features", "cuda"]);
        cuda::apply_link_env(&mut cmd, false)?;
    }
    run(&mut cmd)?;
    // Other builds (the GPU bundle's CUDA build) write the same path: run a
    // private copy so that a concurrent build cannot swap the binary mid-run.
    let built = cargo_target_dir().join("release/topk_bench");
    let dir = root().join("target/xtask-bench");
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let copy = dir.join(if with_cuda {
        "topk_bench-cuda"
    } else {
        "topk_bench"
    });
    std::fs::copy(&built, &copy)
        .map_err(|e| format!("{} → {}: {e}", built.display(), copy.display()))?;
    Ok(copy)
}

/// Flags of `cargo xtask bench`.
#[derive(clap::Args)]
pub struct BenchArgs {
    /// The quick grid (a few small configurations) instead of the full campaign.
    #[arg(long)]
    pub quick: bool,
    /// Build with the `cuda` feature and time the GPU paths too (default: the
    /// CPU backend only).
    #[arg(long)]
    pub cuda: bool,
    /// Results folder [default: target/bench/<cpu|cuda>-<date>[-quick]];
    /// committed results come from the GPU machine through the bundle.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
}

/// `cargo xtask bench [--quick] [--cuda] [--out DIR]`: the campaign here,
/// then its joined CSV, plots and table. Without `--out`, results go to
/// `target/bench/<cpu|cuda>-<date>[-quick]` (committed results are produced
/// on the GPU machine through the bundle).
pub fn bench_cmd(args: &BenchArgs) -> XResult<()> {
    let out = match &args.out {
        Some(o) => o.clone(),
        None => root().join(format!(
            "target/bench/{}-{}{}",
            if args.cuda { "cuda" } else { "cpu" },
            today(),
            if args.quick { "-quick" } else { "" }
        )),
    };
    let bin = build_bench(args.cuda)?;
    let mut cmd = Command::new(&bin);
    cmd.arg("campaign").arg("--out").arg(&out);
    if args.quick {
        cmd.arg("--quick");
    }
    if !args.cuda {
        cmd.args(["--backend", "cpu"]);
    }
    run(&mut cmd)?;
    run(Command::new(&bin).arg("plot").arg(&out))?;
    run(Command::new(&bin).arg("table").arg(&out))?;
    eprintln!("results, plots and data in {}", out.display());
    Ok(())
}

/// `cargo xtask plots DIR`: joins a results folder with its anchors and draws
/// its plots into `DIR/plots`.
pub fn plots_cmd(dir: &Path) -> XResult<()> {
    let bin = build_bench(false)?;
    run(Command::new(&bin).arg("plot").arg(dir))
}

/// Arguments of `cargo xtask bench-table`.
#[derive(clap::Args)]
pub struct TableArgs {
    /// The results folder whose table is written (the one holding results.jsonl).
    pub dir: PathBuf,
    /// The file whose table markers are rewritten [default: README.md at the
    /// workspace root].
    #[arg(long, value_name = "FILE")]
    pub readme: Option<PathBuf>,
}

/// `cargo xtask bench-table DIR [--readme FILE]`: writes the headline table of
/// a committed results folder into README.md between its markers.
pub fn table_cmd(args: &TableArgs) -> XResult<()> {
    let dir = &args.dir;
    let readme = args
        .readme
        .clone()
        .unwrap_or_else(|| root().join("README.md"));
    let shown = dir
        .strip_prefix(root())
        .unwrap_or(dir)
        .display()
        .to_string();
    let bin = build_bench(false)?;
    run(Command::new(&bin)
        .arg("table")
        .arg(dir)
        .arg("--readme")
        .arg(&readme)
        .arg("--source")
        .arg(shown))
}

/// Flags of `cargo xtask cpu-compare`.
#[derive(clap::Args)]
pub struct CpuCompareArgs {
    /// The quick grid, into target/bench/cpu-compare-<date>-quick (not committed).
    #[arg(long)]
    pub quick: bool,
    /// Results folder [default: bench/results/<machine>/<date>-<commit>, e.g.
    /// bench/results/cpu-2core/2026-11-30-13cdda0].
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
}

/// `cargo xtask cpu-compare [--quick] [--out DIR]`: topk's CPU backend, numpy
/// and faiss-cpu (1 and 2 threads) on the same files in one run, with this
/// machine's memory bandwidth; writes CSV, environment, table.md and plots
/// into `bench/results/<machine>/<date>-<commit>/` (or DIR).
pub fn cpu_compare_cmd(args: &CpuCompareArgs) -> XResult<()> {
    let quick = args.quick;
    let out = match &args.out {
        Some(o) => o.clone(),
        None if quick => root().join(format!("target/bench/cpu-compare-{}-quick", today())),
        None => results_dir(),
    };
    let data = root().join(if quick {
        "target/cpu-compare-data-quick"
    } else {
        "target/cpu-compare-data"
    });
    let python = anchor_venv()?;
    let bin = build_bench(false)?;
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    eprintln!("load average before the run: {}", load.trim());

    let mut ours = Command::new(&bin);
    ours.arg("cpu-compare")
        .arg("--out")
        .arg(&out)
        .arg("--data")
        .arg(&data);
    if quick {
        ours.arg("--quick");
    }
    run(&mut ours)?;

    let script = root().join("bench/anchors/cpu_anchors.py");
    let anchors = out.join("anchors");
    std::fs::create_dir_all(&anchors).map_err(|e| format!("{}: {e}", anchors.display()))?;
    // numpy is timed without OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE (they pick a
    // slower kernel for a current OpenBLAS); faiss runs in the environment as is.
    run(Command::new(&python)
        .arg(&script)
        .args(["--only", "numpy", "--data"])
        .arg(&data)
        .arg("--out")
        .arg(anchors.join("numpy.jsonl"))
        .env_remove("OPENBLAS_CORETYPE")
        .env_remove("OPENBLAS_L2_SIZE"))?;
    // faiss's wheel bundles an OpenBLAS that may not know this CPU: run it
    // with the fastest kernel it has here (cpu_anchors.py --pick-coretype).
    let picked = Command::new(&python)
        .arg(&script)
        .arg("--pick-coretype")
        .output()
        .map_err(|e| format!("{}: {e}", python.display()))?;
    if !picked.status.success() {
        return Err(format!(
            "cpu_anchors.py --pick-coretype failed ({}): {}",
            picked.status,
            String::from_utf8_lossy(&picked.stderr)
        ));
    }
    eprint!("{}", String::from_utf8_lossy(&picked.stderr));
    let coretype = String::from_utf8_lossy(&picked.stdout)
        .lines()
        .last()
        .unwrap_or("auto")
        .trim()
        .to_owned();
    let mut faiss = Command::new(&python);
    faiss
        .arg(&script)
        .args(["--only", "faiss", "--data"])
        .arg(&data)
        .arg("--out")
        .arg(anchors.join("faiss.jsonl"));
    if coretype == "auto" {
        faiss.env_remove("OPENBLAS_CORETYPE");
    } else {
        faiss.env("OPENBLAS_CORETYPE", &coretype);
    }
    run(&mut faiss)?;

    let load_end = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let notes =
        format!(
        "Measured with `cargo xtask cpu-compare` on a shared 2-core VM (other work may have run \
         at the same time; load average {} at the start, {} at the end). topk's CPU backend is \
         exact (checked bit for bit against the oracle before timing); numpy and faiss use BLAS \
         summation orders and are not. The floor is N·D·4 bytes over the host read bandwidth \
         measured in the same run. numpy runs without OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE; faiss \
         runs with 1 and 2 OpenMP threads (`faiss.omp_set_num_threads`) and OPENBLAS_CORETYPE={} \
         (the fastest for its bundled OpenBLAS here: `cpu_anchors.py --pick-coretype`, \
         \"auto\" for the library's own choice). The contenders run \
         one after another (topk, then numpy, then faiss), so a change of load between them \
         shows up as a difference between them: compare with care.",
        load.split_whitespace().take(3).collect::<Vec<_>>().join(" "),
        load_end.split_whitespace().take(3).collect::<Vec<_>>().join(" "),
        coretype,
    );
    run(Command::new(&bin)
        .arg("cpu-table")
        .arg(&out)
        .arg("--notes")
        .arg(notes))?;
    run(Command::new(&bin).arg("plot").arg(&out))?;
    eprintln!("CPU comparison in {}", out.display());
    Ok(())
}

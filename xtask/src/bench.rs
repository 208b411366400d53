//! The benchmark commands: the campaign (`bench`), its plots and README table
//! (`plots`, `bench-table`), and the CPU comparison against numpy / faiss-cpu
//! (`cpu-compare`). Each builds `topk_bench` in release and drives it; the
//! GPU bundle runs the same binary's `campaign --torch …` on the H200.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::cuda;
use crate::util::{anchor_venv, root, run, XResult};

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
    let built = root().join("target/release/topk_bench");
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

/// Today's UTC date, `YYYY-MM-DD`, for results folder names.
fn today() -> String {
    let out = Command::new("date").args(["-u", "+%Y-%m-%d"]).output();
    match out {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).trim().to_owned(),
        _ => "undated".to_owned(),
    }
}

/// Splits `--flag VALUE` and bare flags out of an argument list.
struct Flags<'a> {
    args: &'a [String],
}

impl<'a> Flags<'a> {
    fn has(&self, flag: &str) -> bool {
        self.args.iter().any(|a| a == flag)
    }
    fn value(&self, flag: &str) -> XResult<Option<&'a str>> {
        match self.args.iter().position(|a| a == flag) {
            None => Ok(None),
            Some(i) => self
                .args
                .get(i + 1)
                .map(|v| Some(v.as_str()))
                .ok_or_else(|| format!("{flag} needs a value")),
        }
    }
    fn positional(&self) -> Option<&'a str> {
        let mut skip = false;
        for a in self.args {
            if skip {
                skip = false;
                continue;
            }
            if a == "--out" || a == "--readme" {
                skip = true;
                continue;
            }
            if !a.starts_with("--") {
                return Some(a);
            }
        }
        None
    }
    fn reject_unknown(&self, known: &[&str]) -> XResult<()> {
        let mut skip = false;
        for a in self.args {
            if skip {
                skip = false;
                continue;
            }
            if a.starts_with("--") {
                if !known.contains(&a.as_str()) {
                    return Err(format!("unknown flag {a} (known: {})", known.join(" ")));
                }
                skip = a == "--out" || a == "--readme";
            }
        }
        Ok(())
    }
}

/// `cargo xtask bench [--quick] [--cuda] [--out DIR]`: the campaign here,
/// then its joined CSV, plots and table. Without `--out`, results go to
/// `target/bench/<cpu|cuda>-<date>[-quick]` (committed results are produced
/// on the GPU machine through the bundle).
pub fn bench_cmd(args: &[String]) -> XResult<()> {
    let f = Flags { args };
    f.reject_unknown(&["--quick", "--cuda", "--out"])?;
    let quick = f.has("--quick");
    let with_cuda = f.has("--cuda");
    let out = match f.value("--out")? {
        Some(o) => PathBuf::from(o),
        None => root().join(format!(
            "target/bench/{}-{}{}",
            if with_cuda { "cuda" } else { "cpu" },
            today(),
            if quick { "-quick" } else { "" }
        )),
    };
    let bin = build_bench(with_cuda)?;
    let mut cmd = Command::new(&bin);
    cmd.arg("campaign").arg("--out").arg(&out);
    if quick {
        cmd.arg("--quick");
    }
    if !with_cuda {
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
pub fn plots_cmd(args: &[String]) -> XResult<()> {
    let f = Flags { args };
    f.reject_unknown(&[])?;
    let dir = f
        .positional()
        .ok_or("usage: cargo xtask plots DIR")?
        .to_owned();
    let bin = build_bench(false)?;
    run(Command::new(&bin).arg("plot").arg(&dir))
}

/// `cargo xtask bench-table DIR [--readme FILE]`: writes the headline table of
/// a committed results folder into README.md between its markers.
pub fn table_cmd(args: &[String]) -> XResult<()> {
    let f = Flags { args };
    f.reject_unknown(&["--readme"])?;
    let dir = f
        .positional()
        .ok_or("usage: cargo xtask bench-table DIR [--readme README.md]")?;
    let readme = f
        .value("--readme")?
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("README.md"));
    let shown = Path::new(dir)
        .strip_prefix(root())
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| dir.to_owned());
    let bin = build_bench(false)?;
    run(Command::new(&bin)
        .arg("table")
        .arg(dir)
        .arg("--readme")
        .arg(&readme)
        .arg("--source")
        .arg(shown))
}

/// `cargo xtask cpu-compare [--quick] [--out DIR]`: topk's CPU backend, numpy
/// and faiss-cpu (1 and 2 threads) on the same files in one run, with this
/// machine's memory bandwidth; writes CSV, environment, table.md and plots
/// into `bench/results/cpu-<date>/` (or DIR).
pub fn cpu_compare_cmd(args: &[String]) -> XResult<()> {
    let f = Flags { args };
    f.reject_unknown(&["--quick", "--out"])?;
    let quick = f.has("--quick");
    let out = match f.value("--out")? {
        Some(o) => PathBuf::from(o),
        None if quick => root().join(format!("target/bench/cpu-compare-{}-quick", today())),
        None => root().join(format!("bench/results/cpu-{}", today())),
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
    run(Command::new(&python)
        .arg(&script)
        .args(["--only", "faiss", "--data"])
        .arg(&data)
        .arg("--out")
        .arg(anchors.join("faiss.jsonl")))?;

    let load_end = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let notes =
        format!(
        "Measured with `cargo xtask cpu-compare` on a shared 2-core VM (other work may have run \
         at the same time; load average {} at the start, {} at the end). topk's CPU backend is \
         exact (checked bit for bit against the oracle before timing); numpy and faiss use BLAS \
         summation orders and are not. The floor is N·D·4 bytes over the host read bandwidth \
         measured in the same run. numpy runs without OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE; faiss \
         runs with 1 and 2 OpenMP threads (`faiss.omp_set_num_threads`). The contenders run \
         one after another (topk, then numpy, then faiss), so a change of load between them \
         shows up as a difference between them: compare with care.",
        load.split_whitespace().take(3).collect::<Vec<_>>().join(" "),
        load_end.split_whitespace().take(3).collect::<Vec<_>>().join(" "),
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

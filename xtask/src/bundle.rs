//! `cargo xtask gpu-bundle`: builds here (no GPU needed) everything that runs
//! on a GPU machine without Rust, into the ignored folder `gpu-bundle/`:
//!
//! - release test binaries of every crate with a `cuda` feature and of
//!   topk-cpu (its SIMD paths differ on the GPU host's CPU),
//! - the binaries of those crates (`topk_bench`, `topk_demo`, …) and the
//!   `cuda_probe` example, built with CUDA,
//! - `libtopk_cuda_plugin.so`, the GPU engine that `topk_demo --backend cuda`
//!   loads from beside itself (run.sh checks it answers like `--backend cpu`),
//! - the PTX, the Python anchors and `bench/gpu/`,
//! - a generated `run.sh` that runs them all with `TOPK_REQUIRE_GPU=1` and
//!   writes logs under `$OUT` (or the folder given as `$1`).
//!
//! The binaries that embed the engine, and the plugin, link `libcuda.so.1`
//! by soname; the link-time library of this machine never enters the bundle,
//! so the GPU machine's own driver loads.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::cuda;
use crate::util::{root, XResult};

fn bundle_dir() -> PathBuf {
    root().join("gpu-bundle")
}

/// Runs a cargo command with `--message-format=json` and returns the
/// executables it reports, as (target name, kind, path).
fn cargo_executables(args: &[&str]) -> XResult<Vec<(String, String, PathBuf)>> {
    let mut cmd = Command::new(cuda::cargo());
    cmd.current_dir(root())
        .args(args)
        .arg("--message-format=json-render-diagnostics")
        .stdout(Stdio::piped());
    cuda::apply_link_env(&mut cmd, false)?;
    eprintln!("running {cmd:?}");
    let out = cmd.output().map_err(|e| format!("cargo: {e}"))?;
    if !out.status.success() {
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            if let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) {
                if let Some(text) = msg["message"]["rendered"].as_str() {
                    eprint!("{text}");
                }
            }
        }
        return Err(format!("{cmd:?} failed ({})", out.status));
    }
    let mut exes = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if msg["reason"] != "compiler-artifact" {
            continue;
        }
        let Some(exe) = msg["executable"].as_str() else {
            continue;
        };
        let target = msg["target"]["name"].as_str().unwrap_or("bin");
        let name = if msg["profile"]["test"].as_bool().unwrap_or(false) {
            format!(
                "{}-{target}",
                package_name(msg["package_id"].as_str().unwrap_or(""))
            )
        } else {
            target.to_owned()
        };
        let kind = msg["target"]["kind"][0]
            .as_str()
            .unwrap_or("bin")
            .to_owned();
        let test = msg["profile"]["test"].as_bool().unwrap_or(false);
        let kind = if test { format!("{kind}-test") } else { kind };
        exes.push((name, kind, PathBuf::from(exe)));
    }
    Ok(exes)
}

/// File name of the CUDA engine plugin (see crates/topk-cuda-loader).
const PLUGIN_FILE: &str = "libtopk_cuda_plugin.so";

/// Runs a cargo build with `--message-format=json` and returns the shared
/// library it reports.
fn cargo_cdylib(args: &[&str]) -> XResult<PathBuf> {
    let mut cmd = Command::new(cuda::cargo());
    cmd.current_dir(root())
        .args(args)
        .arg("--message-format=json-render-diagnostics")
        .stdout(Stdio::piped());
    cuda::apply_link_env(&mut cmd, false)?;
    eprintln!("running {cmd:?}");
    let out = cmd.output().map_err(|e| format!("cargo: {e}"))?;
    if !out.status.success() {
        return Err(format!("{cmd:?} failed ({})", out.status));
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|m| m["reason"] == "compiler-artifact")
        .filter_map(|m| m["filenames"].as_array().cloned())
        .flatten()
        .filter_map(|f| f.as_str().map(PathBuf::from))
        .find(|p| p.file_name().is_some_and(|n| n == PLUGIN_FILE))
        .ok_or_else(|| format!("{cmd:?} reported no {PLUGIN_FILE}"))
}

/// The package name inside a cargo package id, in either of its spellings
/// (`path+file:///…/topk-cuda#0.1.0`, `…#topk-cuda@0.1.0`, `topk-cuda 0.1.0 (…)`).
fn package_name(id: &str) -> String {
    if let Some((path, frag)) = id.rsplit_once('#') {
        match frag.split_once('@') {
            Some((name, _)) => name.to_owned(),
            None => path.rsplit('/').next().unwrap_or(path).to_owned(),
        }
    } else {
        id.split_whitespace().next().unwrap_or(id).to_owned()
    }
}

fn copy(src: &Path, dst: &Path) -> XResult<()> {
    if let Some(parent) = dst.parent() {
        std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
    }
    std::fs::copy(src, dst).map_err(|e| format!("{} -> {}: {e}", src.display(), dst.display()))?;
    Ok(())
}

fn copy_dir(src: &Path, dst: &Path) -> XResult<()> {
    let Ok(entries) = std::fs::read_dir(src) else {
        return Ok(());
    };
    for e in entries.filter_map(Result::ok) {
        let p = e.path();
        let name = e.file_name();
        if p.is_dir() {
            if name != "__pycache__" {
                copy_dir(&p, &dst.join(&name))?;
            }
        } else {
            copy(&p, &dst.join(&name))?;
        }
    }
    Ok(())
}

fn dir_size(p: &Path) -> u64 {
    std::fs::read_dir(p)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .map(|e| {
                    let p = e.path();
                    if p.is_dir() {
                        dir_size(&p)
                    } else {
                        e.metadata().map(|m| m.len()).unwrap_or(0)
                    }
                })
                .sum()
        })
        .unwrap_or(0)
}

fn as_refs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// Flags of `cargo xtask gpu-bundle`. Every binary links the engine's
/// PTX (each storage type's build), so a bundle of all of them passes the
/// 64 MiB a device call carries: these pick the binaries a call needs.
#[derive(clap::Args)]
pub struct BundleArgs {
    /// Keep only the binaries whose bundle name contains one of these
    /// (comma-separated), e.g. `topk-cuda,cuda_probe`. The plugin is always
    /// kept.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Leave out the binaries whose bundle name contains one of these
    /// (comma-separated), e.g. `test-topk-cpu,sweep`.
    #[arg(long, value_delimiter = ',')]
    skip: Vec<String>,
}

impl BundleArgs {
    /// Whether the binary named `file` in the bundle is kept.
    fn keeps(&self, file: &str) -> bool {
        (self.only.is_empty() || self.only.iter().any(|p| file.contains(p.as_str())))
            && !self.skip.iter().any(|p| file.contains(p.as_str()))
    }
}

/// Entry point.
pub fn bundle_cmd(args: &BundleArgs) -> XResult<()> {
    crate::ptx::ptx_cmd(true)?;
    let out = bundle_dir();
    if out.exists() {
        std::fs::remove_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;
    }
    let bin = out.join("bin");
    std::fs::create_dir_all(&bin).map_err(|e| format!("{}: {e}", bin.display()))?;

    let cuda_pkgs = cuda::cuda_packages();
    let mut test_args: Vec<String> = vec!["test".into(), "--no-run".into(), "--release".into()];
    let mut build_args: Vec<String> = vec!["build".into(), "--release".into()];
    let mut features = Vec::new();
    for p in &cuda_pkgs {
        test_args.extend(["-p".into(), p.clone()]);
        build_args.extend(["-p".into(), p.clone()]);
        features.push(format!("{p}/cuda"));
    }
    test_args.extend(["-p".into(), "topk-cpu".into()]);
    test_args.extend(["--features".into(), features.join(",")]);
    build_args.extend(["--features".into(), features.join(",")]);
    build_args.extend(["--bins".into(), "--examples".into()]);

    let mut names = Vec::new();
    let (mut gpu_tests, mut cpu_tests) = (Vec::new(), Vec::new());
    for (name, kind, exe) in cargo_executables(&as_refs(&test_args))?
        .into_iter()
        .chain(cargo_executables(&as_refs(&build_args))?)
    {
        // Test binaries are named after package and target: several crates
        // have a `lib` test target, and names must not collide.
        let file = if kind.ends_with("-test") {
            format!("test-{name}")
        } else {
            name.clone()
        };
        if !args.keeps(&file) {
            continue;
        }
        if kind.ends_with("-test") {
            // `name` is `<package>-<test target>`; target names have no `-`.
            let pkg = name.rsplit_once('-').map_or(name.as_str(), |(p, _)| p);
            if cuda_pkgs.iter().any(|p| p == pkg) {
                gpu_tests.push(file.clone());
            } else {
                cpu_tests.push(file.clone());
            }
        }
        let dst = bin.join(&file);
        copy(&exe, &dst)?;
        // Debug info is not needed there and would push the bundle past its size limit.
        let _ = Command::new("strip")
            .arg("--strip-debug")
            .arg(&dst)
            .status();
        names.push(file);
    }
    // The GPU engine as the plugin the binaries load at run time (they link
    // no libcuda themselves); libcuda is the GPU machine's own driver.
    let plugin = cargo_cdylib(&[
        "build",
        "--release",
        "-p",
        "topk-cuda-plugin",
        "--features",
        "topk-cuda-plugin/cuda",
    ])?;
    let dst = bin.join(PLUGIN_FILE);
    copy(&plugin, &dst)?;
    let _ = Command::new("strip")
        .arg("--strip-debug")
        .arg(&dst)
        .status();
    names.push(PLUGIN_FILE.to_owned());
    names.sort();
    names.dedup();

    for name in topk_cuda::ptx::KERNEL_NAMES {
        copy(
            &root().join(format!("kernels/{name}.ptx")),
            &out.join(format!("kernels/{name}.ptx")),
        )?;
    }
    copy_dir(&root().join("bench/anchors"), &out.join("bench/anchors"))?;
    copy_dir(&root().join("bench/gpu"), &out.join("bench/gpu"))?;

    gpu_tests.sort();
    gpu_tests.dedup();
    cpu_tests.sort();
    cpu_tests.dedup();
    let script = run_script(&gpu_tests, &cpu_tests);
    let run_sh = out.join("run.sh");
    std::fs::write(&run_sh, script).map_err(|e| format!("{}: {e}", run_sh.display()))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(&run_sh, std::fs::Permissions::from_mode(0o755));
    }
    // The binaries each embed the PTX, so they compress well: ship them as
    // one archive that run.sh unpacks first.
    let status = Command::new("tar")
        .arg("czf")
        .arg(out.join("bin.tar.gz"))
        .arg("-C")
        .arg(&out)
        .arg("bin")
        .status()
        .map_err(|e| format!("tar: {e}"))?;
    if !status.success() {
        return Err(format!("tar czf bin.tar.gz failed: {status}"));
    }
    std::fs::remove_dir_all(&bin).map_err(|e| format!("{}: {e}", bin.display()))?;
    let size = dir_size(&out);
    println!(
        "wrote {} ({:.1} MiB): {}",
        out.display(),
        size as f64 / (1 << 20) as f64,
        names.join(", ")
    );
    if size > 64 << 20 {
        return Err(format!(
            "bundle is {size} bytes, over the 64 MiB limit: pick what the call needs with \
             --only / --skip (e.g. --skip test-topk-cpu,sweep)"
        ));
    }
    Ok(())
}

/// The bundle's `run.sh`, one section per step. Logs go to at most eight files
/// under the output folder (what a device call brings back).
fn run_script(gpu_tests: &[String], cpu_tests: &[String]) -> String {
    let list = |v: &[String]| {
        v.iter()
            .map(|s| format!("\"$B/bin/{s}\""))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let sanitized = gpu_tests
        .iter()
        .find(|t| t.as_str() == "test-topk-cuda-gpu")
        .map(|t| format!("\"$B/bin/{t}\""))
        .unwrap_or_default();
    format!(
        r#"#!/usr/bin/env bash
# Generated by `cargo xtask gpu-bundle`; do not edit (edit xtask/src/bundle.rs).
# Runs the GPU tests, the sanitizers, the CPU tests and the probes on a GPU
# machine without Rust. Logs go to $1, else $OUT, else ./gpu-out.
set -u
B="$(cd "$(dirname "$0")" && pwd)"
O="${{1:-${{OUT:-$PWD/gpu-out}}}}"
# The binaries travel packed (bin.tar.gz); unpack them beside this script, or
# into a scratch copy of the bundle where this folder is read-only.
if [ ! -d "$B/bin" ]; then
  if ! tar xzf "$B/bin.tar.gz" -C "$B" 2>/dev/null; then
    T="$(mktemp -d)"
    cp -r "$B"/. "$T"/
    tar xzf "$B/bin.tar.gz" -C "$T" || {{ echo "cannot unpack $B/bin.tar.gz" >&2; exit 1; }}
    B="$T"
  fi
fi
mkdir -p "$O"
export TOPK_REQUIRE_GPU=1
export RUST_BACKTRACE=1
SUMMARY="$O/summary.txt"
: > "$SUMMARY"
step() {{ # step NAME LOG CMD...: runs CMD appending to LOG, records PASS/FAIL
  local name="$1" log="$2"; shift 2
  echo "=== $name: $*" >> "$log"
  local t0=$(date +%s)
  "$@" >> "$log" 2>&1
  local rc=$?
  local line="$( [ $rc -eq 0 ] && echo PASS || echo FAIL) $name (rc $rc, $(( $(date +%s) - t0 ))s)"
  echo "$line" | tee -a "$SUMMARY"
}}
only() {{ # only SECTION: true when $SECTIONS is unset or names SECTION
  [ -z "${{SECTIONS:-}}" ] || [[ ",$SECTIONS," == *",$1,"* ]]
}}

# ---- environment ------------------------------------------------------------
if only env; then
{{
  date -u; uname -a; nvidia-smi
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,clocks.mem --format=csv
  lscpu | head -25
  for f in "$B"/bin/*; do echo "--- ldd $f"; ldd "$f" | grep -E "cuda|not found"; done
}} > "$O/environment.txt" 2>&1
fi

# ---- GPU tests (bitwise against the oracle) -----------------------------------
if only gpu-tests; then
for t in {gpu}; do step "gpu-tests $(basename $t)" "$O/gpu-tests.log" "$t" --test-threads=2; done
fi

# ---- compute-sanitizer on the GPU tests, reduced cases --------------------------
if only sanitizer; then
for t in {sanitized}; do
  TOPK_GPU_CASES="${{SANITIZER_CASES:-4}}" step "memcheck $(basename $t)" "$O/sanitizer.log" \
    timeout 900 compute-sanitizer --tool memcheck --error-exitcode 9 "$t" --test-threads=1 \
    bitwise_equal large_k score_ids concurrent batch_shapes batch_turns filtered reused_device
  TOPK_GPU_CASES="${{SANITIZER_CASES:-4}}" step "racecheck $(basename $t)" "$O/sanitizer.log" \
    timeout 900 compute-sanitizer --tool racecheck --error-exitcode 9 "$t" --test-threads=1 \
    bitwise_equal large_k
done
fi

# ---- CPU tests on this host's CPU ---------------------------------------------
if only cpu-tests; then
for t in {cpu}; do step "cpu-tests $(basename $t)" "$O/cpu-tests.log" "$t"; done
fi

# ---- latency probe of the GPU engine (JSON lines) ------------------------------
if only probe && [ -x "$B/bin/cuda_probe" ]; then
  step "cuda_probe" "$O/probe.log" sh -c "\"$B/bin/cuda_probe\" ${{PROBE_ARGS:---quick}} > \"$O/probe.jsonl\""
fi

# ---- one topk_demo for every machine: --backend cuda (the plugin beside it) = --backend cpu
if only demo && [ -x "$B/bin/topk_demo" ]; then
  D="$(mktemp -d)"
  step "topk_demo cuda = cpu" "$O/gpu-tests.log" sh -c "\"$B/bin/topk_demo\" --backend cpu --out \"$D/cpu.jsonl\" && \"$B/bin/topk_demo\" --backend cuda --out \"$D/cuda.jsonl\" && cmp \"$D/cpu.jsonl\" \"$D/cuda.jsonl\""
fi


# ---- GPU graph search sweep (about 8 minutes): only when SECTIONS names graph-sweep
# GPU graph search, CPU HNSW and the exact engine side by side; the MiniLM set
# too when MINILM_DIR names its folder. Writes raw.jsonl, table.md, plots.
if [[ ",${{SECTIONS:-}}," == *",graph-sweep,"* ]] && [ -x "$B/bin/graph_sweep" ]; then
  mkdir -p "$O/graph-sweep"
  GS_MINILM=""
  if [ -n "${{MINILM_DIR:-}}" ] && [ -d "$MINILM_DIR" ]; then GS_MINILM="--minilm \"$MINILM_DIR\""; fi
  step "graph_sweep" "$O/graph-sweep/graph-sweep.log" sh -c "\"$B/bin/graph_sweep\" --out \"$O/graph-sweep\" $GS_MINILM ${{GRAPH_SWEEP_ARGS:-}}"
fi

# ---- benchmark campaign (filled in by bench/gpu/campaign.sh when present) -------
if only bench && [ -f "$B/bench/gpu/campaign.sh" ]; then
  step "campaign" "$O/bench.log" bash "$B/bench/gpu/campaign.sh" "$B" "$O"
fi

cat "$SUMMARY"
! grep -q '^FAIL' "$SUMMARY"
"#,
        gpu = list(gpu_tests),
        cpu = list(cpu_tests),
        sanitized = sanitized,
    )
}

#[cfg(test)]
mod pick_tests {
    use super::BundleArgs;

    #[test]
    fn only_and_skip_pick_binaries_by_name() {
        let pick = |only: &[&str], skip: &[&str]| BundleArgs {
            only: only.iter().map(|s| (*s).to_owned()).collect(),
            skip: skip.iter().map(|s| (*s).to_owned()).collect(),
        };
        let all = pick(&[], &[]);
        assert!(all.keeps("test-topk-cpu-storage") && all.keeps("cuda_probe"));
        let some = pick(&["topk-cuda", "cuda_probe"], &["bounds"]);
        assert!(some.keeps("test-topk-cuda-storage"));
        assert!(some.keeps("cuda_probe"));
        assert!(!some.keeps("test-topk-cuda-bounds"));
        assert!(!some.keeps("test-topk-index-lifecycle"));
        let skipped = pick(&[], &["test-topk-cpu", "sweep"]);
        assert!(!skipped.keeps("test-topk-cpu-storage") && !skipped.keeps("graph_sweep"));
        assert!(skipped.keeps("test-topk-cuda-gpu"));
    }
}

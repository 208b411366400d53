//! A `topk_demo` built with `--features cuda` starts on any machine: the GPU
//! engine is a plugin loaded only when `--backend cuda` asks for it, so the
//! binary itself never needs the NVIDIA driver's `libcuda.so.1`. Where the
//! driver (or the plugin) is missing, `--backend cuda` fails with a message
//! naming it; where a GPU is present, it answers like the CPU, bit for bit.
//!
//! The strictest form of these checks, on a machine known to have no driver,
//! is `.ci/cuda-starts-anywhere.sh`.

use std::path::Path;
use std::process::{Command, Output};

mod common;
use common::exe;

/// Runs the demo with nothing extra on the loader path.
fn demo(args: &[&str], plugin: Option<&Path>) -> Output {
    let mut cmd = Command::new(exe());
    cmd.args(args)
        .env("RUST_LOG", "warn")
        .env_remove("LD_LIBRARY_PATH")
        .env_remove("LD_PRELOAD");
    match plugin {
        Some(p) => cmd.env("TOPK_CUDA_PLUGIN", p),
        None => cmd.env_remove("TOPK_CUDA_PLUGIN"),
    };
    cmd.output().expect("the demo binary runs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The `error: ` line of a clean failure (status 1, no panic).
fn error_line(o: &Output) -> String {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(1), "stderr: {err}");
    assert!(!err.contains("panicked"), "{err}");
    err.lines()
        .find(|l| l.starts_with("error: "))
        .unwrap_or_else(|| panic!("no `error:` line in {err}"))
        .to_owned()
}

/// Whether the system's dynamic loader knows a `libcuda.so.1`.
#[cfg(feature = "cuda")]
fn driver_installed() -> bool {
    Command::new("ldconfig")
        .arg("-p")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("libcuda.so.1"))
        .unwrap_or(false)
}

#[cfg(feature = "cuda")]
const BUILD: &str = "cargo build --release -p topk-cuda-plugin --features cuda";

#[test]
fn cpu_backend_starts_without_libcuda_on_the_loader_path() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("cpu.jsonl");
    let o = demo(
        &["--backend", "cpu", "--out", &out.display().to_string()],
        None,
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(std::fs::metadata(&out).is_ok_and(|m| m.len() > 0));
    // Where binutils are installed, the binary must not ask for the driver.
    if let Ok(elf) = Command::new("readelf").arg("-d").arg(exe()).output() {
        let dynamic = String::from_utf8_lossy(&elf.stdout);
        assert!(!dynamic.contains("libcuda"), "{dynamic}");
    }
}

#[test]
#[cfg(not(feature = "cuda"))]
fn cuda_backend_without_the_feature_says_how_to_get_it() {
    let line = error_line(&demo(&["--backend", "cuda"], None));
    assert!(line.contains("--features cuda"), "{line}");
}

#[test]
#[cfg(feature = "cuda")]
fn cuda_backend_without_the_plugin_says_where_it_looked_and_how_to_build_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let missing = dir.path().join("libtopk_cuda_plugin.so");
    let line = error_line(&demo(&["--backend", "cuda"], Some(&missing)));
    assert!(line.contains(&missing.display().to_string()), "{line}");
    assert!(line.contains(BUILD), "{line}");
}

#[test]
#[cfg(feature = "cuda")]
fn cuda_backend_answers_like_cpu_or_names_what_is_missing() {
    let dir = tempfile::tempdir().expect("temp dir");
    let cpu = dir.path().join("cpu.jsonl");
    let gpu = dir.path().join("cuda.jsonl");
    let o = demo(
        &["--backend", "cpu", "--out", &cpu.display().to_string()],
        None,
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let o = demo(
        &["--backend", "cuda", "--out", &gpu.display().to_string()],
        None,
    );
    let required = std::env::var("TOPK_REQUIRE_GPU").as_deref() == Ok("1");
    if o.status.success() || required {
        assert!(o.status.success(), "TOPK_REQUIRE_GPU=1 but: {}", stderr(&o));
        let (a, b) = (std::fs::read(&cpu), std::fs::read(&gpu));
        assert!(
            a.as_ref().ok() == b.as_ref().ok(),
            "cuda results differ from cpu"
        );
        return;
    }
    let line = error_line(&o);
    if driver_installed() {
        // A driver without a usable GPU: the engine's own reason.
        assert!(line.to_lowercase().contains("cuda"), "{line}");
    } else if line.contains("libcuda.so.1") {
        assert!(line.contains("NVIDIA driver is not installed"), "{line}");
    } else {
        // No plugin next to the binary, or one built without CUDA.
        assert!(line.contains("libtopk_cuda_plugin.so"), "{line}");
        assert!(line.contains(BUILD), "{line}");
    }
}

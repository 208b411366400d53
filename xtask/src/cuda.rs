//! The pinned CUDA build toolchain, installed under `target/` without root
//! or a system CUDA install:
//!
//! - `nvcc` 13.0 from NVIDIA's PyPI wheels (`nvidia-cuda-nvcc`, `nvidia-nvvm`,
//!   `nvidia-cuda-crt`, `nvidia-cuda-runtime`), for generating PTX. The version
//!   is pinned because PTX of a newer ISA than the driver supports fails to load.
//! - `libcuda.so` from Debian's `libcuda1` (component non-free), only to *link*
//!   the `cust` crate on machines without the NVIDIA driver. Binaries built
//!   against it carry the soname `libcuda.so.1` and load the machine's own
//!   driver at run time; the library itself never travels in the GPU bundle.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::util::{root, run, XResult};

/// Pinned versions of the NVIDIA wheels that make up nvcc.
pub const NVCC_WHEELS: [&str; 4] = [
    "nvidia-cuda-nvcc==13.0.88",
    "nvidia-nvvm==13.0.88",
    "nvidia-cuda-crt==13.0.88",
    "nvidia-cuda-runtime==13.0.88",
];

/// Debian suite whose non-free component provides `libcuda1`.
const DEBIAN_SUITE: &str = "bookworm";

fn toolchain_dir() -> PathBuf {
    root().join("target/cuda-toolchain")
}

/// Where the wheels' `nvidia/cu13` tree lands.
fn cuda_home() -> PathBuf {
    toolchain_dir().join("py/nvidia/cu13")
}

/// Folder holding the link-time `libcuda.so` extracted from Debian's package.
fn libcuda_extracted_dir() -> PathBuf {
    toolchain_dir().join("libcuda/root/usr/lib/x86_64-linux-gnu/nvidia/current")
}

/// A CUDA-root-shaped folder (`<dir>/lib64/libcuda.so`), which is what
/// `cust`'s build script expects `CUDA_LIBRARY_PATH` to name.
fn libcuda_root() -> PathBuf {
    toolchain_dir().join("libcuda/link")
}

/// The pinned nvcc, installing it first when missing.
pub fn nvcc() -> XResult<PathBuf> {
    let nvcc = cuda_home().join("bin/nvcc");
    let stamp = toolchain_dir().join("py/.pinned");
    let wanted = NVCC_WHEELS.join("\n");
    if nvcc.is_file() && std::fs::read_to_string(&stamp).ok().as_deref() == Some(wanted.as_str()) {
        return Ok(nvcc);
    }
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".to_owned());
    eprintln!(
        "installing the pinned nvcc wheels into {}",
        toolchain_dir().display()
    );
    run(Command::new(python)
        .args([
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--upgrade",
            "--target",
        ])
        .arg(toolchain_dir().join("py"))
        .args(NVCC_WHEELS))?;
    if !nvcc.is_file() {
        return Err(format!(
            "pip installed the wheels but {} is missing",
            nvcc.display()
        ));
    }
    std::fs::write(&stamp, wanted).map_err(|e| format!("{}: {e}", stamp.display()))?;
    Ok(nvcc)
}

/// Whether the system's dynamic loader already knows a `libcuda.so.1`
/// (an NVIDIA driver is installed).
pub fn system_has_libcuda() -> bool {
    Command::new("ldconfig")
        .arg("-p")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("libcuda.so.1"))
        .unwrap_or(false)
}

/// Extracts Debian's `libcuda1` under `target/` (once) and returns the
/// CUDA-root-shaped folder whose `lib64/` holds `libcuda.so` and `libcuda.so.1`.
pub fn libcuda_stub() -> XResult<PathBuf> {
    let link_root = libcuda_root();
    let lib64 = link_root.join("lib64");
    if lib64.join("libcuda.so").exists() && lib64.join("libcuda.so.1").exists() {
        return Ok(link_root);
    }
    let dir = libcuda_extracted_dir();
    let base = toolchain_dir().join("libcuda");
    let apt = base.join("apt");
    let debs = base.join("deb");
    for d in [
        apt.join("lists/partial"),
        apt.join("cache/archives/partial"),
        debs.clone(),
    ] {
        std::fs::create_dir_all(&d).map_err(|e| format!("{}: {e}", d.display()))?;
    }
    let sources = apt.join("sources.list");
    std::fs::write(
        &sources,
        format!("deb http://deb.debian.org/debian {DEBIAN_SUITE} main contrib non-free non-free-firmware\n"),
    )
    .map_err(|e| format!("{}: {e}", sources.display()))?;
    let opts = |cmd: &mut Command| {
        cmd.arg(format!("-oDir::Etc::SourceList={}", sources.display()))
            .arg("-oDir::Etc::SourceParts=/nonexistent")
            .arg(format!(
                "-oDir::State::Lists={}",
                apt.join("lists").display()
            ))
            .arg(format!("-oDir::Cache={}", apt.join("cache").display()))
            .arg("-oAPT::Architecture=amd64")
            .arg("-oAPT::Sandbox::User=root")
            .arg("-qq");
    };
    eprintln!(
        "fetching Debian's libcuda1 (link-time only) into {}",
        base.display()
    );
    let mut update = Command::new("apt-get");
    opts(&mut update);
    run(update.arg("update"))?;
    let mut download = Command::new("apt-get");
    opts(&mut download);
    run(download.current_dir(&debs).args(["download", "libcuda1"]))?;
    let deb = std::fs::read_dir(&debs)
        .map_err(|e| format!("{}: {e}", debs.display()))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "deb"))
        .ok_or_else(|| format!("no libcuda1 .deb in {}", debs.display()))?;
    run(Command::new("dpkg")
        .arg("-x")
        .arg(&deb)
        .arg(base.join("root")))?;
    let real = std::fs::read_dir(&dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libcuda.so.") && n.len() > "libcuda.so.1".len())
        })
        .ok_or_else(|| {
            format!(
                "{} has no libcuda.so.<version> after extraction",
                dir.display()
            )
        })?;
    std::fs::create_dir_all(&lib64).map_err(|e| format!("{}: {e}", lib64.display()))?;
    for name in ["libcuda.so", "libcuda.so.1"] {
        let link = lib64.join(name);
        let _ = std::fs::remove_file(&link);
        std::fs::copy(&real, &link).map_err(|e| format!("{}: {e}", link.display()))?;
    }
    Ok(link_root)
}

/// Makes `cmd` (a cargo invocation building with `--features cuda`) link:
/// where no driver is installed, points `cust`'s build script at the extracted
/// `libcuda.so`. With `for_running`, also lets the built tests start here
/// (they then report "no CUDA device"); never use that on a machine with a GPU.
pub fn apply_link_env(cmd: &mut Command, for_running: bool) -> XResult<()> {
    if system_has_libcuda() || std::env::var_os("CUDA_LIBRARY_PATH").is_some() {
        return Ok(());
    }
    let dir = libcuda_stub()?;
    cmd.env("CUDA_LIBRARY_PATH", &dir);
    if for_running {
        let mut ld = dir.join("lib64").into_os_string();
        if let Some(old) = std::env::var_os("LD_LIBRARY_PATH") {
            ld.push(":");
            ld.push(old);
        }
        cmd.env("LD_LIBRARY_PATH", ld);
    }
    Ok(())
}

/// `cargo xtask cuda-toolchain`: installs both parts and prints the shell
/// environment that builds and runs the CUDA crates on this machine.
pub fn toolchain_cmd() -> XResult<()> {
    let nvcc = nvcc()?;
    println!("export NVCC={}", nvcc.display());
    if system_has_libcuda() {
        println!("# the system has an NVIDIA driver (libcuda.so.1); nothing else to set");
    } else {
        let dir = libcuda_stub()?;
        println!("export CUDA_LIBRARY_PATH={}", dir.display());
        println!(
            "# to run CUDA test binaries on this GPU-less machine (they report 'no CUDA device'):"
        );
        println!("# export LD_LIBRARY_PATH={}", dir.join("lib64").display());
    }
    Ok(())
}

/// `cargo xtask cuda-test [extra cargo test args]`: clippy and the tests of
/// every crate's `cuda` feature. On a machine without a GPU the device cases
/// skip with a printed reason (the no-device path is what they check).
pub fn test_cmd(extra: &[String]) -> XResult<()> {
    let packages = cuda_packages();
    let mut clippy = Command::new(cargo());
    clippy.current_dir(root()).arg("clippy");
    for p in &packages {
        clippy.args(["-p", p]);
    }
    clippy.args([
        "--features",
        "cuda",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]);
    apply_link_env(&mut clippy, false)?;
    run(&mut clippy)?;

    let mut test = Command::new(cargo());
    test.current_dir(root()).arg("test");
    for p in &packages {
        test.args(["-p", p]);
    }
    test.args(["--features", "cuda"]).args(extra);
    apply_link_env(&mut test, true)?;
    run(&mut test)
}

/// The workspace crates that have a `cuda` feature.
pub fn cuda_packages() -> Vec<String> {
    let crates = root().join("crates");
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(&crates) {
        for e in entries.filter_map(Result::ok) {
            let manifest = e.path().join("Cargo.toml");
            if has_cuda_feature(&manifest) {
                out.push(e.file_name().to_string_lossy().into_owned());
            }
        }
    }
    out.sort();
    out
}

fn has_cuda_feature(manifest: &Path) -> bool {
    std::fs::read_to_string(manifest)
        .map(|s| {
            let mut in_features = false;
            s.lines().any(|l| {
                let l = l.trim();
                if l.starts_with('[') {
                    in_features = l == "[features]";
                    false
                } else {
                    in_features && l.starts_with("cuda")
                }
            })
        })
        .unwrap_or(false)
}

/// The cargo that runs this xtask.
pub fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned())
}

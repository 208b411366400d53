//! Helpers shared by the xtask commands: the workspace root, running
//! commands with readable failures, the committed results folder of a run,
//! and the pinned Python anchor venv.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Result type of xtask commands: a message for the user.
pub type XResult<T> = Result<T, String>;

/// The workspace root (the parent of `xtask/`).
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// Today's UTC date, `YYYY-MM-DD`, for results folder names.
pub fn today() -> String {
    let out = Command::new("date").args(["-u", "+%Y-%m-%d"]).output();
    match out {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).trim().to_owned(),
        _ => "undated".to_owned(),
    }
}

/// The short commit of the workspace's `HEAD` (`unknown` outside a git checkout).
pub fn short_commit() -> String {
    let out = Command::new("git")
        .current_dir(root())
        .args(["rev-parse", "--short=7", "HEAD"])
        .output();
    match out {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).trim().to_owned(),
        _ => "unknown".to_owned(),
    }
}

/// The machine part of a CPU run's results folder: `cpu-<cores>core`.
pub fn cpu_machine() -> String {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    format!("cpu-{cores}core")
}

/// Where a run made on this CPU machine is committed:
/// `bench/results/<machine>/<date>-<commit>/` (the layout of
/// bench/results/INDEX.md). One folder per run: when that folder exists
/// already, the first free `<date>-<commit>-<n>` (n = 2, 3, …).
pub fn results_dir() -> PathBuf {
    let machine = root().join("bench/results").join(cpu_machine());
    let base = format!("{}-{}", today(), short_commit());
    let mut dir = machine.join(&base);
    let mut n = 2;
    while dir.exists() {
        dir = machine.join(format!("{base}-{n}"));
        n += 1;
    }
    dir
}

/// Where cargo puts its build outputs: `$CARGO_TARGET_DIR` when set (a
/// relative one taken from the workspace root, as cargo does), else
/// `target/` at the workspace root.
pub fn cargo_target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) if !dir.is_empty() => root().join(dir),
        _ => root().join("target"),
    }
}

/// Runs a command, failing with its command line when it cannot start or exits non-zero.
pub fn run(cmd: &mut Command) -> XResult<()> {
    let shown = format!("{cmd:?}");
    let status = cmd
        .status()
        .map_err(|e| format!("could not start {shown}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{shown} failed with {status}"))
    }
}

/// Creates (once) `target/anchor-venv` with the pinned packages of
/// `bench/anchors/requirements.txt`, and returns its python interpreter.
pub fn anchor_venv() -> XResult<PathBuf> {
    pinned_venv("anchor-venv", "bench/anchors/requirements.txt")
}

/// Creates `target/<name>` as a venv holding exactly the pins of the
/// requirements file `reqs` (relative to the workspace root), and returns
/// its python interpreter. A venv already made from the same file content is
/// reused as is; a changed file installs again over it. `$PYTHON` (default
/// `python3`) makes the venv.
pub fn pinned_venv(name: &str, reqs: &str) -> XResult<PathBuf> {
    let root = root();
    let venv = root.join("target").join(name);
    let python = venv.join("bin/python");
    let reqs = root.join(reqs);
    let stamp = venv.join(".requirements");
    let wanted = std::fs::read_to_string(&reqs).map_err(|e| format!("{}: {e}", reqs.display()))?;
    if python.exists() && std::fs::read_to_string(&stamp).ok().as_deref() == Some(wanted.as_str()) {
        return Ok(python);
    }
    let host_python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".to_owned());
    run(Command::new(&host_python).args(["-m", "venv"]).arg(&venv))?;
    run(Command::new(&python).args(["-m", "pip", "install", "-q", "--upgrade", "pip"]))?;
    run(Command::new(&python)
        .args(["-m", "pip", "install", "-q", "-r"])
        .arg(&reqs))?;
    std::fs::write(&stamp, wanted).map_err(|e| format!("{}: {e}", stamp.display()))?;
    Ok(python)
}

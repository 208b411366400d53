//! Helpers shared by the xtask commands: the workspace root, running
//! commands with readable failures, and the pinned Python anchor venv.

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
    let root = root();
    let venv = root.join("target/anchor-venv");
    let python = venv.join("bin/python");
    let reqs = root.join("bench/anchors/requirements.txt");
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

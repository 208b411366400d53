//! What the CLI tests share (each test binary uses its own part of it).
#![allow(dead_code)]

use std::ffi::OsStr;
use std::path::PathBuf;
use std::process::{Command, Output};

/// The binary under test: where cargo built it, or, in the GPU bundle (no
/// cargo there), beside this test executable.
pub fn exe() -> PathBuf {
    let built = PathBuf::from(env!("CARGO_BIN_EXE_topk_demo"));
    if built.is_file() {
        return built;
    }
    std::env::current_exe()
        .ok()
        .and_then(|t| t.parent().map(|d| d.join("topk_demo")))
        .filter(|p| p.is_file())
        .unwrap_or(built)
}

/// Runs the demo with `args` (logs at `info`) and collects its output.
pub fn demo<I, S>(args: I) -> Output
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    Command::new(exe())
        .args(args)
        .env("RUST_LOG", "info")
        .output()
        .expect("the demo binary runs")
}

/// The run's stdout as text.
pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The run's stderr as text.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Asserts a clean failure (status 1, one `error: ...` line, no panic) whose
/// message contains every one of `needles`.
pub fn fails_with(o: &Output, needles: &[&str]) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(1), "stderr: {err}");
    assert!(!err.contains("panicked"), "{err}");
    let line = err
        .lines()
        .find(|l| l.starts_with("error: "))
        .unwrap_or_else(|| panic!("no `error:` line in {err}"));
    for n in needles {
        assert!(line.contains(n), "`{n}` missing from: {line}");
    }
}

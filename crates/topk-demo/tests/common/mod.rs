//! What the CLI tests share.

use std::path::PathBuf;

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

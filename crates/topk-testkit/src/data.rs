//! The real embeddings beside the repository (`../shared/data/<name>`, see
//! its README): tests that read them call [`shared_data`], which says why
//! they skip where the data is absent, and fails instead under
//! `TOPK_REQUIRE_DATA=1`.

use std::path::PathBuf;

/// The environment variable that makes absent data a failure.
pub const REQUIRE_DATA: &str = "TOPK_REQUIRE_DATA";

/// Whether `TOPK_REQUIRE_DATA=1`.
pub fn data_required() -> bool {
    std::env::var_os(REQUIRE_DATA).is_some_and(|v| v == "1")
}

/// The folder `../shared/data/<name>` (from the repository root) where it
/// holds `corpus.npy`; else `None` after printing why the caller skips.
///
/// # Panics
/// Where the data is absent and `TOPK_REQUIRE_DATA=1`.
pub fn shared_data(name: &str) -> Option<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/data")
        .join(name);
    if dir.join("corpus.npy").is_file() {
        return Some(dir);
    }
    assert!(
        !data_required(),
        "{REQUIRE_DATA}=1 but {} holds no corpus.npy",
        dir.display()
    );
    eprintln!(
        "skipping: {} holds no corpus.npy (set {REQUIRE_DATA}=1 to fail instead)",
        dir.display()
    );
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_folder_skips_unless_required() {
        if data_required() {
            let got = std::panic::catch_unwind(|| shared_data("no-such-data-set"));
            assert!(got.is_err(), "absent data must fail under {REQUIRE_DATA}=1");
        } else {
            assert_eq!(shared_data("no-such-data-set"), None);
        }
    }
}

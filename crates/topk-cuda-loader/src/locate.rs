//! Where the plugin file is looked for.
//!
//! `TOPK_CUDA_PLUGIN`, when set, is the only place. Otherwise, relative to
//! the running executable's folder: that folder (an installed binary, the GPU
//! bundle), its parent (cargo puts test binaries in `target/<profile>/deps`
//! and the plugin in `target/<profile>`), and `../lib` (a `bin/` + `lib/`
//! install).

use std::path::{Path, PathBuf};

use crate::abi::{PLUGIN_ENV, PLUGIN_FILE};
use crate::LoadError;

/// The places to try, in order, for an explicit path (`env`) or an
/// executable at `exe`.
pub(crate) fn candidates(env: Option<PathBuf>, exe: Option<&Path>) -> Vec<PathBuf> {
    if let Some(path) = env.filter(|p| !p.as_os_str().is_empty()) {
        return vec![path];
    }
    let Some(dir) = exe.and_then(Path::parent) else {
        return Vec::new();
    };
    let mut out = vec![dir.join(PLUGIN_FILE)];
    if let Some(parent) = dir.parent() {
        out.push(parent.join(PLUGIN_FILE));
        out.push(parent.join("lib").join(PLUGIN_FILE));
    }
    out
}

/// The first candidate that is a file, or [`LoadError::NotFound`] listing
/// every place tried.
pub(crate) fn find() -> Result<PathBuf, LoadError> {
    let exe = std::env::current_exe().ok();
    let searched = candidates(
        std::env::var_os(PLUGIN_ENV).map(PathBuf::from),
        exe.as_deref(),
    );
    match searched.iter().find(|p| p.is_file()) {
        Some(found) => Ok(found.clone()),
        None => Err(LoadError::NotFound { searched }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_variable_replaces_the_search() {
        let exe = Path::new("/opt/topk/bin/topk_demo");
        assert_eq!(
            candidates(Some(PathBuf::from("/p/x.so")), Some(exe)),
            vec![PathBuf::from("/p/x.so")]
        );
        // An empty variable counts as unset.
        assert_eq!(candidates(Some(PathBuf::new()), Some(exe)).len(), 3);
    }

    #[test]
    fn beside_the_executable_then_its_parent_then_lib() {
        let exe = Path::new("/w/target/release/deps/cli-123");
        assert_eq!(
            candidates(None, Some(exe)),
            vec![
                PathBuf::from("/w/target/release/deps/libtopk_cuda_plugin.so"),
                PathBuf::from("/w/target/release/libtopk_cuda_plugin.so"),
                PathBuf::from("/w/target/release/lib/libtopk_cuda_plugin.so"),
            ]
        );
        assert!(candidates(None, None).is_empty());
        assert_eq!(candidates(None, Some(Path::new("/topk_demo"))).len(), 1);
    }
}

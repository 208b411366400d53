//! Where the demo's output goes: refusing an `--out` that would overwrite an
//! input, and printing the report to a stdout that may be closed.

use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};

use crate::error::DemoError;

/// Refuses an output path that is, or would replace, one of `inputs`: the
/// same path after resolving symlinks and `..`, or (where the output exists)
/// the same file by device and inode, which also catches hard links.
pub fn check_not_input(out: &Path, inputs: &[&Path]) -> Result<(), DemoError> {
    for input in inputs {
        if same_file(out, input) {
            return Err(DemoError::OutputIsInput {
                out: out.to_path_buf(),
                input: input.to_path_buf(),
            });
        }
    }
    Ok(())
}

/// Refuses, before any long work, an output file that cannot be written
/// whole: a folder of that name, or a folder where no file can be created
/// (read-only, full of inodes). A temporary file is made beside `out` and
/// removed again, as the final atomic write will do.
pub fn check_writable(out: &Path) -> Result<(), DemoError> {
    let unwritable = |source: std::io::Error| DemoError::OutputUnwritable {
        out: out.to_path_buf(),
        source,
    };
    if out.is_dir() {
        return Err(unwritable(std::io::Error::new(
            ErrorKind::IsADirectory,
            "it is a folder",
        )));
    }
    let (temp, file) = topk_io::create_temp_beside(out).map_err(unwritable)?;
    drop(file);
    let _ = std::fs::remove_file(temp);
    Ok(())
}

/// Whether writing `out` would replace the file `input` names.
fn same_file(out: &Path, input: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        if let (Ok(a), Ok(b)) = (std::fs::metadata(out), std::fs::metadata(input)) {
            if a.dev() == b.dev() && a.ino() == b.ino() {
                return true;
            }
        }
    }
    match (resolve(out), std::fs::canonicalize(input)) {
        (Some(a), Ok(b)) => a == b,
        _ => false,
    }
}

/// `path` with its folder resolved (symlinks, `..`): the file a write to
/// `path` would create or replace, whether or not it exists yet. A final
/// symlink is resolved too, since writing through it replaces its target.
fn resolve(path: &Path) -> Option<PathBuf> {
    if let Ok(p) = std::fs::canonicalize(path) {
        return Some(p);
    }
    let name = path.file_name()?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    Some(std::fs::canonicalize(dir).ok()?.join(name))
}

/// Writes the report to stdout. A closed pipe (`| head`) ends the report
/// silently; any other failure (`> /dev/full`) is logged on stderr. Neither
/// is an error of the run: the results are already written, and the exit
/// status stays 0.
pub fn print(report: &str) {
    let mut out = std::io::stdout().lock();
    let written = out.write_all(report.as_bytes()).and_then(|()| out.flush());
    match written {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::BrokenPipe => {}
        Err(e) => tracing::warn!("could not write the report to stdout: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_equal_to_an_input_through_dot_dot_and_links_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let corpus = dir.path().join("c.npy");
        std::fs::write(&corpus, b"x").unwrap();
        let sub = dir.path().join("sub");
        std::fs::create_dir(&sub).unwrap();
        assert!(check_not_input(&sub.join("../c.npy"), &[&corpus]).is_err());
        let hard = dir.path().join("hard.npy");
        std::fs::hard_link(&corpus, &hard).unwrap();
        assert!(check_not_input(&hard, &[&corpus]).is_err());
        #[cfg(unix)]
        {
            let soft = dir.path().join("soft.npy");
            std::os::unix::fs::symlink(&corpus, &soft).unwrap();
            assert!(check_not_input(&soft, &[&corpus]).is_err());
        }
        assert!(check_not_input(&dir.path().join("r.npy"), &[&corpus]).is_ok());
    }
}

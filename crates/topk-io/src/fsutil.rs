//! Opening inputs safely and writing outputs atomically.
//!
//! - An input path is examined (following symlinks) before it is opened, so a
//!   FIFO, a device or a directory is refused with what it is, and opening a
//!   FIFO never blocks.
//! - An output is written to a temporary file in the folder of its final name,
//!   flushed to disk (`fsync`) and renamed over the final name, so a reader
//!   sees the previous file or the complete new one, never a part. A failed
//!   write removes its temporary file and leaves the previous file untouched.

use std::fs::{self, File, Metadata, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Error, Result};

/// What a non-regular file is, for messages: `is a FIFO`, `is a directory`, ...
pub(crate) fn kind_of(meta: &Metadata) -> &'static str {
    let t = meta.file_type();
    if t.is_dir() {
        return "is a directory";
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_fifo() {
            return "is a FIFO";
        }
        if t.is_char_device() {
            return "is a character device";
        }
        if t.is_block_device() {
            return "is a block device";
        }
        if t.is_socket() {
            return "is a socket";
        }
    }
    "is not a regular file"
}

/// Opens `path` for reading after checking (through symlinks) that it is a
/// regular file; returns the file and its length.
pub(crate) fn open_regular(path: &Path) -> Result<(File, u64)> {
    let meta = fs::metadata(path).map_err(Error::io(path, "open"))?;
    if !meta.is_file() {
        return Err(Error::NotAFile {
            path: path.to_owned(),
            kind: kind_of(&meta),
        });
    }
    let file = File::open(path).map_err(Error::io(path, "open"))?;
    // The path may have been replaced between the two calls.
    let meta = file.metadata().map_err(Error::io(path, "stat"))?;
    if !meta.is_file() {
        return Err(Error::NotAFile {
            path: path.to_owned(),
            kind: kind_of(&meta),
        });
    }
    Ok((file, meta.len()))
}

/// Refuses an output path that exists and is not a regular file (through
/// symlinks): renaming over a directory or a device would fail only at the end.
pub(crate) fn check_output(path: &Path) -> Result<()> {
    match fs::metadata(path) {
        Ok(meta) if !meta.is_file() => Err(Error::NotAFile {
            path: path.to_owned(),
            kind: kind_of(&meta),
        }),
        _ => Ok(()),
    }
}

/// Distinguishes the temporary files of one process.
static NEXT: AtomicU64 = AtomicU64::new(0);

/// A file being written under a temporary name beside `target`; [`commit`]
/// puts it in place, dropping it uncommitted removes it.
///
/// [`commit`]: AtomicFile::commit
#[derive(Debug)]
pub(crate) struct AtomicFile {
    target: PathBuf,
    temp: PathBuf,
    out: BufWriter<File>,
}

impl AtomicFile {
    /// Creates the temporary file (in the target's folder, so that the final
    /// rename stays on one file system). Errors name the final path.
    pub(crate) fn create(target: &Path) -> Result<AtomicFile> {
        check_output(target)?;
        let dir = match target.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let name = target.file_name().ok_or_else(|| Error::Unwritable {
            path: target.to_owned(),
            reason: "the path names no file".to_owned(),
        })?;
        let mut temp_name = std::ffi::OsString::from(".");
        temp_name.push(name);
        temp_name.push(format!(
            ".{}.{}.tmp",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let temp = dir.join(temp_name);
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&temp)
            .map_err(Error::io(target, "create"))?;
        Ok(AtomicFile {
            target: target.to_owned(),
            temp,
            out: BufWriter::new(file),
        })
    }

    /// The writer of the temporary file.
    pub(crate) fn writer(&mut self) -> &mut BufWriter<File> {
        &mut self.out
    }

    /// Flushes the buffer and the file's data to disk.
    pub(crate) fn sync(&mut self) -> Result<()> {
        self.out.flush().map_err(Error::io(&self.target, "write"))?;
        self.out
            .get_ref()
            .sync_all()
            .map_err(Error::io(&self.target, "write"))
    }

    /// Renames the synced temporary file over the target.
    fn rename(&mut self) -> Result<()> {
        fs::rename(&self.temp, &self.target).map_err(Error::io(&self.target, "rename onto"))?;
        // Nothing left to remove on drop.
        self.temp = PathBuf::new();
        Ok(())
    }

    /// Syncs and renames: the target now holds exactly what was written.
    pub(crate) fn commit(mut self) -> Result<()> {
        self.sync()?;
        self.rename()
    }
}

/// Commits several files together: every one is synced before any is
/// renamed, so a failed write leaves every target as it was. The renames
/// happen in the order given (put the file readers look for first last).
pub(crate) fn commit_all(mut files: Vec<AtomicFile>) -> Result<()> {
    for f in &mut files {
        f.sync()?;
    }
    for f in &mut files {
        f.rename()?;
    }
    Ok(())
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        if !self.temp.as_os_str().is_empty() {
            // Best effort: the temporary file is ours and unused.
            let _ = fs::remove_file(&self.temp);
        }
    }
}

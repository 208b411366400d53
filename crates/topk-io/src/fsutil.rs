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
use std::io::{self, BufWriter, Write};
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
    match open_checked(path) {
        Ok(Opened::File(file, len)) => Ok((file, len)),
        Ok(Opened::NotAFile(kind)) => Err(Error::NotAFile {
            path: path.to_owned(),
            kind,
        }),
        Err((op, e)) => Err(Error::io(path, op)(e)),
    }
}

/// What [`open_checked`] found at a path.
enum Opened {
    /// A regular file, open for reading, and its length.
    File(File, u64),
    /// Something else: what it is, for messages.
    NotAFile(&'static str),
}

/// Opens `path` for reading if it is a regular file (through symlinks); the
/// error is the failed operation and the system's reason.
fn open_checked(path: &Path) -> std::result::Result<Opened, (&'static str, io::Error)> {
    let meta = fs::metadata(path).map_err(|e| ("open", e))?;
    if !meta.is_file() {
        return Ok(Opened::NotAFile(kind_of(&meta)));
    }
    let file = File::open(path).map_err(|e| ("open", e))?;
    // The path may have been replaced between the two calls.
    let meta = file.metadata().map_err(|e| ("stat", e))?;
    if !meta.is_file() {
        return Ok(Opened::NotAFile(kind_of(&meta)));
    }
    Ok(Opened::File(file, meta.len()))
}

/// Opens `path` for reading as [`crate::read_matrix`] does its inputs: a
/// FIFO, a device or a directory is refused with what it is
/// (`ErrorKind::InvalidInput`, "is a FIFO, not a regular file"), and opening
/// a FIFO never blocks. Returns the file and its length. For readers of other
/// formats (index files) whose errors carry an `std::io::Error`.
pub fn open_regular_file(path: &Path) -> io::Result<(File, u64)> {
    match open_checked(path) {
        Ok(Opened::File(file, len)) => Ok((file, len)),
        Ok(Opened::NotAFile(kind)) => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{kind}, not a regular file"),
        )),
        Err((_, e)) => Err(e),
    }
}

/// Creates a new, empty file beside `target` for writing `target` atomically:
/// in the same folder (the final rename stays on one file system), named
/// `.NAME.PID.N.tmp` with `N` unique in the process, and created exclusively,
/// so two writers of one target never share a temporary file and a planted
/// file or symlink of that name is never written through. Long names are
/// shortened so that the temporary name stays within 255 bytes.
pub fn create_temp_beside(target: &Path) -> io::Result<(PathBuf, File)> {
    let name = target
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "the path names no file"))?;
    let dir = match target.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = name.to_string_lossy();
    // 200 bytes of the name leave room for the pid, the counter and dots.
    let mut cut = name.len().min(200);
    while !name.is_char_boundary(cut) {
        cut -= 1;
    }
    let temp = dir.join(format!(
        ".{}.{}.{}.tmp",
        &name[..cut],
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&temp)?;
    Ok((temp, file))
}

/// Writes `bytes` to `path` whole or not at all: a temporary file beside it
/// ([`create_temp_beside`]), synced, renamed over `path`, then the folder
/// synced. On failure the temporary file is removed and any previous file
/// at `path` is left as it was.
pub fn write_whole(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let (tmp, mut file) = create_temp_beside(path)?;
    let written = file
        .write_all(bytes)
        .and_then(|()| file.sync_all())
        .and_then(|()| fs::rename(&tmp, path));
    drop(file);
    if let Err(e) = written {
        // Best effort: the write's error is the one to report.
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    sync_folder_of(path);
    Ok(())
}

/// Syncs the folder holding `path` after a rename into it, so that the
/// rename survives a crash. A folder that cannot be synced (some file
/// systems refuse) still holds the complete file, so the failure is only
/// logged.
pub fn sync_folder_of(path: &Path) {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    if let Err(e) = File::open(dir).and_then(|d| d.sync_all()) {
        tracing::warn!(folder = %dir.display(), error = %e, "could not sync the folder after a rename");
    }
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
        if target.file_name().is_none() {
            return Err(Error::Unwritable {
                path: target.to_owned(),
                reason: "the path names no file".to_owned(),
            });
        }
        let (temp, file) = create_temp_beside(target).map_err(Error::io(target, "create"))?;
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
        self.rename()?;
        sync_folder_of(&self.target);
        Ok(())
    }

    /// A hard link to the file now at the target, under a fresh temporary
    /// name, so that a later failure can put it back; `None` where there is
    /// no such file or the file system cannot link it.
    fn link_previous(&self) -> Option<PathBuf> {
        let (name, file) = create_temp_beside(&self.target).ok()?;
        drop(file);
        // `hard_link` needs a free name: the placeholder only reserved it.
        let linked = fs::remove_file(&name).and_then(|()| fs::hard_link(&self.target, &name));
        linked.ok().map(|()| name)
    }
}

/// Commits several files together: every one is synced before any is
/// renamed, so a failed write leaves every target as it was. The renames
/// happen in the order given (put the file readers look for first last);
/// when one fails, the targets already renamed get their previous files back
/// (or are removed where there was none), so the set is replaced whole or
/// not at all.
pub(crate) fn commit_all(mut files: Vec<AtomicFile>) -> Result<()> {
    for f in &mut files {
        f.sync()?;
    }
    let previous: Vec<Option<PathBuf>> = files.iter().map(AtomicFile::link_previous).collect();
    let mut failure = None;
    for (i, f) in files.iter_mut().enumerate() {
        if let Err(e) = f.rename() {
            failure = Some((i, e));
            break;
        }
    }
    if let Some((failed, e)) = failure {
        for (f, old) in files[..failed].iter().zip(&previous) {
            // Best effort: the error reported is the rename that failed.
            let _ = match old {
                Some(old) => fs::rename(old, &f.target),
                None => fs::remove_file(&f.target),
            };
        }
        for old in previous[failed..].iter().flatten() {
            let _ = fs::remove_file(old);
        }
        return Err(e);
    }
    for old in previous.iter().flatten() {
        let _ = fs::remove_file(old);
    }
    if let Some(f) = files.first() {
        sync_folder_of(&f.target);
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

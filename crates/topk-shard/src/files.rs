//! A set on disk: [`ShardedIndex::save`] and [`ShardedIndex::open`] over a
//! folder of one index file per shard and `manifest.json`
//! (docs/CONTRACTS.md §12, "Files").

use std::path::Path;

use rayon::prelude::*;
use topk_index::Index;

use crate::error::ShardError;
use crate::manifest::{Manifest, ShardEntry};
use crate::sharded::{at_shard, check_shard, same_storage, ShardSpec, ShardedIndex};

/// The file in a set's folder that a save holds locked (an advisory lock
/// of the operating system, released when the save ends or its process
/// dies); it stays, empty.
pub const SAVE_LOCK: &str = ".topk-save.lock";

/// The save lock of a set's folder, held: one save of a folder at a time,
/// in this process or another (a second writer's cleanup would delete the
/// first one's files). Every writer of a set takes it, the Python `topk.ray`
/// sets included; it is released when dropped or when its process dies.
#[derive(Debug)]
pub struct SaveLock {
    _file: std::fs::File,
}

impl SaveLock {
    /// Waits for and takes the save lock of the folder `dir` (which must
    /// exist), creating its [`SAVE_LOCK`] file if missing.
    pub fn acquire(dir: &Path) -> Result<Self, ShardError> {
        let path = dir.join(SAVE_LOCK);
        std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .and_then(|f| f.lock().map(|()| f))
            .map(|file| Self { _file: file })
            .map_err(|source| ShardError::Io {
                path,
                op: "lock the folder for a save",
                source,
            })
    }
}

impl ShardedIndex {
    /// Saves the set into the folder `dir` (created if missing): one index
    /// file per shard, then `manifest.json` naming them, replaced atomically,
    /// then the older generations' files deleted. A failure at any point
    /// leaves the previously saved set whole.
    pub fn save(&self, dir: impl AsRef<Path>) -> Result<(), ShardError> {
        let dir = dir.as_ref();
        std::fs::create_dir_all(dir).map_err(|source| ShardError::Io {
            path: dir.to_owned(),
            op: "create the folder",
            source,
        })?;
        let lock = SaveLock::acquire(dir)?;
        let generation = next_generation(dir)?;
        let entries: Vec<ShardEntry> = self
            .shards
            .iter()
            .enumerate()
            .map(|(i, shard)| ShardEntry {
                file: Manifest::shard_file_name(generation, i),
                rows: shard.len(),
                backend: shard.backend().as_str().to_owned(),
            })
            .collect();
        let saved = self
            .shards
            .par_iter()
            .zip(&entries)
            .enumerate()
            .try_for_each(|(i, (shard, entry))| {
                shard
                    .save(dir.join(&entry.file))
                    .map_err(|source| at_shard(i, source))
            });
        let manifest = Manifest::new(self.dim, self.metric, generation, entries);
        let written = saved.and_then(|()| manifest.write(dir));
        let synced = match written {
            Ok(synced) => synced,
            Err(e) => {
                // The files of this generation name no manifest: they go
                // (a full disk gets its room back for the next try).
                for entry in &manifest.shards {
                    let _ = std::fs::remove_file(dir.join(&entry.file));
                }
                return Err(e);
            }
        };
        let stale = if synced {
            manifest.remove_stale(dir)?
        } else {
            0
        };
        drop(lock);
        tracing::debug!(dir = %dir.display(), generation, stale, "sharded index saved");
        Ok(())
    }

    /// Opens the set saved in `dir`, shard `i` built by `spec(i)` (any
    /// backend: the files hold rows, not a backend). Every shard's dimension,
    /// metric, row count and placement are checked against the manifest.
    pub fn open(
        dir: impl AsRef<Path>,
        spec: impl Fn(usize) -> ShardSpec + Sync,
    ) -> Result<Self, ShardError> {
        let dir = dir.as_ref();
        let manifest = Manifest::read(dir)?;
        let metric = manifest.metric()?;
        let n = manifest.shards.len();
        let shards = manifest
            .shards
            .par_iter()
            .enumerate()
            .map(|(i, entry)| {
                let s = spec(i);
                let index = Index::open_with_options(dir.join(&entry.file), s.backend, &s.options)
                    .map_err(|source| at_shard(i, source))?;
                check_shard(i, &index, manifest.dim, metric, n)?;
                if index.len() != entry.rows {
                    return Err(ShardError::Manifest {
                        path: Manifest::path_in(dir),
                        reason: format!(
                            "shard {i} ({}) holds {} rows, the manifest says {}",
                            entry.file,
                            index.len(),
                            entry.rows
                        ),
                    });
                }
                Ok(index)
            })
            .collect::<Result<Vec<_>, _>>()?;
        same_storage(&shards)?;
        Ok(ShardedIndex {
            dim: manifest.dim,
            metric,
            shards,
        })
    }
}

/// The generation the next save into the folder `dir` writes: one past the
/// larger of its manifest's and of every shard file's there, so a save
/// never reuses the name of a file a failed or concurrent save left.
pub fn next_generation(dir: &Path) -> Result<u64, ShardError> {
    let from_manifest = Manifest::read(dir).map(|m| m.generation).unwrap_or(0);
    let from_files = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let rest = name.strip_prefix("shard-")?.strip_suffix(".topkidx")?;
            rest.split_once(".g")?.1.parse::<u64>().ok()
        })
        .max()
        .unwrap_or(0);
    from_manifest
        .max(from_files)
        .checked_add(1)
        .ok_or_else(|| ShardError::Manifest {
            path: Manifest::path_in(dir),
            reason: format!(
                "generation {} is the largest there is: no save can follow it",
                u64::MAX
            ),
        })
}

//! The manifest of a saved set of shards (docs/CONTRACTS.md §12): one JSON
//! file, `manifest.json`, naming the shard files of one generation.
//!
//! A save writes every shard to a file of a new generation, then replaces
//! the manifest atomically (temporary file, fsync, rename, fsync of the
//! folder), then deletes the files of older generations. A crash at any
//! point leaves the previous manifest and every file it names intact: a set
//! on disk is always whole, the old one or the new one.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::ShardError;
use crate::placement::PLACEMENT;

/// The manifest's file name inside a set's folder.
pub const MANIFEST_FILE: &str = "manifest.json";
/// The `format` field of every manifest.
pub const FORMAT: &str = "topk-shards";
/// The manifest version this crate writes and reads.
pub const MANIFEST_VERSION: u32 = 1;

/// One shard of a saved set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardEntry {
    /// The shard's index file, a plain name inside the set's folder.
    pub file: String,
    /// Its live rows when saved (checked when the set is opened).
    pub rows: usize,
    /// The backend it was saved from (`cpu`, `oracle`, `cuda`, `hnsw`);
    /// informative: a set can be opened on any backend.
    pub backend: String,
}

/// What a set's folder holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// Always [`FORMAT`].
    pub format: String,
    /// Always [`MANIFEST_VERSION`].
    pub version: u32,
    /// The placement rule, always [`PLACEMENT`].
    pub placement: String,
    /// Vector dimension of every shard.
    pub dim: usize,
    /// Metric of every shard (`dot`, `cosine`, `l2`).
    pub metric: String,
    /// Increases by one at every save; names the shard files.
    pub generation: u64,
    /// The shards, in placement order: shard `i` holds the ids `shard_of(id, n) == i`.
    pub shards: Vec<ShardEntry>,
}

impl Manifest {
    /// A manifest of `shards` for generation `generation`.
    pub fn new(
        dim: usize,
        metric: topk_core::Metric,
        generation: u64,
        shards: Vec<ShardEntry>,
    ) -> Self {
        Manifest {
            format: FORMAT.to_owned(),
            version: MANIFEST_VERSION,
            placement: PLACEMENT.to_owned(),
            dim,
            metric: metric.as_str().to_owned(),
            generation,
            shards,
        }
    }

    /// The file name of shard `shard` in generation `generation`.
    pub fn shard_file_name(generation: u64, shard: usize) -> String {
        format!("shard-{shard:04}.g{generation}.topkidx")
    }

    /// The manifest's path inside `dir`.
    pub fn path_in(dir: &Path) -> PathBuf {
        dir.join(MANIFEST_FILE)
    }

    /// The metric, parsed.
    pub fn metric(&self) -> Result<topk_core::Metric, ShardError> {
        self.metric.parse().map_err(|_| ShardError::Manifest {
            path: PathBuf::from(MANIFEST_FILE),
            reason: format!("unknown metric {:?}", self.metric),
        })
    }

    /// Reads and checks the manifest of the set in `dir`.
    pub fn read(dir: &Path) -> Result<Manifest, ShardError> {
        let path = Manifest::path_in(dir);
        let bytes = fs::read(&path).map_err(|source| ShardError::Io {
            path: path.clone(),
            op: "read",
            source,
        })?;
        let bad = |reason: String| ShardError::Manifest {
            path: path.clone(),
            reason,
        };
        let m: Manifest =
            serde_json::from_slice(&bytes).map_err(|e| bad(format!("not a manifest: {e}")))?;
        if m.format != FORMAT {
            return Err(bad(format!(
                "format is {:?}, expected {FORMAT:?}",
                m.format
            )));
        }
        if m.version != MANIFEST_VERSION {
            return Err(bad(format!(
                "version {} is not supported (this build reads {MANIFEST_VERSION})",
                m.version
            )));
        }
        if m.placement != PLACEMENT {
            return Err(bad(format!(
                "placement rule {:?} is not this build's {PLACEMENT:?}",
                m.placement
            )));
        }
        if m.shards.is_empty() {
            return Err(bad("names no shard".to_owned()));
        }
        if m.dim == 0 {
            return Err(bad("dimension 0".to_owned()));
        }
        m.metric()
            .map_err(|_| bad(format!("unknown metric {:?}", m.metric)))?;
        for (i, s) in m.shards.iter().enumerate() {
            let plain = Path::new(&s.file)
                .file_name()
                .is_some_and(|n| n == s.file.as_str());
            if !plain || s.file.starts_with('.') {
                return Err(bad(format!(
                    "shard {i}'s file {:?} is not a plain file name inside the folder",
                    s.file
                )));
            }
        }
        Ok(m)
    }

    /// Writes the manifest into `dir` atomically: the old manifest stays
    /// until the new one is complete and on disk. Returns whether the folder
    /// could be synced after the rename (some file systems refuse; until it
    /// is, a crash may bring the old manifest back, so the files it names
    /// must stay).
    pub fn write(&self, dir: &Path) -> Result<bool, ShardError> {
        let path = Manifest::path_in(dir);
        let io = |op: &'static str, p: &Path| {
            let p = p.to_owned();
            move |source| ShardError::Io {
                path: p,
                op,
                source,
            }
        };
        let mut text = serde_json::to_vec_pretty(self).map_err(|e| ShardError::Manifest {
            path: path.clone(),
            reason: format!("could not encode: {e}"),
        })?;
        text.push(b'\n');
        // A fresh temporary name, created exclusively: two writers never
        // share it, and a planted file or symlink is never written through.
        let (tmp, mut f) = topk_io::create_temp_beside(&path).map_err(io("create", &path))?;
        let written = (|| {
            f.write_all(&text).map_err(io("write", &tmp))?;
            f.sync_all().map_err(io("sync", &tmp))?;
            fs::rename(&tmp, &path).map_err(io("rename the temporary manifest over", &path))
        })();
        drop(f);
        if let Err(e) = written {
            let _ = fs::remove_file(&tmp);
            return Err(e);
        }
        if let Err(e) = File::open(dir).and_then(|d| d.sync_all()) {
            tracing::warn!(folder = %dir.display(), error = %e, "could not sync the folder after writing the manifest; the older shard files stay");
            return Ok(false);
        }
        Ok(true)
    }

    /// Deletes the shard files in `dir` that this manifest does not name
    /// (older generations, or a save that failed half way). Returns how many.
    pub fn remove_stale(&self, dir: &Path) -> Result<usize, ShardError> {
        let entries = fs::read_dir(dir).map_err(|source| ShardError::Io {
            path: dir.to_owned(),
            op: "list",
            source,
        })?;
        let mut removed = 0;
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            let ours = name.starts_with("shard-") && name.ends_with(".topkidx");
            if ours && !self.shards.iter().any(|s| s.file == name) {
                match fs::remove_file(entry.path()) {
                    Ok(()) => removed += 1,
                    Err(e) => {
                        tracing::warn!(file = %entry.path().display(), error = %e, "could not delete a stale shard file")
                    }
                }
            }
        }
        Ok(removed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use topk_core::Metric;

    fn sample(generation: u64) -> Manifest {
        let shards = (0..3)
            .map(|i| ShardEntry {
                file: Manifest::shard_file_name(generation, i),
                rows: i * 10,
                backend: "cpu".to_owned(),
            })
            .collect();
        Manifest::new(8, Metric::Cosine, generation, shards)
    }

    #[test]
    fn round_trips_and_replaces_atomically() -> Result<(), ShardError> {
        let dir = tempfile::tempdir().map_err(|source| ShardError::Io {
            path: PathBuf::from("tempdir"),
            op: "create",
            source,
        })?;
        sample(1).write(dir.path())?;
        assert_eq!(Manifest::read(dir.path())?, sample(1));
        for g in [1, 2] {
            for e in &sample(g).shards {
                fs::write(dir.path().join(&e.file), b"x").map_err(|source| ShardError::Io {
                    path: dir.path().join(&e.file),
                    op: "write",
                    source,
                })?;
            }
        }
        sample(2).write(dir.path())?;
        assert_eq!(Manifest::read(dir.path())?.generation, 2);
        assert_eq!(sample(2).remove_stale(dir.path())?, 3);
        assert!(!dir.path().join(format!(".{MANIFEST_FILE}.tmp")).exists());
        Ok(())
    }

    #[test]
    fn bad_manifests_are_named() {
        let dir = tempfile::tempdir().expect("a temporary folder");
        let p = Manifest::path_in(dir.path());
        let cases: Vec<(String, &str)> = vec![
            ("{".to_owned(), "not a manifest"),
            (r#"{"format":"x"}"#.to_owned(), "not a manifest"),
            (
                serde_json::to_string(&Manifest {
                    version: 9,
                    ..sample(1)
                })
                .expect("json"),
                "version 9",
            ),
            (
                serde_json::to_string(&Manifest {
                    placement: "mod".into(),
                    ..sample(1)
                })
                .expect("json"),
                "placement rule",
            ),
            (
                serde_json::to_string(&Manifest {
                    shards: vec![],
                    ..sample(1)
                })
                .expect("json"),
                "names no shard",
            ),
            (
                serde_json::to_string(&Manifest {
                    metric: "hamming".into(),
                    ..sample(1)
                })
                .expect("json"),
                "unknown metric",
            ),
            (
                serde_json::to_string(&Manifest {
                    shards: vec![ShardEntry {
                        file: "../etc/passwd".into(),
                        rows: 0,
                        backend: "cpu".into(),
                    }],
                    ..sample(1)
                })
                .expect("json"),
                "plain file name",
            ),
        ];
        for (text, expect) in cases {
            fs::write(&p, &text).expect("write the test manifest");
            let err = Manifest::read(dir.path()).expect_err(&text).to_string();
            assert!(err.contains(expect), "{text}: {err}");
        }
        fs::remove_file(&p).expect("remove");
        assert!(matches!(
            Manifest::read(dir.path()),
            Err(ShardError::Io { .. })
        ));
    }
}

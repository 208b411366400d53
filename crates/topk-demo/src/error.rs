//! The demo's error type: what went wrong, and with which input.

/// Everything `topk_demo` reports before exiting with status 1.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    /// A file could not be read or written.
    #[error(transparent)]
    File(#[from] topk_io::Error),
    /// `--out` names a file in a folder that does not exist.
    #[error("output folder {} of --out {} does not exist", .dir.display(), .out.display())]
    OutputFolder {
        /// The missing folder.
        dir: std::path::PathBuf,
        /// The `--out` path as given.
        out: std::path::PathBuf,
    },
    /// `--out` cannot be written (a folder of that name, a read-only folder).
    #[error("--out {} cannot be written: {source}", .out.display())]
    OutputUnwritable {
        /// The `--out` path as given.
        out: std::path::PathBuf,
        /// What creating a file there said.
        #[source]
        source: std::io::Error,
    },
    /// `--out` (or its `.scores.npy` sibling) is one of the input files.
    #[error(
        "--out {} would overwrite the input {}; choose another output name",
        .out.display(),
        .input.display()
    )]
    OutputIsInput {
        /// The output file (the `--out` path or its scores sibling).
        out: std::path::PathBuf,
        /// The input it resolves to.
        input: std::path::PathBuf,
    },
    /// A flag of the search story given with an `index` command.
    #[error("{flag} is a flag of the search story (no command); `topk_demo index {command}` does not take it")]
    FlagWithCommand {
        /// The flag as typed.
        flag: String,
        /// The index command.
        command: String,
    },
    /// An HNSW-only flag given with another backend.
    #[error("{flag} only applies to --backend hnsw (the backend is {backend})")]
    HnswOnlyFlag {
        /// The flag as typed (`--m`, `--ef-construction`, `--ef`).
        flag: &'static str,
        /// The backend asked for.
        backend: String,
    },
    /// `--recall-sample` given with another backend than HNSW.
    #[error(
        "--recall-sample only applies to --backend hnsw (the backend is {backend}, which is exact)"
    )]
    RecallNeedsHnsw {
        /// The backend asked for.
        backend: String,
    },
    /// `--recall-sample 0`.
    #[error("--recall-sample 0 measures nothing: give at least one query")]
    RecallSampleZero,
    /// An index command failed: a bad id, row or file (docs/CONTRACTS.md §10).
    #[error(transparent)]
    Index(#[from] topk::IndexError),
    /// An id file's rows do not match the rows they name.
    #[error("{ids} has {got} ids for the {rows} rows of {what}: give one id per row")]
    IdCount {
        /// The id file.
        ids: String,
        /// Ids in it.
        got: usize,
        /// Rows they should name.
        rows: usize,
        /// The row file.
        what: String,
    },
    /// Memory for the synthetic rows could not be allocated.
    #[error("cannot allocate {bytes} bytes for the synthetic {what} (--n/--nq x --d values)")]
    OutOfMemory {
        /// `corpus` or `queries`.
        what: &'static str,
        /// The allocation that failed.
        bytes: u64,
    },
    /// The corpus broke an input rule (non-finite value, no rows, D = 0).
    #[error("corpus {origin}: {source}")]
    Corpus {
        /// The file, or the synthetic story's description.
        origin: String,
        /// The rule broken.
        #[source]
        source: topk_core::Error,
    },
    /// The queries broke an input rule.
    #[error("queries {origin}: {source}")]
    Queries {
        /// The file, or the synthetic story's description.
        origin: String,
        /// The rule broken.
        #[source]
        source: topk_core::Error,
    },
    /// The backend failed while searching valid queries.
    #[error("search on the {backend} backend failed: {source}")]
    Search {
        /// The backend's name.
        backend: &'static str,
        /// Its error.
        #[source]
        source: topk_core::Error,
    },
    /// Corpus and queries have different row lengths.
    #[error("the queries {queries} have D = {queries_dim}, but the corpus {corpus} has D = {corpus_dim}")]
    DimensionMismatch {
        /// Query origin.
        queries: String,
        /// Values per query.
        queries_dim: usize,
        /// Corpus origin.
        corpus: String,
        /// Values per corpus row.
        corpus_dim: usize,
    },
    /// A search parameter out of range (K = 0).
    #[error(transparent)]
    Parameter(topk_core::Error),
    /// The synthetic corpus or query set asked for cannot be allocated.
    #[error("a synthetic {what} of {flag} {rows} rows x --d {d} values does not fit in memory addresses")]
    SyntheticTooLarge {
        /// "corpus" or "query set".
        what: &'static str,
        /// The flag that asked for the rows: `--n` or `--nq`.
        flag: &'static str,
        /// Rows asked for.
        rows: usize,
        /// Values per row asked for.
        d: usize,
    },
    /// The backend cannot run on this machine (found before any input is read).
    #[error("{backend} backend: {source}")]
    Unavailable {
        /// The backend asked for.
        backend: topk::Backend,
        /// Why it cannot run here.
        #[source]
        source: topk::Unavailable,
    },
    /// The backend could not be built: bad `--m`/`--ef-construction`/`--ef`,
    /// no `cuda` feature in this build, no driver or device, or not enough
    /// device memory for the corpus.
    #[error("{backend} backend over {origin}: {source}")]
    Backend {
        /// The backend asked for.
        backend: topk::Backend,
        /// Where the corpus came from.
        origin: String,
        /// Why it could not be built.
        #[source]
        source: topk::Error,
    },
}

impl DemoError {
    /// The error of opening `backend` over the corpus from `origin`: a broken
    /// input rule names the corpus, anything else the backend.
    pub fn open(backend: topk::Backend, origin: &str, source: topk::Error) -> Self {
        match source {
            topk::Error::Core(source) => DemoError::Corpus {
                origin: origin.to_owned(),
                source,
            },
            source => DemoError::Backend {
                backend,
                origin: origin.to_owned(),
                source,
            },
        }
    }
}

/// The message of `e` followed by those of its sources, skipping a source
/// whose text the previous message already contains (several errors embed
/// their source's message in their own).
pub fn full_message(e: &(dyn std::error::Error + 'static)) -> String {
    let mut msg = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !msg.contains(&text) {
            msg.push_str(": ");
            msg.push_str(&text);
        }
        source = s.source();
    }
    msg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_chain_has_no_repeats() {
        let e = DemoError::Parameter(topk_core::Error::ZeroK);
        assert_eq!(
            full_message(&e),
            "invalid K = 0: ask for at least one neighbour"
        );
        let e = DemoError::Corpus {
            origin: "c.npy".into(),
            source: topk_core::Error::EmptyCorpus,
        };
        let m = full_message(&e);
        assert_eq!(m.matches("empty corpus").count(), 1, "{m}");
        assert!(m.starts_with("corpus c.npy: "), "{m}");
    }
}

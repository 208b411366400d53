//! The data sets of the sweep: the seeded Gaussian-cluster corpus and the
//! MiniLM set read from disk.

use std::path::Path;
use std::time::Instant;

use ndarray::Array2;
use serde_json::{json, Value};
use topk_core::Metric;
use topk_hnsw::synth;

use crate::args::Args;
use crate::{spinner, AnyResult, LOG};

/// A data set of the sweep.
pub(crate) struct Dataset {
    pub(crate) name: String,
    pub(crate) corpus: Array2<f32>,
    pub(crate) queries: Array2<f32>,
    pub(crate) metric: Metric,
    /// How it was made or where it was read from.
    pub(crate) meta: Value,
}

/// The seeded Gaussian-cluster corpus and its held-out queries.
pub(crate) fn gauss(a: &Args) -> AnyResult<Dataset> {
    tracing::info!(
        target: LOG,
        "generating {} x {} Gaussian-cluster rows ({} clusters, spread {}, seed {}) and {} queries",
        a.n,
        a.d,
        a.clusters,
        a.spread,
        a.seed,
        a.queries
    );
    let pb = spinner("generating the corpus");
    let t = Instant::now();
    let corpus = Array2::from_shape_vec(
        (a.n, a.d),
        synth::gaussian_clusters(a.n, a.d, a.clusters, a.spread, a.seed),
    )?;
    let queries = Array2::from_shape_vec(
        (a.queries, a.d),
        synth::cluster_queries(a.queries, a.d, a.clusters, a.spread, a.seed),
    )?;
    pb.finish_and_clear();
    Ok(Dataset {
        name: format!("gauss-{}x{}", a.n, a.d),
        corpus,
        queries,
        metric: a.metric,
        meta: json!({
            "generator": "topk_hnsw::synth::gaussian_clusters",
            "queries_generator": "topk_hnsw::synth::cluster_queries (same centres, independent noise stream)",
            "n": a.n, "d": a.d, "queries": a.queries, "clusters": a.clusters,
            "spread": a.spread, "seed": a.seed, "generate_s": t.elapsed().as_secs_f64(),
        }),
    })
}

/// The shared MiniLM set: `corpus.npy` and `queries.npy`, L2-normalised.
pub(crate) fn read_minilm(dir: &Path, metric: Metric) -> AnyResult<Dataset> {
    let corpus_path = dir.join("corpus.npy");
    let queries_path = dir.join("queries.npy");
    for p in [&corpus_path, &queries_path] {
        if !p.is_file() {
            return Err(format!("{} is not there", p.display()).into());
        }
    }
    let corpus = topk_io::read_matrix(&corpus_path)?;
    let queries = topk_io::read_matrix(&queries_path)?;
    let name = dir
        .file_name()
        .map_or_else(|| "minilm".to_owned(), |s| s.to_string_lossy().into_owned());
    let name = if name.starts_with("minilm") {
        name
    } else {
        format!("minilm-{name}")
    };
    Ok(Dataset {
        meta: json!({
            "path": dir.display().to_string(), "n": corpus.nrows(), "d": corpus.ncols(),
            "queries": queries.nrows(),
        }),
        name,
        corpus,
        queries,
        metric,
    })
}

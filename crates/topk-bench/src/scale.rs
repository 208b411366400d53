//! The scale-out measurements (docs/CONTRACTS.md §12): corpora of 1M–20M
//! rows on the GPU, one engine against a [`topk::ShardedIndex`] of `cuda`
//! shards, with the corpus upload rate.
//!
//! For every (N, D): the corpus is generated (the campaign's Gaussian rows,
//! seed 42, L2-normalised) and uploaded to one engine (`topk::open`, the
//! staged, checked upload), whose single-query (K) and batch (Q) times are
//! taken; the first queries are checked bit for bit against the CPU
//! backend. Then one `cuda` [`topk::Index`] and sets of S shards (placed on
//! the given devices in turn) are built by `add`, timed the same way, and
//! checked bit for bit against the one index. One JSON line per
//! measurement goes to `OUT/scale.jsonl`; `OUT/scale.md` is the table.

use std::io::Write;
use std::path::Path;
use std::time::Instant;

use ndarray::{s, ArrayView2};
use serde::Serialize;
use topk::{
    Backend, FilterSpec, Hit, Index, IndexBackend, IndexOptions, Metric, Neighbor, Options,
    ShardSpec, ShardedIndex,
};

use crate::data;
use crate::error::{BenchError, Result};

/// What a scale run measures.
#[derive(Debug, Clone)]
pub struct ScaleSpec {
    /// Corpus sizes.
    pub ns: Vec<usize>,
    /// Dimensions.
    pub ds: Vec<usize>,
    /// Shard counts of the sharded sets (empty: the engine and one index only).
    pub shards: Vec<usize>,
    /// Device ordinals the shards are placed on, in turn.
    pub devices: Vec<usize>,
    /// K of every search.
    pub k: usize,
    /// Batch size of the batch timings.
    pub batch: usize,
    /// Timed single queries (after 5 warm-up queries).
    pub trials: usize,
    /// Timed batches (after 2 warm-up batches).
    pub batch_trials: usize,
    /// Queries checked against the CPU backend.
    pub check: usize,
    /// Skip the sharded sets above this many rows (host memory: each holds a copy).
    pub shard_max_rows: usize,
}

/// One measurement.
#[derive(Debug, Clone, Serialize)]
pub struct ScaleRecord {
    /// `engine`, `index` or `sharded`.
    pub what: &'static str,
    /// Rows.
    pub n: usize,
    /// Dimension.
    pub d: usize,
    /// Shards (1 for the engine and the one index).
    pub shards: usize,
    /// Devices used.
    pub devices: usize,
    /// K.
    pub k: usize,
    /// Upload / build time, seconds.
    pub upload_s: f64,
    /// Upload rate, corpus bytes per second / 1e9.
    pub upload_gbs: f64,
    /// Single-query median, ms.
    pub single_ms: f64,
    /// Single-query 90th percentile, ms.
    pub single_p90_ms: f64,
    /// Batch size.
    pub batch: usize,
    /// Batch median, ms.
    pub batch_ms: f64,
    /// Queries per second of the batch.
    pub batch_qps: f64,
    /// Memory floor of one query (corpus bytes / device bandwidth), ms.
    pub floor_ms: Option<f64>,
    /// Whether the results were checked bit for bit (and matched).
    pub checked: bool,
    /// A sharded set's shard 0 searched alone, single-query median, ms
    /// (what one shard's search costs without the others running).
    pub shard_alone_ms: Option<f64>,
}

/// Single-query (median, p90) and batch median, ms.
type Timing = ((f64, f64), f64);

impl ScaleRecord {
    /// A record of one path over one corpus (1 shard on 1 device, checked).
    fn of(
        what: &'static str,
        (n, d): (usize, usize),
        spec: &ScaleSpec,
        upload_s: f64,
        ((single_ms, single_p90_ms), batch_ms): Timing,
        floor_ms: Option<f64>,
    ) -> Self {
        ScaleRecord {
            what,
            n,
            d,
            shards: 1,
            devices: 1,
            k: spec.k,
            upload_s,
            upload_gbs: (n * d * 4) as f64 / upload_s / 1e9,
            single_ms,
            single_p90_ms,
            batch: spec.batch,
            batch_ms,
            batch_qps: spec.batch as f64 / (batch_ms / 1e3),
            floor_ms,
            checked: true,
            shard_alone_ms: None,
        }
    }
}

fn median_p90(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.9))
}

/// Times `single` on queries in turn and `batch` on the first `spec.batch`.
fn time_paths(
    spec: &ScaleSpec,
    queries: ArrayView2<'_, f32>,
    single: &mut dyn FnMut(&[f32]) -> Result<()>,
    batch: &mut dyn FnMut(ArrayView2<'_, f32>) -> Result<()>,
) -> Result<((f64, f64), f64)> {
    let row = |i: usize| -> Vec<f32> { queries.row(i % queries.nrows()).to_vec() };
    for i in 0..5 {
        single(&row(i))?;
    }
    let mut times = Vec::with_capacity(spec.trials);
    for i in 0..spec.trials {
        let q = row(i + 5);
        let t = Instant::now();
        single(&q)?;
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let qs = queries.slice(s![..spec.batch.min(queries.nrows()), ..]);
    for _ in 0..2 {
        batch(qs)?;
    }
    let mut btimes = Vec::with_capacity(spec.batch_trials);
    for _ in 0..spec.batch_trials {
        let t = Instant::now();
        batch(qs)?;
        btimes.push(t.elapsed().as_secs_f64() * 1e3);
    }
    Ok((median_p90(times), median_p90(btimes).0))
}

fn same_hits(what: &str, got: &[Hit], want: &[Hit]) -> Result<()> {
    let equal = got.len() == want.len()
        && got
            .iter()
            .zip(want)
            .all(|(g, w)| g.id == w.id && g.score.to_bits() == w.score.to_bits());
    if equal {
        Ok(())
    } else {
        Err(BenchError::Mismatch(format!(
            "{what}: {:?} vs {:?}",
            &got[..got.len().min(3)],
            &want[..want.len().min(3)]
        )))
    }
}

fn as_hits(ns: &[Neighbor]) -> Vec<Hit> {
    ns.iter()
        .map(|n| Hit::new(u64::from(n.index), n.score))
        .collect()
}

/// Runs the sweep, writing `OUT/scale.jsonl` and `OUT/scale.md`.
pub fn run(spec: &ScaleSpec, out: &Path, floor_bw: Option<f64>) -> Result<Vec<ScaleRecord>> {
    std::fs::create_dir_all(out).map_err(|e| BenchError::io(out, e))?;
    let jsonl = out.join("scale.jsonl");
    let mut lines = std::fs::File::create(&jsonl).map_err(|e| BenchError::io(&jsonl, e))?;
    let mut records = Vec::new();
    let metric = Metric::Dot;
    for &d in &spec.ds {
        for &n in &spec.ns {
            let t = Instant::now();
            let corpus = data::gaussian(n, d, 42);
            let queries = data::gaussian_queries(spec.batch.max(spec.trials + 5), d, 42);
            tracing::info!(n, d, secs = t.elapsed().as_secs_f64(), "corpus generated");
            let bytes = (n * d * 4) as f64;
            let floor_ms = floor_bw.map(|bw| bytes / bw * 1e3);
            let mut emit = |rec: ScaleRecord| -> Result<()> {
                let line = serde_json::to_string(&rec).unwrap_or_default();
                writeln!(lines, "{line}").map_err(|e| BenchError::io(&jsonl, e))?;
                tracing::info!("{line}");
                records.push(rec);
                Ok(())
            };

            // The CPU backend's answers to the first queries, for the checks.
            let reference: Vec<Vec<Hit>> = {
                let cpu = topk::open(Backend::Cpu, corpus.view(), metric, &Options::new())?;
                (0..spec.check)
                    .map(|i| {
                        let q = queries.row(i).to_vec();
                        cpu.search(&q, spec.k).map(|r| as_hits(&r))
                    })
                    .collect::<std::result::Result<_, _>>()?
            };

            // One engine: the staged, checked upload, then the searches.
            {
                let t = Instant::now();
                let engine = topk::open(Backend::Cuda, corpus.view(), metric, &Options::new())?;
                let upload_s = t.elapsed().as_secs_f64();
                for (i, want) in reference.iter().enumerate() {
                    let got = as_hits(&engine.search(&queries.row(i).to_vec(), spec.k)?);
                    same_hits("engine vs cpu", &got, want)?;
                }
                let k = spec.k;
                let timing = time_paths(
                    spec,
                    queries.view(),
                    &mut |q| engine.search(q, k).map(|_| ()).map_err(Into::into),
                    &mut |qs| engine.search_batch(qs, k).map(|_| ()).map_err(Into::into),
                )?;
                emit(ScaleRecord::of(
                    "engine",
                    (n, d),
                    spec,
                    upload_s,
                    timing,
                    floor_ms,
                ))?;
            }
            if n > spec.shard_max_rows || spec.shards.is_empty() {
                continue;
            }
            let ids: Vec<u64> = (0..n as u64).collect();
            let qs = queries.slice(s![..spec.batch.min(queries.nrows()), ..]);
            // One `cuda` index (the sharded sets' reference, bit for bit).
            let (one_single, one_batch) = {
                let t = Instant::now();
                let options = IndexOptions::default().capacity(n);
                let mut index = Index::with_options(d, metric, IndexBackend::Cuda, &options)?;
                index.add(&ids, corpus.view())?;
                let upload_s = t.elapsed().as_secs_f64();
                for (i, want) in reference.iter().enumerate() {
                    same_hits(
                        "index vs cpu",
                        &index.search(&queries.row(i).to_vec(), spec.k, None)?,
                        want,
                    )?;
                }
                let k = spec.k;
                let timing = time_paths(
                    spec,
                    queries.view(),
                    &mut |q| index.search(q, k, None).map(|_| ()).map_err(Into::into),
                    &mut |qs| {
                        index
                            .search_batch(qs, k, FilterSpec::None)
                            .map(|_| ())
                            .map_err(Into::into)
                    },
                )?;
                emit(ScaleRecord::of(
                    "index",
                    (n, d),
                    spec,
                    upload_s,
                    timing,
                    floor_ms,
                ))?;
                let singles: Vec<Vec<Hit>> = (0..spec.check)
                    .map(|i| index.search(&queries.row(i).to_vec(), spec.k, None))
                    .collect::<std::result::Result<_, _>>()?;
                (singles, index.search_batch(qs, spec.k, FilterSpec::None)?)
            };
            for &shards in &spec.shards {
                let specs: Vec<ShardSpec> = (0..shards)
                    .map(|i| {
                        let dev = spec.devices[i % spec.devices.len()];
                        let mut s = ShardSpec::cuda(dev);
                        s.options.capacity = n / shards + n / 50 + 1024;
                        s
                    })
                    .collect();
                let t = Instant::now();
                let mut set = ShardedIndex::new(d, metric, &specs)?;
                set.add(&ids, corpus.view())?;
                let upload_s = t.elapsed().as_secs_f64();
                for (i, want) in one_single.iter().enumerate() {
                    same_hits(
                        "sharded vs index",
                        &set.search(&queries.row(i).to_vec(), spec.k, None)?,
                        want,
                    )?;
                }
                for (got, want) in set
                    .search_batch(qs, spec.k, FilterSpec::None)?
                    .iter()
                    .zip(&one_batch)
                {
                    same_hits("sharded batch vs index", got, want)?;
                }
                let k = spec.k;
                let timing = time_paths(
                    spec,
                    queries.view(),
                    &mut |q| set.search(q, k, None).map(|_| ()).map_err(Into::into),
                    &mut |qs| {
                        set.search_batch(qs, k, FilterSpec::None)
                            .map(|_| ())
                            .map_err(Into::into)
                    },
                )?;
                let alone = {
                    let shard0 = &set.shards()[0];
                    let ((ms, _), _) = time_paths(
                        &ScaleSpec {
                            batch_trials: 1,
                            ..spec.clone()
                        },
                        queries.view(),
                        &mut |q| shard0.search(q, k, None).map(|_| ()).map_err(Into::into),
                        &mut |qs| {
                            shard0
                                .search_batch(qs, k, FilterSpec::None)
                                .map(|_| ())
                                .map_err(Into::into)
                        },
                    )?;
                    ms
                };
                let mut used: Vec<usize> = specs.iter().map(|s| s.options.cuda.device).collect();
                used.sort_unstable();
                used.dedup();
                emit(ScaleRecord {
                    shards,
                    devices: used.len(),
                    shard_alone_ms: Some(alone),
                    ..ScaleRecord::of("sharded", (n, d), spec, upload_s, timing, floor_ms)
                })?;
            }
        }
    }
    write_table(&records, &out.join("scale.md"))?;
    Ok(records)
}

/// The markdown table of a run: every measurement, with the single-query
/// time as a multiple of the floor and of the one index.
pub fn write_table(records: &[ScaleRecord], path: &Path) -> Result<()> {
    let mut t = String::from(
        "| what | N | D | shards | devices | upload s | upload GB/s | 1 query ms (p90) | × floor | × one index | shard 0 alone ms | Q batch ms | queries/s |\n\
         | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for r in records {
        let one = records
            .iter()
            .find(|o| o.what == "index" && o.n == r.n && o.d == r.d)
            .map(|o| o.single_ms);
        let fmt = |v: Option<f64>| v.map_or("–".to_owned(), |v| format!("{v:.3}"));
        t.push_str(&format!(
            "| {} | {} | {} | {} | {} | {:.2} | {:.1} | {:.3} ({:.3}) | {} | {} | {} | {:.2} (Q={}) | {:.0} |\n",
            r.what,
            r.n,
            r.d,
            r.shards,
            r.devices,
            r.upload_s,
            r.upload_gbs,
            r.single_ms,
            r.single_p90_ms,
            fmt(r.floor_ms.map(|f| r.single_ms / f)),
            fmt(one.map(|o| r.single_ms / o)),
            fmt(r.shard_alone_ms),
            r.batch_ms,
            r.batch,
            r.batch_qps,
        ));
    }
    crate::record::write_whole(path, t.as_bytes())
}

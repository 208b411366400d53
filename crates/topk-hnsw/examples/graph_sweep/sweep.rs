//! One data set's part of the sweep: the exact engine and the ground truth,
//! both builds, the one-call passes and checks, and the timed points.

use std::collections::BTreeMap;
use std::time::Instant;

use ndarray::s;
use serde_json::{json, Value};
use topk_core::{Neighbor, Retriever};
use topk_cuda::{CudaConfig, CudaRetriever};
use topk_hnsw::{recall_at_k, Hnsw, HnswParams};

use crate::args::Args;
use crate::data::Dataset;
use crate::graph::{gpu_build, upload_graph, GraphSearcher};
use crate::report::{failed, BuildRow, Sink, Summary};
use crate::timing::{differ, ids, Ctx};
use crate::{
    bar, spinner, AnyResult, CPU_HNSW, EXACT_GPU, GPU_GRAPH, GPU_GRAPH_GPU_BUILT, GPU_GRAPH_WIDE,
    LOG,
};

pub(crate) fn run_dataset(
    a: &Args,
    ds: &Dataset,
    threads: usize,
    started: Instant,
    sink: &mut Sink,
    devices: &mut Vec<Value>,
) -> AnyResult<Summary> {
    let (n, d) = ds.corpus.dim();
    let nq = ds.queries.nrows();
    let k = a.k;
    let metric = ds.metric;
    tracing::info!(
        target: LOG,
        "{}: {n} x {d} ({metric}), {nq} queries, k = {k}",
        ds.name
    );
    let mut sum = Summary {
        dataset: ds.name.clone(),
        ..Summary::default()
    };
    let described: Vec<String> = ds
        .meta
        .as_object()
        .map(|o| o.iter().map(|(key, v)| format!("{key} = {v}")).collect())
        .unwrap_or_default();
    sum.header.push(format!(
        "{n} × {d}, {metric}, {nq} queries, k = {k}. Data: {}.",
        described.join(", ")
    ));
    let mut info = ds.meta.clone();
    info["what"] = "dataset".into();
    info["dataset"] = ds.name.clone().into();
    info["metric"] = metric.as_str().into();
    sink.emit(&info)?;

    let flat: Vec<f32> = ds.corpus.iter().copied().collect();
    let qflat: Vec<f32> = ds.queries.iter().copied().collect();
    let qv = ds.queries.view();

    // The exact engine, and the ground truth.
    let gpu = if a.cpu_only {
        None
    } else {
        let pb = spinner("uploading the corpus to the GPU");
        let t = Instant::now();
        let mut config = CudaConfig::default();
        config.max_batch = a.exact_max_batch;
        config.tuning.walk_threads = a.walk_threads;
        config.tuning.walk_seen = a.walk_seen;
        let gpu = CudaRetriever::from_rowmajor(flat.clone(), d, metric, config)?;
        pb.finish_and_clear();
        let dev = gpu.info();
        let dev = json!({
            "name": dev.name, "driver_version": dev.driver_version,
            "total_memory": dev.total_memory,
            "compute_capability": [dev.compute_capability.0, dev.compute_capability.1],
            "multiprocessors": dev.multiprocessors,
        });
        devices.push(dev.clone());
        sink.emit(&json!({
            "what": "engine", "dataset": ds.name, "device": dev,
            "upload_s": t.elapsed().as_secs_f64(),
        }))?;
        Some(gpu)
    };
    let pb = spinner("ground truth");
    let t = Instant::now();
    let (exact_full, truth_by) = match &gpu {
        Some(g) => (g.search_batch_rowmajor(&qflat, k)?, "exact GPU engine"),
        None => (
            topk_cpu::CpuRetriever::new(ds.corpus.view(), metric)?.search_batch(qv, k)?,
            "CPU oracle",
        ),
    };
    pb.finish_and_clear();
    sum.header
        .push(format!("Ground truth: the {truth_by}, K = {k}."));
    sink.emit(&json!({
        "what": "ground_truth", "dataset": ds.name, "by": truth_by, "k": k,
        "queries": nq, "seconds": t.elapsed().as_secs_f64(),
    }))?;
    let truth = ids(&exact_full);
    let cx = Ctx {
        a,
        ds,
        truth,
        started,
    };

    // The builds.
    let params = HnswParams {
        m: a.m,
        ef_construction: a.ef_construction,
        ef_search: a.ef[0],
        seed: a.level_seed,
        parallel: true,
    };
    tracing::info!(target: LOG, "CPU parallel build on {threads} threads");
    let pb = bar(n as u64, "CPU build");
    let report = |rows: usize| pb.set_position(rows as u64);
    let data = flat.clone();
    let t = Instant::now();
    // `Hnsw::build_parallel`'s build (parallel = true), with progress.
    let index = Hnsw::from_rowmajor_with_progress(data, d, metric, params, &report)?;
    let cpu_build_s = t.elapsed().as_secs_f64();
    pb.finish_and_clear();
    tracing::info!(target: LOG, "CPU build: {cpu_build_s:.1} s");
    // Every GPU build of `--gpu-build`; the first that succeeds is the
    // graph of the GPU-built points.
    let mut gpu_builds: Vec<(Hnsw, f64, String)> = Vec::new();
    if let Some(g) = gpu.as_ref().filter(|_| !a.no_gpu_build) {
        for &build in &a.gpu_build {
            let pb = bar(n as u64, "GPU build");
            let data = flat.clone();
            let t = Instant::now();
            let built = gpu_build(data, d, metric, params, g, build, &pb);
            let s = t.elapsed().as_secs_f64();
            pb.finish_and_clear();
            match built {
                Ok(built) => {
                    tracing::info!(target: LOG, "{build}: {s:.2} s");
                    gpu_builds.push((built, s, build.to_string()));
                }
                Err(e) => failed(sink, &mut sum, &ds.name, &build.to_string(), &e)?,
            }
        }
    }

    // One-call passes over all queries: recall per ef, and the references
    // every timed batch is compared with.
    let mut cpu_full: BTreeMap<usize, Vec<Vec<Neighbor>>> = BTreeMap::new();
    let mut builds = vec![BuildRow {
        what: "CPU parallel build (Hnsw::build_parallel)".to_owned(),
        seconds: cpu_build_s,
        recall: Vec::new(),
    }];
    builds.extend(gpu_builds.iter().map(|(_, s, what)| BuildRow {
        what: what.clone(),
        seconds: *s,
        recall: Vec::new(),
    }));
    let pb = bar(a.ef.len() as u64, "recall per ef");
    for &ef in &a.ef {
        let r = index.search_batch_with_ef(qv, k, ef)?;
        let rc = recall_at_k(&r, &cx.truth, k)?;
        builds[0].recall.push((ef, rc));
        cpu_full.insert(ef, r);
        for (i, (gi, _, _)) in gpu_builds.iter().enumerate() {
            let r = gi.search_batch_with_ef(qv, k, ef)?;
            builds[i + 1]
                .recall
                .push((ef, recall_at_k(&r, &cx.truth, k)?));
        }
        pb.inc(1);
    }
    pb.finish_and_clear();
    for (i, b) in builds.iter().enumerate() {
        let stats = if i == 0 {
            index.stats()
        } else {
            gpu_builds[i - 1].0.stats()
        };
        sink.emit(&json!({
            "what": "build", "dataset": ds.name, "build": b.what, "seconds": b.seconds,
            "n": n, "d": d, "metric": metric.as_str(), "m": a.m,
            "ef_construction": a.ef_construction, "level_seed": a.level_seed,
            "threads": threads, "k": k,
            "recall_at_ef": b.recall.iter().map(|&(ef, r)| json!({"ef": ef, "recall": r})).collect::<Vec<_>>(),
            "max_level": stats.max_level,
            "mean_degree": stats.mean_degree.clone(),
        }))?;
    }
    sum.builds = builds;

    let mut batches: Vec<usize> = a.batch.iter().map(|&b| b.min(nq)).collect();
    batches.sort_unstable_by(|x, y| y.cmp(x));
    batches.dedup();
    let (b_max, b_min) = (batches[0], batches[batches.len() - 1]);

    // GPU graph search: the graph uploaded, one-call passes, the CPU check.
    let mut gpu_full: BTreeMap<usize, Vec<Vec<Neighbor>>> = BTreeMap::new();
    let mut gpu_built_full: BTreeMap<usize, Vec<Vec<Neighbor>>> = BTreeMap::new();
    let mut searcher = match &gpu {
        Some(g) => timed_upload(&index, g, "CPU-built", ds, sink, &mut sum)?,
        None => None,
    };
    let mut searcher_gpu_built = match (&gpu, gpu_builds.first()) {
        (Some(g), Some((gi, _, _))) => timed_upload(gi, g, "GPU-built", ds, sink, &mut sum)?,
        _ => None,
    };
    // Width 1 (`gpu_full`), then `--walk-width` where above 1 (`wide_full`),
    // each checked against the CPU walk at its width.
    let mut wide_full: BTreeMap<usize, Vec<Vec<Neighbor>>> = BTreeMap::new();
    let widths: Vec<usize> = if a.walk_width > 1 {
        vec![1, a.walk_width]
    } else {
        vec![1]
    };
    if let Some(s) = &searcher {
        'widths: for &width in &widths {
            let (full, name) = if width == 1 {
                (&mut gpu_full, GPU_GRAPH)
            } else {
                (&mut wide_full, GPU_GRAPH_WIDE)
            };
            for &ef in &a.ef {
                s.take_counts();
                let r = match s.search(qv, k, ef, width) {
                    Ok(r) => r,
                    Err(e) => {
                        let what = format!("{name} one call, ef = {ef}");
                        failed(sink, &mut sum, &ds.name, &what, &e)?;
                        full.clear();
                        continue 'widths;
                    }
                };
                let (device_walks, host_answers) = s.take_counts();
                let wide_cpu;
                let cpu = if width == 1 {
                    cpu_full.get(&ef).map_or(&[][..], |v| v.as_slice())
                } else {
                    wide_cpu = index.search_batch_wide(qv, k, ef, width, None)?;
                    wide_cpu.as_slice()
                };
                let (ids_differ, bits_differ) = differ(&r, cpu);
                sum.gpu_vs_cpu
                    .push((width, ef, ids_differ, bits_differ, host_answers));
                sink.emit(&json!({
                    "what": "check_gpu_graph_equals_cpu_hnsw", "dataset": ds.name, "ef": ef,
                    "width": width, "k": k, "queries": nq, "ids_differ": ids_differ,
                    "bits_differ": bits_differ,
                    "recall_gpu_graph": recall_at_k(&r, &cx.truth, k)?,
                    "recall_cpu_hnsw": recall_at_k(cpu, &cx.truth, k)?,
                    "device_walks": device_walks, "host_answers": host_answers,
                }))?;
                full.insert(ef, r);
            }
        }
    }
    let wide_ok = a.walk_width > 1 && wide_full.len() == a.ef.len();
    if gpu_full.len() < a.ef.len() {
        searcher = None;
    }
    if let Some(s) = &searcher_gpu_built {
        for &ef in &a.ef {
            match s.search(qv, k, ef, 1) {
                Ok(r) => {
                    gpu_built_full.insert(ef, r);
                }
                Err(e) => {
                    let what = format!("{GPU_GRAPH_GPU_BUILT} one call, ef = {ef}");
                    failed(sink, &mut sum, &ds.name, &what, &e)?;
                    break;
                }
            }
        }
    }
    if gpu_built_full.len() < a.ef.len() {
        searcher_gpu_built = None;
    }

    // The timed sweep.
    let gpu_points = if gpu.is_some() {
        a.ef.len() * batches.len() * (1 + usize::from(wide_ok)) + 2 * a.ef.len() + batches.len()
    } else {
        0
    };
    let pb = bar(
        (a.ef.len() * batches.len() + gpu_points) as u64,
        "search sweep",
    );
    for &b in &batches {
        for &ef in &a.ef {
            // The GPU walk of the CPU-built graph at every batch size, of the
            // GPU-built graph at the smallest and largest.
            // The wide walk of the CPU-built graph where asked for.
            let walks = [
                (GPU_GRAPH, searcher.as_ref(), &gpu_full, 1, true),
                (
                    GPU_GRAPH_WIDE,
                    searcher.as_ref(),
                    &wide_full,
                    a.walk_width,
                    wide_ok,
                ),
                (
                    GPU_GRAPH_GPU_BUILT,
                    searcher_gpu_built.as_ref(),
                    &gpu_built_full,
                    1,
                    b == b_max || b == b_min,
                ),
            ];
            for (name, searcher, full, width, here) in walks {
                let Some(s) = searcher.filter(|_| here) else {
                    continue;
                };
                pb.set_message(format!("{name} b={b} ef={ef}"));
                let full = full.get(&ef).map_or(&[][..], |v| v.as_slice());
                let mut f = |lo: usize, hi: usize| s.search(qv.slice(s![lo..hi, ..]), k, ef, width);
                cx.point(sink, &mut sum, name, b, Some(ef), full, Some(s), &mut f)?;
                pb.inc(1);
            }
            pb.set_message(format!("{CPU_HNSW} b={b} ef={ef}"));
            let full = cpu_full.get(&ef).map_or(&[][..], |v| v.as_slice());
            let mut f = |lo: usize, hi: usize| -> AnyResult<Vec<Vec<Neighbor>>> {
                if hi - lo == 1 {
                    // One query on this thread: the single-threaded latency.
                    let mut out = Vec::with_capacity(k);
                    let q: Vec<f32> = qv.row(lo).iter().copied().collect();
                    index.search_with_ef(&q, k, ef, &mut out)?;
                    Ok(vec![out])
                } else {
                    Ok(index.search_batch_with_ef(qv.slice(s![lo..hi, ..]), k, ef)?)
                }
            };
            cx.point(sink, &mut sum, CPU_HNSW, b, Some(ef), full, None, &mut f)?;
            pb.inc(1);
        }
        if let Some(g) = &gpu {
            pb.set_message(format!("{EXACT_GPU} b={b}"));
            let mut one = Vec::with_capacity(k);
            let mut f = |lo: usize, hi: usize| -> AnyResult<Vec<Vec<Neighbor>>> {
                if hi - lo == 1 {
                    g.search_host(&qflat[lo * d..hi * d], k, &mut one)?;
                    Ok(vec![one.clone()])
                } else {
                    Ok(g.search_batch_rowmajor(&qflat[lo * d..hi * d], k)?)
                }
            };
            cx.point(
                sink,
                &mut sum,
                EXACT_GPU,
                b,
                None,
                &exact_full,
                None,
                &mut f,
            )?;
            pb.inc(1);
        }
    }
    pb.finish_and_clear();
    Ok(sum)
}

/// Uploads `index`'s graph (`label`: which build made it) next to `gpu`'s
/// corpus, recording the time, or the failure, after which the sweep goes
/// on without that searcher.
fn timed_upload<'a>(
    index: &'a Hnsw,
    gpu: &'a CudaRetriever,
    label: &str,
    ds: &Dataset,
    sink: &mut Sink,
    sum: &mut Summary,
) -> AnyResult<Option<GraphSearcher<'a>>> {
    let t = Instant::now();
    match upload_graph(index, gpu) {
        Ok(s) => {
            sink.emit(&json!({"what": "graph_upload", "dataset": ds.name, "graph": label.to_lowercase(), "seconds": t.elapsed().as_secs_f64()}))?;
            Ok(Some(s))
        }
        Err(e) => {
            failed(
                sink,
                sum,
                &ds.name,
                &format!("graph upload ({label} graph)"),
                &e,
            )?;
            Ok(None)
        }
    }
}

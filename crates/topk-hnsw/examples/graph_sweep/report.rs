//! What the sweep records: `raw.jsonl` lines, the per-data-set summary,
//! `environment.json` and `table.md`.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};

use serde_json::{json, Value};

use crate::args::Args;
use crate::{AnyResult, CPU_HNSW, EXACT_GPU, GPU_GRAPH, GPU_GRAPH_GPU_BUILT, GPU_GRAPH_WIDE, LOG};

/// Appends JSON lines to `raw.jsonl`, flushed per line so a cut-off run
/// keeps what it measured.
pub(crate) struct Sink {
    pub(crate) file: BufWriter<File>,
}

impl Sink {
    pub(crate) fn emit(&mut self, v: &Value) -> AnyResult<()> {
        writeln!(self.file, "{v}")?;
        self.file.flush()?;
        Ok(())
    }
}

/// One timed point of the sweep.
#[derive(Debug, Clone)]
pub(crate) struct Point {
    pub(crate) method: &'static str,
    pub(crate) batch: usize,
    pub(crate) ef: Option<usize>,
    pub(crate) qps: f64,
    pub(crate) median_ms: f64,
    pub(crate) p90_ms: f64,
    /// Recall of the method at this `ef` over all queries (one-call pass).
    pub(crate) recall: f64,
}

/// The build of one graph.
#[derive(Debug, Clone)]
pub(crate) struct BuildRow {
    pub(crate) what: String,
    pub(crate) seconds: f64,
    /// recall@k at each `ef` of the sweep.
    pub(crate) recall: Vec<(usize, f64)>,
}

/// What one data set's run leaves for the table and the plot.
#[derive(Default)]
pub(crate) struct Summary {
    pub(crate) dataset: String,
    pub(crate) header: Vec<String>,
    pub(crate) builds: Vec<BuildRow>,
    pub(crate) points: Vec<Point>,
    /// Per walk width and `ef`: queries whose GPU graph ids differ from CPU
    /// HNSW's (at the same width), whose (id, score bits) lists differ, and
    /// that the CPU path answered.
    pub(crate) gpu_vs_cpu: Vec<(usize, usize, usize, usize, usize)>,
    /// Queries of timed batches whose result differs from the one-call
    /// pass, summed over the points of each method.
    pub(crate) batch_differs: BTreeMap<&'static str, (usize, usize)>,
    /// Queries of GPU graph points that the CPU path answered instead of
    /// the device, per method.
    pub(crate) host_answers: BTreeMap<&'static str, usize>,
    /// Parts that failed, with their errors.
    pub(crate) failures: Vec<String>,
    pub(crate) skipped: usize,
}

/// The environment record: host, parameters, commit.
pub(crate) fn environment(a: &Args, threads: usize) -> Value {
    let cpu_model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_owned())
        })
        .unwrap_or_default();
    let unix_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    json!({
        "host_threads": std::thread::available_parallelism().map_or(1, |p| p.get()),
        "threads": threads,
        "cpu_model": cpu_model,
        "os": std::env::consts::OS,
        "arch": std::env::consts::ARCH,
        "commit": std::env::var("TOPK_COMMIT").ok(),
        "started_unix_s": unix_s,
        "device": Value::Null,
        "args": format!("{a:?}"),
        "parameters": {
            "n": a.n, "d": a.d, "queries": a.queries, "clusters": a.clusters,
            "spread": a.spread, "seed": a.seed, "metric": a.metric.as_str(),
            "minilm": a.minilm.as_ref().map(|p| p.display().to_string()),
            "minilm_metric": a.minilm_metric.as_str(),
            "m": a.m, "ef_construction": a.ef_construction, "level_seed": a.level_seed,
            "ef": a.ef, "batch": a.batch, "k": a.k, "budget_s": a.budget_s,
            "warmup": a.warmup, "min_reps": a.min_reps, "deadline_s": a.deadline_s,
            "recall_target": a.recall_target, "exact_max_batch": a.exact_max_batch,
            "walk_threads": a.walk_threads, "walk_seen": format!("{:?}", a.walk_seen),
            "no_gpu_build": a.no_gpu_build,
            "cpu_only": a.cpu_only,
        },
    })
}

/// Records a part of the sweep that failed (the rest goes on).
pub(crate) fn failed(
    sink: &mut Sink,
    sum: &mut Summary,
    dataset: &str,
    what: &str,
    e: &dyn std::fmt::Display,
) -> AnyResult<()> {
    tracing::warn!(target: LOG, "{dataset}: {what} failed: {e}");
    sink.emit(
        &json!({"what": "failed", "dataset": dataset, "part": what, "error": e.to_string()}),
    )?;
    sum.failures.push(format!("{what}: {e}"));
    Ok(())
}

/// The best QPS among `points` of `method` at batch `b` with recall at
/// least `target`.
fn best<'a>(points: &'a [Point], method: &str, b: usize, target: f64) -> Option<&'a Point> {
    points
        .iter()
        .filter(|p| p.method == method && p.batch == b && p.recall >= target)
        .max_by(|x, y| x.qps.total_cmp(&y.qps))
}

pub(crate) fn fmt_qps(q: f64) -> String {
    if q >= 1e6 {
        format!("{:.2}M", q / 1e6)
    } else if q >= 1e4 {
        format!("{:.0}k", q / 1e3)
    } else if q >= 1e3 {
        format!("{:.1}k", q / 1e3)
    } else {
        format!("{q:.0}")
    }
}

fn cell(p: Option<&Point>) -> String {
    match p {
        Some(p) => format!(
            "{} (ef {}, recall {:.3}, {:.3} ms)",
            fmt_qps(p.qps),
            p.ef.map_or_else(|| "—".to_owned(), |e| e.to_string()),
            p.recall,
            p.median_ms
        ),
        None => "—".to_owned(),
    }
}

fn ratio(x: Option<&Point>, y: Option<&Point>) -> String {
    match (x, y) {
        (Some(x), Some(y)) => format!("{:.2}×", x.qps / y.qps),
        _ => "—".to_owned(),
    }
}

/// The markdown summary of every data set.
pub(crate) fn table(a: &Args, sums: &[Summary]) -> String {
    let mut o = String::new();
    let t = a.recall_target;
    o.push_str("# GPU graph search sweep\n\n");
    o.push_str(&format!(
        "CPU: {} threads (CPU HNSW batches and the CPU build; batch 1 on one thread). \
         m = {}, ef_construction = {}, k = {}; best QPS at recall@{} ≥ {t} per batch size \
         (cell: QPS (ef, recall, median latency per batch)); recall against each data set's exact ground truth.\n\n",
        rayon::current_num_threads(),
        a.m, a.ef_construction, a.k, a.k
    ));
    for s in sums {
        o.push_str(&format!("## {}\n\n", s.dataset));
        for h in &s.header {
            o.push_str(&format!("{h}\n\n"));
        }
        o.push_str("### Builds\n\n| build | seconds |");
        for &ef in &a.ef {
            o.push_str(&format!(" recall ef={ef} |"));
        }
        o.push_str("\n| --- | ---: |");
        for _ in &a.ef {
            o.push_str(" ---: |");
        }
        o.push('\n');
        for b in &s.builds {
            o.push_str(&format!("| {} | {:.2} |", b.what, b.seconds));
            for &(_, r) in &b.recall {
                o.push_str(&format!(" {r:.4} |"));
            }
            o.push('\n');
        }
        if let [cpu, gpus @ ..] = s.builds.as_slice() {
            for gpu in gpus {
                o.push_str(&format!(
                    "\n{}: {:.2}× faster than the CPU parallel build.\n",
                    gpu.what,
                    cpu.seconds / gpu.seconds
                ));
            }
        }
        let mut batches: Vec<usize> = s.points.iter().map(|p| p.batch).collect();
        batches.sort_unstable();
        batches.dedup();
        let wide = s.points.iter().any(|p| p.method == GPU_GRAPH_WIDE);
        o.push_str(&format!(
            "\n### Best QPS at recall@{} ≥ {t}\n\n| batch | {GPU_GRAPH} | {CPU_HNSW} | {EXACT_GPU} | {GPU_GRAPH}/{CPU_HNSW} | {GPU_GRAPH}/{EXACT_GPU} | {GPU_GRAPH_GPU_BUILT} |",
            a.k
        ));
        if wide {
            o.push_str(&format!(
                " {GPU_GRAPH_WIDE}, width {w} | wide/{CPU_HNSW} | wide/{EXACT_GPU} |",
                w = a.walk_width
            ));
        }
        o.push_str("\n| ---: | --- | --- | --- | ---: | ---: | --- |");
        if wide {
            o.push_str(" --- | ---: | ---: |");
        }
        o.push('\n');
        for &b in &batches {
            let g = best(&s.points, GPU_GRAPH, b, t);
            let c = best(&s.points, CPU_HNSW, b, t);
            let e = best(&s.points, EXACT_GPU, b, t);
            let gg = best(&s.points, GPU_GRAPH_GPU_BUILT, b, t);
            o.push_str(&format!(
                "| {b} | {} | {} | {} | {} | {} | {} |",
                cell(g),
                cell(c),
                cell(e),
                ratio(g, c),
                ratio(g, e),
                cell(gg)
            ));
            if wide {
                let w = best(&s.points, GPU_GRAPH_WIDE, b, t);
                o.push_str(&format!(
                    " {} | {} | {} |",
                    cell(w),
                    ratio(w, c),
                    ratio(w, e)
                ));
            }
            o.push('\n');
        }
        o.push_str("\n### Every point\n\n| method | batch | ef | recall | QPS | median ms | p90 ms |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n");
        for p in &s.points {
            o.push_str(&format!(
                "| {} | {} | {} | {:.4} | {:.0} | {:.4} | {:.4} |\n",
                p.method,
                p.batch,
                p.ef.map_or_else(|| "—".to_owned(), |e| e.to_string()),
                p.recall,
                p.qps,
                p.median_ms,
                p.p90_ms
            ));
        }
        o.push_str("\n### Checks\n\n");
        if s.gpu_vs_cpu.is_empty() {
            o.push_str("- GPU graph search not run.\n");
        }
        for &(width, ef, ids, bits, host) in &s.gpu_vs_cpu {
            o.push_str(&format!(
                "- width {width}, ef = {ef}, one call of all queries: {ids} queries whose GPU graph ids differ from CPU HNSW's on the same graph at the same width ({bits} with any score bit differing); {host} answered by the CPU path.\n"
            ));
        }
        for (m, host) in &s.host_answers {
            o.push_str(&format!(
                "- {m}: {host} queries of the timed calls answered by the CPU path instead of the device walk.\n"
            ));
        }
        for (m, (diff, of)) in &s.batch_differs {
            o.push_str(&format!(
                "- {m}: {diff} of {of} timed query results differ from the same query's in the one-call batch of all queries.\n"
            ));
        }
        for f in &s.failures {
            o.push_str(&format!("- failed: {f}\n"));
        }
        if s.skipped > 0 {
            o.push_str(&format!(
                "- {} points skipped: past --deadline-s {}.\n",
                s.skipped, a.deadline_s
            ));
        }
        o.push('\n');
    }
    o
}

//! The topk side of the CPU lifecycle benchmark (`cargo xtask lifecycle-bench`).
//!
//! `serve --dir DATA` loads the data set written by
//! `bench/cpu/lifecycle_anchors.py gen` (corpus, random external ids,
//! queries, one allow-list per selectivity, fresh rows for adds) and answers
//! JSON commands, one per line on stdin, one JSON reply per line on stdout:
//! exact searches of an [`Index`] (cpu backend), filtered searches of a
//! topk-hnsw graph, and add / remove series on both. The Python anchors
//! (faiss-cpu, hnswlib) answer the same commands, so the driver can run the
//! two engines interleaved in one invocation.
//!
//! `persist --dir TMP --n N --d D --rounds R` times `Index::save` and
//! `Index::open` of an `N × D` index against a plain write + fsync of the
//! same number of bytes and a plain read of the file (`cat` and a read
//! loop), cold (the file's pages dropped from the page cache with
//! `dd iflag=nocache count=0`) and warm, and prints one JSON object.
//!
//! Progress goes to stderr.

use std::collections::{HashMap, VecDeque};
use std::error::Error;
use std::fs::File;
use std::io::{BufRead, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};
use ndarray::{s, Array1, Array2};
use serde_json::{json, Value};
use topk_core::{Hit, Metric, Retriever};
use topk_hnsw::{Hnsw, HnswParams, SlotFilter};
use topk_index::{Filter, FilterSpec, Index, IndexBackend, MAX_ID};

type Res<T> = Result<T, Box<dyn Error>>;

/// The filter tags of the data set (percent of the corpus allowed).
const SELECTIVITIES: [&str; 4] = ["100", "10", "1", "0.1"];

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = |name: &str| -> Option<&str> {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .map(String::as_str)
    };
    let dir = PathBuf::from(flag("--dir").ok_or("--dir DIR is required")?);
    match args.first().map(String::as_str) {
        Some("serve") => serve(&dir),
        Some("persist") => {
            let num = |name: &str, default: usize| -> Res<usize> {
                Ok(flag(name).map(str::parse).transpose()?.unwrap_or(default))
            };
            persist(
                &dir,
                num("--n", 1_000_000)?,
                num("--d", 1024)?,
                num("--rounds", 3)?,
            )
        }
        _ => Err("usage: lifecycle_bench serve --dir DATA | persist --dir TMP [--n N] [--d D] [--rounds R]".into()),
    }
}

// ---- serve ---------------------------------------------------------------

/// Everything the commands work on.
struct Bench {
    dir: PathBuf,
    corpus: Array2<f32>,
    ids: Vec<u64>,
    queries: Array2<f32>,
    extra: Array2<f32>,
    extra_ids: Vec<u64>,
    filters: HashMap<String, Filter>,
    index: Option<Index>,
    graph: Option<Hnsw>,
    /// Slot of each id in the graph.
    slot_of: HashMap<u64, u32>,
    /// Next unused row of `extra`, per target ("flat", "graph").
    cursor: HashMap<String, usize>,
    /// Ids added this round and not yet removed, per target.
    queue: HashMap<String, VecDeque<u64>>,
    /// Exact answers of the graph queries, per filter tag ("none" unfiltered).
    truth: HashMap<String, Vec<Vec<u64>>>,
}

fn load<T: ndarray_npy::ReadableElement, D: ndarray::Dimension>(
    dir: &Path,
    name: &str,
) -> Res<ndarray::Array<T, D>> {
    let path = dir.join(name);
    ndarray_npy::read_npy(&path).map_err(|e| format!("{}: {e}", path.display()).into())
}

fn serve(dir: &Path) -> Res<()> {
    let spinner = ProgressBar::new_spinner().with_message(format!("loading {}", dir.display()));
    let corpus: Array2<f32> = load(dir, "corpus.npy")?;
    let ids: Array1<u64> = load(dir, "ids.npy")?;
    let queries: Array2<f32> = load(dir, "queries.npy")?;
    let extra: Array2<f32> = load(dir, "extra.npy")?;
    let extra_ids: Array1<u64> = load(dir, "extra_ids.npy")?;
    let mut filters = HashMap::new();
    for tag in SELECTIVITIES {
        let f: Array1<u64> = load(dir, &format!("filter_{tag}.npy"))?;
        filters.insert(tag.to_owned(), Filter::new(f.iter().copied()));
    }
    spinner.finish_and_clear();
    let mut bench = Bench {
        dir: dir.to_owned(),
        corpus,
        ids: ids.to_vec(),
        queries,
        extra,
        extra_ids: extra_ids.to_vec(),
        filters,
        index: None,
        graph: None,
        slot_of: HashMap::new(),
        cursor: HashMap::new(),
        queue: HashMap::new(),
        truth: HashMap::new(),
    };
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", json!({ "ready": true }))?;
    out.flush()?;
    for line in std::io::stdin().lock().lines() {
        let cmd: Value = serde_json::from_str(&line?)?;
        let op = cmd["op"].as_str().unwrap_or_default();
        let reply = match op {
            "quit" => return Ok(()),
            "setup_exact" => bench.setup_exact()?,
            "exact" => bench.exact(&cmd)?,
            "build_graph" => bench.build_graph(&cmd)?,
            "graph" => bench.graph_search(&cmd)?,
            "mutate" => bench.mutate(&cmd)?,
            "end_round" => bench.end_round(&cmd)?,
            other => return Err(format!("unknown command {other:?}").into()),
        };
        writeln!(out, "{reply}")?;
        out.flush()?;
    }
    Ok(())
}

fn field<'a>(cmd: &'a Value, name: &str) -> Res<&'a Value> {
    cmd.get(name)
        .ok_or_else(|| format!("command {cmd} has no {name:?}").into())
}

fn usize_field(cmd: &Value, name: &str) -> Res<usize> {
    field(cmd, name)?
        .as_u64()
        .map(|v| v as usize)
        .ok_or_else(|| format!("{name:?} of {cmd} is not a count").into())
}

fn f64_field(cmd: &Value, name: &str) -> Res<f64> {
    field(cmd, name)?
        .as_f64()
        .ok_or_else(|| format!("{name:?} of {cmd} is not a number").into())
}

fn str_field(cmd: &Value, name: &str) -> Res<String> {
    field(cmd, name)?
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| format!("{name:?} of {cmd} is not a string").into())
}

/// The filter tag of a command: `None` when unfiltered (`"sel": null`).
fn sel_field(cmd: &Value) -> Option<String> {
    cmd.get("sel").and_then(Value::as_str).map(str::to_owned)
}

/// Runs `f` once to warm up, then until `min_time_s` has passed and at least
/// `min_calls` calls were made (at most `max_calls`); each call's ms.
fn timed_calls(
    min_time_s: f64,
    min_calls: usize,
    max_calls: usize,
    mut f: impl FnMut() -> Res<()>,
) -> Res<Vec<f64>> {
    f()?;
    let mut times = Vec::new();
    let start = Instant::now();
    while times.len() < max_calls
        && (times.len() < min_calls || start.elapsed().as_secs_f64() < min_time_s)
    {
        let t = Instant::now();
        f()?;
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    Ok(times)
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => f64::NAN,
        _ if !n.is_multiple_of(2) => v[n / 2],
        _ => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

impl Bench {
    fn index(&self) -> Res<&Index> {
        self.index
            .as_ref()
            .ok_or_else(|| "no index: send setup_exact first".into())
    }

    fn filter(&self, sel: Option<&str>) -> Res<Option<&Filter>> {
        sel.map(|t| {
            self.filters
                .get(t)
                .ok_or_else(|| format!("no filter {t:?}").into())
        })
        .transpose()
    }

    fn setup_exact(&mut self) -> Res<Value> {
        let t = Instant::now();
        let index = Index::with_ids(
            &self.ids,
            self.corpus.view(),
            Metric::Dot,
            IndexBackend::Cpu,
        )?;
        let build_s = t.elapsed().as_secs_f64();
        let rows = index.len();
        self.index = Some(index);
        Ok(json!({ "build_s": build_s, "rows": rows }))
    }

    fn exact(&mut self, cmd: &Value) -> Res<Value> {
        let (k, q) = (usize_field(cmd, "k")?, usize_field(cmd, "q")?);
        let sel = sel_field(cmd);
        let index = self.index()?;
        let filter = self.filter(sel.as_deref())?;
        let queries = self.queries.slice(s![..q, ..]);
        let spec = filter.map_or(FilterSpec::None, FilterSpec::Shared);
        let search = || -> Res<Vec<Vec<Hit>>> {
            Ok(if q == 1 {
                let row = queries.row(0);
                let query = row.as_slice().ok_or("query row is not contiguous")?;
                vec![index.search(query, k, filter)?]
            } else {
                index.search_batch(queries, k, spec)?
            })
        };
        let times = timed_calls(f64_field(cmd, "min_time_s")?, 2, 50, || {
            search().map(|_| ())
        })?;
        if cmd.get("save_ids").and_then(Value::as_bool) == Some(true) {
            let hits = search()?;
            let tag = format!("k{k}-q{q}-s{}", sel.as_deref().unwrap_or("none"));
            let dir = self.dir.join("results");
            std::fs::create_dir_all(&dir)?;
            let mut ids = Array2::<i64>::from_elem((q, k), -1);
            let mut scores = Array2::<f32>::from_elem((q, k), f32::NEG_INFINITY);
            for (i, row) in hits.iter().enumerate() {
                for (j, h) in row.iter().enumerate() {
                    ids[[i, j]] = h.id as i64;
                    scores[[i, j]] = h.score;
                }
            }
            ndarray_npy::write_npy(dir.join(format!("topk-{tag}-ids.npy")), &ids)?;
            ndarray_npy::write_npy(dir.join(format!("topk-{tag}-scores.npy")), &scores)?;
        }
        Ok(json!({ "ms": median(&times), "calls": times.len() }))
    }

    fn build_graph(&mut self, cmd: &Value) -> Res<Value> {
        let params = HnswParams {
            m: usize_field(cmd, "m")?,
            ef_construction: usize_field(cmd, "ef_construction")?,
            ef_search: usize_field(cmd, "ef")?,
            seed: field(cmd, "seed")?.as_u64().unwrap_or(0),
            parallel: true,
        };
        let (n, d) = self.corpus.dim();
        let bar = ProgressBar::new(n as u64).with_style(
            ProgressStyle::with_template("topk-hnsw build {bar:40} {pos}/{len} rows {elapsed}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        let data = self
            .corpus
            .as_slice()
            .ok_or("corpus is not row-major")?
            .to_vec();
        let progress = |rows: usize| bar.set_position(rows as u64);
        eprintln!(
            "topk-hnsw: building {n} rows on {} threads",
            rayon::current_num_threads()
        );
        let t = Instant::now();
        let graph = Hnsw::from_rowmajor_with_progress(data, d, Metric::Dot, params, &progress)?;
        let build_s = t.elapsed().as_secs_f64();
        bar.finish_and_clear();
        self.slot_of = self
            .ids
            .iter()
            .enumerate()
            .map(|(slot, &id)| (id, slot as u32))
            .collect();
        self.graph = Some(graph);
        Ok(json!({ "build_s": build_s, "rows": n, "rows_per_s": n as f64 / build_s }))
    }

    /// The exact top `k` ids of every query under filter `sel`, from the index.
    fn exact_truth(&mut self, sel: Option<&str>, k: usize) -> Res<&Vec<Vec<u64>>> {
        let key = format!("{}-{k}", sel.unwrap_or("none"));
        if !self.truth.contains_key(&key) {
            let spec = self
                .filter(sel)?
                .map_or(FilterSpec::None, FilterSpec::Shared);
            let hits = self.index()?.search_batch(self.queries.view(), k, spec)?;
            let ids = hits
                .into_iter()
                .map(|h| h.into_iter().map(|h| h.id).collect())
                .collect();
            self.truth.insert(key.clone(), ids);
        }
        self.truth
            .get(&key)
            .ok_or_else(|| "ground truth missing".into())
    }

    fn graph_search(&mut self, cmd: &Value) -> Res<Value> {
        let k = usize_field(cmd, "k")?;
        let sel = sel_field(cmd);
        let truth = self.exact_truth(sel.as_deref(), k)?.clone();
        let graph = self
            .graph
            .as_ref()
            .ok_or("no graph: send build_graph first")?;
        let slots = self.filter(sel.as_deref())?.map(|f| {
            f.ids()
                .iter()
                .filter_map(|id| self.slot_of.get(id).copied())
                .collect::<SlotFilter>()
        });
        let queries: Vec<&[f32]> = self
            .queries
            .rows()
            .into_iter()
            .map(|r| r.to_slice().ok_or("query row is not contiguous"))
            .collect::<Result<_, _>>()?;
        let mut found: Vec<Vec<u32>> = Vec::new();
        let mut one_pass = || -> Res<()> {
            found.clear();
            for q in &queries {
                let hits = match &slots {
                    None => graph.search(q, k)?,
                    Some(f) => graph.search_filtered(q, k, f)?,
                };
                found.push(hits.iter().map(|h| h.index).collect());
            }
            Ok(())
        };
        let passes = timed_calls(f64_field(cmd, "min_time_s")?, 2, 20, &mut one_pass)?;
        let mut hits = 0usize;
        for (f, t) in found.iter().zip(&truth) {
            hits += f
                .iter()
                .filter(|&&slot| self.ids.get(slot as usize).is_some_and(|id| t.contains(id)))
                .count();
        }
        Ok(json!({
            "ms_per_query": median(&passes) / queries.len() as f64,
            "passes": passes.len(),
            "recall": hits as f64 / (k * queries.len()) as f64,
        }))
    }

    fn mutate(&mut self, cmd: &Value) -> Res<Value> {
        let target = str_field(cmd, "target")?;
        let kind = str_field(cmd, "kind")?;
        let batch = usize_field(cmd, "batch")?.max(1);
        let rows = usize_field(cmd, "rows")?;
        let budget = f64_field(cmd, "budget_s")?;
        let graph_target = match target.as_str() {
            "flat" => false,
            "graph" => true,
            other => return Err(format!("unknown target {other:?}").into()),
        };
        let mut done = 0usize;
        let start = Instant::now();
        while done < rows && start.elapsed().as_secs_f64() < budget {
            let mut b = batch.min(rows - done);
            if kind == "add" {
                let c = self.cursor.get(&target).copied().unwrap_or(0);
                if c + b > self.extra_ids.len() {
                    return Err(format!("out of extra rows at {c} + {b}").into());
                }
                let x = self.extra.slice(s![c..c + b, ..]);
                let ids = &self.extra_ids[c..c + b];
                if graph_target {
                    let graph = self.graph.as_mut().ok_or("no graph")?;
                    for (row, &id) in x.rows().into_iter().zip(ids) {
                        let row = row.to_slice().ok_or("row is not contiguous")?;
                        self.slot_of.insert(id, graph.insert(row)?);
                    }
                } else {
                    self.index.as_mut().ok_or("no index")?.add(ids, x)?;
                }
                self.cursor.insert(target.clone(), c + b);
                self.queue
                    .entry(target.clone())
                    .or_default()
                    .extend(ids.iter().copied());
            } else {
                let queue = self.queue.entry(target.clone()).or_default();
                if queue.is_empty() {
                    break;
                }
                b = b.min(queue.len());
                let ids: Vec<u64> = queue.drain(..b).collect();
                if graph_target {
                    let graph = self.graph.as_mut().ok_or("no graph")?;
                    for id in &ids {
                        let slot = self.slot_of.remove(id).ok_or("removed id has no slot")?;
                        graph.mark_deleted(slot)?;
                    }
                } else {
                    self.index.as_mut().ok_or("no index")?.remove(&ids);
                }
            }
            done += b;
        }
        let secs = start.elapsed().as_secs_f64();
        Ok(json!({ "rows": done, "s": secs, "rows_per_s": done as f64 / secs }))
    }

    fn end_round(&mut self, cmd: &Value) -> Res<Value> {
        let target = str_field(cmd, "target")?;
        self.queue.remove(&target);
        if target != "flat" {
            return Ok(json!({ "compact_s": null }));
        }
        let index = self.index.as_mut().ok_or("no index")?;
        let t = Instant::now();
        index.compact();
        Ok(json!({ "compact_s": t.elapsed().as_secs_f64() }))
    }
}

// ---- persist ---------------------------------------------------------------

/// A fixed, cheap pseudo-random stream (splitmix64).
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A value in [-1, 1).
    fn value(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// Drops `path`'s pages from the page cache (`dd iflag=nocache count=0`:
/// `posix_fadvise(DONTNEED)` over the whole file, no privileges needed).
fn drop_cache(path: &Path) -> Res<()> {
    let status = Command::new("dd")
        .arg(format!("if={}", path.display()))
        .args(["iflag=nocache", "count=0", "status=none"])
        .status()?;
    if !status.success() {
        return Err(format!("dd iflag=nocache on {} failed: {status}", path.display()).into());
    }
    Ok(())
}

/// Seconds to `cat path > /dev/null`.
fn cat(path: &Path) -> Res<f64> {
    let t = Instant::now();
    let status = Command::new("cat")
        .arg(path)
        .stdout(Stdio::null())
        .status()?;
    if !status.success() {
        return Err(format!("cat {} failed: {status}", path.display()).into());
    }
    Ok(t.elapsed().as_secs_f64())
}

/// Seconds to read `path` through a 1 MiB buffer.
fn read_loop(path: &Path) -> Res<f64> {
    let t = Instant::now();
    let mut file = File::open(path)?;
    let mut buf = vec![0u8; 1 << 20];
    while file.read(&mut buf)? > 0 {}
    Ok(t.elapsed().as_secs_f64())
}

/// Seconds to write `bytes` bytes to `path` in 1 MiB chunks, then fsync.
fn raw_write(path: &Path, bytes: u64, source: &[u8]) -> Res<f64> {
    let t = Instant::now();
    let mut file = File::create(path)?;
    let mut left = bytes;
    let mut at = 0usize;
    while left > 0 {
        let n = (left as usize).min(1 << 20);
        if at + n > source.len() {
            at = 0;
        }
        file.write_all(&source[at..at + n])?;
        at += n;
        left -= n as u64;
    }
    file.sync_all()?;
    Ok(t.elapsed().as_secs_f64())
}

fn persist(dir: &Path, n: usize, d: usize, rounds: usize) -> Res<()> {
    std::fs::create_dir_all(dir)?;
    let mut rng = SplitMix(0x19);
    // Built in chunks so that the rows are never held twice.
    let chunk = 10_000;
    let bar = ProgressBar::new(n as u64).with_style(
        ProgressStyle::with_template("building {bar:40} {pos}/{len} rows {elapsed}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let t = Instant::now();
    let mut index = Index::new(d, Metric::Dot, IndexBackend::Cpu)?;
    for start in (0..n).step_by(chunk) {
        let m = chunk.min(n - start);
        let rows = Array2::from_shape_simple_fn((m, d), || rng.value());
        // An odd multiplier is a bijection modulo 2^63: distinct random-looking ids.
        let ids: Vec<u64> = (start..start + m)
            .map(|i| (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) & MAX_ID)
            .collect();
        index.add(&ids, rows.view())?;
        bar.set_position((start + m) as u64);
    }
    bar.finish_and_clear();
    let build_s = t.elapsed().as_secs_f64();
    eprintln!("persist: built {n} x {d} in {build_s:.1} s");
    let query: Vec<f32> = (0..d).map(|_| rng.value()).collect();
    let before = index.search(&query, 10, None)?;
    let file = dir.join("index.topk");
    let raw = dir.join("raw.bin");
    let source: Vec<u8> = (0..64 << 20).map(|_| (rng.next() >> 56) as u8).collect();
    let mut identical = true;
    let mut out = Vec::new();
    let mut file_bytes = 0;
    for round in 0..rounds {
        eprintln!("persist: round {} of {rounds}", round + 1);
        let t = Instant::now();
        index.save(&file)?;
        let save_s = t.elapsed().as_secs_f64();
        file_bytes = std::fs::metadata(&file)?.len();
        let raw_write_s = raw_write(&raw, file_bytes, &source)?;
        drop(index);
        drop_cache(&file)?;
        let cat_cold_s = cat(&file)?;
        drop_cache(&file)?;
        let read_cold_s = read_loop(&file)?;
        drop_cache(&file)?;
        let t = Instant::now();
        let opened = Index::open(&file, IndexBackend::Cpu)?;
        let open_cold_s = t.elapsed().as_secs_f64();
        identical &= opened.search(&query, 10, None)? == before;
        drop(opened);
        let cat_warm_s = cat(&file)?;
        let read_warm_s = read_loop(&file)?;
        let t = Instant::now();
        index = Index::open(&file, IndexBackend::Cpu)?;
        let open_warm_s = t.elapsed().as_secs_f64();
        out.push(json!({
            "save_s": save_s,
            "raw_write_s": raw_write_s,
            "cat_cold_s": cat_cold_s,
            "read_cold_s": read_cold_s,
            "open_cold_s": open_cold_s,
            "cat_warm_s": cat_warm_s,
            "read_warm_s": read_warm_s,
            "open_warm_s": open_warm_s,
        }));
    }
    std::fs::remove_file(&file)?;
    std::fs::remove_file(&raw)?;
    println!(
        "{}",
        json!({
            "n": n,
            "d": d,
            "file_bytes": file_bytes,
            "build_s": build_s,
            "identical": identical,
            "rounds": out,
        })
    );
    Ok(())
}

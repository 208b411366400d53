//! The harness's guarantees through its library: a wrong backend is caught by
//! the gate and never timed; results are written row by row and joined with
//! anchors; plots are drawn.

use std::cell::Cell;

use ndarray::ArrayView2;
use topk_bench::config::{Backend, RunConfig, TimedPath};
use topk_bench::gate::Reference;
use topk_bench::join;
use topk_bench::record::{read_jsonl, Record, ResultsWriter, CSV_HEADER};
use topk_bench::run::{measure, HostSearch, Plan, Searcher};
use topk_core::{Metric, Neighbor, Retriever};

/// Wraps the CPU backend and flips one bit of the score at rank `bad_rank`.
struct OffByOneUlp {
    inner: topk_cpu::CpuRetriever,
    bad_rank: usize,
}

impl Retriever for OffByOneUlp {
    fn backend(&self) -> &'static str {
        "broken"
    }
    fn len(&self) -> usize {
        self.inner.len()
    }
    fn dim(&self) -> usize {
        self.inner.dim()
    }
    fn metric(&self) -> Metric {
        self.inner.metric()
    }
    fn search_into(&self, q: &[f32], k: usize, out: &mut Vec<Neighbor>) -> topk_core::Result<()> {
        self.inner.search_into(q, k, out)?;
        if let Some(n) = out.get_mut(self.bad_rank) {
            n.score = f32::from_bits(n.score.to_bits() ^ 1);
        }
        Ok(())
    }
}

/// Counts the calls that reach the backend.
struct Counting<'a> {
    inner: HostSearch<'a>,
    calls: &'a Cell<usize>,
}

impl Searcher for Counting<'_> {
    fn answer(
        &mut self,
        first: usize,
        queries: ArrayView2<'_, f32>,
        k: usize,
        out: &mut Vec<Vec<Neighbor>>,
    ) -> topk_bench::Result<()> {
        self.calls.set(self.calls.get() + 1);
        self.inner.answer(first, queries, k, out)
    }
}

fn setup(n: usize, d: usize) -> (ndarray::Array2<f32>, ndarray::Array2<f32>) {
    (
        topk_io::synth::gaussian_rows(n, d, 5, true),
        topk_io::synth::gaussian_queries(8, d, 5, true),
    )
}

fn cfg(n: usize, d: usize, k: usize, batch: usize) -> RunConfig {
    RunConfig {
        n,
        d,
        k,
        trials: 7,
        warmup: 2,
        seed: 5,
        metric: Metric::Dot,
        backend: Backend::Cpu,
        batch,
    }
}

#[test]
fn a_wrong_backend_is_caught_and_not_timed() {
    let (corpus, queries) = setup(400, 20);
    let oracle = topk_cpu::Oracle::new(corpus.view(), Metric::Dot).unwrap();
    let reference = Reference::compute("oracle", &oracle, queries.view(), 3, 10).unwrap();
    let refs = [&reference];
    for batch in [1, 4] {
        let c = cfg(400, 20, 10, batch);
        let broken = OffByOneUlp {
            inner: topk_cpu::CpuRetriever::new(corpus.view(), Metric::Dot).unwrap(),
            bad_rank: 6,
        };
        let calls = Cell::new(0);
        let mut s = Counting {
            inner: HostSearch::new(&broken),
            calls: &calls,
        };
        let plan = Plan {
            cfg: &c,
            path: TimedPath::Cpu,
            queries: queries.view(),
            refs: &refs,
            data: "gaussian",
            bandwidth: None,
            approximate: false,
        };
        let rec = measure(&plan, &mut s);
        assert_eq!(rec.correct, Some(false));
        assert!(rec.median_ms.is_none() && rec.min_ms.is_none() && rec.qps.is_none());
        let err = rec.error.unwrap();
        assert!(err.contains("rank 6"), "{err}");
        // Only the gate ran (each of the 3 referenced queries on its own, or
        // one batch call): no warm-up, no trials.
        let gate_calls = if batch == 1 { 3 } else { 1 };
        assert_eq!(calls.get(), gate_calls, "batch {batch}");
    }
}

#[test]
fn a_correct_backend_is_gated_then_timed() {
    let (corpus, queries) = setup(400, 20);
    let oracle = topk_cpu::Oracle::new(corpus.view(), Metric::Dot).unwrap();
    let reference = Reference::compute("oracle", &oracle, queries.view(), 3, 50).unwrap();
    let refs = [&reference];
    let cpu = topk_cpu::CpuRetriever::new(corpus.view(), Metric::Dot).unwrap();
    let c = cfg(400, 20, 10, 1);
    let calls = Cell::new(0);
    let mut s = Counting {
        inner: HostSearch::new(&cpu),
        calls: &calls,
    };
    let plan = Plan {
        cfg: &c,
        path: TimedPath::Cpu,
        queries: queries.view(),
        refs: &refs,
        data: "gaussian",
        bandwidth: Some(10e9),
        approximate: false,
    };
    let rec = measure(&plan, &mut s);
    assert_eq!(rec.correct, Some(true), "{:?}", rec.error);
    // 3 gate queries (K = 10 checked against a K = 50 reference), 2 warm-up, 7 trials.
    assert_eq!(calls.get(), 3 + 2 + 7);
    assert_eq!(rec.trials, 7);
    let floor = rec.floor_ms.unwrap();
    assert!((floor - 400.0 * 20.0 * 4.0 / 10e9 * 1e3).abs() < 1e-12);
}

#[test]
fn no_reference_means_not_correct() {
    let (corpus, queries) = setup(50, 4);
    let cpu = topk_cpu::CpuRetriever::new(corpus.view(), Metric::Dot).unwrap();
    let c = cfg(50, 4, 3, 1);
    let plan = Plan {
        cfg: &c,
        path: TimedPath::Cpu,
        queries: queries.view(),
        refs: &[],
        data: "gaussian",
        bandwidth: None,
        approximate: false,
    };
    let rec = measure(&plan, &mut HostSearch::new(&cpu));
    assert_eq!(rec.correct, Some(false));
    assert!(rec.median_ms.is_none());
}

fn rec(backend: &str, path: &str, n: usize, k: usize, ms: f64) -> Record {
    Record {
        n,
        d: 64,
        k,
        batch: 1,
        metric: "dot".into(),
        backend: backend.into(),
        path: path.into(),
        trials: 20,
        warmup: 3,
        seed: 42,
        median_ms: Some(ms),
        min_ms: Some(ms * 0.9),
        max_ms: Some(ms * 1.2),
        p90_ms: Some(ms * 1.1),
        correct: if backend == "torch" { None } else { Some(true) },
        recall: None,
        floor_ms: if backend == "torch" {
            None
        } else {
            Some(n as f64 * 1e-6)
        },
        bandwidth_gbs: None,
        qps: Some(1e3 / ms),
        gate: None,
        data: Some("gaussian".into()),
        error: None,
    }
}

#[test]
fn results_are_written_row_by_row_and_joined_with_anchors() {
    let dir = tempfile::tempdir().unwrap();
    // An earlier run's results stay whole until this run finishes.
    std::fs::write(dir.path().join("results.jsonl"), "earlier\n").unwrap();
    let mut w = ResultsWriter::create(dir.path(), false).unwrap();
    let ours = [
        rec("cuda", "resident", 10_000, 8, 0.02),
        rec("cuda", "cpu_roundtrip", 10_000, 8, 0.3),
        rec("cuda", "resident", 100_000, 8, 0.06),
    ];
    for (i, r) in ours.iter().enumerate() {
        w.write(r).unwrap();
        // Every finished row is on disk before the next starts (an
        // interrupted campaign keeps it), without dropping the writer.
        let on_disk = read_jsonl(&dir.path().join("results.jsonl.partial")).unwrap();
        assert_eq!(on_disk.len(), i + 1);
        let csv = std::fs::read_to_string(dir.path().join("results.csv.partial")).unwrap();
        assert_eq!(csv.lines().count(), i + 2);
        assert_eq!(csv.lines().next(), Some(CSV_HEADER));
        let earlier = std::fs::read_to_string(dir.path().join("results.jsonl")).unwrap();
        assert_eq!(earlier, "earlier\n");
    }
    w.finish().unwrap();
    assert_eq!(
        read_jsonl(&dir.path().join("results.jsonl")).unwrap().len(),
        3
    );
    assert!(!dir.path().join("results.jsonl.partial").exists());
    assert!(!dir.path().join("results.csv.partial").exists());
    std::fs::create_dir_all(dir.path().join("anchors")).unwrap();
    let torch = [
        rec("torch", "resident", 10_000, 8, 0.11),
        rec("torch", "resident", 100_000, 8, 0.05),
    ];
    let lines: Vec<String> = torch.iter().map(Record::to_line).collect();
    std::fs::write(
        dir.path().join("anchors/torch.jsonl"),
        format!("some log line\n{}\n", lines.join("\n")),
    )
    .unwrap();

    let rows = join::join_dir(dir.path()).unwrap();
    assert_eq!(rows.len(), 2);
    let small = &rows[0];
    assert!((small.speedup_vs("torch").unwrap() - 5.5).abs() < 1e-9);
    assert!((small.speedup_vs(join::CPU_ROUNDTRIP).unwrap() - 15.0).abs() < 1e-9);
    assert!(
        rows[1].speedup_vs("torch").unwrap() < 1.0,
        "a loss is kept, not hidden"
    );

    let csv = std::fs::read_to_string(dir.path().join("joined.csv")).unwrap();
    let mut lines = csv.lines();
    let head: Vec<&str> = lines.next().unwrap().split(',').collect();
    for col in [
        "topk_ms",
        "torch_ms",
        "cpu_roundtrip_ms",
        "speedup_vs_torch",
        "ours_over_floor",
    ] {
        assert!(head.contains(&col), "{col} in {head:?}");
    }
    let first: Vec<&str> = lines.next().unwrap().split(',').collect();
    assert_eq!(first.len(), head.len());
    let at = |c: &str| first[head.iter().position(|h| *h == c).unwrap()];
    assert_eq!(at("n"), "10000");
    assert_eq!(at("ours_over_floor"), "2");

    let md = topk_bench::table::headline(&rows, &Default::default(), "x");
    assert!(
        md.contains("torch.topk is faster than topk in 1 configuration(s): N=100k D=64 K=8"),
        "{md}"
    );
}

#[test]
fn plots_are_drawn_as_png_and_svg() {
    let dir = tempfile::tempdir().unwrap();
    let mut records = Vec::new();
    for (i, n) in [10_000usize, 50_000, 100_000].into_iter().enumerate() {
        for k in [8, 100] {
            let ms = 0.02 * (i + 1) as f64;
            records.push(rec("cuda", "resident", n, k, ms));
            records.push(rec("torch", "resident", n, k, ms * 3.0));
            records.push(rec("cuda", "cpu_roundtrip", n, k, ms * 20.0));
        }
        // A batch of 16: ours, torch and the CPU's host batch.
        for (backend, scale) in [("cuda", 1.0), ("torch", 2.0), ("cpu", 40.0)] {
            let mut r = rec(backend, "resident", n, 100, 0.1 * (i + 1) as f64 * scale);
            r.batch = 16;
            records.push(r);
        }
    }
    let rows = join::join(&records);
    let files = topk_bench::plot::plot_dir(dir.path(), &rows).unwrap();
    // latency_k8, latency_k100, batch_q16_k100, speedup_heatmap, floor —
    // each as PNG and SVG.
    assert_eq!(files.len(), 10);
    let batch = std::fs::read_to_string(dir.path().join("plots/batch_q16_k100.svg")).unwrap();
    assert!(
        batch.contains("Q = 16") && batch.contains("torch") && batch.contains("topk_cpu"),
        "the batch plot names its size and contenders"
    );
    for f in &files {
        let len = std::fs::metadata(f).unwrap().len();
        assert!(len > 1000, "{} is {len} bytes", f.display());
    }
    let svg = std::fs::read_to_string(dir.path().join("plots/speedup_heatmap.svg")).unwrap();
    assert!(
        svg.contains("3.00×"),
        "the cells carry their speedup as text"
    );
}

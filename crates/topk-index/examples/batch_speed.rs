//! Times the `cpu` backend's searches of an index: single queries, a batch,
//! a batch under a shared filter of half the ids, a batch of up to 200
//! queries under a filter of their own each, the first batch (which
//! builds the certified path's row state), and a batch right after 1,000
//! rows are appended (which extends it).
//!
//! `cargo run --release -p topk-index --example batch_speed -- [N] [D] [Q] [K]`

use std::time::Instant;

use ndarray::Array2;
use topk_core::Metric;
use topk_index::{Filter, FilterSpec, Index, IndexBackend};
use topk_testkit::corpora::Rng;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse())
        .collect::<Result<_, _>>()?;
    let n = args.first().copied().unwrap_or(100_000);
    let d = args.get(1).copied().unwrap_or(384);
    let q = args.get(2).copied().unwrap_or(1000);
    let k = args.get(3).copied().unwrap_or(10);
    let mut rng = Rng::new(17);
    let rows = Array2::from_shape_simple_fn((n, d), || rng.unit());
    let queries = Array2::from_shape_simple_fn((q, d), || rng.unit());
    let more = Array2::from_shape_simple_fn((1000, d), || rng.unit());
    let mut index = Index::from_rows(rows.view(), Metric::Dot, IndexBackend::Cpu)?;
    let half = Filter::new((0..n as u64).filter(|i| i % 2 == 0));
    let secs = |t: Instant| t.elapsed().as_secs_f64();

    let t = Instant::now();
    index.search_batch(queries.view(), k, FilterSpec::None)?;
    println!(
        "N={n} D={d} K={k}: first batch of {q}: {:.1} ms",
        secs(t) * 1e3
    );
    let best = best_of(3, || {
        index.search_batch(queries.view(), k, FilterSpec::None)
    })?;
    println!(
        "  batch of {q}: {:.1} ms, {:.0} queries/s",
        best * 1e3,
        q as f64 / best
    );
    let best = best_of(3, || {
        index.search_batch(queries.view(), k, FilterSpec::Shared(&half))
    })?;
    println!("  batch of {q}, half the ids allowed: {:.1} ms", best * 1e3);
    // A filter per query, each allowing half the ids (a different half for
    // each of 8 offsets), over the first 200 queries: 200 filters of N/2 ids.
    let qp = q.min(200);
    let per: Vec<Filter> = (0..qp)
        .map(|i| Filter::new((0..n as u64).filter(|x| (x / 8 + x + i as u64).is_multiple_of(2))))
        .collect();
    let sub = queries.slice(ndarray::s![..qp, ..]);
    let best = best_of(3, || index.search_batch(sub, k, FilterSpec::PerQuery(&per)))?;
    println!(
        "  batch of {qp}, a filter of half the ids per query: {:.1} ms, {:.0} queries/s",
        best * 1e3,
        qp as f64 / best
    );
    let best = best_of(5, || {
        for row in queries.rows().into_iter().take(16) {
            std::hint::black_box(index.search(&row.to_vec(), k, None)?);
        }
        Ok::<_, topk_index::IndexError>(())
    })?;
    println!("  single query: {:.1} us", best / 16.0 * 1e6);
    let ids: Vec<u64> = (n as u64..n as u64 + 1000).collect();
    let t = Instant::now();
    index.add(&ids, more.view())?;
    let add = secs(t);
    let t = Instant::now();
    index.search_batch(queries.view(), k, FilterSpec::None)?;
    println!(
        "  add 1,000 rows: {:.1} ms, then a batch of {q}: {:.1} ms",
        add * 1e3,
        secs(t) * 1e3
    );
    Ok(())
}

/// The fastest of `rounds` runs of `f`, in seconds.
fn best_of<T, E>(rounds: usize, mut f: impl FnMut() -> Result<T, E>) -> Result<f64, E> {
    let mut best = f64::MAX;
    for _ in 0..rounds {
        let t = Instant::now();
        std::hint::black_box(f()?);
        best = best.min(t.elapsed().as_secs_f64());
    }
    Ok(best)
}

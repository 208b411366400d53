//! Where a filtered search should stop walking the graph: for a sweep of
//! filter selectivities, the single-thread time per query and recall@k of
//! the filtered walk against exact scoring of the allowed rows, on a corpus
//! read from disk (default: the MiniLM 20k set, inner product).
//!
//! Each query gets its own seeded random allow-list of `selectivity · N`
//! slots; both modes see the same lists. The exact mode is the ground truth
//! (it scores every allowed row with the canonical score), so its recall is 1.
//! Per selectivity `s` it also prints the walk-cost factor the two times
//! imply, `c = walk · s² · N / (exact · ef)`: the walk scores about
//! `c · ef / s` rows where exact scoring scores `s · N`, so the two cost the
//! same at `allowed = sqrt(c · ef · N)`. The last line interpolates the
//! crossover selectivity `s*` (log-linearly in `s`, between the two sweep
//! points where the faster mode changes) and the `c = s*² · N / ef` it
//! implies; `DEFAULT_FILTER_WALK_COST` is set from it.
//!
//! ```text
//! cargo run --release -p topk-hnsw --example hnsw_filter_sweep -- --dir ../shared/data/minilm-docs-20k
//! ```

use std::path::PathBuf;
use std::time::Instant;

use clap::Parser;
use topk_core::{Metric, Neighbor};
use topk_hnsw::{recall_at_k, Hnsw, HnswParams, SlotFilter, SplitMix64};

#[derive(Parser)]
#[command(about = "filtered HNSW walk vs exact scoring of the allowed rows")]
struct Cli {
    /// Holds corpus.npy and queries.npy.
    #[arg(long)]
    dir: PathBuf,
    /// Metric of the index.
    #[arg(long, default_value = "dot")]
    metric: Metric,
    #[arg(long, default_value_t = 10)]
    k: usize,
    #[arg(long, default_value_t = 64)]
    ef: usize,
    /// Rows used (the first ones of corpus.npy; 0: all).
    #[arg(long, default_value_t = 0)]
    n: usize,
    /// Queries used (the first ones of queries.npy).
    #[arg(long, default_value_t = 500)]
    queries: usize,
    /// Timed passes over the queries per mode (the best is reported).
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    /// Selectivities (allowed fraction of the rows), comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "0.5,0.4,0.3,0.25,0.2,0.15,0.1,0.05,0.02,0.01,0.005,0.002"
    )]
    selectivity: Vec<f64>,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let cli = Cli::parse();
    let corpus = topk_io::read_matrix(cli.dir.join("corpus.npy"))?;
    let queries = topk_io::read_matrix(cli.dir.join("queries.npy"))?;
    let corpus = if cli.n > 0 && cli.n < corpus.nrows() {
        corpus.slice(ndarray::s![..cli.n, ..]).to_owned()
    } else {
        corpus
    };
    let (n, dim) = corpus.dim();
    let nq = cli.queries.min(queries.nrows());
    let params = HnswParams {
        seed: 11,
        ..HnswParams::default()
    };
    let t = Instant::now();
    let mut index = Hnsw::new(corpus.view(), cli.metric, params)?;
    eprintln!(
        "built {n} × {dim} ({}) in {:.1} s, m = {}, ef_construction = {}",
        cli.metric,
        t.elapsed().as_secs_f64(),
        params.m,
        params.ef_construction
    );
    let qs: Vec<Vec<f32>> = (0..nq).map(|i| queries.row(i).to_vec()).collect();

    println!(
        "selectivity | allowed | walk µs/query | walk recall@{} | exact µs/query | faster | c",
        cli.k
    );
    let mut crossover = 0.0_f64;
    // (selectivity, ln(walk / exact)) per point.
    let mut ratios = Vec::new();
    for &s in &cli.selectivity {
        let allowed = ((s * n as f64).round() as usize).max(1);
        let mut rng = SplitMix64::new(0xF1_17E5 ^ allowed as u64);
        let filters: Vec<SlotFilter> = (0..nq).map(|_| sample(n, allowed, &mut rng)).collect();
        let run = |index: &Hnsw| -> Result<Timed, Box<dyn std::error::Error>> {
            let mut best = f64::INFINITY;
            let mut res = Vec::new();
            for _ in 0..cli.repeats.max(1) {
                res.clear();
                let t = Instant::now();
                for (q, f) in qs.iter().zip(&filters) {
                    let mut out = Vec::with_capacity(cli.k);
                    index.search_filtered_with_ef(q, cli.k, cli.ef, f, &mut out)?;
                    res.push(out);
                }
                best = best.min(t.elapsed().as_secs_f64() * 1e6 / nq as f64);
            }
            Ok((best, res))
        };
        index.set_filter_walk_cost(0.0)?;
        let (walk_us, walk) = run(&index)?;
        index.set_filter_walk_cost(f64::INFINITY)?;
        let (exact_us, exact) = run(&index)?;
        let truth: Vec<Vec<u32>> = exact
            .iter()
            .map(|r| r.iter().map(|x| x.index).collect())
            .collect();
        let k = cli.k.min(allowed);
        let recall = recall_at_k(&walk, &truth, k)?;
        let faster = if exact_us < walk_us { "exact" } else { "walk" };
        if exact_us < walk_us {
            crossover = crossover.max(s);
        }
        let c = walk_us * s * s * n as f64 / (exact_us * cli.ef as f64);
        ratios.push((s, (walk_us / exact_us).ln()));
        println!(
            "{s} | {allowed} | {walk_us:.1} | {recall:.4} | {exact_us:.1} | {faster} | {c:.1}"
        );
        println!(
            "HNSW_FILTER_SWEEP_JSON {{\"selectivity\":{s},\"allowed\":{allowed},\"walk_us\":{walk_us:.2},\"walk_recall\":{recall:.5},\"exact_us\":{exact_us:.2},\"c\":{c:.3},\"k\":{},\"ef\":{},\"n\":{n},\"dim\":{dim}}}",
            cli.k, cli.ef
        );
    }
    ratios.sort_by(|a, b| b.0.total_cmp(&a.0));
    println!("largest selectivity of the sweep where exact scoring is faster: {crossover}");
    // The first pair, from the densest filter down, where the walk stops winning.
    let cross = ratios
        .windows(2)
        .find(|w| w[0].1 <= 0.0 && w[1].1 > 0.0)
        .map(|w| {
            let (ls0, ls1) = (w[0].0.ln(), w[1].0.ln());
            let t = w[0].1 / (w[0].1 - w[1].1);
            (ls0 + t * (ls1 - ls0)).exp()
        });
    match cross {
        Some(s) => println!(
            "crossover s* = {s:.3} ({:.0} allowed rows): c = s*² · N / ef = {:.1}",
            s * n as f64,
            s * s * n as f64 / cli.ef as f64
        ),
        None => println!("no crossover inside the sweep"),
    }
    Ok(())
}

/// Best time per query (µs) and the results of one mode.
type Timed = (f64, Vec<Vec<Neighbor>>);

/// A uniform random subset of `count` slots of `0..n` (partial Fisher–Yates).
fn sample(n: usize, count: usize, rng: &mut SplitMix64) -> SlotFilter {
    let mut slots: Vec<u32> = (0..n as u32).collect();
    for i in 0..count.min(n) {
        let j = i + (rng.next_u64() % (n - i) as u64) as usize;
        slots.swap(i, j);
    }
    slots[..count.min(n)].iter().copied().collect()
}

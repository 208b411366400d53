//! Times filtered searches of the `cpu` backend across filter fractions, on
//! either side of `SPARSE_FRACTION` (gathered below, masked above), against
//! the unfiltered search of the same index.
//!
//! `cargo run --release -p topk-index --example filter_sweep -- [N] [D] [REPEATS]`

use std::time::Instant;

use ndarray::Array2;
use topk_core::Metric;
use topk_index::{Filter, Index, IndexBackend, SPARSE_FRACTION};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse())
        .collect::<Result<_, _>>()?;
    let n = args.first().copied().unwrap_or(200_000);
    let d = args.get(1).copied().unwrap_or(128);
    let repeats = args.get(2).copied().unwrap_or(20);
    // A fixed, cheap pseudo-random corpus (splitmix64 values in [-1, 1)).
    let mut state = 0x1234_5678_u64;
    let mut next = move || {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    let rows =
        Array2::from_shape_simple_fn((n, d), || (next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0);
    let index = Index::from_rows(rows.view(), Metric::Dot, IndexBackend::Cpu)?;
    let query: Vec<f32> = rows.row(0).to_vec();
    let time = |filter: Option<&Filter>| -> Result<f64, Box<dyn std::error::Error>> {
        index.search(&query, 100, filter)?;
        let t = Instant::now();
        for _ in 0..repeats {
            index.search(&query, 100, filter)?;
        }
        Ok(t.elapsed().as_secs_f64() * 1e3 / repeats as f64)
    };
    let full = time(None)?;
    println!("N = {n}, D = {d}, K = 100, threshold {SPARSE_FRACTION}");
    println!("unfiltered: {full:.3} ms");
    for percent in [0.1, 1.0, 5.0, 10.0, 10.5, 20.0, 30.0, 50.0, 100.0] {
        let every = (100.0 / percent) as u64;
        let mut r = 0x9999_u64;
        let f = Filter::new((0..n as u64).filter(|_| {
            r = r.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            (r >> 33).is_multiple_of(every)
        }));
        let ms = time(Some(&f))?;
        let path = if f.len() as f64 <= SPARSE_FRACTION * n as f64 {
            "gather"
        } else {
            "mask"
        };
        println!(
            "{percent:>5} % ({:>7} ids, {path:>6}): {ms:.3} ms = {:.3} x unfiltered",
            f.len(),
            ms / full
        );
    }
    Ok(())
}

//! Times filtered searches of the `cpu` backend across filter fractions, on
//! either side of `SPARSE_FRACTION` (gathered below, masked above), against
//! the unfiltered search of the same index, with filter ids resolved to rows
//! by hash lookups, by a merge with the id-sorted rows, and by the index's
//! automatic choice (`MERGE_FRACTION`) side by side.
//!
//! `cargo run --release -p topk-index --example filter_sweep -- [N] [D] [REPEATS]`

use std::time::Instant;

use ndarray::Array2;
use topk_core::Metric;
use topk_index::{Filter, FilterResolution, Index, IndexBackend, MERGE_FRACTION, SPARSE_FRACTION};

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
    let time =
        |index: &Index, filter: Option<&Filter>| -> Result<f64, Box<dyn std::error::Error>> {
            index.search(&query, 100, filter)?;
            let t = Instant::now();
            for _ in 0..repeats {
                index.search(&query, 100, filter)?;
            }
            Ok(t.elapsed().as_secs_f64() * 1e3 / repeats as f64)
        };
    let full = time(&index, None)?;
    let modes = [
        FilterResolution::Lookup,
        FilterResolution::Merge,
        FilterResolution::Auto,
    ];
    let indexes: Vec<Index> = modes
        .iter()
        .map(|&m| index.clone().with_filter_resolution(m))
        .collect();
    println!(
        "N = {n}, D = {d}, K = 100, gather at or below {SPARSE_FRACTION}, merge at or above {MERGE_FRACTION}"
    );
    println!("unfiltered: {full:.3} ms; filtered, as a multiple of unfiltered:");
    println!("    % |     ids |   path | lookup |  merge |   auto");
    for percent in [0.1, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 90.0, 99.0, 100.0] {
        let per_mille = (percent * 10.0) as u64;
        let mut r = 0x9999_u64;
        let f = Filter::new((0..n as u64).filter(|_| {
            r = r.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            (r >> 33) % 1000 < per_mille
        }));
        let path = if f.len() as f64 <= SPARSE_FRACTION * n as f64 {
            "gather"
        } else {
            "mask"
        };
        let mut line = format!("{percent:>5} | {:>7} | {path:>6}", f.len());
        for index in &indexes {
            let ms = time(index, Some(&f))?;
            line.push_str(&format!(" | {:>6.3}", ms / full));
        }
        println!("{line}");
    }
    Ok(())
}

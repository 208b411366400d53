use topk_core::{Metric, Retriever};

use super::*;
use crate::synth;

fn params() -> HnswParams {
    HnswParams {
        m: 8,
        ef_construction: 40,
        ..HnswParams::default()
    }
}

fn build(data: &[f32], dim: usize, metric: Metric, schedule: BatchSchedule) -> Hnsw {
    Hnsw::build_batched(data.to_vec(), dim, metric, params(), schedule).unwrap()
}

#[test]
fn rounds_grow_with_the_graph_within_the_schedule() {
    let s = BatchSchedule {
        divisor: 4,
        max_batch: 100,
    };
    for (inserted, round) in [(1, 1), (3, 1), (4, 1), (8, 2), (401, 100), (10_000, 100)] {
        assert_eq!(s.round(inserted), round, "{inserted} in the graph");
    }
    for bad in [
        BatchSchedule {
            divisor: 0,
            max_batch: 1,
        },
        BatchSchedule {
            divisor: 1,
            max_batch: 0,
        },
    ] {
        let e = Hnsw::build_batched(vec![0.0; 4], 2, Metric::L2, params(), bad).unwrap_err();
        assert!(
            matches!(e, HnswError::InvalidParameter { value: 0, .. }),
            "{e}"
        );
    }
}

#[test]
fn lists_respect_capacities_and_every_layer_is_well_formed() {
    let (n, dim) = (3000, 6);
    let data = synth::gaussian_clusters(n, dim, 8, 0.4, 11);
    let index = build(&data, dim, Metric::Cosine, BatchSchedule::default());
    let g = &index.graph;
    assert!(g.max_level >= 2, "the test wants two upper layers");
    assert_eq!(
        usize::from(g.links.layout.levels[g.entry as usize]),
        g.max_level
    );
    let levels = draw_levels(n, &params());
    assert_eq!(
        g.links.layout.levels, levels,
        "levels as the insertion build draws them"
    );
    for node in 0..n as u32 {
        for level in 0..=g.links.layout.level(node) {
            let list = g.links.neighbours(node, level);
            assert!(list.len() <= g.links.layout.cap(level));
            assert!(!list.contains(&node), "{node} links to itself on {level}");
            for &e in list {
                assert!(g.links.layout.level(e) >= level, "{node} -> {e} on {level}");
            }
            let mut sorted = list.to_vec();
            sorted.sort_unstable();
            sorted.dedup();
            assert_eq!(sorted.len(), list.len(), "duplicate link of {node}");
            assert!(level > 0 || !list.is_empty(), "{node} has no layer-0 link");
        }
    }
}

#[test]
fn the_graph_does_not_depend_on_the_thread_count() {
    let (n, dim) = (2500, 8);
    let data = synth::gaussian_clusters(n, dim, 16, 0.5, 7);
    let reference = build(&data, dim, Metric::L2, BatchSchedule::default()).to_bytes();
    for threads in [1, 3] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        let bytes = pool.install(|| build(&data, dim, Metric::L2, BatchSchedule::default()));
        assert!(
            bytes.to_bytes() == reference,
            "{threads} threads changed the graph"
        );
    }
    // The schedule is a parameter of the graph: another one builds another
    // (valid) graph, the same one every time.
    let other = BatchSchedule {
        divisor: 1,
        max_batch: 64,
    };
    let a = build(&data, dim, Metric::L2, other).to_bytes();
    assert!(a == build(&data, dim, Metric::L2, other).to_bytes());
}

#[test]
fn tiny_and_degenerate_corpora_build_and_search() {
    // One row, two rows, and 300 copies of one row (every score tied).
    for (n, same) in [(1, false), (2, false), (300, true)] {
        let dim = 3;
        let data: Vec<f32> = (0..n * dim)
            .map(|i| if same { 1.0 } else { i as f32 })
            .collect();
        let index = build(&data, dim, Metric::L2, BatchSchedule::default());
        assert_eq!(index.len(), n);
        let hits = index.search(&data[..dim], n.min(5)).unwrap();
        assert_eq!(hits.len(), n.min(5), "{n} rows");
        // Ties go to the smaller id (§3).
        assert_eq!(hits[0].index, 0);
    }
}

#[test]
fn host_selection_is_the_insertion_heuristic() {
    let (n, dim) = (400, 5);
    let data = synth::gaussian_clusters(n, dim, 4, 0.3, 2);
    let vectors = Vectors::new(data, dim, Metric::Dot);
    let base = 17u32;
    let cands: Vec<u32> = (0..n as u32).filter(|&i| i != base).rev().collect();
    let q = vectors.row_query(base);
    let mut ranked: Vec<Cand> = cands
        .iter()
        .map(|&x| Cand::new(x, vectors.score(q, x)))
        .collect();
    ranked.sort_by_key(|c| std::cmp::Reverse(c.key));
    let mut kept = Vec::new();
    select_neighbours(&vectors, &ranked, 8, &mut kept);
    let ids: Vec<u32> = kept.iter().map(|c| c.id()).collect();
    assert_eq!(select_job(&vectors, base, &cands, 8), ids);
    assert!(!ids.is_empty() && ids.len() <= 8);
    // Fewer candidates than the capacity are all kept, best first.
    let few = select_job(&vectors, base, &cands[..3], 8);
    let mut want: Vec<u32> = cands[..3].to_vec();
    want.sort_by_key(|&x| std::cmp::Reverse(Cand::new(x, vectors.score(q, x)).key));
    assert_eq!(few, want);
}

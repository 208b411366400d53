use topk_core::Metric;

use super::*;
use crate::synth;

fn corpus(n: usize, dim: usize) -> Vec<f32> {
    synth::gaussian_clusters(n, dim, 8, 0.4, 11)
}

fn params() -> HnswParams {
    HnswParams {
        m: 8,
        ef_construction: 40,
        ..HnswParams::default()
    }
}

#[test]
fn graph_does_not_depend_on_batch_size_or_threads() {
    let (n, dim) = (1500, 12);
    let data = corpus(n, dim);
    let cpu = CpuRetriever::from_rowmajor(data.clone(), dim, Metric::L2).unwrap();
    let build = |batch_rows: usize, host_prefix: usize| {
        let schedule = Schedule {
            batch_rows,
            host_prefix,
        };
        Hnsw::knn_build(&data, dim, Metric::L2, params(), &cpu, schedule, None)
            .unwrap()
            .to_bytes()
    };
    let reference = build(KNN_BATCH_ROWS, HOST_PREFIX);
    for (batch, host) in [(1, 1), (7, 3), (100, 16), (1499, 50), (1500, 2000)] {
        assert!(
            build(batch, host) == reference,
            "batch size {batch}, host prefix {host} changed the graph"
        );
    }
    for threads in [1, 3] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        let bytes = pool.install(|| build(64, 10));
        assert!(bytes == reference, "{threads} threads changed the graph");
    }
}

#[test]
fn levels_and_entry_match_the_insertion_build() {
    let (n, dim) = (3000, 8);
    let data = corpus(n, dim);
    let knn = Hnsw::build_knn_cpu(&data, dim, Metric::Dot, params()).unwrap();
    let ins = Hnsw::build(&data, dim, Metric::Dot, params()).unwrap();
    assert_eq!(knn.graph.links.layout.levels, ins.graph.links.layout.levels);
    assert_eq!(knn.graph.entry, ins.graph.entry);
    assert_eq!(knn.graph.max_level, ins.graph.max_level);
    assert!(knn.graph.max_level >= 1, "the test wants an upper layer");
}

#[test]
fn lists_respect_capacities_and_hold_no_self_links() {
    let (n, dim) = (2000, 6);
    let data = corpus(n, dim);
    let index = Hnsw::build_knn_cpu(&data, dim, Metric::Cosine, params()).unwrap();
    let links = &index.graph.links;
    for node in 0..n as u32 {
        for level in 0..=links.layout.level(node) {
            let list = links.neighbours(node, level);
            assert!(list.len() <= links.layout.cap(level));
            assert!(
                !list.contains(&node),
                "node {node} links to itself on {level}"
            );
            for &e in list {
                assert!(links.layout.level(e) >= level, "{node} -> {e} on {level}");
            }
            let mut sorted = list.to_vec();
            sorted.sort_unstable();
            sorted.dedup();
            assert_eq!(sorted.len(), list.len(), "duplicate link of {node}");
            // Every node keeps at least its nearest other row.
            assert!(
                level > 0 || !list.is_empty(),
                "node {node} has no layer-0 link"
            );
        }
    }
}

/// Nodes of `level` reachable from `from` along that layer's links.
fn reachable(links: &Links<u32>, level: usize, from: u32) -> usize {
    let mut seen = vec![false; links.layout.len()];
    let mut stack = vec![from];
    seen[from as usize] = true;
    let mut count = 1;
    while let Some(x) = stack.pop() {
        for &e in links.neighbours(x, level) {
            if !std::mem::replace(&mut seen[e as usize], true) {
                count += 1;
                stack.push(e);
            }
        }
    }
    count
}

#[test]
fn every_layer_is_reachable_from_the_entry_and_carries_layer_1_links() {
    // 32 well separated clusters: the kNN lists alone leave some of
    // them unreachable from the entry.
    let (n, dim) = (5000, 32);
    let data = synth::gaussian_clusters(n, dim, 32, 0.6, 20_261_201);
    let p = HnswParams {
        m: 16,
        ef_construction: 100,
        seed: 3,
        ..HnswParams::default()
    };
    let index = Hnsw::build_knn_cpu(&data, dim, Metric::L2, p).unwrap();
    let g = &index.graph;
    for level in 0..=g.max_level {
        let on_layer = (0..n as u32)
            .filter(|&i| g.links.layout.level(i) >= level)
            .count();
        assert_eq!(
            reachable(&g.links, level, g.entry),
            on_layer,
            "layer {level}"
        );
    }
    for node in (0..n as u32).filter(|&i| g.links.layout.level(i) >= 1) {
        let layer0 = g.links.neighbours(node, 0);
        let lifted = g
            .links
            .neighbours(node, 1)
            .iter()
            .all(|e| layer0.contains(e));
        assert!(lifted || layer0.len() == p.m0(), "node {node}");
    }
}

/// Answers with the rows of another corpus of the same shape.
struct Foreign(CpuRetriever);

impl KnnSource for Foreign {
    fn rows(&self) -> usize {
        self.0.rows()
    }
    fn knn_batch(&self, queries: &[f32], k: usize) -> Result<Vec<Vec<Neighbor>>> {
        self.0.knn_batch(queries, k)
    }
}

#[test]
fn a_source_over_other_rows_is_a_typed_error() {
    let (n, dim) = (300, 4);
    let data = corpus(n, dim);
    let other: Vec<f32> = data.iter().map(|v| v + 1.0).collect();
    let src = Foreign(CpuRetriever::from_rowmajor(other, dim, Metric::L2).unwrap());
    let e = Hnsw::build_from_knn(&data, dim, Metric::L2, params(), &src).unwrap_err();
    assert!(matches!(e, HnswError::KnnSource { .. }), "{e}");
    assert!(e.to_string().contains("canonical score"), "{e}");
    let short =
        Foreign(CpuRetriever::from_rowmajor(data[..dim * 10].to_vec(), dim, Metric::L2).unwrap());
    let e = Hnsw::build_from_knn(&data, dim, Metric::L2, params(), &short).unwrap_err();
    assert!(e.to_string().contains("holds 10 rows"), "{e}");
}

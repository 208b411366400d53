//! Running out of memory anywhere in a mutation changes nothing
//! (docs/CONTRACTS.md §10). Each mutation runs on a fresh corpus with its
//! first, second, third … allocation failing, until it runs through; after
//! every failure the corpus reports the same sizes and answers the same
//! searches to the bit as before the call, and a call that runs through
//! (after failures, as a caller retries) gives the answers of a run that
//! never failed.
//!
//! Without a device each case prints why and passes, unless
//! `TOPK_REQUIRE_GPU=1`, under which a missing device fails.

use topk_core::{Hit, Metric};
use topk_testkit::gpu_or_skip;

use super::ResidentCorpus;
use crate::driver::faults;
use crate::{CudaConfig, CudaError, IdFilter};

const DIM: usize = 8;

/// Row `id`'s values: small integers, so that many scores tie.
fn row(id: u64) -> Vec<f32> {
    (0..DIM)
        .map(|j| ((id as usize * 5 + j * 3) % 7) as f32 - 3.0)
        .collect()
}

fn rows(ids: &[u64]) -> Vec<f32> {
    ids.iter().flat_map(|&id| row(id)).collect()
}

/// What a caller can see of the corpus: its sizes, and the bits of every
/// answer to three queries over all rows and through a filter.
type Seen = (usize, usize, usize, usize, Vec<Vec<(u64, u32)>>);

fn seen(c: &ResidentCorpus) -> Seen {
    let queries: Vec<f32> = (0..3 * DIM).map(|i| ((i * 7) % 11) as f32 - 5.0).collect();
    let k = c.stored() + 1;
    let bits = |hits: Vec<Vec<Hit>>| -> Vec<Vec<(u64, u32)>> {
        hits.into_iter()
            .map(|h| h.iter().map(|h| (h.id, h.score.to_bits())).collect())
            .collect()
    };
    let filter: Vec<u64> = (0..200).step_by(3).collect();
    let mut answers = bits(c.search(&queries, k, IdFilter::All).unwrap());
    answers.extend(bits(
        c.search(&queries, k, IdFilter::Shared(&filter)).unwrap(),
    ));
    (c.len(), c.stored(), c.capacity(), c.tombstones(), answers)
}

/// A corpus of ids 10, 20, …, 80 with 40 removed, in room for 8 rows.
fn start(metric: Metric, config: &CudaConfig) -> ResidentCorpus {
    let mut c = ResidentCorpus::new(DIM, metric, config.clone(), 8).unwrap();
    let ids: Vec<u64> = (1..=8).map(|i| i * 10).collect();
    c.add(&ids, &rows(&ids)).unwrap();
    c.remove(&[40]).unwrap();
    c
}

type Mutation = fn(&mut ResidentCorpus) -> Result<(), CudaError>;

/// Each mutation with the path it takes through the corpus.
fn mutations() -> Vec<(&'static str, Mutation)> {
    vec![
        ("add above the largest id, growing", |c| {
            let ids = [90, 100, 110];
            c.add(&ids, &rows(&ids))
        }),
        ("add below the largest id, growing (a merge)", |c| {
            let ids = [5, 45, 85];
            c.add(&ids, &rows(&ids))
        }),
        ("upsert of present and new ids below the largest", |c| {
            let ids = [20, 35, 70];
            let mut r = rows(&ids);
            r.iter_mut().for_each(|v| *v = -*v);
            c.upsert(&ids, &r)
        }),
        ("upsert of present ids and one above, growing", |c| {
            let ids = [80, 10, 300];
            let mut r = rows(&ids);
            r.reverse();
            c.upsert(&ids, &r)
        }),
        ("compaction", |c| c.compact()),
        ("removal", |c| c.remove(&[10, 10, 999, 70]).map(|_| ())),
    ]
}

/// Allocations a mutation may make before the sweep gives up (a loop that
/// never ends would otherwise hang the test).
const MAX_ALLOCATIONS: usize = 4_096;

fn every_allocation_fails_in_turn(metric: Metric, config: CudaConfig) {
    for (name, mutation) in mutations() {
        let mut reference = start(metric, &config);
        mutation(&mut reference).unwrap();
        let want = seen(&reference);
        drop(reference);
        // A failed mutation leaves the corpus as it was, so the next
        // failure point is tried on the same corpus; a fresh one is made
        // only after a success (where the failure was one the engine can
        // do without: the f16 copy of the rows).
        let mut c = start(metric, &config);
        let before = seen(&c);
        for k in 0..MAX_ALLOCATIONS {
            faults::fail_after(Some(k));
            let got = mutation(&mut c);
            let made = faults::made();
            faults::fail_after(None);
            match got {
                Err(CudaError::OutOfMemory { .. }) => {
                    assert_eq!(seen(&c), before, "{name}: allocation {k} failed");
                }
                Err(e) => panic!("{name}: allocation {k} failed with {e}"),
                Ok(()) => {
                    assert_eq!(seen(&c), want, "{name}: allocation {k} of {made}");
                    if made <= k {
                        // It ran through with no failure, on the corpus
                        // every earlier point failed on: all were tried.
                        eprintln!("{metric:?}, {name}: {k} allocation points");
                        break;
                    }
                    c = start(metric, &config);
                }
            }
            assert!(
                k + 1 < MAX_ALLOCATIONS,
                "{name}: over {MAX_ALLOCATIONS} allocations"
            );
        }
    }
}

#[test]
fn running_out_of_memory_in_a_mutation_changes_nothing() {
    let Some(()) = gpu_or_skip() else { return };
    every_allocation_fails_in_turn(Metric::Dot, CudaConfig::default());
    every_allocation_fails_in_turn(Metric::Cosine, CudaConfig::default());
    // Norms kept for the filtered path, and the f16 copy of the rows.
    let mut c = CudaConfig::default();
    c.tuning.shadow_min_dim = DIM;
    every_allocation_fails_in_turn(Metric::L2, c);
}

//! One round of the batched build on the host side: the walks' selections
//! become the new nodes' lists, their offers are grouped by target, and
//! every changed list is written, all in parallel and without a list
//! allocated per node.

use std::time::Instant;

use rayon::prelude::*;

use super::{BatchEngine, Jobs, MAX_SELECT_CANDIDATES};
use crate::error::Result;
use crate::graph::Links;
use crate::params::HnswParams;
use crate::search::{id_of_key, Cand};

/// Up to `cap` values per item of a batch: item `i` is
/// `items[i * cap..][..counts[i]]`.
#[derive(Debug, Default)]
pub(crate) struct Flat<T> {
    pub(crate) cap: usize,
    pub(crate) items: Vec<T>,
    pub(crate) counts: Vec<u32>,
}

impl<T: Copy + Default + Send + Sync> Flat<T> {
    /// `len` items, item `i` written by `fill(i, its cap slots)`, which
    /// returns how many it wrote.
    pub(crate) fn par_fill(
        len: usize,
        cap: usize,
        fill: impl Fn(usize, &mut [T]) -> Result<usize> + Sync,
    ) -> Result<Self> {
        let cap = cap.max(1);
        let mut items = vec![T::default(); len * cap];
        let mut counts = vec![0_u32; len];
        items
            .par_chunks_mut(cap)
            .zip(counts.par_iter_mut())
            .enumerate()
            .try_for_each(|(i, (slots, count))| {
                *count = fill(i, slots)?.min(cap) as u32;
                Ok::<_, crate::error::HnswError>(())
            })?;
        Ok(Flat { cap, items, counts })
    }

    pub(crate) fn get(&self, i: usize) -> &[T] {
        &self.items[i * self.cap..][..self.counts[i] as usize]
    }
}

/// Seconds a level's rounds spent in each step (logged; a tuning aid).
#[derive(Debug, Default)]
pub(crate) struct Phases {
    pub(crate) rounds: usize,
    /// Walks and the selection of each walk's nodes.
    pub(crate) walk: f64,
    /// Offers listed and sorted.
    pub(crate) offers: f64,
    /// Offers grouped by target, re-selection jobs listed.
    pub(crate) group: f64,
    /// Re-selections.
    pub(crate) relink: f64,
    /// Changed lists written on the host.
    pub(crate) apply: f64,
    /// Changed lists handed to the engine.
    pub(crate) update: f64,
}

/// Seconds since `*t`, which moves to now.
pub(crate) fn lap(t: &mut Instant) -> f64 {
    let now = Instant::now();
    let s = now.duration_since(*t).as_secs_f64();
    *t = now;
    s
}

/// An offer of a new node to `target`, as one integer: the target in the
/// high half, then the new node's §3 key against the target inverted, so
/// that ascending order groups offers by target and ranks each group best
/// first.
fn offer(target: u32, key: u64) -> u128 {
    (u128::from(target) << 64) | u128::from(!key)
}

fn offer_target(o: u128) -> u32 {
    (o >> 64) as u32
}

/// The offered node (the key's id).
fn offer_node(o: u128) -> u32 {
    id_of_key(!(o as u64))
}

/// How a changed list gets its new contents.
#[derive(Debug, Clone, Copy)]
enum Change {
    /// A new node: item `i` of the walks' selections.
    Row(u32),
    /// Offers group `g` appended to the list as it is.
    Append(u32),
    /// Re-selection job `j`'s kept ids.
    Relink(u32),
}

/// One round: walks, selections, offers, the engine told of every list
/// that changed.
pub(crate) fn insert_round(
    links: &mut Links<u32>,
    entry: u32,
    rows: &[u32],
    inserted: usize,
    params: &HnswParams,
    engine: &mut dyn BatchEngine,
    t: &mut Phases,
) -> Result<()> {
    let mut clock = Instant::now();
    let cap0 = links.layout.m0;
    let ef = params.ef_construction;
    let kept = engine.walk_select(links, entry, rows, ef, ef.min(inserted), params.m)?;
    t.walk += lap(&mut clock);
    // Every kept neighbour `e` of a new node `r` is offered `r`, ranked by
    // the score `r`'s selection saw (scores are symmetric).
    let mut offers: Vec<u128> = (0..rows.len())
        .into_par_iter()
        .flat_map_iter(|i| {
            let r = rows[i];
            kept.get(i)
                .iter()
                .map(move |c| offer(c.id(), Cand::new(r, c.score()).key))
        })
        .collect();
    offers.par_sort_unstable();
    t.offers += lap(&mut clock);

    // Groups: offers[starts[g]..starts[g + 1]] go to one target.
    let mut starts: Vec<u32> = (0..offers.len())
        .into_par_iter()
        .filter(|&i| i == 0 || offer_target(offers[i]) != offer_target(offers[i - 1]))
        .map(|i| i as u32)
        .collect();
    starts.push(offers.len() as u32);
    let groups = starts.len() - 1;
    let group = |g: usize| &offers[starts[g] as usize..starts[g + 1] as usize];
    let target = |g: usize| offer_target(offers[starts[g] as usize]);
    let links_ref = &*links;
    let fits = |g: usize| links_ref.neighbours(target(g), 0).len() + group(g).len() <= cap0;
    let (append, relink): (Vec<u32>, Vec<u32>) = (0..groups as u32)
        .into_par_iter()
        .partition(|&g| fits(g as usize));
    // A target whose list and offers overflow it re-selects from both,
    // its best offers first where they exceed the selection's limit.
    let taken = |g: usize| {
        let current = links_ref.neighbours(target(g), 0);
        let room = MAX_SELECT_CANDIDATES.saturating_sub(current.len());
        (current, &group(g)[..group(g).len().min(room)])
    };
    let jobs = {
        let base: Vec<u32> = relink.par_iter().map(|&g| target(g as usize)).collect();
        let cands: Vec<u32> = relink
            .par_iter()
            .flat_map_iter(|&g| {
                let (current, new) = taken(g as usize);
                current
                    .iter()
                    .copied()
                    .chain(new.iter().map(|&o| offer_node(o)))
            })
            .collect();
        let mut off = Vec::with_capacity(relink.len() + 1);
        off.push(0_u32);
        for &g in &relink {
            let (current, new) = taken(g as usize);
            let last = off[off.len() - 1];
            off.push(last + (current.len() + new.len()) as u32);
        }
        Jobs { base, off, cands }
    };
    t.group += lap(&mut clock);
    let relinked = engine.select(&jobs, cap0)?;
    t.relink += lap(&mut clock);

    // Every changed list (new nodes and targets are distinct nodes), in
    // node order, written in parallel.
    let mut changes: Vec<(u32, Change)> = Vec::with_capacity(rows.len() + groups);
    changes.extend(
        rows.iter()
            .enumerate()
            .map(|(i, &r)| (r, Change::Row(i as u32))),
    );
    changes.extend(
        append
            .iter()
            .map(|&g| (target(g as usize), Change::Append(g))),
    );
    changes.extend(
        relink
            .iter()
            .enumerate()
            .map(|(j, &g)| (target(g as usize), Change::Relink(j as u32))),
    );
    changes.par_sort_unstable_by_key(|&(node, _)| node);
    let nodes: Vec<u32> = changes.iter().map(|&(node, _)| node).collect();
    let blocks = links.layer0_blocks_mut(&nodes);
    blocks
        .into_par_iter()
        .zip(&changes)
        .for_each(|(block, &(_, change))| match change {
            Change::Row(i) => write_list(block, 0, kept.get(i as usize).iter().map(|c| c.id())),
            Change::Append(g) => {
                let at = block[0] as usize;
                write_list(block, at, group(g as usize).iter().map(|&o| offer_node(o)));
            }
            Change::Relink(j) => write_list(block, 0, relinked.get(j as usize).iter().copied()),
        });
    t.apply += lap(&mut clock);
    engine.update(links, &nodes)?;
    t.update += lap(&mut clock);
    Ok(())
}

/// Writes `ids` into a layer-0 block after its first `at` ids, and the
/// count (the caller checked that they fit).
fn write_list(block: &mut [u32], at: usize, ids: impl Iterator<Item = u32>) {
    let mut count = at;
    for (slot, id) in block[1 + at..].iter_mut().zip(ids) {
        *slot = id;
        count += 1;
    }
    block[0] = count as u32;
}

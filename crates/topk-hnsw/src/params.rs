//! Build and search parameters, their valid ranges, and the seeded level draw.

use crate::error::{HnswError, Result};

/// Largest accepted `m`. Neighbour lists are scanned linearly and pruned with
/// an O(m²) heuristic; beyond a few hundred the graph stops paying for itself.
pub const MAX_M: usize = 4096;

/// Largest layer a node can be drawn on. With `m ≥ 2` and a 53-bit uniform,
/// `floor(-ln(U) / ln(m))` never exceeds 53, so the cap only guards the format.
pub const MAX_LEVEL: usize = 63;

/// Parameters of an HNSW index (Malkov & Yashunin).
///
/// | field | meaning | valid |
/// | --- | --- | --- |
/// | `m` | links per node on layers ≥ 1; layer 0 keeps `2·m` | `2 ..= 4096` |
/// | `ef_construction` | beam width while inserting | `≥ 1` |
/// | `ef_search` | default beam width of [`topk_core::Retriever::search`] | `≥ 1` |
/// | `seed` | seed of the level draw | any |
/// | `parallel` | build from every rayon thread ([`crate::Hnsw::new`], [`crate::Hnsw::from_rowmajor`]) | any |
///
/// A search asks for at least `k` candidates: an `ef` below `k` is raised to
/// `k` (as hnswlib and faiss do) rather than rejected, so `ef` only ever
/// trades speed for recall and never changes how many results come back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HnswParams {
    /// Links per node on the upper layers (`M`); layer 0 keeps `M0 = 2·M`.
    pub m: usize,
    /// Beam width of the layer searches run while inserting.
    pub ef_construction: usize,
    /// Default beam width of a search (overridable per search).
    pub ef_search: usize,
    /// Seed of the level draw: the same seed and insertion order give the same graph.
    pub seed: u64,
    /// Whether [`crate::Hnsw::new`] and [`crate::Hnsw::from_rowmajor`] insert
    /// from every thread of the current rayon pool (faster; the graph then
    /// depends on thread timing, its recall does not) or on one thread
    /// (deterministic: the same inputs always give the same graph and file).
    /// Not stored in an index file: a loaded index reports the default.
    pub parallel: bool,
}

impl Default for HnswParams {
    fn default() -> Self {
        HnswParams {
            m: 16,
            ef_construction: 100,
            ef_search: 64,
            seed: 0x5EED_4E53_5700_0001,
            parallel: true,
        }
    }
}

impl HnswParams {
    /// Parameters with `m` links per node and the other fields at their defaults.
    pub fn with_m(m: usize) -> Self {
        HnswParams {
            m,
            ..Self::default()
        }
    }

    /// Links per node on layer 0.
    pub fn m0(&self) -> usize {
        2 * self.m
    }

    /// The level multiplier `mL = 1 / ln(m)`.
    pub fn level_mult(&self) -> f64 {
        1.0 / (self.m as f64).ln()
    }

    /// Checks every field against its range.
    pub fn validate(&self) -> Result<()> {
        if self.m < 2 {
            return Err(invalid("m", self.m, "must be at least 2 (mL = 1/ln(m))"));
        }
        if self.m > MAX_M {
            return Err(invalid("m", self.m, "must be at most 4096"));
        }
        if self.ef_construction == 0 {
            return Err(invalid("ef_construction", 0, "must be at least 1"));
        }
        check_ef(self.ef_search)?;
        Ok(())
    }
}

/// Checks a search beam width: zero is meaningless, anything else is accepted
/// (values below `k` are raised to `k` by the search).
pub(crate) fn check_ef(ef: usize) -> Result<()> {
    if ef == 0 {
        return Err(invalid(
            "ef",
            0,
            "must be at least 1 (values below k are raised to k)",
        ));
    }
    Ok(())
}

/// Most nodes a search expands per step ([`Hnsw::search_batch_wide`]; the
/// GPU walk's limit too).
///
/// [`Hnsw::search_batch_wide`]: crate::Hnsw::search_batch_wide
pub const MAX_WALK_WIDTH: usize = 8;

pub(crate) fn check_width(width: usize) -> Result<()> {
    if width == 0 || width > MAX_WALK_WIDTH {
        return Err(invalid(
            "width",
            width,
            "nodes expanded per step: must be 1 ..= 8",
        ));
    }
    Ok(())
}

fn invalid(name: &'static str, value: usize, reason: &'static str) -> HnswError {
    HnswError::InvalidParameter {
        name,
        value: value as u64,
        reason,
    }
}

/// SplitMix64: the level draw's generator, fixed in this crate so that a saved
/// graph stays reproducible across dependency upgrades.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    /// The internal state; `SplitMix64::new(g.state())` continues the stream of `g`.
    pub fn state(&self) -> u64 {
        self.0
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(SPLITMIX_GAMMA);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A uniform value in `(0, 1]` (never 0, so `ln` stays finite).
    pub fn next_open01(&mut self) -> f64 {
        ((self.next_u64() >> 11) + 1) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// The layer of every node, drawn in insertion order: `floor(-ln(U) · mL)`.
pub(crate) fn draw_levels(n: usize, params: &HnswParams) -> Vec<u8> {
    let mut rng = SplitMix64::new(params.seed);
    (0..n).map(|_| draw_level(&mut rng, params)).collect()
}

/// One level draw, `floor(-ln(U) · mL)`, advancing `rng` by one step.
pub(crate) fn draw_level(rng: &mut SplitMix64, params: &HnswParams) -> u8 {
    let level = (-rng.next_open01().ln() * params.level_mult()).floor();
    // In range by construction (see MAX_LEVEL); the clamp keeps the cast total.
    level.clamp(0.0, MAX_LEVEL as f64) as u8
}

/// The level generator after the `n` draws of a build: the stream later
/// insertions continue, so a history of builds and inserts is reproducible.
pub(crate) fn rng_after(seed: u64, n: usize) -> SplitMix64 {
    SplitMix64(seed.wrapping_add((n as u64).wrapping_mul(SPLITMIX_GAMMA)))
}

const SPLITMIX_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn level_distribution_is_geometric() {
        let p = HnswParams::with_m(16);
        let levels = draw_levels(200_000, &p);
        let above0 = levels.iter().filter(|&&l| l >= 1).count() as f64 / 200_000.0;
        let above1 = levels.iter().filter(|&&l| l >= 2).count() as f64 / 200_000.0;
        // P(level ≥ l) = m^-l.
        assert!((above0 - 1.0 / 16.0).abs() < 0.005, "{above0}");
        assert!((above1 - 1.0 / 256.0).abs() < 0.001, "{above1}");
        assert_eq!(draw_levels(1000, &p), draw_levels(1000, &p));
    }

    #[test]
    fn rng_after_continues_the_build_stream() {
        let p = HnswParams::with_m(8);
        let mut rng = SplitMix64::new(p.seed);
        for _ in 0..1234 {
            draw_level(&mut rng, &p);
        }
        assert_eq!(rng_after(p.seed, 1234).state(), rng.state());
        let mut after = rng_after(p.seed, 1000);
        let tail: Vec<u8> = (0..234).map(|_| draw_level(&mut after, &p)).collect();
        assert_eq!(tail, draw_levels(1234, &p)[1000..].to_vec());
    }

    #[test]
    fn bad_parameters_are_typed_errors() {
        let e = HnswParams::with_m(1).validate().unwrap_err();
        assert!(
            matches!(
                e,
                HnswError::InvalidParameter {
                    name: "m",
                    value: 1,
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("m = 1"));
        let e = HnswParams {
            ef_construction: 0,
            ..HnswParams::default()
        }
        .validate()
        .unwrap_err();
        assert!(matches!(
            e,
            HnswError::InvalidParameter {
                name: "ef_construction",
                value: 0,
                ..
            }
        ));
        let e = HnswParams {
            ef_search: 0,
            ..HnswParams::default()
        }
        .validate()
        .unwrap_err();
        assert!(matches!(e, HnswError::InvalidParameter { name: "ef", .. }));
        assert!(HnswParams::with_m(MAX_M + 1).validate().is_err());
        assert!(HnswParams::with_m(2).validate().is_ok());
    }
}

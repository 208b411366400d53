//! Which shard holds an id (docs/CONTRACTS.md §12).

/// The name of the placement rule, recorded in every manifest: a set saved
/// under one rule is never opened under another.
pub const PLACEMENT: &str = "splitmix64-mulshift";

/// The shard of `id` among `shards` (≥ 1): the id is mixed by the SplitMix64
/// finaliser, and the 64-bit hash `h` mapped to `⌊h · shards / 2^64⌋`.
///
/// The rule depends on the id alone, so an add, an upsert and a remove of
/// one id reach the same shard without a directory, from any process (the
/// Python `topk.ray` driver calls this same function). Sequential, strided
/// and random ids all spread evenly; the share of a shard differs from
/// `1 / shards` by a few standard deviations of a binomial at most.
/// Changing the shard count moves most ids: a set is re-sharded by reading it
/// and adding its rows to a new set.
pub fn shard_of(id: u64, shards: usize) -> usize {
    debug_assert!(shards >= 1, "a sharded index has at least one shard");
    let mut z = id.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    ((u128::from(z) * shards as u128) >> 64) as usize
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn known_values_pin_the_rule() {
        // A saved set depends on these (computed independently from the
        // definition): changing the rule is a format change.
        let got: Vec<usize> = (0..12u64).map(|id| shard_of(id, 4)).collect();
        assert_eq!(got, KNOWN);
        assert_eq!(shard_of(u64::MAX, 7), shard_of(u64::MAX, 7));
    }
    const KNOWN: [usize; 12] = [3, 2, 2, 0, 1, 1, 2, 1, 2, 2, 0, 1];

    #[test]
    fn sequential_and_strided_ids_spread_evenly() {
        for stride in [1u64, 2, 4, 1024, 1 << 32] {
            let mut counts = [0usize; 4];
            for i in 0..40_000u64 {
                counts[shard_of(i * stride, 4)] += 1;
            }
            // Binomial(40000, 1/4): sd ≈ 87; six sd either side.
            for c in counts {
                assert!((9_480..=10_520).contains(&c), "stride {stride}: {counts:?}");
            }
        }
    }

    proptest! {
        #[test]
        fn always_in_range(id in any::<u64>(), shards in 1usize..1000) {
            prop_assert!(shard_of(id, shards) < shards);
            prop_assert_eq!(shard_of(id, 1), 0);
        }
    }
}

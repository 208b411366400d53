//! The overflow rule (docs/CONTRACTS.md §4.1) on the GPU engine, on every
//! plan path: huge, tiny and subnormal corpora and queries are rejected with
//! the same typed error as the oracle, or answered with finite scores equal
//! to the oracle's, bit for bit.
//!
//! Without a device the case prints why and passes, unless
//! `TOPK_REQUIRE_GPU=1`, under which a missing device fails.
#![cfg(feature = "cuda")]

use proptest::prelude::*;
use topk_testkit::{gpu_or_skip, overflow, Label};

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn huge_and_tiny_values_are_rejected_or_score_finitely(case in overflow::case()) {
        let Some(()) = gpu_or_skip() else { return Ok(()) };
        for label in Label::cuda_paths() {
            overflow::check(&label.subject(), &case)?;
        }
    }
}

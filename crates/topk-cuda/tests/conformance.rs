//! The conformance tester of topk-testkit on the GPU engine, once per plan
//! path: every input rule, and the oracle's bytes on tie-rich and adversarial
//! corpora under every metric, single and batched, with the engine tuned so
//! that the path serves every shape it can. The tester fails when the
//! labelled path served no query.
//!
//! Without a device the case prints why and passes, unless
//! `TOPK_REQUIRE_GPU=1`, under which a missing device fails.
#![cfg(feature = "cuda")]

use topk_testkit::{conformance, gpu_or_skip, Label};

#[test]
fn every_plan_path_conforms() {
    let Some(()) = gpu_or_skip() else { return };
    let labels = Label::cuda_paths();
    assert_eq!(labels.len(), topk_cuda::PlanPath::ALL.len());
    for label in labels {
        let covered = conformance(&label.subject());
        assert!(covered.answers > 0, "{label}: {covered:?}");
    }
}

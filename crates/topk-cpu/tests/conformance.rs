//! The conformance tester of topk-testkit on both CPU backends: every input
//! rule, and the oracle's bytes on every kernel path this CPU runs.

use topk_testkit::{conformance, Label};

#[test]
fn the_oracle_conforms() {
    let covered = conformance(&Label::Oracle.subject());
    assert!(covered.answers > 0 && covered.rejections > 0, "{covered:?}");
}

#[test]
fn every_kernel_path_conforms() {
    let labels = Label::cpu_paths();
    assert!(labels.contains(&Label::Cpu(topk_cpu::Path::Scalar)));
    for label in labels {
        let covered = conformance(&label.subject());
        assert!(covered.answers > 0, "{label}: {covered:?}");
    }
}

#[test]
fn half_width_storage_conforms_on_every_path() {
    let labels = Label::cpu_stored();
    assert!(labels.len() >= 4, "{labels:?}");
    for label in labels {
        let covered = conformance(&label.subject());
        assert!(
            covered.answers > 0 && covered.rejections > 0,
            "{label}: {covered:?}"
        );
    }
}

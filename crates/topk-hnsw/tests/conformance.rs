//! The conformance tester of topk-testkit on the HNSW index: every input rule
//! of topk-core, and answers of `min(K, N)` distinct rows, best first, each
//! with its canonical score, on tie-rich and adversarial corpora.

use topk_testkit::{conformance, Label};

#[test]
fn hnsw_keeps_the_input_rules_and_the_answer_shape() {
    let covered = conformance(&Label::Hnsw.subject());
    assert!(covered.answers > 0 && covered.rejections > 0, "{covered:?}");
}

//! Every backend through the front door: the conformance tester of
//! topk-testkit on what `topk::open` returns, exact backends against the
//! oracle's bytes, HNSW on the input rules and the shape of its answers.

use topk::{Backend, CoreError, Dtype, Options};
use topk_testkit::{conformance, or_skip, Subject};

/// The subject that opens `backend` with `topk::open` over a row-major corpus.
fn subject(backend: Backend) -> Subject<'static> {
    stored_subject(backend, Dtype::F32)
}

/// [`subject`] with the corpus stored as `dtype`.
fn stored_subject(backend: Backend, dtype: Dtype) -> Subject<'static> {
    let open = move |data: Vec<f32>, dim: usize, metric| {
        topk::open(backend, (data, dim), metric, &Options::new().dtype(dtype)).map_err(
            |e| match e {
                topk::Error::Core(e) => e,
                e => CoreError::backend("topk", e),
            },
        )
    };
    let label = format!("topk::open({backend}, {dtype})");
    let s = if backend.is_exact() {
        Subject::exact(label, open)
    } else {
        Subject::approximate(label, open)
    };
    s.stored_as(dtype)
}

#[test]
fn every_host_backend_conforms_over_half_width_storage() {
    for dtype in [Dtype::F16, Dtype::Bf16] {
        for backend in [Backend::Cpu, Backend::Oracle, Backend::Hnsw] {
            let covered = conformance(&stored_subject(backend, dtype));
            assert!(
                covered.answers > 0 && covered.rejections > 0,
                "{backend} {dtype}: {covered:?}"
            );
        }
    }
}

#[test]
fn every_host_backend_conforms() {
    for backend in [Backend::Cpu, Backend::Oracle, Backend::Hnsw] {
        let covered = conformance(&subject(backend));
        assert!(
            covered.answers > 0 && covered.rejections > 0,
            "{backend}: {covered:?}"
        );
    }
}

/// Runs where the build has the `cuda` feature and the machine a device
/// (under `TOPK_REQUIRE_GPU=1` a missing device fails).
#[test]
fn cuda_conforms_where_it_runs() {
    if !Backend::Cuda.compiled() {
        eprintln!("skipping: this build has no `cuda` feature");
        return;
    }
    let Some(()) = or_skip(Backend::Cuda.available()) else {
        return;
    };
    let covered = conformance(&subject(Backend::Cuda));
    assert!(covered.answers > 0, "{covered:?}");
    for dtype in [Dtype::F16, Dtype::Bf16] {
        let covered = conformance(&stored_subject(Backend::Cuda, dtype));
        assert!(covered.answers > 0, "{dtype}: {covered:?}");
    }
}

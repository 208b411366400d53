//! The launch layer's checks against the kernel sources and PTX.

/// The value of `#define NAME <integer>` in a kernel source.
pub(super) fn define(src: &str, name: &str) -> usize {
    src.lines()
        .filter_map(|l| l.trim().strip_prefix("#define "))
        .find_map(|rest| {
            let mut parts = rest.split_whitespace();
            (parts.next() == Some(name)).then(|| parts.next()).flatten()
        })
        .and_then(|v| v.trim_end_matches('u').parse().ok())
        .unwrap_or_else(|| panic!("no integer #define {name} in the kernel source"))
}

/// The kernel sources the host mirrors, embedded at build time so the
/// test passes from any working directory.
pub(super) const COMMON_CUH: &str = include_str!("../../../../kernels/common.cuh");
pub(super) const STAGE_CUH: &str = include_str!("../../../../kernels/stage.cuh");
pub(super) const SHAPES_CUH: &str = include_str!("../../../../kernels/shapes.cuh");
pub(super) const SCORE_BATCH_CU: &str = include_str!("../../../../kernels/score_batch.cu");
pub(super) const FILTER_CU: &str = include_str!("../../../../kernels/filter.cu");
pub(super) const FILTER90_CU: &str = include_str!("../../../../kernels/filter90.cu");
pub(super) const WALK_CU: &str = include_str!("../../../../kernels/walk.cu");

#[test]
fn host_constants_mirror_the_kernel_headers() {
    use super::*;
    let src = COMMON_CUH;
    assert_eq!(define(src, "TOPK_AREA_STRIDE"), AREA_STRIDE);
    assert_eq!(define(src, "TOPK_CAND_CAP"), CAND_CAP);
    assert_eq!(define(src, "TOPK_MAYBE_CAP"), MAYBE_CAP);
    assert_eq!(define(src, "TOPK_STASH_ROWS"), select::STASH_ROWS as usize);
    assert_eq!(define(src, "TOPK_SEL_THREADS"), SEL_THREADS as usize);
    assert_eq!(define(src, "TOPK_STATUS_OK"), STATUS_OK as usize);
    assert_eq!(
        define(src, "TOPK_STATUS_OVERFLOW"),
        STATUS_OVERFLOW as usize
    );
}

#[test]
fn every_kernel_the_host_loads_is_an_entry_of_its_ptx() {
    use crate::ptx;
    let metrics = |f: &str| ["dot", "cosine", "l2"].map(|m| format!("{f}_{m}")).to_vec();
    let single = [metrics("topk_score1"), metrics("topk_score1u")].concat();
    let single = [single, metrics("topk_search1"), metrics("topk_search1u")].concat();
    let batch = [metrics("topk_scoreb"), metrics("topk_scoreq32")].concat();
    let batch = [batch, metrics("topk_scoreq16")].concat();
    let filter = [metrics("topk_approx"), metrics("topk_filter")].concat();
    let filter = [filter, metrics("topk_filter_emitted")].concat();
    let filter = [
        filter,
        metrics("topk_rescore"),
        vec!["topk_select_listed".into()],
    ]
    .concat();
    let select: Vec<String> = ["topk_select_small", "topk_hist", "topk_gather"]
        .map(String::from)
        .to_vec();
    let filter90 = [metrics("topk_approx90"), metrics("topk_emit90")].concat();
    let filter90_half = [filter90.clone(), vec!["topk_queries16".into()]].concat();
    let norms = ["topk_norms", "topk_row_norms", "topk_fetch_query"]
        .map(String::from)
        .to_vec();
    for (module, text, names) in [
        ("norms", ptx::NORMS_PTX, norms),
        ("score_single", ptx::SCORE_SINGLE_PTX, single),
        ("score_batch", ptx::SCORE_BATCH_PTX, batch),
        ("score_ids", ptx::SCORE_IDS_PTX, metrics("topk_score_ids")),
        ("select", ptx::SELECT_PTX, select),
        ("filter", ptx::FILTER_PTX, filter),
        ("filter90", ptx::FILTER90_PTX, filter90),
        (
            "filter90.f16",
            ptx::ptx_of("filter90.f16").unwrap_or_default(),
            [filter90_half.clone(), vec!["topk_rows16".into()]].concat(),
        ),
        (
            "filter90.bf16",
            ptx::ptx_of("filter90.bf16").unwrap_or_default(),
            filter90_half,
        ),
        (
            "walk",
            ptx::WALK_PTX,
            crate::config::WALK_TEAMS
                .iter()
                .flat_map(|t| {
                    metrics("topk_walk")
                        .into_iter()
                        .map(move |m| format!("{m}_{t}"))
                })
                .chain(metrics("topk_prune"))
                .chain(["topk_set_lists".to_owned()])
                .collect(),
        ),
    ] {
        for name in &names {
            assert!(
                text.contains(&format!(".entry {name}(")),
                "{name} missing from {module}.ptx"
            );
        }
        // Every entry of the module is one the host loads.
        assert_eq!(text.matches(".entry ").count(), names.len(), "{module}.ptx");
    }
}

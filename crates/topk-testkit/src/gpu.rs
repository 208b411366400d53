//! Skipping device cases where there is no device, and only there.
//!
//! A GPU case calls [`gpu_or_skip`] (or [`or_skip`] with its own probe):
//! without a usable device it prints the reason and the case returns early,
//! unless the environment sets `TOPK_REQUIRE_GPU=1` (the GPU bundle does),
//! under which a missing device fails the case: a run on the GPU machine
//! cannot pass by skipping.

use std::fmt::Display;

/// The variable that turns a skip into a failure.
pub const REQUIRE_GPU: &str = "TOPK_REQUIRE_GPU";

/// Whether `TOPK_REQUIRE_GPU=1` is set.
pub fn gpu_required() -> bool {
    std::env::var(REQUIRE_GPU).is_ok_and(|v| v == "1")
}

/// `Some(())` where device 0 of the in-process engine answers; otherwise
/// prints why and returns `None`, or panics under `TOPK_REQUIRE_GPU=1`.
///
/// The engine runs in process only in a build that enables `topk-cuda/cuda`;
/// elsewhere this skips with "rebuild with `--features cuda`".
pub fn gpu_or_skip() -> Option<()> {
    or_skip(topk_cuda::device_info(0).map(|_| ()))
}

/// The probe's value where it succeeded; otherwise prints its error and
/// returns `None`, or panics under `TOPK_REQUIRE_GPU=1`.
pub fn or_skip<T, E: Display>(probe: Result<T, E>) -> Option<T> {
    match probe {
        Ok(v) => Some(v),
        Err(e) if gpu_required() => panic!("{REQUIRE_GPU}=1 but no usable GPU: {e}"),
        Err(e) => {
            eprintln!("skipping GPU case: {e}");
            None
        }
    }
}

/// The variable that sets how many property cases a GPU test runs.
pub const GPU_CASES: &str = "TOPK_GPU_CASES";

/// Property cases of a GPU test: `TOPK_GPU_CASES` where it is set to a
/// number, else `default`.
pub fn gpu_cases(default: u32) -> u32 {
    std::env::var(GPU_CASES)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// A property-test runner of [`gpu_cases`]`(default)` cases where device 0
/// answers; `None` (printed, or a panic under `TOPK_REQUIRE_GPU=1`) as
/// [`gpu_or_skip`] where it does not.
pub fn gpu_runner(default: u32) -> Option<proptest::test_runner::TestRunner> {
    gpu_or_skip()?;
    Some(proptest::test_runner::TestRunner::new(
        proptest::test_runner::Config {
            cases: gpu_cases(default),
            ..proptest::test_runner::Config::default()
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn case_counts_default_without_the_variable() {
        if std::env::var(GPU_CASES).is_err() {
            assert_eq!(gpu_cases(7), 7);
        }
    }

    #[test]
    fn a_working_probe_is_never_skipped() {
        assert_eq!(or_skip(Ok::<u8, String>(7)), Some(7));
    }

    #[test]
    fn a_failed_probe_skips_or_fails_as_the_environment_says() {
        let outcome = std::panic::catch_unwind(|| or_skip(Err::<(), _>("no device")));
        match outcome {
            Ok(v) => {
                assert!(!gpu_required());
                assert_eq!(v, None);
            }
            Err(_) => assert!(gpu_required()),
        }
    }
}

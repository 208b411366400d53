//! Test support of the topk workspace (dev-only, not published).
//!
//! | item | what it is for |
//! | --- | --- |
//! | [`corpora`] | seeded corpora rich in ties, `-0.0`, subnormals, huge values and shuffled duplicates; [`corpora::bitwise_diff`] |
//! | [`gpu_or_skip`], [`or_skip`] | device cases skip with a printed reason where there is no device, and fail instead under `TOPK_REQUIRE_GPU=1` |
//! | [`conformance`], [`Subject`], [`Label`] | every input rule and bit-identical oracle agreement, through any backend |
//! | [`overflow`] | the overflow rule as a property test any exact backend must keep |
//! | [`files`] | [`files::crc32`], to edit files and fix their checksums as a writer would; [`files::full_disk_child`], a write that fails as on a full disk |
//! | [`hits`] | hit lists compared bit for bit, rows from vectors (history tests) |
//! | [`shared_data`] | the real embeddings beside the repository, skipped with a printed reason where absent, a failure under `TOPK_REQUIRE_DATA=1` |
//!
//! ```
//! use topk_testkit::{conformance, Label};
//!
//! for label in Label::cpu_paths() {
//!     let covered = conformance(&label.subject());
//!     assert!(covered.answers > 0);
//! }
//! ```

mod conformance;
pub mod corpora;
mod data;
pub mod files;
mod gpu;
pub mod hits;
mod labels;
pub mod overflow;

pub use conformance::{conformance, Coverage, OpenFn, Subject};
pub use data::{data_required, shared_data, REQUIRE_DATA};
pub use gpu::{gpu_cases, gpu_or_skip, gpu_required, gpu_runner, or_skip, GPU_CASES, REQUIRE_GPU};
pub use labels::Label;

//! The benchmark campaign of topk (docs/CONTRACTS.md §6).
//!
//! The `topk_bench` binary measures exact top-K retrieval end to end and
//! prints one `TOPK_BENCH_JSON {...}` line per measured configuration. Every
//! configuration is first checked against the scalar oracle, bit for bit; a
//! configuration that fails is reported with `correct = false` and never timed.
//!
//! | module | what it does |
//! | --- | --- |
//! | [`config`] | the flags of one run and their validation |
//! | [`single`] | one configuration from the command line |
//! | [`campaign`] | the full sweep in one process, written row by row |
//! | [`compare`] | the CPU comparison against numpy / faiss-cpu |
//! | [`gate`] | the bitwise correctness check against the oracle |
//! | [`run`] | gate + warm-up + trials of one timed path |
//! | [`gpu`] | the GPU-resident and CPU round-trip paths (feature `cuda`) |
//! | [`record`] | the result record, its JSON line and CSV row |
//! | [`join`] | our records joined with the anchors' by configuration |
//! | [`table`], [`plot`] | the README table, the CPU table, and the plots |
//! | [`membw`], [`environment`] | the floor's bandwidth and the run's environment |
//! | [`scale`] | 1M–20M rows: one engine against sharded `cuda` sets, the upload rate |

pub mod backends;
pub mod campaign;
pub mod compare;
pub mod config;
pub mod data;
pub mod environment;
pub mod error;
pub mod gate;
pub mod gpu;
pub mod join;
pub mod manifest;
pub mod membw;
pub mod plot;
pub mod record;
pub mod run;
pub mod scale;
pub mod single;
pub mod stats;
pub mod table;

pub use config::{Backend, RunConfig, TimedPath};
pub use error::{BenchError, Result};
pub use record::Record;

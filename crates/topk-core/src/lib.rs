//! The contracts every topk backend keeps.
//!
//! topk answers one question: the K rows of a corpus most similar to a query,
//! exactly, with the same bytes on every backend. This crate holds everything
//! the backends must agree on, and nothing else (no I/O, no threads, no unsafe):
//!
//! | item | what it fixes |
//! | --- | --- |
//! | [`Metric`] | the three similarity measures; higher score is better for all |
//! | [`score`] | the canonical score: 32 FMA partial sums + a butterfly tree, bit for bit |
//! | [`order`] | the one ordering of results (score, then smaller index) and its 64-bit key |
//! | [`TopK`] | a bounded selector built on that key, shared by CPU, HNSW and merges |
//! | [`hit`] | results named by external ids ([`Hit`]), their 128-bit key, [`HitTopK`] and [`merge_hits`] (shards) |
//! | [`storage`] | how a corpus stores its values ([`Dtype`]: f32, f16, bf16) and [`RowStore`], rows checked as stored |
//! | [`validate`] | the input rules: shapes, finiteness, the overflow rule (norms), K, empty corpus |
//! | [`Retriever`] | the trait generic code is written against |
//! | [`Error`] | every way an input or a backend can fail, with the offending value |
//!
//! ```
//! use topk_core::{canon_dot, Metric, Neighbor, order::cmp_rank};
//!
//! let q = [1.0_f32, 2.0, 3.0];
//! let rows = [[1.0_f32, 0.0, 0.0], [0.0, 1.0, 1.0], [0.0, 0.0, 1.0]];
//! let mut hits: Vec<Neighbor> = rows
//!     .iter()
//!     .enumerate()
//!     .map(|(i, r)| Neighbor::new(i as u32, Metric::Dot.score_scalar(&q, r)))
//!     .collect();
//! hits.sort_by(cmp_rank);
//! assert_eq!(hits[0], Neighbor::new(1, 5.0));
//! assert_eq!(canon_dot(&q, &rows[0]), 1.0);
//! ```
#![forbid(unsafe_code)]

mod error;
pub mod hit;
mod metric;
pub mod order;
mod retriever;
pub mod score;
mod select;
pub mod storage;
pub mod validate;

pub use error::{Error, Located, Result};
pub use hit::{check_ids, cmp_hit, hit_key, merge_hits, Hit, HitTopK, IdProblem, MAX_ID};
pub use metric::Metric;
pub use order::{cmp_rank, rank_key, Neighbor};
pub use retriever::Retriever;
pub use score::{canon_dot, canon_norm, canon_sqdist, cosine_from_parts, LANES};
pub use select::{TopK, TopKBy};
pub use storage::{Dtype, RowStore};

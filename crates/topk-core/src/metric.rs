//! The similarity measures and their text names.

use std::fmt;
use std::str::FromStr;

use crate::error::Error;
use crate::score::{canon_dot, canon_norm, canon_sqdist, cosine_from_parts};

/// How a query is compared with a row. Higher score is better for every metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(u32)]
pub enum Metric {
    /// Inner product `canon_dot(q, r)`.
    #[default]
    Dot = 0,
    /// `canon_dot(q, r) / (norm(q) * norm(r))`, `-inf` when a norm is zero.
    Cosine = 1,
    /// Negated squared Euclidean distance `-canon_sqdist(q, r)`.
    L2 = 2,
}

impl Metric {
    /// All metrics, for tests and sweeps.
    pub const ALL: [Metric; 3] = [Metric::Dot, Metric::Cosine, Metric::L2];

    /// The lowercase name used on command lines and in files.
    pub fn as_str(self) -> &'static str {
        match self {
            Metric::Dot => "dot",
            Metric::Cosine => "cosine",
            Metric::L2 => "l2",
        }
    }

    /// Scores one row with the scalar reference, computing norms on the fly.
    ///
    /// This is the definition; backends precompute row norms at ingest and must
    /// produce the same bits.
    pub fn score_scalar(self, query: &[f32], row: &[f32]) -> f32 {
        match self {
            Metric::Dot => canon_dot(query, row),
            Metric::Cosine => {
                cosine_from_parts(canon_dot(query, row), canon_norm(query), canon_norm(row))
            }
            Metric::L2 => -canon_sqdist(query, row),
        }
    }

    /// Turns a score into what a user calls a distance where the metric has one
    /// (L2 reports the squared distance); other metrics report the score itself.
    pub fn display_value(self, score: f32) -> f32 {
        match self {
            Metric::L2 => -score,
            Metric::Dot | Metric::Cosine => score,
        }
    }
}

impl fmt::Display for Metric {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Metric {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "dot" | "ip" | "inner" => Ok(Metric::Dot),
            "cosine" | "cos" => Ok(Metric::Cosine),
            "l2" | "euclidean" => Ok(Metric::L2),
            _ => Err(Error::InvalidParameter {
                name: "metric",
                value: s.to_owned(),
                reason: "expected one of dot, cosine, l2".to_owned(),
            }),
        }
    }
}

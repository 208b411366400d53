//! The one list of backends: names, what each is, and whether it can run here.

use std::fmt;
use std::str::FromStr;

/// A backend [`crate::open`] can build.
///
/// Names are lowercase (`cpu`, `oracle`, `cuda`, `hnsw`); parsing ignores
/// case and also takes `gpu` for `cuda`.
///
/// ```
/// use topk::Backend;
///
/// let b: Backend = "CPU".parse()?;
/// assert_eq!(b, Backend::Cpu);
/// assert_eq!(b.to_string(), "cpu");
/// assert!(Backend::ALL.iter().all(|b| b.compiled() || *b == Backend::Cuda));
/// let e = "faiss".parse::<Backend>().unwrap_err();
/// assert!(e.to_string().contains("cpu, oracle, cuda, hnsw"));
/// # Ok::<(), topk::ParseBackendError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Backend {
    /// Multi-threaded SIMD exact search on the CPU ([`topk_cpu::CpuRetriever`]).
    Cpu,
    /// The scalar reference: every row scored, one comparator; slow and obviously right.
    Oracle,
    /// The GPU-resident exact engine (a build with the `cuda` feature and an NVIDIA GPU).
    Cuda,
    /// Approximate: an HNSW graph index ([`topk_hnsw::Hnsw`]).
    Hnsw,
}

impl Backend {
    /// Every backend, in the order help texts list them.
    pub const ALL: [Backend; 4] = [Backend::Cpu, Backend::Oracle, Backend::Cuda, Backend::Hnsw];

    /// The lowercase name used on command lines and in result records.
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Cpu => "cpu",
            Backend::Oracle => "oracle",
            Backend::Cuda => "cuda",
            Backend::Hnsw => "hnsw",
        }
    }

    /// One line saying what the backend is, for help texts.
    pub fn describe(self) -> &'static str {
        match self {
            Backend::Cpu => "Multi-threaded SIMD search on the CPU",
            Backend::Oracle => {
                "Scalar reference: every row scored, one comparator; slow and obviously right"
            }
            Backend::Cuda => "GPU-resident corpus (needs a build with `--features cuda`)",
            Backend::Hnsw => "Approximate: an HNSW graph index",
        }
    }

    /// Whether the backend returns the exact top K (bit-identical to the
    /// oracle); only HNSW is approximate.
    pub fn is_exact(self) -> bool {
        self != Backend::Hnsw
    }

    /// Whether this build includes the backend: `cuda` only with this
    /// crate's `cuda` feature, the others always.
    pub fn compiled(self) -> bool {
        match self {
            Backend::Cuda => cfg!(feature = "cuda"),
            Backend::Cpu | Backend::Oracle | Backend::Hnsw => true,
        }
    }

    /// Whether the backend can run on this machine, and why not.
    ///
    /// The host backends always can; `cuda` needs this crate's `cuda`
    /// feature, the NVIDIA driver and a device (this asks about device 0;
    /// opening an engine on another device checks that one).
    pub fn available(self) -> Result<(), Unavailable> {
        match self {
            Backend::Cpu | Backend::Oracle | Backend::Hnsw => Ok(()),
            Backend::Cuda => crate::cuda::available(),
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Backend {
    type Err = ParseBackendError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let lower = s.to_ascii_lowercase();
        if lower == "gpu" {
            return Ok(Backend::Cuda);
        }
        Backend::ALL
            .into_iter()
            .find(|b| b.as_str() == lower)
            .ok_or_else(|| ParseBackendError {
                given: s.to_owned(),
            })
    }
}

#[cfg(feature = "clap")]
impl clap::ValueEnum for Backend {
    fn value_variants<'a>() -> &'a [Self] {
        &Backend::ALL
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        let value = clap::builder::PossibleValue::new(self.as_str()).help(self.describe());
        Some(match self {
            Backend::Cuda => value.alias("gpu"),
            _ => value,
        })
    }
}

/// A backend name that is none of [`Backend::ALL`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown backend `{given}`: expected one of cpu, oracle, cuda, hnsw")]
pub struct ParseBackendError {
    /// The name given.
    pub given: String,
}

/// Why a backend cannot run here, in words a user can act on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Unavailable {
    /// This build does not include the backend.
    #[error("backend `{backend}` is not in this build (no CUDA support); rebuild with `--features cuda`")]
    NotCompiled {
        /// The backend asked for.
        backend: Backend,
    },
    /// The engine cannot be loaded: its plugin is missing or stale, or the
    /// NVIDIA driver (`libcuda.so.1`) is not installed. The reason says which
    /// and how to fix it.
    #[error("backend `cuda` cannot start: {reason}")]
    NotLoaded {
        /// What failed to load, and how to fix it.
        reason: String,
    },
    /// The engine loads, but the driver finds no usable device (or not the
    /// one asked for).
    #[error("backend `cuda` has no device: {reason}")]
    NoDevice {
        /// What the driver reported.
        reason: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_in_any_case() {
        for b in Backend::ALL {
            assert_eq!(b.as_str().parse::<Backend>(), Ok(b));
            assert_eq!(b.as_str().to_uppercase().parse::<Backend>(), Ok(b));
            assert_eq!(b.to_string(), b.as_str());
        }
        assert_eq!("GPU".parse::<Backend>(), Ok(Backend::Cuda));
    }

    #[test]
    fn unknown_name_lists_the_valid_ones() {
        let e = "faiss".parse::<Backend>().unwrap_err();
        assert_eq!(e.given, "faiss");
        assert_eq!(
            e.to_string(),
            "unknown backend `faiss`: expected one of cpu, oracle, cuda, hnsw"
        );
    }

    #[test]
    fn host_backends_are_compiled_and_available() {
        for b in [Backend::Cpu, Backend::Oracle, Backend::Hnsw] {
            assert!(b.compiled(), "{b}");
            assert_eq!(b.available(), Ok(()), "{b}");
        }
        assert!(!Backend::Hnsw.is_exact());
        assert!(Backend::Cpu.is_exact() && Backend::Cuda.is_exact());
    }

    #[test]
    #[cfg(not(feature = "cuda"))]
    fn cuda_without_the_feature_says_how_to_get_it() {
        assert!(!Backend::Cuda.compiled());
        let e = Backend::Cuda.available().unwrap_err();
        assert_eq!(
            e,
            Unavailable::NotCompiled {
                backend: Backend::Cuda
            }
        );
        assert!(
            e.to_string().contains("rebuild with `--features cuda`"),
            "{e}"
        );
    }

    #[test]
    #[cfg(feature = "clap")]
    fn clap_lists_every_backend() {
        use clap::ValueEnum;
        let names: Vec<String> = Backend::value_variants()
            .iter()
            .filter_map(|b| b.to_possible_value())
            .map(|v| v.get_name().to_owned())
            .collect();
        assert_eq!(names, ["cpu", "oracle", "cuda", "hnsw"]);
        assert_eq!(
            <Backend as ValueEnum>::from_str("gpu", true),
            Ok(Backend::Cuda)
        );
    }
}

//! Why a CUDA backend could not be had: the plugin file, its loading, its
//! version, its build, or the engine inside it.

use std::fmt;
use std::path::PathBuf;

use crate::abi::{BUILD_COMMAND, DRIVER_LIBRARY, PLUGIN_ENV, PLUGIN_FILE};

/// Everything that can go wrong between asking for the CUDA backend and
/// getting an answer from it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// No plugin file where the loader looked.
    #[error(
        "the CUDA plugin {PLUGIN_FILE} was not found (looked for {}); build it with `{BUILD_COMMAND}` and put it next to the executable, or set {PLUGIN_ENV} to its path",
        list(.searched)
    )]
    NotFound {
        /// Every path tried, in order.
        searched: Vec<PathBuf>,
    },
    /// The plugin exists but cannot load because the NVIDIA driver's
    /// `libcuda.so.1` is not on this machine.
    #[error(
        "the NVIDIA driver is not installed: {DRIVER_LIBRARY} cannot be loaded, and the CUDA plugin {} needs it ({reason}); install the NVIDIA driver, or use a CPU backend",
        .path.display()
    )]
    DriverMissing {
        /// The plugin file.
        path: PathBuf,
        /// The dynamic loader's message.
        reason: String,
    },
    /// The plugin exists but the dynamic loader refused it for another reason.
    #[error("cannot load the CUDA plugin {}: {reason}", .path.display())]
    Load {
        /// The plugin file.
        path: PathBuf,
        /// The dynamic loader's message.
        reason: String,
    },
    /// The library loaded but lacks an entry point of the ABI.
    #[error("{} is not a topk CUDA plugin: symbol `{symbol}` is missing ({reason}); rebuild it with `{BUILD_COMMAND}`", .path.display())]
    MissingSymbol {
        /// The plugin file.
        path: PathBuf,
        /// The entry point looked for.
        symbol: String,
        /// The dynamic loader's message.
        reason: String,
    },
    /// The plugin speaks another version of the ABI.
    #[error("the CUDA plugin {} has ABI version {found}, this program needs version {expected}; rebuild it with `{BUILD_COMMAND}` from the same source", .path.display())]
    AbiMismatch {
        /// The plugin file.
        path: PathBuf,
        /// What the plugin reports.
        found: u32,
        /// [`crate::abi::ABI_VERSION`].
        expected: u32,
    },
    /// The plugin was built without the `cuda` feature.
    #[error("the CUDA plugin {} was built without CUDA; rebuild it with `{BUILD_COMMAND}`", .path.display())]
    WithoutCuda {
        /// The plugin file.
        path: PathBuf,
    },
    /// An input broke the rules of docs/CONTRACTS.md §4 (checked here, before
    /// anything crosses into the plugin).
    #[error(transparent)]
    Input(#[from] topk_core::Error),
    /// The engine inside the plugin failed; `message` is its own text.
    #[error("{message}")]
    Engine {
        /// What kind of failure.
        kind: EngineErrorKind,
        /// The engine's message.
        message: String,
    },
}

/// The kinds of engine failure the plugin reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum EngineErrorKind {
    /// The driver could not be initialised (installed, but no usable GPU).
    NoDriver,
    /// No device with the requested ordinal.
    NoDevice,
    /// Device memory ran out.
    OutOfMemory,
    /// An input the engine refused.
    InvalidInput,
    /// A configuration value out of range.
    InvalidOption,
    /// A driver call or kernel module failed.
    Driver,
    /// The plugin caught a panic.
    Panic,
    /// A call the plugin refused as malformed (a loader bug).
    BadArgument,
    /// Anything else, including status codes this version does not know.
    Other,
}

impl fmt::Display for EngineErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            EngineErrorKind::NoDriver => "no driver",
            EngineErrorKind::NoDevice => "no device",
            EngineErrorKind::OutOfMemory => "out of memory",
            EngineErrorKind::InvalidInput => "invalid input",
            EngineErrorKind::InvalidOption => "invalid option",
            EngineErrorKind::Driver => "driver",
            EngineErrorKind::Panic => "panic",
            EngineErrorKind::BadArgument => "bad argument",
            EngineErrorKind::Other => "other",
        })
    }
}

fn list(paths: &[PathBuf]) -> String {
    if paths.is_empty() {
        return "nowhere: the executable's folder is unknown".to_owned();
    }
    paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

impl From<LoadError> for topk_core::Error {
    fn from(e: LoadError) -> Self {
        match e {
            LoadError::Input(inner) => inner,
            other => topk_core::Error::backend("cuda", other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_found_lists_where_it_looked_and_how_to_build() {
        let e = LoadError::NotFound {
            searched: vec![
                PathBuf::from("/a/libtopk_cuda_plugin.so"),
                PathBuf::from("/b"),
            ],
        };
        let msg = e.to_string();
        assert!(msg.contains("/a/libtopk_cuda_plugin.so, /b"), "{msg}");
        assert!(msg.contains(BUILD_COMMAND), "{msg}");
        assert!(msg.contains(PLUGIN_ENV), "{msg}");
    }

    #[test]
    fn driver_missing_names_the_library_and_the_driver() {
        let e = LoadError::DriverMissing {
            path: PathBuf::from("/x/libtopk_cuda_plugin.so"),
            reason: "libcuda.so.1: cannot open shared object file".to_owned(),
        };
        let msg = e.to_string();
        assert!(msg.contains("libcuda.so.1"), "{msg}");
        assert!(msg.contains("NVIDIA driver is not installed"), "{msg}");
    }

    #[test]
    fn input_errors_stay_typed_through_the_core_error() {
        let e: topk_core::Error = LoadError::Input(topk_core::Error::ZeroK).into();
        assert!(matches!(e, topk_core::Error::ZeroK));
        let e: topk_core::Error = LoadError::WithoutCuda {
            path: PathBuf::from("p"),
        }
        .into();
        assert!(matches!(
            e,
            topk_core::Error::Backend {
                backend: "cuda",
                ..
            }
        ));
    }
}

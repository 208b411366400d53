//! The `cuda` arm of [`crate::open`] and [`crate::Backend::available`].
//!
//! The engine is loaded at run time by `topk-cuda-loader`, so this crate
//! never links the NVIDIA driver: a build without the `cuda` feature says how
//! to get it, and a build with it reports a missing plugin, driver or device
//! as [`Unavailable`].

use topk_core::{Metric, Retriever, RowStore};
use topk_cuda_loader::{EngineErrorKind, LoadError};

use crate::backend::{Backend, Unavailable};
use crate::open::Error;
use crate::CudaConfig;

/// Whether the GPU engine can run here: its plugin and the driver load and
/// device 0 exists (an engine opened on another device checks that one).
pub(crate) fn available() -> Result<(), Unavailable> {
    if !Backend::Cuda.compiled() {
        return Err(Unavailable::NotCompiled {
            backend: Backend::Cuda,
        });
    }
    topk_cuda_loader::available().map(|_| ()).map_err(|e| {
        unavailable(e).unwrap_or_else(|e| Unavailable::NotLoaded {
            reason: e.to_string(),
        })
    })
}

/// Builds the GPU engine over `data` (row-major, `dim` values a row).
pub(crate) fn open(
    data: &[f32],
    dim: usize,
    metric: Metric,
    config: &CudaConfig,
) -> Result<Box<dyn Retriever>, Error> {
    compiled()?;
    topk_cuda_loader::open_rowmajor(data, dim, metric, config)
        .map(|engine| Box::new(engine) as Box<dyn Retriever>)
        .map_err(from_load_error)
}

/// An error saying how to get the backend where this build has no `cuda`.
fn compiled() -> Result<(), Error> {
    if Backend::Cuda.compiled() {
        Ok(())
    } else {
        Err(Unavailable::NotCompiled {
            backend: Backend::Cuda,
        }
        .into())
    }
}

/// The facade's error for a failed open.
fn from_load_error(e: LoadError) -> Error {
    match e {
        LoadError::Input(e) => Error::Core(e),
        e => match unavailable(e) {
            Ok(why) => Error::Unavailable(why),
            Err(e) => Error::Cuda(e),
        },
    }
}

/// Builds the GPU engine over the rows of `store`, held on the device as
/// they are stored.
pub(crate) fn open_store(
    store: &RowStore,
    metric: Metric,
    config: &CudaConfig,
) -> Result<Box<dyn Retriever>, Error> {
    compiled()?;
    topk_cuda_loader::open_store(store, metric, config)
        .map(|engine| Box::new(engine) as Box<dyn Retriever>)
        .map_err(from_load_error)
}

/// Why the engine cannot run here, or the error back when it is not about
/// availability (memory, a limit out of range).
fn unavailable(e: LoadError) -> Result<Unavailable, LoadError> {
    match e {
        LoadError::Engine {
            kind: EngineErrorKind::NoDevice | EngineErrorKind::NoDriver,
            message,
        } => Ok(Unavailable::NoDevice { reason: message }),
        e @ (LoadError::NotFound { .. }
        | LoadError::DriverMissing { .. }
        | LoadError::Load { .. }
        | LoadError::MissingSymbol { .. }
        | LoadError::AbiMismatch { .. }
        | LoadError::WithoutCuda { .. }) => Ok(Unavailable::NotLoaded {
            reason: e.to_string(),
        }),
        e => Err(e),
    }
}

//! The build without the `cuda` feature: the same public surface, where
//! construction returns [`CudaError::NotCompiled`] and nothing links libcuda.
//! The engine type is uninhabited, so no method past construction can run.

use ndarray::ArrayView2;
use topk_core::{Dtype, Metric, Neighbor, Retriever, RowStore};

use crate::{
    CudaConfig, CudaError, CudaRetriever, DeviceInfo, GraphLayout, PathCounts, PruneJobs,
    WalkQueries, WalkStatus,
};

/// Uninhabited: no engine exists in a build without CUDA.
pub(crate) enum Engine {}

impl Engine {
    pub(crate) fn new(
        _corpus: ArrayView2<'_, f32>,
        _metric: Metric,
        config: CudaConfig,
    ) -> Result<Self, CudaError> {
        config.check()?;
        Err(CudaError::NotCompiled)
    }
    pub(crate) fn from_rowmajor(
        _data: &[f32],
        _dim: usize,
        _metric: Metric,
        config: CudaConfig,
    ) -> Result<Self, CudaError> {
        config.check()?;
        Err(CudaError::NotCompiled)
    }
    pub(crate) fn from_store(
        _store: &RowStore,
        _metric: Metric,
        config: CudaConfig,
    ) -> Result<Self, CudaError> {
        config.check()?;
        Err(CudaError::NotCompiled)
    }
    pub(crate) fn dtype(&self) -> Dtype {
        match *self {}
    }
    pub(crate) fn len(&self) -> usize {
        match *self {}
    }
    pub(crate) fn dim(&self) -> usize {
        match *self {}
    }
    pub(crate) fn metric(&self) -> Metric {
        match *self {}
    }
    pub(crate) fn config(&self) -> &CudaConfig {
        match *self {}
    }
    pub(crate) fn path_counts(&self) -> PathCounts {
        match *self {}
    }
    pub(crate) fn filter_reruns(&self) -> usize {
        match *self {}
    }
    pub(crate) fn filter_listed(&self) -> usize {
        match *self {}
    }
    pub(crate) fn filter_shadowed(&self) -> usize {
        match *self {}
    }
    pub(crate) fn shadow_bounds(&self) -> bool {
        match *self {}
    }
    pub(crate) fn info(&self) -> &DeviceInfo {
        match *self {}
    }
    pub(crate) fn search_host(
        &self,
        _q: &[f32],
        _k: usize,
        _out: &mut Vec<Neighbor>,
    ) -> Result<(), CudaError> {
        match *self {}
    }
    pub(crate) fn search_batch(
        &self,
        _q: &[f32],
        _k: usize,
    ) -> Result<Vec<Vec<Neighbor>>, CudaError> {
        match *self {}
    }
    pub(crate) fn upload_graph(&self, _layout: &GraphLayout<'_>) -> Result<DeviceGraph, CudaError> {
        match *self {}
    }
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn walk_graph(
        &self,
        _graph: &DeviceGraph,
        _queries: WalkQueries<'_>,
        _ef: usize,
        _width: usize,
        _want: usize,
        _allow: Option<&[u32]>,
        _hits: &mut Vec<Neighbor>,
        _status: &mut Vec<WalkStatus>,
        _select: Option<std::convert::Infallible>,
    ) -> Result<(), CudaError> {
        match *self {}
    }
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn walk_select_rows(
        &self,
        _graph: &DeviceGraph,
        _rows: &[u32],
        _ef: usize,
        _want: usize,
        _cap: usize,
        _lists: &mut Vec<u32>,
        _scores: &mut Vec<f32>,
        _counts: &mut Vec<u32>,
        _status: &mut Vec<WalkStatus>,
    ) -> Result<(), CudaError> {
        match *self {}
    }
    pub(crate) fn prune_lists(
        &self,
        _jobs: &PruneJobs<'_>,
        _cap: usize,
        _out: &mut Vec<u32>,
        _counts: &mut Vec<u32>,
    ) -> Result<(), CudaError> {
        match *self {}
    }
    pub(crate) fn set_graph_lists(
        &self,
        _graph: &mut DeviceGraph,
        _nodes: &[u32],
        _blocks: &[u32],
    ) -> Result<(), CudaError> {
        match *self {}
    }
    pub(crate) fn score_ids(
        &self,
        _queries: &[f32],
        _ids: &[u32],
        _offsets: &[usize],
        _out: &mut [f32],
    ) -> Result<(), CudaError> {
        match *self {}
    }
}

/// A device-resident query; none can exist without CUDA.
#[derive(Debug)]
pub enum DeviceQuery {}

impl DeviceQuery {
    pub(crate) fn upload(engine: &Engine, _query: &[f32]) -> Result<Self, CudaError> {
        match *engine {}
    }
    pub(crate) fn search(
        &self,
        _engine: &Engine,
        _k: usize,
        _out: &mut Vec<Neighbor>,
    ) -> Result<(), CudaError> {
        match *self {}
    }
    pub(crate) fn overwrite(&mut self, _query: &[f32]) -> Result<(), CudaError> {
        match *self {}
    }
    /// Values in the query (D).
    pub fn len(&self) -> usize {
        match *self {}
    }
    /// Always false.
    pub fn is_empty(&self) -> bool {
        match *self {}
    }
}

/// Queries resident on the device; none can exist without CUDA.
#[derive(Debug)]
pub enum DeviceBatch {}

impl DeviceBatch {
    pub(crate) fn upload(engine: &Engine, _queries: &[f32], _nq: usize) -> Result<Self, CudaError> {
        match *engine {}
    }
    pub(crate) fn search(
        &self,
        _engine: &Engine,
        _k: usize,
    ) -> Result<Vec<Vec<Neighbor>>, CudaError> {
        match *self {}
    }
    /// How many queries it holds.
    pub fn len(&self) -> usize {
        match *self {}
    }
    /// Whether it holds no query.
    pub fn is_empty(&self) -> bool {
        match *self {}
    }
}

/// The CPU round-trip baseline; needs CUDA.
#[derive(Debug)]
pub enum RoundTrip {}

impl RoundTrip {
    /// Always [`CudaError::NotCompiled`] (no retriever can exist here).
    pub fn new(gpu: &CudaRetriever, _max_k: usize) -> Result<Self, CudaError> {
        let _ = gpu;
        Err(CudaError::NotCompiled)
    }
    /// Unreachable: no `RoundTrip` exists without CUDA.
    pub fn run(
        &mut self,
        _query: &DeviceQuery,
        _cpu: &dyn Retriever,
        _k: usize,
        _out: &mut Vec<Neighbor>,
    ) -> Result<(), CudaError> {
        match *self {}
    }
}

/// Always [`CudaError::NotCompiled`].
pub fn device_info(_device: usize) -> Result<DeviceInfo, CudaError> {
    Err(CudaError::NotCompiled)
}

/// Always [`CudaError::NotCompiled`].
pub fn measure_d2d_bandwidth(_device: usize, _bytes: usize) -> Result<f64, CudaError> {
    Err(CudaError::NotCompiled)
}

/// The mutable resident corpus in a build without CUDA: construction
/// returns [`CudaError::NotCompiled`], so no method past it can run.
pub struct ResidentCorpus {
    never: Engine,
}

impl std::fmt::Debug for ResidentCorpus {
    fn fmt(&self, _: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.never {}
    }
}

#[allow(missing_docs, clippy::missing_errors_doc)]
impl ResidentCorpus {
    pub fn new(
        _dim: usize,
        _metric: Metric,
        config: CudaConfig,
        _capacity: usize,
    ) -> Result<Self, CudaError> {
        config.check()?;
        Err(CudaError::NotCompiled)
    }
    pub fn with_dtype(
        _dim: usize,
        _dtype: Dtype,
        _metric: Metric,
        config: CudaConfig,
        _capacity: usize,
    ) -> Result<Self, CudaError> {
        config.check()?;
        Err(CudaError::NotCompiled)
    }
    pub fn dtype(&self) -> Dtype {
        match self.never {}
    }
    pub fn len(&self) -> usize {
        match self.never {}
    }
    pub fn is_empty(&self) -> bool {
        match self.never {}
    }
    pub fn stored(&self) -> usize {
        match self.never {}
    }
    pub fn capacity(&self) -> usize {
        match self.never {}
    }
    pub fn tombstones(&self) -> usize {
        match self.never {}
    }
    pub fn dim(&self) -> usize {
        match self.never {}
    }
    pub fn metric(&self) -> Metric {
        match self.never {}
    }
    pub fn config(&self) -> &CudaConfig {
        match self.never {}
    }
    pub fn path_counts(&self) -> PathCounts {
        match self.never {}
    }
    pub fn contains(&self, _id: u64) -> bool {
        match self.never {}
    }
    pub fn add(&mut self, _ids: &[u64], _rows: &[f32]) -> Result<(), CudaError> {
        match self.never {}
    }
    pub fn upsert(&mut self, _ids: &[u64], _rows: &[f32]) -> Result<(), CudaError> {
        match self.never {}
    }
    pub fn remove(&mut self, _ids: &[u64]) -> Result<usize, CudaError> {
        match self.never {}
    }
    pub fn compact(&mut self) -> Result<(), CudaError> {
        match self.never {}
    }
    pub fn search(
        &self,
        _queries: &[f32],
        _k: usize,
        _filter: crate::IdFilter<'_>,
    ) -> Result<Vec<Vec<topk_core::Hit>>, CudaError> {
        match self.never {}
    }
    /// # Safety
    /// As the CUDA build's `ResidentCorpus::search_device`.
    pub unsafe fn search_device(
        &self,
        _queries: u64,
        _nq: usize,
        _k: usize,
        _filter: crate::IdFilter<'_>,
        _stream: u64,
    ) -> Result<Vec<Vec<topk_core::Hit>>, CudaError> {
        match self.never {}
    }
}

/// A graph on the device; none exists in a build without CUDA.
#[derive(Debug)]
pub struct DeviceGraph {
    never: std::convert::Infallible,
}

impl DeviceGraph {
    /// Nodes of the graph.
    pub fn len(&self) -> usize {
        match self.never {}
    }

    /// Whether the graph has no nodes.
    pub fn is_empty(&self) -> bool {
        match self.never {}
    }
}

//! GPU graph search over an uploaded graph, and the GPU build.

use std::cell::Cell;

use ndarray::ArrayView2;
use topk_core::{Metric, Neighbor};
use topk_cuda::CudaRetriever;
use topk_hnsw::{Hnsw, HnswParams};

use crate::args::GpuBuild;
use crate::AnyResult;

/// GPU graph search over one uploaded graph (`Hnsw::upload_graph`,
/// `Hnsw::search_graph_gpu`), counting the walks the device finished and
/// the queries the CPU path answered instead.
pub(crate) struct GraphSearcher<'a> {
    index: &'a Hnsw,
    graph: topk_hnsw::GpuGraph<'a>,
    /// (device walks, host answers) since the last [`GraphSearcher::take_counts`].
    counts: Cell<(usize, usize)>,
}

impl GraphSearcher<'_> {
    pub(crate) fn search(
        &self,
        queries: ArrayView2<'_, f32>,
        k: usize,
        ef: usize,
        width: usize,
    ) -> AnyResult<Vec<Vec<Neighbor>>> {
        let (hits, c) =
            self.index
                .search_graph_gpu_counted(&self.graph, queries, k, ef, width, None)?;
        let (dev, host) = self.counts.get();
        self.counts.set((dev + c.device, host + c.host));
        Ok(hits)
    }

    pub(crate) fn take_counts(&self) -> (usize, usize) {
        self.counts.replace((0, 0))
    }
}

/// Uploads `index`'s graph to the engine that holds its corpus.
pub(crate) fn upload_graph<'a>(
    index: &'a Hnsw,
    gpu: &'a CudaRetriever,
) -> AnyResult<GraphSearcher<'a>> {
    Ok(GraphSearcher {
        index,
        graph: index.upload_graph(gpu)?,
        counts: Cell::new((0, 0)),
    })
}

/// One GPU build of `--gpu-build` over `data` (taken, as the CPU build
/// takes it), progress on `pb` (rows in layer 0).
pub(crate) fn gpu_build(
    data: Vec<f32>,
    dim: usize,
    metric: Metric,
    params: HnswParams,
    gpu: &CudaRetriever,
    build: GpuBuild,
    pb: &indicatif::ProgressBar,
) -> AnyResult<Hnsw> {
    let report = |rows: usize| pb.set_position(rows as u64);
    Ok(match build {
        GpuBuild::Batched(schedule) => Hnsw::build_batched_gpu_with_progress(
            data,
            dim,
            metric,
            params,
            schedule,
            gpu,
            Some(&report),
        )?,
        GpuBuild::Knn => {
            Hnsw::build_from_knn_with_progress(&data, dim, metric, params, gpu, &report)?
        }
    })
}

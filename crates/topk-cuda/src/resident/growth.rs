//! Growing the engine under a resident corpus: the norm buffer, slots and
//! f16 copy of a larger capacity, allocated before anything is replaced,
//! and the plan made again when the rows in use change.

use cust::memory::DeviceBuffer;
use topk_core::Metric;

use crate::driver::alloc;
use crate::engine::Engine;
use crate::error::CudaError;
use crate::plan::Planner;
use crate::slot::Slot;

/// The buffers of a grown engine, allocated before anything is replaced.
pub(crate) struct Growth {
    capacity: usize,
    pub(super) rnorm: DeviceBuffer<f32>,
    pub(super) norms: bool,
    slots: Vec<std::sync::Mutex<Slot>>,
    sizes: crate::slot::Sizes,
    /// Room for the f16 copy of the rows, where the engine keeps one.
    shadow: Option<crate::shadow::Shadow>,
}

impl Engine {
    /// The rows in use become `n`: the plan is made again for them and the
    /// slots' query graphs (captured with the old rows and buffers) dropped.
    pub(crate) fn set_rows(&mut self, n: usize) {
        self.n = n;
        if let Some(shadow) = &mut self.shadow {
            shadow.stale();
        }
        self.planner = Planner::new(n, self.dim(), &self.config, self.search_grid.is_some());
        for slot in &mut self.slots {
            let slot = slot.get_mut().unwrap_or_else(|p| p.into_inner());
            slot.graphs = crate::graph::GraphCache::default();
        }
    }

    /// The norm buffer and slots of `capacity` rows when that is more than
    /// the engine holds (`None` otherwise), allocated without touching the
    /// engine so that running out of memory changes nothing.
    pub(crate) fn staged_growth(&self, capacity: usize) -> Result<Option<Growth>, CudaError> {
        if capacity <= self.capacity {
            return Ok(None);
        }
        let shape = Engine::shape_for(capacity, self.dim(), self.dtype(), &self.config, self.lists);
        let norms = self.metric() == Metric::Cosine || shape.filter_list > 0;
        let rnorm = alloc::<f32>("row norms", if norms { capacity } else { 1 })?;
        let slots = Engine::make_slots(
            &shape,
            self.config.streams,
            self.map_results,
            self.map_queries,
        )?;
        let shadow = self.shadow_for(capacity)?;
        Ok(Some(Growth {
            capacity,
            rnorm,
            norms,
            slots,
            sizes: shape.sizes,
            shadow,
        }))
    }

    /// Replaces the norm buffer and slots by grown ones (the caller then
    /// recomputes the norms).
    pub(crate) fn install_growth(&mut self, g: Growth) {
        for s in &self.slots {
            let slot = s.lock().unwrap_or_else(|p| p.into_inner());
            if let Err(e) = slot.stream.synchronize() {
                tracing::warn!("topk-cuda: stream error before growth: {e}");
            }
        }
        self.capacity = g.capacity;
        self.rnorm = g.rnorm;
        self.norms = g.norms;
        self.slots = g.slots;
        self.sizes = g.sizes;
        // Stale until the next filtered chunk makes it.
        self.shadow = g.shadow;
    }
}

//! The graph walk (`kernels/walk.cu`): every query's whole HNSW search in
//! one launch, one block per query.

use std::ffi::c_void;

use topk_core::Metric;

use super::{allow_shared, fits_shared, kernel_args, metric_slot, Kernels, Launch, Queue};
use crate::device::DevNeighbor;
use crate::driver::DevSlice;
use crate::error::CudaError;
use crate::walk_layout::MAX_WALK_DEGREE as WALK_MAX_DEGREE;

/// Threads per block of the walk (`WALK_THREADS`).
pub(crate) const WALK_THREADS: u32 = 256;
/// Bytes of one beam entry (`WalkEntry`).
const ENTRY_BYTES: usize = 16;

/// The resident graph as the walk reads it: layer 0 (`n` blocks of
/// `1 + m0` slots: a count, then ids), the upper layers' blocks of `1 + m`
/// slots and, per node, the offset of its first upper block.
#[derive(Clone, Copy)]
pub(crate) struct WalkGraph<'a> {
    pub(crate) layer0: DevSlice<'a, u32>,
    pub(crate) m0: u32,
    pub(crate) upper: DevSlice<'a, u32>,
    pub(crate) upper_off: DevSlice<'a, u32>,
    pub(crate) m: u32,
    pub(crate) entry: u32,
    pub(crate) top: u32,
}

/// One walk launch: `nq` queries (`queries`, nq × d) against the corpus
/// (`corpus`, n × d, row norms `rnorm` for cosine), results into `out`
/// (nq × want) and `status` (nq), optionally restricted to the nodes whose
/// bit is set in `allow` (n bits, 32 per word).
pub(crate) struct WalkArgs<'a> {
    pub(crate) corpus: DevSlice<'a, f32>,
    pub(crate) rnorm: DevSlice<'a, f32>,
    pub(crate) n: u32,
    pub(crate) d: u32,
    pub(crate) queries: DevSlice<'a, f32>,
    pub(crate) nq: u32,
    pub(crate) graph: WalkGraph<'a>,
    pub(crate) allow: Option<DevSlice<'a, u32>>,
    pub(crate) ef: u32,
    pub(crate) want: u32,
    pub(crate) cap: u32,
    pub(crate) table_slots: u32,
    pub(crate) out: DevSlice<'a, DevNeighbor>,
    pub(crate) status: DevSlice<'a, u32>,
}

/// Dynamic shared memory of a walk block (the layout of `walk_query`).
fn walk_smem(d: usize, cap: usize, table_slots: usize) -> usize {
    let query = (d * 4).div_ceil(16) * 16;
    query
        + 2 * (cap + WALK_MAX_DEGREE) * ENTRY_BYTES
        + 2 * WALK_MAX_DEGREE * ENTRY_BYTES
        + WALK_MAX_DEGREE * 4
        + table_slots * 4
}

impl Kernels {
    /// Launches the walk of every query on `q`. Checks every buffer
    /// against the sizes the kernel reads and writes; the graph's ids and
    /// offsets were checked on the host when it was uploaded.
    pub(crate) fn walk(
        &self,
        q: Queue<'_>,
        metric: Metric,
        a: &WalkArgs<'_>,
    ) -> Result<(), CudaError> {
        let (n, d, nq) = (a.n as usize, a.d as usize, a.nq as usize);
        let g = &a.graph;
        a.corpus.need("corpus", n * d)?;
        if metric == Metric::Cosine {
            a.rnorm.need("row norms", n)?;
        }
        a.queries.need("walk queries", nq * d)?;
        g.layer0.need("layer-0 lists", n * (1 + g.m0 as usize))?;
        g.upper_off.need("upper-layer offsets", n)?;
        if let Some(allow) = a.allow {
            allow.need("allowed nodes", n.div_ceil(32))?;
        }
        a.out.need("walk results", nq * a.want as usize)?;
        a.status.need("walk status", nq)?;
        let bad = |name, value: usize, reason| {
            Err(CudaError::InvalidOption {
                name,
                value,
                reason,
            })
        };
        if g.m0 as usize > WALK_MAX_DEGREE || g.m as usize > WALK_MAX_DEGREE {
            return bad(
                "graph degree",
                g.m0.max(g.m) as usize,
                "the GPU walk takes at most 128 neighbours per list",
            );
        }
        if a.ef == 0 || a.want == 0 || a.want > a.ef || a.cap < a.ef {
            return bad("walk ef", a.ef as usize, "need 1 <= want <= ef <= cap");
        }
        if !a.table_slots.is_power_of_two() {
            return bad(
                "seen-set slots",
                a.table_slots as usize,
                "must be a power of two",
            );
        }
        if g.entry as usize >= n.max(1) {
            return bad(
                "entry node",
                g.entry as usize,
                "must be a node of the graph",
            );
        }
        if nq == 0 {
            return Ok(());
        }
        let smem = walk_smem(d, a.cap as usize, a.table_slots as usize);
        let f = self.walk[metric_slot(metric)];
        if !fits_shared(f, smem)? {
            return bad(
                "walk shared memory (bytes)",
                smem,
                "ef or D too large for one block of this device",
            );
        }
        allow_shared(f, smem)?;
        kernel_args!(
            args = [
                corpus = a.corpus.ptr(),
                rnorm = a.rnorm.ptr(),
                d = a.d,
                queries = a.queries.ptr(),
                layer0 = g.layer0.ptr(),
                m0 = g.m0,
                upper = g.upper.ptr(),
                upper_off = g.upper_off.ptr(),
                m = g.m,
                entry = g.entry,
                top = g.top,
                allow = a.allow.map_or(0, |s| s.ptr()),
                ef = a.ef,
                want = a.want,
                cap = a.cap,
                mask = a.table_slots - 1,
                out = a.out.ptr(),
                status = a.status.ptr()
            ]
        );
        let launch = Launch::new("topk_walk", f, (a.nq, 1), WALK_THREADS).shared(smem);
        // SAFETY: the parameter list of topk_walk_*; every buffer checked
        // above; list ids and upper offsets in range by the upload's host
        // check; the dynamic shared memory is allowed just above.
        unsafe { launch.run(q, &mut args) }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{define, WALK_CU};
    use super::*;

    #[test]
    fn host_constants_mirror_the_walk_kernel() {
        assert_eq!(define(WALK_CU, "WALK_THREADS"), WALK_THREADS as usize);
        assert_eq!(define(WALK_CU, "WALK_MAX_DEGREE"), WALK_MAX_DEGREE);
    }
}

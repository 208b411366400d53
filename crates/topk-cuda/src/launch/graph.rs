//! CUDA graphs built node by node (no stream capture, so other threads'
//! CUDA calls cannot interfere) and their replay.

use std::ffi::c_void;

use cust::sys as cu;

use crate::driver::{check, DPtr};
use crate::error::CudaError;

/// One end of a graph copy.
pub(super) enum Mem {
    Host(*mut c_void),
    Device(DPtr),
}

/// The parameters of a plain 1-D copy of `bytes` from `src` to `dst`
/// (every field set: the memory-type fields are enums with no zero value).
fn memcpy_params(dst: Mem, src: Mem, bytes: usize) -> cu::CUDA_MEMCPY3D {
    let side = |m: Mem| match m {
        Mem::Host(h) => (cu::CUmemorytype::CU_MEMORYTYPE_HOST, h, 0),
        Mem::Device(d) => (
            cu::CUmemorytype::CU_MEMORYTYPE_DEVICE,
            std::ptr::null_mut(),
            d,
        ),
    };
    let (src_type, src_host, src_device) = side(src);
    let (dst_type, dst_host, dst_device) = side(dst);
    cu::CUDA_MEMCPY3D {
        srcXInBytes: 0,
        srcY: 0,
        srcZ: 0,
        srcLOD: 0,
        srcMemoryType: src_type,
        srcHost: src_host as *const c_void,
        srcDevice: src_device,
        srcArray: std::ptr::null_mut(),
        reserved0: std::ptr::null_mut(),
        srcPitch: 0,
        srcHeight: 0,
        dstXInBytes: 0,
        dstY: 0,
        dstZ: 0,
        dstLOD: 0,
        dstMemoryType: dst_type,
        dstHost: dst_host,
        dstDevice: dst_device,
        dstArray: std::ptr::null_mut(),
        reserved1: std::ptr::null_mut(),
        dstPitch: 0,
        dstHeight: 0,
        WidthInBytes: bytes,
        Height: 1,
        Depth: 1,
    }
}

/// A graph being built as a chain: each node depends on the one before.
/// Built node by node rather than captured from a stream, so that no other
/// thread's CUDA calls can interfere while it is made.
pub(crate) struct GraphBuild {
    graph: cu::CUgraph,
    ctx: cu::CUcontext,
    last: std::cell::Cell<cu::CUgraphNode>,
}

impl GraphBuild {
    /// An empty graph in the current context.
    pub(crate) fn new() -> Result<Self, CudaError> {
        let mut ctx: cu::CUcontext = std::ptr::null_mut();
        // SAFETY: `ctx` is valid for one write.
        check("cuCtxGetCurrent", unsafe { cu::cuCtxGetCurrent(&mut ctx) })?;
        let mut graph: cu::CUgraph = std::ptr::null_mut();
        // SAFETY: `graph` is valid for one write.
        check("cuGraphCreate", unsafe { cu::cuGraphCreate(&mut graph, 0) })?;
        Ok(GraphBuild {
            graph,
            ctx,
            last: std::cell::Cell::new(std::ptr::null_mut()),
        })
    }

    /// The dependency list of the next node: the last one, if any.
    fn deps(&self) -> (*const cu::CUgraphNode, usize) {
        let last = self.last.as_ptr() as *const cu::CUgraphNode;
        if self.last.get().is_null() {
            (std::ptr::null(), 0)
        } else {
            (last, 1)
        }
    }

    /// Appends a kernel node (a cooperative one with `cooperative`).
    ///
    /// # Safety
    /// As `Launch::run`; the buffers stay valid while the graph lives.
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn kernel(
        &self,
        op: &'static str,
        f: cu::CUfunction,
        grid: (u32, u32),
        block: u32,
        shared: u32,
        args: &mut [*mut c_void],
        cooperative: bool,
    ) -> Result<(), CudaError> {
        let params = cu::CUDA_KERNEL_NODE_PARAMS {
            func: f,
            gridDimX: grid.0,
            gridDimY: grid.1,
            gridDimZ: 1,
            blockDimX: block,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: shared,
            kernelParams: args.as_mut_ptr(),
            extra: std::ptr::null_mut(),
        };
        let (deps, ndeps) = self.deps();
        let mut node: cu::CUgraphNode = std::ptr::null_mut();
        // SAFETY: the driver copies the parameters (and the argument values
        // they point at) into the node; `node` is valid for one write.
        check(op, unsafe {
            cu::cuGraphAddKernelNode(&mut node, self.graph, deps, ndeps, &params)
        })?;
        if cooperative {
            // The attribute value is a union the driver reads as its own
            // (larger, in newer headers) type: pass zeroed room for it with
            // `cooperative` (its first member) set.
            let mut value = [0u64; 8];
            // SAFETY: `value` is 64 bytes, aligned for an i32 at its start.
            unsafe { (value.as_mut_ptr() as *mut i32).write(1) };
            // SAFETY: `node` was just added; `value` outlives the call.
            check(op, unsafe {
                cu::cuGraphKernelNodeSetAttribute(
                    node,
                    cu::CUkernelNodeAttrID::CU_KERNEL_NODE_ATTRIBUTE_COOPERATIVE,
                    value.as_ptr() as *const cu::CUkernelNodeAttrValue,
                )
            })?;
        }
        self.last.set(node);
        Ok(())
    }

    /// Appends a copy node of `bytes` from `src` to `dst`.
    ///
    /// # Safety
    /// Both ranges are valid for `bytes` (host ones pinned) while the graph lives.
    pub(super) unsafe fn copy(&self, dst: Mem, src: Mem, bytes: usize) -> Result<(), CudaError> {
        let p = memcpy_params(dst, src, bytes);
        let (deps, ndeps) = self.deps();
        let mut node: cu::CUgraphNode = std::ptr::null_mut();
        // SAFETY: `p` describes the two ranges of the contract; `node` is
        // valid for one write.
        check("cuGraphAddMemcpyNode", unsafe {
            cu::cuGraphAddMemcpyNode(&mut node, self.graph, deps, ndeps, &p, self.ctx)
        })?;
        self.last.set(node);
        Ok(())
    }

    /// Instantiates the graph for replay.
    pub(crate) fn finish(self) -> Result<Replay, CudaError> {
        let graph = self.graph;
        // The Replay (or the error path) owns the graph from here on.
        std::mem::forget(self);
        let mut exec: cu::CUgraphExec = std::ptr::null_mut();
        // SAFETY: `exec` is valid for one write; `graph` is complete.
        let status = unsafe { cu::cuGraphInstantiateWithFlags(&mut exec, graph, 0) };
        if let Err(e) = check("cuGraphInstantiate", status) {
            // SAFETY: the graph is ours and instantiated nowhere.
            unsafe { cu::cuGraphDestroy(graph) };
            return Err(e);
        }
        Ok(Replay { graph, exec })
    }
}

impl Drop for GraphBuild {
    fn drop(&mut self) {
        // SAFETY: the graph is ours (finish forgets self) and was never
        // instantiated.
        unsafe { cu::cuGraphDestroy(self.graph) };
    }
}

/// A built sequence of launches and copies, instantiated: one launch replays
/// it with the same parameters and buffers.
pub(crate) struct Replay {
    graph: cu::CUgraph,
    exec: cu::CUgraphExec,
}

// SAFETY: graph handles are not bound to a thread; the engine uses each one
// under its slot's mutex, with the context current.
unsafe impl Send for Replay {}

impl Replay {
    /// Queues the whole sequence on `stream`.
    pub(crate) fn launch(&self, stream: cu::CUstream) -> Result<(), CudaError> {
        // SAFETY: the executable graph is live; its buffers belong to the
        // slot that owns it and outlive it.
        check("cuGraphLaunch", unsafe {
            cu::cuGraphLaunch(self.exec, stream)
        })
    }
}

impl Drop for Replay {
    fn drop(&mut self) {
        // SAFETY: both handles are ours; the owner's context is current (the
        // engine makes it so before its slots drop) and the stream that
        // replayed them was synchronised.
        unsafe {
            cu::cuGraphExecDestroy(self.exec);
            cu::cuGraphDestroy(self.graph);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn graph_copy_parameters_describe_a_plain_copy() {
        let mut host = [0u8; 64];
        let h = host.as_mut_ptr() as *mut c_void;
        let up = memcpy_params(Mem::Device(0x1000), Mem::Host(h), 64);
        assert_eq!(up.srcMemoryType, cu::CUmemorytype::CU_MEMORYTYPE_HOST);
        assert_eq!(up.srcHost, h as *const c_void);
        assert_eq!(up.dstMemoryType, cu::CUmemorytype::CU_MEMORYTYPE_DEVICE);
        assert_eq!(up.dstDevice, 0x1000);
        assert_eq!((up.WidthInBytes, up.Height, up.Depth), (64, 1, 1));
        let down = memcpy_params(Mem::Host(h), Mem::Device(0x2000), 8);
        assert_eq!(down.srcMemoryType, cu::CUmemorytype::CU_MEMORYTYPE_DEVICE);
        assert_eq!(down.srcDevice, 0x2000);
        assert_eq!(down.dstMemoryType, cu::CUmemorytype::CU_MEMORYTYPE_HOST);
        assert_eq!(down.dstHost, h);
        assert_eq!((down.WidthInBytes, down.Height, down.Depth), (8, 1, 1));
    }
}

// Shared by the Hopper bounds labs (wgmma16_lab.cu, tma_lab.cu; not part of
// the engine): the kernels that make their half operands. Include after
// filter90.cu.
#pragma once

// topk_queries16's half operands of f32 queries and their inverse scales.
template <class T>
__global__ void lab_queries16(const float* __restrict__ q, unsigned nq, unsigned d,
                              T* __restrict__ out, float* __restrict__ inv) {
    w9_halves(q, nq, d, out, inv);
}

// Rows rounded to T (nearest even), and the stored values widened back.
template <class T>
__global__ void lab_narrow(const float* __restrict__ x, size_t count, T* __restrict__ out,
                           float* __restrict__ wide) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count;
         i += (size_t)gridDim.x * blockDim.x) {
        const T h = w9_round(x[i], T{});
        out[i] = h;
        wide[i] = topk_widen(h);
    }
}

// Block shapes of the batch scoring kernels (topk-cuda mirrors these
// numbers; the batch lab, bench/gpu/lab/batch_lab.cu, reads them too).
#ifndef TOPK_SHAPES_CUH
#define TOPK_SHAPES_CUH
#include "common.cuh"

#define BATCH_QT 8
#define BATCH_RT 4

// The two resident-query batch shapes (topk-cuda mirrors these numbers):
// 32 queries x 32 rows per block for larger batches, 16 x 64 for small ones;
// both with two stages of two chunks (one barrier per 256 columns, measured
// faster on an H200 than three or four stages of one chunk:
// bench/gpu/NOTES.md).
#define BQ32_WR 4
#define BQ32_WQ 2
#define BQ32_RT 8
#define BQ32_QT 16
#define BQ32_DEPTH 2
#define BQ32_SUB 2
#define BQ32_THREADS (BQ32_WR * BQ32_WQ * TOPK_WARP)
#define BQ16_WR 8
#define BQ16_WQ 1
#define BQ16_RT 8
#define BQ16_QT 16
#define BQ16_DEPTH 2
#define BQ16_SUB 2
#define BQ16_THREADS (BQ16_WR * BQ16_WQ * TOPK_WARP)

#endif  // TOPK_SHAPES_CUH

// Shared by the lab programs of bench/gpu/lab (not part of the engine):
// a CUDA runtime call that fails ends the program with the call and reason.
#pragma once

#include <cstdio>
#include <cstdlib>

#define CK(x)                                                                                \
    do {                                                                                     \
        cudaError_t e = (x);                                                                 \
        if (e != cudaSuccess) {                                                              \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); \
            exit(1);                                                                         \
        }                                                                                    \
    } while (0)

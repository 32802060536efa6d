// fox/tma.cuh: tensor maps for the bulk tensor copy engine (TMA, sm_90): the host side of tma_load_3d
// (fox/attention_primitives.cuh). The encoder is the driver's cuTensorMapEncodeTiled, reached through the
// runtime's cudaGetDriverEntryPointByVersion, so the programs keep linking cudart alone (no -lcuda).
#ifndef FOX_TMA_CUH
#define FOX_TMA_CUH

#include <stdio.h>            // fprintf
#include <stdlib.h>           // exit
#include <cuda.h>             // CUtensorMap and its enums (types only)
#include <cudaTypedefs.h>     // PFN_cuTensorMapEncodeTiled_v12000 (the 12.0 signature asked for below)
#include <cuda_runtime.h>     // cudaGetDriverEntryPointByVersion
#include "cuda_common.cuh"    // FOX_CUDA_CHECK

namespace fox_attn {

// The driver's encoder, looked up once.
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
    static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
        void *p = nullptr;
        cudaDriverEntryPointQueryResult found;
        FOX_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &found));
        if (found != cudaDriverEntryPointSuccess || !p) {
            fprintf(stderr, "fox_attn: the driver has no cuTensorMapEncodeTiled\n");
            exit(EXIT_FAILURE);
        }
        return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
    }();
    return fn;
}

// A map of a bf16 tensor [planes][rows][cols] (rows of cols contiguous elements, e.g. [B H][T][d_h]) whose
// box is box_rows x 64 columns of one plane, written into smem with the 128-byte swizzle (the swz<64> layout
// of one 64-column half, fox/attention_primitives.cuh); rows past `rows` come in as zeros.
inline CUtensorMap tma_map_bf16_3d(const void *base, int cols, int rows, int planes, int box_rows) {
    CUtensorMap map;
    const cuuint64_t dims[3] = {(cuuint64_t)cols, (cuuint64_t)rows, (cuuint64_t)planes};
    const cuuint64_t strides[2] = {(cuuint64_t)cols * 2, (cuuint64_t)rows * cols * 2};  // bytes, dims 1 and 2
    const cuuint32_t box[3] = {64, (cuuint32_t)box_rows, 1};
    const cuuint32_t elem_strides[3] = {1, 1, 1};
    const CUresult r = tensor_map_encoder()(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<void *>(base), dims,
                                            strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                            CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
        fprintf(stderr, "fox_attn: cuTensorMapEncodeTiled failed (%d) for [%d][%d][%d], box %d x 64\n", (int)r, planes,
                rows, cols, box_rows);
        exit(EXIT_FAILURE);
    }
    return map;
}

}  // namespace fox_attn

#endif  // FOX_TMA_CUH

// GPTQ-packed weights on the CPU (backend/engine/quantization/gptq_awq.py has the layout): y [rows, n]
// (row stride ldy) = x [rows, k] @ W^T for a few rows, W[j, i] = scale[g[i], j] * (q[i, j] - zero[g[i], j]),
// q packed 32 / BITS input rows per int32 of qweight [k / f, n], zero - 1 packed along n in qzeros
// [groups, n / f], fp16 scales [groups, n], int32 g_idx [k]. Outputs are taken BLOCK at a time: the
// block's zeros and scales are decoded once for all groups, then every packed row of qweight is read once
// (contiguous BLOCK int32s) and multiplied into every x row, in fp32. Built by backend/engine/cpu_kernels.py.
#include <cstdint>
#include <cstring>
#include <vector>

#include "dtypes.h"

namespace {

constexpr int MAX_ROWS = 8;
constexpr int64_t BLOCK = 16;

template <int BITS, typename T>
void gptq_gemv(const T *x, const int32_t *qweight, const int32_t *qzeros, const uint16_t *scales,
               const int32_t *g_idx, const T *bias, T *y, int64_t rows, int64_t n, int64_t k, int64_t groups,
               int64_t ldy) {
    constexpr int F = 32 / BITS;
    constexpr uint32_t MASK = (1u << BITS) - 1;
    std::vector<float> xf(rows * k);
    for (int64_t i = 0; i < rows * k; i++) xf[i] = to_float(x[i]);
#pragma omp parallel for schedule(static)
    for (int64_t j0 = 0; j0 < n; j0 += BLOCK) {
        const int64_t width = n - j0 < BLOCK ? n - j0 : BLOCK;
        std::vector<float> zero(groups * BLOCK), scale(groups * BLOCK);
        for (int64_t g = 0; g < groups; g++) {
            for (int64_t c = 0; c < width; c++) {
                const int64_t j = j0 + c;
                const uint32_t packed = uint32_t(qzeros[g * (n / F) + j / F]);
                zero[g * BLOCK + c] = float(((packed >> (BITS * (j % F))) & MASK) + 1);
                scale[g * BLOCK + c] = half_to_float(scales[g * n + j]);
            }
        }
        float acc[MAX_ROWS][BLOCK] = {};
        for (int64_t p = 0; p < k / F; p++) {
            const int32_t *qrow = qweight + p * n + j0;
            for (int s = 0; s < F; s++) {
                const int64_t i = p * F + s;
                const float *z = zero.data() + g_idx[i] * BLOCK, *sc = scale.data() + g_idx[i] * BLOCK;
                float w[BLOCK];
                for (int64_t c = 0; c < width; c++)
                    w[c] = sc[c] * (float((uint32_t(qrow[c]) >> (BITS * s)) & MASK) - z[c]);
                for (int64_t r = 0; r < rows; r++) {
                    const float xv = xf[r * k + i];
#pragma omp simd
                    for (int64_t c = 0; c < width; c++) acc[r][c] += xv * w[c];
                }
            }
        }
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < width; c++)
                store(y[r * ldy + j0 + c], acc[r][c] + (bias ? to_float(bias[j0 + c]) : 0.0f));
    }
}

}  // namespace

#define EXPORT(BITS, T, SUFFIX)                                                                              \
    extern "C" void gptq_gemv_w##BITS##_##SUFFIX(const T *x, const int32_t *qweight, const int32_t *qzeros,  \
                                                 const uint16_t *scales, const int32_t *g_idx, const T *bias, \
                                                 T *y, int64_t rows, int64_t n, int64_t k, int64_t groups,   \
                                                 int64_t ldy) {                                              \
        gptq_gemv<BITS>(x, qweight, qzeros, scales, g_idx, bias, y, rows, n, k, groups, ldy);              \
    }
EXPORT(4, float, f32)
EXPORT(4, BFloat16, bf16)
EXPORT(8, float, f32)
EXPORT(8, BFloat16, bf16)

// Small fused CPU ops for the decoder layer, each replacing several torch ops whose dispatch overhead
// (a few microseconds each) dominates small batches: RMSNorm, SiLU-and-multiply, and a matrix-vector
// product over bf16 weights for batches of a few rows. Arithmetic follows transformers': fp32 inside,
// rounded to the storage type where transformers rounds. Built and loaded by backend/engine/cpu_kernels.py.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "dtypes.h"

namespace {

// out = weight * round(x * rsqrt(mean(x^2) + eps)), per row of x [rows, dim]
template <typename T>
void rms_norm(const T *x, const T *weight, T *out, int64_t rows, int64_t dim, float eps) {
#pragma omp parallel for schedule(static) if (rows > 1)
    for (int64_t r = 0; r < rows; r++) {
        const T *xr = x + r * dim;
        float squares = 0.0f;
#pragma omp simd reduction(+ : squares)
        for (int64_t i = 0; i < dim; i++) squares += to_float(xr[i]) * to_float(xr[i]);
        const float inv = 1.0f / std::sqrt(squares / float(dim) + eps);
        for (int64_t i = 0; i < dim; i++) {
            store(out[r * dim + i], to_float(weight[i]) * round_to<T>(to_float(xr[i]) * inv));
        }
    }
}

// out [rows, dim] = silu(gate_up[:, :dim]) * gate_up[:, dim:]
template <typename T>
void silu_and_mul(const T *gate_up, T *out, int64_t rows, int64_t dim) {
#pragma omp parallel for schedule(static) if (rows > 1)
    for (int64_t r = 0; r < rows; r++) {
        const T *gate = gate_up + r * 2 * dim, *up = gate + dim;
        for (int64_t i = 0; i < dim; i++) {
            const float g = to_float(gate[i]);
            store(out[r * dim + i], round_to<T>(g / (1.0f + std::exp(-g))) * to_float(up[i]));
        }
    }
}

}  // namespace

extern "C" {
void rms_norm_f32(const float *x, const float *w, float *out, int64_t rows, int64_t dim, float eps) {
    rms_norm(x, w, out, rows, dim, eps);
}
void rms_norm_bf16(const BFloat16 *x, const BFloat16 *w, BFloat16 *out, int64_t rows, int64_t dim, float eps) {
    rms_norm(x, w, out, rows, dim, eps);
}
void silu_and_mul_f32(const float *gate_up, float *out, int64_t rows, int64_t dim) {
    silu_and_mul(gate_up, out, rows, dim);
}
void silu_and_mul_bf16(const BFloat16 *gate_up, BFloat16 *out, int64_t rows, int64_t dim) {
    silu_and_mul(gate_up, out, rows, dim);
}

// y [rows, n] = x [rows, k] @ weight [n, k]^T (+ bias [n]), bf16 in and out, fp32 accumulation: for a few
// rows, where reading the weights once is the whole cost (about 25% faster than torch's bf16 GEMV here).
void linear_bf16_small(const BFloat16 *x, const BFloat16 *weight, const BFloat16 *bias, BFloat16 *y,
                       int64_t rows, int64_t n, int64_t k) {
    std::vector<float> xf(rows * k);
    for (int64_t i = 0; i < rows * k; i++) xf[i] = to_float(x[i]);
#pragma omp parallel for schedule(static)
    for (int64_t j = 0; j < n; j++) {
        const BFloat16 *w = weight + j * k;
        for (int64_t r = 0; r < rows; r++) {
            const float *xr = xf.data() + r * k;
            float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
            for (int64_t i = 0; i < k; i++) acc += xr[i] * to_float(w[i]);
            store(y[r * n + j], acc + (bias ? to_float(bias[j]) : 0.0f));
        }
    }
}
}

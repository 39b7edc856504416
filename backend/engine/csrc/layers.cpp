// Small fused CPU ops for the decoder layer, each replacing several torch ops whose dispatch overhead
// (a few microseconds each) dominates small batches: RMSNorm, SiLU-and-multiply, RoPE with the KV-cache
// write, and a matrix-vector product over bf16 weights for batches of a few rows. Arithmetic follows transformers': fp32 inside,
// rounded to the storage type where transformers rounds. Built and loaded by backend/engine/cpu_kernels.py.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
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

// residual_out = round(x + residual) (the decoder's residual add, in the storage type, as torch adds), and
// out = rms_norm(residual_out): vLLM's fused_add_rms_norm, one pass and one parallel region instead of two
template <typename T>
void add_rms_norm(const T *x, const T *residual, const T *weight, T *out, T *residual_out, int64_t rows,
                  int64_t dim, float eps) {
#pragma omp parallel for schedule(static) if (rows > 1)
    for (int64_t r = 0; r < rows; r++) {
        const T *xr = x + r * dim, *rr = residual + r * dim;
        T *sum = residual_out + r * dim;
        float squares = 0.0f;
#pragma omp simd reduction(+ : squares)
        for (int64_t i = 0; i < dim; i++) {
            const float h = round_to<T>(to_float(xr[i]) + to_float(rr[i]));
            store(sum[i], h);
            squares += h * h;
        }
        const float inv = 1.0f / std::sqrt(squares / float(dim) + eps);
#pragma omp simd
        for (int64_t i = 0; i < dim; i++) {
            store(out[r * dim + i], to_float(weight[i]) * round_to<T>(to_float(sum[i]) * inv));
        }
    }
}

// out [rows, dim] = silu(gate_up[:, :dim]) * gate_up[:, dim:]
template <typename T>
void silu_and_mul(const T *gate_up, T *out, int64_t rows, int64_t dim) {
#pragma omp parallel for schedule(static) if (rows > 1)
    for (int64_t r = 0; r < rows; r++) {
        const T *gate = gate_up + r * 2 * dim, *up = gate + dim;
#pragma omp simd
        for (int64_t i = 0; i < dim; i++) {
            const float g = to_float(gate[i]);
            store(out[r * dim + i], round_to<T>(g / (1.0f + fast_exp(-g))) * to_float(up[i]));
        }
    }
}

// qkv [tokens, (heads + 2 * kv_heads) * D], the fused projection's output: rotates the q and k heads in
// place (rotate-half RoPE, cos/sin tables [positions, D] with both halves filled, as transformers builds
// them) and copies each token's k and v heads into pool slot slots[t] of k/v_cache [kv_heads, pool, D]
// (an fp8 pool stores k / k_scale and v / v_scale, clamped to +-limit, as attention.py's write_kv_cache).
template <typename T, typename C>
void rope_and_cache(T *qkv, const int64_t *positions, const T *cos, const T *sin, const int64_t *slots,
                    C *k_cache, C *v_cache, int64_t tokens, int64_t heads, int64_t kv_heads, int64_t D,
                    int64_t pool_slots, float k_scale, float v_scale, float limit) {
    const int64_t half = D / 2, width = (heads + 2 * kv_heads) * D;
#pragma omp parallel for schedule(static) if (tokens > 1)
    for (int64_t t = 0; t < tokens; t++) {
        const T *c = cos + positions[t] * D, *s = sin + positions[t] * D;
        T *row = qkv + t * width;
        for (int64_t h = 0; h < heads + kv_heads; h++) {
            T *x = row + h * D;
            for (int64_t i = 0; i < half; i++) {  // x * cos + cat(-x2, x1) * sin, rounded as torch does
                const float a = to_float(x[i]), b = to_float(x[i + half]);
                const float lo = round_to<T>(a * to_float(c[i])) + round_to<T>(-b * to_float(s[i]));
                const float hi = round_to<T>(b * to_float(c[i + half])) + round_to<T>(a * to_float(s[i + half]));
                store(x[i], lo);
                store(x[i + half], hi);
            }
        }
        for (int64_t h = 0; h < kv_heads; h++) {
            const int64_t slot = (h * pool_slots + slots[t]) * D;
            const T *k = row + (heads + h) * D, *v = row + (heads + kv_heads + h) * D;
            if constexpr (std::is_same_v<T, C>) {
                std::memcpy(k_cache + slot, k, D * sizeof(T));
                std::memcpy(v_cache + slot, v, D * sizeof(T));
            } else {
                for (int64_t i = 0; i < D; i++) {
                    store(k_cache[slot + i], std::fmin(std::fmax(to_float(k[i]) / k_scale, -limit), limit));
                    store(v_cache[slot + i], std::fmin(std::fmax(to_float(v[i]) / v_scale, -limit), limit));
                }
            }
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
void add_rms_norm_f32(const float *x, const float *res, const float *w, float *out, float *res_out, int64_t rows,
                      int64_t dim, float eps) {
    add_rms_norm(x, res, w, out, res_out, rows, dim, eps);
}
void add_rms_norm_bf16(const BFloat16 *x, const BFloat16 *res, const BFloat16 *w, BFloat16 *out,
                       BFloat16 *res_out, int64_t rows, int64_t dim, float eps) {
    add_rms_norm(x, res, w, out, res_out, rows, dim, eps);
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

#define EXPORT_ROPE_AND_CACHE(SUFFIX, T, C)                                                               \
    extern "C" void rope_and_cache_##SUFFIX(T *qkv, const int64_t *pos, const T *cos, const T *sin,         \
                                            const int64_t *slots, C *k, C *v, int64_t tokens, int64_t heads, \
                                            int64_t kv_heads, int64_t D, int64_t pool_slots, float k_scale, \
                                            float v_scale, float limit) {                                    \
        rope_and_cache(qkv, pos, cos, sin, slots, k, v, tokens, heads, kv_heads, D, pool_slots, k_scale,     \
                       v_scale, limit);                                                                      \
    }
FOR_EACH_KV_TYPE(EXPORT_ROPE_AND_CACHE)

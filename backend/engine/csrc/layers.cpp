// Small fused CPU ops for the decoder layer, each replacing several torch ops whose dispatch overhead
// (a few microseconds each) dominates small batches: RMSNorm, SiLU-and-multiply, GELU(tanh)-and-multiply,
// RoPE with the KV-cache write, greedy argmax, and a matrix-vector product over bf16 weights for batches of a
// few rows.
// Arithmetic follows transformers': fp32 inside, rounded to the storage type where transformers rounds.
// The row loops are plain C++ that GCC vectorizes for any -march; where the build has AVX-512 (BW, VL) the
// norms and SiLU take explicit 16-lane paths instead (10-15% faster: bf16 rounding in one instruction on
// CPUs with AVX512_BF16, masked tails). Built and loaded by backend/engine/cpu_kernels.py.
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "dtypes.h"
#include "lanes16.h"

namespace {

// Below this many elements a kernel runs on the calling thread: waking the OpenMP team costs more than the
// work (a batch-1 decode calls each kernel 30 times a token on a few thousand elements).
constexpr int64_t PARALLEL_MIN_ELEMENTS = 16384;

// One row of rms_norm / add_rms_norm: with residual, sum = round(x + residual) is stored first (the
// decoder's residual add, in the storage type, as torch adds); then out = weight * round(sum * rsqrt(mean(
// sum^2) + eps)), transformers' RMSNorm (sum = x without residual). out may be x (qk_norm normalises in
// place: each element is read before it is written, in the same step).
template <typename T>
inline void rms_norm_row(const T *x, const T *__restrict residual, const T *__restrict weight, T *out,
                         T *__restrict sum, int64_t dim, float eps) {
#if defined(LANES16)
    __m512 squares = _mm512_setzero_ps();
    for (int64_t i = 0; i < dim; i += 16) {
        const __mmask16 m = lanes(dim - i);
        __m512 h = load16(x + i, m);
        if (residual) {
            h = round16<T>(_mm512_add_ps(h, load16(residual + i, m)));
            store16(sum + i, h, m);
        }
        squares = _mm512_fmadd_ps(h, h, squares);
    }
    const float inv = 1.0f / std::sqrt(_mm512_reduce_add_ps(squares) / float(dim) + eps);
    const T *normed = residual ? sum : x;
    for (int64_t i = 0; i < dim; i += 16) {
        const __mmask16 m = lanes(dim - i);
        const __m512 h = round16<T>(_mm512_mul_ps(load16(normed + i, m), _mm512_set1_ps(inv)));
        store16(out + i, _mm512_mul_ps(load16(weight + i, m), h), m);
    }
#else
    float squares = 0.0f;
    if (residual) {
#pragma omp simd reduction(+ : squares)
        for (int64_t i = 0; i < dim; i++) {
            const float h = round_to<T>(to_float(x[i]) + to_float(residual[i]));
            store(sum[i], h);
            squares += h * h;
        }
    } else {
#pragma omp simd reduction(+ : squares)
        for (int64_t i = 0; i < dim; i++) squares += to_float(x[i]) * to_float(x[i]);
    }
    const float inv = 1.0f / std::sqrt(squares / float(dim) + eps);
    const T *normed = residual ? sum : x;
#pragma omp simd
    for (int64_t i = 0; i < dim; i++) store(out[i], to_float(weight[i]) * round_to<T>(to_float(normed[i]) * inv));
#endif
}

// out = weight * round(x * rsqrt(mean(x^2) + eps)), per row of x [rows, dim]
template <typename T>
void rms_norm(const T *x, const T *weight, T *out, int64_t rows, int64_t dim, float eps) {
#pragma omp parallel for schedule(static) if (rows > 1 && rows * dim >= PARALLEL_MIN_ELEMENTS)
    for (int64_t r = 0; r < rows; r++) rms_norm_row<T>(x + r * dim, nullptr, weight, out + r * dim, nullptr, dim, eps);
}

// The q/k norm of qkv [rows, (heads + 2 kv_heads) * D], the fused projection's output, in place before RoPE:
// transformers' RMSNorm of each q head with q_weight [D] and of each k head with k_weight [D] (Qwen3), or
// across_heads, of all of a row's q at once with q_weight [heads * D] and all of its k with k_weight
// [kv_heads * D] (OLMo 2, OLMoE); v is not read.
template <typename T>
void qk_norm(T *qkv, const T *q_weight, const T *k_weight, int64_t rows, int64_t heads, int64_t kv_heads,
             int64_t D, bool across_heads, float eps) {
    const int64_t q_width = across_heads ? heads * D : D, k_width = across_heads ? kv_heads * D : D;
    const int64_t q_groups = heads * D / q_width, k_groups = kv_heads * D / k_width;
    const int64_t stride = (heads + 2 * kv_heads) * D;
#pragma omp parallel for schedule(static) if (rows > 1 && rows * stride >= PARALLEL_MIN_ELEMENTS)
    for (int64_t r = 0; r < rows; r++) {
        T *q = qkv + r * stride, *k = q + heads * D;
        for (int64_t g = 0; g < q_groups; g++) {
            rms_norm_row<T>(q + g * q_width, nullptr, q_weight, q + g * q_width, nullptr, q_width, eps);
        }
        for (int64_t g = 0; g < k_groups; g++) {
            rms_norm_row<T>(k + g * k_width, nullptr, k_weight, k + g * k_width, nullptr, k_width, eps);
        }
    }
}

// residual_out = round(x + residual), out = rms_norm(residual_out): vLLM's fused_add_rms_norm, one pass and
// one parallel region instead of two
template <typename T>
void add_rms_norm(const T *x, const T *residual, const T *weight, T *out, T *residual_out, int64_t rows,
                  int64_t dim, float eps) {
#pragma omp parallel for schedule(static) if (rows > 1 && rows * dim >= PARALLEL_MIN_ELEMENTS)
    for (int64_t r = 0; r < rows; r++) {
        rms_norm_row(x + r * dim, residual + r * dim, weight, out + r * dim, residual_out + r * dim, dim, eps);
    }
}

// out [dim] = silu(gate [dim]) * up [dim], silu rounded to T as torch rounds F.silu's output. Without
// AVX-512: chunks of CHUNK floats in two plain loops over __restrict pointers, so that both vectorize on
// every -march: the exponentials first, then the division, rounding and product (in one loop, GCC turns
// fast_exp's clamps into branches of the division and divides several times per element).
template <typename T>
inline void silu_and_mul_row(const T *__restrict gate, const T *__restrict up, T *__restrict out, int64_t dim) {
#if defined(LANES16)
    for (int64_t i = 0; i < dim; i += 16) {
        const __mmask16 m = lanes(dim - i);
        const __m512 g = load16(gate + i, m);
        const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), g));
        const __m512 silu = round16<T>(_mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e)));
        store16(out + i, _mm512_mul_ps(silu, load16(up + i, m)), m);
    }
#else
    constexpr int64_t CHUNK = 64;
    float e[CHUNK];
    for (int64_t begin = 0; begin < dim; begin += CHUNK) {
        const int64_t n = dim - begin < CHUNK ? dim - begin : CHUNK;
        const T *__restrict g = gate + begin, *__restrict u = up + begin;
        T *__restrict o = out + begin;
#pragma omp simd
        for (int64_t i = 0; i < n; i++) e[i] = fast_exp(-to_float(g[i]));
#pragma omp simd
        for (int64_t i = 0; i < n; i++) store(o[i], round_to<T>(to_float(g[i]) / (1.0f + e[i])) * to_float(u[i]));
    }
#endif
}

// out [rows, dim] = silu(gate_up[:, :dim]) * gate_up[:, dim:]
template <typename T>
void silu_and_mul(const T *gate_up, T *out, int64_t rows, int64_t dim) {
#pragma omp parallel for schedule(static) if (rows > 1 && rows * dim >= PARALLEL_MIN_ELEMENTS)
    for (int64_t r = 0; r < rows; r++) {
        silu_and_mul_row(gate_up + r * 2 * dim, gate_up + r * 2 * dim + dim, out + r * dim, dim);
    }
}

// out [dim] = gelu_tanh(gate [dim]) * up [dim], the gelu rounded to T as torch rounds F.gelu(approximate="tanh")'s
// output (Gemma's gelu_pytorch_tanh), computed as torch's CPU kernel computes it: 0.5 x (1 + tanh(sqrt(2 / pi)
// (x + 0.044715 x^3))) in fp32, each operation rounded (no contraction), with fast_tanh (dtypes.h) for tanh (so
// that, as torch's, the result is 0 where tanh rounds to -1). Chunks of CHUNK floats in two loops, as silu's.
template <typename T>
__attribute__((optimize("fp-contract=off"))) inline void gelu_tanh_and_mul_row(const T *__restrict gate,
                                                                                const T *__restrict up,
                                                                                T *__restrict out, int64_t dim) {
    constexpr float beta = float(0.7978845608028654), kappa = 0.044715f;  // sqrt(2 / pi), torch's kBeta, kKappa
    constexpr int64_t CHUNK = 64;
    float t[CHUNK];
    for (int64_t begin = 0; begin < dim; begin += CHUNK) {
        const int64_t n = dim - begin < CHUNK ? dim - begin : CHUNK;
        const T *__restrict g = gate + begin, *__restrict u = up + begin;
        T *__restrict o = out + begin;
#pragma omp simd
        for (int64_t i = 0; i < n; i++) {
            const float x = to_float(g[i]);
            t[i] = fast_tanh(beta * (x + kappa * (x * x * x)));
        }
#pragma omp simd
        for (int64_t i = 0; i < n; i++) {
            const float x = to_float(g[i]);
            store(o[i], round_to<T>(0.5f * x * (1.0f + t[i])) * to_float(u[i]));
        }
    }
}

// out [rows, dim] = gelu_tanh(gate_up[:, :dim]) * gate_up[:, dim:]
template <typename T>
void gelu_tanh_and_mul(const T *gate_up, T *out, int64_t rows, int64_t dim) {
#pragma omp parallel for schedule(static) if (rows > 1 && rows * dim >= PARALLEL_MIN_ELEMENTS)
    for (int64_t r = 0; r < rows; r++) {
        gelu_tanh_and_mul_row(gate_up + r * 2 * dim, gate_up + r * 2 * dim + dim, out + r * dim, dim);
    }
}

// One head x [D] rotated in place: lo = x[:half], hi = x[half:], cos/sin rows c and s [D]:
// x * cos + cat(-hi, lo) * sin, each product rounded to T as torch rounds it, then the sum.
template <typename T>
inline void rope_head(T *__restrict lo, T *__restrict hi, const T *__restrict c_lo, const T *__restrict c_hi,
                      const T *__restrict s_lo, const T *__restrict s_hi, int64_t half) {
#pragma omp simd
    for (int64_t i = 0; i < half; i++) {
        const float a = to_float(lo[i]), b = to_float(hi[i]);
        const float l = round_to<T>(a * to_float(c_lo[i])) + round_to<T>(-b * to_float(s_lo[i]));
        const float h = round_to<T>(b * to_float(c_hi[i])) + round_to<T>(a * to_float(s_hi[i]));
        store(lo[i], l);
        store(hi[i], h);
    }
}

// out [D] = x / scale clamped to +-limit, in the KV pool's type (an fp8 pool, as attention.py's to_cache)
template <typename T, typename C>
inline void store_scaled(C *__restrict out, const T *__restrict x, int64_t D, float scale, float limit) {
#pragma omp simd
    for (int64_t i = 0; i < D; i++) {
        float y = to_float(x[i]) / scale;
        y = y < -limit ? -limit : y;  // NaN stays NaN (and is stored as NaN), as torch's clamp
        y = y > limit ? limit : y;
        store(out[i], y);
    }
}

// qkv [tokens, (heads + 2 * kv_heads) * D], the fused projection's output: rotates the first rotary_dim
// elements of the q and k heads in place (rotate-half RoPE within them, cos/sin tables [positions,
// rotary_dim] with both halves filled, as transformers builds them; the rest pass, as Phi-3's partial rotary;
// rotary_dim 0: none, a NoPE layer, the tables not read) and copies each token's k and v heads into pool
// slot slots[t] of k/v_cache [kv_heads, pool, D] (an fp8 pool stores k / k_scale and v / v_scale, clamped to
// +-limit, as attention.py's write_kv_cache). No multiply-add contraction here: in fp32 the two products are
// rounded before their sum, as torch does.
template <typename T, typename C>
__attribute__((optimize("fp-contract=off"))) void rope_and_cache(
    T *qkv, const int64_t *positions, const T *cos, const T *sin, const int64_t *slots, C *k_cache, C *v_cache,
    int64_t tokens, int64_t heads, int64_t kv_heads, int64_t D, int64_t pool_slots, int64_t rotary_dim,
    float k_scale, float v_scale, float limit) {
    const int64_t half = rotary_dim / 2, width = (heads + 2 * kv_heads) * D;
#pragma omp parallel for schedule(static) if (tokens > 1 && tokens * width >= PARALLEL_MIN_ELEMENTS)
    for (int64_t t = 0; t < tokens; t++) {
        T *row = qkv + t * width;
        if (half > 0) {
            const T *c = cos + positions[t] * rotary_dim, *s = sin + positions[t] * rotary_dim;
            for (int64_t h = 0; h < heads + kv_heads; h++) {
                T *x = row + h * D;
                rope_head(x, x + half, c, c + half, s, s + half, half);
            }
        }
        for (int64_t h = 0; h < kv_heads; h++) {
            const int64_t slot = (h * pool_slots + slots[t]) * D;
            const T *k = row + (heads + h) * D, *v = row + (heads + kv_heads + h) * D;
            if constexpr (std::is_same_v<T, C>) {
                std::memcpy(k_cache + slot, k, D * sizeof(T));
                std::memcpy(v_cache + slot, v, D * sizeof(T));
            } else {
                store_scaled(k_cache + slot, k, D, k_scale, limit);
                store_scaled(v_cache + slot, v, D, v_scale, limit);
            }
        }
    }
}

// out[r] = the index of the largest of x [rows, n] row r, the first one on ties, the first NaN where a row
// has one (torch.argmax's answer): greedy sampling over the vocabulary without torch's scalar-speed reduction.
template <typename T>
int64_t argmax_row(const T *__restrict x, int64_t n) {
    constexpr int64_t L = 16;  // lanes: each keeps its own best value and index, every L-th element
    float best[L];
    int64_t index[L];
    int nan = 0;
    for (int64_t l = 0; l < L; l++) best[l] = -INFINITY, index[l] = l;
    int64_t i = 0;
    for (; i + L <= n; i += L) {
#pragma omp simd reduction(| : nan)
        for (int64_t l = 0; l < L; l++) {
            const float v = to_float(x[i + l]);
            nan |= v != v;
            index[l] = v > best[l] ? i + l : index[l];
            best[l] = v > best[l] ? v : best[l];
        }
    }
    float top = -INFINITY;
    int64_t found = n > 0 ? 0 : -1;
    for (int64_t l = 0; l < L && l < n; l++) {  // the lanes' winners, lowest index first on ties
        if (best[l] > top || (best[l] == top && index[l] < found)) top = best[l], found = index[l];
    }
    for (; i < n; i++) {
        const float v = to_float(x[i]);
        nan |= v != v;
        if (v > top) top = v, found = i;
    }
    if (nan) {  // rare: the first NaN wins
        for (int64_t j = 0; j < n; j++) {
            const float v = to_float(x[j]);
            if (v != v) return j;
        }
    }
    return found;
}

template <typename T>
void argmax_rows(const T *x, int64_t *out, int64_t rows, int64_t n) {
#pragma omp parallel for schedule(static) if (rows > 1 && rows * n >= PARALLEL_MIN_ELEMENTS)
    for (int64_t r = 0; r < rows; r++) out[r] = argmax_row(x + r * n, n);
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
void qk_norm_f32(float *qkv, const float *q_w, const float *k_w, int64_t rows, int64_t heads, int64_t kv_heads,
                 int64_t D, int64_t across_heads, float eps) {
    qk_norm(qkv, q_w, k_w, rows, heads, kv_heads, D, across_heads != 0, eps);
}
void qk_norm_bf16(BFloat16 *qkv, const BFloat16 *q_w, const BFloat16 *k_w, int64_t rows, int64_t heads,
                  int64_t kv_heads, int64_t D, int64_t across_heads, float eps) {
    qk_norm(qkv, q_w, k_w, rows, heads, kv_heads, D, across_heads != 0, eps);
}
void silu_and_mul_f32(const float *gate_up, float *out, int64_t rows, int64_t dim) {
    silu_and_mul(gate_up, out, rows, dim);
}
void silu_and_mul_bf16(const BFloat16 *gate_up, BFloat16 *out, int64_t rows, int64_t dim) {
    silu_and_mul(gate_up, out, rows, dim);
}
void gelu_tanh_and_mul_f32(const float *gate_up, float *out, int64_t rows, int64_t dim) {
    gelu_tanh_and_mul(gate_up, out, rows, dim);
}
void gelu_tanh_and_mul_bf16(const BFloat16 *gate_up, BFloat16 *out, int64_t rows, int64_t dim) {
    gelu_tanh_and_mul(gate_up, out, rows, dim);
}
void argmax_f32(const float *x, int64_t *out, int64_t rows, int64_t n) { argmax_rows(x, out, rows, n); }
void argmax_bf16(const BFloat16 *x, int64_t *out, int64_t rows, int64_t n) { argmax_rows(x, out, rows, n); }

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

// y [rows, n] (row stride ldy) = x [rows, k] @ weight [n, k]^T (+ bias [n]), all fp32 and dense: a MoE
// router in an fp32 model (CPUs without fast bf16), where oneDNN's call and its tensors cost more than the
// product (64 x 2048 for OLMoE), eager and captured alike (graph_ops). Each output is one dot product of k,
// the same sums for any row count.
extern "C" void linear_f32(const float *x, const float *weight, const float *bias, float *y, int64_t rows,
                           int64_t n, int64_t k, int64_t ldy) {
#pragma omp parallel for schedule(static) if (n * k >= PARALLEL_MIN_ELEMENTS)
    for (int64_t j = 0; j < n; j++) {
        const float *w = weight + j * k;
        for (int64_t r = 0; r < rows; r++) {
            const float *xr = x + r * k;
            float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
            for (int64_t i = 0; i < k; i++) acc += xr[i] * w[i];
            y[r * ldy + j] = acc + (bias ? bias[j] : 0.0f);
        }
    }
}

#define EXPORT_ROPE_AND_CACHE(SUFFIX, T, C)                                                                \
    extern "C" void rope_and_cache_##SUFFIX(T *qkv, const int64_t *pos, const T *cos, const T *sin,          \
                                            const int64_t *slots, C *k, C *v, int64_t tokens, int64_t heads,  \
                                            int64_t kv_heads, int64_t D, int64_t pool_slots, int64_t rotary_dim, \
                                            float k_scale, float v_scale, float limit) {                     \
        rope_and_cache(qkv, pos, cos, sin, slots, k, v, tokens, heads, kv_heads, D, pool_slots, rotary_dim,   \
                       k_scale, v_scale, limit);                                                              \
    }
FOR_EACH_KV_TYPE(EXPORT_ROPE_AND_CACHE)

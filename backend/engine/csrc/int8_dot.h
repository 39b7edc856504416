// Activations quantized to int8 for the integer dot-product instruction (AVX512_VNNI VPDPBUSD: 64 products
// of unsigned and signed bytes a time, summed in int32), what llama.cpp's CPU backend does on these CPUs
// (ggml-cpu quantize_row_q8_0 / quantize_row_q8_K, then ggml_vec_dot_q4_0_q8_0 / ggml_vec_dot_q6_K_q8_K).
// Each block of an activation row is quantized once per call, symmetrically, to nearest:
//   d = max |x_i| / 127,  q_i = round(x_i / d)  (|q_i| <= 127; an all-zero block: d = 0, q = 0)
// so |x_i - d q_i| <= d / 2 per value: a product with weights w then errs by at most
//   sum over blocks of d / 2 * sum_i |w_i|   (tests/engine/test_int8_dot.py checks this bound)
// Weights stay unsigned integers (Q4_0's nibbles 0..15, Q6_K's 6-bit values 0..63), and the offset they
// are stored with (8, 32) comes back through each block's sum of q: sum_i (u_i - o) q_i = sum_i u_i q_i - o S.
// INT8_DOT is defined where the build (-march) has AVX512_VNNI and AVX512BW; cpu_kernels.py reads
// int8_dot_available() and calls int8_dot_set_rows() to say from which rows the kernels take this path.
#pragma once
#include <cstdint>
#include <cstring>

#include "dtypes.h"

#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512F__)
#include <immintrin.h>
#define INT8_DOT 1

namespace int8dot {

inline __m512 load16(const BFloat16 *p) {  // 16 bf16 widened to fp32 (exact)
    return _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(p))), 16));
}
inline __m512 load16(const float *p) { return _mm512_loadu_ps(p); }

inline uint32_t u32(const uint8_t *p) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
}

// n values (a multiple of 16) of x quantized as one block: q [n] int8, returns d; sums [n / 16] the sums of
// each 16 q (the Q6_K sub-blocks') when not null
template <typename T>
inline float quantize_block(const T *x, int n, int8_t *q, int32_t *sums) {
    __m512 amax = _mm512_setzero_ps();
    for (int i = 0; i < n; i += 16) amax = _mm512_max_ps(amax, _mm512_abs_ps(load16(x + i)));
    const float m = _mm512_reduce_max_ps(amax), d = m / 127.0f;
    const __m512 inverse = _mm512_set1_ps(m > 0.0f ? 127.0f / m : 0.0f);
    for (int i = 0; i < n; i += 16) {
        const __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(load16(x + i), inverse));  // to nearest even
        _mm_storeu_si128(reinterpret_cast<__m128i *>(q + i), _mm512_cvtsepi32_epi8(v));
        if (sums) sums[i / 16] = _mm512_reduce_add_epi32(v);
    }
    return d;
}

}  // namespace int8dot
#endif

// from which rows each kernel takes its int8 path (0: never), up to MAX_ROWS (cpu_kernels.INT8_MAX_ROWS:
// batched decode steps, and prefill chunks that short); set by cpu_kernels.py at load
struct Int8Rows {
    static constexpr int64_t MAX_ROWS = 64;
    int64_t q4_0 = 0, q6_k = 0;
    bool q4_0_takes(int64_t rows) const { return q4_0 > 0 && rows >= q4_0 && rows <= MAX_ROWS; }
    bool q6_k_takes(int64_t rows) const { return q6_k > 0 && rows >= q6_k && rows <= MAX_ROWS; }
};
inline Int8Rows int8_rows;  // C++17 inline variable: one for the whole library

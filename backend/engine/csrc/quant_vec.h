// The float vector the native kernels accumulate in (csrc/quantized.cpp, csrc/packed_rows.cpp,
// csrc/paged_attention.cpp): 16 lanes with AVX-512, 8 with AVX2+FMA, 1 (plain C++) otherwise, chosen by the
// build's -march.
#pragma once
#include <cstdint>
#include <type_traits>

// f(std::integral_constant<int, R>{}) for R = rows (1..MAX; more rows: MAX): a kernel's row count as a
// compile-time constant, so its R x lanes accumulators live in registers
template <int MAX, typename F>
inline void with_rows(int64_t rows, F &&f) {
    switch (rows) {
        case 1: return f(std::integral_constant<int, 1>{});
        case 2: return f(std::integral_constant<int, 2>{});
        case 3: return f(std::integral_constant<int, 3>{});
        case 4: return f(std::integral_constant<int, 4>{});
        case 5: return f(std::integral_constant<int, 5>{});
        case 6: return f(std::integral_constant<int, 6>{});
        case 7: return f(std::integral_constant<int, 7>{});
        default: return f(std::integral_constant<int, MAX>{});
    }
}

#if defined(__AVX512F__)
#include <immintrin.h>
#define VEC_WIDTH 16
using Vec = __m512;
inline Vec vzero() { return _mm512_setzero_ps(); }
inline Vec vload(const float *p) { return _mm512_loadu_ps(p); }
inline Vec vfma(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
inline float vsum(Vec a) { return _mm512_reduce_add_ps(a); }
inline Vec vset(float x) { return _mm512_set1_ps(x); }
inline void vstore(float *p, Vec a) { _mm512_storeu_ps(p, a); }
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define VEC_WIDTH 8
using Vec = __m256;
inline Vec vzero() { return _mm256_setzero_ps(); }
inline Vec vload(const float *p) { return _mm256_loadu_ps(p); }
inline Vec vfma(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
inline float vsum(Vec a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)));
}
inline Vec vset(float x) { return _mm256_set1_ps(x); }
inline void vstore(float *p, Vec a) { _mm256_storeu_ps(p, a); }
#else
#define VEC_WIDTH 1
using Vec = float;
inline Vec vzero() { return 0.0f; }
inline Vec vload(const float *p) { return *p; }
inline Vec vfma(Vec a, Vec b, Vec c) { return a * b + c; }
inline float vsum(Vec a) { return a; }
inline Vec vset(float x) { return x; }
inline void vstore(float *p, Vec a) { *p = a; }
#endif

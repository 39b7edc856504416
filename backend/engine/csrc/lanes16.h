// 16 fp32 lanes of AVX-512 (F, BW, VL) shared by the kernels that round like torch: loads and stores of float
// and bf16, bf16 rounding, and the exponential of silu (csrc/layers.cpp, csrc/gemm_bf16.cpp's fused
// SiLU-and-multiply: one definition, so that the fused and the separate kernels agree bit for bit).
// LANES16 is defined where the build has them.
#pragma once
#include <cfloat>
#include <cstdint>
#include <type_traits>

#include "dtypes.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>
#define LANES16 1

// 16 lanes of T as floats, and back: bf16 rounded to nearest even as store() rounds (NaN stays NaN).
// vcvtneps2bf16 (AVX512_BF16) treats fp32 denormals as zero where torch keeps them as bf16 subnormals, so a
// vector holding one (|x| < FLT_MIN, never a model's activation in practice) takes the integer rounding.
inline __mmask16 lanes(int64_t n) { return n >= 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1); }
inline __m512 load16(const float *p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
inline __m512 load16(const BFloat16 *p, __mmask16 m) {
    const __m256i h = _mm256_maskz_loadu_epi16(m, p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
inline __m256i bf16_bits(__m512 x) {
#if defined(__AVX512BF16__)
    const __m512 magnitude = _mm512_abs_ps(x);
    const __mmask16 tiny = _mm512_cmp_ps_mask(magnitude, _mm512_set1_ps(FLT_MIN), _CMP_LT_OQ) &
                           _mm512_cmp_ps_mask(magnitude, _mm512_setzero_ps(), _CMP_NEQ_OQ);
    if (__builtin_expect(tiny == 0, 1)) return (__m256i)_mm512_cvtneps_pbh(x);
#endif
    const __m512i bits = _mm512_castps_si512(x);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    const __m512i biased = _mm512_add_epi32(_mm512_add_epi32(bits, _mm512_set1_epi32(0x7fff)), odd);
    __m512i rounded = _mm512_srli_epi32(biased, 16);
    const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(0x40));  // NaN stays NaN
    rounded = _mm512_mask_mov_epi32(rounded, nan, quiet);
    return _mm512_cvtepi32_epi16(rounded);
}
inline void store16(float *p, __m512 x, __mmask16 m) { _mm512_mask_storeu_ps(p, m, x); }
inline void store16(BFloat16 *p, __m512 x, __mmask16 m) { _mm256_mask_storeu_epi16(p, m, bf16_bits(x)); }
template <typename T>
inline __m512 round16(__m512 x) {  // x as it would be after a round trip through T (round_to)
    if constexpr (std::is_same_v<T, float>) {
        return x;
    } else {
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bf16_bits(x)), 16));
    }
}
// fast_exp (dtypes.h) on 16 lanes: the same range clamp and polynomial, 2^n applied by vscalefps
inline __m512 exp16(__m512 x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.0f));
    const __m512 y = _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f));
    const __m512 n = _mm512_roundscale_ps(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_sub_ps(y, n);
    __m512 p = _mm512_set1_ps(1.5403530393e-4f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3333558146e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291076e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504108665e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022650696e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718056e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}
#endif

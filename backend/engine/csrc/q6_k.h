// GGUF's Q6_K super-block decoded to fp32 (ggml-quants.h block_q6_K: 256 weights in 210 bytes), shared by
// csrc/quantized.cpp (quant_gemv, quant_dequant) and csrc/q6_k_gemm.cpp (quant_gemm_q6_k, its portable path).
// The 16 int8 scales each serve 16 consecutive weights of the decoded order (scales[i]: weights 16 i ..).
#pragma once
#include <cstdint>
#include <cstring>

#include "dtypes.h"

#if defined(__F16C__) || defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

inline float q6k_f16(const uint8_t *p) {  // IEEE half (little-endian) to float
    uint16_t h;
    std::memcpy(&h, p, 2);
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    return half_to_float(h);
#endif
}

struct Q6_K {  // 128 bytes of low nibbles, 64 of high 2-bit pairs, 16 int8 scales, d
    static constexpr int QK = 256, BYTES = 210;
    // ggml's dequantize_row_q6_K order: per half of 128 weights, 32 positions l, each giving weights l,
    // l + 32, l + 64, l + 96 (16 positions share a scale): 16 positions a vector with AVX-512, else loops
    // the compiler vectorizes
    static void decode(const uint8_t *b, float *w) {
        const uint8_t *ql = b, *qh = b + 128;
        const int8_t *scales = reinterpret_cast<const int8_t *>(b + 192);
        const float d = q6k_f16(b + 208);
        for (int half = 0; half < 2; half++, ql += 64, qh += 32, scales += 8, w += 128) {
            for (int is = 0; is < 2; is++) {
                const float s0 = d * float(scales[is]), s1 = d * float(scales[is + 2]);
                const float s2 = d * float(scales[is + 4]), s3 = d * float(scales[is + 6]);
#if defined(__AVX512F__)
                decode16(ql + is * 16, qh + is * 16, s0, s1, s2, s3, w + is * 16);
#else
                for (int l = is * 16; l < is * 16 + 16; l++) {
                    w[l] = s0 * float(((ql[l] & 15) | ((qh[l] & 3) << 4)) - 32);
                    w[l + 32] = s1 * float(((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) - 32);
                    w[l + 64] = s2 * float(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
                    w[l + 96] = s3 * float(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
                }
#endif
            }
        }
    }
#if defined(__AVX512F__)
    // 16 positions l at once: weights l, l + 32, l + 64, l + 96 (the loop above, the same products)
    static void decode16(const uint8_t *ql, const uint8_t *qh, float s0, float s1, float s2, float s3, float *w) {
        auto bytes = [](const uint8_t *p) {
            return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i *>(p)));
        };
        const __m512i lo = bytes(ql), hi = bytes(ql + 32), h = bytes(qh);
        const __m512i fifteen = _mm512_set1_epi32(15), three = _mm512_set1_epi32(3), offset = _mm512_set1_epi32(32);
        auto weights = [&](__m512i low4, int shift, float scale, float *out) {
            const __m512i high2 = _mm512_slli_epi32(_mm512_and_si512(_mm512_srlv_epi32(h, _mm512_set1_epi32(shift)), three), 4);
            const __m512i q = _mm512_sub_epi32(_mm512_or_si512(low4, high2), offset);
            _mm512_storeu_ps(out, _mm512_mul_ps(_mm512_set1_ps(scale), _mm512_cvtepi32_ps(q)));
        };
        weights(_mm512_and_si512(lo, fifteen), 0, s0, w);
        weights(_mm512_and_si512(hi, fifteen), 2, s1, w + 32);
        weights(_mm512_srli_epi32(lo, 4), 4, s2, w + 64);
        weights(_mm512_srli_epi32(hi, 4), 6, s3, w + 96);
    }
#endif
};

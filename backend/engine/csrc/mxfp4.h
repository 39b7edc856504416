// MXFP4 (OCP Microscaling, gpt-oss's expert weights; GGUF type MXFP4): blocks of 32 e2m1 values sharing
// one e8m0 scale 2^(e - 127). The engine keeps them as GGUF's block_mxfp4 (ggml-common.h): the byte e, then
// 16 bytes, byte j holding value j in its low nibble and value j + 16 in its high one
// (backend/engine/quantization/mxfp4.py moves gpt-oss's *_blocks / *_scales into it). As ggml does, the
// e2m1 values are held doubled, {0, 1, 2, 3, 4, 6, 8, 12} and their negatives (exact integers: exact in
// bf16, so VDPBF16PS products with bf16 activations are exact), and the scale halved:
//   value = kvalues[nibble] * 2^(e - 128)          (ggml_e8m0_to_fp32_half; e < 2 gives fp32 subnormals)
// which is transformers' lut[nibble] * 2^(e - 127) (integrations/mxfp4.py) exactly.
#pragma once
#include <cstdint>

namespace mxfp4 {

constexpr int8_t KVALUES[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

inline uint32_t half_scale_bits(uint32_t e) {  // the fp32 bits of 2^(e - 128)
    return e < 2 ? 0x00200000u << e : (e - 1) << 23;
}

inline float half_scale(uint8_t e) { return __builtin_bit_cast(float, half_scale_bits(e)); }

}  // namespace mxfp4

#if defined(__AVX512F__)
#include <immintrin.h>
namespace mxfp4 {
inline __m512 half_scales16(const uint8_t *e) {  // 16 scale bytes -> 16 lanes of 2^(e - 128)
    const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i *>(e)));
    const __mmask16 tiny = _mm512_cmplt_epu32_mask(v, _mm512_set1_epi32(2));
    const __m512i normal = _mm512_slli_epi32(_mm512_sub_epi32(v, _mm512_set1_epi32(1)), 23);
    const __m512i subnormal = _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), v);
    return _mm512_castsi512_ps(_mm512_mask_mov_epi32(normal, tiny, subnormal));
}
}  // namespace mxfp4
#endif

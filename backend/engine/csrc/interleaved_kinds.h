// The block kinds csrc/interleaved.cpp's tiles multiply: how a 32-byte chunk of a 16-row panel becomes bf16
// vectors (a decoder) and where each group's 16 scales come from (a scale source). A kind is one of each.
//   GGUF (Q4_0, Q4_1, Q8_0): a panel-block opens with the 16 rows' fp16 d (Q4_1: then m); a group is one
//     block of 32 weights. MXFP4 (csrc/mxfp4.h) the same, its header the 16 rows' e8m0 bytes.
//   Packed (GPTQ, AWQ, compressed-tensors W4A16 / W8A16, re-laid out by quantization/group_scales.py): the
//     chunks only; the checkpoint's scales [groups, n] (fp16, bf16 or fp32) and packed zeros [groups,
//     n * bits / 8] (plain order: row j's field at bits * j of the row) beside them (Groups). Symmetric
//     weights (every zero 8, or 128) decode as Q4_0 / Q8_0 do (4-bit: q - 8 looked up; 8-bit: the
//     bytes stored as q - 128); asymmetric ones subtract each row's zero from its integers first, in
//     integers: 4-bit (q - z) & 31 looks up bf16(q - z) in [-16, 15], 8-bit q - z in int32, then fp32.
// Either way every weight the tiles multiply is the exact bf16 integer (q - z), so each product with bf16 x
// is exact in fp32 and a group's sum is scaled once by its fp32 scale: only the order of the fp32 sums
// differs from the product with the dequantized weights s * (q - z).
#pragma once
#include <cstdint>

#include "dtypes.h"
#include "mxfp4.h"

struct Groups {  // quantization/group_scales.py GroupArgs mirrors it field by field
    const void *scales;    // [groups, n], scale_dtype: 0 fp16, 1 bf16, 2 fp32
    const uint8_t *zeros;  // [groups, n * bits / 8], or null (symmetric)
    const int32_t *perm;   // [k]: weight column i multiplies x[perm[i]] (act-order), or null
    int64_t group_size, scale_dtype, zero_add;  // z = the stored field + zero_add (GPTQ stores z - 1)
};

#if defined(__AVX512BF16__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>

namespace {

constexpr int PANEL = 16;  // W's rows a panel: one vector of fp32 sums

struct Call {
    const BFloat16 *x;  // [rows, k]
    const uint8_t *w;   // interleaved
    const BFloat16 *bias;
    void *y;            // BFloat16, or float holding bf16 values (float_out)
    const float *sums;  // [rows, blocks]: each block's sum of x, fp32 (Q4_1's m term)
    int64_t rows, n, k, ldy;
    bool float_out;
    const Groups *groups;  // packed kinds: scales, zeros, perm (GGUF: null)
    int64_t head, group_bytes, group_blocks;  // a panel-block's header and size in bytes; blocks a group
};

struct NoZeros {};

inline __m512i word_table(int offset, int wrap) {  // entry i: bf16 of (i & wrap) + offset, or less 32 past 15
    alignas(64) uint16_t table[32];
    for (int i = 0; i < 32; i++) {
        const int value = wrap == 15 ? (i & 15) + offset : (i < 16 ? i : i - 32);
        table[i] = uint16_t(__builtin_bit_cast(uint32_t, float(value)) >> 16);
    }
    return _mm512_load_si512(table);
}

inline __m512i chunk_words(const uint8_t *chunk) {  // 32 bytes widened to words
    return _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(chunk)));
}

template <int OFFSET>
struct Nibbles {  // a chunk: k-pairs 2 c and 2 c + 1 of 16 rows, q + OFFSET
    static constexpr int CHUNKS = 8, PAIRS = 2, MANY_ROWS = 6;  // past 8 rows: tiles of 6 rows x 2 panels
    static constexpr bool DECODE_ONCE = false;  // 4 instructions a vector: as cheap as a load
    static constexpr float SCALE = 1.0f;  // what the decoded weights are short of (times the group's scale)
    using Zeros = NoZeros;
    const __m512i table = word_table(OFFSET, 15);  // VPERMW reads the index's low 5 bits: no mask needed
    Zeros zeros(const Call &, int64_t, int64_t) const { return {}; }
    void operator()(const uint8_t *chunk, const Zeros &, __m512bh *w) const {
        const __m512i words = chunk_words(chunk);
        w[0] = (__m512bh)_mm512_permutexvar_epi16(words, table);
        w[1] = (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(words, 4), table);
    }
};

struct NibblesMinusZero {  // q - z, z per row and group (word 2 r + e of Zeros: row r's)
    static constexpr int CHUNKS = 8, PAIRS = 2, MANY_ROWS = 6;  // 6 x 2 tiles: 1.0-1.3x 8 x 1 (9-32 rows)
    static constexpr bool DECODE_ONCE = false;
    static constexpr float SCALE = 1.0f;
    using Zeros = __m512i;
    const __m512i table = word_table(0, 31), low = _mm512_set1_epi16(15);
    Zeros zeros(const Call &c, int64_t panel, int64_t g) const {  // 8 bytes: row 2 i low nibble, 2 i + 1 high
        const uint8_t *p = c.groups->zeros + g * (c.n / 2) + panel * PANEL / 2;
        const __m128i bytes = _mm_shuffle_epi8(_mm_loadl_epi64(reinterpret_cast<const __m128i *>(p)),
                                               _mm_set_epi8(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0));
        const __m256i shifts = _mm256_set_epi16(4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0);
        __m256i z = _mm256_and_si256(_mm256_srlv_epi16(_mm256_cvtepu8_epi16(bytes), shifts), _mm256_set1_epi16(15));
        z = _mm256_add_epi16(z, _mm256_set1_epi16(int16_t(c.groups->zero_add)));
        const __m512i wide = _mm512_cvtepu16_epi32(z);  // row r in dword r: both its words
        return _mm512_or_si512(wide, _mm512_slli_epi32(wide, 16));
    }
    void operator()(const uint8_t *chunk, const Zeros &z, __m512bh *w) const {
        const __m512i words = chunk_words(chunk);
        w[0] = (__m512bh)_mm512_permutexvar_epi16(_mm512_sub_epi16(_mm512_and_si512(words, low), z), table);
        w[1] = (__m512bh)_mm512_permutexvar_epi16(_mm512_sub_epi16(_mm512_srli_epi16(words, 4), z), table);
    }
};

// MXFP4 (csrc/mxfp4.h): a chunk laid out as Nibbles's, each nibble looked up as its doubled e2m1 value (an
// exact bf16 integer); the panel-block's header holds the 16 rows' e8m0 bytes (Kind's E8M0), scaled by halves
struct E2m1Nibbles {
    static constexpr int CHUNKS = 8, PAIRS = 2, MANY_ROWS = 6;
    static constexpr bool DECODE_ONCE = false;
    static constexpr float SCALE = 1.0f;
    using Zeros = NoZeros;
    const __m512i table = e2m1_table();
    static __m512i e2m1_table() {  // entry i: bf16 of KVALUES[i & 15]
        alignas(64) uint16_t words[32];
        for (int i = 0; i < 32; i++)
            words[i] = uint16_t(__builtin_bit_cast(uint32_t, float(mxfp4::KVALUES[i & 15])) >> 16);
        return _mm512_load_si512(words);
    }
    Zeros zeros(const Call &, int64_t, int64_t) const { return {}; }
    void operator()(const uint8_t *chunk, const Zeros &, __m512bh *w) const {
        const __m512i words = chunk_words(chunk);
        w[0] = (__m512bh)_mm512_permutexvar_epi16(words, table);
        w[1] = (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(words, 4), table);
    }
};

inline __m512bh bf16_pair(__m512i lo, __m512i hi) {  // int32 rows 0-7 and 8-15 (|v| <= 256: exact)
    return _mm512_cvtne2ps_pbh(_mm512_cvtepi32_ps(hi), _mm512_cvtepi32_ps(lo));
}

struct Bytes {  // a chunk: k-pair c of 16 rows, int8 q
    static constexpr int CHUNKS = 16, PAIRS = 1, MANY_ROWS = 8;
    static constexpr bool DECODE_ONCE = true;  // 7 instructions a vector
    static constexpr float SCALE = 1.0f;
    using Zeros = NoZeros;
    Zeros zeros(const Call &, int64_t, int64_t) const { return {}; }
    void operator()(const uint8_t *chunk, const Zeros &, __m512bh *w) const {
        const __m128i *p = reinterpret_cast<const __m128i *>(chunk);
        w[0] = bf16_pair(_mm512_cvtepi8_epi32(_mm_loadu_si128(p)), _mm512_cvtepi8_epi32(_mm_loadu_si128(p + 1)));
    }
};

struct BytesMinusZero {  // uint8 q - z, z per row and group: lanes 2 r + e of lo (rows 0-7) and hi (8-15)
    static constexpr int CHUNKS = 16, PAIRS = 1, MANY_ROWS = 8;
    static constexpr bool DECODE_ONCE = true;
    static constexpr float SCALE = 1.0f;
    struct Zeros {
        __m512i lo, hi;
    };
    Zeros zeros(const Call &c, int64_t panel, int64_t g) const {
        const uint8_t *p = c.groups->zeros + g * c.n + panel * PANEL;
        const __m512i z = _mm512_add_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i *>(p))),
                                           _mm512_set1_epi32(int32_t(c.groups->zero_add)));
        const __m512i half = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
        return {_mm512_permutexvar_epi32(half, z),
                _mm512_permutexvar_epi32(_mm512_add_epi32(half, _mm512_set1_epi32(8)), z)};
    }
    void operator()(const uint8_t *chunk, const Zeros &z, __m512bh *w) const {
        const __m128i *p = reinterpret_cast<const __m128i *>(chunk);
        w[0] = bf16_pair(_mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128(p)), z.lo),
                         _mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128(p + 1)), z.hi));
    }
};

// fp8 e4m3 codes (s eeee mmm) moved to fp16's bits as s 0eeee mmm0000000: the same value times 2^-8 exactly,
// subnormals included (their exponent field stays 0), then widened; SCALE puts the 2^8 back into the scale
struct Fp8Bytes {
    static constexpr int CHUNKS = 16, PAIRS = 1, MANY_ROWS = 8;
    static constexpr bool DECODE_ONCE = true;
    static constexpr float SCALE = 256.0f;
    using Zeros = NoZeros;
    Zeros zeros(const Call &, int64_t, int64_t) const { return {}; }
    void operator()(const uint8_t *chunk, const Zeros &, __m512bh *w) const {
        const __m512i words = chunk_words(chunk);
        const __m512i magnitude = _mm512_slli_epi16(_mm512_and_si512(words, _mm512_set1_epi16(0x7f)), 7);
        const __m512i sign = _mm512_slli_epi16(_mm512_and_si512(words, _mm512_set1_epi16(0x80)), 8);
        const __m512i half = _mm512_or_si512(magnitude, sign);
        w[0] = _mm512_cvtne2ps_pbh(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(half, 1)),
                                   _mm512_cvtph_ps(_mm512_castsi512_si256(half)));
    }
};

inline __m512 half16(const void *p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(p)));
}

// a group's 16 scales d (and Q4_1's mins m): GGUF from the panel-block's header (MXFP4: 16 e8m0 bytes),
// packed from the checkpoint's scales [groups, n]
template <typename B>
void group_scales(const Call &c, const uint8_t *head, int64_t panel, int64_t g, __m512 &d, __m512 &m) {
    if constexpr (B::E8M0) {
        d = mxfp4::half_scales16(head);
        return;
    }
    if (c.groups == nullptr) {
        d = half16(head);
        if constexpr (B::HAS_MIN) m = half16(head + 32);
        return;
    }
    const int64_t i = g * c.n + panel * PANEL;
    if (c.groups->scale_dtype == 0) {
        d = half16(static_cast<const uint16_t *>(c.groups->scales) + i);
    } else if (c.groups->scale_dtype == 1) {
        const auto *p = static_cast<const uint16_t *>(c.groups->scales) + i;
        const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(p));
        d = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    } else {
        d = _mm512_loadu_ps(static_cast<const float *>(c.groups->scales) + i);
    }
}

template <typename Decoder, bool MIN, bool E8M0_SCALES = false>
struct Kind : Decoder {
    static constexpr bool HAS_MIN = MIN;
    static constexpr bool E8M0 = E8M0_SCALES;  // MXFP4: the header's scales are e8m0 bytes
};

using Q4_0 = Kind<Nibbles<-8>, false>;  // and "w4": symmetric GPTQ / compressed-tensors
using Q4_1 = Kind<Nibbles<0>, true>;
using Q8_0 = Kind<Bytes, false>;  // and "w8"
using W4Zp = Kind<NibblesMinusZero, false>;
using W8Zp = Kind<BytesMinusZero, false>;
using Fp8 = Kind<Fp8Bytes, false>;
using Mxfp4 = Kind<E2m1Nibbles, false, true>;

}  // namespace
#endif

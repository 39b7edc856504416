// The quantized kernels' bf16 dot-product paths (csrc/quantized.cpp includes this): bf16 activations and
// 4-bit or 8-bit GGUF blocks on VDPBF16PS, where the build (-march) has AVX512_BF16; BF16_DOT is defined
// then.
#pragma once
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "dtypes.h"
#include "quant_vec.h"

#if defined(__AVX512BF16__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>
#define BF16_DOT 1
// bf16 activations times blocks on the bf16 dot-product instruction (VDPBF16PS: 32 products a time, summed
// in fp32). A block's integers are exact in bf16 (nibbles 0..15, or -8..7 for Q4_0, through a 32-entry
// table and VPERMW; Q8_0's -128..127 through fp32), and per block
//   sum_i x_i (d q_i + m) = d * sum_i q_i x_i + m * sum_i x_i
// so every product is exact in fp32 (bf16 subnormals, below 1e-38, count as zero) and the result differs
// from the product with the fp32 dequantized weights only by the order of the fp32 sums.
//   gemv (up to MAX_ROWS rows): blocks in pairs, one register the low nibbles of both (weights 0..15 of
//     each), another their high nibbles (16..31); x laid out once per call to match (pair_x)
//   gemm (up to GEMM_MAX_ROWS rows): rows of x in the vector lanes, a pair of decoded weights broadcast
//   dequant (to bf16, for torch's GEMM on larger batches): each block's 16 values d q + m computed in fp32,
//     rounded to bf16 once, then looked up per weight (VPERMW)
namespace bf16dot {

inline uint32_t u32(const uint8_t *p) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
}
inline uint16_t u16(const uint8_t *p) {
    uint16_t v;
    std::memcpy(&v, p, 2);
    return v;
}

inline __m512i nibble_table(int offset) {  // entry i: bf16 of (i & 15) + offset (an index's low 5 bits)
    alignas(64) uint16_t table[32];
    for (int i = 0; i < 32; i++) table[i] = uint16_t(__builtin_bit_cast(uint32_t, float((i & 15) + offset)) >> 16);
    return _mm512_load_si512(table);
}

template <int QS, int OFFSET>
struct NibbleDecoder {  // a block's 32 weights as bf16 integers, in order (nibble table, VPERMW)
    const __m512i table = nibble_table(OFFSET), low = _mm512_set1_epi16(15);
    const __m512i shifts = _mm512_set_epi16(4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 0, 0, 0, 0, 0, 0, 0, 0,
                                            0, 0, 0, 0, 0, 0, 0, 0);
    __m512i operator()(const uint8_t *block) const {
        const __m512i words = _mm512_srlv_epi16(
            _mm512_cvtepu8_epi16(
                _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i *>(block + QS)))),
            shifts);  // the 16 bytes twice: their low nibbles (weights 0..15), then the high ones (16..31)
        return _mm512_permutexvar_epi16(_mm512_and_si512(words, low), table);
    }
};

struct Q4_0 {
    static constexpr int BYTES = 18, QS = 2, OFFSET = -8;
    using Decoder = NibbleDecoder<QS, OFFSET>;
    static constexpr bool HAS_MIN = false;
    static __m128 header(const uint8_t *b0, const uint8_t *b1) {  // [d0, d1, 0, 0]
        return _mm_cvtph_ps(_mm_cvtsi32_si128(int(uint32_t(u16(b0)) | uint32_t(u16(b1)) << 16)));
    }
    static __m512i scale_index() { return _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0); }
};

struct Q4_1 {
    static constexpr int BYTES = 20, QS = 4, OFFSET = 0;
    using Decoder = NibbleDecoder<QS, OFFSET>;
    static constexpr bool HAS_MIN = true;
    static __m128 header(const uint8_t *b0, const uint8_t *b1) {  // [d0, m0, d1, m1]
        return _mm_cvtph_ps(_mm_insert_epi32(_mm_cvtsi32_si128(int(u32(b0))), int(u32(b1)), 1));
    }
    static __m512i scale_index() { return _mm512_set_epi32(2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0); }
};

struct Q8_0 {  // quant_gemm only (gemv keeps the fp32 path: nothing to share between rows there)
    static constexpr int BYTES = 34;
    static constexpr bool HAS_MIN = false;
    struct Decoder {  // int8 to fp32 to bf16, exactly (|q| <= 128 needs 8 bits)
        __m512i operator()(const uint8_t *block) const {
            const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i *>(block + 2))));
            const __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i *>(block + 18))));
            return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
        }
    };
};

// x [rows, k] bf16 laid out per pair of blocks b, b + 1 as [x_b[0:16] x_b+1[0:16] x_b[16:32] x_b+1[16:32]]
// (xp [pairs, rows, 64], a missing last block's part zero), and sums [pairs, rows, 4] = [0, S_b, 0, S_b+1]
// with S the sum of a block's x in fp32
inline float block_sum(const BFloat16 *x) {  // of 32 bf16, in fp32
    const __m512i v = _mm512_loadu_si512(x);
    const __m512 even = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
    const __m512 odd = _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(int(0xffff0000u))));
    return _mm512_reduce_add_ps(_mm512_add_ps(even, odd));
}

inline void pair_x(const BFloat16 *x, int64_t rows, int64_t k, uint16_t *xp, float *sums) {
    const int64_t blocks = k / 32, pairs = (blocks + 1) / 2;
    alignas(64) static const BFloat16 zeros[32] = {};
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t p = 0; p < pairs; p++) {
            const BFloat16 *x0 = x + r * k + p * 64, *x1 = 2 * p + 1 < blocks ? x0 + 32 : zeros;
            const __m256i *a = reinterpret_cast<const __m256i *>(x0), *b = reinterpret_cast<const __m256i *>(x1);
            __m512i *dst = reinterpret_cast<__m512i *>(xp + (p * rows + r) * 64);
            _mm512_storeu_si512(dst, _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(a)), _mm256_loadu_si256(b), 1));
            _mm512_storeu_si512(dst + 1, _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(a + 1)),
                                                            _mm256_loadu_si256(b + 1), 1));
            _mm_storeu_ps(sums + (p * rows + r) * 4, _mm_set_ps(block_sum(x1), 0.0f, block_sum(x0), 0.0f));
        }
    }
}

template <typename B, int R>
inline void pair_step(const uint8_t *b0, const uint8_t *b1, const __m512i table, const __m512i scale_index,
                      const uint16_t *xp, const float *sums, __m512 *acc, __m128 *macc) {
    const __m256i bytes = _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i *>(b0 + B::QS))),
        _mm_loadu_si128(reinterpret_cast<const __m128i *>(b1 + B::QS)), 1);
    const __m512i words = _mm512_cvtepu8_epi16(bytes);
    const __m512bh lo = (__m512bh)_mm512_permutexvar_epi16(words, table);
    const __m512bh hi = (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(words, 4), table);
    const __m128 dm = B::header(b0, b1);
    const __m512 d = _mm512_permutexvar_ps(scale_index, _mm512_castps128_ps512(dm));
    for (int r = 0; r < R; r++) {
        const uint16_t *xr = xp + r * 64;
        __m512 part = _mm512_dpbf16_ps(_mm512_setzero_ps(), lo, (__m512bh)_mm512_loadu_si512(xr));
        part = _mm512_dpbf16_ps(part, hi, (__m512bh)_mm512_loadu_si512(xr + 32));
        acc[r] = _mm512_fmadd_ps(d, part, acc[r]);
        if constexpr (B::HAS_MIN) macc[r] = _mm_fmadd_ps(dm, _mm_loadu_ps(sums + r * 4), macc[r]);
    }
}

template <typename B, int R>
void gemv_rows(const uint16_t *xp, const float *sums, const uint8_t *w, const BFloat16 *bias, BFloat16 *y,
               int64_t n, int64_t k, int64_t ldy) {
    const int64_t blocks = k / 32, full = blocks / 2, pairs = (blocks + 1) / 2, row_bytes = blocks * B::BYTES;
    alignas(64) static const uint8_t zero_block[64] = {};
    const __m512i table = nibble_table(B::OFFSET), scale_index = B::scale_index();
#pragma omp parallel for schedule(static)
    for (int64_t j = 0; j < n; j++) {
        __m512 acc[R];
        __m128 macc[R];
        for (int r = 0; r < R; r++) {
            acc[r] = _mm512_setzero_ps();
            macc[r] = _mm_setzero_ps();
        }
        const uint8_t *row = w + j * row_bytes;
        for (int64_t p = 0; p < full; p++) {
            const uint8_t *b0 = row + 2 * p * B::BYTES;
            pair_step<B, R>(b0, b0 + B::BYTES, table, scale_index, xp + p * R * 64, sums + p * R * 4, acc, macc);
        }
        if (full < pairs) {  // an odd last block, paired with a zero one
            const uint8_t *b0 = row + 2 * full * B::BYTES;
            pair_step<B, R>(b0, zero_block, table, scale_index, xp + full * R * 64, sums + full * R * 4, acc, macc);
        }
        const float extra = bias ? to_float(bias[j]) : 0.0f;
        for (int r = 0; r < R; r++) {
            const __m128 m = _mm_add_ps(macc[r], _mm_movehl_ps(macc[r], macc[r]));  // [., m0 + m1, ., .]
            const float offsets = B::HAS_MIN ? _mm_cvtss_f32(_mm_shuffle_ps(m, m, 1)) : 0.0f;
            store(y[r * ldy + j], _mm512_reduce_add_ps(acc[r]) + offsets + extra);
        }
    }
}

template <typename B, int MAX_ROWS>
void gemv(const BFloat16 *x, const uint8_t *w, const BFloat16 *bias, BFloat16 *y, int64_t rows, int64_t n,
          int64_t k, int64_t ldy) {
    const int64_t pairs = (k / 32 + 1) / 2;
    std::vector<uint16_t> xp(rows * pairs * 64);
    std::vector<float> sums(rows * pairs * 4);
    pair_x(x, rows, k, xp.data(), sums.data());
    const uint16_t *xd = xp.data();
    const float *sd = sums.data();
    with_rows<MAX_ROWS>(rows, [&](auto r) {
        gemv_rows<B, decltype(r)::value>(xd, sd, w, bias, y, n, k, ldy);
    });
}

// W [n, k] decoded to bf16, a pair of blocks at a time: each block's 16 possible values d q + m are
// computed in fp32 and rounded to bf16 once (a 32-entry table for the pair), then looked up per weight;
// the same values as store() of the fp32 decoding
template <typename B>
void dequant(const uint8_t *w, BFloat16 *out, int64_t n, int64_t k) {
    const int64_t blocks = k / 32, full = blocks / 2, row_bytes = blocks * B::BYTES;
    const __m512 q = _mm512_add_ps(_mm512_set_ps(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                   _mm512_set1_ps(float(B::OFFSET)));
    // a block's 16 bytes twice as words: the low nibbles (weights 0..15), then the high ones (16..31)
    const __m512i shifts = _mm512_set_epi16(4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 0, 0, 0, 0, 0, 0, 0,
                                            0, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m512i low = _mm512_set1_epi16(15), second = _mm512_set1_epi16(16);
#pragma omp parallel for schedule(static) if (n > 1)
    for (int64_t j = 0; j < n; j++) {
        const uint8_t *row = w + j * row_bytes;
        uint16_t *o = reinterpret_cast<uint16_t *>(out + j * k);
        alignas(16) float dm[4];
        for (int64_t p = 0; p < full; p++) {
            const uint8_t *b0 = row + 2 * p * B::BYTES, *b1 = b0 + B::BYTES;
            _mm_store_ps(dm, B::header(b0, b1));
            asm("" : "+m"(dm));  // broadcast back from memory (loads) rather than in registers (shuffles)
            const float *d = dm, *m = dm + 1;
            __m512 t0 = _mm512_mul_ps(_mm512_set1_ps(d[0]), q), t1 = _mm512_mul_ps(_mm512_set1_ps(d[B::HAS_MIN ? 2 : 1]), q);
            if constexpr (B::HAS_MIN) {  // d q is exact in fp32: one rounding, as in d * q + m
                t0 = _mm512_add_ps(t0, _mm512_set1_ps(m[0]));
                t1 = _mm512_add_ps(t1, _mm512_set1_ps(m[2]));
            }
            const __m512i table = (__m512i)_mm512_cvtne2ps_pbh(t1, t0);  // [block b's 16 | block b+1's]
            const __m512i w0 = _mm512_srlv_epi16(_mm512_cvtepu8_epi16(_mm256_broadcastsi128_si256(
                                                     _mm_loadu_si128(reinterpret_cast<const __m128i *>(b0 + B::QS)))),
                                                 shifts);
            const __m512i w1 = _mm512_srlv_epi16(_mm512_cvtepu8_epi16(_mm256_broadcastsi128_si256(
                                                     _mm_loadu_si128(reinterpret_cast<const __m128i *>(b1 + B::QS)))),
                                                 shifts);
            _mm512_storeu_si512(o + p * 64, _mm512_permutexvar_epi16(_mm512_and_si512(w0, low), table));
            _mm512_storeu_si512(o + p * 64 + 32,
                                _mm512_permutexvar_epi16(_mm512_ternarylogic_epi32(w1, low, second, 0xEA), table));
        }
        if (full * 2 < blocks) {  // an odd last block
            const uint8_t *b = row + 2 * full * B::BYTES;
            for (int i = 0; i < 32; i++) {
                const int nibble = (b[B::QS + i % 16] >> (i / 16 * 4)) & 15;
                const float d = _cvtsh_ss(u16(b)), m = B::HAS_MIN ? _cvtsh_ss(u16(b + 2)) : 0.0f;
                BFloat16 v;
                store(v, d * float(nibble + B::OFFSET) + m);
                o[full * 64 + i] = v.bits;
            }
        }
    }
}

// y [rows, n] = x [rows, k] @ W^T for more rows than gemv_rows takes (up to GEMM_MAX_ROWS): x's rows lie
// in the vector lanes (16 a register, G registers), so a decoded pair of weights is broadcast to all rows
// and one VDPBF16PS does 32 products of 16 rows. Each block of J rows of W is decoded once to its exact
// small integers (the nibble table) in an L1 buffer; per block and row of W the products are summed apart,
// then scaled: acc += d * sum_i q_i x_i + m * S, the same function as gemv_rows. x is laid out once per
// call as xq [k / 2, G, 16 rows, 2] (pairs of neighbouring k of each row; rows past the last are zero) and
// its block sums as sq [blocks, G, 16].
constexpr int GEMM_MAX_ROWS = 64;

inline void transpose16(__m512i *v) {  // a 16 x 16 matrix of 32-bit elements, one row a register
    __m512i t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(v[i], v[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(v[i], v[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        v[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        v[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        v[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        v[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    for (int i = 0; i < 4; i++) {  // 128-bit lanes: rows i, i + 4, i + 8, i + 12 hold columns 4 l + (i's)
        t[i] = _mm512_shuffle_i32x4(v[i], v[i + 4], 0x88);
        t[i + 4] = _mm512_shuffle_i32x4(v[i], v[i + 4], 0xdd);
        t[i + 8] = _mm512_shuffle_i32x4(v[i + 8], v[i + 12], 0x88);
        t[i + 12] = _mm512_shuffle_i32x4(v[i + 8], v[i + 12], 0xdd);
    }
    for (int i = 0; i < 4; i++) {
        v[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88);
        v[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0xdd);
        v[i + 4] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0x88);
        v[i + 12] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0xdd);
    }
}

inline void lane_x(const BFloat16 *x, int64_t rows, int64_t k, int groups, uint16_t *xq, float *sq) {
    const int64_t blocks = k / 32, pairs = k / 2;  // pairs: a multiple of 16
    for (int g = 0; g < groups; g++) {
        for (int64_t p0 = 0; p0 < pairs; p0 += 16) {  // 16 rows x 16 pairs of x, transposed
            __m512i v[16];
            for (int l = 0; l < 16; l++) {
                const int64_t r = g * 16 + l;
                v[l] = r < rows ? _mm512_loadu_si512(x + r * k + p0 * 2) : _mm512_setzero_si512();
            }
            transpose16(v);
            for (int i = 0; i < 16; i++) _mm512_storeu_si512(xq + ((p0 + i) * groups + g) * 32, v[i]);
        }
        for (int64_t b = 0; b < blocks; b++)
            for (int l = 0; l < 16; l++) {
                const int64_t r = g * 16 + l;
                sq[(b * groups + g) * 16 + l] = r < rows ? block_sum(x + r * k + b * 32) : 0.0f;
            }
    }
}

template <typename B, int J, int G>
inline void gemm_rows(const uint16_t *xq, const float *sq, const uint8_t *w, const BFloat16 *bias, BFloat16 *y,
                      int64_t rows, int64_t j0, int64_t k, int64_t ldy) {
    const int64_t blocks = k / 32, row_bytes = blocks * B::BYTES;
    const typename B::Decoder decode;
    constexpr int J8 = (J + 7) / 8 * 8;
    alignas(64) uint16_t q[J][32];      // this block of J rows of W, as bf16
    alignas(64) uint32_t header[J8];    // their d and m (halves; Q4_0: d only)
    alignas(64) float scale[J8][2];     // the same in fp32
    __m512 acc[J][G];
    for (int j = 0; j < J; j++)
        for (int g = 0; g < G; g++) acc[j][g] = _mm512_setzero_ps();
    for (int64_t b = 0; b < blocks; b++) {
        for (int j = 0; j < J; j++) {
            const uint8_t *block = w + (j0 + j) * row_bytes + b * B::BYTES;
            _mm512_store_si512(q[j], decode(block));
            header[j] = B::HAS_MIN ? u32(block) : u16(block);
        }
        for (int j = J; j < J8; j++) header[j] = 0;
        for (int j = 0; j < J8; j += 8)  // 8 rows' d and m at a time
            _mm512_store_ps(scale[j], _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i *>(header + j))));
        asm("" : "+m"(scale));  // broadcast from memory below (loads) rather than in registers (shuffles)
        __m512 part[J][G];
        for (int j = 0; j < J; j++)
            for (int g = 0; g < G; g++) part[j][g] = _mm512_setzero_ps();
        const uint16_t *xb = xq + b * 16 * G * 32;
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++) {
            __m512bh xv[G];
            for (int g = 0; g < G; g++) xv[g] = (__m512bh)_mm512_load_si512(xb + (i * G + g) * 32);
            for (int j = 0; j < J; j++) {
                uint32_t pair;
                std::memcpy(&pair, &q[j][2 * i], 4);
                const __m512bh wv = (__m512bh)_mm512_set1_epi32(int(pair));
                for (int g = 0; g < G; g++) part[j][g] = _mm512_dpbf16_ps(part[j][g], wv, xv[g]);
            }
        }
        for (int j = 0; j < J; j++) {
            const __m512 d = _mm512_set1_ps(scale[j][0]), m = _mm512_set1_ps(scale[j][1]);
            for (int g = 0; g < G; g++) {
                acc[j][g] = _mm512_fmadd_ps(d, part[j][g], acc[j][g]);
                if constexpr (B::HAS_MIN)
                    acc[j][g] = _mm512_fmadd_ps(m, _mm512_load_ps(sq + (b * G + g) * 16), acc[j][g]);
            }
        }
    }
    for (int j = 0; j < J; j++) {
        const float extra = bias ? to_float(bias[j0 + j]) : 0.0f;
        for (int g = 0; g < G; g++) {
            alignas(64) float lanes[16];
            _mm512_store_ps(lanes, acc[j][g]);
            for (int l = 0; l < 16 && g * 16 + l < rows; l++) store(y[(g * 16 + l) * ldy + j0 + j], lanes[l] + extra);
        }
    }
}

template <typename B, int J, int G>
void gemm_groups(const uint16_t *xq, const float *sq, const uint8_t *w, const BFloat16 *bias, BFloat16 *y,
                 int64_t rows, int64_t n, int64_t k, int64_t ldy) {
    const int64_t chunks = n / J;
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < chunks; c++) gemm_rows<B, J, G>(xq, sq, w, bias, y, rows, c * J, k, ldy);
    for (int64_t j = chunks * J; j < n; j++) gemm_rows<B, 1, G>(xq, sq, w, bias, y, rows, j, k, ldy);
}

template <typename B>
void gemm(const BFloat16 *x, const uint8_t *w, const BFloat16 *bias, BFloat16 *y, int64_t rows, int64_t n,
          int64_t k, int64_t ldy) {
    const int groups = int((rows + 15) / 16);  // k is a multiple of 32: both sizes multiples of 64 bytes
    uint16_t *xq = static_cast<uint16_t *>(std::aligned_alloc(64, k * groups * 16 * sizeof(uint16_t)));
    float *sq = static_cast<float *>(std::aligned_alloc(64, k / 32 * groups * 16 * sizeof(float)));
    lane_x(x, rows, k, groups, xq, sq);
    switch (groups) {  // J rows of W at a time: J x G accumulators and J x G partial sums in registers
        case 1: gemm_groups<B, 8, 1>(xq, sq, w, bias, y, rows, n, k, ldy); break;
        case 2: gemm_groups<B, 4, 2>(xq, sq, w, bias, y, rows, n, k, ldy); break;
        case 3: gemm_groups<B, 4, 3>(xq, sq, w, bias, y, rows, n, k, ldy); break;
        default: gemm_groups<B, 2, 4>(xq, sq, w, bias, y, rows, n, k, ldy); break;
    }
    std::free(xq);
    std::free(sq);
}

}  // namespace bf16dot
#endif

// GGUF Q4_0 and Q6_K products with int8 activations on CPUs with AVX2 but no AVX-512 (csrc/int8_dot.h's
// VNNI paths need AVX512_VNNI): what llama.cpp's CPU backend does there (ggml_vec_dot_q4_0_q8_0,
// ggml_vec_dot_q6_K_q8_K): VPMADDUBSW multiplies 32 unsigned weight bytes by 32 signed activation bytes
// into 16 sums of pairs (int16: 2 * 63 * 127 at most, never saturated), VPMADDWD widens them to int32.
// x is quantized once per call, as csrc/int8_dot.h does (per block of 32 for Q4_0, of 256 for Q6_K:
// d = max |x_i| / 127, q_i = round(x_i / d) to nearest even), so the same error bound holds
// (tests/engine/test_int8_dot.py). Weights stay in ggml's block layout and unsigned; their offsets (8,
// 32) come back through x's block sums:
//   Q4_0:  y += d_w * d_x * (sum_i u_i q_i - 8 S)            per block of 32
//   Q6_K:  y += d_w * d_x * sum_s scale_s * (sum_i u_i q_i - 32 S_s)   per super-block, s its 16 sub-blocks
// Q6_K's sums stay in int32 over a whole super-block (|sum| <= 256 * 32 * 127 * 128 < 2^31): one conversion
// to fp32 a super-block. Output columns are split over the engine's OpenMP threads. Q4_0 multiplies 8
// columns at a time (tile_columns: their blocks decoded once for all rows, columns in int32 lanes): from
// 8-column tiles (tile_load: the transposition done at load, one stream a group; csrc/quantized.cpp
// q4_0x8_gemm) at every row count; from blocks as stored (transposed as they are read) from 2 rows, one row
// a column at a time (q4_0_column). Q6_K a column at a time, its super-blocks decoded once per group of up
// to 8 rows.
// Included by csrc/quantized.cpp (quant_gemv_q4_0, quant_gemm_q4_0, q4_0x8_gemm / _dequant, the MoE experts'
// moe_panels_tiles_q4_0 / moe_panels_rows_q4_0 / _q6_k) and csrc/q6_k_gemm.cpp (quant_gemm_q6_k)
// where the build (-march) has AVX2, FMA and F16C and not AVX-512F; int8_rows says from which rows.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "dtypes.h"
#include "int8_dot.h"
#include "quant_vec.h"  // vsum: an AVX2 build's Vec is __m256

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__) && !defined(__AVX512F__)
#include <immintrin.h>
#define INT8_AVX2 1

namespace avx2dot {

constexpr int GROUP = 8;  // rows a pass over a Q6_K column: 8 fp32 accumulators in registers

inline __m256 load8(const float *p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const BFloat16 *p) {  // 8 bf16 widened to fp32 (exact)
    return _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i *>(p))), 16));
}

inline float hmax(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_max_ss(s, _mm_shuffle_ps(s, s, 1)));
}

inline float f16(const uint8_t *p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

// n values of x (a multiple of 32) as one block: q [n] int8, returns d; sums [n / 16]: each 16 q's sum
template <typename T>
inline float quantize_block(const T *x, int n, int8_t *q, int16_t *sums) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 amax = _mm256_setzero_ps();
    for (int i = 0; i < n; i += 8) amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, load8(x + i)));
    const float m = hmax(amax), d = m / 127.0f;
    const __m256 inverse = _mm256_set1_ps(m > 0.0f ? 127.0f / m : 0.0f);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);  // undoes the packs' lane interleave
    for (int i = 0; i < n; i += 32) {
        __m256i v[4];
        for (int j = 0; j < 4; j++) v[j] = _mm256_cvtps_epi32(_mm256_mul_ps(load8(x + i + 8 * j), inverse));
        for (int j = 0; j < 4; j += 2) {  // 16 values' sum: two vectors of 8
            const __m256i s = _mm256_add_epi32(v[j], v[j + 1]);
            const __m128i h = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
            const __m128i h2 = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4E));
            sums[(i + 16 * (j / 2)) / 16] = int16_t(_mm_cvtsi128_si32(_mm_add_epi32(h2, _mm_shuffle_epi32(h2, 0xB1))));
        }
        const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
        _mm256_storeu_si256(reinterpret_cast<__m256i *>(q + i), _mm256_permutevar8x32_epi32(bytes, order));
    }
    return d;
}

struct X {  // x's rows quantized per block (Q4_0: 32; Q6_K: 256), block-major: a block's rows side by side
    std::vector<int8_t> q;      // [blocks, rows, block]
    std::vector<float> d;       // [blocks, rows]
    std::vector<int16_t> sums;  // [blocks, rows, block / 16]: each 16 q's sum
    std::vector<int32_t> corr;  // [blocks, rows], Q4_0 only: -8 S, S the block's sum of q (Q4_0's offset 8)
    int64_t rows, blocks;
};

template <typename T>
X quantize(const T *x, int64_t rows, int64_t k, int block) {
    const int64_t blocks = k / block;
    const bool q4_0 = block == 32;  // only Q4_0's kernel reads corr
    X a{std::vector<int8_t>(rows * k), std::vector<float>(rows * blocks), std::vector<int16_t>(rows * k / 16),
        std::vector<int32_t>(q4_0 ? rows * blocks : 0), rows, blocks};
    for (int64_t r = 0; r < rows; r++)
        for (int64_t b = 0; b < blocks; b++) {
            const int64_t i = b * rows + r;
            int16_t *sums = a.sums.data() + i * (block / 16);
            a.d[i] = quantize_block(x + r * k + b * block, block, a.q.data() + i * block, sums);
            if (q4_0) a.corr[i] = -8 * (sums[0] + sums[1]);  // the block's two sums of 16
        }
    return a;
}

// ---- Q4_0: 18-byte blocks (fp16 d, 16 bytes: weights i and i + 16 in byte i's low and high nibbles) ----
inline __m256i q4_0_bytes(const uint8_t *qs) {  // the 32 nibbles in x's order, as bytes 0..15
    const __m256i both = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i *>(qs)));
    const __m256i b = _mm256_srlv_epi64(both, _mm256_setr_epi64x(0, 0, 4, 4));  // the high lane's nibbles down
    return _mm256_and_si256(b, _mm256_set1_epi8(15));
}

// every fp16 value as fp32 (256 KB, filled once): a block's d is one load, not a conversion through the
// vector unit's shuffle ports (llama.cpp keeps the same table, ggml_table_f32_f16)
inline const float *f16_table() {
    static const std::vector<float> table = [] {
        std::vector<float> t(65536);
        for (int h = 0; h < 65536; h++) t[h] = _cvtsh_ss(uint16_t(h));
        return t;
    }();
    return table.data();
}

// y [0, j] for x's one row, column j's blocks as stored: 4 accumulator sets (blocks b, b + 1, .. in turn),
// so that the FMAs do not wait on one chain; -8 S enters as -S in each of the 8 int32 lanes
template <typename T>
void q4_0_column(const X &x, const uint8_t *w, const T *bias, T *y, int64_t j) {
    constexpr int S = 4;
    const __m256i ones = _mm256_set1_epi16(1);
    const float *half = f16_table();
    const int64_t blocks = x.blocks;
    __m256 acc[S];
    for (int s = 0; s < S; s++) acc[s] = _mm256_setzero_ps();
    const uint8_t *wb = w + j * blocks * 18;
    for (int64_t b = 0; b < blocks; b += S) {
        const int sets = int(std::min<int64_t>(S, blocks - b));
        for (int s = 0; s < sets; s++) {
            const uint8_t *block = wb + (b + s) * 18;
            uint16_t h;
            std::memcpy(&h, block, 2);
            const __m256i qv = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(x.q.data() + (b + s) * 32));
            __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(q4_0_bytes(block + 2), qv), ones);
            p = _mm256_add_epi32(p, _mm256_set1_epi32(x.corr[b + s] / 8));
            const __m256 scale = _mm256_mul_ps(_mm256_broadcast_ss(half + h), _mm256_broadcast_ss(&x.d[b + s]));
            acc[s] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), scale, acc[s]);
        }
    }
    const __m256 total = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), acc[2]), acc[3]);
    store(y[j], vsum(total) + (bias ? to_float(bias[j]) : 0.0f));
}

// A tile: one block of 8 output columns with each column's 16 bytes in an int32 lane. Dword v of a block
// holds weights 4v..4v+3 (low nibbles) and 16+4v..16+4v+3 (high): transposing the 8 columns' 4 dwords puts
// column c's dword v in lane c of T_v, and u[v] / u[4 + v] are its low / high nibbles as bytes. VPMADDUBSW
// of u[v] with a broadcast quad of x (x's 4 values at the same k) gives each column's two pair sums; the 8
// quads' int16 sums add up without saturating (8 * 2 * 15 * 127 < 2^15), one VPMADDWD widens them: 9
// integer multiplies per row, block and 8 columns (llama.cpp's AVX2 Q4_0 8x8 GEMM), where one column at a
// time took 16. Columns past n repeat the last one (read, never stored).
struct Q4Tile {
    __m256i u[8];  // u[v]: the 8 columns' weights 4v..4v+3 (v < 4), 16+4(v-4).. (v >= 4), unsigned bytes
    __m256 d;      // the 8 columns' d
};

inline __m256i pair128(const uint8_t *low, const uint8_t *high) {  // 16 bytes at low | 16 at high
    return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i *>(low))),
                                   _mm_loadu_si128(reinterpret_cast<const __m128i *>(high)), 1);
}

inline void q4_0_tile(const uint8_t *const block[8], Q4Tile &t) {  // block[c]: column c's 18-byte block
    const __m256i a0 = pair128(block[0] + 2, block[4] + 2), a1 = pair128(block[1] + 2, block[5] + 2);
    const __m256i a2 = pair128(block[2] + 2, block[6] + 2), a3 = pair128(block[3] + 2, block[7] + 2);
    const __m256i t0 = _mm256_unpacklo_epi32(a0, a1), t1 = _mm256_unpackhi_epi32(a0, a1);
    const __m256i t2 = _mm256_unpacklo_epi32(a2, a3), t3 = _mm256_unpackhi_epi32(a2, a3);
    const __m256i dwords[4] = {_mm256_unpacklo_epi64(t0, t2), _mm256_unpackhi_epi64(t0, t2),
                               _mm256_unpacklo_epi64(t1, t3), _mm256_unpackhi_epi64(t1, t3)};
    const __m256i m15 = _mm256_set1_epi8(15);
    for (int v = 0; v < 4; v++) {
        t.u[v] = _mm256_and_si256(dwords[v], m15);
        t.u[4 + v] = _mm256_and_si256(_mm256_srli_epi16(dwords[v], 4), m15);
    }
    uint16_t h[8];  // built in a register (vpinsrw), not stored and reloaded: a reload waits for 8 stores
    for (int c = 0; c < 8; c++) std::memcpy(h + c, block[c], 2);
    t.d = _mm256_cvtph_ps(_mm_setr_epi16(short(h[0]), short(h[1]), short(h[2]), short(h[3]), short(h[4]),
                                         short(h[5]), short(h[6]), short(h[7])));
}

inline __m256i quad(const int8_t *q) {  // x's 4 int8 at q in every int32 lane
    int32_t v;
    std::memcpy(&v, q, 4);
    return _mm256_set1_epi32(v);
}

// GGUF Q4_0 in 8-column tiles (quantization/column_tiles.py, llama.cpp's block_q4_0x8 on AVX2): W's columns
// in groups of 8, a group's blocks in k order, each TILE_BYTES: the 8 columns' fp16 d, then T_0..T_3 (32
// bytes each), T_v holding column c's bytes 4v..4v+3 in lane c: q4_0_tile's transposition done once, at
// load. A group's blocks are one stream from memory, and a block's tile is 4 loads.
constexpr int TILE_COLUMNS = 8;
constexpr int64_t TILE_BYTES = 144;  // 8 blocks of 18 bytes, moved

inline void tile_load(const uint8_t *p, Q4Tile &t) {
    const __m256i m15 = _mm256_set1_epi8(15);
    for (int v = 0; v < 4; v++) {
        const __m256i dwords = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(p + 16 + 32 * v));
        t.u[v] = _mm256_and_si256(dwords, m15);
        t.u[4 + v] = _mm256_and_si256(_mm256_srli_epi16(dwords, 4), m15);
    }
    t.d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(p)));
}

// group's 8 columns back in GGUF's block layout: rows [8, blocks * 18]
inline void untile(const uint8_t *group, uint8_t *rows, int64_t blocks) {
    for (int64_t b = 0; b < blocks; b++)
        for (int c = 0; c < TILE_COLUMNS; c++) {
            const uint8_t *p = group + b * TILE_BYTES;
            uint8_t *block = rows + (c * blocks + b) * 18;
            std::memcpy(block, p + 2 * c, 2);
            for (int v = 0; v < 4; v++) std::memcpy(block + 2 + 4 * v, p + 16 + 32 * v + 4 * c, 4);
        }
}

// y [:, j0 .. j0 + 8) (those below n) for all of x's rows (at most Int8Rows::MAX_ROWS: int8_rows' range);
// load(b, t) puts block b's tile in t
template <typename Load, typename T>
void tile_columns(const X &x, Load &&load, const T *bias, T *y, int64_t j0, int64_t n, int64_t ldy) {
    const int64_t rows = x.rows, blocks = x.blocks;
    __m256 acc[Int8Rows::MAX_ROWS];
    const __m256i ones = _mm256_set1_epi16(1);
    for (int64_t r = 0; r < rows; r++) acc[r] = _mm256_setzero_ps();
    Q4Tile t;
    for (int64_t b = 0; b < blocks; b++) {
        load(b, t);
        for (int64_t r = 0; r < rows; r++) {
            const int64_t i = b * rows + r;
            const int8_t *q = x.q.data() + i * 32;
            __m256i s = _mm256_maddubs_epi16(t.u[0], quad(q));
            for (int v = 1; v < 8; v++)
                s = _mm256_add_epi16(s, _mm256_maddubs_epi16(t.u[v], quad(q + (v < 4 ? 4 * v : 16 + 4 * (v - 4)))));
            const __m256i p = _mm256_add_epi32(_mm256_madd_epi16(s, ones), _mm256_set1_epi32(x.corr[i]));
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(t.d, _mm256_set1_ps(x.d[i])), acc[r]);
        }
    }
    const int cols = int(std::min<int64_t>(8, n - j0));
    for (int64_t r = 0; r < rows; r++) {
        alignas(32) float out[8];
        _mm256_store_ps(out, acc[r]);
        for (int c = 0; c < cols; c++) store(y[r * ldy + j0 + c], out[c] + (bias ? to_float(bias[j0 + c]) : 0.0f));
    }
}

// the same from blocks as stored: the 8 columns' blocks transposed as they are read
template <typename T>
void q4_0_columns(const X &x, const uint8_t *w, const T *bias, T *y, int64_t j0, int64_t n, int64_t ldy) {
    const uint8_t *column[8];
    for (int c = 0; c < 8; c++) column[c] = w + std::min(j0 + c, n - 1) * x.blocks * 18;
    auto load = [&](int64_t b, Q4Tile &t) {
        const uint8_t *block[8];
        for (int c = 0; c < 8; c++) block[c] = column[c] + b * 18;
        q4_0_tile(block, t);
    };
    tile_columns(x, load, bias, y, j0, n, ldy);
}

// ---- Q6_K: 210-byte super-blocks (ql [128], qh [64], int8 scales [16], fp16 d; csrc/q6_k.h) ----
struct Q6Decoded {
    __m256i u[8];       // the 256 unsigned 6-bit integers in x's order, 32 a vector
    __m256i scales[8];  // vector v's two sub-blocks' scales as int16: s[2 v] (low 128 bits), s[2 v + 1]
    __m256i all;        // the 16 scales as int16, in order (for the offsets' term)
    float d;
};

// VPSHUFB controls: pick m broadcasts int16 element 2 m to the low 128 bits, element 2 m + 1 to the high
alignas(32) inline constexpr uint8_t SCALE_PICKS[4][32] = {
    {0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3},
    {4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7},
    {8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11},
    {12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13,
     14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15},
};

inline void q6_k_decode(const uint8_t *b, Q6Decoded &o) {
    const __m256i m15 = _mm256_set1_epi8(15), m3 = _mm256_set1_epi8(3);
    for (int half = 0; half < 2; half++) {
        const uint8_t *ql = b + 64 * half, *qh = b + 128 + 32 * half;
        const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(ql));
        const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(ql + 32));
        const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(qh));
        auto high2 = [&](int shift) {  // bits shift, shift + 1 of each qh byte, moved to bits 4, 5
            const __m256i bits = _mm256_and_si256(_mm256_srli_epi16(h, shift), m3);
            return _mm256_slli_epi16(bits, 4);  // no carries between bytes: bits 4-5 only
        };
        __m256i *u = o.u + 4 * half;
        u[0] = _mm256_or_si256(_mm256_and_si256(lo, m15), high2(0));
        u[1] = _mm256_or_si256(_mm256_and_si256(hi, m15), high2(2));
        u[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(lo, 4), m15), high2(4));
        u[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(hi, 4), m15), high2(6));
    }
    const __m128i s8 = _mm_loadu_si128(reinterpret_cast<const __m128i *>(b + 192));
    o.all = _mm256_cvtepi8_epi16(s8);
    const __m256i first = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(s8));  // s[0..7] in both lanes
    const __m256i second = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(_mm_srli_si128(s8, 8)));
    for (int v = 0; v < 8; v++)  // int16 element 2 (v % 4) in the low lane, 2 (v % 4) + 1 in the high
        o.scales[v] = _mm256_shuffle_epi8(v < 4 ? first : second,
                                          _mm256_load_si256(reinterpret_cast<const __m256i *>(SCALE_PICKS[v % 4])));
    o.d = f16(b + 208);
}

template <int R, typename T>
void q6_k_column(const X &x, int64_t row, const uint8_t *w, const T *bias, T *y, int64_t j, int64_t ldy) {
    __m256 acc[R];
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    const uint8_t *blocks = w + j * x.blocks * 210;
    Q6Decoded s;
    for (int64_t b = 0; b < x.blocks; b++) {
        q6_k_decode(blocks + b * 210, s);
        for (int r = 0; r < R; r++) {
            const int64_t i = b * x.rows + row + r;
            const int8_t *q = x.q.data() + i * 256;
            __m256i sum = _mm256_setzero_si256();
            for (int v = 0; v < 8; v++) {
                const __m256i qv = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(q + 32 * v));
                sum = _mm256_add_epi32(sum, _mm256_madd_epi16(_mm256_maddubs_epi16(s.u[v], qv), s.scales[v]));
            }
            const __m256i bsums = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(x.sums.data() + i * 16));
            sum = _mm256_sub_epi32(sum, _mm256_slli_epi32(_mm256_madd_epi16(s.all, bsums), 5));  // -32 sum_s scale_s S_s
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_set1_ps(s.d * x.d[i]), acc[r]);
        }
    }
    const float extra = bias ? to_float(bias[j]) : 0.0f;
    for (int r = 0; r < R; r++) store(y[(row + r) * ldy + j], vsum(acc[r]) + extra);
}

// y [:, first .. end) for x's rows (quantized as a), W Q4_0 (QK 32: 8 columns a tile) or Q6_K
// (QK 256: a column at a time, in groups of up to 8 rows)
template <int QK, typename T>
void columns(const X &a, const uint8_t *w, const T *bias, T *y, int64_t first, int64_t end, int64_t ldy) {
    if constexpr (QK == 32) {
        if (a.rows == 1) {  // one row streams each column's blocks in turn (faster from memory: performance.md)
            for (int64_t j = first; j < end; j++) q4_0_column(a, w, bias, y, j);
            return;
        }
        for (int64_t j = first; j < end; j += 8) q4_0_columns(a, w, bias, y, j, end, ldy);
    } else {
        for (int64_t j = first; j < end; j++)
            for (int64_t row = 0; row < a.rows; row += GROUP) {
                auto run = [&](auto r) { q6_k_column<decltype(r)::value>(a, row, w, bias, y, j, ldy); };
                switch (std::min<int64_t>(GROUP, a.rows - row)) {
                    case 1: run(std::integral_constant<int, 1>{}); break;
                    case 2: run(std::integral_constant<int, 2>{}); break;
                    case 3: run(std::integral_constant<int, 3>{}); break;
                    case 4: run(std::integral_constant<int, 4>{}); break;
                    case 5: run(std::integral_constant<int, 5>{}); break;
                    case 6: run(std::integral_constant<int, 6>{}); break;
                    case 7: run(std::integral_constant<int, 7>{}); break;
                    default: run(std::integral_constant<int, 8>{}); break;
                }
            }
    }
}

// y [rows, n] (row stride ldy) = x [rows, k] @ W^T (+ bias), W Q4_0 (QK 32) or Q6_K (QK 256) blocks
template <int QK, typename T>
void gemm(const T *x, const uint8_t *w, const T *bias, T *y, int64_t rows, int64_t n, int64_t k, int64_t ldy) {
    const X a = quantize(x, rows, k, QK);
    constexpr int64_t STEP = QK == 32 ? 8 : 1;  // columns a unit of work
#pragma omp parallel for schedule(static)
    for (int64_t j = 0; j < n; j += STEP) columns<QK>(a, w, bias, y, j, std::min(j + STEP, n), ldy);
}

}  // namespace avx2dot
#endif

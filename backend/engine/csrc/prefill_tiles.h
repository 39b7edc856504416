// The tiles of csrc/prefill_attention.cpp: register-tiled products C (=, +=) A @ B with fp32 sums, and the
// packed B operands they read (keys for the scores, values for the output), converted from the pool's type.
// B [K][N] is row-major in fp32 and in pairs along K in bf16 ([K / 2][N][2], what VDPBF16PS multiplies).
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "dtypes.h"
#include "quant_vec.h"

#if defined(__AVX512BF16__) && defined(__AVX512VL__)
#include <immintrin.h>
#endif

namespace prefill {

constexpr int64_t KEY_TILE = 64;  // keys per tile: a multiple of 16, the products' column unit
constexpr int MAX_R = 6;  // rows of a register tile
constexpr int64_t COLUMN_UNIT = 16;  // padded head size and key counts are multiples of this

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// C [R, NV * VEC_WIDTH] (=, or += when accumulate) A [R, K] @ B [K, ldb] (columns 0 .. NV * VEC_WIDTH - 1)
template <int R, int NV>
void tile_f32(const float *a, int64_t lda, const float *b, int64_t ldb, float *c, int64_t ldc, int64_t K,
              bool accumulate) {
    Vec acc[R][NV];
    for (int r = 0; r < R; r++) {
        for (int v = 0; v < NV; v++) acc[r][v] = accumulate ? vload(c + r * ldc + v * VEC_WIDTH) : vzero();
    }
    for (int64_t k = 0; k < K; k++) {
        Vec bv[NV];
        for (int v = 0; v < NV; v++) bv[v] = vload(b + k * ldb + v * VEC_WIDTH);
        for (int r = 0; r < R; r++) {
            const Vec av = vset(a[r * lda + k]);
            for (int v = 0; v < NV; v++) acc[r][v] = vfma(av, bv[v], acc[r][v]);
        }
    }
    for (int r = 0; r < R; r++) {
        for (int v = 0; v < NV; v++) vstore(c + r * ldc + v * VEC_WIDTH, acc[r][v]);
    }
}

#if defined(__AVX512BF16__) && defined(__AVX512VL__)
constexpr bool HAS_BF16_DOT = true;
// The same product with bf16 operands, B packed in pairs along K ([K / 2][ldb][2], K even): VDPBF16PS
// multiplies a broadcast pair of A's row by 16 columns' pairs, exactly, and adds both products in fp32
template <int R, int NV>
void tile_bf16(const BFloat16 *a, int64_t lda, const BFloat16 *b, int64_t ldb, float *c, int64_t ldc, int64_t K,
               bool accumulate) {
    __m512 acc[R][NV];
    for (int r = 0; r < R; r++) {
        for (int v = 0; v < NV; v++) acc[r][v] = accumulate ? _mm512_loadu_ps(c + r * ldc + v * 16) : _mm512_setzero_ps();
    }
    for (int64_t k = 0; k < K; k += 2) {
        __m512bh bv[NV];
        for (int v = 0; v < NV; v++) bv[v] = (__m512bh)_mm512_loadu_si512(b + k * ldb + v * 32);
        for (int r = 0; r < R; r++) {
            uint32_t pair;
            std::memcpy(&pair, a + r * lda + k, sizeof pair);
            const __m512bh av = (__m512bh)_mm512_set1_epi32(int32_t(pair));
            for (int v = 0; v < NV; v++) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], av, bv[v]);
        }
    }
    for (int r = 0; r < R; r++) {
        for (int v = 0; v < NV; v++) _mm512_storeu_ps(c + r * ldc + v * 16, acc[r][v]);
    }
}
#else
constexpr bool HAS_BF16_DOT = false;
template <int R, int NV>
void tile_bf16(const BFloat16 *, int64_t, const BFloat16 *, int64_t, float *, int64_t, int64_t, bool) {}
#endif

// The operand type of the products: bf16 where the build has VDPBF16PS and the activations are bf16
template <typename T>
using Operand = std::conditional_t<HAS_BF16_DOT && std::is_same_v<T, BFloat16>, BFloat16, float>;

// Element (k, n) of a B operand [K][N]: row-major for fp32, in pairs along K for bf16
template <typename PT>
inline int64_t b_index(int64_t k, int64_t n, int64_t N) {
    if constexpr (std::is_same_v<PT, float>) {
        return k * N + n;
    } else {
        return ((k >> 1) * N + n) * 2 + (k & 1);
    }
}

// C [rows, N] (=, or +=) A [rows, K] @ B [K, N] for rows <= MAX_R, N a multiple of COLUMN_UNIT, K even
template <typename PT>
void product(const PT *a, int64_t lda, const PT *b, int64_t ldb, float *c, int64_t ldc, int64_t rows, int64_t N,
             int64_t K, bool accumulate) {
    constexpr int64_t lanes = std::is_same_v<PT, float> ? VEC_WIDTH : 16;
    constexpr int max_nv = lanes == 8 ? 2 : 4;  // AVX2 has 16 registers, AVX-512 32
    for (int64_t n0 = 0; n0 < N;) {
        const int nv = int(std::min<int64_t>(max_nv, (N - n0) / lanes));
        const PT *bn = std::is_same_v<PT, float> ? b + n0 : b + 2 * n0;
        with_rows<MAX_R>(rows, [&](auto r) {
            auto call = [&](auto v) {
                if constexpr (std::is_same_v<PT, float>) {
                    tile_f32<r.value, v.value>(a, lda, bn, ldb, c + n0, ldc, K, accumulate);
                } else {
                    tile_bf16<r.value, v.value>(a, lda, bn, ldb, c + n0, ldc, K, accumulate);
                }
            };
            if (nv >= 4) return call(std::integral_constant<int, max_nv>{});
            if (nv == 3) return call(std::integral_constant<int, std::min(3, max_nv)>{});
            if (nv == 2) return call(std::integral_constant<int, 2>{});
            return call(std::integral_constant<int, 1>{});
        });
        n0 += int64_t(nv) * lanes;
    }
}

struct Shape {
    int64_t num_heads, num_kv_heads, head_dim, padded_dim, num_blocks, block_size, max_blocks;
};

// Where position p of KV head kvh lies in the pool (element offset of its row)
inline int64_t pool_row(const int64_t *table, int64_t kvh, int64_t p, const Shape &s) {
    return ((kvh * s.num_blocks + table[p / s.block_size]) * s.block_size + p % s.block_size) * s.head_dim;
}

#if defined(__AVX512BF16__) && defined(__AVX512VL__)
// rows [16] of 16 x 32-bit lanes transposed in place: four rounds, each swapping one bit of the row index
// with the same bit of the lane index between row pairs (i, i + bit), two two-source permutes a pair
inline void transpose16(__m512i *rows) {
    for (int bit = 1; bit < 16; bit *= 2) {
        alignas(64) int32_t low[16], high[16];
        for (int j = 0; j < 16; j++) {
            low[j] = (j & bit) ? 16 + (j ^ bit) : j;
            high[j] = (j & bit) ? 16 + j : (j | bit);
        }
        const __m512i lo = _mm512_load_si512(low), hi = _mm512_load_si512(high);
        for (int i = 0; i < 16; i++) {
            if (i & bit) continue;
            const __m512i a = rows[i], b = rows[i + bit];
            rows[i] = _mm512_permutex2var_epi32(a, lo, b);
            rows[i + bit] = _mm512_permutex2var_epi32(a, hi, b);
        }
    }
}

// pack_tile for a bf16 pool, D % 32 == 0: keys transposed 16 x 16 pairs at a time in registers, values
// interleaved two rows at a time (vector permutes, not 16-bit moves); positions j < first or >= n are 0
inline void pack_tile_bf16(const BFloat16 *k_cache, const BFloat16 *v_cache, const int64_t *table, int64_t kvh,
                           int64_t p0, int64_t first, int64_t n, const Shape &s, BFloat16 *keys, BFloat16 *values) {
    const int64_t D = s.head_dim, pairs = D / 2;
    auto read = [&](int64_t j) { return j >= first && j < n; };
    for (int64_t j0 = 0; j0 < KEY_TILE; j0 += 16) {
        const BFloat16 *rows[16];
        for (int j = 0; j < 16; j++) rows[j] = read(j0 + j) ? k_cache + pool_row(table, kvh, p0 + j0 + j, s) : nullptr;
        for (int64_t q0 = 0; q0 < pairs; q0 += 16) {  // pairs q0 .. q0 + 15 of keys j0 .. j0 + 15
            __m512i block[16];
            for (int j = 0; j < 16; j++) block[j] = rows[j] ? _mm512_loadu_si512(rows[j] + 2 * q0) : _mm512_setzero_si512();
            transpose16(block);
            for (int i = 0; i < 16; i++) _mm512_storeu_si512(keys + ((q0 + i) * KEY_TILE + j0) * 2, block[i]);
        }
    }
    alignas(64) int16_t low[32], high[32];
    for (int i = 0; i < 16; i++) low[2 * i] = i, low[2 * i + 1] = 32 + i, high[2 * i] = 16 + i, high[2 * i + 1] = 48 + i;
    const __m512i lo = _mm512_load_si512(low), hi = _mm512_load_si512(high);
    for (int64_t j = 0; j < KEY_TILE; j += 2) {  // rows j, j + 1 interleaved: [j / 2][D][2]
        const BFloat16 *a = read(j) ? v_cache + pool_row(table, kvh, p0 + j, s) : nullptr;
        const BFloat16 *b = read(j + 1) ? v_cache + pool_row(table, kvh, p0 + j + 1, s) : nullptr;
        for (int64_t d0 = 0; d0 < D; d0 += 32) {
            const __m512i x = a ? _mm512_loadu_si512(a + d0) : _mm512_setzero_si512();
            const __m512i y = b ? _mm512_loadu_si512(b + d0) : _mm512_setzero_si512();
            BFloat16 *out = values + (j / 2 * D + d0) * 2;
            _mm512_storeu_si512(out, _mm512_permutex2var_epi16(x, lo, y));
            _mm512_storeu_si512(out + 32, _mm512_permutex2var_epi16(x, hi, y));
        }
    }
}
#endif

// Keys [p0, p0 + KEY_TILE) of one (chunk, KV head) as B of the scores product ([padded_dim][KEY_TILE]) and
// values as B of the output product ([KEY_TILE][padded_dim]); positions before lo (a sliding window's: their
// blocks may be freed, so they are not read), positions past len and columns past D are 0
template <typename PT, typename C>
void pack_tile(const C *k_cache, const C *v_cache, const int64_t *table, int64_t kvh, int64_t p0, int64_t lo,
               int64_t len, const Shape &s, PT *keys, PT *values) {
    const int64_t D = s.head_dim, Dp = s.padded_dim, n = std::min(KEY_TILE, len - p0);
    const int64_t first = std::max<int64_t>(0, lo - p0);
#if defined(__AVX512BF16__) && defined(__AVX512VL__)
    if constexpr (std::is_same_v<PT, BFloat16> && std::is_same_v<C, BFloat16>) {
        if (D % 32 == 0) return pack_tile_bf16(k_cache, v_cache, table, kvh, p0, first, n, s, keys, values);
    }
#endif
    if (n < KEY_TILE || D < Dp || first > 0) {
        std::fill(keys, keys + KEY_TILE * Dp, PT{});
        std::fill(values, values + KEY_TILE * Dp, PT{});
    }
    for (int64_t j = first; j < n; j++) {
        const C *k = k_cache + pool_row(table, kvh, p0 + j, s), *v = v_cache + pool_row(table, kvh, p0 + j, s);
        for (int64_t d = 0; d < D; d++) store(keys[b_index<PT>(d, j, KEY_TILE)], to_float(k[d]));
        for (int64_t d = 0; d < D; d++) store(values[b_index<PT>(j, d, Dp)], to_float(v[d]));
    }
}

}  // namespace prefill

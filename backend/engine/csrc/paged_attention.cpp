// Paged decode attention for the CPU: each query token reads its keys and values straight from the
// block pool through its block table, so nothing is gathered, padded or converted first.
//
// Layout (as in backend/engine/attention.py):
//   q             [T, H, D]           T query tokens (one per decoding sequence), token stride q_stride
//   out           [T, H, D]           contiguous
//   k/v cache     [KVH, NB, BS, D]    the pool of one layer, in q's type or fp8 (keys stored as k / k_scale,
//                                     values as v / v_scale: k_scale is folded into scale, v_scale applied
//                                     to the output)
//   block_tables  [T, max_blocks]     int64 block ids of each query's sequence
//   context_lens  [T]                 int64: keys at positions 0 .. len-1 are attended
// Query heads h = kvh * G + g share KV head kvh (G = H / KVH), as in GQA. Work is split over
// (token, KV head) pairs with OpenMP (torch's own runtime, already loaded); scores, softmax and the
// weighted sum of values are computed in fp32 whatever the storage type. No torch headers: it builds
// in about a second. Built and loaded by backend/engine/cpu_kernels.py.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "dtypes.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

namespace {

constexpr int64_t MAX_TILE = 64;  // positions per tile: a block, or a part of one
constexpr int64_t KEYS_AHEAD = 2;  // tiles of keys prefetched ahead of the one being scored

// Asks for bytes at p to be brought into the cache ahead of their use: the pool is read through block tables
// (a jump every block), so the hardware prefetchers alone leave every block's first lines to miss.
// LEVEL 3: into every level of the cache (what is read next), 2: into L2 but not L1 (what is read later).
template <int LEVEL>
inline void prefetch(const void *p, int64_t bytes) {
    const char *c = static_cast<const char *>(p);
    for (int64_t offset = 0; offset < bytes; offset += 64) __builtin_prefetch(c + offset, 0, LEVEL);
}

#if defined(__AVX2__) && defined(__FMA__)
// [sum of h[0], ..., sum of h[7]]: eight horizontal sums at once (a transposing add tree)
inline __m256 sum8(const __m256 *h) {
    const __m256 t0 = _mm256_hadd_ps(h[0], h[1]), t1 = _mm256_hadd_ps(h[2], h[3]);
    const __m256 t2 = _mm256_hadd_ps(h[4], h[5]), t3 = _mm256_hadd_ps(h[6], h[7]);
    const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

inline void store_first(float *out, __m256 x, int64_t m) {  // out[0 .. m-1] = x's first m lanes
    if (m == 8) {
        _mm256_storeu_ps(out, x);
    } else {
        alignas(32) float lanes[8];
        _mm256_store_ps(lanes, x);
        for (int64_t j = 0; j < m; j++) out[j] = lanes[j];
    }
}
#endif

// scores[p] = dot(query [D], keys[p, :]) for p < n, keys fp32 [n, D]: eight keys at a time, each summed in
// its own vector register and the eight reduced together, where the build has AVX-512 or AVX2 and D allows
inline void tile_scores(const float *query, const float *keys, int64_t n, int64_t D, float *scores) {
#if defined(__AVX512F__)
    if (D % 16 == 0) {
        for (int64_t p0 = 0; p0 < n; p0 += 8) {
            const int64_t m = std::min<int64_t>(8, n - p0);
            __m512 acc[8];
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++) acc[j] = _mm512_setzero_ps();
            for (int64_t d = 0; d < D; d += 16) {
                const __m512 qv = _mm512_loadu_ps(query + d);
#pragma GCC unroll 8
                for (int j = 0; j < 8; j++) {  // rows past n repeat the last one (computed, not stored)
                    const float *k = keys + (p0 + std::min<int64_t>(j, m - 1)) * D + d;
                    acc[j] = _mm512_fmadd_ps(qv, _mm512_loadu_ps(k), acc[j]);
                }
            }
            __m256 h[8];
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++) {
                h[j] = _mm256_add_ps(_mm512_castps512_ps256(acc[j]), _mm512_extractf32x8_ps(acc[j], 1));
            }
            store_first(scores + p0, sum8(h), m);
        }
        return;
    }
#endif
#if defined(__AVX2__) && defined(__FMA__)
    if (D % 8 == 0) {
        for (int64_t p0 = 0; p0 < n; p0 += 8) {
            const int64_t m = std::min<int64_t>(8, n - p0);
            __m256 acc[8];
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++) acc[j] = _mm256_setzero_ps();
            for (int64_t d = 0; d < D; d += 8) {
                const __m256 qv = _mm256_loadu_ps(query + d);
#pragma GCC unroll 8
                for (int j = 0; j < 8; j++) {
                    const float *k = keys + (p0 + std::min<int64_t>(j, m - 1)) * D + d;
                    acc[j] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k), acc[j]);
                }
            }
            store_first(scores + p0, sum8(acc), m);
        }
        return;
    }
#endif
    for (int64_t p = 0; p < n; p++) scores[p] = dot(query, keys + p * D, D);
}

#if defined(__AVX512BF16__) && defined(__AVX512VL__)
constexpr bool HAS_BF16_DOT = true;
// scores[p] = scale * dot(q [D], keys[p, :]) for p < n, q and keys bf16 ([n, D], D % 32 == 0), read in place:
// AVX512_BF16's dot product instruction multiplies bf16 pairs exactly and sums them in fp32
inline void tile_scores_bf16(const BFloat16 *q, const BFloat16 *keys, int64_t n, int64_t D, float scale,
                             float *scores) {
    for (int64_t p0 = 0; p0 < n; p0 += 8) {
        const int64_t m = std::min<int64_t>(8, n - p0);
        __m512 acc[8];
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) acc[j] = _mm512_setzero_ps();
        for (int64_t d = 0; d < D; d += 32) {
            const __m512bh qv = (__m512bh)_mm512_loadu_si512(q + d);
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++) {
                const BFloat16 *k = keys + (p0 + std::min<int64_t>(j, m - 1)) * D + d;
                acc[j] = _mm512_dpbf16_ps(acc[j], qv, (__m512bh)_mm512_loadu_si512(k));
            }
        }
        __m256 h[8];
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {
            h[j] = _mm256_add_ps(_mm512_castps512_ps256(acc[j]), _mm512_extractf32x8_ps(acc[j], 1));
        }
        store_first(scores + p0, _mm256_mul_ps(sum8(h), _mm256_set1_ps(scale)), m);
    }
}
#else
constexpr bool HAS_BF16_DOT = false;
inline void tile_scores_bf16(const BFloat16 *, const BFloat16 *, int64_t, int64_t, float, float *) {}
#endif

// acc [D] += sum over p < n of w[p] * values[p, :], W columns at a time held in registers across p (64:
// four AVX-512 accumulators, so four independent multiply-add chains instead of one latency-bound chain)
template <int64_t W>
int64_t accumulate_columns(float *acc, const float *w, const float *values, int64_t n, int64_t D, int64_t d0) {
    for (; d0 + W <= D; d0 += W) {
        float a[W];
#pragma omp simd
        for (int64_t l = 0; l < W; l++) a[l] = acc[d0 + l];
        for (int64_t p = 0; p < n; p++) {
            const float wp = w[p], *vp = values + p * D + d0;
#pragma omp simd
            for (int64_t l = 0; l < W; l++) a[l] += wp * vp[l];
        }
#pragma omp simd
        for (int64_t l = 0; l < W; l++) acc[d0 + l] = a[l];
    }
    return d0;
}

// one vector register of floats, per instruction set, for accumulate_rows
#if defined(__AVX512F__)
using RowVec = __m512;
constexpr int64_t ROW_LANES = 16;
inline RowVec row_load(const float *p) { return _mm512_loadu_ps(p); }
inline void row_store(float *p, RowVec v) { _mm512_storeu_ps(p, v); }
inline RowVec row_set1(float x) { return _mm512_set1_ps(x); }
inline RowVec row_fma(RowVec a, RowVec b, RowVec c) { return _mm512_fmadd_ps(a, b, c); }
#elif defined(__AVX2__) && defined(__FMA__)
using RowVec = __m256;
constexpr int64_t ROW_LANES = 8;
inline RowVec row_load(const float *p) { return _mm256_loadu_ps(p); }
inline void row_store(float *p, RowVec v) { _mm256_storeu_ps(p, v); }
inline RowVec row_set1(float x) { return _mm256_set1_ps(x); }
inline RowVec row_fma(RowVec a, RowVec b, RowVec c) { return _mm256_fmadd_ps(a, b, c); }
#else
constexpr int64_t ROW_LANES = 0;
#endif

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
// acc [CHUNKS * ROW_LANES] += sum over p < n of w[p] * values[p, :] (row stride D), the whole row in registers
template <int CHUNKS>
void accumulate_rows(float *acc, const float *w, const float *values, int64_t n, int64_t D) {
    RowVec a[CHUNKS];
#pragma GCC unroll 16
    for (int c = 0; c < CHUNKS; c++) a[c] = row_load(acc + ROW_LANES * c);
    for (int64_t p = 0; p < n; p++) {
        const RowVec wp = row_set1(w[p]);
#pragma GCC unroll 16
        for (int c = 0; c < CHUNKS; c++) a[c] = row_fma(wp, row_load(values + p * D + ROW_LANES * c), a[c]);
    }
#pragma GCC unroll 16
    for (int c = 0; c < CHUNKS; c++) row_store(acc + ROW_LANES * c, a[c]);
}
#else
template <int CHUNKS>
void accumulate_rows(float *, const float *, const float *, int64_t, int64_t) {}
#endif

inline void accumulate(float *acc, const float *w, const float *values, int64_t n, int64_t D) {
    if (ROW_LANES > 0 && D % std::max<int64_t>(ROW_LANES, 1) == 0) {  // rows of up to 8 vectors: 128 floats
        // on AVX-512, 64 on AVX2
        switch (D / std::max<int64_t>(ROW_LANES, 1)) {
            case 1: return accumulate_rows<1>(acc, w, values, n, D);
            case 2: return accumulate_rows<2>(acc, w, values, n, D);
            case 3: return accumulate_rows<3>(acc, w, values, n, D);
            case 4: return accumulate_rows<4>(acc, w, values, n, D);
            case 5: return accumulate_rows<5>(acc, w, values, n, D);
            case 6: return accumulate_rows<6>(acc, w, values, n, D);
            case 7: return accumulate_rows<7>(acc, w, values, n, D);
            case 8: return accumulate_rows<8>(acc, w, values, n, D);
            default: break;
        }
    }
    int64_t d0 = accumulate_columns<64>(acc, w, values, n, D, 0);
    d0 = accumulate_columns<16>(acc, w, values, n, D, d0);
    for (; d0 < D; d0++) {
        for (int64_t p = 0; p < n; p++) acc[d0] += w[p] * values[p * D + d0];
    }
}

// x [n] as floats: x itself when it holds floats, else converted into buffer
template <typename C>
inline const float *as_floats(const C *x, float *buffer, int64_t n) {
    if constexpr (std::is_same_v<C, float>) {
        return x;
    } else {
#pragma omp simd
        for (int64_t i = 0; i < n; i++) buffer[i] = to_float(x[i]);
        return buffer;
    }
}

// Where a sequence's positions lie in the pool: tiles of up to MAX_TILE consecutive positions within a block
struct Tiles {
    const int64_t *table;
    int64_t len, block_size, tile, pool_base, D;
    // first pool element of the tile starting at position begin, and its size n
    int64_t at(int64_t begin, int64_t &n) const {
        const int64_t offset = begin % block_size;
        n = std::min({tile, len - begin, block_size - offset});
        return ((pool_base + table[begin / block_size]) * block_size + offset) * D;
    }
};

// One (token, KV head) pair: its G query heads against the sequence's keys, a tile (one block, or part of
// one) at a time: each tile of keys, then of values, is converted to fp32 once and used by all G heads
// while it is in cache (fp32 tiles, and bf16 keys on a CPU with AVX512_BF16, are read as they are). Scores
// of the whole context, then an exact softmax (max, exp, sum, divide), then the probability-weighted
// values: the arithmetic of the reference softmax, in fp32. While one tile's keys are scored, the keys
// KEYS_AHEAD tiles on and this tile's values are prefetched; while the values are summed, the first
// next_size keys at next (the pair this thread does next, or null).
template <typename T, typename C>
void attend_one(const T *q, const C *k_cache, const C *v_cache, const Tiles &tiles, T *out, int64_t G, float scale,
                float v_scale, float *scratch, const C *next, int64_t next_size) {
    const int64_t D = tiles.D, len = tiles.len;
    float *query = scratch, *acc = query + G * D, *tile_buffer = acc + G * D, *scores = tile_buffer + MAX_TILE * D;
    constexpr bool bf16_keys = HAS_BF16_DOT && std::is_same_v<T, BFloat16> && std::is_same_v<C, BFloat16>;
    const bool read_in_place = bf16_keys && D % 32 == 0;
    for (int64_t i = 0; i < G * D; i++) {
        query[i] = to_float(q[i]) * scale;
        acc[i] = 0.0f;
    }
    int64_t n = 0, next_n = 0;
    int64_t row = tiles.at(0, n);
    for (int64_t begin = 0; begin < len;) {
        const int64_t next_row = begin + n < len ? tiles.at(begin + n, next_n) : -1;
        // the keys KEYS_AHEAD tiles on (all of them up to there at the first tile), this tile's values
        const int64_t ahead = begin + KEYS_AHEAD * tiles.tile;
        for (int64_t b = begin == 0 ? n : ahead; b <= ahead && b < len; b += tiles.tile) {
            int64_t m;
            const int64_t first = tiles.at(b, m);  // sets m
            prefetch<3>(k_cache + first, m * D * int64_t(sizeof(C)));
        }
        prefetch<2>(v_cache + row, n * D * int64_t(sizeof(C)));
        const C *k = k_cache + row;
        if (read_in_place) {
            if constexpr (bf16_keys) {
                for (int64_t g = 0; g < G; g++) tile_scores_bf16(q + g * D, k, n, D, scale, scores + g * len + begin);
            }
        } else {
            const float *keys = as_floats(k, tile_buffer, n * D);
            for (int64_t g = 0; g < G; g++) tile_scores(query + g * D, keys, n, D, scores + g * len + begin);
        }
        begin += n, row = next_row, n = next_n;
    }
    for (int64_t g = 0; g < G; g++) {
        float *s = scores + g * len, top = -INFINITY, sum = 0.0f;
        for (int64_t p = 0; p < len; p++) top = s[p] > top ? s[p] : top;
#pragma omp simd reduction(+ : sum)
        for (int64_t p = 0; p < len; p++) {
            s[p] = fast_exp(s[p] - top);
            sum += s[p];
        }
#pragma omp simd
        for (int64_t p = 0; p < len; p++) s[p] /= sum;
    }
    if (next) prefetch<3>(next, next_size * D * int64_t(sizeof(C)));
    for (int64_t begin = 0; begin < len; begin += n) {
        const int64_t row = tiles.at(begin, n);  // sets n, read below
        const float *values = as_floats(v_cache + row, tile_buffer, n * D);
        for (int64_t g = 0; g < G; g++) accumulate(acc + g * D, scores + g * len + begin, values, n, D);
    }
    for (int64_t i = 0; i < G * D; i++) store(out[i], acc[i] * v_scale);
}

template <typename T, typename C>
void decode_attention(const T *q, const C *k_cache, const C *v_cache, const int64_t *block_tables,
                      const int64_t *context_lens, T *out, int64_t num_tokens, int64_t num_heads,
                      int64_t num_kv_heads, int64_t head_dim, int64_t num_blocks, int64_t block_size,
                      int64_t max_blocks, int64_t q_stride, float scale, float v_scale) {
    const int64_t G = num_heads / num_kv_heads, D = head_dim;
    const int64_t scratch_size = 2 * G * D + MAX_TILE * D + G * max_blocks * block_size;
    const int64_t pairs = num_tokens * num_kv_heads;
    const int64_t tile = std::min(block_size, MAX_TILE);
    auto tiles_of = [&](int64_t pair) {
        const int64_t t = pair / num_kv_heads, kvh = pair % num_kv_heads;
        return Tiles{block_tables + t * max_blocks, context_lens[t], block_size, tile, kvh * num_blocks, D};
    };
    // (token, KV head) pairs, handed out one at a time (dynamic scheduling: contexts differ in length), each
    // thread claiming its next pair as it starts one, so that it can prefetch that pair's first keys
    std::atomic<int64_t> counter{0};
#pragma omp parallel if (pairs > 1)
    {
        std::vector<float> scratch(scratch_size);  // one per thread, reused by its pairs
        int64_t pair = counter.fetch_add(1, std::memory_order_relaxed);
        while (pair < pairs) {
            const int64_t next = counter.fetch_add(1, std::memory_order_relaxed);
            const Tiles tiles = tiles_of(pair);
            const C *next_keys = nullptr;
            int64_t next_n = 0;
            if (next < pairs) {
                const Tiles next_tiles = tiles_of(next);
                next_keys = next_tiles.len > 0 ? k_cache + next_tiles.at(0, next_n) : nullptr;
            }
            const int64_t t = pair / num_kv_heads, kvh = pair % num_kv_heads;
            attend_one(q + t * q_stride + kvh * G * D, k_cache, v_cache, tiles, out + (t * num_heads + kvh * G) * D,
                       G, scale, v_scale, scratch.data(), next_keys, next_n);
            pair = next;
        }
    }
}

}  // namespace

#define EXPORT(SUFFIX, T, C)                                                                             \
    extern "C" void paged_decode_attention_##SUFFIX(                                                     \
        const T *q, const C *k, const C *v, const int64_t *tables, const int64_t *lens, T *out,           \
        int64_t num_tokens, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, int64_t num_blocks, \
        int64_t block_size, int64_t max_blocks, int64_t q_stride, float scale, float v_scale) {          \
        decode_attention(q, k, v, tables, lens, out, num_tokens, num_heads, num_kv_heads, head_dim,      \
                         num_blocks, block_size, max_blocks, q_stride, scale, v_scale);                  \
    }
FOR_EACH_KV_TYPE(EXPORT)

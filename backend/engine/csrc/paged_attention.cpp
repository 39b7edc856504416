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
//   context_lens  [T]                 int64: keys at positions 0 .. len-1 are attended (the query is at len-1)
//   features      a sliding window (only keys len - W .. len - 1 are read), a soft-cap, sinks
//                 (attention_features.h); all off: plain attention over the whole context
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

#include "attention_features.h"
#include "dtypes.h"
#include "quant_vec.h"

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

// scores[j] = scale * the sum of acc[j]'s lanes for j < m (m <= 8; the other sums are computed, not stored)
inline void store_sums(const __m256 *acc, int64_t m, float scale, float *scores) {
    const __m256 sums = _mm256_mul_ps(sum8(acc), _mm256_set1_ps(scale));
    if (m == 8) {
        _mm256_storeu_ps(scores, sums);
    } else {
        alignas(32) float lanes[8];
        _mm256_store_ps(lanes, sums);
        for (int64_t j = 0; j < m; j++) scores[j] = lanes[j];
    }
}
#endif

#if defined(__AVX512F__)
// the same for 16-lane registers, each one's halves added first
inline void store_sums(const __m512 *acc, int64_t m, float scale, float *scores) {
    __m256 halves[8];
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) {
        halves[j] = _mm256_add_ps(_mm512_castps512_ps256(acc[j]), _mm512_extractf32x8_ps(acc[j], 1));
    }
    store_sums(halves, m, scale, scores);
}
#endif

// What tile_dots multiplies and adds with: STEP elements of the query and of a key per step, loaded as an
// Operand and accumulated into an Acc register. FloatLanes: the build's float vector (quant_vec.h).
struct FloatLanes {
    using Element = float;
    using Operand = Vec;
    using Acc = Vec;
    static constexpr int64_t STEP = VEC_WIDTH;
    static Acc zero() { return vzero(); }
    static Operand load(const float *p) { return vload(p); }
    static Acc step(Acc acc, Operand q, Operand k) { return vfma(q, k, acc); }
};

#if defined(__AVX512F__) && defined(__FMA__)
struct HalfFloatLanes {  // 8 floats on an AVX-512 build: head sizes that are a multiple of 8 but not of 16
    using Element = float;
    using Operand = __m256;
    using Acc = __m256;
    static constexpr int64_t STEP = 8;
    static Acc zero() { return _mm256_setzero_ps(); }
    static Operand load(const float *p) { return _mm256_loadu_ps(p); }
    static Acc step(Acc acc, Operand q, Operand k) { return _mm256_fmadd_ps(q, k, acc); }
};
#endif

#if defined(__AVX512BF16__) && defined(__AVX512VL__)
constexpr bool HAS_BF16_DOT = true;
struct Bf16Pairs {  // AVX512_BF16's dot product: bf16 pairs multiplied exactly and summed in fp32
    using Element = BFloat16;
    using Operand = __m512bh;
    using Acc = __m512;
    static constexpr int64_t STEP = 32;
    static Acc zero() { return _mm512_setzero_ps(); }
    static Operand load(const BFloat16 *p) { return (__m512bh)_mm512_loadu_si512(p); }
    static Acc step(Acc acc, Operand q, Operand k) { return _mm512_dpbf16_ps(acc, q, k); }
};
#else
constexpr bool HAS_BF16_DOT = false;
#endif

// scores[p] = scale * dot(query [D], keys[p, :]) for p < n, keys [n, D] with D % L::STEP == 0, read in place:
// eight keys at a time, each summed in its own register and the eight reduced together
template <typename L>
inline void tile_dots(const typename L::Element *query, const typename L::Element *keys, int64_t n, int64_t D,
                      float scale, float *scores) {
    for (int64_t p0 = 0; p0 < n; p0 += 8) {
        const int64_t m = std::min<int64_t>(8, n - p0);
        typename L::Acc acc[8];
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) acc[j] = L::zero();
        for (int64_t d = 0; d < D; d += L::STEP) {
            const typename L::Operand qv = L::load(query + d);
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++) {  // rows past n repeat the last one (computed, not stored)
                acc[j] = L::step(acc[j], qv, L::load(keys + (p0 + std::min<int64_t>(j, m - 1)) * D + d));
            }
        }
        store_sums(acc, m, scale, scores + p0);
    }
}

// scores[p] = dot(query [D], keys[p, :]) for p < n, keys fp32 [n, D]: tile_dots where the build has vectors
// and D allows, else one key at a time
inline void tile_scores(const float *query, const float *keys, int64_t n, int64_t D, float *scores) {
    if constexpr (VEC_WIDTH > 1) {
        if (D % VEC_WIDTH == 0) return tile_dots<FloatLanes>(query, keys, n, D, 1.0f, scores);
    }
#if defined(__AVX512F__) && defined(__FMA__)
    if (D % 8 == 0) return tile_dots<HalfFloatLanes>(query, keys, n, D, 1.0f, scores);
#endif
    for (int64_t p = 0; p < n; p++) scores[p] = dot(query, keys + p * D, D);
}

#if defined(__AVX512BF16__) && defined(__AVX512VL__)
// scores[p] = scale * dot(q [D], keys[p, :]) for p < n, q and keys bf16 ([n, D], D % 32 == 0), read in place
inline void tile_scores_bf16(const BFloat16 *q, const BFloat16 *keys, int64_t n, int64_t D, float scale,
                             float *scores) {
    tile_dots<Bf16Pairs>(q, keys, n, D, scale, scores);
}
#else
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

// acc [CHUNKS * VEC_WIDTH] += sum over p < n of w[p] * values[p, :] (row stride D), the whole row in registers
template <int CHUNKS>
void accumulate_rows(float *acc, const float *w, const float *values, int64_t n, int64_t D) {
    Vec a[CHUNKS];
#pragma GCC unroll 16
    for (int c = 0; c < CHUNKS; c++) a[c] = vload(acc + VEC_WIDTH * c);
    for (int64_t p = 0; p < n; p++) {
        const Vec wp = vset(w[p]);
#pragma GCC unroll 16
        for (int c = 0; c < CHUNKS; c++) a[c] = vfma(wp, vload(values + p * D + VEC_WIDTH * c), a[c]);
    }
#pragma GCC unroll 16
    for (int c = 0; c < CHUNKS; c++) vstore(acc + VEC_WIDTH * c, a[c]);
}

inline void accumulate(float *acc, const float *w, const float *values, int64_t n, int64_t D) {
    // rows of up to 8 vectors (128 floats on AVX-512, 64 on AVX2) in registers
    if (VEC_WIDTH > 1 && D % VEC_WIDTH == 0 && D <= 8 * VEC_WIDTH) {
        return with_rows<8>(D / VEC_WIDTH, [&](auto chunks) {
            accumulate_rows<decltype(chunks)::value>(acc, w, values, n, D);
        });
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

// Where a sequence's positions lie in the pool: tiles of up to MAX_TILE consecutive positions within a block,
// from position start (0, or where a sliding window begins) to len - 1
struct Tiles {
    const int64_t *table;
    int64_t len, block_size, tile, pool_base, D, start;
    // first pool element of the tile starting at position begin, and its size n
    int64_t at(int64_t begin, int64_t &n) const {
        const int64_t offset = begin % block_size;
        n = std::min({tile, len - begin, block_size - offset});
        return ((pool_base + table[begin / block_size]) * block_size + offset) * D;
    }
};

// The softmax of one head's scores s [n] in place (max, exp, sum, divide), a sink logit (or -infinity)
// joining the max and the denominator
inline void softmax(float *s, int64_t n, float sink) {
    float top = sink, sum = 0.0f;
    for (int64_t p = 0; p < n; p++) top = s[p] > top ? s[p] : top;
#pragma omp simd reduction(+ : sum)
    for (int64_t p = 0; p < n; p++) {
        s[p] = fast_exp(s[p] - top);
        sum += s[p];
    }
    if (sink != -INFINITY) sum += fast_exp(sink - top);
#pragma omp simd
    for (int64_t p = 0; p < n; p++) s[p] /= sum;
}

// One (token, KV head) pair: its G query heads (the first one is head h0) against the sequence's keys from
// tiles.start, a tile (one block, or part of one) at a time: each tile of keys, then of values, is converted
// to fp32 once and used by all G heads while it is in cache (fp32 tiles, and bf16 keys on a CPU with
// AVX512_BF16, are read as they are). Scores of the whole context (soft-capped where asked), then an exact
// softmax (max, exp, sum, divide), then the probability-weighted values: the arithmetic of the reference
// softmax, in fp32. While one tile's keys are scored, the keys KEYS_AHEAD tiles on and this tile's values are
// prefetched; while the values are summed, the first next_size keys at next (the pair this thread does next,
// or null).
template <typename T, typename C>
void attend_one(const T *q, const C *k_cache, const C *v_cache, const Tiles &tiles, T *out, int64_t G, int64_t h0,
                float scale, float v_scale, const Features &features, float *scratch, const C *next,
                int64_t next_size) {
    const int64_t D = tiles.D, len = tiles.len - tiles.start;  // scores [G, len], position start + p at p
    float *query = scratch, *acc = query + G * D, *tile_buffer = acc + G * D, *scores = tile_buffer + MAX_TILE * D;
    constexpr bool bf16_keys = HAS_BF16_DOT && std::is_same_v<T, BFloat16> && std::is_same_v<C, BFloat16>;
    const bool read_in_place = bf16_keys && D % 32 == 0;
    for (int64_t i = 0; i < G * D; i++) {
        query[i] = to_float(q[i]) * scale;
        acc[i] = 0.0f;
    }
    const int64_t start = tiles.start, end = tiles.len;  // positions start .. end - 1
    int64_t n = 0, next_n = 0;
    int64_t row = tiles.at(start, n);
    for (int64_t begin = start; begin < end;) {
        const int64_t next_row = begin + n < end ? tiles.at(begin + n, next_n) : -1;
        // the keys KEYS_AHEAD tiles on (all of them up to there at the first tile), this tile's values
        const int64_t ahead = begin + KEYS_AHEAD * tiles.tile;
        for (int64_t b = begin == start ? begin + n : ahead; b <= ahead && b < end; b += tiles.tile) {
            int64_t m;
            const int64_t first = tiles.at(b, m);  // sets m
            prefetch<3>(k_cache + first, m * D * int64_t(sizeof(C)));
        }
        prefetch<2>(v_cache + row, n * D * int64_t(sizeof(C)));
        const C *k = k_cache + row;
        float *s = scores + (begin - start);
        if (read_in_place) {
            if constexpr (bf16_keys) {
                for (int64_t g = 0; g < G; g++) tile_scores_bf16(q + g * D, k, n, D, scale, s + g * len);
            }
        } else {
            const float *keys = as_floats(k, tile_buffer, n * D);
            for (int64_t g = 0; g < G; g++) tile_scores(query + g * D, keys, n, D, s + g * len);
        }
        begin += n, row = next_row, n = next_n;
    }
    for (int64_t g = 0; g < G; g++) {
        if (features.soft_cap > 0.0f) apply_soft_cap(scores + g * len, len, features.soft_cap);
        softmax(scores + g * len, len, features.sinks ? features.sinks[h0 + g] : -INFINITY);
    }
    if (next) prefetch<3>(next, next_size * D * int64_t(sizeof(C)));
    for (int64_t begin = start; begin < end; begin += n) {
        const int64_t row = tiles.at(begin, n);  // sets n, read below
        const float *values = as_floats(v_cache + row, tile_buffer, n * D);
        for (int64_t g = 0; g < G; g++) accumulate(acc + g * D, scores + g * len + (begin - start), values, n, D);
    }
    for (int64_t i = 0; i < G * D; i++) store(out[i], acc[i] * v_scale);
}

template <typename T, typename C>
void decode_attention(const T *q, const C *k_cache, const C *v_cache, const int64_t *block_tables,
                      const int64_t *context_lens, T *out, int64_t num_tokens, int64_t num_heads,
                      int64_t num_kv_heads, int64_t head_dim, int64_t num_blocks, int64_t block_size,
                      int64_t max_blocks, int64_t q_stride, float scale, float v_scale, const Features &features) {
    const int64_t G = num_heads / num_kv_heads, D = head_dim;
    // scores sized by the longest context (or window), not by the tables' width (a captured decode step's
    // tables are max_model_len wide: their scratch would be zeroed for nothing, every layer)
    int64_t longest = 0;
    for (int64_t t = 0; t < num_tokens; t++) longest = std::max(longest, context_lens[t]);
    if (features.window > 0) longest = std::min(longest, features.window);
    const int64_t scratch_size = 2 * G * D + MAX_TILE * D + G * longest;
    const int64_t pairs = num_tokens * num_kv_heads;
    const int64_t tile = std::min(block_size, MAX_TILE);
    auto tiles_of = [&](int64_t pair) {
        const int64_t t = pair / num_kv_heads, kvh = pair % num_kv_heads;
        const int64_t len = context_lens[t], start = window_start(len - 1, features.window);
        return Tiles{block_tables + t * max_blocks, len, block_size, tile, kvh * num_blocks, D, start};
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
                next_keys = next_tiles.len > 0 ? k_cache + next_tiles.at(next_tiles.start, next_n) : nullptr;
            }
            const int64_t t = pair / num_kv_heads, kvh = pair % num_kv_heads;
            attend_one(q + t * q_stride + kvh * G * D, k_cache, v_cache, tiles, out + (t * num_heads + kvh * G) * D,
                       G, kvh * G, scale, v_scale, features, scratch.data(), next_keys, next_n);
            pair = next;
        }
    }
}

}  // namespace

// window (0: none), soft_cap (0: none) and sinks (null: none) as in attention_features.h
#define EXPORT(SUFFIX, T, C)                                                                              \
    extern "C" void paged_decode_attention_##SUFFIX(                                                      \
        const T *q, const C *k, const C *v, const int64_t *tables, const int64_t *lens, T *out,            \
        const float *sinks, int64_t num_tokens, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,  \
        int64_t num_blocks, int64_t block_size, int64_t max_blocks, int64_t q_stride, int64_t window,       \
        float scale, float v_scale, float soft_cap) {                                                     \
        decode_attention(q, k, v, tables, lens, out, num_tokens, num_heads, num_kv_heads, head_dim,       \
                         num_blocks, block_size, max_blocks, q_stride, scale, v_scale,                    \
                         Features{window, soft_cap, sinks});                                              \
    }
FOR_EACH_KV_TYPE(EXPORT)

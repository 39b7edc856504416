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
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "dtypes.h"

namespace {

constexpr int64_t MAX_TILE = 64;  // positions per tile: a block, or a part of one

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

inline void accumulate(float *acc, const float *w, const float *values, int64_t n, int64_t D) {
    int64_t d0 = accumulate_columns<64>(acc, w, values, n, D, 0);
    d0 = accumulate_columns<16>(acc, w, values, n, D, d0);
    for (; d0 < D; d0++) {
        for (int64_t p = 0; p < n; p++) acc[d0] += w[p] * values[p * D + d0];
    }
}

// One (token, KV head) pair: its G query heads against the sequence's keys, a tile (one block, or part of
// one) at a time: each tile of keys, then of values, is converted to fp32 once and used by all G heads
// while it is in cache. Scores of the whole context, then an exact softmax (max, exp, sum, divide), then
// the probability-weighted values: the arithmetic of the reference softmax, in fp32.
template <typename T, typename C>
void attend_one(const T *q, const C *k_cache, const C *v_cache, const int64_t *table, int64_t len, T *out,
                int64_t G, int64_t D, int64_t pool_base, int64_t block_size, float scale, float v_scale,
                float *scratch) {
    float *query = scratch, *acc = query + G * D, *tile_buffer = acc + G * D, *scores = tile_buffer + MAX_TILE * D;
    for (int64_t i = 0; i < G * D; i++) {
        query[i] = to_float(q[i]) * scale;
        acc[i] = 0.0f;
    }
    const int64_t tile = block_size < MAX_TILE ? block_size : MAX_TILE;
    auto tile_rows = [&](int64_t begin, int64_t &n) {  // first pool row of the tile at begin, and its size
        const int64_t offset = begin % block_size;
        n = std::min({tile, len - begin, block_size - offset});
        return ((pool_base + table[begin / block_size]) * block_size + offset) * D;
    };
    for (int64_t begin = 0, n = 0; begin < len; begin += n) {
        const C *k = k_cache + tile_rows(begin, n);
#pragma omp simd
        for (int64_t i = 0; i < n * D; i++) tile_buffer[i] = to_float(k[i]);
        for (int64_t g = 0; g < G; g++) {
            for (int64_t p = 0; p < n; p++) scores[g * len + begin + p] = dot(query + g * D, tile_buffer + p * D, D);
        }
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
    for (int64_t begin = 0, n = 0; begin < len; begin += n) {
        const C *v = v_cache + tile_rows(begin, n);
#pragma omp simd
        for (int64_t i = 0; i < n * D; i++) tile_buffer[i] = to_float(v[i]);
        for (int64_t g = 0; g < G; g++) accumulate(acc + g * D, scores + g * len + begin, tile_buffer, n, D);
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
#pragma omp parallel
    {
        std::vector<float> scratch(scratch_size);  // one per thread, reused by its pairs
#pragma omp for collapse(2) schedule(dynamic)
        for (int64_t t = 0; t < num_tokens; t++) {
            for (int64_t kvh = 0; kvh < num_kv_heads; kvh++) {
                attend_one(q + t * q_stride + kvh * G * D, k_cache, v_cache, block_tables + t * max_blocks,
                           context_lens[t], out + (t * num_heads + kvh * G) * D, G, D, kvh * num_blocks,
                           block_size, scale, v_scale, scratch.data());
            }
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

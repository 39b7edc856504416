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
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "dtypes.h"

namespace {

template <typename T, typename C>
void decode_attention(const T *q, const C *k_cache, const C *v_cache, const int64_t *block_tables,
                      const int64_t *context_lens, T *out, int64_t num_tokens, int64_t num_heads,
                      int64_t num_kv_heads, int64_t head_dim, int64_t num_blocks, int64_t block_size,
                      int64_t max_blocks, int64_t q_stride, float scale, float v_scale) {
    const int64_t G = num_heads / num_kv_heads, D = head_dim;
#pragma omp parallel for collapse(2) schedule(dynamic)
    for (int64_t t = 0; t < num_tokens; t++) {
        for (int64_t kvh = 0; kvh < num_kv_heads; kvh++) {
            const int64_t len = context_lens[t];
            const int64_t *table = block_tables + t * max_blocks;
            const int64_t head_offset = (t * num_heads + kvh * G) * D;  // of query head kvh * G in out
            std::vector<float> query(G * D), acc(G * D, 0.0f), scores(G * len);
            for (int64_t i = 0; i < G * D; i++) query[i] = to_float(q[t * q_stride + kvh * G * D + i]) * scale;
            auto row_of = [&](int64_t pos) {  // row of the pool holding position pos of this sequence
                return ((kvh * num_blocks + table[pos / block_size]) * block_size + pos % block_size) * D;
            };
            for (int64_t pos = 0; pos < len; pos++) {
                const C *key = k_cache + row_of(pos);
                for (int64_t g = 0; g < G; g++) {
                    const float *qg = query.data() + g * D;
                    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
                    for (int64_t d = 0; d < D; d++) dot += qg[d] * to_float(key[d]);
                    scores[g * len + pos] = dot;
                }
            }
            for (int64_t g = 0; g < G; g++) {
                float *s = scores.data() + g * len, top = -INFINITY, sum = 0.0f;
                for (int64_t pos = 0; pos < len; pos++) top = std::fmax(top, s[pos]);
                for (int64_t pos = 0; pos < len; pos++) {
                    s[pos] = std::exp(s[pos] - top);
                    sum += s[pos];
                }
                for (int64_t pos = 0; pos < len; pos++) s[pos] /= sum;
            }
            for (int64_t pos = 0; pos < len; pos++) {
                const C *value = v_cache + row_of(pos);
                for (int64_t g = 0; g < G; g++) {
                    const float p = scores[g * len + pos];
                    float *a = acc.data() + g * D;
#pragma omp simd
                    for (int64_t d = 0; d < D; d++) a[d] += p * to_float(value[d]);
                }
            }
            for (int64_t i = 0; i < G * D; i++) store(out[head_offset + i], acc[i] * v_scale);
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

// Paged prefill attention for the CPU: every prefill chunk of a step in one call, each query attending
// causally to its sequence's keys, read from the block pool through the sequence's block table (its cached
// prefix and the chunk's own keys, which the cache write stored before): nothing gathered, no mask built.
//
// Layout (as in backend/engine/attention.py):
//   q                [T, H, D]          token stride q_stride (a view into the fused qkv rows)
//   out              [T, H, D]          contiguous; the chunks' rows are written
//   k/v cache        [KVH, NB, BS, D]   as in paged_attention.cpp (fp8: k_scale folded into scale, v_scale
//                                       applied to the output)
//   query_start_loc  [S + 1]            int64: chunk s's queries are rows query_start_loc[s] .. [s + 1] - 1
//   seq_lens         [S]                int64: chunk s attends to keys 0 .. seq_len - 1; its queries are the
//                                       last positions (the first is at seq_len - n, after the cached prefix)
//   block_tables     [S, max_blocks]    int64 block ids of each chunk's sequence
//
// Two phases in one OpenMP region. First the keys and values of each (chunk, KV head) are packed, a tile
// of KEY_TILE positions at a time, into the layout the products below read, converted from the pool's
// type once rather than once per query tile. Then work items (chunk, KV head, tile of query tokens) are
// handed out largest first through a shared counter; each puts its G * QT query rows (the G heads of a
// GQA group, token by token) against the key tiles up to its last position, flash-attention style:
// scores, an online softmax in fp32 (a running max and sum per row, earlier sums rescaled), then the
// probabilities times the values added to an fp32 accumulator. Rows and columns wholly past a row's
// causal limit are skipped, so the diagonal tiles cost about half a full one.
// With AVX512_BF16 and bf16 activations both products take VDPBF16PS on bf16 operands with fp32 sums (the
// probabilities rounded to bf16 for the second, as torch's CPU flash attention does); otherwise fp32
// multiply-adds on the quant_vec.h vector (AVX-512, AVX2 or plain C++). Built by cpu_kernels.py.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "dtypes.h"
#include "quant_vec.h"

namespace {

constexpr int64_t KEY_TILE = 64;  // keys per tile: a multiple of 16, the products' column unit
constexpr int64_t TARGET_ROWS = 96;  // query rows (tokens x G heads) a work item aims at
constexpr int MAX_R = 6;  // rows of a register tile
constexpr int64_t COLUMN_UNIT = 16;  // padded head size and key counts are multiples of this
constexpr int64_t LANES = 16;  // a row's running sum is kept in LANES partial sums (added at the end)

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
// interleaved two rows at a time (vector permutes, not 16-bit moves)
inline void pack_tile_bf16(const BFloat16 *k_cache, const BFloat16 *v_cache, const int64_t *table, int64_t kvh,
                           int64_t p0, int64_t n, const Shape &s, BFloat16 *keys, BFloat16 *values) {
    const int64_t D = s.head_dim, pairs = D / 2;
    for (int64_t j0 = 0; j0 < KEY_TILE; j0 += 16) {
        const BFloat16 *rows[16];
        for (int j = 0; j < 16; j++) rows[j] = j0 + j < n ? k_cache + pool_row(table, kvh, p0 + j0 + j, s) : nullptr;
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
        const BFloat16 *a = j < n ? v_cache + pool_row(table, kvh, p0 + j, s) : nullptr;
        const BFloat16 *b = j + 1 < n ? v_cache + pool_row(table, kvh, p0 + j + 1, s) : nullptr;
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
// values as B of the output product ([KEY_TILE][padded_dim]); positions past len and columns past D are 0
template <typename PT, typename C>
void pack_tile(const C *k_cache, const C *v_cache, const int64_t *table, int64_t kvh, int64_t p0, int64_t len,
               const Shape &s, PT *keys, PT *values) {
    const int64_t D = s.head_dim, Dp = s.padded_dim, n = std::min(KEY_TILE, len - p0);
#if defined(__AVX512BF16__) && defined(__AVX512VL__)
    if constexpr (std::is_same_v<PT, BFloat16> && std::is_same_v<C, BFloat16>) {
        if (D % 32 == 0) return pack_tile_bf16(k_cache, v_cache, table, kvh, p0, n, s, keys, values);
    }
#endif
    if (n < KEY_TILE || D < Dp) {
        std::fill(keys, keys + KEY_TILE * Dp, PT{});
        std::fill(values, values + KEY_TILE * Dp, PT{});
    }
    for (int64_t j = 0; j < n; j++) {
        const C *k = k_cache + pool_row(table, kvh, p0 + j, s), *v = v_cache + pool_row(table, kvh, p0 + j, s);
        for (int64_t d = 0; d < D; d++) store(keys[b_index<PT>(d, j, KEY_TILE)], to_float(k[d]));
        for (int64_t d = 0; d < D; d++) store(values[b_index<PT>(j, d, Dp)], to_float(v[d]));
    }
}

struct Item {
    int64_t seq, kvh, first, count;  // query tokens first .. first + count - 1 of the chunk
    int64_t cost;
};

// Per-thread buffers of one work item
template <typename PT>
struct Scratch {
    std::vector<PT> query, probs;
    std::vector<float> scores, acc, top, sum;  // sum: LANES partial sums a row
    std::vector<int64_t> limit;
    Scratch(int64_t rows, int64_t Dp)
        : query(rows * Dp), probs(rows * KEY_TILE), scores(rows * KEY_TILE), acc(rows * Dp), top(rows), sum(rows * LANES),
          limit(rows) {}
};

// The largest of x[0 .. LANES - 1], by halving (no serial chain of LANES comparisons)
inline float lanes_max(const float *x) {
#if defined(__AVX512F__)
    return _mm512_reduce_max_ps(_mm512_loadu_ps(x));
#else
    float y[LANES];
    std::copy(x, x + LANES, y);
    for (int width = int(LANES) / 2; width > 0; width /= 2) {
        for (int l = 0; l < width; l++) y[l] = y[l + width] > y[l] ? y[l + width] : y[l];
    }
    return y[0];
#endif
}

// probs [LANES] = p [LANES] in the products' type, their values as stored added to sum [LANES]
template <typename PT>
inline void to_operand(const float *p, PT *probs, float *sum) {
#if defined(__AVX512BF16__) && defined(__AVX512VL__)
    if constexpr (std::is_same_v<PT, BFloat16>) {  // one rounding instruction (nearest even)
        const __m256i rounded = (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(p));
        _mm256_storeu_si256(reinterpret_cast<__m256i *>(probs), rounded);
        const __m512 back = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(rounded), 16));
        _mm512_storeu_ps(sum, _mm512_add_ps(_mm512_loadu_ps(sum), back));
        return;
    }
#endif
#pragma omp simd
    for (int l = 0; l < int(LANES); l++) {
        store(probs[l], p[l]);
        sum[l] += to_float(probs[l]);  // the probabilities as the product reads them (bf16: rounded)
    }
}

// One row's online-softmax step over a key tile: scores of its first limit keys (scaled) folded into its
// running max and LANES partial sums, probabilities (0 from limit to width, the columns its row block
// computed) into probs, its accumulator rescaled where the max grew. scores is overwritten. Loops of LANES
// with selects, not branches, and int indices (64-bit compares would halve the vector width): they vectorize.
template <typename PT>
void softmax_row(float *scores, int limit, int width, float scale, float &top, float *sum, PT *probs, float *acc,
                 int64_t Dp) {
    float tops[LANES];
    std::fill(tops, tops + LANES, -INFINITY);
    for (int j0 = 0; j0 < width; j0 += int(LANES)) {
#pragma omp simd
        for (int l = 0; l < int(LANES); l++) {
            const float x = j0 + l < limit ? scores[j0 + l] : -INFINITY;
            tops[l] = x > tops[l] ? x : tops[l];
        }
    }
    const float tile_top = lanes_max(tops);
    const float new_top = std::max(top, tile_top * scale);  // scale > 0
    const float alpha = new_top == top ? 1.0f : top == -INFINITY ? 0.0f : fast_exp(top - new_top);
    top = new_top;
    if (alpha != 1.0f) {
#pragma omp simd
        for (int l = 0; l < int(LANES); l++) sum[l] *= alpha;
#pragma omp simd
        for (int64_t d = 0; d < Dp; d++) acc[d] *= alpha;
    }
    for (int j0 = 0; j0 < width; j0 += int(LANES)) {
#pragma omp simd
        for (int l = 0; l < int(LANES); l++) {
            const float e = fast_exp(scores[j0 + l] * scale - new_top);
            scores[j0 + l] = j0 + l < limit ? e : 0.0f;
        }
        to_operand(scores + j0, probs + j0, sum);
    }
}

struct Problem {
    const int64_t *block_tables, *query_start_loc, *seq_lens;
    int64_t num_seqs, q_stride;
    float scale, v_scale;
    Shape shape;
};

// One work item: query tokens first .. first + count - 1 of a chunk, the G heads of KV head kvh, against the
// chunk's packed key tiles (keys, values: its first tile for this head; tiles kv_stride elements apart)
template <typename T, typename PT>
void attend_item(const T *q, T *out, const Problem &pb, const Item &item, const PT *keys, const PT *values,
                 int64_t kv_stride, Scratch<PT> &s) {
    const Shape &sh = pb.shape;
    const int64_t G = sh.num_heads / sh.num_kv_heads, D = sh.head_dim, Dp = sh.padded_dim;
    const int64_t rows = item.count * G, start = pb.query_start_loc[item.seq];
    const int64_t len = pb.seq_lens[item.seq], n = pb.query_start_loc[item.seq + 1] - start;
    const int64_t first_pos = len - n + item.first;  // position of the item's first query token
    for (int64_t r = 0; r < rows; r++) {  // row r: token r / G, head kvh * G + r % G
        const T *src = q + (start + item.first + r / G) * pb.q_stride + (item.kvh * G + r % G) * D;
        if constexpr (std::is_same_v<T, PT>) {
            std::memcpy(&s.query[r * Dp], src, D * sizeof(T));
            std::fill(&s.query[r * Dp + D], &s.query[(r + 1) * Dp], PT{});
        } else {
            for (int64_t d = 0; d < Dp; d++) store(s.query[r * Dp + d], d < D ? to_float(src[d]) : 0.0f);
        }
        s.top[r] = -INFINITY;
        std::fill(&s.sum[r * LANES], &s.sum[(r + 1) * LANES], 0.0f);
        std::fill(&s.acc[r * Dp], &s.acc[r * Dp] + Dp, 0.0f);
    }
    const int64_t last_pos = first_pos + item.count - 1;
    for (int64_t p0 = 0; p0 <= last_pos; p0 += KEY_TILE) {
        const PT *k = keys + (p0 / KEY_TILE) * kv_stride, *v = values + (p0 / KEY_TILE) * kv_stride;
        const int64_t begin = std::max<int64_t>(0, p0 - first_pos) * G;  // rows before see no key of this tile
        for (int64_t r = begin; r < rows; r++) s.limit[r] = std::min(KEY_TILE, first_pos + r / G - p0 + 1);
        for (int64_t m0 = begin; m0 < rows; m0 += MAX_R) {
            const int64_t block = std::min<int64_t>(MAX_R, rows - m0), widest = s.limit[m0 + block - 1];
            const int64_t width = round_up(widest, COLUMN_UNIT);  // the key columns this block computes
            product(&s.query[m0 * Dp], Dp, k, KEY_TILE, &s.scores[m0 * KEY_TILE], KEY_TILE, block, width, Dp, false);
            for (int64_t r = m0; r < m0 + block; r++) {
                softmax_row(&s.scores[r * KEY_TILE], int(s.limit[r]), int(width), pb.scale, s.top[r],
                            &s.sum[r * LANES], &s.probs[r * KEY_TILE], &s.acc[r * Dp], Dp);
            }
            product(&s.probs[m0 * KEY_TILE], KEY_TILE, v, Dp, &s.acc[m0 * Dp], Dp, block, Dp, round_up(widest, 2),
                    true);
        }
    }
    for (int64_t r = 0; r < rows; r++) {
        T *dst = out + ((start + item.first + r / G) * sh.num_heads + item.kvh * G + r % G) * D;
        float total = 0.0f;
        for (int64_t l = 0; l < LANES; l++) total += s.sum[r * LANES + l];
        const float factor = pb.v_scale / total;
        for (int64_t d = 0; d < D; d++) store(dst[d], s.acc[r * Dp + d] * factor);
    }
}

// Asks for an item's query rows to be brought into the cache (strided rows: the hardware prefetchers miss
// them) ahead of attend_item, which reads them first
template <typename T>
void prefetch_queries(const T *q, const Problem &pb, const Item &item) {
    const Shape &sh = pb.shape;
    const int64_t G = sh.num_heads / sh.num_kv_heads, bytes = G * sh.head_dim * int64_t(sizeof(T));
    for (int64_t t = 0; t < item.count; t++) {
        const char *row = reinterpret_cast<const char *>(
            q + (pb.query_start_loc[item.seq] + item.first + t) * pb.q_stride + item.kvh * G * sh.head_dim);
        for (int64_t offset = 0; offset < bytes; offset += 64) __builtin_prefetch(row + offset, 0, 3);
    }
}

// The work items, largest first (a query tile's cost grows with its last position: causal tiles differ)
std::vector<Item> work_items(const Problem &pb, int64_t tokens_per_item) {
    std::vector<Item> items;
    for (int64_t seq = 0; seq < pb.num_seqs; seq++) {
        const int64_t n = pb.query_start_loc[seq + 1] - pb.query_start_loc[seq], cached = pb.seq_lens[seq] - n;
        for (int64_t first = 0; first < n; first += tokens_per_item) {
            const int64_t count = std::min(tokens_per_item, n - first);
            for (int64_t kvh = 0; kvh < pb.shape.num_kv_heads; kvh++) {
                items.push_back({seq, kvh, first, count, count * (cached + first + count / 2 + 1)});
            }
        }
    }
    std::stable_sort(items.begin(), items.end(), [](const Item &a, const Item &b) { return a.cost > b.cost; });
    return items;
}

template <typename T, typename C>
void prefill_attention(const T *q, const C *k_cache, const C *v_cache, T *out, const Problem &pb) {
    using PT = Operand<T>;
    const Shape &sh = pb.shape;
    const int64_t G = sh.num_heads / sh.num_kv_heads, tile_size = KEY_TILE * sh.padded_dim;
    std::vector<int64_t> first_tile(pb.num_seqs + 1, 0);  // chunk s's key tiles: first_tile[s] ..
    for (int64_t seq = 0; seq < pb.num_seqs; seq++) {
        first_tile[seq + 1] = first_tile[seq] + (pb.seq_lens[seq] + KEY_TILE - 1) / KEY_TILE;
    }
    const int64_t num_tiles = first_tile[pb.num_seqs] * sh.num_kv_heads;  // (tile, KV head) pairs
    static thread_local std::vector<PT> packed;  // grows to the largest step; kept for the next layer's call
    packed.resize(std::max<size_t>(packed.size(), size_t(2 * num_tiles * tile_size)));
    PT *keys = packed.data(), *values = keys + num_tiles * tile_size;  // tile i of chunk s, head h at
    // ((first_tile[s] + i) * KVH + h) * tile_size
    const std::vector<Item> items = work_items(pb, std::max<int64_t>(1, TARGET_ROWS / G));
    int64_t total = 0;
    for (const Item &item : items) total += item.cost;
    std::atomic<int64_t> counter{0};
#pragma omp parallel if (total * G * sh.head_dim > (1 << 20))
    {
#pragma omp for schedule(static)
        for (int64_t i = 0; i < num_tiles; i++) {
            const int64_t tile = i / sh.num_kv_heads, kvh = i % sh.num_kv_heads;
            const int64_t seq = std::upper_bound(first_tile.begin(), first_tile.end(), tile) - first_tile.begin() - 1;
            pack_tile(k_cache, v_cache, pb.block_tables + seq * sh.max_blocks, kvh, (tile - first_tile[seq]) * KEY_TILE,
                      pb.seq_lens[seq], sh, keys + i * tile_size, values + i * tile_size);
        }  // (an implied barrier: every tile is packed before any is read)
        Scratch<PT> scratch(std::max<int64_t>(1, TARGET_ROWS / G) * G, sh.padded_dim);
        const int64_t num_items = int64_t(items.size());
        for (int64_t i = counter.fetch_add(1); i < num_items;) {  // each thread claims its next item ahead,
            const int64_t next = counter.fetch_add(1);  // so that the item's queries are fetched meanwhile
            if (next < num_items) prefetch_queries(q, pb, items[next]);
            const Item &item = items[i];
            const int64_t offset = (first_tile[item.seq] * sh.num_kv_heads + item.kvh) * tile_size;
            attend_item(q, out, pb, item, keys + offset, values + offset, sh.num_kv_heads * tile_size, scratch);
            i = next;
        }
    }
}

}  // namespace

// Whether the products take VDPBF16PS for bf16 activations in this build (for reports and tests)
extern "C" int prefill_attention_bf16_dot() { return HAS_BF16_DOT ? 1 : 0; }

#define EXPORT(SUFFIX, T, C)                                                                                     \
    extern "C" void paged_prefill_attention_##SUFFIX(                                                            \
        const T *q, const C *k, const C *v, const int64_t *tables, const int64_t *query_start_loc,                \
        const int64_t *seq_lens, T *out, int64_t num_seqs, int64_t num_heads, int64_t num_kv_heads,               \
        int64_t head_dim, int64_t num_blocks, int64_t block_size, int64_t max_blocks, int64_t q_stride,          \
        float scale, float v_scale) {                                                                            \
        const Shape shape{num_heads, num_kv_heads, head_dim, round_up(head_dim, COLUMN_UNIT), num_blocks,         \
                          block_size, max_blocks};                                                               \
        const Problem problem{tables, query_start_loc, seq_lens, num_seqs, q_stride, scale, v_scale, shape};    \
        prefill_attention(q, k, v, out, problem);                                                                \
    }
FOR_EACH_KV_TYPE(EXPORT)

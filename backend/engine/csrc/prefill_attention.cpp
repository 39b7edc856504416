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
//   features         a sliding window, a soft-cap, sinks (attention_features.h); all off: plain causal
//
// Two phases in one OpenMP region. First the keys and values of each (chunk, KV head) are packed, a tile
// of KEY_TILE positions at a time, into the layout the products read (prefill_tiles.h), converted from the
// pool's type once rather than once per query tile. Then work items (chunk, KV head, tile of query tokens) are
// handed out largest first through a shared counter; each puts its G * QT query rows (the G heads of a
// GQA group, token by token) against the key tiles up to its last position, flash-attention style:
// scores, an online softmax in fp32 (a running max and sum per row, earlier sums rescaled), then the
// probabilities times the values added to an fp32 accumulator. Rows and columns wholly past a row's
// causal limit are skipped, so the diagonal tiles cost about half a full one. With a sliding window, key
// tiles wholly before a row block's window are neither packed nor read (a windowed layer's cost follows
// its window), and the edge tile masks the columns before each row's window.
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

#include "attention_features.h"
#include "dtypes.h"
#include "prefill_tiles.h"

namespace {

constexpr int64_t TARGET_ROWS = 96;  // query rows (tokens x G heads) a work item aims at
constexpr int64_t LANES = 16;  // a row's running sum is kept in LANES partial sums (added at the end)

using namespace prefill;  // the tiles (prefill_tiles.h)

struct Item {
    int64_t seq, kvh, first, count;  // query tokens first .. first + count - 1 of the chunk
    int64_t cost;
};

// Per-thread buffers of one work item
template <typename PT>
struct Scratch {
    std::vector<PT> query, probs;
    std::vector<float> scores, acc, top, sum;  // sum: LANES partial sums a row
    std::vector<int64_t> limit, lower;  // a row's key columns in the current tile: lower .. limit - 1
    Scratch(int64_t rows, int64_t Dp)
        : query(rows * Dp), probs(rows * KEY_TILE), scores(rows * KEY_TILE), acc(rows * Dp), top(rows), sum(rows * LANES),
          limit(rows), lower(rows) {}
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

// One row's online-softmax step over a key tile: scores of its keys lower .. limit - 1 (scaled) folded into its
// running max and LANES partial sums, probabilities (0 elsewhere up to width, the columns its row block
// computed) into probs, its accumulator rescaled where the max grew. scores is overwritten. Loops of LANES
// with selects, not branches, and int indices (64-bit compares would halve the vector width): they vectorize.
// LOWER: whether lower may be above 0 (a sliding window's edge tile); without, lower is not read.
template <bool LOWER, typename PT>
inline void softmax_row(float *scores, int lower, int limit, int width, float scale, float &top, float *sum, PT *probs,
                 float *acc, int64_t Dp) {
    float tops[LANES];
    std::fill(tops, tops + LANES, -INFINITY);
    for (int j0 = 0; j0 < width; j0 += int(LANES)) {
#pragma omp simd
        for (int l = 0; l < int(LANES); l++) {
            const bool inside = (!LOWER || j0 + l >= lower) && j0 + l < limit;
            const float x = inside ? scores[j0 + l] : -INFINITY;
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
            const bool inside = (!LOWER || j0 + l >= lower) && j0 + l < limit;
            scores[j0 + l] = inside ? e : 0.0f;
        }
        to_operand(scores + j0, probs + j0, sum);
    }
}

struct Problem {
    const int64_t *block_tables, *query_start_loc, *seq_lens;
    int64_t num_seqs, q_stride;
    float scale, v_scale;
    Shape shape;
    Features features;
};

// softmax_row of an edge tile's rows, out of line: the hot code of attention without a window stays as it was
template <typename PT>
__attribute__((noinline)) void softmax_rows_from(int64_t m0, int64_t block, float *scores, const int64_t *lower,
                                                 const int64_t *limit, int width, float scale, float *top, float *sum,
                                                 PT *probs, float *acc, int64_t Dp) {
    for (int64_t r = m0; r < m0 + block; r++) {
        softmax_row<true>(scores + r * KEY_TILE, int(lower[r]), int(limit[r]), width, scale, top[r], sum + r * LANES,
                          probs + r * KEY_TILE, acc + r * Dp, Dp);
    }
}

// The first key any query of chunk seq sees (0 without a window): the chunk's keys are packed from its tile
inline int64_t first_key(const Problem &pb, int64_t seq) {
    const int64_t n = pb.query_start_loc[seq + 1] - pb.query_start_loc[seq];
    return window_start(pb.seq_lens[seq] - n, pb.features.window);
}

// One row block's scores [block, width] (row stride KEY_TILE) scaled and soft-capped in place
__attribute__((noinline)) void soft_cap_rows(float *scores, int64_t block, int64_t width, float scale, float cap) {
    for (int64_t r = 0; r < block; r++) {
        float *row = scores + r * KEY_TILE;
#pragma omp simd
        for (int64_t j = 0; j < width; j++) row[j] = cap * fast_tanh(row[j] * scale / cap);
    }
}

// One work item: query tokens first .. first + count - 1 of a chunk, the G heads of KV head kvh, against the
// chunk's packed key tiles (keys, values: its first packed tile for this head, the one holding first_key;
// tiles kv_stride elements apart)
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
        // a sink starts the row's softmax: the running max at its logit, its exp(0) = 1 in the sum
        const float *sinks = pb.features.sinks;
        s.top[r] = sinks ? sinks[item.kvh * G + r % G] : -INFINITY;
        std::fill(&s.sum[r * LANES], &s.sum[(r + 1) * LANES], 0.0f);
        if (sinks) s.sum[r * LANES] = 1.0f;
        std::fill(&s.acc[r * Dp], &s.acc[r * Dp] + Dp, 0.0f);
    }
    const int64_t last_pos = first_pos + item.count - 1, window = pb.features.window;
    const float cap = pb.features.soft_cap, scale = cap > 0.0f ? 1.0f : pb.scale;  // capped: scaled before
    const int64_t packed_from = first_key(pb, item.seq) / KEY_TILE;  // the chunk's first packed tile
    for (int64_t p0 = window_start(first_pos, window) / KEY_TILE * KEY_TILE; p0 <= last_pos; p0 += KEY_TILE) {
        const int64_t tile = p0 / KEY_TILE - packed_from;
        const PT *k = keys + tile * kv_stride, *v = values + tile * kv_stride;
        const int64_t begin = std::max<int64_t>(0, p0 - first_pos) * G;  // rows before see no key of this tile
        // rows after end see no key of it either (their windows begin past it)
        const int64_t end = window > 0 ? std::min(rows, std::max<int64_t>(0, p0 + KEY_TILE + window - 1 - first_pos) * G)
                                       : rows;
        for (int64_t r = begin; r < end; r++) s.limit[r] = std::min(KEY_TILE, first_pos + r / G - p0 + 1);
        if (window > 0) {
            for (int64_t r = begin; r < end; r++) {
                s.lower[r] = std::max<int64_t>(0, window_start(first_pos + r / G, window) - p0);
            }
        }
        for (int64_t m0 = begin; m0 < end; m0 += MAX_R) {
            const int64_t block = std::min<int64_t>(MAX_R, end - m0), widest = s.limit[m0 + block - 1];
            const int64_t width = round_up(widest, COLUMN_UNIT);  // the key columns this block computes
            product(&s.query[m0 * Dp], Dp, k, KEY_TILE, &s.scores[m0 * KEY_TILE], KEY_TILE, block, width, Dp, false);
            if (cap > 0.0f) soft_cap_rows(&s.scores[m0 * KEY_TILE], block, width, pb.scale, cap);
            if (window > 0 && s.lower[m0 + block - 1] > 0) {  // some row's window begins inside the tile
                softmax_rows_from(m0, block, s.scores.data(), s.lower.data(), s.limit.data(), int(width), scale,
                                  s.top.data(), s.sum.data(), s.probs.data(), s.acc.data(), Dp);
            } else {
                for (int64_t r = m0; r < m0 + block; r++) {
                    softmax_row<false>(&s.scores[r * KEY_TILE], 0, int(s.limit[r]), int(width), scale, s.top[r],
                                       &s.sum[r * LANES], &s.probs[r * KEY_TILE], &s.acc[r * Dp], Dp);
                }
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

// The work items, largest first (a query tile's cost grows with its last position, up to the window: causal
// tiles differ)
std::vector<Item> work_items(const Problem &pb, int64_t tokens_per_item) {
    std::vector<Item> items;
    const int64_t window = pb.features.window;
    for (int64_t seq = 0; seq < pb.num_seqs; seq++) {
        const int64_t n = pb.query_start_loc[seq + 1] - pb.query_start_loc[seq], cached = pb.seq_lens[seq] - n;
        for (int64_t first = 0; first < n; first += tokens_per_item) {
            const int64_t count = std::min(tokens_per_item, n - first);
            const int64_t keys = cached + first + count / 2 + 1;  // a middle query's
            for (int64_t kvh = 0; kvh < pb.shape.num_kv_heads; kvh++) {
                items.push_back({seq, kvh, first, count, count * (window > 0 ? std::min(keys, window) : keys)});
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
    // chunk s's packed key tiles: first_tile[s] .., from the tile holding its first_key (0 without a window)
    std::vector<int64_t> first_tile(pb.num_seqs + 1, 0);
    for (int64_t seq = 0; seq < pb.num_seqs; seq++) {
        const int64_t tiles = (pb.seq_lens[seq] + KEY_TILE - 1) / KEY_TILE - first_key(pb, seq) / KEY_TILE;
        first_tile[seq + 1] = first_tile[seq] + tiles;
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
            const int64_t lo = first_key(pb, seq), p0 = (tile - first_tile[seq] + lo / KEY_TILE) * KEY_TILE;
            pack_tile(k_cache, v_cache, pb.block_tables + seq * sh.max_blocks, kvh, p0, lo, pb.seq_lens[seq], sh,
                      keys + i * tile_size, values + i * tile_size);
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

// window (0: none), soft_cap (0: none) and sinks (null: none) as in attention_features.h
#define EXPORT(SUFFIX, T, C)                                                                                     \
    extern "C" void paged_prefill_attention_##SUFFIX(                                                            \
        const T *q, const C *k, const C *v, const int64_t *tables, const int64_t *query_start_loc,                \
        const int64_t *seq_lens, T *out, const float *sinks, int64_t num_seqs, int64_t num_heads,                 \
        int64_t num_kv_heads, int64_t head_dim, int64_t num_blocks, int64_t block_size, int64_t max_blocks,      \
        int64_t q_stride, int64_t window, float scale, float v_scale, float soft_cap) {                          \
        const Shape shape{num_heads, num_kv_heads, head_dim, round_up(head_dim, COLUMN_UNIT), num_blocks,         \
                          block_size, max_blocks};                                                               \
        const Problem problem{tables, query_start_loc, seq_lens, num_seqs, q_stride, scale, v_scale, shape,      \
                              Features{window, soft_cap, sinks}};                                                \
        prefill_attention(q, k, v, out, problem);                                                                \
    }
FOR_EACH_KV_TYPE(EXPORT)

// Weights re-laid out at load with 16 output rows interleaved (llama.cpp's repack does the same for its CPU
// kernels: block_q4_0x8), in the same bytes, for CPUs with AVX512_BF16:
//   y [rows, n] (row stride ldy) = x [rows, k] @ W^T (+ bias), bf16 x and y, fp32 sums (float_out: y is
//   fp32 holding the bf16 values, as the logits are sampled; csrc/gemm_bf16.cpp's float_out).
// GGUF Q4_0 / Q4_1 / Q8_0 (backend/engine/quantization/interleaved.py), MXFP4 (quantization/mxfp4.py) and
// GPTQ / AWQ / compressed-tensors 4- and 8-bit integers (quantization/group_scales.py; their scales and
// zeros stay beside the weights, csrc/interleaved_kinds.h) share the layout: W's rows in panels of 16 (n a
// multiple of 16), each panel's blocks of 32 weights in k order, a panel-block holding the 16 rows' blocks as
//   GGUF only: d[16] (fp16), Q4_1 only: m[16] (fp16), MXFP4 only: e[16] (e8m0 bytes), then chunks of 32
//   bytes: 4-bit: 8, chunk c's byte 2 r + e holding row r's weight 4 c + e in its low nibble and 4 c + 2 + e
//   in its high one; 8-bit: 16, chunk c's byte 2 r + e holding row r's weight 2 c + e
// So a 4-bit chunk widened to 32 words and looked up in a nibble table (VPERMW on the index's low 5 bits)
// is two vectors of 16 rows x a k-pair of exact bf16 integers, and an 8-bit chunk (through fp32: |q| <= 256
// is exact in bf16) one: the layout VDPBF16PS reads against a broadcast k-pair of x (read in place), as
// csrc/gemm_bf16.cpp's panels. The kinds (interleaved_kinds.h) differ only in that decoding and in where a
// group's scales come from; per group the 16 rows' sums are scaled as the GGUF kernels scale them
// (csrc/quantized_bf16.h):
//   sum_i x_i (d q_i + m) = d * sum_i q_i x_i + m * sum_i x_i   (packed: m = 0, q_i the exact q - z)
// every product exact in fp32, so only the order of the fp32 sums differs from the product with the
// dequantized weights; the 16 sums a row are one vector (no horizontal sums), rounded to bf16 once.
// A tile is MR rows of x times V panels, its sums in registers over the whole of k; rows are the inner
// loop, so a strip of V panels comes from memory once, and its first row tile prefetches the next strip
// (the weights stream from DRAM every decode step). One OpenMP region a call, panels split evenly.
// Act-order weights (a perm in Groups) multiply x with its columns permuted, inside the call. On CPUs
// with AMX, calls of many rows run on its tiles instead (csrc/interleaved_amx.h), the same function. GGUF
// Q4_0 on CPUs with AVX512_VNNI, from int8_rows.q4_0 rows, rounds x to int8 first (csrc/interleaved_int8.h).
// interleaved_available() is 0 where the build (-march) lacks AVX512_BF16 (the layout is not used
// there). Built and loaded by backend/engine/cpu_kernels.py.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "dtypes.h"
#include "interleaved_kinds.h"
#include "moe.h"

#if defined(__AVX512BF16__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <omp.h>

namespace {

constexpr int MR = 8;      // rows of x a tile (past MR rows: the kind's MANY_ROWS)
constexpr int NV = 4;      // panels a tile at most
constexpr int LINE = 64;

inline __m512bh pair_of(const BFloat16 *p) {  // x[i], x[i + 1] broadcast to every lane pair
    int32_t v;
    std::memcpy(&v, p, 4);
    return (__m512bh)_mm512_set1_epi32(v);
}

// y[row, 16 panel : 16 panel + 16] = sums (+ bias), rounded to bf16 once
inline void store_sums(const Call &c, __m512 sums, int64_t row, int64_t panel) {
    const int64_t col = panel * PANEL;
    __m512 bias = _mm512_setzero_ps();
    if (c.bias)
        bias = _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(c.bias + col))), 16));
    const __m256i out = (__m256i)_mm512_cvtneps_pbh(_mm512_add_ps(sums, bias));
    const int64_t at = row * c.ldy + col;
    if (c.float_out)  // the bf16 value widened: what torch's .float() of the bf16 output gives
        _mm512_storeu_si512(static_cast<float *>(c.y) + at, _mm512_slli_epi32(_mm512_cvtepu16_epi32(out), 16));
    else
        _mm256_storeu_si256(reinterpret_cast<__m256i *>(static_cast<BFloat16 *>(c.y) + at), out);
}

// y[row : row + R, 16 panel : 16 (panel + V)] over the whole of k, a group's sums scaled once; prefetch (or
// null): the next strip
template <typename B, int R, int V>
void tile(const Call &c, int64_t row, int64_t panel, const uint8_t *prefetch, int prefetch_panels,
          const uint16_t *decoded) {
    const int64_t blocks = c.k / 32, panel_bytes = blocks * c.group_bytes, per_group = c.group_blocks;
    const B kind;
    __m512 acc[R][V];
    for (int r = 0; r < R; r++)
        for (int v = 0; v < V; v++) acc[r][v] = _mm512_setzero_ps();
    for (int64_t g = 0; g < blocks / per_group; g++) {
        typename B::Zeros zeros[V];
        if (!decoded)
            for (int v = 0; v < V; v++) zeros[v] = kind.zeros(c, panel + v, g);
        __m512 part[R][V];
        for (int r = 0; r < R; r++)
            for (int v = 0; v < V; v++) part[r][v] = _mm512_setzero_ps();
        for (int64_t b = g * per_group; b < (g + 1) * per_group; b++) {
            const uint8_t *block = c.w + panel * panel_bytes + b * c.group_bytes + c.head;
            if (prefetch)
                for (int v = 0; v < prefetch_panels; v++)
                    for (int64_t line = 0; line < c.group_bytes; line += LINE)
                        _mm_prefetch(reinterpret_cast<const char *>(prefetch + v * panel_bytes + b * c.group_bytes + line),
                                     _MM_HINT_T1);
            const BFloat16 *xb = c.x + row * c.k + b * 32;
#pragma GCC unroll 16
            for (int q = 0; q < B::CHUNKS; q++) {
                __m512bh wv[V][B::PAIRS];
                for (int v = 0; v < V; v++) {
                    if (decoded)  // the strip decoded once for all its tiles of rows (V = 1 then)
                        for (int p = 0; p < B::PAIRS; p++)
                            wv[v][p] = (__m512bh)_mm512_loadu_si512(decoded + ((b * B::CHUNKS + q) * B::PAIRS + p) * 32);
                    else
                        kind(block + v * panel_bytes + q * 32, zeros[v], wv[v]);
                }
                for (int r = 0; r < R; r++)
                    for (int p = 0; p < B::PAIRS; p++) {
                        const __m512bh xp = pair_of(xb + r * c.k + 2 * (q * B::PAIRS + p));
                        for (int v = 0; v < V; v++) part[r][v] = _mm512_dpbf16_ps(part[r][v], wv[v][p], xp);
                    }
            }
        }
        for (int v = 0; v < V; v++) {
            __m512 d, m;
            group_scales<B>(c, c.w + (panel + v) * panel_bytes + g * c.group_bytes, panel + v, g, d, m);
            if constexpr (B::SCALE != 1.0f) d = _mm512_mul_ps(d, _mm512_set1_ps(B::SCALE));  // exact: a power of 2
            for (int r = 0; r < R; r++) acc[r][v] = _mm512_fmadd_ps(d, part[r][v], acc[r][v]);
            if constexpr (B::HAS_MIN)
                for (int r = 0; r < R; r++)
                    acc[r][v] = _mm512_fmadd_ps(m, _mm512_set1_ps(c.sums[(row + r) * blocks + g]), acc[r][v]);
        }
    }
    for (int v = 0; v < V; v++)
        for (int r = 0; r < R; r++) store_sums(c, acc[r][v], row + r, panel + v);
}

using TileFn = void (*)(const Call &, int64_t, int64_t, const uint8_t *, int, const uint16_t *);

template <typename B, int R>
TileFn tile_of(int v) {
    switch (v) {
        case 1: return tile<B, R, 1>;
        case 2: return tile<B, R, 2>;
        case 3: return tile<B, R, 3>;
        default: return tile<B, R, 4>;
    }
}

// tile<B, r, v> for 1 <= r <= MR, 1 <= v <= panels_per_tile(r)
template <typename B>
TileFn tile_fn(int r, int v) {
    switch (r) {
        case 1: return tile_of<B, 1>(v);
        case 2: return tile_of<B, 2>(v);
        case 3: return tile_of<B, 3>(std::min(v, 3));
        case 4: return tile_of<B, 4>(std::min(v, 2));
        case 5: return tile_of<B, 5>(std::min(v, 2));
        case 6: return tile_of<B, 6>(std::min(v, 2));
        case 7: return tile<B, 7, 1>;
        default: return tile<B, 8, 1>;
    }
}

inline int panels_per_tile(int64_t rows) {  // R x V sums and partial sums in registers
    return rows <= 2 ? NV : rows == 3 ? 3 : rows <= 6 ? 2 : 1;
}

// one panel's weights as the bf16 vectors the tiles multiply ([blocks, chunks, pairs]), for many rows
template <typename B>
void decode_panel(const Call &c, int64_t panel, uint16_t *out) {
    const int64_t blocks = c.k / 32;
    const uint8_t *w = c.w + panel * blocks * c.group_bytes + c.head;
    const B kind;
    for (int64_t b = 0; b < blocks; b++) {
        const typename B::Zeros zeros = kind.zeros(c, panel, b / c.group_blocks);
        for (int q = 0; q < B::CHUNKS; q++) {
            __m512bh wv[B::PAIRS];
            kind(w + b * c.group_bytes + q * 32, zeros, wv);
            for (int p = 0; p < B::PAIRS; p++)
                _mm512_storeu_si512(out + ((b * B::CHUNKS + q) * B::PAIRS + p) * 32, (__m512i)wv[p]);
        }
    }
}

}  // namespace

#include "interleaved_amx.h"  // many rows on AMX tiles (AMX CPUs)
#include "interleaved_int8.h"  // GGUF Q4_0 with int8 activations (AVX512_VNNI)

namespace {

// panels [first, last) for all rows: strip by strip, each strip's rows in tiles of MR (past MR rows: the
// kind's MANY_ROWS); the first tile of a strip prefetches the next strip into L2. 8-bit past MR rows: a
// strip is one panel, decoded once into an L1/L2 buffer that its tiles of rows read (a load a vector, not
// a decode)
template <typename B>
void strips(const Call &c, int64_t first, int64_t last) {
    if (amx_rows(c)) return amx_strips<B>(c, first, last);
    const int64_t blocks = c.k / 32, panel_bytes = blocks * c.group_bytes;
    const bool once = B::DECODE_ONCE && c.rows > MR;
    const int64_t mr = c.rows > MR && !once ? B::MANY_ROWS : MR;
    const int width = panels_per_tile(std::min<int64_t>(c.rows, mr));
    std::vector<uint16_t> buffer(once ? blocks * B::CHUNKS * B::PAIRS * 32 : 0);  // [.., pairs, 32 words]
    uint16_t *decoded = once ? buffer.data() : nullptr;
    for (int64_t panel = first; panel < last; panel += width) {
        const int v = int(std::min<int64_t>(width, last - panel));
        const int64_t next = panel + v;
        const int next_v = int(std::min<int64_t>(width, last - next));
        if (decoded) decode_panel<B>(c, panel, decoded);
        for (int64_t row = 0; row < c.rows; row += mr) {
            const int r = int(std::min<int64_t>(mr, c.rows - row));
            const uint8_t *prefetch = row == 0 && next_v > 0 ? c.w + next * panel_bytes : nullptr;
            tile_fn<B>(r, v)(c, row, panel, prefetch, next_v, decoded);  // r <= MR rows: at least v panels
        }
    }
}

inline float block_sum(const BFloat16 *x) {  // of 32 bf16, in fp32
    const __m512i v = _mm512_loadu_si512(x);
    const __m512 even = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
    const __m512 odd = _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(int(0xffff0000u))));
    return _mm512_reduce_add_ps(_mm512_add_ps(even, odd));
}

// head: the header bytes of a GGUF panel-block (32: d; 64: d and m), 0 for packed kinds
template <typename B>
void gemm(const BFloat16 *x, const uint8_t *w, const BFloat16 *bias, void *y, int64_t rows, int64_t n,
          int64_t k, int64_t ldy, const Groups *groups, int64_t float_out, int64_t head) {
    const int64_t blocks = k / 32, panels = n / PANEL;
    std::vector<BFloat16> permuted(groups && groups->perm ? rows * k : 0);
    for (int64_t i = 0; i < int64_t(permuted.size()); i++)  // x's columns in the weights' order (act-order)
        permuted[i] = x[i / k * k + groups->perm[i % k]];
    if (!permuted.empty()) x = permuted.data();
    std::vector<float> sums(B::HAS_MIN ? rows * blocks : 0);
    for (int64_t i = 0; i < int64_t(sums.size()); i++) sums[i] = block_sum(x + i * 32);
    const int64_t group_blocks = groups ? groups->group_size / 32 : 1;
    const Call c{x, w, bias, y, sums.data(), rows, n, k, ldy, float_out != 0, groups, head, head + B::CHUNKS * 32,
                 group_blocks};
    if constexpr (std::is_same_v<B, Q4_0>)
        if (head == 32 && int8_gemm_q4_0(c)) return;  // GGUF Q4_0 (not "w4"), from int8_rows.q4_0 rows
#pragma omp parallel if (panels > 1)
    {
        const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
        strips<B>(c, panels * t / threads, panels * (t + 1) / threads);
    }
}

// panels [first, last) of one expert's product for csrc/moe.cpp (inside its OpenMP region): the same strips,
// over the expert's rows of x (Q4_1's block sums of them computed here)
template <typename B>
void moe_panels(const moe::ExpertGemm &e, int64_t first, int64_t last, int64_t head) {
    const BFloat16 *x = static_cast<const BFloat16 *>(e.x);
    std::vector<float> sums(B::HAS_MIN ? e.rows * (e.k / 32) : 0);
    for (int64_t i = 0; i < int64_t(sums.size()); i++) sums[i] = block_sum(x + i * 32);
    const Call c{x, e.w, static_cast<const BFloat16 *>(e.bias), e.y, sums.data(), e.rows, e.n, e.k, e.ldy, false,
                 nullptr, head, head + B::CHUNKS * 32, 1};
    strips<B>(c, first, last);
}

}  // namespace

#define MOE_PANELS(NAME, KIND, HEAD)                                                                          \
    extern "C" void moe_panels_interleaved_##NAME(const moe::ExpertGemm &e, int64_t first, int64_t last) { \
        moe_panels<KIND>(e, first, last, HEAD);                                                              \
    }
MOE_PANELS(q4_0, Q4_0, 32)
MOE_PANELS(q4_1, Q4_1, 64)
MOE_PANELS(q8_0, Q8_0, 32)
MOE_PANELS(mxfp4, Mxfp4, 16)

#define INTERLEAVED(NAME, KIND, HEAD)                                                                          \
    extern "C" void interleaved_gemm_##NAME(const BFloat16 *x, const uint8_t *w, const BFloat16 *bias, void *y, \
                                            int64_t rows, int64_t n, int64_t k, int64_t ldy,                    \
                                            const Groups *groups, int64_t float_out) {                          \
        gemm<KIND>(x, w, bias, y, rows, n, k, ldy, groups, float_out, HEAD);                                    \
    }
extern "C" int interleaved_available() { return 1; }

// out [rows, k] = rows ids[t] of an interleaved Q8_0 weight, decoded as quant_dequant_q8_0 decodes their GGUF
// blocks (d * q in fp32, rounded once): a tied embedding's lookup in a captured decode step
extern "C" void interleaved_embedding_q8_0(const int64_t *ids, const uint8_t *w, BFloat16 *out, int64_t rows,
                                           int64_t k) {
    const int64_t group_bytes = 32 + 16 * 32, panel_bytes = k / 32 * group_bytes;
    for (int64_t t = 0; t < rows; t++) {
        const int64_t r = ids[t] % PANEL;  // its row of the panel: bytes 2 r and 2 r + 1 of each chunk
        const uint8_t *panel = w + ids[t] / PANEL * panel_bytes;
        for (int64_t b = 0; b < k / 32; b++) {
            const uint8_t *group = panel + b * group_bytes;
            uint16_t half;
            std::memcpy(&half, group + 2 * r, 2);
            const float d = _cvtsh_ss(half);
            for (int i = 0; i < 32; i++)  // weight i = 2 c + e: chunk c's byte 2 r + e
                store(out[t * k + b * 32 + i], float(int8_t(group[32 + i / 2 * 32 + 2 * r + i % 2])) * d);
        }
    }
}

#else
extern "C" void interleaved_amx_set_min_rows(int64_t) {}
#define INTERLEAVED(NAME, KIND, HEAD)                                                                          \
    extern "C" void interleaved_gemm_##NAME(const BFloat16 *, const uint8_t *, const BFloat16 *, void *,       \
                                            int64_t, int64_t, int64_t, int64_t, const Groups *, int64_t) {}
extern "C" int interleaved_available() { return 0; }
extern "C" void interleaved_embedding_q8_0(const int64_t *, const uint8_t *, BFloat16 *, int64_t, int64_t) {}
#define MOE_PANELS(NAME) \
    extern "C" void moe_panels_interleaved_##NAME(const moe::ExpertGemm &, int64_t, int64_t) {}
MOE_PANELS(q4_0)
MOE_PANELS(q4_1)
MOE_PANELS(q8_0)
MOE_PANELS(mxfp4)
#endif

INTERLEAVED(q4_0, Q4_0, 32)
INTERLEAVED(q4_1, Q4_1, 64)
INTERLEAVED(q8_0, Q8_0, 32)
INTERLEAVED(w4, Q4_0, 0)  // the same tiles as GGUF's, scales from Groups
INTERLEAVED(w4_zp, W4Zp, 0)
INTERLEAVED(w8, Q8_0, 0)
INTERLEAVED(w8_zp, W8Zp, 0)
INTERLEAVED(fp8, Fp8, 0)
INTERLEAVED(mxfp4, Mxfp4, 16)  // a panel-block's header: the 16 rows' e8m0 bytes

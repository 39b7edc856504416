// A dense bf16 GEMM for CPUs with AVX512_BF16 and no AMX (where oneDNN's packed bf16 GEMM leaves a fifth
// to a third of the cores' rate unused at the decode step's few dozen rows):
//   y [rows, n] (row stride ldy) = x [rows, k] @ W^T (+ bias), bf16 in and out, fp32 sums (float_out: y
//   is fp32 holding the bf16 values, as the logits are sampled).
// W is re-laid out once, at load (cpu_kernels.gemm_bf16_pack), into panels of 16 output columns with
// neighbouring k paired, the layout VDPBF16PS reads (oneDNN's VNNI one):
//   packed [panels = ceil(n / 16), k / 2, 16 columns, 2]  (columns past n are zero)
// so one 64-byte load holds a k-pair of 16 columns, and a k-pair of one row of x (32 bits, read in place:
// x needs no packing) is broadcast to all lanes; one VDPBF16PS adds 32 products into 16 fp32 sums.
// A tile of MR rows x NV panels keeps its MR * NV sums in registers over the whole of k and is rounded to
// bf16 once, at the store. Rows are the inner loop: a strip of NV panels comes from memory once and from
// the cache for the other tiles of rows, and while one strip is computed the next is prefetched (the
// weights stream from DRAM every decode step; the hardware prefetcher stops at each 4 KiB page). Rows go
// in blocks of ROW_BLOCK, each block through all of a thread's strips before the next, so that a prefill's
// rows (x: 2.4 MB at 2,048 tokens x 576) are read from L2, not L3, by every strip. One OpenMP region per
// call, the panels split evenly between its threads.
// k must be even. gemm_bf16_available() is 0 where the build (-march) lacks AVX512_BF16 (the engine
// keeps oneDNN there). Built and loaded by backend/engine/cpu_kernels.py.
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <utility>

#include "dtypes.h"

#if defined(__AVX512BF16__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>
#include <omp.h>

namespace {

constexpr int PANEL = 16;  // output columns a panel: one vector of fp32 sums
constexpr int MR = 6;      // rows of x a tile
constexpr int NV = 4;      // panels a tile: 24 sums, 4 weight vectors and a broadcast pair in registers
constexpr int LINE = 64;   // bytes: a cache line, a k-pair of one panel
// rows a block: 128 x k bf16 (147 KB at k 576, 393 KB at 1,536) stays in a core's L2 across the strips.
// MR 6 x NV 4 and 128-row blocks measured best of the shapes tried (8x3, 4x6, 5x5, 12x2; blocks of 64-256
// and none) at 1-2,048 rows on Zen 4: kernel_bench --only gemm, see the README
constexpr int64_t ROW_BLOCK = 128;

struct Gemm {
    const BFloat16 *x;  // [rows, 2 * k2]
    const uint16_t *w;  // packed
    const BFloat16 *bias;
    void *y;            // BFloat16, or float holding bf16 values (float_out)
    int64_t rows, n, k2, ldy;
    bool float_out;
};

// y[row : row + R, 16 panel : 16 (panel + V)] over the whole of k, prefetching prefetch_panels panels from
// prefetch on (a line each a k-pair)
template <int R, int V>
void tile(const Gemm &g, int64_t row, int64_t panel, const char *prefetch, int prefetch_panels) {
    const int64_t k = 2 * g.k2, stride = g.k2 * 2 * PANEL;  // elements from one panel to the next
    const uint16_t *w = g.w + panel * stride;
    const BFloat16 *x = g.x + row * k;
    __m512 acc[R][V];
    for (int r = 0; r < R; r++)
        for (int v = 0; v < V; v++) acc[r][v] = _mm512_setzero_ps();
    const int64_t panel_bytes = stride * 2;
    for (int64_t p = 0; p < g.k2; p++) {
        for (int i = 0; i < prefetch_panels; i++) _mm_prefetch(prefetch + i * panel_bytes + p * LINE, _MM_HINT_T1);
        __m512bh wv[V];
        for (int v = 0; v < V; v++) wv[v] = (__m512bh)_mm512_loadu_si512(w + v * stride + p * 2 * PANEL);
        for (int r = 0; r < R; r++) {
            int32_t pair;
            std::memcpy(&pair, x + r * k + 2 * p, 4);
            const __m512bh xb = (__m512bh)_mm512_set1_epi32(pair);
            for (int v = 0; v < V; v++) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], xb, wv[v]);
        }
    }
    for (int v = 0; v < V; v++) {
        const int64_t col = (panel + v) * PANEL, left = g.n - col;
        const __mmask16 mask = left >= PANEL ? __mmask16(0xffff) : __mmask16((1u << left) - 1);
        __m512 bias = _mm512_setzero_ps();
        if (g.bias)
            bias = _mm512_castsi512_ps(
                _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, g.bias + col)), 16));
        for (int r = 0; r < R; r++) {
            const __m256i out = (__m256i)_mm512_cvtneps_pbh(_mm512_add_ps(acc[r][v], bias));
            const int64_t at = (row + r) * g.ldy + col;
            if (g.float_out)  // the bf16 value widened: what torch's .float() of the bf16 output gives
                _mm512_mask_storeu_epi32(static_cast<float *>(g.y) + at, mask, _mm512_slli_epi32(_mm512_cvtepu16_epi32(out), 16));
            else
                _mm256_mask_storeu_epi16(static_cast<BFloat16 *>(g.y) + at, mask, out);
        }
    }
}

using TileFn = void (*)(const Gemm &, int64_t, int64_t, const char *, int);

template <int R, int... V>
constexpr std::array<TileFn, NV> tiles_of_rows(std::integer_sequence<int, V...>) {
    return {tile<R, V + 1>...};
}

template <int... R>
constexpr std::array<std::array<TileFn, NV>, MR> tile_table(std::integer_sequence<int, R...>) {
    return {tiles_of_rows<R + 1>(std::make_integer_sequence<int, NV>())...};
}

// tile<r, v> for 1 <= r <= MR, 1 <= v <= NV
TileFn tile_fn(int r, int v) {
    static constexpr auto table = tile_table(std::make_integer_sequence<int, MR>());
    return table[r - 1][v - 1];
}

// panels [first, last) for rows [row, end): strip by strip of NV panels, each strip's rows in tiles of MR;
// the tiles of a strip prefetch the next strip into L2, a panel each (spread out over the tiles)
void strips(const Gemm &g, int64_t first, int64_t last, int64_t row, int64_t end) {
    const int64_t panel_bytes = g.k2 * 2 * PANEL * 2, tiles = (end - row + MR - 1) / MR;
    const char *packed = reinterpret_cast<const char *>(g.w);
    for (int64_t panel = first; panel < last; panel += NV) {
        const int v = int(std::min<int64_t>(NV, last - panel));
        const int64_t next = panel + v, next_v = std::min<int64_t>(NV, last - next);
        for (int64_t t = 0; t < tiles; t++) {
            const int64_t a = next_v * t / tiles, b = next_v * (t + 1) / tiles;
            const int r = int(std::min<int64_t>(MR, end - row - t * MR));
            tile_fn(r, v)(g, row + t * MR, panel, packed + (next + a) * panel_bytes, int(b - a));
        }
    }
}

}  // namespace

extern "C" int gemm_bf16_available() { return 1; }

extern "C" void gemm_bf16(const BFloat16 *x, const uint16_t *packed, const BFloat16 *bias, void *y, int64_t rows,
                          int64_t n, int64_t k, int64_t ldy, int64_t float_out) {
    const Gemm g{x, packed, bias, y, rows, n, k / 2, ldy, float_out != 0};
    const int64_t panels = (n + PANEL - 1) / PANEL;
#pragma omp parallel if (panels > 1)
    {
        const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
        const int64_t first = panels * t / threads, last = panels * (t + 1) / threads;
        for (int64_t row = 0; row < rows; row += ROW_BLOCK) strips(g, first, last, row, std::min(rows, row + ROW_BLOCK));
    }
}

#else
extern "C" int gemm_bf16_available() { return 0; }
extern "C" void gemm_bf16(const BFloat16 *, const uint16_t *, const BFloat16 *, void *, int64_t, int64_t, int64_t,
                          int64_t, int64_t) {}
#endif

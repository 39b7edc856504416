// A dense bf16 GEMM for CPUs with AVX512_BF16 (where oneDNN's packed bf16 GEMM leaves a fifth to a third
// of the cores' rate unused at the decode step's few dozen rows; on CPUs with AMX, calls of many rows run
// on its tiles, csrc/gemm_amx.h, over the same packed weights):
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
#include "lanes16.h"
#include "moe.h"

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
    bool float_out, silu_and_mul;
};

inline __m512 widen(__m256bh x) {  // bf16 lanes as floats
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)x), 16));
}

inline __m512 bias16(const Gemm &g, int64_t col, __mmask16 mask) {
    return g.bias ? load16(g.bias + col, mask) : _mm512_setzero_ps();
}

// y[row : row + R, columns of panels panel .. panel + V) = acc (+ bias), rounded to bf16 once
template <int R, int V>
inline void store(const Gemm &g, const __m512 (&acc)[R][V], int64_t row, int64_t panel) {
    for (int v = 0; v < V; v++) {
        const int64_t col = (panel + v) * PANEL;
        const __mmask16 mask = lanes(g.n - col);
        const __m512 bias = bias16(g, col, mask);
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

// The gate_up projection with SiLU-and-multiply as its epilogue: gate and up panels alternate (panel 2j
// holds gate columns 16j .. 16j + 15, panel 2j + 1 the same up columns; cpu_kernels.pack_gate_up), and
// y [rows, n / 2] = silu(gate) * up is rounded step by step as gemm_bf16 then layers.cpp's silu_and_mul
// round it (gate and up to bf16, silu to bf16, the product), so the fused call equals the two bit for bit.
template <int R, int V>
inline void store_silu_and_mul(const Gemm &g, const __m512 (&acc)[R][V], int64_t row, int64_t panel) {
    for (int v = 0; v + 1 < V; v += 2) {
        const int64_t col = (panel + v) * PANEL, out_col = col / 2;
        const __mmask16 mask = lanes(g.n / 2 - out_col);
        const __m512 gate_bias = bias16(g, col, mask), up_bias = bias16(g, col + PANEL, mask);
        for (int r = 0; r < R; r++) {
            const __m512 gate = widen(_mm512_cvtneps_pbh(_mm512_add_ps(acc[r][v], gate_bias)));
            const __m512 up = widen(_mm512_cvtneps_pbh(_mm512_add_ps(acc[r][v + 1], up_bias)));
            const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), gate));
            const __m512 silu = round16<BFloat16>(_mm512_div_ps(gate, _mm512_add_ps(_mm512_set1_ps(1.0f), e)));
            store16(static_cast<BFloat16 *>(g.y) + (row + r) * g.ldy + out_col, _mm512_mul_ps(silu, up), mask);
        }
    }
}

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
    if (g.silu_and_mul)
        store_silu_and_mul<R, V>(g, acc, row, panel);
    else
        store<R, V>(g, acc, row, panel);
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

#include "gemm_amx.h"  // AMX tiles over the same packed panels (AMX CPUs, from AMX_MIN_ROWS rows)

namespace {

// panels [first, last) of g for all rows, a block of rows at a time (on AMX tiles where amx_rows says so)
void run(const Gemm &g, int64_t first, int64_t last) {
    if (amx_rows(g)) return amx_run(g, first, last);
    for (int64_t row = 0; row < g.rows; row += ROW_BLOCK) strips(g, first, last, row, std::min(g.rows, row + ROW_BLOCK));
}

}  // namespace

extern "C" int gemm_bf16_available() { return 1; }

extern "C" void gemm_bf16(const BFloat16 *x, const uint16_t *packed, const BFloat16 *bias, void *y, int64_t rows,
                          int64_t n, int64_t k, int64_t ldy, int64_t float_out) {
    const Gemm g{x, packed, bias, y, rows, n, k / 2, ldy, float_out != 0, false};
    const int64_t panels = (n + PANEL - 1) / PANEL;
#pragma omp parallel if (panels > 1)
    {
        const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
        run(g, panels * t / threads, panels * (t + 1) / threads);
    }
}

// y [rows, n / 2] (row stride ldy, bf16) = silu(gate) * up of x @ W^T (+ bias) for a gate_up projection
// packed by cpu_kernels.pack_gate_up (n a multiple of 32): pairs of panels split between the threads
extern "C" void gemm_bf16_silu_and_mul(const BFloat16 *x, const uint16_t *packed, const BFloat16 *bias,
                                       BFloat16 *y, int64_t rows, int64_t n, int64_t k, int64_t ldy) {
    const Gemm g{x, packed, bias, y, rows, n, k / 2, ldy, false, true};
    const int64_t pairs = n / (2 * PANEL);
#pragma omp parallel if (pairs > 1)
    {
        const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
        run(g, 2 * (pairs * t / threads), 2 * (pairs * (t + 1) / threads));
    }
}

// panels [first, last) of one expert's product for csrc/moe.cpp (inside its OpenMP region): the expert's
// weights packed on their own (cpu_kernels.gemm_bf16_pack of [n, k]), its rows of x
extern "C" void moe_panels_gemm_bf16(const moe::ExpertGemm &e, int64_t first, int64_t last) {
    const Gemm g{static_cast<const BFloat16 *>(e.x), reinterpret_cast<const uint16_t *>(e.w),
                 static_cast<const BFloat16 *>(e.bias), e.y, e.rows, e.n, e.k / 2, e.ldy, false, false};
    run(g, first, last);
}

#else
extern "C" void moe_panels_gemm_bf16(const moe::ExpertGemm &, int64_t, int64_t) {}
extern "C" int gemm_bf16_available() { return 0; }
extern "C" int gemm_amx_ready() { return 0; }
extern "C" void gemm_amx_set_min_rows(int64_t) {}
extern "C" int64_t amx_tile_runs() { return 0; }
extern "C" void gemm_bf16(const BFloat16 *, const uint16_t *, const BFloat16 *, void *, int64_t, int64_t, int64_t,
                          int64_t, int64_t) {}
extern "C" void gemm_bf16_silu_and_mul(const BFloat16 *, const uint16_t *, const BFloat16 *, BFloat16 *, int64_t,
                                       int64_t, int64_t, int64_t) {}
#endif

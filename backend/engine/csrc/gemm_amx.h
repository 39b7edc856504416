// gemm_bf16 on AMX tiles (Advanced Matrix Extensions: Sapphire Rapids and later Xeons), included by
// csrc/gemm_bf16.cpp, whose Gemm and epilogues (store, store_silu_and_mul) it shares.
// gemm_bf16's packed layout [panels, k / 2, 16, 2] is already AMX's B-tile layout: 16 k-pairs of a panel
// are one tile (16 rows of 64 bytes, 1 KiB, contiguous); 16 rows x 32 k of x are an A tile read in place
// (row stride 2 k bytes); TDPBF16PS adds their 16 x 16 x 32 products into a C tile of 16 x 16 fp32 sums.
// A block is up to 32 rows x 2 panels: 2 A tiles, 2 B tiles, 4 C tiles over the whole of k, then stored to
// a buffer and passed a row at a time through gemm_bf16's own epilogue (bias, one bf16 rounding, float_out,
// the fused SiLU-and-multiply), so the two kernels differ only in the order of the fp32 sums. Rows go in
// blocks of ROW_BLOCK through all of a thread's panels (x from L2), as in gemm_bf16; the last rows of a
// call, fewer than a block of 32, are copied into a zeroed block (a tile reads 16 full rows).
// amx_rows(): a call takes the tiles from amx_min_rows rows (cpu_kernels.GEMM_AMX_MIN_ROWS; fewer rows are
// bound by reading the weights, which VDPBF16PS does as fast with no padding), with k a multiple of 32, once
// Linux granted this process the tile state (csrc/amx_tiles.h). Each OpenMP thread loads the tile
// configuration at the start of its share and releases the tiles after.
#pragma once
#include <vector>

#include "amx_tiles.h"

#if defined(AMX_TILES)
namespace {

constexpr int64_t AMX_ROWS = 32;  // rows of a block: two A tiles of 16
int64_t amx_min_rows = 0;         // 0: tiles not used (not granted, or turned off)

inline bool amx_rows(const Gemm &g) { return amx_min_rows > 0 && g.rows >= amx_min_rows && g.k2 % 16 == 0; }

// C tile 2 a + b (a: A tile, b: panel) += x rows [16 a, 16 a + 16) x panel b's columns, over the whole of k;
// then stored to c (4 x 16 x 16 fp32)
template <int A, int V>
void amx_block(const Gemm &g, const BFloat16 *x, int64_t panel, float *c) {
    const int64_t lda = 4 * g.k2, stride = g.k2 * 2 * PANEL;  // x row in bytes; panel to panel in elements
    const uint16_t *w = g.w + panel * stride;
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t p = 0; p < g.k2; p += 16) {  // 16 k-pairs: 32 k
        _tile_loadd(4, x + 2 * p, lda);
        _tile_loadd(6, w + p * 2 * PANEL, 64);
        _tile_dpbf16ps(0, 4, 6);
        if constexpr (V == 2) {
            _tile_loadd(7, w + stride + p * 2 * PANEL, 64);
            _tile_dpbf16ps(1, 4, 7);
        }
        if constexpr (A == 2) {
            _tile_loadd(5, x + 16 * 2 * g.k2 + 2 * p, lda);
            _tile_dpbf16ps(2, 5, 6);
            if constexpr (V == 2) _tile_dpbf16ps(3, 5, 7);
        }
    }
    _tile_stored(0, c, 64);
    _tile_stored(1, c + 256, 64);
    _tile_stored(2, c + 512, 64);
    _tile_stored(3, c + 768, 64);
}

using AmxBlockFn = void (*)(const Gemm &, const BFloat16 *, int64_t, float *);

AmxBlockFn amx_block_fn(int64_t rows, int v) {
    if (rows > 16) return v == 2 ? amx_block<2, 2> : amx_block<2, 1>;
    return v == 2 ? amx_block<1, 2> : amx_block<1, 1>;
}

// rows [row, row + m) of the block's sums c through gemm_bf16's epilogue
void amx_store(const Gemm &g, const float *c, int64_t row, int64_t m, int64_t panel, int v) {
    for (int64_t r = 0; r < m; r++) {
        const float *sums = c + (r / 16) * 512 + (r % 16) * 16;  // C tile 2 (r / 16) + b, its row r % 16
        if (v == 2) {
            const __m512 acc[1][2] = {{_mm512_loadu_ps(sums), _mm512_loadu_ps(sums + 256)}};
            if (g.silu_and_mul)
                store_silu_and_mul<1, 2>(g, acc, row + r, panel);
            else
                store<1, 2>(g, acc, row + r, panel);
        } else {
            const __m512 acc[1][1] = {{_mm512_loadu_ps(sums)}};
            store<1, 1>(g, acc, row + r, panel);
        }
    }
}

// panels [first, last) of g for all rows on AMX tiles (first even for the fused SiLU-and-multiply, so that
// a block's two panels are a gate panel and its up panel)
void amx_run(const Gemm &g, int64_t first, int64_t last) {
    amx::configure();
    std::vector<BFloat16> tail;  // the call's last rows, fewer than AMX_ROWS, in a zeroed block
    alignas(64) float c[4 * 16 * 16];
    for (int64_t row = 0; row < g.rows; row += ROW_BLOCK) {
        const int64_t end = std::min(g.rows, row + ROW_BLOCK);
        for (int64_t panel = first; panel < last; panel += 2) {
            const int v = int(std::min<int64_t>(2, last - panel));
            for (int64_t r = row; r < end; r += AMX_ROWS) {
                const int64_t m = std::min(AMX_ROWS, end - r);
                const BFloat16 *x = amx::rows_for_tiles(g.x, g.rows, 2 * g.k2, r, AMX_ROWS, tail);
                amx_block_fn(m, v)(g, x, panel, c);
                amx_store(g, c, r, m, panel, v);
            }
        }
    }
    _tile_release();
}

}  // namespace

// 1 where this process may use AMX tiles from now on (Linux granted the tile state), 0 where not
extern "C" int gemm_amx_ready() { return amx::granted(); }

// shares of calls run on AMX tiles so far (amx_tiles.h), by gemm_bf16 and the interleaved kernels
extern "C" int64_t amx_tile_runs() { return amx::runs.load(); }

// calls of at least rows rows take AMX tiles (0: none); only once gemm_amx_ready() returned 1
extern "C" void gemm_amx_set_min_rows(int64_t rows) { amx_min_rows = gemm_amx_ready() ? rows : 0; }

#else
namespace {
inline bool amx_rows(const Gemm &) { return false; }
inline void amx_run(const Gemm &, int64_t, int64_t) {}
}  // namespace
extern "C" int gemm_amx_ready() { return 0; }
extern "C" void gemm_amx_set_min_rows(int64_t) {}
extern "C" int64_t amx_tile_runs() { return 0; }
#endif

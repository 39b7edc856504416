// csrc/interleaved.cpp's GEMM on AMX tiles, for calls of many rows (prefill, large decode batches) on CPUs
// with AMX: included by interleaved.cpp, whose Call, kinds, decode_panel and store_sums it shares.
// A panel's weights are decoded once into the bf16 vectors the VDPBF16PS tiles read (decode_panel: exact
// integers, or fp8 values, 16 rows x a k-pair each, in k order): a block of 32 weights is then one AMX B tile
// as it is (16 k-pairs x 64 bytes, 1 KiB). x's rows are A tiles read in place (16 rows x 32 k). Per group,
// TDPBF16PS sums the group's blocks into a zeroed C tile (every product exact in fp32, as VDPBF16PS's), the
// tile is stored and its 16 rows are scaled as the VDPBF16PS tiles scale theirs:
//   acc += d * sum_i q_i x_i (+ m * sum_i x_i)
// so the two paths differ only in the order of fp32 sums, as gemm_bf16's two do. Rows go in tiles of 16
// (the last few copied into a zeroed tile), a panel's decoded weights (18-48 KiB) read from L1/L2 by all
// of them. amx_rows(): from interleaved_amx_min_rows rows (cpu_kernels.INTERLEAVED_AMX_MIN_ROWS), once
// Linux granted the tile state (csrc/amx_tiles.h).
#pragma once
#include <vector>

#include "amx_tiles.h"

#if defined(AMX_TILES)
namespace {

int64_t interleaved_amx_min_rows = 0;  // 0: tiles not used

inline bool amx_rows(const Call &c) { return interleaved_amx_min_rows > 0 && c.rows >= interleaved_amx_min_rows; }

// rows [row, row + 16) of x (padded: the tile's rows past the call's are zero) times one decoded panel
template <typename B>
void amx_tile(const Call &c, const BFloat16 *x, int64_t row, int64_t rows, int64_t panel, const uint16_t *decoded) {
    const int64_t blocks = c.k / 32, panel_bytes = blocks * c.group_bytes, groups = blocks / c.group_blocks;
    alignas(64) float part[16 * 16];
    __m512 acc[16];
    for (int r = 0; r < 16; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t g = 0; g < groups; g++) {
        _tile_zero(0);
        for (int64_t b = g * c.group_blocks; b < (g + 1) * c.group_blocks; b++) {
            _tile_loadd(1, x + b * 32, 2 * c.k);
            _tile_loadd(2, decoded + b * 512, 64);
            _tile_dpbf16ps(0, 1, 2);
        }
        _tile_stored(0, part, 64);
        __m512 d, m;
        group_scales<B>(c, c.w + panel * panel_bytes + g * c.group_bytes, panel, g, d, m);
        if constexpr (B::SCALE != 1.0f) d = _mm512_mul_ps(d, _mm512_set1_ps(B::SCALE));  // exact: a power of 2
        for (int r = 0; r < 16; r++) acc[r] = _mm512_fmadd_ps(d, _mm512_load_ps(part + 16 * r), acc[r]);
        if constexpr (B::HAS_MIN)
            for (int r = 0; r < rows; r++)
                acc[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(c.sums[(row + r) * blocks + g]), acc[r]);
    }
    for (int r = 0; r < rows; r++) store_sums(c, acc[r], row + r, panel);
}

// panels [first, last) for all rows: each panel decoded once, then every tile of 16 rows against it
template <typename B>
void amx_strips(const Call &c, int64_t first, int64_t last) {
    static_assert(B::CHUNKS * B::PAIRS == 16, "a block is one B tile: 16 k-pairs");
    amx::configure();
    std::vector<uint16_t> decoded(size_t(c.k / 32 * 512));
    std::vector<BFloat16> tail;  // the call's last rows, fewer than 16, in a zeroed tile
    for (int64_t panel = first; panel < last; panel++) {
        decode_panel<B>(c, panel, decoded.data());
        for (int64_t row = 0; row < c.rows; row += 16) {
            const int64_t rows = std::min<int64_t>(16, c.rows - row);
            const BFloat16 *x = amx::rows_for_tiles(c.x, c.rows, c.k, row, 16, tail);
            amx_tile<B>(c, x, row, rows, panel, decoded.data());
        }
    }
    _tile_release();
}

}  // namespace

// calls of at least rows rows take AMX tiles (0: none); only where Linux granted the tile state
extern "C" void interleaved_amx_set_min_rows(int64_t rows) { interleaved_amx_min_rows = amx::granted() ? rows : 0; }

#else
namespace {
inline bool amx_rows(const Call &) { return false; }
template <typename B>
void amx_strips(const Call &, int64_t, int64_t) {}
}  // namespace
extern "C" void interleaved_amx_set_min_rows(int64_t) {}
#endif

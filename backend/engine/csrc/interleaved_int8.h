// csrc/interleaved.cpp's GGUF Q4_0 GEMM with int8 activations (csrc/int8_dot.h), where the build has
// AVX512_VNNI: included by interleaved.cpp, whose Call and store_sums it shares. x is quantized once per
// call per block of 32 (llama.cpp's Q8_0: a d and the sum S of the q per row and block); a chunk of a
// panel-block (16 rows x 4 k, csrc/interleaved.cpp's layout: byte 2 r + e holds row r's weights 4 c + e and
// 4 c + 2 + e) widens to 16 dwords, row r's four nibbles in dword r, so one VPDPBUSD multiplies it by a
// broadcast quad of one row of x. Per block the int32 sums start from -8 S (Q4_0's offset) and are scaled
// once by the 16 rows' d times x's d:
//   y += d_w * d_x * (sum_i u_i q_i - 8 S)
// A tile is one panel (16 output columns) times up to 16 rows of x over the whole of k: its 8 decoded
// chunks serve every row (one decode a block, not one per tile of rows), the panel streams from memory once
// (the first tile of rows prefetches the next panel). int8_gemm_q4_0 returns false where it does not
// apply (packed kinds, rows outside int8_rows' range, calls on AMX tiles), and the bf16 path runs.
#pragma once
#include <cstdint>
#include <cstdlib>

#include "int8_dot.h"

#if defined(INT8_DOT)
namespace {

struct Int8X {         // x quantized per block of 32
    const int8_t *q;   // [rows, k]
    const float *d;    // [rows, blocks]
    const int32_t *corr;  // [rows, blocks]: -8 S
};

inline __m512i q4_quads(const uint8_t *chunk) {  // 16 rows x 4 k as unsigned nibbles, row r in dword r
    const __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(chunk)));
    return _mm512_ternarylogic_epi32(v, _mm512_slli_epi32(v, 12), _mm512_set1_epi32(0x0F0F0F0F), 0xA8);  // (a|b)&c
}

template <int R>
void int8_tile(const Call &c, const Int8X &x, int64_t row, int64_t panel, const uint8_t *prefetch) {
    const int64_t blocks = c.k / 32, panel_bytes = blocks * c.group_bytes;
    __m512 acc[R];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    const uint8_t *p = c.w + panel * panel_bytes;
    for (int64_t b = 0; b < blocks; b++) {
        const uint8_t *block = p + b * c.group_bytes;  // d[16] (fp16), then 8 chunks of 32 bytes
        if (prefetch)
            for (int64_t line = 0; line < c.group_bytes; line += 64)
                _mm_prefetch(reinterpret_cast<const char *>(prefetch + b * c.group_bytes + line), _MM_HINT_T0);
        const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(block)));
        __m512i wq[8];
        for (int q = 0; q < 8; q++) wq[q] = q4_quads(block + 32 + 32 * q);
        for (int r = 0; r < R; r++) {
            const int64_t i = (row + r) * blocks + b;
            const int8_t *xr = x.q + (row + r) * c.k + b * 32;
            __m512i sum = _mm512_set1_epi32(x.corr[i]);
            for (int q = 0; q < 8; q++)
                sum = _mm512_dpbusd_epi32(sum, wq[q], _mm512_set1_epi32(int(int8dot::u32(reinterpret_cast<const uint8_t *>(xr + 4 * q)))));
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(dw, _mm512_set1_ps(x.d[i])), acc[r]);
        }
    }
    for (int r = 0; r < R; r++) store_sums(c, acc[r], row + r, panel);
}

using Int8TileFn = void (*)(const Call &, const Int8X &, int64_t, int64_t, const uint8_t *);

template <int... R>
Int8TileFn int8_tile_of(int r, std::integer_sequence<int, R...>) {  // int8_tile<r>, 1 <= r <= 16
    constexpr Int8TileFn fns[] = {int8_tile<R + 1>...};
    return fns[r - 1];
}

// panels [first, last) for all rows, in tiles of up to 16 rows
inline void int8_strips(const Call &c, const Int8X &x, int64_t first, int64_t last) {
    const int64_t panel_bytes = c.k / 32 * c.group_bytes;
    for (int64_t panel = first; panel < last; panel++) {
        const uint8_t *next = panel + 1 < last ? c.w + (panel + 1) * panel_bytes : nullptr;
        for (int64_t row = 0; row < c.rows; row += 16) {
            const int r = int(std::min<int64_t>(16, c.rows - row));
            int8_tile_of(r, std::make_integer_sequence<int, 16>{})(c, x, row, panel, row == 0 ? next : nullptr);
        }
    }
}

// interleaved GGUF Q4_0 with int8 x (int8_rows.q4_0_takes): false (nothing written) where it does not apply
inline bool int8_gemm_q4_0(const Call &c) {
    if (c.groups || !int8_rows.q4_0_takes(c.rows) || amx_rows(c)) return false;
    const int64_t blocks = c.k / 32;
    std::vector<int8_t> q(c.rows * c.k);
    std::vector<float> d(c.rows * blocks);
    std::vector<int32_t> corr(c.rows * blocks);
    for (int64_t i = 0; i < c.rows * blocks; i++) {
        int32_t sum[2];
        d[i] = int8dot::quantize_block(c.x + i * 32, 32, q.data() + i * 32, sum);
        corr[i] = -8 * (sum[0] + sum[1]);
    }
    const Int8X x{q.data(), d.data(), corr.data()};
    const int64_t panels = c.n / PANEL;
#pragma omp parallel if (panels > 1)
    {
        const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
        int8_strips(c, x, panels * t / threads, panels * (t + 1) / threads);
    }
    return true;
}

}  // namespace
#else
namespace {
inline bool int8_gemm_q4_0(const Call &) { return false; }
}  // namespace
#endif

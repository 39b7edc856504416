// Q6_K weights times up to GEMM_MAX_ROWS activation rows without a decoded copy of the weights in memory:
//   quant_gemm_q6_k_{f32,bf16}: y [rows, n] (row stride ldy) = x [rows, k] @ W^T (+ bias), W [n, k] Q6_K
// (csrc/q6_k.h). Up to quantized.cpp's MAX_ROWS rows (bf16 lanes: BF16_GEMV_ROWS) it is quant_gemv_q6_k
// (each block decoded in registers once per output column); past it, where quant_gemv would decode every
// block once per 8 rows:
//   - bf16 x where the build has AVX512_BF16 (BF16_DOT, csrc/quantized_bf16.h): x's rows in vector lanes
//     (bf16dot::lane_x), each super-block of J output columns decoded once to its exact 6-bit integers as
//     bf16 (a 64-entry table, VPERMT2W) in an L1 buffer, VDPBF16PS products summed per 16-weight sub-block
//     in fp32, then scaled by d * scale: the function (d * scale) * q * x with the fp32 sums in another order
//   - otherwise (AVX-512 without bf16, AVX2+FMA, plain C++; fp32 x or bf16 x widened once): J output
//     columns decoded to fp32 (Q6_K::decode) into a per-thread buffer, then R rows x J columns of fp32
//     products in vector registers (quant_vec.h)
//   - bf16 x where the build has AVX512_VNNI (INT8_DOT, csrc/q6_k_int8.h), from int8_rows.q6_k rows: x
//     quantized to int8 per super-block as llama.cpp's Q8_K (ggml_vec_dot_q6_K_q8_K), VPDPBUSD on the
//     unsigned 6-bit integers; not the same function (x rounded to 8 bits, csrc/int8_dot.h's bound); one row
//     (batch-1 decode) with the weights in lanes instead (q6_int8::gemv_row)
// All are parallel over output columns with the engine's OpenMP threads.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "dtypes.h"
#include "int8_avx2.h"
#include "q6_k.h"
#include "quant_vec.h"
#include "q6_k_int8.h"
#include "quantized_bf16.h"

extern "C" void quant_gemv_q6_k_f32(const float *x, const uint8_t *w, const float *bias, float *y, int64_t rows,
                                    int64_t n, int64_t k, int64_t ldy);
extern "C" void quant_gemv_q6_k_bf16(const BFloat16 *x, const uint8_t *w, const BFloat16 *bias, BFloat16 *y,
                                     int64_t rows, int64_t n, int64_t k, int64_t ldy);

namespace {

constexpr int GEMV_ROWS = 8;       // quantized.cpp MAX_ROWS: quant_gemv up to here
// bf16 lanes from 5 rows: Llama-3.2-1B's lm_head (128,256 x 2,048) on 2 threads of an EPYC with
// AVX512_BF16 took 165 ms (quant_gemv) vs 208 (lanes) at 4 rows, 317 vs 234 at 6, 344 vs 216 at 8
// (a shared machine, load 7: the best of 3; lanes cost about the same from 1 to 16 rows)
constexpr int BF16_GEMV_ROWS = 4;
constexpr int GEMM_MAX_ROWS = 64;  // cpu_kernels.Q6_K_GEMM_MAX_ROWS
constexpr int QK = Q6_K::QK, BYTES = Q6_K::BYTES;

// ---- portable: J columns decoded to fp32, R rows x J columns of accumulators ----
constexpr int PJ = 4, PR = 4;  // 16 accumulators: AVX2's and AVX-512's register files hold them with room

template <int R, int J>
inline void tile_dot(const float *x, const float *w, int64_t k, float (*out)[PJ]) {
    Vec acc[R][J];
    for (int r = 0; r < R; r++)
        for (int j = 0; j < J; j++) acc[r][j] = vzero();
    for (int64_t i = 0; i < k; i += VEC_WIDTH) {  // k: a multiple of 256
        Vec wv[J];
        for (int j = 0; j < J; j++) wv[j] = vload(w + j * k + i);
        for (int r = 0; r < R; r++) {
            const Vec xv = vload(x + r * k + i);
            for (int j = 0; j < J; j++) acc[r][j] = vfma(wv[j], xv, acc[r][j]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int j = 0; j < J; j++) out[r][j] = vsum(acc[r][j]);
}

template <int J>
inline void tile_rows(const float *x, const float *w, int64_t rows, int64_t k, float (*out)[PJ]) {
    switch (rows) {
        case 1: return tile_dot<1, J>(x, w, k, out);
        case 2: return tile_dot<2, J>(x, w, k, out);
        case 3: return tile_dot<3, J>(x, w, k, out);
        default: return tile_dot<PR, J>(x, w, k, out);
    }
}

// columns j0 .. j0 + cols - 1 (cols <= PJ) of y for every row, W's columns decoded into buf [PJ, k]
template <typename T>
void portable_columns(const float *x, const uint8_t *w, const T *bias, T *y, int64_t rows, int64_t j0, int cols,
                      int64_t k, int64_t ldy, float *buf) {
    const int64_t blocks = k / QK, row_bytes = blocks * BYTES;
    for (int j = 0; j < cols; j++)
        for (int64_t b = 0; b < blocks; b++) Q6_K::decode(w + (j0 + j) * row_bytes + b * BYTES, buf + j * k + b * QK);
    for (int64_t r0 = 0; r0 < rows; r0 += PR) {
        const int64_t r_n = std::min<int64_t>(PR, rows - r0);
        float out[PR][PJ];
        if (cols == PJ) {
            tile_rows<PJ>(x + r0 * k, buf, r_n, k, out);
        } else {
            for (int j = 0; j < cols; j++) {
                float one[PR][PJ];
                tile_rows<1>(x + r0 * k, buf + j * k, r_n, k, one);
                for (int r = 0; r < r_n; r++) out[r][j] = one[r][0];
            }
        }
        for (int r = 0; r < r_n; r++)
            for (int j = 0; j < cols; j++)
                store(y[(r0 + r) * ldy + j0 + j], out[r][j] + (bias ? to_float(bias[j0 + j]) : 0.0f));
    }
}

template <typename T>
void portable_gemm(const T *x, const uint8_t *w, const T *bias, T *y, int64_t rows, int64_t n, int64_t k,
                   int64_t ldy) {
    std::vector<float> xf(rows * k);
    for (int64_t i = 0; i < rows * k; i++) xf[i] = to_float(x[i]);
    const int64_t chunks = (n + PJ - 1) / PJ;
#pragma omp parallel
    {
        std::vector<float> buf(PJ * k);
#pragma omp for schedule(static)
        for (int64_t c = 0; c < chunks; c++) {
            const int cols = int(std::min<int64_t>(PJ, n - c * PJ));
            portable_columns(xf.data(), w, bias, y, rows, c * PJ, cols, k, ldy, buf.data());
        }
    }
}

#if defined(BF16_DOT)
// ---- AVX512_BF16: rows in lanes, 6-bit integers as bf16 ----
inline __m512i six_bit_table(int upper) {  // entry i: bf16 of (i + 32 upper) - 32, exact
    alignas(64) uint16_t table[32];
    for (int i = 0; i < 32; i++) table[i] = uint16_t(__builtin_bit_cast(uint32_t, float(i + 32 * upper - 32)) >> 16);
    return _mm512_load_si512(table);
}

struct Decoder {  // a super-block's 256 weights q - 32 as bf16, in Q6_K::decode's order; d * scales in fp32
    const __m512i lower = six_bit_table(0), upper = six_bit_table(1);
    const __m512i m15 = _mm512_set1_epi16(15), m48 = _mm512_set1_epi16(48);
    void operator()(const uint8_t *block, uint16_t *q, float *scale) const {
        auto words = [](const uint8_t *p) {
            return _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(p)));
        };
        auto put = [&](uint16_t *out, __m512i six) {  // 6-bit indices 0..63 -> bf16 of index - 32
            _mm512_store_si512(out, _mm512_permutex2var_epi16(lower, six, upper));
        };
        for (int half = 0; half < 2; half++, q += 128) {
            const uint8_t *ql = block + 64 * half, *qh = block + 128 + 32 * half;
            const __m512i a = words(ql), b = words(ql + 32), h = words(qh);  // weights l, l + 32 (low 4 bits)
            put(q, _mm512_or_si512(_mm512_and_si512(a, m15), _mm512_and_si512(_mm512_slli_epi16(h, 4), m48)));
            put(q + 32, _mm512_or_si512(_mm512_and_si512(b, m15), _mm512_and_si512(_mm512_slli_epi16(h, 2), m48)));
            put(q + 64, _mm512_or_si512(_mm512_srli_epi16(a, 4), _mm512_and_si512(h, m48)));
            put(q + 96, _mm512_or_si512(_mm512_srli_epi16(b, 4), _mm512_and_si512(_mm512_srli_epi16(h, 2), m48)));
        }
        const __m512 scales = _mm512_cvtepi32_ps(
            _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i *>(block + 192))));
        _mm512_store_ps(scale, _mm512_mul_ps(_mm512_set1_ps(q6k_f16(block + 208)), scales));  // exact
    }
};

// y's columns j0 .. j0 + J - 1 for rows in G groups of 16 lanes; xq: bf16dot::lane_x's layout [k / 2, G, 16, 2]
template <int J, int G>
void gemm_rows(const uint16_t *xq, const uint8_t *w, const BFloat16 *bias, BFloat16 *y, int64_t rows, int64_t j0,
               int64_t k, int64_t ldy) {
    const int64_t blocks = k / QK, row_bytes = blocks * BYTES;
    const Decoder decode;
    alignas(64) uint16_t q[J][QK];
    alignas(64) float scale[J][16];
    __m512 acc[J][G];
    for (int j = 0; j < J; j++)
        for (int g = 0; g < G; g++) acc[j][g] = _mm512_setzero_ps();
    for (int64_t b = 0; b < blocks; b++) {
        for (int j = 0; j < J; j++) decode(w + (j0 + j) * row_bytes + b * BYTES, q[j], scale[j]);
        for (int s = 0; s < 16; s++) {  // 16 weights (8 pairs) of one scale
            __m512 part[J][G];
            for (int j = 0; j < J; j++)
                for (int g = 0; g < G; g++) part[j][g] = _mm512_setzero_ps();
            const uint16_t *xs = xq + (b * QK / 2 + s * 8) * G * 32;
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++) {
                __m512bh xv[G];
                for (int g = 0; g < G; g++) xv[g] = (__m512bh)_mm512_load_si512(xs + (i * G + g) * 32);
                for (int j = 0; j < J; j++) {
                    uint32_t pair;
                    std::memcpy(&pair, &q[j][s * 16 + 2 * i], 4);
                    const __m512bh wv = (__m512bh)_mm512_set1_epi32(int(pair));
                    for (int g = 0; g < G; g++) part[j][g] = _mm512_dpbf16_ps(part[j][g], wv, xv[g]);
                }
            }
            for (int j = 0; j < J; j++) {
                const __m512 d = _mm512_set1_ps(scale[j][s]);
                for (int g = 0; g < G; g++) acc[j][g] = _mm512_fmadd_ps(d, part[j][g], acc[j][g]);
            }
        }
    }
    for (int j = 0; j < J; j++) {
        const float extra = bias ? to_float(bias[j0 + j]) : 0.0f;
        for (int g = 0; g < G; g++) {
            alignas(64) float lanes[16];
            _mm512_store_ps(lanes, acc[j][g]);
            for (int l = 0; l < 16 && g * 16 + l < rows; l++) store(y[(g * 16 + l) * ldy + j0 + j], lanes[l] + extra);
        }
    }
}

template <int J, int G>
void gemm_groups(const uint16_t *xq, const uint8_t *w, const BFloat16 *bias, BFloat16 *y, int64_t rows, int64_t n,
                 int64_t k, int64_t ldy) {
    const int64_t chunks = n / J;
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < chunks; c++) gemm_rows<J, G>(xq, w, bias, y, rows, c * J, k, ldy);
    for (int64_t j = chunks * J; j < n; j++) gemm_rows<1, G>(xq, w, bias, y, rows, j, k, ldy);
}

void bf16_gemm(const BFloat16 *x, const uint8_t *w, const BFloat16 *bias, BFloat16 *y, int64_t rows, int64_t n,
               int64_t k, int64_t ldy) {
    const int groups = int((rows + 15) / 16);  // k is a multiple of 256: both sizes multiples of 64 bytes
    uint16_t *xq = static_cast<uint16_t *>(std::aligned_alloc(64, k * groups * 16 * sizeof(uint16_t)));
    float *sq = static_cast<float *>(std::aligned_alloc(64, k / 32 * groups * 16 * sizeof(float)));  // unused
    bf16dot::lane_x(x, rows, k, groups, xq, sq);
    switch (groups) {  // J x G accumulators and J x G partial sums in registers, as bf16dot::gemm
        case 1: gemm_groups<8, 1>(xq, w, bias, y, rows, n, k, ldy); break;
        case 2: gemm_groups<4, 2>(xq, w, bias, y, rows, n, k, ldy); break;
        case 3: gemm_groups<4, 3>(xq, w, bias, y, rows, n, k, ldy); break;
        default: gemm_groups<2, 4>(xq, w, bias, y, rows, n, k, ldy); break;
    }
    std::free(xq);
    std::free(sq);
}
#endif

}  // namespace

extern "C" int quant_gemm_q6_k_max_rows() { return GEMM_MAX_ROWS; }

extern "C" void quant_gemm_q6_k_f32(const float *x, const uint8_t *w, const float *bias, float *y, int64_t rows,
                                    int64_t n, int64_t k, int64_t ldy) {
#if defined(INT8_AVX2)
    if (int8_rows.q6_k_takes(rows)) return avx2dot::gemm<QK>(x, w, bias, y, rows, n, k, ldy);
#endif
    if (rows <= GEMV_ROWS) return quant_gemv_q6_k_f32(x, w, bias, y, rows, n, k, ldy);
    portable_gemm(x, w, bias, y, rows, n, k, ldy);
}

extern "C" void quant_gemm_q6_k_bf16(const BFloat16 *x, const uint8_t *w, const BFloat16 *bias, BFloat16 *y,
                                     int64_t rows, int64_t n, int64_t k, int64_t ldy) {
#if defined(INT8_DOT)
    if (int8_rows.q6_k_takes(rows)) return q6_int8::gemm(x, w, bias, y, rows, n, k, ldy);
#elif defined(INT8_AVX2)
    if (int8_rows.q6_k_takes(rows)) return avx2dot::gemm<QK>(x, w, bias, y, rows, n, k, ldy);
#endif
#if defined(BF16_DOT)
    if (rows <= BF16_GEMV_ROWS) return quant_gemv_q6_k_bf16(x, w, bias, y, rows, n, k, ldy);
    bf16_gemm(x, w, bias, y, rows, n, k, ldy);
#else
    if (rows <= GEMV_ROWS) return quant_gemv_q6_k_bf16(x, w, bias, y, rows, n, k, ldy);
    portable_gemm(x, w, bias, y, rows, n, k, ldy);
#endif
}

// one path at any rows, for tests and benches (where GEMV_ROWS lies): the portable one whatever the build, the
// build's past-quant_gemv bf16 one (bf16 lanes or portable), the int8 one (where built; else bf16 lanes or
// portable). The first two compute the same function; int8 rounds x to 8 bits first
extern "C" void quant_gemm_q6_k_portable_bf16(const BFloat16 *x, const uint8_t *w, const BFloat16 *bias, BFloat16 *y,
                                              int64_t rows, int64_t n, int64_t k, int64_t ldy) {
    portable_gemm(x, w, bias, y, rows, n, k, ldy);
}
extern "C" void quant_gemm_q6_k_lanes_bf16(const BFloat16 *x, const uint8_t *w, const BFloat16 *bias, BFloat16 *y,
                                           int64_t rows, int64_t n, int64_t k, int64_t ldy) {
#if defined(BF16_DOT)
    bf16_gemm(x, w, bias, y, rows, n, k, ldy);
#else
    portable_gemm(x, w, bias, y, rows, n, k, ldy);
#endif
}
extern "C" void quant_gemm_q6_k_int8_bf16(const BFloat16 *x, const uint8_t *w, const BFloat16 *bias, BFloat16 *y,
                                          int64_t rows, int64_t n, int64_t k, int64_t ldy) {
#if defined(INT8_DOT)
    q6_int8::gemm(x, w, bias, y, rows, n, k, ldy);
#elif defined(INT8_AVX2)
    avx2dot::gemm<QK>(x, w, bias, y, rows, n, k, ldy);
#else
    quant_gemm_q6_k_lanes_bf16(x, w, bias, y, rows, n, k, ldy);
#endif
}

#if defined(INT8_DOT)
extern "C" int int8_dot_available() { return 1; }
#elif defined(INT8_AVX2)
extern "C" int int8_dot_available() { return 2; }  // csrc/int8_avx2.h: GGUF Q4_0 and Q6_K rows, fp32 or bf16 x
#else
extern "C" int int8_dot_available() { return 0; }
#endif
// from which rows interleaved_gemm_q4_0 and quant_gemm_q6_k_bf16 take their int8 paths (0: never; ignored
// where int8_dot_available() is 0)
extern "C" void int8_dot_set_rows(int64_t q4_0, int64_t q6_k) { int8_rows = {q4_0, q6_k}; }
extern "C" int64_t int8_dot_q4_0_rows() { return int8_rows.q4_0; }

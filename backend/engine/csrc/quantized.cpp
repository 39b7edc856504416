// GGUF-quantized weights on the CPU, kept in ggml's block layouts (ggml-quants.h): Q4_0, Q4_1, Q8_0 (32
// weights a block), Q4_K, Q6_K (256 weights a super-block) and MXFP4 (32; csrc/mxfp4.h, MoE experts only). A weight matrix [n, k] is n rows of k / QK
// blocks each. Kernels per type, for activations in fp32 or bf16:
//   quant_gemv_*:    y [rows, n] (row stride ldy) = x [rows, k] @ W^T (+ bias), for 1..MAX_ROWS rows: each
//                    block is decoded once, in registers, and multiplied into every row (the decode hot
//                    path: memory traffic is the quantized bytes)
//   quant_gemm_*:    the same for up to GEMM_MAX_ROWS rows, bf16 x and Q4_0 / Q4_1 / Q8_0 W, where the build
//                    has AVX512_BF16 (quant_gemm_max_rows() is 0 otherwise)
//   quant_dequant_*: out [n, k] = W decoded, for a GEMM by torch (prefill, large batches) or an embedding
//   moe_panels_rows_*: csrc/moe.cpp's per-expert products (moe.h) over the same column loop as quant_gemv
// Decoding computes exactly what gguf-py's dequantize_blocks computes. Products are summed in fp32 in
// vector registers: AVX-512 or AVX2+FMA when the build (-march=native) has them, plain C++ otherwise; with
// bf16 activations and AVX512_BF16, 4-bit and 8-bit blocks use the bf16 dot-product instruction on their
// integers, which are exact in bf16 (namespace bf16dot). Built and loaded by backend/engine/cpu_kernels.py.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>

#include "dtypes.h"
#include "int8_avx2.h"
#include "moe.h"
#include "mxfp4.h"
#include "q6_k.h"
#include "quantized_bf16.h"

#if defined(__F16C__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#include "quant_vec.h"

#if defined(__AVX512F__)
inline Vec vnibbles(const uint8_t *p, int shift) {  // 16 bytes -> their low (shift 0) or high nibbles
    const __m512i z = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i *>(p)));
    return _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(z, shift), _mm512_set1_epi32(15)));
}
inline Vec vint8(const int8_t *p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i *>(p))));
}
#elif defined(__AVX2__) && defined(__FMA__)
inline Vec vnibbles(const uint8_t *p, int shift) {  // 8 bytes -> their low (shift 0) or high nibbles
    const __m256i z = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i *>(p)));
    return _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(z, shift), _mm256_set1_epi32(15)));
}
inline Vec vint8(const int8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i *>(p))));
}
#else
inline Vec vnibbles(const uint8_t *p, int shift) { return float((*p >> shift) & 15); }
inline Vec vint8(const int8_t *p) { return float(*p); }
#endif

namespace {

constexpr int MAX_ROWS = 8;
constexpr int CHUNK = 32;  // weights per accumulator set: every block size is a multiple
constexpr int LANES = CHUNK / VEC_WIDTH;

inline float f16(const uint8_t *p) {  // IEEE half (little-endian) to float
    uint16_t h;
    std::memcpy(&h, p, 2);
#if defined(__F16C__)
    return _cvtsh_ss(h);  // one instruction; the same value (subnormals included)
#else
    return half_to_float(h);
#endif
}

// lanes v of a 32-weight block of nibbles: weights v * W .. v * W + W - 1 (low nibbles first)
inline Vec nibble_lane(const uint8_t *qs, int v) {
    return vnibbles(qs + (v * VEC_WIDTH) % 16, v * VEC_WIDTH >= 16 ? 4 : 0);
}

struct Q4_0 {
    static constexpr int QK = 32, BYTES = 18;
    static void vectors(const uint8_t *b, Vec *w) {
        const Vec d = vset(f16(b)), eight = vset(8.0f);
        for (int v = 0; v < LANES; v++) w[v] = d * (nibble_lane(b + 2, v) - eight);
    }
    static void decode(const uint8_t *b, float *w) {
        const float d = f16(b);
        for (int i = 0; i < 16; i++) {
            w[i] = d * float(int(b[2 + i] & 15) - 8);
            w[i + 16] = d * float(int(b[2 + i] >> 4) - 8);
        }
    }
};

struct Q4_1 {
    static constexpr int QK = 32, BYTES = 20;
    static void vectors(const uint8_t *b, Vec *w) {
        const Vec d = vset(f16(b)), m = vset(f16(b + 2));
        for (int v = 0; v < LANES; v++) w[v] = vfma(d, nibble_lane(b + 4, v), m);
    }
    static void decode(const uint8_t *b, float *w) {
        const float d = f16(b), m = f16(b + 2);
        for (int i = 0; i < 16; i++) {
            w[i] = d * float(b[4 + i] & 15) + m;
            w[i + 16] = d * float(b[4 + i] >> 4) + m;
        }
    }
};

struct Q8_0 {
    static constexpr int QK = 32, BYTES = 34;
    static void vectors(const uint8_t *b, Vec *w) {
        const Vec d = vset(f16(b));
        const int8_t *q = reinterpret_cast<const int8_t *>(b + 2);
        for (int v = 0; v < LANES; v++) w[v] = vint8(q + v * VEC_WIDTH) * d;
    }
    static void decode(const uint8_t *b, float *w) {
        const float d = f16(b);
        const int8_t *q = reinterpret_cast<const int8_t *>(b + 2);
        for (int i = 0; i < 32; i++) w[i] = float(q[i]) * d;
    }
};

struct Q4_K {  // d, dmin, 12 bytes of 6-bit scales and mins for 8 sub-blocks, 128 bytes of nibbles
    static constexpr int QK = 256, BYTES = 144;
    static void decode(const uint8_t *b, float *w) {
        const float d = f16(b), dmin = f16(b + 2);
        const uint8_t *s = b + 4, *qs = b + 16;
        for (int j = 0; j < 8; j++) {
            int sc, m;
            if (j < 4) {
                sc = s[j] & 63;
                m = s[j + 4] & 63;
            } else {
                sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
                m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
            }
            const float scale = d * float(sc), offset = dmin * float(m);
            const uint8_t *q = qs + (j / 2) * 32;
            const int shift = (j % 2) * 4;
            for (int i = 0; i < 32; i++) w[j * 32 + i] = scale * float((q[i] >> shift) & 15) - offset;
        }
    }
};

struct MXFP4 {  // csrc/mxfp4.h: e8m0 e, then 16 bytes of nibbles in Q4_0's order
    static constexpr int QK = 32, BYTES = 17;
    static void decode(const uint8_t *b, float *w) {
        const float d = mxfp4::half_scale(b[0]);
        for (int i = 0; i < 16; i++) {
            w[i] = float(mxfp4::KVALUES[b[1 + i] & 15]) * d;
            w[i + 16] = float(mxfp4::KVALUES[b[1 + i] >> 4]) * d;
        }
    }
    static void vectors(const uint8_t *b, Vec *w) {
        alignas(64) float decoded[32];
        decode(b, decoded);
        for (int v = 0; v < LANES; v++) w[v] = vload(decoded + v * VEC_WIDTH);
    }
};

// y[:, j] for R rows (R known at compile time, so the R x LANES accumulators live in registers)
template <typename B, int R, typename T>
inline void gemv_column(const float *x, const uint8_t *w, const T *bias, T *y, int64_t j, int64_t k, int64_t ldy) {
    const int64_t blocks = k / B::QK, row_bytes = blocks * B::BYTES;
    alignas(64) float decoded[B::QK];
    Vec acc[R][LANES];
    for (int r = 0; r < R; r++)
        for (int v = 0; v < LANES; v++) acc[r][v] = vzero();
    const uint8_t *row = w + j * row_bytes;
    for (int64_t b = 0; b < blocks; b++) {
        if constexpr (B::QK == CHUNK) {  // decoded in registers
            Vec wv[LANES];
            B::vectors(row + b * B::BYTES, wv);
            for (int r = 0; r < R; r++) {
                const float *xr = x + r * k + b * CHUNK;
                for (int v = 0; v < LANES; v++) acc[r][v] = vfma(wv[v], vload(xr + v * VEC_WIDTH), acc[r][v]);
            }
            continue;
        }
        B::decode(row + b * B::BYTES, decoded);
        for (int c = 0; c < B::QK; c += CHUNK) {
            for (int r = 0; r < R; r++) {
                const float *xr = x + r * k + b * B::QK + c;
                for (int v = 0; v < LANES; v++)
                    acc[r][v] = vfma(vload(decoded + c + v * VEC_WIDTH), vload(xr + v * VEC_WIDTH), acc[r][v]);
            }
        }
    }
    const float extra = bias ? to_float(bias[j]) : 0.0f;
    for (int r = 0; r < R; r++) {
        float sum = 0.0f;
        for (int v = 0; v < LANES; v++) sum += vsum(acc[r][v]);
        store(y[r * ldy + j], sum + extra);
    }
}

template <typename B, int R, typename T>
void gemv_rows(const float *x, const uint8_t *w, const T *bias, T *y, int64_t n, int64_t k, int64_t ldy) {
#pragma omp parallel for schedule(static)
    for (int64_t j = 0; j < n; j++) gemv_column<B, R>(x, w, bias, y, j, k, ldy);
}

template <typename B, typename T>
void gemv(const T *x, const uint8_t *w, const T *bias, T *y, int64_t rows, int64_t n, int64_t k, int64_t ldy) {
#if defined(INT8_AVX2)
    if constexpr (std::is_same_v<B, Q4_0>)
        if (int8_rows.q4_0_takes(rows)) return avx2dot::gemm<32>(x, w, bias, y, rows, n, k, ldy);
#endif
#if defined(BF16_DOT)
    if constexpr (std::is_same_v<T, BFloat16> && std::is_same_v<B, Q4_0>)
        return bf16dot::gemv<bf16dot::Q4_0, MAX_ROWS>(x, w, bias, y, rows, n, k, ldy);
    if constexpr (std::is_same_v<T, BFloat16> && std::is_same_v<B, Q4_1>)
        return bf16dot::gemv<bf16dot::Q4_1, MAX_ROWS>(x, w, bias, y, rows, n, k, ldy);
#endif
    std::vector<float> xf(rows * k);
    for (int64_t i = 0; i < rows * k; i++) xf[i] = to_float(x[i]);
    const float *xp = xf.data();
    with_rows<MAX_ROWS>(rows, [&](auto r) {
        gemv_rows<B, decltype(r)::value>(xp, w, bias, y, n, k, ldy);
    });
}

template <typename B, typename T>
void dequant_row(const uint8_t *row, T *out, int64_t blocks) {  // one row of W's blocks into out [blocks * QK]
    alignas(64) float decoded[B::QK];
    for (int64_t b = 0; b < blocks; b++) {
        const uint8_t *block = row + b * B::BYTES;
        T *o = out + b * B::QK;
        if constexpr (B::QK == CHUNK) {  // decoded in registers
            Vec wv[LANES];
            B::vectors(block, wv);
#if defined(BF16_DOT)
            if constexpr (std::is_same_v<T, BFloat16>) {  // rounded to nearest even, as store() rounds
                _mm512_storeu_si512(o, (__m512i)_mm512_cvtne2ps_pbh(wv[1], wv[0]));
                continue;
            }
#endif
            if constexpr (std::is_same_v<T, float>) {
                for (int v = 0; v < LANES; v++) vstore(o + v * VEC_WIDTH, wv[v]);
                continue;
            }
            for (int v = 0; v < LANES; v++) vstore(decoded + v * VEC_WIDTH, wv[v]);
        } else {
            B::decode(block, decoded);
        }
        for (int i = 0; i < B::QK; i++) store(o[i], decoded[i]);
    }
}

template <typename B, typename T>
void dequant(const uint8_t *w, T *out, int64_t n, int64_t k) {
#if defined(BF16_DOT)
    if constexpr (std::is_same_v<T, BFloat16> && std::is_same_v<B, Q4_0>)
        return bf16dot::dequant<bf16dot::Q4_0>(w, out, n, k);
    if constexpr (std::is_same_v<T, BFloat16> && std::is_same_v<B, Q4_1>)
        return bf16dot::dequant<bf16dot::Q4_1>(w, out, n, k);
#endif
    const int64_t blocks = k / B::QK, row_bytes = blocks * B::BYTES;
#pragma omp parallel for schedule(static) if (n > 1)
    for (int64_t j = 0; j < n; j++) dequant_row<B>(w + j * row_bytes, out + j * k, blocks);
}

// panels [first, last) of one expert's product for csrc/moe.cpp (inside its OpenMP region): its rows
// widened to fp32, then MAX_ROWS rows at a time, as gemv
template <typename B, typename T>
void moe_panels(const moe::ExpertGemm &e, int64_t first, int64_t last) {
#if defined(INT8_AVX2)  // csrc/int8_avx2.h: x quantized per call (each thread its own copy: rows x k bytes)
    constexpr bool q4_0 = std::is_same_v<B, Q4_0>, q6_k = std::is_same_v<B, Q6_K>;
    if constexpr (q4_0 || q6_k)
        if (q4_0 ? int8_rows.q4_0_takes(e.rows) : int8_rows.q6_k_takes(e.rows)) {
            const avx2dot::X a = avx2dot::quantize(static_cast<const T *>(e.x), e.rows, e.k, B::QK);
            avx2dot::columns<B::QK>(a, e.w, static_cast<const T *>(e.bias), static_cast<T *>(e.y),
                                    first * moe::PANEL, std::min(e.n, last * moe::PANEL), e.ldy);
            return;
        }
#endif
    std::vector<float> xf(e.rows * e.k);
    for (int64_t i = 0; i < int64_t(xf.size()); i++) xf[i] = to_float(static_cast<const T *>(e.x)[i]);
    const int64_t end = std::min(e.n, last * moe::PANEL);
    for (int64_t row = 0; row < e.rows; row += MAX_ROWS) {
        T *y = static_cast<T *>(e.y) + row * e.ldy;
        with_rows<MAX_ROWS>(e.rows - row, [&](auto r) {
            for (int64_t j = first * moe::PANEL; j < end; j++)
                gemv_column<B, decltype(r)::value>(xf.data() + row * e.k, e.w, static_cast<const T *>(e.bias), y, j,
                                                   e.k, e.ldy);
        });
    }
}

}  // namespace

#define EXPORT(TYPE, NAME, T, SUFFIX)                                                                       \
    extern "C" void quant_gemv_##NAME##_##SUFFIX(const T *x, const uint8_t *w, const T *bias, T *y,        \
                                                 int64_t rows, int64_t n, int64_t k, int64_t ldy) {         \
        gemv<TYPE>(x, w, bias, y, rows, n, k, ldy);                                                          \
    }                                                                                                        \
    extern "C" void quant_dequant_##NAME##_##SUFFIX(const uint8_t *w, T *out, int64_t n, int64_t k) {     \
        dequant<TYPE>(w, out, n, k);                                                                         \
    }                                                                                                        \
    extern "C" void moe_panels_rows_##NAME##_##SUFFIX(const moe::ExpertGemm &e, int64_t first, int64_t last) { \
        moe_panels<TYPE, T>(e, first, last);                                                                 \
    }
#define EXPORT_TYPE(TYPE, NAME) \
    EXPORT(TYPE, NAME, float, f32) \
    EXPORT(TYPE, NAME, BFloat16, bf16)

EXPORT_TYPE(Q4_0, q4_0)
EXPORT_TYPE(Q4_1, q4_1)
EXPORT_TYPE(Q8_0, q8_0)
EXPORT_TYPE(Q4_K, q4_k)
EXPORT_TYPE(Q6_K, q6_k)
EXPORT_TYPE(MXFP4, mxfp4)

extern "C" int quant_vector_width() { return VEC_WIDTH; }

// y [rows, n] (row stride ldy) = x [rows, k] @ W^T (+ bias) for QUANT_GEMV_MAX_ROWS < rows <= quant_gemm_max_rows(),
// bf16 x, Q4_0, Q4_1 or Q8_0 W; only where the build has AVX512_BF16 (quant_gemm_max_rows() is 0 otherwise)
#if defined(BF16_DOT)
extern "C" int quant_gemm_max_rows() { return bf16dot::GEMM_MAX_ROWS; }
extern "C" void quant_gemm_q4_0_bf16(const BFloat16 *x, const uint8_t *w, const BFloat16 *bias, BFloat16 *y,
                                     int64_t rows, int64_t n, int64_t k, int64_t ldy) {
    bf16dot::gemm<bf16dot::Q4_0>(x, w, bias, y, rows, n, k, ldy);
}
extern "C" void quant_gemm_q8_0_bf16(const BFloat16 *x, const uint8_t *w, const BFloat16 *bias, BFloat16 *y,
                                     int64_t rows, int64_t n, int64_t k, int64_t ldy) {
    bf16dot::gemm<bf16dot::Q8_0>(x, w, bias, y, rows, n, k, ldy);
}
extern "C" void quant_gemm_q4_1_bf16(const BFloat16 *x, const uint8_t *w, const BFloat16 *bias, BFloat16 *y,
                                     int64_t rows, int64_t n, int64_t k, int64_t ldy) {
    bf16dot::gemm<bf16dot::Q4_1>(x, w, bias, y, rows, n, k, ldy);
}
#else
extern "C" int quant_gemm_max_rows() { return 0; }
#endif

// Q4_0 up to Int8Rows::MAX_ROWS rows with int8 activations where the build has AVX2 and not AVX-512
// (csrc/int8_avx2.h), fp32 or bf16 x; rows outside int8_rows' range: quant_gemv, 8 rows a call
#if defined(INT8_AVX2)
template <typename T>
void avx2_gemm_q4_0(const T *x, const uint8_t *w, const T *bias, T *y, int64_t rows, int64_t n, int64_t k,
                    int64_t ldy) {
    if (int8_rows.q4_0_takes(rows)) return avx2dot::gemm<32>(x, w, bias, y, rows, n, k, ldy);
    for (int64_t row = 0; row < rows; row += MAX_ROWS)
        gemv<Q4_0>(x + row * k, w, bias, y + row * ldy, std::min<int64_t>(MAX_ROWS, rows - row), n, k, ldy);
}
extern "C" void quant_gemm_q4_0_f32(const float *x, const uint8_t *w, const float *bias, float *y, int64_t rows,
                                    int64_t n, int64_t k, int64_t ldy) {
    avx2_gemm_q4_0(x, w, bias, y, rows, n, k, ldy);
}
extern "C" void quant_gemm_q4_0_bf16(const BFloat16 *x, const uint8_t *w, const BFloat16 *bias, BFloat16 *y,
                                     int64_t rows, int64_t n, int64_t k, int64_t ldy) {
    avx2_gemm_q4_0(x, w, bias, y, rows, n, k, ldy);
}
#endif

// GGUF Q4_0 in 8-column tiles (csrc/int8_avx2.h; quantization/column_tiles.py), where the build has AVX2
// and not AVX-512: q4_0x8_gemm, up to Int8Rows::MAX_ROWS rows; q4_0x8_dequant, out [n, k] = W decoded as
// quant_dequant_q4_0 decodes it (torch's GEMM past those rows); moe_panels_tiles_q4_0, MoE experts
// (csrc/moe.h). Rows in int8_rows' Q4_0 range take the tiles' int8 kernel, others (the int8 paths set off,
// a long prefill's tokens routed to one expert) the exact function: each group of 8 columns moved back to
// GGUF blocks once and multiplied as quant_gemv multiplies the blocks as stored. n a multiple of 8.
#if defined(INT8_AVX2)
extern "C" int q4_0x8_available() { return 1; }

// columns [first, end) (first a multiple of 8) of y = x @ W^T (+ bias), x quantized as a
template <typename T>
void tiles_int8(const avx2dot::X &a, const uint8_t *w, const T *bias, T *y, int64_t first, int64_t end, int64_t ldy) {
    for (int64_t j = first; j < end; j += avx2dot::TILE_COLUMNS) {
        const uint8_t *group = w + j / avx2dot::TILE_COLUMNS * a.blocks * avx2dot::TILE_BYTES;
        auto load = [&](int64_t b, avx2dot::Q4Tile &t) { avx2dot::tile_load(group + b * avx2dot::TILE_BYTES, t); };
        avx2dot::tile_columns(a, load, bias, y, j, end, ldy);
    }
}

// the same exactly, from x widened to fp32 (xf [rows, k])
template <typename T>
void tiles_exact(const float *xf, const uint8_t *w, const T *bias, T *y, int64_t rows, int64_t k, int64_t first,
                 int64_t end, int64_t ldy) {
    const int64_t blocks = k / 32;
    std::vector<uint8_t> stored(avx2dot::TILE_COLUMNS * blocks * Q4_0::BYTES);
    for (int64_t j = first; j < end; j += avx2dot::TILE_COLUMNS) {
        avx2dot::untile(w + j / avx2dot::TILE_COLUMNS * blocks * avx2dot::TILE_BYTES, stored.data(), blocks);
        const int64_t columns = std::min<int64_t>(avx2dot::TILE_COLUMNS, end - j);
        for (int64_t row = 0; row < rows; row += MAX_ROWS)
            with_rows<MAX_ROWS>(rows - row, [&](auto r) {
                for (int64_t c = 0; c < columns; c++)
                    gemv_column<Q4_0, decltype(r)::value>(xf + row * k, stored.data(), bias ? bias + j : nullptr,
                                                         y + row * ldy + j, c, k, ldy);
            });
    }
}

template <typename T>
std::vector<float> widened(const T *x, int64_t count) {
    std::vector<float> xf(count);
    for (int64_t i = 0; i < count; i++) xf[i] = to_float(x[i]);
    return xf;
}

template <typename T>
void q4_0x8_gemm(const T *x, const uint8_t *w, const T *bias, T *y, int64_t rows, int64_t n, int64_t k, int64_t ldy) {
    constexpr int64_t G = avx2dot::TILE_COLUMNS;
    if (int8_rows.q4_0_takes(rows)) {
        const avx2dot::X a = avx2dot::quantize(x, rows, k, 32);
#pragma omp parallel for schedule(static)
        for (int64_t j = 0; j < n; j += G) tiles_int8(a, w, bias, y, j, j + G, ldy);
        return;
    }
    const std::vector<float> xf = widened(x, rows * k);
#pragma omp parallel for schedule(static)
    for (int64_t j = 0; j < n; j += G) tiles_exact(xf.data(), w, bias, y, rows, k, j, j + G, ldy);
}

template <typename T>
void q4_0x8_dequant(const uint8_t *w, T *out, int64_t n, int64_t k) {
    const int64_t blocks = k / 32;
#pragma omp parallel for schedule(static)
    for (int64_t g = 0; g < n / avx2dot::TILE_COLUMNS; g++) {
        std::vector<uint8_t> rows(avx2dot::TILE_COLUMNS * blocks * Q4_0::BYTES);
        avx2dot::untile(w + g * blocks * avx2dot::TILE_BYTES, rows.data(), blocks);
        for (int c = 0; c < avx2dot::TILE_COLUMNS; c++)
            dequant_row<Q4_0>(rows.data() + c * blocks * Q4_0::BYTES, out + (g * avx2dot::TILE_COLUMNS + c) * k, blocks);
    }
}

// panels [first, last) of one expert's product (inside csrc/moe.cpp's OpenMP region)
template <typename T>
void moe_panels_tiles(const moe::ExpertGemm &e, int64_t first, int64_t last) {
    const T *x = static_cast<const T *>(e.x), *bias = static_cast<const T *>(e.bias);
    T *y = static_cast<T *>(e.y);
    const int64_t end = std::min(e.n, last * moe::PANEL);
    if (int8_rows.q4_0_takes(e.rows))
        return tiles_int8(avx2dot::quantize(x, e.rows, e.k, 32), e.w, bias, y, first * moe::PANEL, end, e.ldy);
    tiles_exact(widened(x, e.rows * e.k).data(), e.w, bias, y, e.rows, e.k, first * moe::PANEL, end, e.ldy);
}
#define EXPORT_TILES(T, SUFFIX)                                                                              \
    extern "C" void q4_0x8_gemm_##SUFFIX(const T *x, const uint8_t *w, const T *bias, T *y, int64_t rows,    \
                                         int64_t n, int64_t k, int64_t ldy) {                                \
        q4_0x8_gemm(x, w, bias, y, rows, n, k, ldy);                                                         \
    }                                                                                                        \
    extern "C" void q4_0x8_dequant_##SUFFIX(const uint8_t *w, T *out, int64_t n, int64_t k) {                 \
        q4_0x8_dequant(w, out, n, k);                                                                        \
    }                                                                                                        \
    extern "C" void moe_panels_tiles_q4_0_##SUFFIX(const moe::ExpertGemm &e, int64_t first, int64_t last) {   \
        moe_panels_tiles<T>(e, first, last);                                                                 \
    }
EXPORT_TILES(float, f32)
EXPORT_TILES(BFloat16, bf16)
#else
extern "C" int q4_0x8_available() { return 0; }
#endif

// quant_gemm_q6_k's int8 path (csrc/int8_dot.h; included by csrc/q6_k_gemm.cpp): x's rows quantized once
// per call per super-block of 256 (llama.cpp's Q8_K: one fp32 d a row and super-block, the sums of each 16
// q), laid out with rows in vector lanes (xq [blocks, 64 quads, G, 16 rows, 4 bytes]). Each super-block of
// J output columns is decoded once to its unsigned 6-bit integers (0..63, in k order) and 16 fp32 scales
// d * scales[s] in an L1 buffer; per 16-weight sub-block, 4 VPDPBUSD multiply a broadcast quad of weights
// into 16 rows, starting from -32 times the rows' sums of that sub-block (the stored offset), and the int32
// sums are scaled into fp32 per sub-block, then by the rows' d per super-block:
//   y = sum_b d_x,b * sum_s (d * scales[s]) * sum_i (u_i - 32) q_i
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "int8_dot.h"
#include "q6_k.h"

#if defined(INT8_DOT)
namespace q6_int8 {

constexpr int QK = Q6_K::QK, BYTES = Q6_K::BYTES;

struct Activations {  // x quantized, rows in lanes (rows past the call's: zero)
    int8_t *q;      // [blocks, 64, groups, 16, 4]
    int32_t *corr;  // [blocks, 16, groups, 16]: -32 * the sum of each sub-block's q
    float *d;       // [blocks, groups, 16]
    int64_t groups;
};

template <typename T>
Activations quantize(const T *x, int64_t rows, int64_t k) {
    const int64_t blocks = k / QK, groups = (rows + 15) / 16;
    Activations a{static_cast<int8_t *>(std::aligned_alloc(64, blocks * 64 * groups * 64)),
                  static_cast<int32_t *>(std::aligned_alloc(64, blocks * 16 * groups * 64)),
                  static_cast<float *>(std::aligned_alloc(64, blocks * groups * 64)), groups};
    std::memset(a.q, 0, blocks * 64 * groups * 64);
    std::memset(a.corr, 0, blocks * 16 * groups * 64);
    std::memset(a.d, 0, blocks * groups * 64);
    alignas(64) int8_t q[QK];
    int32_t sums[16];
    for (int64_t r = 0; r < rows; r++) {
        const int64_t g = r / 16, l = r % 16;
        for (int64_t b = 0; b < blocks; b++) {
            a.d[(b * groups + g) * 16 + l] = int8dot::quantize_block(x + r * k + b * QK, QK, q, sums);
            for (int s = 0; s < 16; s++) a.corr[((b * 16 + s) * groups + g) * 16 + l] = -32 * sums[s];
            for (int t = 0; t < 64; t++) std::memcpy(a.q + ((b * 64 + t) * groups + g) * 64 + l * 4, q + 4 * t, 4);
        }
    }
    return a;
}

inline void release(Activations &a) {
    std::free(a.q);
    std::free(a.corr);
    std::free(a.d);
}

// a super-block's 256 weights as unsigned 6-bit integers in k order, 64 a vector (u[v]: weights 64 v ..
// 64 v + 63), and its 16 scales d * scales[s] (exact) as the return value
inline __m512 decode_vectors(const uint8_t *block, __m512i u[4]) {
    const __m512i m0f = _mm512_set1_epi8(15), m30 = _mm512_set1_epi8(48);
    // qh's 32 bytes twice: weights l and l + 32 take bits 0-1 and 2-3 (moved to bits 4-5: << 4, << 2),
    // weights l + 64 and l + 96 bits 4-5 and 6-7 (>> 0, >> 2); shifts of 16-bit lanes, then masked per byte
    const long long by2 = 0x0002000200020002LL, by4 = 0x0004000400040004LL;
    const __m512i up = _mm512_set_epi64(by2, by2, by2, by2, by4, by4, by4, by4);
    const __m512i down = _mm512_set_epi64(by2, by2, by2, by2, 0, 0, 0, 0);
    for (int half = 0; half < 2; half++) {
        const __m512i ql = _mm512_loadu_si512(block + 64 * half);  // low nibbles: l, l + 32; high: + 64
        const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(block + 128 + 32 * half)));
        const __m512i low = _mm512_and_si512(_mm512_sllv_epi16(qh, up), m30);
        const __m512i high = _mm512_and_si512(_mm512_srlv_epi16(qh, down), m30);
        u[2 * half] = _mm512_ternarylogic_epi32(ql, m0f, low, 0xEA);  // (a & b) | c
        u[2 * half + 1] = _mm512_ternarylogic_epi32(_mm512_srli_epi16(ql, 4), m0f, high, 0xEA);
    }
    const __m512 scales = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i *>(block + 192))));
    return _mm512_mul_ps(_mm512_set1_ps(q6k_f16(block + 208)), scales);
}

// the same, into an L1 buffer: u [256], scale [16]
inline void decode(const uint8_t *block, uint8_t *u, float *scale) {
    __m512i v[4];
    _mm512_store_ps(scale, decode_vectors(block, v));
    for (int i = 0; i < 4; i++) _mm512_store_si512(u + 64 * i, v[i]);
}

// y's columns j0 .. j0 + J - 1 for rows of lane groups g0 .. g0 + G - 1
template <int J, int G, typename T>
void columns(const Activations &a, const uint8_t *w, const T *bias, T *y, int64_t rows, int64_t j0, int64_t g0,
             int64_t k, int64_t ldy) {
    const int64_t blocks = k / QK, row_bytes = blocks * BYTES, groups = a.groups;
    alignas(64) uint8_t u[J][QK];
    alignas(64) float scale[J][16];
    __m512 acc[J][G];
    for (int j = 0; j < J; j++)
        for (int g = 0; g < G; g++) acc[j][g] = _mm512_setzero_ps();
    for (int64_t b = 0; b < blocks; b++) {
        for (int j = 0; j < J; j++) {
            const uint8_t *block = w + (j0 + j) * row_bytes + b * BYTES;
            for (int line = 0; line < BYTES; line += 64)  // the next J columns' super-block (the stream)
                _mm_prefetch(reinterpret_cast<const char *>(block + J * row_bytes + line), _MM_HINT_T0);
            decode(block, u[j], scale[j]);
        }
        __m512 part[J][G];
        for (int j = 0; j < J; j++)
            for (int g = 0; g < G; g++) part[j][g] = _mm512_setzero_ps();
        for (int s = 0; s < 16; s++) {
            __m512i xv[G][4], corr[G];
            for (int g = 0; g < G; g++) {
                corr[g] = _mm512_load_si512(a.corr + ((b * 16 + s) * groups + g0 + g) * 16);
                for (int i = 0; i < 4; i++) xv[g][i] = _mm512_load_si512(a.q + ((b * 64 + 4 * s + i) * groups + g0 + g) * 64);
            }
            for (int j = 0; j < J; j++) {
                const __m512 sc = _mm512_set1_ps(scale[j][s]);
                for (int g = 0; g < G; g++) {
                    __m512i sum = corr[g];
                    for (int i = 0; i < 4; i++)
                        sum = _mm512_dpbusd_epi32(sum, _mm512_set1_epi32(int(int8dot::u32(u[j] + 16 * s + 4 * i))), xv[g][i]);
                    part[j][g] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), sc, part[j][g]);
                }
            }
        }
        for (int g = 0; g < G; g++) {
            const __m512 d = _mm512_load_ps(a.d + (b * groups + g0 + g) * 16);
            for (int j = 0; j < J; j++) acc[j][g] = _mm512_fmadd_ps(part[j][g], d, acc[j][g]);
        }
    }
    for (int j = 0; j < J; j++) {
        const float extra = bias ? to_float(bias[j0 + j]) : 0.0f;
        for (int g = 0; g < G; g++) {
            alignas(64) float lanes[16];
            _mm512_store_ps(lanes, acc[j][g]);
            for (int64_t l = 0, r = (g0 + g) * 16; l < 16 && r < rows; l++, r++) store(y[r * ldy + j0 + j], lanes[l] + extra);
        }
    }
}

// all rows of columns j0 .. j0 + J - 1: lane groups two at a time (J x 2 sums and partial sums in registers)
template <int J, typename T>
void column_rows(const Activations &a, const uint8_t *w, const T *bias, T *y, int64_t rows, int64_t j0, int64_t k,
                 int64_t ldy) {
    for (int64_t g0 = 0; g0 < a.groups; g0 += 2) {
        if (a.groups - g0 >= 2)
            columns<J, 2>(a, w, bias, y, rows, j0, g0, k, ldy);
        else
            columns<J, 1>(a, w, bias, y, rows, j0, g0, k, ldy);
    }
}

// One row of x (a batch-1 decode step's lm_head), where 15 of the 16 lanes above would idle: the weights in
// lanes instead. x is quantized per super-block in k order (Q8_K); each column's super-block decodes in
// registers (decode_vectors), 4 VPDPBUSD against x start from -32 times each lane's 4 q (the stored offset),
// and lane i of vector v, sub-block 4 v + i / 4, is scaled by that sub-block's d * scales[s] times x's d.
struct Row {
    std::vector<int8_t> q;      // [blocks, 256]
    std::vector<__m512i> corr;  // [blocks, 4]: -32 * each lane's sum of 4 q
    std::vector<float> d;       // [blocks]
};

template <typename T>
Row quantize_row(const T *x, int64_t k) {
    const int64_t blocks = k / QK;
    Row r{std::vector<int8_t>(blocks * QK), std::vector<__m512i>(blocks * 4), std::vector<float>(blocks)};
    const __m512i offset = _mm512_set1_epi8(32);
    for (int64_t b = 0; b < blocks; b++) {
        r.d[b] = int8dot::quantize_block(x + b * QK, QK, r.q.data() + b * QK, nullptr);
        for (int v = 0; v < 4; v++) {
            const __m512i q = _mm512_loadu_si512(r.q.data() + b * QK + 64 * v);
            r.corr[b * 4 + v] = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), offset, q));
        }
    }
    return r;
}

inline float row_dot(const Row &x, const uint8_t *w, int64_t blocks, int64_t row_bytes) {
    __m512i lanes[4];  // lane i of vector v: sub-block 4 v + i / 4
    for (int v = 0; v < 4; v++)
        lanes[v] = _mm512_set_epi32(4 * v + 3, 4 * v + 3, 4 * v + 3, 4 * v + 3, 4 * v + 2, 4 * v + 2, 4 * v + 2, 4 * v + 2,
                                    4 * v + 1, 4 * v + 1, 4 * v + 1, 4 * v + 1, 4 * v, 4 * v, 4 * v, 4 * v);
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int64_t b = 0; b < blocks; b++) {
        const uint8_t *block = w + b * BYTES;
        for (int line = 0; line < BYTES; line += 64)  // four columns ahead (the stream)
            _mm_prefetch(reinterpret_cast<const char *>(block + 4 * row_bytes + line), _MM_HINT_T0);
        __m512i u[4];
        const __m512 scale = _mm512_mul_ps(decode_vectors(block, u), _mm512_set1_ps(x.d[b]));
        for (int v = 0; v < 4; v++) {
            const __m512i q = _mm512_loadu_si512(x.q.data() + b * QK + 64 * v);
            const __m512i sum = _mm512_dpbusd_epi32(x.corr[b * 4 + v], u[v], q);
            acc[v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_permutexvar_ps(lanes[v], scale), acc[v]);
        }
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
}

template <typename T>
void gemv_row(const T *x, const uint8_t *w, const T *bias, T *y, int64_t n, int64_t k) {
    const Row row = quantize_row(x, k);
    const int64_t blocks = k / QK, row_bytes = blocks * BYTES;
#pragma omp parallel for schedule(static)
    for (int64_t j = 0; j < n; j++) {
        const float extra = bias ? to_float(bias[j]) : 0.0f;
        store(y[j], row_dot(row, w + j * row_bytes, blocks, row_bytes) + extra);
    }
}

template <typename T>
void gemm(const T *x, const uint8_t *w, const T *bias, T *y, int64_t rows, int64_t n, int64_t k, int64_t ldy) {
    if (rows == 1) return gemv_row(x, w, bias, y, n, k);
    Activations a = quantize(x, rows, k);
    constexpr int J = 8;  // columns a tile: 1.4x 4 on the lm_head (16 rows, an EPYC), 8 x 2 sums and partial sums
    const int64_t chunks = n / J;
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < chunks; c++) column_rows<J>(a, w, bias, y, rows, c * J, k, ldy);
    for (int64_t j = chunks * J; j < n; j++) column_rows<1>(a, w, bias, y, rows, j, k, ldy);
    release(a);
}

}  // namespace q6_int8
#endif

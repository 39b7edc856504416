// Packed-integer (GPTQ, AWQ, compressed-tensors pack-quantized W4A16 / W8A16) and fp8 (e4m3) weights on the
// CPU, in the row layout backend/engine/quantization/row_packed.py re-lays every such checkpoint into at
// load (the same bytes): output row j holds its k weights in 32-weight chunks, 4-bit as 16 bytes (byte i:
// weight i in the low nibble, weight i + 16 in the high one, ggml's order), 8-bit and fp8 as 32 bytes.
// W[j, i] = s(j, g) * (q[j, i] - z(j, g)) with g = i / group_size (fp8: q the e4m3 value, z = 0), s read
// from the checkpoint's scales and z from its packed zeros (or a constant) through PackedLayout's strides;
// input columns may be permuted (act-order: x[perm[i]] meets the weight stored at i). A chunk's weights are
// decoded to fp32 exactly as the PyTorch reference computes them ((q - z) in integers, times s once), so
// only the order of the fp32 sums differs from a product with the dequantized weights.
//   packed_gemv_*:    y [rows, n] (row stride ldy) = x [rows, k] @ W^T (+ bias) for 1..MAX_ROWS rows, each
//                     chunk decoded once and multiplied into every row (the decode hot path)
//   packed_dequant_*: rows first..last-1 of W into out [last - first, k] (tiles for torch's GEMM)
// Vectors are AVX-512, AVX2+FMA or plain C++ by the build's -march (quant_vec.h). Where the build has
// AVX512_BF16, 4-bit weights times bf16 x run on the bf16 dot-product instruction (VDPBF16PS) instead: per
// group a 16-entry table of the exact bf16 integers q - z (VPERMW looks each nibble up), the products
// (q - z) x exact in fp32, summed in fp32 and scaled by s once per group (as the GGUF kernels do in
// quantized_bf16.h). Built and loaded by backend/engine/cpu_kernels.py.
#include <cstdint>
#include <type_traits>
#include <vector>

#include "dtypes.h"
#include "quant_vec.h"

struct PackedLayout {  // row_packed.py's Layout (a ctypes Structure) mirrors it field by field
    int64_t n, k, group_size;                        // k and group_size multiples of 32
    int64_t scale_row, scale_group, scale_dtype;     // s(j, g) = scales[j * scale_row + g * scale_group]
    int64_t zero_pack, zero_group, zero_add, zero_const;  // z(j, g): see zero_at
};

namespace {

constexpr int MAX_ROWS = 8;
constexpr int CHUNK = 32;
constexpr int LANES = CHUNK / VEC_WIDTH;
enum ScaleType { FP16 = 0, BF16 = 1, FP32 = 2 };

inline float scale_at(const void *scales, int64_t i, int64_t type) {
    if (type == FP16) return half_to_float(static_cast<const uint16_t *>(scales)[i]);
    if (type == BF16) return to_float(static_cast<const BFloat16 *>(scales)[i]);
    return static_cast<const float *>(scales)[i];
}

// z(j, g): BITS-bit fields packed along output rows, 32 / BITS per int32 (field j % f of
// zeros[(j / f) * zero_pack + g * zero_group]), plus zero_add (GPTQ stores zero - 1); zero_const without zeros
template <int BITS>
inline int32_t zero_at(const int32_t *zeros, const PackedLayout &l, int64_t j, int64_t g) {
    if (zeros == nullptr) return int32_t(l.zero_const);
    constexpr int F = 32 / BITS;
    const uint32_t packed = uint32_t(zeros[(j / F) * l.zero_pack + g * l.zero_group]);
    return int32_t((packed >> (BITS * (j % F))) & ((1u << BITS) - 1)) + int32_t(l.zero_add);
}

struct W4 {
    static constexpr int BITS = 4, BYTES = 16;  // bytes per 32-weight chunk
    static void decode(const uint8_t *b, int32_t z, float s, float *w) {
#pragma omp simd
        for (int i = 0; i < 16; i++) {
            w[i] = float(int32_t(b[i] & 15) - z) * s;
            w[i + 16] = float(int32_t(b[i] >> 4) - z) * s;
        }
    }
};

struct W8 {
    static constexpr int BITS = 8, BYTES = 32;
    static void decode(const uint8_t *b, int32_t z, float s, float *w) {
#pragma omp simd
        for (int i = 0; i < 32; i++) w[i] = float(int32_t(b[i]) - z) * s;
    }
};

struct FP8 {  // e4m3 (torch.float8_e4m3fn): every code exact in fp32 (dtypes.h), then times s
    static constexpr int BITS = 8, BYTES = 32;
    static void decode(const uint8_t *b, int32_t, float s, float *w) {
#pragma omp simd
        for (int i = 0; i < 32; i++) w[i] = fp8_to_float<3, 7>(b[i]) * s;
    }
};

template <typename D, int R, typename T>
void gemv_rows(const float *x, const uint8_t *q, const void *scales, const int32_t *zeros, const T *bias, T *y,
               int64_t ldy, const PackedLayout &l) {
    const int64_t k = l.k, row_bytes = k / CHUNK * D::BYTES, groups = k / l.group_size;
    const int64_t per_group = l.group_size / CHUNK;
#pragma omp parallel for schedule(static)
    for (int64_t j = 0; j < l.n; j++) {
        Vec acc[R][LANES];
        for (int r = 0; r < R; r++)
            for (int v = 0; v < LANES; v++) acc[r][v] = vzero();
        const uint8_t *row = q + j * row_bytes;
        for (int64_t g = 0; g < groups; g++) {
            const float s = scale_at(scales, j * l.scale_row + g * l.scale_group, l.scale_dtype);
            const int32_t z = zero_at<D::BITS>(zeros, l, j, g);
            for (int64_t c = g * per_group; c < (g + 1) * per_group; c++) {
                alignas(64) float w[CHUNK];
                D::decode(row + c * D::BYTES, z, s, w);
                Vec wv[LANES];
                for (int v = 0; v < LANES; v++) wv[v] = vload(w + v * VEC_WIDTH);
                for (int r = 0; r < R; r++) {
                    const float *xr = x + r * k + c * CHUNK;
                    for (int v = 0; v < LANES; v++) acc[r][v] = vfma(wv[v], vload(xr + v * VEC_WIDTH), acc[r][v]);
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
}

#if defined(__AVX512BF16__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define PACKED_BF16_DOT 1
// y = x @ W^T for 4-bit W and bf16 x (x's columns already in the weights' order)
template <int R>
void gemv_w4_bf16(const BFloat16 *x, const uint8_t *q, const void *scales, const int32_t *zeros,
                  const BFloat16 *bias, BFloat16 *y, int64_t ldy, const PackedLayout &l) {
    const int64_t k = l.k, row_bytes = k / 2, groups = k / l.group_size, per_group = l.group_size / CHUNK;
    const __m512i shifts = _mm512_set_epi16(4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 0, 0, 0, 0, 0, 0, 0, 0,
                                            0, 0, 0, 0, 0, 0, 0, 0);
    const __m512i low = _mm512_set1_epi16(15);
    const __m512 iota = _mm512_set_ps(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
#pragma omp parallel for schedule(static)
    for (int64_t j = 0; j < l.n; j++) {
        __m512 acc[R];
        for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
        const uint8_t *row = q + j * row_bytes;
        for (int64_t g = 0; g < groups; g++) {
            const float s = scale_at(scales, j * l.scale_row + g * l.scale_group, l.scale_dtype);
            const __m512 values = _mm512_sub_ps(iota, _mm512_set1_ps(float(zero_at<4>(zeros, l, j, g))));
            const __m512i table = (__m512i)_mm512_cvtne2ps_pbh(values, values);  // entry i: bf16(i - z), exact
            __m512 part[R];
            for (int r = 0; r < R; r++) part[r] = _mm512_setzero_ps();
            for (int64_t c = g * per_group; c < (g + 1) * per_group; c++) {
                const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i *>(row + c * 16));
                const __m512i words =
                    _mm512_srlv_epi16(_mm512_cvtepu8_epi16(_mm256_broadcastsi128_si256(bytes)), shifts);
                const __m512bh w = (__m512bh)_mm512_permutexvar_epi16(_mm512_and_si512(words, low), table);
                for (int r = 0; r < R; r++)
                    part[r] = _mm512_dpbf16_ps(part[r], w, (__m512bh)_mm512_loadu_si512(x + r * k + c * CHUNK));
            }
            for (int r = 0; r < R; r++) acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(s), part[r], acc[r]);
        }
        const float extra = bias ? to_float(bias[j]) : 0.0f;
        for (int r = 0; r < R; r++) store(y[r * ldy + j], _mm512_reduce_add_ps(acc[r]) + extra);
    }
}

void gemv_w4_bf16(const BFloat16 *x, const uint8_t *q, const void *scales, const int32_t *zeros,
                  const int32_t *perm, const BFloat16 *bias, BFloat16 *y, int64_t rows, int64_t ldy,
                  const PackedLayout &l) {
    std::vector<BFloat16> xp;
    if (perm) {  // x's columns in the weights' order
        xp.resize(rows * l.k);
        for (int64_t r = 0; r < rows; r++)
            for (int64_t i = 0; i < l.k; i++) xp[r * l.k + i] = x[r * l.k + perm[i]];
        x = xp.data();
    }
    with_rows<MAX_ROWS>(rows, [&](auto r) {
        gemv_w4_bf16<decltype(r)::value>(x, q, scales, zeros, bias, y, ldy, l);
    });
}
#endif

template <typename D, typename T>
void gemv(const T *x, const uint8_t *q, const void *scales, const int32_t *zeros, const int32_t *perm,
          const T *bias, T *y, int64_t rows, int64_t ldy, const PackedLayout &l) {
#if defined(PACKED_BF16_DOT)
    if constexpr (std::is_same_v<D, W4> && std::is_same_v<T, BFloat16>)
        return gemv_w4_bf16(x, q, scales, zeros, perm, bias, y, rows, ldy, l);
#endif
    const int64_t k = l.k;
    std::vector<float> xf(rows * k);  // in fp32, columns in the weights' (permuted) order
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < k; i++) xf[r * k + i] = to_float(x[r * k + (perm ? perm[i] : i)]);
    const float *xp = xf.data();
    with_rows<MAX_ROWS>(rows, [&](auto r) {
        gemv_rows<D, decltype(r)::value>(xp, q, scales, zeros, bias, y, ldy, l);
    });
}

template <typename D, typename T>
void dequant(const uint8_t *q, const void *scales, const int32_t *zeros, const int32_t *perm, T *out,
             int64_t first, int64_t last, const PackedLayout &l) {
    const int64_t k = l.k, row_bytes = k / CHUNK * D::BYTES, groups = k / l.group_size;
    const int64_t per_group = l.group_size / CHUNK;
#pragma omp parallel for schedule(static) if (last - first > 1)
    for (int64_t j = first; j < last; j++) {
        T *o = out + (j - first) * k;
        for (int64_t g = 0; g < groups; g++) {
            const float s = scale_at(scales, j * l.scale_row + g * l.scale_group, l.scale_dtype);
            const int32_t z = zero_at<D::BITS>(zeros, l, j, g);
            for (int64_t c = g * per_group; c < (g + 1) * per_group; c++) {
                alignas(64) float w[CHUNK];
                D::decode(q + j * row_bytes + c * D::BYTES, z, s, w);
                if (perm == nullptr) {
                    for (int i = 0; i < CHUNK; i++) store(o[c * CHUNK + i], w[i]);
                } else {
                    for (int i = 0; i < CHUNK; i++) store(o[perm[c * CHUNK + i]], w[i]);
                }
            }
        }
    }
}

}  // namespace

#define EXPORT(D, NAME, T, SUFFIX)                                                                             \
    extern "C" void packed_gemv_##NAME##_##SUFFIX(const T *x, const uint8_t *q, const void *scales,           \
                                                  const int32_t *zeros, const int32_t *perm, const T *bias,   \
                                                  T *y, int64_t rows, int64_t ldy, const PackedLayout *l) {   \
        gemv<D>(x, q, scales, zeros, perm, bias, y, rows, ldy, *l);                                           \
    }                                                                                                         \
    extern "C" void packed_dequant_##NAME##_##SUFFIX(const uint8_t *q, const void *scales,                    \
                                                     const int32_t *zeros, const int32_t *perm, T *out,       \
                                                     int64_t first, int64_t last, const PackedLayout *l) {    \
        dequant<D>(q, scales, zeros, perm, out, first, last, *l);                                             \
    }
#define EXPORT_KIND(D, NAME) \
    EXPORT(D, NAME, float, f32) \
    EXPORT(D, NAME, BFloat16, bf16)

EXPORT_KIND(W4, w4)
EXPORT_KIND(W8, w8)
EXPORT_KIND(FP8, fp8)

#if defined(PACKED_BF16_DOT)
extern "C" int packed_bf16_dot() { return 1; }  // 4-bit weights times bf16 x on VDPBF16PS
#else
extern "C" int packed_bf16_dot() { return 0; }
#endif

// Storage types of the CPU kernels: float, and bf16 as raw bits (converted with shifts, as torch does).
#pragma once
#include <cstdint>
#include <cmath>
#include <cstring>

struct BFloat16 {
    uint16_t bits;
};

inline float to_float(float x) { return x; }
inline float to_float(BFloat16 x) { return __builtin_bit_cast(float, uint32_t(x.bits) << 16); }

inline void store(float &dst, float x) { dst = x; }
inline void store(BFloat16 &dst, float x) {  // round to nearest even, as torch does; branch-free (vectorizes)
    const uint32_t bits = __builtin_bit_cast(uint32_t, x);
    const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
    const uint32_t nan = (bits >> 16) | 0x40u;  // NaN stays NaN
    dst.bits = uint16_t((bits & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

// x as it would be after a round trip through storage type T
template <typename T>
inline float round_to(float x) {
    T t;
    store(t, x);
    return to_float(t);
}

// fp8 KV-cache storage (torch.float8_e4m3fn and torch.float8_e5m2) as raw bits. Stores round to nearest
// even like torch's casts; callers clamp to the type's range first (as the PyTorch path does), so no
// value saturates or overflows here.
struct Float8E4M3 {
    uint8_t bits;
};
struct Float8E5M2 {
    uint8_t bits;
};

// fp8 with M mantissa bits and exponent bias BIAS: to float, and from a float within range. Branch-free
// (selects, not branches), so that loops over them vectorize. NaN converts to NaN both ways, as torch's casts
// (e4m3fn has no infinities: S.1111.111 is its NaN; e5m2's exponent 31 holds infinities and NaNs).
template <int M, int BIAS>
inline float fp8_to_float(uint8_t b) {
    const uint32_t magnitude = b & 0x7fu, sign = uint32_t(b & 0x80u) << 24;
    // normal: exponent and mantissa bits moved into a float's, the exponent rebiased by an integer add
    uint32_t bits = (magnitude << (23 - M)) + (uint32_t(127 - BIAS) << 23);
    // subnormal (exponent 0): mantissa * 2^(1 - BIAS - M), exact
    const float subnormal = float(int32_t(magnitude)) * (1.0f / float(1 << (BIAS + M - 1)));
    bits = magnitude < (1u << M) ? __builtin_bit_cast(uint32_t, subnormal) : bits;
    if constexpr (M == 3) {
        bits = magnitude == 0x7fu ? 0x7fc00000u : bits;  // e4m3fn's only NaN
    } else {
        bits = magnitude >= 0x7cu ? 0x7f800000u | ((magnitude & 3u) << 21) : bits;  // infinity or NaN
    }
    return __builtin_bit_cast(float, sign | bits);
}

template <int M, int BIAS>
inline uint8_t float_to_fp8(float x) {
    const uint32_t all = __builtin_bit_cast(uint32_t, x);
    const uint32_t sign = (all >> 24) & 0x80u, bits = all & 0x7fffffffu;
    const float magnitude = __builtin_bit_cast(float, bits);
    // subnormal range: a multiple of the smallest step (2^M steps = the smallest normal), rounded to nearest
    // even by adding and subtracting 1.5 * 2^23 (kept as written: no -ffast-math)
    const float steps = (magnitude * float(1 << (BIAS + M - 1)) + 12582912.0f) - 12582912.0f;
    const uint32_t subnormal = uint32_t(int32_t(steps));
    constexpr int drop = 23 - M;
    const uint32_t rounded = bits + (1u << (drop - 1)) - 1 + ((bits >> drop) & 1u);  // nearest even at `drop`
    const uint32_t normal = (((rounded >> 23) - 127 + BIAS) << M) | ((rounded >> drop) & ((1u << M) - 1));
    const uint32_t code = magnitude < 1.0f / float(1 << (BIAS - 1)) ? subnormal : normal;
    return uint8_t(sign | (bits > 0x7f800000u ? 0x7fu : code));
}

inline float to_float(Float8E4M3 x) { return fp8_to_float<3, 7>(x.bits); }
inline float to_float(Float8E5M2 x) { return fp8_to_float<2, 15>(x.bits); }
inline void store(Float8E4M3 &dst, float x) { dst.bits = float_to_fp8<3, 7>(x); }
inline void store(Float8E5M2 &dst, float x) { dst.bits = float_to_fp8<2, 15>(x); }

// X(suffix, activation type, KV-pool type) for every pair the KV-cache kernels are built for
#define FOR_EACH_KV_TYPE(X)                   \
    X(f32, float, float)                      \
    X(bf16, BFloat16, BFloat16)               \
    X(f32_fp8_e4m3, float, Float8E4M3)        \
    X(bf16_fp8_e4m3, BFloat16, Float8E4M3)    \
    X(f32_fp8_e5m2, float, Float8E5M2)        \
    X(bf16_fp8_e5m2, BFloat16, Float8E5M2)

// exp(x) in plain arithmetic the compiler vectorizes (std::exp stays a scalar libm call without
// -ffast-math): 2^(x log2 e) split into 2^n (exponent bits) and 2^f, |f| <= 1/2, by a degree-6 Taylor
// polynomial (relative error about 2e-7). x is clamped to [-87, 88]: exp(-87) is 1.6e-38, not 0.
inline float fast_exp(float x) {
    x = x < -87.0f ? -87.0f : x;  // selects, not branches, with -fno-trapping-math (cpu_kernels.FLAGS)
    x = x > 88.0f ? 88.0f : x;
    const float y = x * 1.44269504088896341f;
    const int32_t n = int32_t(y + 128.5f) - 128;  // round(y): y + 128.5 > 0, so truncation floors
    const float f = y - float(n);
    float p = 1.5403530393e-4f;
    p = p * f + 1.3333558146e-3f;
    p = p * f + 9.6181291076e-3f;
    p = p * f + 5.5504108665e-2f;
    p = p * f + 2.4022650696e-1f;
    p = p * f + 6.9314718056e-1f;
    p = p * f + 1.0f;
    return p * __builtin_bit_cast(float, (n + 127) << 23);
}

// tanh(x) in plain arithmetic the compiler vectorizes (selects, no branches): the odd Taylor series to x^17 below
// |x| = 0.4 (truncation error under 1e-10 there), else 1 - 2 / (exp(2 |x|) + 1) with fast_exp (relative error
// under 3e-7 at 0.4, falling with |x|; exactly +-1 from |x| about 9, as fp32 rounds tanh there)
inline float fast_tanh(float x) {
    const float a = x < 0.0f ? -x : x, a2 = a * a;
    float p = 6404582.0f / 10854718875.0f;
    p = p * a2 - 929569.0f / 638512875.0f;
    p = p * a2 + 21844.0f / 6081075.0f;
    p = p * a2 - 1382.0f / 155925.0f;
    p = p * a2 + 62.0f / 2835.0f;
    p = p * a2 - 17.0f / 315.0f;
    p = p * a2 + 2.0f / 15.0f;
    p = p * a2 - 1.0f / 3.0f;
    const float small = a + a * a2 * p;
    const float large = 1.0f - 2.0f / (fast_exp(2.0f * a) + 1.0f);
    const float t = a < 0.4f ? small : large;
    return x < 0.0f ? -t : t;
}

// sum of a[i] * b[i] over n floats; n a multiple of 16 takes the vector path where the build has one
#if defined(__AVX512F__)
#include <immintrin.h>
inline float dot(const float *a, const float *b, int64_t n) {
    if (n % 16 == 0) {
        __m512 acc = _mm512_setzero_ps();
        for (int64_t i = 0; i < n; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc);
        return _mm512_reduce_add_ps(acc);
    }
    float s = 0.0f;
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}
#else
inline float dot(const float *a, const float *b, int64_t n) {
    float lanes[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
#pragma omp simd
        for (int l = 0; l < 8; l++) lanes[l] += a[i + l] * b[i + l];
    }
    float s = ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5])) + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}
#endif

// IEEE half (as its bits) to float, subnormals included
inline float half_to_float(uint16_t h) {
    const uint32_t sign = uint32_t(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    uint32_t bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    } else {  // zero or subnormal: man * 2^-24, exact in a float
        const float f = float(man) * 5.9604644775390625e-08f;
        return sign ? -f : f;
    }
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
}

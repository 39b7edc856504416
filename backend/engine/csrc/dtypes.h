// Storage types of the CPU kernels: float, and bf16 as raw bits (converted with shifts, as torch does).
#pragma once
#include <cstdint>
#include <cmath>
#include <cstring>

struct BFloat16 {
    uint16_t bits;
};

inline float to_float(float x) { return x; }
inline float to_float(BFloat16 x) {
    uint32_t bits = uint32_t(x.bits) << 16;
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
}

inline void store(float &dst, float x) { dst = x; }
inline void store(BFloat16 &dst, float x) {  // round to nearest even, as torch does
    uint32_t bits;
    std::memcpy(&bits, &x, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) {
        dst.bits = uint16_t((bits >> 16) | 0x40u);  // NaN stays NaN
        return;
    }
    bits += 0x7fffu + ((bits >> 16) & 1u);
    dst.bits = uint16_t(bits >> 16);
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

// fp8 with M mantissa bits and exponent bias BIAS: to float, and from a float within range
template <int M, int BIAS>
inline float fp8_to_float(uint8_t b) {
    const uint32_t sign = uint32_t(b & 0x80) << 24, exp = (b & 0x7f) >> M, man = b & ((1u << M) - 1);
    if (exp == 0) {  // subnormal: man * 2^(1 - BIAS - M), exact in a float
        const float f = float(man) / float(1 << (BIAS + M - 1));
        return sign ? -f : f;
    }
    const uint32_t bits = sign | ((exp - BIAS + 127) << 23) | (man << (23 - M));
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
}

template <int M, int BIAS>
inline uint8_t float_to_fp8(float x) {
    uint32_t bits;
    std::memcpy(&bits, &x, sizeof bits);
    const uint8_t sign = uint8_t((bits >> 24) & 0x80);
    bits &= 0x7fffffffu;
    float magnitude;
    std::memcpy(&magnitude, &bits, sizeof magnitude);
    if (magnitude < 1.0f / float(1 << (BIAS - 1))) {  // subnormal range: a multiple of the smallest step
        return sign | uint8_t(std::nearbyint(magnitude * float(1 << (BIAS + M - 1))));  // 2^M = smallest normal
    }
    const int drop = 23 - M;
    bits += (1u << (drop - 1)) - 1 + ((bits >> drop) & 1u);  // round to nearest even at bit `drop`
    const uint32_t exp = (bits >> 23) - 127 + BIAS, man = (bits >> drop) & ((1u << M) - 1);
    return sign | uint8_t((exp << M) | man);
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

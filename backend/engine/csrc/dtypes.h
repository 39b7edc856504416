// Storage types of the CPU kernels: float, and bf16 as raw bits (converted with shifts, as torch does).
#pragma once
#include <cstdint>
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

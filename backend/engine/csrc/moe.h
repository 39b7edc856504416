// What csrc/moe.cpp's grouped expert products ask of a weight format: one function computing a range of
// output panels (16 columns each; the last may be short) of one expert's product over the rows routed to
// it. Each format's source defines its moe_panels_* functions over its own inner loops (interleaved.cpp:
// GGUF Q4_0 / Q4_1 / Q8_0 and MXFP4 in 16-row panels; gemm_bf16.cpp: dense bf16 panels; quantized.cpp:
// GGUF blocks row by row), called from inside moe.cpp's OpenMP region (so they open none of their own).
#pragma once
#include <cstdint>

namespace moe {

constexpr int64_t PANEL = 16;  // output columns a panel

struct ExpertGemm {  // y [rows, n] (row stride ldy) = x [rows, k] @ W^T (+ bias) for one expert
    const void *x;     // [rows, k] contiguous, the activations' type
    const uint8_t *w;  // the expert's weights in the format's layout
    const void *bias;  // [n] in the activations' type, or null
    void *y;
    int64_t rows, n, k, ldy;
};

// output columns [PANEL * first, min(PANEL * last, n)) of e
using PanelsFn = void (*)(const ExpertGemm &e, int64_t first, int64_t last);

}  // namespace moe

// What one layer's attention may add to plain causal attention, shared by the paged kernels
// (csrc/paged_attention.cpp, csrc/prefill_attention.cpp), with transformers' semantics:
//   window     a sliding window of W keys: a query at position p sees keys p - W + 1 .. p (transformers'
//              masking_utils.sliding_window_overlay: kv_idx > q_idx - sliding_window); 0: every earlier key.
//              The kernels never read a key outside it (a sequence's blocks before the window may be freed).
//   soft_cap   logit soft-capping (Gemma 2's attn_logit_softcapping): each scaled score s becomes
//              cap * tanh(s / cap) before the softmax; 0: none.
//   sinks      [num_heads] fp32 learned logits (gpt-oss): each joins its head's softmax denominator as one
//              more score (not scaled, not capped) and is dropped from the output; null: none.
#pragma once
#include <algorithm>
#include <cstdint>

#include "dtypes.h"

struct Features {
    int64_t window;
    float soft_cap;
    const float *sinks;
};

// The first key position a query at position p sees
inline int64_t window_start(int64_t p, int64_t window) { return window > 0 ? std::max<int64_t>(0, p - window + 1) : 0; }

// scores[i] = cap * tanh(scores[i] / cap) for i < n (out of line: the kernels' hot code stays as compact as
// without caps)
__attribute__((noinline)) inline void apply_soft_cap(float *scores, int64_t n, float cap) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) scores[i] = cap * fast_tanh(scores[i] / cap);
}

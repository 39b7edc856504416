// A decoder's mixture-of-experts block on the CPU in one call (backend/engine/layers/fused_moe/), vLLM's
// fused_moe: from the router's logits [T, E],
//   out [T, H] = sum over token t's top_k experts e of  weight_e * down_e(act(gate_up_e(x_t)))  (+ shared)
// Per pass of at most MAX_PAIRS token-expert pairs, one OpenMP region:
//   1. routing per token, in fp32 (the family's order: softmax over all experts then the top_k, optionally
//      renormalised; or the top_k logits then a softmax over them), ties to the lower expert index
//   2. the pairs counted and sorted by expert (stable: token order within an expert), x's rows gathered
//   3. each routed expert's gate_up product over its rows only, the activation (SiLU-and-multiply, or
//      gpt-oss's clamped SwiGLU), its down product: the experts' products split between the threads by
//      (expert, panel of 16 output columns), each panel weighted by its weight read plus its rows, so the
//      threads share the work whatever the routing; the weight formats bring their inner loops (moe.h)
//   4. each token's outputs summed with their weights in ascending expert order (as transformers' loop over
//      experts adds them), in fp32, plus a shared expert's output (times sigmoid of its gate where it has
//      one), rounded once
// Expert outputs are rounded to x's type between the steps, as the PyTorch path rounds them. The workspace
// (moe_workspace_bytes) is the caller's: a captured decode step holds it for its largest batch.
// Built and loaded by backend/engine/cpu_kernels.py.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "dtypes.h"
#include "moe.h"

extern "C" void silu_and_mul_f32(const float *gate_up, float *out, int64_t rows, int64_t dim);  // layers.cpp
extern "C" void silu_and_mul_bf16(const BFloat16 *gate_up, BFloat16 *out, int64_t rows, int64_t dim);

struct MoeLayer {  // fused_moe/native.py MoeLayerArgs mirrors it field by field
    moe::PanelsFn gate_up, down;  // each projection's format: a moe_panels_* function
    const uint8_t *w13, *w2;      // experts stacked: expert e's weights at w13 + e * w13_stride
    const void *b13, *b2;         // [E, 2 I] and [E, H] in x's type, or null
    int64_t w13_stride, w2_stride;
    int64_t experts, top_k, hidden, inter;
    int64_t routing, renormalize, activation;
    float alpha, limit;  // gpt-oss's SwiGLU
    float scale;         // on the block's output (Granite-MoE's residual_multiplier where not folded into w2)
    int64_t *counts;     // [E] or null: each call adds its token-expert assignments per expert (EngineStats)
};

namespace {

constexpr int64_t MAX_PAIRS = 4096;  // a pass's token-expert pairs: the workspace holds 6 H + 3 I values each
constexpr int64_t MAX_EXPERTS = 1024, MAX_TOP_K = 64;  // fused_moe/config.py checks them
// a panel's weight read, counted as this many rows of products when the threads split the work: the
// weights stream from DRAM at a few rows a panel (decode), past that the products dominate
constexpr int64_t PANEL_COST = 8;
constexpr int64_t ALIGN = 64;

enum Routing : int64_t { SOFTMAX_TOPK = 0, TOPK_SOFTMAX = 1 };
enum Activation : int64_t { SILU = 0, SWIGLU_OAI = 1 };

struct Pass {  // a pass's workspace
    int32_t *ids;      // [pairs]: pair t * K + k's expert
    float *weights;    // [pairs]
    int32_t *order;    // [pairs]: the pair in each sorted slot
    int32_t *slot;     // [pairs]: each pair's sorted slot
    int64_t *offsets;  // [E + 1]: expert e's slots start at offsets[e]
    void *xs, *h13, *act, *y;  // [pairs, H], [pairs, 2 I], [pairs, I], [pairs, H] in x's type
};

struct Active {  // an expert with rows this pass
    int64_t expert, first_slot, rows;
};

int64_t aligned(int64_t bytes) { return (bytes + ALIGN - 1) / ALIGN * ALIGN; }

// the workspace of a pass of `tokens` tokens: its size, and its layout in pass where base is given
int64_t layout(const MoeLayer &l, int64_t tokens, int64_t elem, uint8_t *base, Pass *pass) {
    const int64_t pairs = tokens * l.top_k;
    const int64_t sizes[9] = {4 * pairs, 4 * pairs, 4 * pairs, 4 * pairs, 8 * (l.experts + 1),
                              pairs * l.hidden * elem, pairs * 2 * l.inter * elem, pairs * l.inter * elem,
                              pairs * l.hidden * elem};
    uint8_t *at[9];
    int64_t total = 0;
    for (int i = 0; i < 9; i++) {
        at[i] = base ? base + total : nullptr;
        total += aligned(sizes[i]);
    }
    if (pass)
        *pass = {reinterpret_cast<int32_t *>(at[0]), reinterpret_cast<float *>(at[1]),
                 reinterpret_cast<int32_t *>(at[2]), reinterpret_cast<int32_t *>(at[3]),
                 reinterpret_cast<int64_t *>(at[4]), at[5], at[6], at[7], at[8]};
    return total;
}

void softmax(float *v, int64_t n) {  // as torch's: exp(v - max), times 1 / sum
    float top = v[0];
    for (int64_t i = 1; i < n; i++) top = std::max(top, v[i]);
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i++) sum += v[i] = std::exp(v[i] - top);
    const float inverse = 1.0f / sum;
    for (int64_t i = 0; i < n; i++) v[i] *= inverse;
}

// a token's top_k experts and their weights from its logits [E]
template <typename T>
void route(const MoeLayer &l, const T *logits, int32_t *ids, float *weights) {
    float v[MAX_EXPERTS];
    bool taken[MAX_EXPERTS] = {};
    for (int64_t e = 0; e < l.experts; e++) v[e] = to_float(logits[e]);
    if (l.routing == SOFTMAX_TOPK) softmax(v, l.experts);
    for (int64_t k = 0; k < l.top_k; k++) {
        int64_t best = -1;
        for (int64_t e = 0; e < l.experts; e++)
            if (!taken[e] && (best < 0 || v[e] > v[best])) best = e;
        taken[best] = true;
        ids[k] = int32_t(best);
        weights[k] = v[best];
    }
    if (l.routing == TOPK_SOFTMAX) softmax(weights, l.top_k);
    if (l.renormalize) {
        float sum = 0.0f;
        for (int64_t k = 0; k < l.top_k; k++) sum += weights[k];
        for (int64_t k = 0; k < l.top_k; k++) weights[k] /= sum;
    }
}

// counting sort of the pairs by expert (one thread); the experts with rows into active
void sort_pairs(const MoeLayer &l, const Pass &p, int64_t pairs, std::vector<Active> &active) {
    std::fill(p.offsets, p.offsets + l.experts + 1, 0);
    for (int64_t s = 0; s < pairs; s++) p.offsets[p.ids[s] + 1]++;
    if (l.counts)
        for (int64_t e = 0; e < l.experts; e++) l.counts[e] += p.offsets[e + 1];
    for (int64_t e = 0; e < l.experts; e++) p.offsets[e + 1] += p.offsets[e];
    std::vector<int64_t> cursor(p.offsets, p.offsets + l.experts);
    for (int64_t s = 0; s < pairs; s++) {
        const int64_t slot = cursor[p.ids[s]]++;
        p.order[slot] = int32_t(s);
        p.slot[s] = int32_t(slot);
    }
    active.clear();
    for (int64_t e = 0; e < l.experts; e++)
        if (p.offsets[e + 1] > p.offsets[e]) active.push_back({e, p.offsets[e], p.offsets[e + 1] - p.offsets[e]});
}

int64_t first_panel_from(int64_t offset, int64_t cost, int64_t panels) {  // the first panel starting at offset+
    return offset <= 0 ? 0 : std::min(panels, (offset + cost - 1) / cost);
}

// this thread's share of every active expert's product in[slots] [rows, k] @ W_e^T (+ b_e) -> out[slots]
template <typename T>
void products(moe::PanelsFn fn, const uint8_t *w, int64_t stride, const void *bias, int64_t n, int64_t k,
              const std::vector<Active> &active, const T *in, T *out) {
    const int64_t panels = (n + moe::PANEL - 1) / moe::PANEL;
    int64_t total = 0;
    for (const Active &a : active) total += panels * (PANEL_COST + a.rows);
    const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t begin = total * t / threads, end = total * (t + 1) / threads;
    int64_t start = 0;
    for (const Active &a : active) {
        const int64_t cost = PANEL_COST + a.rows;
        const int64_t first = first_panel_from(begin - start, cost, panels);
        const int64_t last = first_panel_from(end - start, cost, panels);
        if (first < last) {
            const T *b = bias ? static_cast<const T *>(bias) + a.expert * n : nullptr;
            const moe::ExpertGemm e{in + a.first_slot * k, w + a.expert * stride, b, out + a.first_slot * n,
                                    a.rows, n, k, n};
            fn(e, first, last);
        }
        start += panels * cost;
    }
}

inline void silu_and_mul(const float *gate_up, float *out, int64_t dim) { silu_and_mul_f32(gate_up, out, 1, dim); }
inline void silu_and_mul(const BFloat16 *gate_up, BFloat16 *out, int64_t dim) {
    silu_and_mul_bf16(gate_up, out, 1, dim);
}

// out [I] = act(gate_up [2 I]: gate, then up)
template <typename T>
void activate(const MoeLayer &l, const T *gate_up, T *out) {
    const int64_t dim = l.inter;
    if (l.activation == SILU) return silu_and_mul(gate_up, out, dim);
    for (int64_t i = 0; i < dim; i++) {  // gpt-oss: (clamp(up) + 1) * gate * sigmoid(alpha * gate), gate <= limit
        const float gate = std::min(to_float(gate_up[i]), l.limit);
        const float up = std::max(std::min(to_float(gate_up[dim + i]), l.limit), -l.limit);
        store(out[i], (up + 1.0f) * (gate * (1.0f / (1.0f + std::exp(-l.alpha * gate)))));
    }
}

// out[t] = sum of token t's expert outputs times their weights, in ascending expert order (+ shared)
template <typename T>
void combine(const MoeLayer &l, const Pass &p, int64_t t, const T *shared, const T *shared_gate, T *out,
             float *acc) {
    const int64_t K = l.top_k, H = l.hidden;
    int64_t pairs[MAX_TOP_K];
    for (int64_t k = 0; k < K; k++) pairs[k] = t * K + k;
    std::sort(pairs, pairs + K, [&](int64_t a, int64_t b) { return p.ids[a] < p.ids[b]; });
    std::fill(acc, acc + H, 0.0f);
    for (int64_t k = 0; k < K; k++) {
        const T *y = static_cast<const T *>(p.y) + int64_t(p.slot[pairs[k]]) * H;
        const float weight = p.weights[pairs[k]];
        for (int64_t h = 0; h < H; h++) acc[h] += weight * to_float(y[h]);
    }
    if (shared) {
        const float gate = shared_gate ? 1.0f / (1.0f + std::exp(-to_float(shared_gate[t]))) : 1.0f;
        for (int64_t h = 0; h < H; h++) acc[h] += gate * to_float(shared[t * H + h]);
    }
    for (int64_t h = 0; h < H; h++) store(out[t * H + h], l.scale == 1.0f ? acc[h] : acc[h] * l.scale);
}

template <typename T>
void run_pass(const MoeLayer &l, const T *x, const T *logits, const T *shared, const T *shared_gate, T *out,
              const Pass &p, int64_t tokens) {
    const int64_t K = l.top_k, H = l.hidden, I = l.inter, pairs = tokens * K;
    T *xs = static_cast<T *>(p.xs), *h13 = static_cast<T *>(p.h13), *act = static_cast<T *>(p.act);
    std::vector<Active> active;
#pragma omp parallel
    {
#pragma omp for schedule(static)
        for (int64_t t = 0; t < tokens; t++) route(l, logits + t * l.experts, p.ids + t * K, p.weights + t * K);
#pragma omp single
        sort_pairs(l, p, pairs, active);
#pragma omp for schedule(static)
        for (int64_t s = 0; s < pairs; s++) std::memcpy(xs + s * H, x + p.order[s] / K * H, H * sizeof(T));
        products(l.gate_up, l.w13, l.w13_stride, l.b13, 2 * I, H, active, xs, h13);
#pragma omp barrier
#pragma omp for schedule(static)
        for (int64_t s = 0; s < pairs; s++) activate(l, h13 + s * 2 * I, act + s * I);
        products(l.down, l.w2, l.w2_stride, l.b2, H, I, active, act, static_cast<T *>(p.y));
#pragma omp barrier
        std::vector<float> acc(H);
#pragma omp for schedule(static)
        for (int64_t t = 0; t < tokens; t++) combine(l, p, t, shared, shared_gate, out, acc.data());
    }
}

int64_t tokens_a_pass(const MoeLayer &l) { return std::max<int64_t>(1, MAX_PAIRS / l.top_k); }

template <typename T>
void forward(const MoeLayer &l, const T *x, const T *logits, const T *shared, const T *shared_gate, T *out,
             uint8_t *workspace, int64_t rows) {
    const int64_t H = l.hidden;
    for (int64_t t0 = 0; t0 < rows; t0 += tokens_a_pass(l)) {
        const int64_t tokens = std::min(tokens_a_pass(l), rows - t0);
        Pass p;
        layout(l, tokens, sizeof(T), workspace, &p);
        run_pass(l, x + t0 * H, logits + t0 * l.experts, shared ? shared + t0 * H : nullptr,
                 shared_gate ? shared_gate + t0 : nullptr, out + t0 * H, p, tokens);
    }
}

}  // namespace

// bytes of workspace a call of rows tokens needs (elem: x's element size)
extern "C" int64_t moe_workspace_bytes(const MoeLayer *l, int64_t rows, int64_t elem) {
    return layout(*l, std::min(rows, tokens_a_pass(*l)), elem, nullptr, nullptr);
}

extern "C" int64_t moe_max_experts() { return MAX_EXPERTS; }
extern "C" int64_t moe_max_top_k() { return MAX_TOP_K; }

// out [rows, H] = the block's output for x [rows, H] and the router's logits [rows, E]; shared [rows, H]
// (or null): a shared expert's output, times sigmoid(shared_gate [rows]) where that is given
#define MOE_FORWARD(SUFFIX, T)                                                                                 \
    extern "C" void moe_forward_##SUFFIX(const MoeLayer *l, const T *x, const T *logits, const T *shared,     \
                                         const T *shared_gate, T *out, uint8_t *workspace, int64_t rows) {    \
        forward(*l, x, logits, shared, shared_gate, out, workspace, rows);                                    \
    }                                                                                                          \
    extern "C" void moe_route_##SUFFIX(const MoeLayer *l, const T *logits, int64_t rows, int32_t *ids,         \
                                       float *weights) {                                                       \
        for (int64_t t = 0; t < rows; t++)                                                                     \
            route(*l, logits + t * l->experts, ids + t * l->top_k, weights + t * l->top_k);                    \
    }
MOE_FORWARD(f32, float)
MOE_FORWARD(bf16, BFloat16)

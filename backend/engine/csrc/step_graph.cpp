// A captured decode step (backend/engine/decode_graph.py) replayed in one call: an array of prepared kernel
// calls, each the address of one of this library's kernels, its signature and its arguments (pointers into
// the step's persistent buffers, sizes, scales), run in order. The row count is the one argument that
// changes from step to step: each op names the integer slot that takes it. What vLLM's CUDA graphs do for
// kernel launches this does for the Python around each native call (argument conversion, module calls,
// fresh output tensors): a step's 250 calls cost one ctypes call.
// Pointers travel as int64 slots and are passed back as void * to the kernel's exact signature.
#include <cstdint>
#include <cstring>

namespace {

enum Signature : int64_t {
    GEMM = 0,            // (x, w, bias, y, rows, n, k, ldy): gemm_bf16_silu_and_mul, quant_gemm_*, linear_f32
    GEMM_BF16 = 1,       // (x, w, bias, y, rows, n, k, ldy, float_out)
    RMS_NORM = 2,        // (x, weight, out, rows, dim, eps)
    ADD_RMS_NORM = 3,    // (x, residual, weight, out, residual_out, rows, dim, eps)
    SILU_AND_MUL = 4,    // (gate_up, out, rows, dim): silu_and_mul, gelu_tanh_and_mul
    ROPE_AND_CACHE = 5,  // (qkv, positions, cos, sin, slots, k_cache, v_cache, rows, heads, kv_heads, dim,
                         //  slots, rotary_dim, k_scale, v_scale, limit)
    DECODE_ATTENTION = 6,  // (q, k_cache, v_cache, tables, lens, out, sinks, rows, heads, kv_heads, dim, blocks,
                           //  block_size, max_blocks, q_stride, window, scale, v_scale, soft_cap)
    INTERLEAVED = 7,     // (x, w, bias, y, rows, n, k, ldy, groups, float_out): interleaved_gemm_*
    EMBEDDING = 8,       // (ids, table, out, rows, k or row bytes): interleaved_embedding_q8_0, embedding_rows
    WIDEN = 9,           // (y, rows, n): widen_bf16_rows
    MOE = 10,            // (layer, x, logits, shared, shared_gate, out, workspace, rows): moe_forward_*
    QK_NORM = 11,        // (qkv, q_weight, k_weight, rows, heads, kv_heads, dim, across_heads, eps): qk_norm_*
};

constexpr int MAX_INTS = 16;
constexpr int MAX_FLOATS = 3;

struct Op {  // decode_graph.Op mirrors this layout
    void *function;
    int64_t signature;
    int64_t rows_slot;  // which of ints takes the step's row count
    int64_t ints[MAX_INTS];
    float floats[MAX_FLOATS];
};

using P = void *;
using I = int64_t;
using F = float;

inline P p(const int64_t *a, int i) { return reinterpret_cast<P>(a[i]); }

void run(const Op &op) {
    const int64_t *a = op.ints;
    const float *f = op.floats;
    switch (op.signature) {
        case GEMM:
            reinterpret_cast<void (*)(P, P, P, P, I, I, I, I)>(op.function)(p(a, 0), p(a, 1), p(a, 2), p(a, 3),
                                                                        a[4], a[5], a[6], a[7]);
            break;
        case GEMM_BF16:
            reinterpret_cast<void (*)(P, P, P, P, I, I, I, I, I)>(op.function)(p(a, 0), p(a, 1), p(a, 2), p(a, 3),
                                                                           a[4], a[5], a[6], a[7], a[8]);
            break;
        case INTERLEAVED:
            reinterpret_cast<void (*)(P, P, P, P, I, I, I, I, P, I)>(op.function)(
                p(a, 0), p(a, 1), p(a, 2), p(a, 3), a[4], a[5], a[6], a[7], p(a, 8), a[9]);
            break;
        case MOE:
            reinterpret_cast<void (*)(P, P, P, P, P, P, P, I)>(op.function)(p(a, 0), p(a, 1), p(a, 2), p(a, 3), p(a, 4),
                                                                           p(a, 5), p(a, 6), a[7]);
            break;
        case WIDEN:
            reinterpret_cast<void (*)(P, I, I)>(op.function)(p(a, 0), a[1], a[2]);
            break;
        case EMBEDDING:
            reinterpret_cast<void (*)(P, P, P, I, I)>(op.function)(p(a, 0), p(a, 1), p(a, 2), a[3], a[4]);
            break;
        case RMS_NORM:
            reinterpret_cast<void (*)(P, P, P, I, I, F)>(op.function)(p(a, 0), p(a, 1), p(a, 2), a[3], a[4], f[0]);
            break;
        case ADD_RMS_NORM:
            reinterpret_cast<void (*)(P, P, P, P, P, I, I, F)>(op.function)(p(a, 0), p(a, 1), p(a, 2), p(a, 3),
                                                                        p(a, 4), a[5], a[6], f[0]);
            break;
        case SILU_AND_MUL:
            reinterpret_cast<void (*)(P, P, I, I)>(op.function)(p(a, 0), p(a, 1), a[2], a[3]);
            break;
        case QK_NORM:
            reinterpret_cast<void (*)(P, P, P, I, I, I, I, I, F)>(op.function)(p(a, 0), p(a, 1), p(a, 2), a[3], a[4],
                                                                           a[5], a[6], a[7], f[0]);
            break;
        case ROPE_AND_CACHE:
            reinterpret_cast<void (*)(P, P, P, P, P, P, P, I, I, I, I, I, I, F, F, F)>(op.function)(
                p(a, 0), p(a, 1), p(a, 2), p(a, 3), p(a, 4), p(a, 5), p(a, 6), a[7], a[8], a[9], a[10], a[11],
                a[12], f[0], f[1], f[2]);
            break;
        case DECODE_ATTENTION:
            reinterpret_cast<void (*)(P, P, P, P, P, P, P, I, I, I, I, I, I, I, I, I, F, F, F)>(op.function)(
                p(a, 0), p(a, 1), p(a, 2), p(a, 3), p(a, 4), p(a, 5), p(a, 6), a[7], a[8], a[9], a[10], a[11],
                a[12], a[13], a[14], a[15], f[0], f[1], f[2]);
            break;
    }
}

}  // namespace

extern "C" int64_t step_graph_op_size() { return sizeof(Op); }

// out [rows] = table [ids[t]], rows of row_bytes each: a dense embedding's lookup in a captured step
extern "C" void embedding_rows(const int64_t *ids, const char *table, char *out, int64_t rows, int64_t row_bytes) {
    for (int64_t t = 0; t < rows; t++) std::memcpy(out + t * row_bytes, table + ids[t] * row_bytes, size_t(row_bytes));
}

// y [rows, n] fp32 whose row r starts with the n bf16 values a row-layout lm_head wrote there (row stride 2 n
// bf16): each widened in place to its fp32 value, the last first (fp32 i overwrites bf16 2 i and 2 i + 1,
// already read), so the logits are fp32 as an interleaved lm_head writes them (float_out), no extra buffer
extern "C" void widen_bf16_rows(float *y, int64_t rows, int64_t n) {
    for (int64_t r = 0; r < rows; r++) {
        float *row = y + r * n;
        const uint16_t *bf16 = reinterpret_cast<const uint16_t *>(row);
        for (int64_t i = n - 1; i >= 0; i--) {
            const uint32_t bits = uint32_t(bf16[i]) << 16;
            std::memcpy(row + i, &bits, 4);
        }
    }
}

// ops[0 .. num_ops) in order, each with its rows slot set to rows (the array is left as it was)
extern "C" void run_step_graph(const Op *ops, int64_t num_ops, int64_t rows) {
    for (int64_t i = 0; i < num_ops; i++) {
        Op op = ops[i];
        op.ints[op.rows_slot] = rows;
        run(op);
    }
}

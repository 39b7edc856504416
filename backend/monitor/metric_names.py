"""Which Prometheus names each serving engine uses, per normalised quantity (their documented names).

``SIGNATURES`` recognises an engine by a metric-name prefix, most specific first: our server uses
vLLM's names plus a few ``playground:`` ones."""

from __future__ import annotations

# normalised name -> candidate sample names, first present wins
_VLLM = {
    "num_requests_running": ("vllm:num_requests_running",),
    "num_requests_waiting": ("vllm:num_requests_waiting",),
    "kv_cache_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    "prompt_tokens_total": ("vllm:prompt_tokens_total",),
    "generation_tokens_total": ("vllm:generation_tokens_total",),
    "num_preemptions_total": ("vllm:num_preemptions_total",),
    "prefix_cache_queries_total": ("vllm:prefix_cache_queries_total",),
    "prefix_cache_hits_total": ("vllm:prefix_cache_hits_total",),
    "spec_decode_num_drafts_total": ("vllm:spec_decode_num_drafts_total",),
    "spec_decode_num_draft_tokens_total": ("vllm:spec_decode_num_draft_tokens_total",),
    "spec_decode_num_accepted_tokens_total": ("vllm:spec_decode_num_accepted_tokens_total",),
    "ttft": ("vllm:time_to_first_token_seconds",),
    "itl": ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
}
ENGINE_METRICS: dict[str, dict[str, tuple[str, ...]]] = {
    "embedded": _VLLM
    | {
        "num_kv_blocks_used": ("playground:kv_cache_blocks_used",),
        "num_kv_blocks_total": ("playground:kv_cache_blocks_total",),
        "compute_threads": ("playground:compute_threads",),
    },
    "vllm": _VLLM,
    "sglang": {
        "num_requests_running": ("sglang:num_running_reqs",),
        "num_requests_waiting": ("sglang:num_queue_reqs",),
        "kv_cache_usage": ("sglang:token_usage",),
        "prompt_tokens_total": ("sglang:prompt_tokens_total",),
        "generation_tokens_total": ("sglang:generation_tokens_total",),
        "prefix_cache_hit_rate": ("sglang:cache_hit_rate",),
        "ttft": ("sglang:time_to_first_token_seconds",),
        "itl": ("sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds"),
    },
    "tgi": {
        "num_requests_running": ("tgi_batch_current_size",),
        "num_requests_waiting": ("tgi_queue_size",),
        "prompt_tokens_total": ("tgi_request_input_length_sum",),
        "generation_tokens_total": ("tgi_request_generated_tokens_sum",),
        "itl": ("tgi_request_mean_time_per_token_duration",),
    },
    "llamacpp": {
        "num_requests_running": ("llamacpp:requests_processing",),
        "num_requests_waiting": ("llamacpp:requests_deferred",),
        "kv_cache_usage": ("llamacpp:kv_cache_usage_ratio",),
        "prompt_tokens_total": ("llamacpp:prompt_tokens_total",),
        "generation_tokens_total": ("llamacpp:tokens_predicted_total",),
    },
    "trtllm": {
        "num_requests_running": ("trtllm_num_requests_running",),
        "num_requests_waiting": ("trtllm_num_requests_waiting",),
        "kv_cache_usage": ("trtllm_kv_cache_utilization",),
        "ttft": ("trtllm_time_to_first_token_seconds",),
        "itl": ("trtllm_time_per_output_token_seconds",),
    },
}
SIGNATURES = (
    ("embedded", "playground:"),
    ("vllm", "vllm:"),
    ("sglang", "sglang:"),
    ("llamacpp", "llamacpp:"),
    ("tgi", "tgi_"),
    ("trtllm", "trtllm_"),
)

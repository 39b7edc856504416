"""The forms the UI handler tests send: the Plan and Export tabs' fields by name, as Gradio passes them."""

from __future__ import annotations

PLAN_FORM = dict(
    model="meta-llama/Llama-3.1-8B-Instruct",
    gpu="H100-80GB",
    num_gpus=1,
    tp=0,
    pp=1,
    quant="bf16",
    kv_dtype="auto",
    max_len=0,
    input_len=1024,
    output_len=256,
    concurrency=16,
    util=0.92,
    engine="vllm",
    vllm_version="0.33.0",
    ttft=0,
    tpot=0,
)
EXPORT_FORM = dict(
    plan=None,
    engines=["vllm"],
    formats=["shell", "compose"],
    host="127.0.0.1",
    port=8000,
    served="",
    api_key="",
    speculative="off",
)

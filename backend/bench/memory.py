"""Where resident memory goes: a process's mappings by kind, and the embedded engine's own account.

    python -m backend.bench.memory --pid PID       # any process: our server, vLLM's API server, EngineCore
    python -m backend.bench.memory --model DIR     # the engine in this process, set up as compare serves it,
                                                   # before and after a workload

The outside view reads /proc/PID/smaps (Linux) and groups mappings: shared libraries, mapped model files,
the KV pool (anonymous mappings holding it, when the engine runs here), other anonymous memory (tensors,
allocator caches, Python objects) and stacks. Rss counts pages of shared libraries once per process (Pss
splits them among the processes mapping them). The inside view adds what the engine knows: its weights
(packed oneDNN copies included), and the KV pool's reserved and committed bytes.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, field

MIB = 1024**2
HEADER = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) \S+ \S+ \S+ \S+\s*(.*)$")
MODEL_FILES = (".safetensors", ".gguf", ".bin", ".pt")


@dataclass(slots=True)
class Mapping:
    start: int
    end: int
    path: str
    kb: dict[str, int] = field(default_factory=dict)  # Rss, Pss, Private_Dirty, ... in kB


def read_smaps(pid: int | str = "self") -> list[Mapping]:
    maps: list[Mapping] = []
    with open(f"/proc/{pid}/smaps", encoding="utf-8", errors="replace") as smaps:
        for line in smaps:
            header = HEADER.match(line)
            if header:
                maps.append(Mapping(int(header[1], 16), int(header[2], 16), header[3].strip()))
            elif line.endswith(" kB\n") and maps:
                key, value = line.split(":", 1)
                maps[-1].kb[key] = int(value.split()[0])
    return maps


def kind(mapping: Mapping, kv_ranges: list[tuple[int, int]]) -> str:
    path = mapping.path
    if path.startswith("/dev/zero") or any(s < mapping.end and mapping.start < e for s, e in kv_ranges):
        # Python's mmap.mmap(-1, n) (the KV pool, model_runner.kv_pool) shows as "/dev/zero (deleted)"
        return "KV pool (anonymous mmap; pages committed when first written)"
    if path.endswith(MODEL_FILES):
        return "model files mapped (safetensors / GGUF)"
    if ".so" in path:
        return "shared libraries (torch, oneDNN, Python modules)"
    if path.startswith("[stack"):
        return "stacks"
    if path in ("", "[heap]") or path.startswith("[anon"):
        return "anonymous: weights, activations, allocator caches, Python objects"
    return "other (the executable, locale files, vdso)"


def by_kind(maps: list[Mapping], kv_ranges: list[tuple[int, int]] | None = None) -> dict[str, dict[str, int]]:
    """kind -> {"rss": bytes, "pss": bytes}, largest first."""
    totals: dict[str, dict[str, int]] = {}
    for mapping in maps:
        entry = totals.setdefault(kind(mapping, kv_ranges or []), {"rss": 0, "pss": 0})
        entry["rss"] += mapping.kb.get("Rss", 0) * 1024
        entry["pss"] += mapping.kb.get("Pss", 0) * 1024
    return dict(sorted(totals.items(), key=lambda item: -item[1]["rss"]))


def format_kinds(totals: dict[str, dict[str, int]]) -> str:
    lines = [f"  {'kind':<68} {'RSS MiB':>9} {'PSS MiB':>9}"]
    lines += [f"  {k:<68} {v['rss'] / MIB:>9.1f} {v['pss'] / MIB:>9.1f}" for k, v in totals.items()]
    rss, pss = sum(v["rss"] for v in totals.values()), sum(v["pss"] for v in totals.values())
    lines.append(f"  {'total':<68} {rss / MIB:>9.1f} {pss / MIB:>9.1f}")
    return "\n".join(lines)


def engine_account(llm) -> dict[str, int]:
    """What the engine holds by its own count: weights (packed copies included) and the KV pool."""
    runner = llm.llm_engine.runner
    ranges = kv_ranges(llm)
    committed = sum(
        m.kb.get("Rss", 0) * 1024 for m in read_smaps() if any(s < m.end and m.start < e for s, e in ranges)
    )
    graph = runner.decode_graph
    return {
        "weights (packed oneDNN copies included)": runner.model.weights_bytes(),
        "KV pool reserved (virtual)": runner.kv_pool_bytes,
        "KV pool committed (resident)": committed,
        "captured decode step's buffers": graph.buffer_bytes if graph is not None else 0,
    }


def kv_ranges(llm) -> list[tuple[int, int]]:
    tensors = [t for pair in llm.llm_engine.runner.kv_caches for t in pair]
    return [(t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()) for t in tensors]


def run_workload(llm, num_prompts: int, input_len: int, output_len: int) -> None:
    """Random-token prompts (compare's `random` dataset), greedy, ignore_eos, all at once."""
    from backend.bench.compare import Workload
    from backend.bench.compare_offline import token_prompts
    from backend.bench.offline import Workload as TokenWorkload
    from backend.bench.offline import run_engine

    model = llm.llm_engine.config.model
    work = Workload("random", num_prompts, 1, input_len, output_len, ignore_eos=True, tokenizer=model)
    ids = token_prompts(work, model)
    run_engine(llm, TokenWorkload(ids["prompts"], ids["max_tokens"]))


def inside(args: argparse.Namespace) -> None:
    from dataclasses import asdict

    from backend.bench.compare_targets import LocalTargets, model_folder
    from backend.engine import LLM  # torch: only when the engine runs here

    model = model_folder(args.model, args.cache)
    print("after imports (Python, torch, transformers):")
    print(format_kinds(by_kind(read_smaps())), flush=True)
    local = LocalTargets(model, args.max_model_len, args.max_num_seqs)
    config = asdict(local.engine_config(args.max_num_seqs))
    llm = LLM(config.pop("model"), **config)
    for stage in ("after loading the engine", f"after {args.num_prompts} prompts"):
        if stage != "after loading the engine":
            run_workload(llm, args.num_prompts, args.input_len, args.output_len)
        print(f"\n{stage}:")
        print(format_kinds(by_kind(read_smaps(), kv_ranges(llm))))
        for name, nbytes in engine_account(llm).items():
            print(f"  engine: {name:<60} {nbytes / MIB:>9.1f}")


def main(args: argparse.Namespace) -> int:
    if args.pid:
        for pid in args.pid:
            print(f"pid {pid}:")
            print(format_kinds(by_kind(read_smaps(pid))))
        return 0
    inside(args)
    return 0


if __name__ == "__main__":
    from pathlib import Path

    from backend.bench.compare_targets import dense_cache_dir

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pid", type=int, nargs="*", help="processes to read (instead of --model)")
    parser.add_argument("--model", default=None, help="model folder or .gguf (default: the packaged model)")
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--input-len", type=int, default=256)
    parser.add_argument("--output-len", type=int, default=128)
    parser.set_defaults(cache=Path(dense_cache_dir()))
    raise SystemExit(main(parser.parse_args()))

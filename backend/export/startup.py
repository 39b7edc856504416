"""Startup phases of an external engine, read from its log lines (vLLM's messages; others: started/ready).

A phase is (pattern, fraction of the startup done, label); the last pattern seen wins. vLLM also logs the
KV-cache size it allocated, which is kept as a number (tokens) for the memory comparison.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# vLLM 0.32-0.33 log messages in startup order (engine core, worker, API server)
VLLM_PHASES = (
    (r"Initializing a V1 LLM engine", 0.10, "initialising the engine"),
    (r"Starting to load model|Loading weights|Loading safetensors", 0.25, "loading weights"),
    (r"Model loading took|Loading weights took", 0.45, "weights loaded"),
    (
        r"Warming up model|torch\.compile|Compiling a graph|Compile and warming up",
        0.60,
        "compiling / warming up",
    ),
    (r"KV cache size: [\d,]+ tokens", 0.80, "KV cache allocated"),
    (r"init engine \(profile, create kv cache, warmup model\) took", 0.90, "engine ready, starting the API"),
    (r"Starting vLLM API server|Application startup complete", 0.97, "API server starting"),
)
GENERIC_PHASES = (
    (r"Application startup complete|server is listening|HTTP server listening", 0.97, "listening"),
)
EXCEPTION = re.compile(r"\b[A-Z]\w*(Error|Exception): .*")
KV_TOKENS = re.compile(r"KV cache size: ([\d,]+) tokens")


@dataclass(slots=True)
class Startup:
    """Where a starting engine is, from the log lines seen so far."""

    engine: str
    progress: float = 0.02
    phase: str = "starting the process"
    kv_cache_tokens: int | None = None

    def feed(self, line: str) -> None:
        for pattern, fraction, label in VLLM_PHASES if self.engine == "vllm" else GENERIC_PHASES:
            if fraction > self.progress and re.search(pattern, line):
                self.progress, self.phase = fraction, label
        if match := KV_TOKENS.search(line):
            self.kv_cache_tokens = int(match.group(1).replace(",", ""))


def error_lines(lines: list[str], limit: int = 12, last: int = 8) -> list[str]:
    """The engine's own error lines: each distinct exception message (`XError: why`), then the last lines."""
    tail = lines[-400:]
    messages = []
    for line in tail:
        match = EXCEPTION.search(line)
        if match and match.group(0) not in messages:
            messages.append(match.group(0))
    return [*messages[-limit:], "…", *tail[-last:]]

"""Test-only fault injection: makes the engine raise inside a step for chosen requests.

Set PLAYGROUND_TEST_FAULT_INJECTION="<phase>:<marker>[,<phase>:<marker>...]" before the engine starts
(off when unset; never set it in production). Every sequence whose prompt contains a <marker> then
raises InjectedFault in that phase of each step: "execute" (the model's forward pass, shared by the
whole batch) or "sample" (that sequence's own sampling). Tests use it to show that a failure costs only
the requests concerned.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence as Seqs
from dataclasses import dataclass
from typing import Any

from backend.engine.sequence import Sequence

log = logging.getLogger(__name__)
ENV_VAR = "PLAYGROUND_TEST_FAULT_INJECTION"
PHASES = ("execute", "sample")


class InjectedFault(RuntimeError):
    """The exception a test asked for."""


@dataclass(slots=True)
class FaultInjector:
    faults: list[tuple[str, str]]  # (phase, marker)
    tokenizer: Any

    def check(self, phase: str, seqs: Seqs[Sequence]) -> None:
        markers = [marker for fault_phase, marker in self.faults if fault_phase == phase]
        for seq in seqs if markers else ():
            prompt = self.tokenizer.decode(seq.token_ids[: seq.num_prompt_tokens])
            if any(marker in prompt for marker in markers):
                raise InjectedFault(f"fault injected by {ENV_VAR} while in phase {phase!r}")


def fault_injector_from_env(tokenizer: Any) -> FaultInjector | None:
    value = os.environ.get(ENV_VAR, "")
    if not value:
        return None
    faults = [(phase, marker) for phase, _, marker in (item.partition(":") for item in value.split(","))]
    if not all(phase in PHASES and marker for phase, marker in faults):
        raise ValueError(f"{ENV_VAR} must be '<phase>:<marker>,...' with phase in {PHASES}, got {value!r}")
    log.warning("TEST-ONLY fault injection is on (%s=%s)", ENV_VAR, value)
    return FaultInjector(faults, tokenizer)


def check_fault(injector: FaultInjector | None, phase: str, seqs: Seqs[Sequence]) -> None:
    """Raise InjectedFault when a test asked for one in this phase for one of seqs (no-op when off)."""
    if injector is not None:
        injector.check(phase, seqs)

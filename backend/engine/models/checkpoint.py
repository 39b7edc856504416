"""CheckpointNames: how a model's parameters are spelled in a transformers checkpoint, and the checks that
a checkpoint fits the model that its config.json describes.

A checkpoint names projections one by one (q_proj, k_proj, v_proj); the model fuses some of them
(packed_modules_mapping: qkv_proj holds q, k and v rows in turn). `check` runs on the model built on the
meta device, before any memory is allocated: a config whose sizes do not match the weights fails there.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

import torch


@dataclass(slots=True)
class CheckpointNames:
    params: dict[str, torch.Tensor]  # the model's own parameter names -> parameters (only shapes are read)
    packed_modules_mapping: Mapping[str, tuple[str, ...]]  # fused module -> checkpoint projections in order
    skips_lm_head: bool  # a tied model ignores a checkpoint's lm_head.weight

    def target(self, name: str) -> tuple[str, int | None] | None:
        """(own parameter, index among its fused parts or None) of a checkpoint tensor; None: not used."""
        name = name.removeprefix("model.")
        if name == "lm_head.weight" and self.skips_lm_head:
            return None
        pieces = name.split(".")
        for fused, parts in self.packed_modules_mapping.items():
            if len(pieces) >= 2 and pieces[-2] in parts:
                return ".".join([*pieces[:-2], fused, pieces[-1]]), parts.index(pieces[-2])
        return name, None

    def check(self, shapes: Mapping[str, tuple[int, ...]], quantized_names: Collection[str] = ()) -> None:
        """ValueError unless every dense tensor (shapes) fits its parameter and every parameter is in the
        checkpoint, dense or quantized; read before allocating the model."""
        for name, shape in shapes.items():
            found = self.target(name)
            if found is None:
                continue
            own, index = found
            if own not in self.params:
                raise ValueError(f"unexpected weight {name!r} in the checkpoint")
            expected = tuple(self.params[own].shape)
            compared = slice(None) if index is None else slice(1, None)  # a fused part: its rows are a share
            if tuple(shape)[compared] != expected[compared]:
                raise ValueError(
                    f"weight {name!r} has shape {tuple(shape)}, but config.json's sizes make "
                    f"{own} {expected}: the config does not describe these weights"
                )
        targets = {t[0] for t in map(self.target, [*shapes, *quantized_names]) if t is not None}
        missing = sorted(set(self.params) - targets)
        if missing:
            raise ValueError(f"weights missing from the checkpoint: {missing[:5]}")

    def gather(self, state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Own parameter name -> its tensor, fused parts concatenated in order; ValueError for a weight
        that is unexpected, missing or of another shape."""
        self.check({name: tuple(t.shape) for name, t in state.items()})
        whole: dict[str, torch.Tensor] = {}
        parts: dict[str, dict[int, torch.Tensor]] = {}
        for name, tensor in state.items():
            found = self.target(name)
            if found is None:
                continue
            own, index = found
            if index is None:
                whole[own] = tensor
            else:
                parts.setdefault(own, {})[index] = tensor
        for own, shards in parts.items():
            whole[own] = torch.cat([shards[i] for i in sorted(shards)], dim=0)
            shape, expected = tuple(whole[own].shape), tuple(self.params[own].shape)
            if shape != expected:
                raise ValueError(
                    f"{own}: the checkpoint's {len(shards)} parts of it make {shape}, not {expected}"
                )
        return whole

"""LLM: the offline entry point, vLLM's `LLM(model).generate(prompts, params)` and `.chat(...)`."""

from __future__ import annotations

import itertools
from typing import Any, cast

import torch

from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.load_phases import LoadPhases
from backend.engine.outputs import RequestOutput
from backend.engine.sampling_params import SamplingParams
from backend.engine.stats import EngineStats

Prompt = str | list[int]


class LLM:
    def __init__(self, model: str, phases: LoadPhases | None = None, **kwargs: Any) -> None:
        """kwargs: any EngineConfig field (dtype, max_num_seqs, num_kv_blocks, ...); others are refused.
        phases, if given, records where the load's time goes (load_phases.py)."""
        config = EngineConfig.from_kwargs(model, **kwargs)
        self.llm_engine = LLMEngine(config, phases)
        self._request_ids = itertools.count()

    @property
    def tokenizer(self) -> Any:
        return self.llm_engine.tokenizer

    @property
    def model_name(self) -> str:
        return self.llm_engine.model_name

    @property
    def max_model_len(self) -> int:
        return self.llm_engine.max_model_len

    @property
    def device(self) -> str:
        return str(self.llm_engine.device)

    @property
    def dtype(self) -> torch.dtype:
        return self.llm_engine.dtype

    def stats(self) -> EngineStats:
        return self.llm_engine.stats()

    def generate(
        self,
        prompts: Prompt | list[str] | list[list[int]],
        params: SamplingParams | list[SamplingParams] | None = None,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        """Run all prompts to completion with continuous batching; outputs in the order of the prompts."""
        prompt_list = as_prompt_list(prompts)
        params = params if params is not None else SamplingParams()
        params_list = params if isinstance(params, list) else [params] * len(prompt_list)
        if len(params_list) != len(prompt_list):
            raise ValueError(f"got {len(prompt_list)} prompts but {len(params_list)} SamplingParams")
        engine = self.llm_engine
        processed = [engine.process_inputs(p, sp) for p, sp in zip(prompt_list, params_list, strict=True)]
        ids = [f"llm-{next(self._request_ids)}" for _ in prompt_list]
        for request_id, (text, token_ids), sp in zip(ids, processed, params_list, strict=True):
            engine.add_processed_request(request_id, text, token_ids, sp)
        results: dict[str, RequestOutput] = {}
        bar = _progress(len(ids)) if use_tqdm else None
        try:
            while len(results) < len(ids):
                for out in engine.step():
                    if out.finished:
                        results[out.request_id] = out
                        if bar is not None:
                            bar.update(1)
        finally:
            for request_id in ids:
                if request_id not in results:
                    engine.abort_request(request_id)
            if bar is not None:
                bar.close()
        return [results[request_id] for request_id in ids]

    def chat(
        self,
        messages: list[dict[str, str]] | list[list[dict[str, str]]],
        params: SamplingParams | list[SamplingParams] | None = None,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        """Apply the model's chat template to each conversation, then generate."""
        single = bool(messages) and isinstance(messages[0], dict)
        conversations = (
            [cast(list[dict[str, str]], messages)] if single else cast(list[list[dict[str, str]]], messages)
        )
        prompts = [self.chat_prompt(conversation) for conversation in conversations]
        return self.generate(prompts, params, use_tqdm=use_tqdm)

    def chat_prompt(self, conversation: list[dict[str, str]]) -> list[int]:
        """Token ids of one conversation, templated with a generation prompt for the assistant."""
        text = self.tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
        return list(self.tokenizer(text, add_special_tokens=False).input_ids)


def as_prompt_list(prompts: Prompt | list[str] | list[list[int]]) -> list[Prompt]:
    """One prompt (a string or a list of token ids) or a list of them, as a list of prompts."""
    if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
        return [prompts]
    return cast(list[Prompt], list(prompts))


def _progress(total: int):
    from tqdm import tqdm

    return tqdm(total=total, desc="Generating", unit="req")

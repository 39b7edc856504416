"""Request: one prompt with its n sequences; builds the RequestOutput a caller sees.

It is vLLM v1's ParentRequest and output processor in one: the n sequences are its child requests (one
per sample, SamplingParams.n) and output() fans their completions back in, in index order, with the
prompt logprobs its first sequence gathered while prefilling.
"""

from __future__ import annotations

from dataclasses import dataclass

from backend.engine.outputs import CompletionOutput, RequestMetrics, RequestOutput
from backend.engine.sampling_params import SamplingParams
from backend.engine.sequence import Sequence


@dataclass(slots=True)
class Request:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    seqs: list[Sequence]
    metrics: RequestMetrics

    @property
    def finished(self) -> bool:
        return all(seq.is_finished for seq in self.seqs)

    def output(self) -> RequestOutput:
        prompt_logprobs = self.seqs[0].prompt_logprobs
        return RequestOutput(
            request_id=self.request_id,
            prompt=self.prompt,
            prompt_token_ids=self.prompt_token_ids,
            outputs=[completion(seq) for seq in self.seqs],
            finished=self.finished,
            metrics=self.metrics,
            prompt_logprobs=(
                list(prompt_logprobs.entries)
                if prompt_logprobs is not None and prompt_logprobs.entries is not None
                else None
            ),
            prompt_logprobs_tensor=prompt_logprobs.tensor() if prompt_logprobs is not None else None,
        )


def completion(seq: Sequence) -> CompletionOutput:
    text = seq.detokenizer.text
    if not seq.is_finished and seq.params.stop_strings:
        # hold back what could still turn out to be the start of a stop string
        hold = max(len(s) for s in seq.params.stop_strings) - 1
        text = text[: max(0, len(text) - hold)]
    return CompletionOutput(
        index=seq.index,
        text=text,
        token_ids=seq.output_token_ids,
        logprobs=list(seq.logprobs) if seq.logprobs is not None else None,
        finish_reason=seq.finish_reason,
        stop_reason=seq.stop_reason,
    )

"""/v1/completions bodies (object "text_completion"): one choice per prompt and sample, `echo`, and the
legacy logprobs object.

OpenAI's legacy logprobs are four parallel lists: `tokens`, `token_logprobs`, `top_logprobs` (token text
-> logprob of the top `logprobs` tokens) and `text_offset` (where each token starts in the choice's text).
With `echo` the choice's text starts with its prompt and the lists start with the prompt's tokens: the
first has no logprob (None in `token_logprobs` and `top_logprobs`), as OpenAI and vLLM send it. With
echo and max_tokens=0 (`echo_only`) the engine samples one token that is not sent: the choice is the
prompt alone, with finish_reason "length" and no completion tokens.
"""

from __future__ import annotations

from backend.server.responses import ChoiceStream, ResponseFormatter, prompt_logprobs_json


class CompletionFormatter(ResponseFormatter):
    object_name = "text_completion"
    chunk_object_name = "text_completion"
    id_prefix = "cmpl"

    def __init__(
        self,
        model: str,
        tokenizer,
        top_logprobs: int | None,
        n: int = 1,
        echo_prompts: list[str] | None = None,
        echo_only: bool = False,
    ):
        """echo_prompts: each prompt's text when the request echoes them (None: no echo)."""
        super().__init__(model, tokenizer, top_logprobs, n)
        self.echo_prompts = echo_prompts
        self.echo_only = echo_only

    def logprobs(self, stream: ChoiceStream, ids: list[int], logprobs: list | None) -> dict | None:
        if logprobs is None or self.top_logprobs is None:
            return None
        out: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for tid, entries in zip(ids, logprobs, strict=True):
            token = self.token_text(tid, None if entries is None else entries.get(tid))
            out["tokens"].append(token)
            if entries is None:  # the first prompt token
                out["token_logprobs"].append(None)
                out["top_logprobs"].append(None)
            else:
                out["token_logprobs"].append(entries[tid].logprob)
                ranked = self.ranked(entries)
                out["top_logprobs"].append({self.token_text(a, lp): lp.logprob for a, lp in ranked})
            out["text_offset"].append(stream.text_offset)
            stream.text_offset += len(token)
        return out

    def usage(self, outputs: list) -> dict:
        usage = super().usage(outputs)
        if self.echo_only:  # the one sampled token is not sent
            usage["completion_tokens"], usage["total_tokens"] = 0, usage["prompt_tokens"]
        return usage

    def echoed(self, prompt_index: int, output) -> tuple[str, list[int], list | None]:
        """The prompt's text, token ids and logprob dicts (echo)."""
        assert self.echo_prompts is not None
        return self.echo_prompts[prompt_index], list(output.prompt_token_ids), output.prompt_logprobs

    def choice_delta(self, prompt_index: int, output, comp) -> tuple[str, list[int], list | None] | None:
        """What a chunk of this choice carries now (None: nothing yet)."""
        stream = self.stream(self.choice_index(prompt_index, comp.index))
        if self.echo_only:
            return self.echoed(prompt_index, output) if comp.finished and not stream.started else None
        text, ids, logprobs = self.take_delta(stream, comp)
        if self.echo_prompts is not None and not stream.started and (text or ids or comp.finished):
            prompt_text, prompt_ids, prompt_logprobs = self.echoed(prompt_index, output)
            text, ids = prompt_text + text, prompt_ids + ids
            if logprobs is not None and prompt_logprobs is not None:
                logprobs = prompt_logprobs + logprobs
        if not text and not ids and not comp.finished:
            return None
        return text, ids, logprobs

    def choice(self, prompt_index: int, output, comp, delta: tuple[str, list[int], list | None]) -> dict:
        index = self.choice_index(prompt_index, comp.index)
        stream = self.stream(index)
        stream.started = True
        text, ids, logprobs = delta
        choice = {
            "index": index,
            "text": text,
            "logprobs": self.logprobs(stream, ids, logprobs),
            "finish_reason": "length" if self.echo_only else comp.finish_reason,
        }
        return choice

    def first_chunks(self, include_usage: bool) -> list[dict]:
        return []

    def chunks(self, prompt_index: int, output, include_usage: bool) -> list[dict]:
        out = []
        for comp in output.outputs:
            delta = self.choice_delta(prompt_index, output, comp)
            if delta is not None:
                out.append(self.chunk_envelope(self.choice(prompt_index, output, comp, delta), include_usage))
        return out

    def response(self, outputs: list) -> dict:
        choices = []
        for prompt_index, output in enumerate(outputs):
            prompt_logprobs = prompt_logprobs_json(output.prompt_logprobs)
            for comp in output.outputs:
                if self.echo_only:
                    delta = self.echoed(prompt_index, output)
                elif self.echo_prompts is not None:
                    text, ids, logprobs = self.echoed(prompt_index, output)
                    if logprobs is not None and comp.logprobs is not None:
                        logprobs = logprobs + comp.logprobs
                    delta = (text + comp.text, ids + comp.token_ids, logprobs)
                else:
                    delta = (comp.text, comp.token_ids, comp.logprobs)
                choice = self.choice(prompt_index, output, comp, delta)
                choice["stop_reason"] = None if self.echo_only else comp.stop_reason
                if prompt_logprobs is not None:
                    choice["prompt_logprobs"] = prompt_logprobs
                choices.append(choice)
        return self.envelope(self.object_name, choices, usage=self.usage(outputs))

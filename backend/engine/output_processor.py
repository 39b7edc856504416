"""After sampling: append the token, record logprobs, detokenize, and decide whether the sequence stops."""

from __future__ import annotations

from typing import Any

import torch

from backend.engine.outputs import Logprob
from backend.engine.sequence import Sequence


def token_logprobs(row: torch.Tensor, token_id: int, top_n: int, tokenizer: Any) -> dict[int, Logprob]:
    """The sampled token's logprob and rank plus the top_n most likely tokens, from one row of logprobs."""
    chosen = float(row[token_id])
    entries = {token_id: Logprob(chosen, int((row > chosen).sum()) + 1, tokenizer.decode([token_id]))}
    if top_n:
        values, ids = torch.topk(row, top_n)
        for rank, (value, tid) in enumerate(zip(values.tolist(), ids.tolist(), strict=True), start=1):
            if tid not in entries:
                entries[tid] = Logprob(value, rank, tokenizer.decode([tid]))
    return entries


def find_stop_string(text: str, new_chars: int, stops: list[str]) -> tuple[int, str] | None:
    """Earliest stop string that ends inside the last new_chars characters: (position, stop)."""
    best: tuple[int, str] | None = None
    for stop in stops:
        pos = text.find(stop, max(0, len(text) - new_chars - len(stop) + 1))
        if pos != -1 and (best is None or pos < best[0]):
            best = (pos, stop)
    return best


def append_token(seq: Sequence, token_id: int, eos_token_ids: list[int], max_model_len: int) -> None:
    """Append one sampled token; set seq.finish_reason / stop_reason if the sequence is done."""
    params = seq.params
    seq.token_ids.append(token_id)
    if seq.grammar is not None:
        seq.grammar.accept_token(token_id)
    if not params.ignore_eos and token_id in eos_token_ids:
        seq.finish_reason = "stop"
    elif token_id in (params.stop_token_ids or ()):
        seq.finish_reason, seq.stop_reason = "stop", token_id
    else:
        delta = seq.detokenizer.add_token(token_id)
        if delta and params.stop_strings:
            found = find_stop_string(seq.detokenizer.text, len(delta), params.stop_strings)
            if found is not None:
                seq.detokenizer.text = seq.detokenizer.text[: found[0]]
                seq.finish_reason, seq.stop_reason = "stop", found[1]
                return
    if seq.finish_reason is None and seq.grammar is not None and seq.grammar.is_terminated():
        seq.finish_reason = "stop"  # the grammar is complete: nothing but EOS could follow
    if seq.finish_reason is None:
        max_tokens = params.max_tokens or max_model_len
        if seq.num_output_tokens >= max_tokens or len(seq.token_ids) >= max_model_len:
            seq.finish_reason = "length"
    if seq.finish_reason is not None:
        seq.detokenizer.flush()

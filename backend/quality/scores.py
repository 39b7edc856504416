"""ChunkScores: one model's next-token distributions at the scored positions of one chunk, and the
per-token comparison of a model's chunk with the reference's (llama.cpp's `log_softmax(..., kld)`).

An engine source gives whole log-softmax rows (`SamplingParams(return_prompt_logprobs_tensor=True)`); a
server gives what the OpenAI API's `prompt_logprobs=k` carries: each position's token and its k most
likely tokens. From these:
- NLL of the actual next token: exact from either.
- Same top: the model's most likely token equals the reference's: exact from either (rank 1).
- KL(reference || model) = sum_v p(v) (log p(v) - log q(v)) over the whole vocabulary: exact only when
  both sides are whole rows. Against a server's top-k it is the KL of both distributions coarsened to
  {each token the server named, everything else}: by the data-processing inequality a LOWER BOUND on the
  true KL, and reported as one (`KldKind`). With a reference from a server there is no KL.
Unlike llama.cpp, which keeps the reference as 16-bit log-probs over [max - 16, max] and skips terms with
log p <= -16, the reference rows are kept whole in float32 (reference.py), so the KL is exact.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

KldKind = Literal["exact", "lower bound", "n/a"]
KL_ROWS_AT_ONCE = 64  # rows per float64 pass: 64 x a 152k vocabulary is 78 MB


@dataclass(slots=True)
class ChunkScores:
    token_logprobs: torch.Tensor  # [m] float64, log q(the actual next token)
    top_ids: torch.Tensor  # [m] int64, the most likely token
    rows: torch.Tensor | None = None  # [m, vocab] float32 log-softmax (engine sources)
    top_logprobs: list[dict[int, float]] | None = None  # [m] the server's top-k and the token (servers)

    @classmethod
    def from_rows(cls, rows: torch.Tensor, targets: list[int]) -> ChunkScores:
        """rows: [m, vocab] log-softmax; targets: the m next tokens."""
        index = torch.tensor(targets, dtype=torch.long)[:, None]
        return cls(rows.gather(1, index)[:, 0].double(), rows.argmax(-1), rows=rows)


@dataclass(slots=True)
class TokenStats:
    """Per scored token of one chunk: the model's and the reference's NLL, the KL, same top token."""

    nll: torch.Tensor  # [m] float64
    nll_base: torch.Tensor  # [m] float64
    kld: torch.Tensor | None  # [m] float64; None: no KL from these sources
    same_top: torch.Tensor  # [m] bool
    kld_kind: KldKind


def compare_chunk(reference: ChunkScores, model: ChunkScores) -> TokenStats:
    """The model's chunk against the reference's (same tokens, same positions)."""
    assert reference.token_logprobs.shape == model.token_logprobs.shape, "chunks of different lengths"
    kld: torch.Tensor | None
    kind: KldKind
    if reference.rows is not None and model.rows is not None:
        if reference.rows.shape != model.rows.shape:
            raise ValueError(
                f"the models' vocabularies differ ({reference.rows.shape[1]} vs {model.rows.shape[1]} "
                "tokens): KL needs the same vocabulary"
            )
        kld, kind = kl_rows(reference.rows, model.rows), "exact"
    elif reference.rows is not None and model.top_logprobs is not None:
        kld, kind = kl_lower_bound(reference.rows, model.top_logprobs), "lower bound"
    else:
        kld, kind = None, "n/a"
    return TokenStats(
        nll=-model.token_logprobs,
        nll_base=-reference.token_logprobs,
        kld=kld,
        same_top=model.top_ids == reference.top_ids,
        kld_kind=kind,
    )


def kl_rows(reference: torch.Tensor, model: torch.Tensor) -> torch.Tensor:
    """KL(p || q) per row of two [m, vocab] log-softmax tensors, summed in float64 (p = 0 adds 0)."""
    out = torch.empty(reference.shape[0], dtype=torch.float64)
    for start in range(0, reference.shape[0], KL_ROWS_AT_ONCE):
        p = reference[start : start + KL_ROWS_AT_ONCE].double()
        q = model[start : start + KL_ROWS_AT_ONCE].double()
        terms = torch.where(p == -math.inf, 0.0, p.exp() * (p - q))
        out[start : start + KL_ROWS_AT_ONCE] = terms.sum(-1)
    return out


def kl_lower_bound(reference: torch.Tensor, top_logprobs: list[dict[int, float]]) -> torch.Tensor:
    """KL of the reference rows and the server's distributions, both coarsened to {each token the server
    named at that position, the rest}: a lower bound on the true KL (coarsening never raises a KL)."""
    out = torch.empty(len(top_logprobs), dtype=torch.float64)
    for i, entries in enumerate(top_logprobs):
        ids = torch.tensor(list(entries), dtype=torch.long)
        q = torch.tensor(list(entries.values()), dtype=torch.float64)
        p = reference[i, ids].double()
        kl = float(torch.where(p == -math.inf, 0.0, p.exp() * (p - q)).sum())
        p_rest = max(0.0, 1.0 - float(p.exp().sum()))
        q_rest = max(0.0, 1.0 - float(q.exp().sum()))
        # the rest's term, where it can be computed; when the server's named tokens already hold all its
        # mass (q_rest rounds to 0) the term is >= 0 and leaving it out keeps the bound a bound
        if p_rest > 0.0 and q_rest > 0.0:
            kl += p_rest * math.log(p_rest / q_rest)
        out[i] = kl
    return out

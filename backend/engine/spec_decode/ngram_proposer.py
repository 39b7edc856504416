"""NgramProposer: prompt lookup decoding (vLLM's `ngram` method), no model involved.

For n from prompt_lookup_max down to prompt_lookup_min, the sequence's last n tokens (prompt + output)
are searched for earlier in the sequence; at the first (earliest) match, the tokens that followed it
there are the proposal. Like vLLM, the longest n that matches wins. The search runs on the packed bytes
of the token ids (bytes.find, in C), checking that a hit is aligned to a whole token.
"""

from __future__ import annotations

from array import array

from backend.engine.sequence import Sequence
from backend.engine.spec_decode.config import SpeculativeConfig

ITEM = array("i").itemsize


class NgramProposer:
    def __init__(self, config: SpeculativeConfig) -> None:
        assert config.prompt_lookup_min is not None and config.prompt_lookup_max is not None
        self.min_n = config.prompt_lookup_min
        self.max_n = config.prompt_lookup_max

    def propose(self, seqs: list[Sequence], max_tokens: list[int]) -> list[list[int]]:
        return [self.lookup(seq.token_ids, n) for seq, n in zip(seqs, max_tokens, strict=True)]

    def free(self, seq: Sequence) -> None:
        """Nothing to free: the proposer keeps no state per sequence."""

    @property
    def num_used_blocks(self) -> int:
        return 0

    def lookup(self, token_ids: list[int], max_tokens: int) -> list[int]:
        """Up to max_tokens draft tokens that continue token_ids; [] when no n-gram recurs."""
        if max_tokens < 1 or len(token_ids) <= self.min_n:
            return []
        data = array("i", token_ids).tobytes()
        total = len(token_ids)
        for n in range(min(self.max_n, total - 1), self.min_n - 1, -1):
            start = _find_aligned(data, data[(total - n) * ITEM :], (total - 1) * ITEM)
            if start is not None:
                begin = start + n
                return token_ids[begin : begin + max_tokens]
        return []


def _find_aligned(data: bytes, needle: bytes, end: int) -> int | None:
    """Token index of the first whole-token occurrence of needle that ends by byte `end`."""
    pos = data.find(needle, 0, end)
    while pos != -1:
        if pos % ITEM == 0:
            return pos // ITEM
        pos = data.find(needle, pos + 1, end)
    return None

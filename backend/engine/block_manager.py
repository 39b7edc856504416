"""BlockManager: the paged KV cache's bookkeeping (no tensors here).

The KV pool is split into fixed-size blocks. A sequence owns a block_table (list of block ids). With
prefix caching, every full block whose KV has been computed gets a chained hash (SHA-256 of the hash of
the block before it plus its tokens, as vLLM since its hash-collision advisory), so a later sequence with
the same prefix reuses the block (ref_count + 1). The hash only finds a candidate: a hit is taken only
when the block's own tokens and its parent block match too, so even a hash collision can never serve
another prompt's KV. Freed blocks go to a free list in LRU order; a freed block keeps its hash until it
is reused for new data, so a cached prefix survives until memory is actually needed.

With a sliding_window (every layer of the model windowed: sliding_window.freeable_window), a running
sequence gives back the blocks wholly before its next token's window (free_skipped_blocks, vLLM's
remove_skipped_blocks); their entries in its block table become NULL_BLOCK, which no kernel reads. They
were cached like any full block, so a later prompt with the same prefix still finds them until evicted.

Parallel samples (SamplingParams.n) fork their prompt's block table: every block gains a reference. A
sequence about to write into a block others still hold (the prompt's last, partial block) first gets a
copy of it (copy-on-write, as in the PagedAttention paper); the copies to make before the step's forward
pass are taken with take_copies(). Full blocks are never written again, so they stay shared.
"""

from __future__ import annotations

import hashlib
import itertools
from array import array
from collections import OrderedDict
from dataclasses import dataclass

from backend.engine.sequence import Sequence
from backend.engine.sliding_window import NULL_BLOCK, first_needed_block

ROOT_HASH = b""  # the parent hash of a sequence's first block


def hash_block_tokens(parent_hash: bytes, token_ids: tuple[int, ...]) -> bytes:
    """vLLM's chained block hash: SHA-256 over the parent's hash and the block's token ids."""
    return hashlib.sha256(parent_hash + array("q", token_ids).tobytes()).digest()


@dataclass(slots=True)
class CachedBlock:
    """What a cached block holds, checked on every hit: its tokens and which cached block precedes it."""

    block_hash: bytes
    token_ids: tuple[int, ...]
    serial: int  # unique per caching, never reused: a parent that was evicted and re-cached differs
    parent_serial: int | None  # None for a sequence's first block


class BlockManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool = True,
        sliding_window: int | None = None,  # free blocks before it (only where every layer has it)
    ) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.sliding_window = sliding_window
        self.num_skipped_blocks = 0  # blocks given back because they fell before a window
        self.ref_counts = [0] * num_blocks
        self.cached: list[CachedBlock | None] = [None] * num_blocks
        self.hash_to_block: dict[bytes, int] = {}
        self._serials = itertools.count()
        # free blocks, evicted from the front: never-cached blocks first, then cached ones, oldest first
        self.free_blocks: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.prefix_cache_queries = 0  # tokens looked up
        self.prefix_cache_hits = 0  # tokens found
        self.pending_copies: list[tuple[int, int]] = []  # (source, destination) blocks, copy-on-write

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_blocks)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self.free_blocks)

    def blocks_needed(self, seq: Sequence, num_tokens: int) -> int:
        """New blocks seq needs to hold num_tokens more tokens after its computed ones (a copy of a
        shared block it writes into included)."""
        total = -(-(seq.num_computed_tokens + num_tokens) // self.block_size)
        copy = 1 if num_tokens > 0 and self._writes_shared_block(seq) else 0
        return max(0, total - len(seq.block_table)) + copy

    def _writes_shared_block(self, seq: Sequence) -> bool:
        """The block of seq's next token is partly filled and held by another sequence too."""
        index, offset = divmod(seq.num_computed_tokens, self.block_size)
        if offset == 0 or index >= len(seq.block_table):
            return False
        block_id = seq.block_table[index]
        return block_id != NULL_BLOCK and self.ref_counts[block_id] > 1

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """child shares parent's computed blocks (a parallel sample of the same prompt)."""
        assert not child.block_table and parent.num_computed_tokens > 0
        for block_id in parent.block_table:
            if block_id != NULL_BLOCK:  # freed before every window: nothing to share
                self.ref_counts[block_id] += 1
        child.block_table = list(parent.block_table)
        child.block_hashes = list(parent.block_hashes)
        child.num_computed_tokens = parent.num_computed_tokens

    def take_copies(self) -> list[tuple[int, int]]:
        """The (source, destination) block copies to make before the step's forward pass."""
        copies, self.pending_copies = self.pending_copies, []
        return copies

    def can_allocate(self, num_blocks: int) -> bool:
        return num_blocks <= len(self.free_blocks)

    def match_prefix(self, seq: Sequence) -> int:
        """For a sequence with no blocks yet: take the cached blocks of its longest cached prefix.

        Returns the number of prompt tokens found (they count as computed).
        """
        assert not seq.block_table and seq.num_computed_tokens == 0
        if not self.enable_prefix_caching:
            return 0
        # leave at least one token to compute, so the step produces logits to sample from
        num_full = (len(seq.token_ids) - 1) // self.block_size
        parent_hash, parent_serial = ROOT_HASH, None
        for i in range(num_full):
            tokens = tuple(seq.token_ids[i * self.block_size : (i + 1) * self.block_size])
            h = hash_block_tokens(parent_hash, tokens)
            block_id = self.hash_to_block.get(h)
            cached = None if block_id is None else self.cached[block_id]
            if (
                block_id is None
                or cached is None
                or cached.token_ids != tokens
                or cached.parent_serial != parent_serial
            ):
                break  # a miss, or a hash collision: never reuse KV computed for other tokens
            self._take(block_id)
            seq.block_table.append(block_id)
            seq.block_hashes.append(h)
            parent_hash, parent_serial = h, cached.serial
        seq.num_computed_tokens = len(seq.block_table) * self.block_size
        return seq.num_computed_tokens

    def record_prefix_lookup(self, num_tokens: int, num_hits: int) -> None:
        if self.enable_prefix_caching:
            self.prefix_cache_queries += num_tokens
            self.prefix_cache_hits += num_hits

    def allocate(self, seq: Sequence, num_blocks: int) -> None:
        """Give seq num_blocks blocks (blocks_needed): first the copy of a shared block it writes into."""
        if num_blocks and self._writes_shared_block(seq):
            index = seq.num_computed_tokens // self.block_size
            source, copy = seq.block_table[index], self._new_block()
            self.ref_counts[source] -= 1  # others still hold it: never 0 here
            seq.block_table[index] = copy
            self.pending_copies.append((source, copy))
            num_blocks -= 1
        for _ in range(num_blocks):
            seq.block_table.append(self._new_block())

    def _new_block(self) -> int:
        """Take the free block evicted first, dropping the cached content it still holds."""
        block_id = next(iter(self.free_blocks))
        old = self.cached[block_id]
        if old is not None:
            if self.hash_to_block.get(old.block_hash) == block_id:
                del self.hash_to_block[old.block_hash]
            self.cached[block_id] = None
        self._take(block_id)
        return block_id

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Register the blocks of seq that became full and computed this step (each after its parent)."""
        if not self.enable_prefix_caching:
            return
        num_full = seq.num_computed_tokens // self.block_size
        for i in range(len(seq.block_hashes), num_full):
            parent_hash = seq.block_hashes[-1] if seq.block_hashes else ROOT_HASH
            tokens = tuple(seq.token_ids[i * self.block_size : (i + 1) * self.block_size])
            h = hash_block_tokens(parent_hash, tokens)
            seq.block_hashes.append(h)
            block_id = seq.block_table[i]
            assert block_id != NULL_BLOCK, "blocks are freed before a window only once registered"
            parent = self._cached_parent(seq, i)
            if h in self.hash_to_block or self.cached[block_id] is not None or (i and parent is None):
                continue  # already cached (or a collision): keep the first; an uncached parent ends the chain
            serial = next(self._serials)
            self.cached[block_id] = CachedBlock(h, tokens, serial, parent.serial if parent else None)
            self.hash_to_block[h] = block_id

    def _cached_parent(self, seq: Sequence, i: int) -> CachedBlock | None:
        """What block i - 1 of seq holds as cached (None: the first block, or its parent is not cached); a
        parent freed before the window is found by its hash while it stays cached."""
        if not i:
            return None
        parent_id = seq.block_table[i - 1]
        if parent_id == NULL_BLOCK:
            parent_id = self.hash_to_block.get(seq.block_hashes[i - 1], NULL_BLOCK)
            cached = self.cached[parent_id] if parent_id != NULL_BLOCK else None
            return cached if cached is not None and cached.block_hash == seq.block_hashes[i - 1] else None
        return self.cached[parent_id]

    def free_skipped_blocks(self, seq: Sequence) -> None:
        """Give back seq's blocks wholly before the window of its next token (at num_computed_tokens); each
        becomes NULL_BLOCK in its table. Blocks before the first NULL_BLOCK were given back earlier."""
        if self.sliding_window is None:
            return
        end = first_needed_block(seq.num_computed_tokens, self.sliding_window, self.block_size)
        for i in range(min(end, len(seq.block_table)) - 1, -1, -1):
            block_id = seq.block_table[i]
            if block_id == NULL_BLOCK:
                break
            seq.block_table[i] = NULL_BLOCK
            self._release(block_id)
            self.num_skipped_blocks += 1

    def trim(self, seq: Sequence) -> None:
        """Free the blocks past seq's computed tokens (KV of rejected draft tokens); they were never
        hashed, since only full blocks of computed tokens are, so the prefix cache is untouched."""
        keep = -(-seq.num_computed_tokens // self.block_size)
        while len(seq.block_table) > keep:
            block_id = seq.block_table.pop()
            assert self.cached[block_id] is None and self.ref_counts[block_id] == 1
            self.ref_counts[block_id] = 0
            self.free_blocks[block_id] = None
            self.free_blocks.move_to_end(block_id, last=False)

    def free(self, seq: Sequence) -> None:
        # reversed: a sequence's tail blocks are the least likely to be shared, so they are evicted first
        for block_id in reversed(seq.block_table):
            if block_id != NULL_BLOCK:
                self._release(block_id)
        seq.block_table = []
        seq.block_hashes = []
        seq.num_computed_tokens = 0

    def _release(self, block_id: int) -> None:
        """One reference fewer; at none the block is free (a cached one at the back: evicted last)."""
        self.ref_counts[block_id] -= 1
        assert self.ref_counts[block_id] >= 0
        if self.ref_counts[block_id] == 0:
            self.free_blocks[block_id] = None
            if self.cached[block_id] is None:
                self.free_blocks.move_to_end(block_id, last=False)

    def _take(self, block_id: int) -> None:
        if self.ref_counts[block_id] == 0:
            del self.free_blocks[block_id]
        self.ref_counts[block_id] += 1

"""ModelRunner: owns the model and the KV block pool; turns a scheduled step into next-token logits."""

from __future__ import annotations

import array
import math
import mmap
from dataclasses import dataclass

import torch

from backend.engine import cpu_kernels
from backend.engine.attention import AttentionMetadata, PrefillChunk, pool_rows
from backend.engine.config import KV_CACHE_DTYPES
from backend.engine.cpu_kernels import PrefillKernelInputs
from backend.engine.decode_graph import DecodeGraph
from backend.engine.decode_graph_support import unsupported_reason
from backend.engine.models.base import CausalLM
from backend.engine.scheduler import ScheduledSeq


@dataclass(slots=True)
class StepInputs:
    """One step's new tokens, decodes first: what the model reads and where their K/V go."""

    input_ids: list[int]
    positions: list[int]
    slots: list[int]  # KV-pool slot of each token: block_id * block_size + offset
    logits_rows: list[int]  # rows whose logits are sampled: each sequence's last token and its drafts


FP8_CACHE_DTYPES = {
    "fp8": torch.float8_e4m3fn,
    "fp8_e4m3": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
}
assert set(FP8_CACHE_DTYPES) == set(KV_CACHE_DTYPES) - {"auto"}, "every kv_cache_dtype has a torch dtype"


def int64_tensor(values: list[int], device: torch.device) -> torch.Tensor:
    """torch.tensor(values) as int64 on device, built through an array.array: about 10x faster for a list
    of Python ints (torch.tensor takes about 150 ns an element; a step's block tables hold hundreds)."""
    if not values:
        return torch.empty(0, dtype=torch.int64, device=device)
    return torch.frombuffer(array.array("q", values), dtype=torch.int64).to(device)


def kv_cache_torch_dtype(model: CausalLM, kv_cache_dtype: str) -> torch.dtype:
    """The KV pool's element type: the model's dtype for "auto", else vLLM's fp8 formats."""
    return FP8_CACHE_DTYPES.get(kv_cache_dtype, model.norm.weight.dtype)


def kv_pool(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zeroed KV pool. On the CPU it is anonymous mmap'd memory: zero pages the OS commits only when a
    block is first written, so resident memory follows the blocks in use, not the pool's size (torch.zeros
    would write, and so commit, all of it at start: 2 GiB of a 2.8 GiB server for a 135M model)."""
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    nbytes = math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
    return torch.frombuffer(mmap.mmap(-1, nbytes), dtype=dtype).view(shape)


def is_decode(item: ScheduledSeq) -> bool:
    """One token (and its drafts) that keeps no prompt rows: a chunk that keeps some is a prefill, so
    the prompt rows follow the order of the scheduled sequences."""
    return item.num_new_tokens == 1 + len(item.spec_token_ids) and not item.prompt_logprob_positions


class ModelRunner:
    def __init__(
        self, model: CausalLM, num_blocks: int, block_size: int, kv_cache_dtype: str = "auto"
    ) -> None:
        self.model = model
        self.device = model.norm.weight.device
        self.dtype = model.norm.weight.dtype
        self.kv_dtype = kv_cache_torch_dtype(model, kv_cache_dtype)
        self.block_size = block_size
        if len({(s.num_kv_heads, s.head_dim) for s in model.attention_specs}) != 1:
            raise ValueError(
                "layers with different KV heads or head sizes are not supported by the KV pool yet"
            )
        self.kv_caches = []  # a K and a V pool per layer: [num_kv_heads, num_blocks, block_size, head_dim]
        for spec in model.attention_specs:
            shape = (spec.num_kv_heads, num_blocks, block_size, spec.head_dim)
            self.kv_caches.append(
                (kv_pool(shape, self.kv_dtype, self.device), kv_pool(shape, self.kv_dtype, self.device))
            )
        self.decode_kernel = cpu_kernels.supports(self.device, self.dtype)
        self.prefill_kernel = cpu_kernels.prefill_attention_enabled(self.device, self.dtype)
        self.decode_graph: DecodeGraph | None = None  # set by capture_decode_graph

    def capture_decode_graph(self, max_num_seqs: int, max_model_len: int) -> str | None:
        """Capture decode-only steps as one native call each (decode_graph.py); returns why the model
        cannot be (its steps then all take the modules)."""
        reason = unsupported_reason(self.model, self.decode_kernel)
        if reason is None:
            self.decode_graph = DecodeGraph(
                self.model, self.kv_caches, max_num_seqs, max_model_len, self.block_size
            )
        return reason

    @staticmethod
    def bytes_per_block(model: CausalLM, block_size: int, kv_cache_dtype: str = "auto") -> int:
        """K and V bytes of one block in every layer's pool."""
        element = kv_cache_torch_dtype(model, kv_cache_dtype).itemsize
        return sum(2 * block_size * s.num_kv_heads * s.head_dim * element for s in model.attention_specs)

    @property
    def pool_shape(self) -> tuple[int, int]:
        """(num_kv_heads, num_blocks) of each layer's K and V pool."""
        num_kv_heads, num_blocks = self.kv_caches[0][0].shape[:2]
        return num_kv_heads, num_blocks

    @property
    def kv_pool_bytes(self) -> int:
        return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in self.kv_caches)

    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """Copy KV blocks (source, destination) in every layer: BlockManager's copy-on-write."""
        for source, destination in copies:
            for k_cache, v_cache in self.kv_caches:  # [num_kv_heads, num_blocks, block_size, head_dim]
                k_cache[:, destination].copy_(k_cache[:, source])
                v_cache[:, destination].copy_(v_cache[:, source])

    def execute(self, scheduled: list[ScheduledSeq]) -> tuple[list[ScheduledSeq], torch.Tensor]:
        """Run one step. Returns the sequences that sample (in row order) and their logits [n, vocab] fp32,
        `num_logits` consecutive rows per sequence (1 + its drafts when it verifies drafts); after those
        rows come the prompt rows kept for prompt logprobs, in `scheduled` order.

        Rows are decodes first, then prefill chunks, like vLLM's V1 runner. A decode is one token, or one
        token and its drafts: each draft row is a decode row of its own whose context ends at it (the
        decode kernel, not a prefill chunk's gather and masked attention; as vLLM's spec decode does).
        A captured step calls no torch op that records anything: it skips inference mode's entry and exit
        (tens of microseconds each on caches the weights' stream has just evicted)."""
        decodes = [s for s in scheduled if is_decode(s)]
        prefills = [s for s in scheduled if not is_decode(s)]
        if self.decode_graph is not None and not prefills:
            step = self.decode_graph.step_rows(decodes)
            if step is not None:  # every row a plain decode: the captured calls
                return decodes, self.decode_graph.run(step)
        return self.execute_modules(decodes, prefills)

    @torch.inference_mode()
    def execute_modules(
        self, decodes: list[ScheduledSeq], prefills: list[ScheduledSeq]
    ) -> tuple[list[ScheduledSeq], torch.Tensor]:
        """execute() through the model's modules (any step the captured calls do not serve)."""
        ordered = decodes + prefills
        inputs = self.prepare_inputs(ordered)
        num_decode_rows = sum(s.num_new_tokens for s in decodes)
        chunks: list[PrefillChunk] = []
        prefill_blocks, kernel_inputs = 0, None
        if self.prefill_kernel and prefills:
            kernel_inputs = self.prepare_prefill_kernel(prefills, first_row=num_decode_rows)
        elif prefills:
            chunks, prefill_blocks = self.prepare_prefill(prefills, first_row=num_decode_rows)
        meta = AttentionMetadata(
            slot_mapping=int64_tensor(inputs.slots, self.device),
            positions=int64_tensor(inputs.positions, self.device),
            num_decodes=num_decode_rows,
            decode_rows=None,
            decode_mask=None,
            decode_block_tables=None,
            decode_context_lens=None,
            prefills=chunks,
            prefill_kernel=kernel_inputs,
            gather_buffers=None,
        )
        decode_blocks = self.prepare_decode(decodes, meta) if decodes else 0
        meta.gather_buffers = self.gather_buffers(max(prefill_blocks, decode_blocks))
        logits = self.run(inputs, meta)
        return [s for s in ordered if s.samples], logits

    def prepare_inputs(self, ordered: list[ScheduledSeq]) -> StepInputs:
        """Token ids, positions and KV-pool slots of every new token, and the rows whose logits are kept:
        the rows that sample, then the prompt rows kept for prompt logprobs (prompt_logprob_positions)."""
        bs = self.block_size
        inputs = StepInputs([], [], [], [])
        prompt_rows: list[int] = []
        for item in ordered:
            seq, start = item.seq, item.seq.num_computed_tokens
            end = start + item.num_new_tokens
            first = len(inputs.input_ids)
            inputs.input_ids.extend(seq.token_ids[start:end])
            inputs.input_ids.extend(item.spec_token_ids)  # drafts follow the sequence's last token
            inputs.positions.extend(range(start, end))
            inputs.slots.extend(seq.block_table[p // bs] * bs + p % bs for p in range(start, end))
            last = len(inputs.input_ids)
            inputs.logits_rows.extend(range(last - item.num_logits, last))
            prompt_rows.extend(first + p - start for p in item.prompt_logprob_positions)
        inputs.logits_rows.extend(prompt_rows)
        return inputs

    def prepare_prefill(self, prefills: list[ScheduledSeq], first_row: int) -> tuple[list[PrefillChunk], int]:
        """One PrefillChunk per prefilling sequence, and the most blocks one of them gathers.

        A chunk after a sequence's first attends over its earlier tokens too, read from the pool through
        its block table with a causal mask; a first chunk attends over its own rows only."""
        bs = self.block_size
        chunks: list[PrefillChunk] = []
        gather_blocks, row = 0, first_row
        for item in prefills:
            start = item.seq.num_computed_tokens
            end = start + item.num_new_tokens
            rows = mask = None
            if start:
                num_blocks = -(-end // bs)
                rows = pool_rows(item.seq.block_table[:num_blocks], *self.pool_shape, self.device)
                query_pos = torch.arange(start, end, device=self.device)
                mask = torch.arange(end, device=self.device)[None, :] <= query_pos[:, None]
                gather_blocks = max(gather_blocks, num_blocks)
            chunks.append(PrefillChunk(row, row + item.num_new_tokens, start, rows, mask))
            row += item.num_new_tokens
        return chunks, gather_blocks

    def prepare_prefill_kernel(self, prefills: list[ScheduledSeq], first_row: int) -> PrefillKernelInputs:
        """The chunks' rows, context lengths and block tables (padded with block 0) for the CPU kernel."""
        starts, seq_lens, tables = [first_row], [], []
        for item in prefills:
            starts.append(starts[-1] + item.num_new_tokens)
            seq_lens.append(item.seq.num_computed_tokens + item.num_new_tokens)
        max_blocks = -(-max(seq_lens) // self.block_size)
        for item in prefills:
            table = item.seq.block_table[:max_blocks]
            tables += table + [0] * (max_blocks - len(table))
        return PrefillKernelInputs(
            query_start_loc=int64_tensor(starts, self.device),
            seq_lens=int64_tensor(seq_lens, self.device),
            block_tables=int64_tensor(tables, self.device).view(len(prefills), max_blocks),
        )

    def prepare_decode(self, decodes: list[ScheduledSeq], meta: AttentionMetadata) -> int:
        """Fill meta's decode fields, one row per token (a draft's context ends at the draft): padded block
        tables for the CPU kernel, else pool rows and a mask for the PyTorch path. Returns how many blocks
        the PyTorch path gathers (0 for the kernel)."""
        bs = self.block_size
        context_lens: list[int] = []
        for s in decodes:
            first = s.seq.num_computed_tokens + 1
            context_lens.extend(range(first, first + s.num_new_tokens))
        max_blocks = -(-max(context_lens) // bs)
        padded: list[int] = []
        for s in decodes:
            table = s.seq.block_table[:max_blocks]
            padded += (table + [0] * (max_blocks - len(table))) * s.num_new_tokens
        rows = len(context_lens)
        lens = int64_tensor(context_lens, self.device)
        if self.decode_kernel:
            meta.decode_block_tables = int64_tensor(padded, self.device).view(rows, max_blocks)
            meta.decode_context_lens = lens
            return 0
        meta.decode_rows = pool_rows(padded, *self.pool_shape, self.device)
        key_pos = torch.arange(max_blocks * bs, device=self.device)
        meta.decode_mask = (key_pos[None, :] < lens[:, None])[:, None, None, :]
        return rows * max_blocks

    def gather_buffers(self, num_blocks: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Scratch K and V buffers, reused by every layer, for the blocks the PyTorch paths gather."""
        if not num_blocks:
            return None
        size = num_blocks * self.kv_caches[0][0][:, 0].numel()
        return (
            torch.empty(size, dtype=self.kv_dtype, device=self.device),
            torch.empty(size, dtype=self.kv_dtype, device=self.device),
        )

    def run(self, inputs: StepInputs, meta: AttentionMetadata) -> torch.Tensor:
        """The model's forward pass; logits [len(logits_rows), vocab] fp32."""
        logits = self.model(
            int64_tensor(inputs.input_ids, self.device),
            meta.positions,
            self.kv_caches,
            meta,
            int64_tensor(inputs.logits_rows, self.device),
        )
        return logits.float()

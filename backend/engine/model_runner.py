"""ModelRunner: owns the model and the KV block pool; turns a scheduled step into next-token logits."""

from __future__ import annotations

import torch

from backend.engine import cpu_kernels
from backend.engine.attention import AttentionMetadata, PrefillChunk, pool_rows
from backend.engine.models.llama import LlamaForCausalLM
from backend.engine.scheduler import ScheduledSeq


class ModelRunner:
    def __init__(self, model: LlamaForCausalLM, num_blocks: int, block_size: int) -> None:
        self.model = model
        args = model.args
        self.device = model.embed_tokens.weight.device
        self.dtype = model.embed_tokens.weight.dtype
        self.block_size = block_size
        shape = (args.num_kv_heads, num_blocks, block_size, args.head_dim)
        self.kv_caches = [
            (
                torch.zeros(shape, dtype=self.dtype, device=self.device),
                torch.zeros(shape, dtype=self.dtype, device=self.device),
            )
            for _ in range(args.num_layers)
        ]
        self.decode_kernel = cpu_kernels.supports(self.device, self.dtype)

    @staticmethod
    def bytes_per_block(model: LlamaForCausalLM, block_size: int) -> int:
        args = model.args
        element = model.embed_tokens.weight.element_size()
        return 2 * args.num_layers * block_size * args.num_kv_heads * args.head_dim * element

    @property
    def kv_pool_bytes(self) -> int:
        return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in self.kv_caches)

    @torch.inference_mode()
    def execute(self, scheduled: list[ScheduledSeq]) -> tuple[list[ScheduledSeq], torch.Tensor]:
        """Run one step. Returns the sequences that sample (in row order) and their logits [n, vocab] fp32."""
        decodes = [s for s in scheduled if s.num_new_tokens == 1]
        prefills = [s for s in scheduled if s.num_new_tokens > 1]
        ordered = decodes + prefills
        bs = self.block_size
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        logits_rows: list[int] = []
        chunks: list[PrefillChunk] = []
        gather_blocks = 0  # the most blocks one layer gathers this step
        pool_shape = self.kv_caches[0][0].shape[:2]  # (num_kv_heads, num_blocks)
        for item in ordered:
            seq, start = item.seq, item.seq.num_computed_tokens
            end = start + item.num_new_tokens
            row = len(input_ids)
            input_ids.extend(seq.token_ids[start:end])
            positions.extend(range(start, end))
            table = seq.block_table
            slots.extend(table[p // bs] * bs + p % bs for p in range(start, end))
            if item.num_new_tokens > 1:
                rows = mask = None
                if start:
                    num_blocks = -(-end // bs)
                    rows = pool_rows(table[:num_blocks], *pool_shape, self.device)
                    query_pos = torch.arange(start, end, device=self.device)
                    mask = torch.arange(end, device=self.device)[None, :] <= query_pos[:, None]
                    gather_blocks = max(gather_blocks, num_blocks)
                chunks.append(PrefillChunk(row, row + item.num_new_tokens, start, rows, mask))
            if item.samples:
                logits_rows.append(len(input_ids) - 1)
        meta = AttentionMetadata(
            slot_mapping=torch.tensor(slots, device=self.device),
            positions=torch.tensor(positions, device=self.device),
            num_decodes=len(decodes),
            decode_rows=None,
            decode_mask=None,
            decode_block_tables=None,
            decode_context_lens=None,
            prefills=chunks,
            gather_buffers=None,
        )
        if decodes:
            context_lens = [s.seq.num_computed_tokens + 1 for s in decodes]
            max_blocks = -(-max(context_lens) // bs)
            padded: list[int] = []
            for s in decodes:
                table = s.seq.block_table[:max_blocks]
                padded += table + [0] * (max_blocks - len(table))
            lens = torch.tensor(context_lens, device=self.device)
            if self.decode_kernel:
                meta.decode_block_tables = torch.tensor(padded).view(len(decodes), max_blocks)
                meta.decode_context_lens = lens
            else:
                meta.decode_rows = pool_rows(padded, *pool_shape, self.device)
                key_pos = torch.arange(max_blocks * bs, device=self.device)
                meta.decode_mask = (key_pos[None, :] < lens[:, None])[:, None, None, :]
                gather_blocks = max(gather_blocks, len(decodes) * max_blocks)
        if gather_blocks:
            size = gather_blocks * self.kv_caches[0][0][:, 0].numel()
            meta.gather_buffers = (
                torch.empty(size, dtype=self.dtype, device=self.device),
                torch.empty(size, dtype=self.dtype, device=self.device),
            )
        logits = self.model(
            torch.tensor(input_ids, device=self.device),
            meta.positions,
            self.kv_caches,
            meta,
            torch.tensor(logits_rows, device=self.device, dtype=torch.long),
        )
        sampling = [s for s in ordered if s.samples]
        return sampling, logits.float()

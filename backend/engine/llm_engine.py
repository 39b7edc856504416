"""LLMEngine: loads the model, sizes the KV pool, runs step() = schedule -> run model -> sample."""

from __future__ import annotations

import logging
import time
from typing import Any

from backend.engine import cpu_kernels
from backend.engine.block_manager import BlockManager
from backend.engine.config import EngineConfig
from backend.engine.detokenizer import IncrementalDetokenizer
from backend.engine.device import kv_cache_budget_bytes, resolve_device, resolve_dtype
from backend.engine.fault_injection import fault_injector_from_env
from backend.engine.load_phases import LoadPhases
from backend.engine.loader import load_model, rope_tables
from backend.engine.model_runner import ModelRunner
from backend.engine.output_processor import append_token, token_logprobs
from backend.engine.outputs import RequestMetrics, RequestOutput
from backend.engine.request import Request
from backend.engine.sampler import Sampler
from backend.engine.sampling_params import SamplingParams
from backend.engine.scheduler import ScheduledSeq, Scheduler
from backend.engine.sequence import Sequence
from backend.engine.spec_decode.speculator import make_speculator
from backend.engine.stats import EngineCounters, EngineStats, engine_stats
from backend.engine.structured_output import StructuredOutputManager

log = logging.getLogger(__name__)


class LLMEngine:
    def __init__(self, config: EngineConfig, phases: LoadPhases | None = None) -> None:
        phases = phases if phases is not None else LoadPhases()
        self.config = config
        self.device = resolve_device(config.device)
        self.dtype = resolve_dtype(config.dtype, self.device)
        with phases.phase("load CPU kernels"):  # compiled on first use, then cached (cpu_kernels.py)
            cpu_kernels.supports(self.device, self.dtype)
        loaded = load_model(
            config.model, self.dtype, self.device, config.trust_remote_code, config.dequantize_weights, phases
        )
        self.quantization = loaded.quantization
        self.model_name, self.tokenizer, self.eos_token_ids = (
            loaded.name,
            loaded.tokenizer,
            loaded.eos_token_ids,
        )
        self.hf_config = loaded.hf_config
        model = loaded.model
        self.weights_bytes = model.weights_bytes()
        with phases.phase("allocate KV cache"):
            num_blocks, self.max_model_len = self._size_kv_pool(model)
            cos, sin = rope_tables(self.hf_config, model.args.head_dim, self.max_model_len)
            model.rope_cos, model.rope_sin = cos.to(self.device, self.dtype), sin.to(self.device, self.dtype)
            self.runner = ModelRunner(model, num_blocks, config.block_size, config.kv_cache_dtype)
        self.block_manager = BlockManager(num_blocks, config.block_size, config.enable_prefix_caching)
        self.sampler = Sampler(config.seed)
        self.speculator = make_speculator(self, num_blocks)
        self.scheduler = Scheduler(
            self.block_manager,
            config.max_num_seqs,
            config.max_num_batched_tokens,
            on_free=self.speculator.free if self.speculator else None,
        )
        eos = self.tokenizer.eos_token_id if self.tokenizer.eos_token_id is not None else None
        self.structured_output = StructuredOutputManager(self.tokenizer, model.args.vocab_size, eos)
        self.requests: dict[str, Request] = {}
        self.counters = EngineCounters()
        self.fault_injector = fault_injector_from_env(self.tokenizer)  # test-only; None unless set

    def _size_kv_pool(self, model) -> tuple[int, int]:
        """(number of KV blocks, max_model_len): the pool always holds at least one max-length sequence."""
        cfg, bs = self.config, self.config.block_size
        model_limit = getattr(self.hf_config, "max_position_embeddings", None) or 2048
        window = getattr(self.hf_config, "sliding_window", None)
        if window and getattr(self.hf_config, "use_sliding_window", True):
            model_limit = min(model_limit, window)  # within the window, attention is plain causal
        if cfg.max_model_len is not None and cfg.max_model_len > model_limit:
            raise ValueError(
                f"max_model_len={cfg.max_model_len} exceeds the model's limit of {model_limit} tokens"
            )
        max_len = cfg.max_model_len or model_limit
        per_block = ModelRunner.bytes_per_block(model, bs, cfg.kv_cache_dtype)
        if cfg.num_kv_blocks is not None:
            num_blocks = cfg.num_kv_blocks
        elif cfg.kv_cache_memory_bytes is not None:
            num_blocks = cfg.kv_cache_memory_bytes // per_block
        else:
            enough = cfg.max_num_seqs * -(-max_len // bs)
            num_blocks = min(enough, kv_cache_budget_bytes(self.device) // per_block)
        if num_blocks < 1:
            raise ValueError(f"the KV pool must hold at least one block of {per_block} bytes")
        if num_blocks * bs < max_len:
            if cfg.max_model_len is not None:
                raise ValueError(
                    f"max_model_len={max_len} needs {-(-max_len // bs)} KV blocks of {bs} tokens, "
                    f"but the KV pool has only {num_blocks}; lower max_model_len or give the pool more memory"
                )
            max_len = num_blocks * bs
        return num_blocks, max_len

    # ---- requests ----
    def process_inputs(self, prompt: str | list[int], params: SamplingParams) -> tuple[str | None, list[int]]:
        """Validate and tokenize a prompt; raises ValueError without touching the engine's state."""
        if not isinstance(params, SamplingParams):
            raise ValueError(f"params must be a SamplingParams, got {type(params).__name__}")
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError("The prompt is empty; it must contain at least one token")
            text, ids = prompt, list(self.tokenizer(prompt).input_ids)
        else:
            text, ids = None, list(prompt)
            vocab = self.runner.model.args.vocab_size
            if not all(isinstance(t, int) and 0 <= t < vocab for t in ids):
                raise ValueError(f"Prompt token ids must be integers in [0, {vocab - 1}]")
        if not ids:
            raise ValueError("The prompt is empty; it must contain at least one token")
        if len(ids) >= self.max_model_len:
            raise ValueError(
                f"The prompt is {len(ids)} tokens long, but max_model_len is {self.max_model_len}: "
                f"a prompt may have at most {self.max_model_len - 1} tokens so that one can be generated"
            )
        return text, ids

    def add_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams,
        arrival_time: float | None = None,
    ) -> None:
        text, ids = self.process_inputs(prompt, params)
        self.add_processed_request(request_id, text, ids, params, arrival_time)

    def add_processed_request(
        self,
        request_id: str,
        prompt: str | None,
        prompt_token_ids: list[int],
        params: SamplingParams,
        arrival_time: float | None = None,
    ) -> None:
        if request_id in self.requests:
            raise ValueError(f"request_id {request_id!r} is already in use")
        metrics = RequestMetrics(arrival_time or time.time())
        seqs = [
            Sequence(
                request_id,
                i,
                prompt_token_ids,
                params,
                IncrementalDetokenizer(self.tokenizer, params.skip_special_tokens),
                metrics,
            )
            for i in range(params.n)
        ]
        if params.structured_outputs is not None:  # a cache hit when the front end compiled it
            for seq in seqs:
                seq.grammar = self.structured_output.grammar(params.structured_outputs)
        self.requests[request_id] = Request(request_id, prompt, prompt_token_ids, params, seqs, metrics)
        for seq in seqs:
            self.scheduler.add(seq)

    def abort_request(self, request_id: str) -> RequestOutput | None:
        """Stop a request and free its blocks at once; returns its final output (None if unknown)."""
        return self._finish_request(request_id, "abort")

    def _finish_request(self, request_id: str, reason: str, error: str | None = None) -> RequestOutput | None:
        request = self.requests.pop(request_id, None)
        if request is None:
            return None
        for seq in request.seqs:
            if not seq.is_finished:
                seq.finish_reason = reason
                self.scheduler.finish(seq)
        request.metrics.finished_time = time.time()
        self.counters.num_requests_finished += 1
        out = request.output()
        out.error = error
        return out

    def _fail_requests(self, failed: dict[str, str]) -> list[RequestOutput]:
        """Fail each request (id -> why) alone: finish_reason "error", blocks freed, the rest go on."""
        outputs = []
        for request_id, why in failed.items():
            log.error("request %s failed in the engine: %s", request_id, why)
            out = self._finish_request(request_id, "error", why)
            if out is not None:
                outputs.append(out)
        return outputs

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    # ---- the step ----
    def step(self) -> list[RequestOutput]:
        """schedule -> run the model -> sample -> update. An exception fails only the requests it can be
        pinned on (all of the batch when the shared forward pass fails); the engine keeps serving."""
        start = time.perf_counter()
        if self.speculator is not None:
            try:
                self.speculator.propose(self.scheduler.running)
            except Exception as exc:  # the draft model's forward pass: fail the sequences it served
                why = f"proposing draft tokens failed: {_describe(exc)}"
                return self._fail_requests({seq.request_id: why for seq in self.scheduler.running})
        scheduled = self.scheduler.schedule()
        if not scheduled:
            return []
        now = time.time()
        for item in scheduled:
            if item.seq.metrics.first_scheduled_time is None:
                item.seq.metrics.first_scheduled_time = now
        try:
            self._check_fault("execute", [item.seq for item in scheduled])
            sampling, logits = self.runner.execute(scheduled)
        except Exception as exc:  # one forward pass serves the whole batch: fail the requests in it
            why = f"running the model failed: {_describe(exc)}"
            return self._fail_requests({item.seq.request_id: why for item in scheduled})
        failed: dict[str, str] = {}
        for item in scheduled:
            if not item.spec_token_ids:  # a verification advances by what it accepts (_verify)
                item.seq.num_computed_tokens += item.num_new_tokens
                self.block_manager.cache_full_blocks(item.seq)
        touched: dict[str, Request] = {}
        now = time.time()
        if any(item.spec_token_ids for item in sampling):
            sampling, logits = self._verify(sampling, logits, failed, touched, now)
        seqs = [item.seq for item in sampling]
        logits = self.structured_output.apply_bitmask(logits, [seq.grammar for seq in seqs])
        tokens, logprobs = self._sample(logits, seqs, failed)
        for row, (seq, token_id) in enumerate(zip(seqs, tokens, strict=True)):
            if token_id is None or seq.request_id in failed:
                continue
            try:
                self._update(seq, token_id, None if logprobs is None else logprobs[row], now)
            except Exception as exc:  # detokenizing or a stop check of this sequence failed
                failed[seq.request_id] = f"processing the output failed: {_describe(exc)}"
                continue
            touched[seq.request_id] = self.requests[seq.request_id]
        outputs = self._fail_requests(failed)
        for request in touched.values():
            if request.request_id in failed:
                continue
            if request.finished:
                request.metrics.finished_time = now
                del self.requests[request.request_id]
                self.counters.num_requests_finished += 1
            outputs.append(request.output())
        self.counters.record_step(time.perf_counter() - start)
        return outputs

    def _verify(
        self, sampling: list[ScheduledSeq], logits, failed: dict[str, str], touched: dict, now: float
    ) -> tuple[list[ScheduledSeq], Any]:
        """Verify the drafts of the sequences that carried some; returns the others and their logits."""
        assert self.speculator is not None
        plain: list[ScheduledSeq] = []
        plain_rows: list[int] = []
        row = 0
        for item in sampling:  # every item samples: 1 + drafts rows (num_computed_tokens moved on)
            num_rows = 1 + len(item.spec_token_ids)
            rows = logits[row : row + num_rows]
            if not item.spec_token_ids:
                plain.append(item)
                plain_rows.append(row)
            else:
                try:
                    self._check_fault("sample", [item.seq])
                    tokens = self.speculator.verify(item, rows)
                    self._accept(item, tokens, rows, now)
                    touched[item.seq.request_id] = self.requests[item.seq.request_id]
                except Exception as exc:  # this sequence's sampling or output processing
                    failed[item.seq.request_id] = f"verifying draft tokens failed: {_describe(exc)}"
            row += num_rows
        return plain, logits[plain_rows]

    def _accept(self, item: ScheduledSeq, tokens: list[int], logits, now: float) -> None:
        """Append the verified tokens; the KV of the accepted drafts stays, that of the rejected goes."""
        seq, num_accepted = item.seq, len(tokens) - 1
        seq.num_computed_tokens += item.num_new_tokens - len(item.spec_token_ids) + num_accepted
        logprobs = logits.log_softmax(-1) if seq.logprobs is not None else None
        for i, token_id in enumerate(tokens):
            self._update(seq, token_id, None if logprobs is None else logprobs[i], now)
            if seq.is_finished:
                return
        self.block_manager.cache_full_blocks(seq)  # only now: a block is hashed once its tokens are known
        self.scheduler.rollback(seq)

    def _sample(self, logits, seqs: list[Sequence], failed: dict[str, str]) -> tuple[list, Any]:
        """Tokens per row (None where that row failed) and the logprob rows (or None)."""
        try:
            self._check_fault("sample", seqs)
            return self.sampler.sample(logits, seqs)
        except Exception:  # find the rows at fault: sample each alone
            tokens: list[int | None] = []
            rows: list = []
            for i, seq in enumerate(seqs):
                try:
                    self._check_fault("sample", [seq])
                    (token,), logprobs = self.sampler.sample(logits[i : i + 1], [seq])
                    tokens.append(token)
                    rows.append(None if logprobs is None else logprobs[0])
                except Exception as exc:  # this row's own parameters or state
                    failed[seq.request_id] = f"sampling failed: {_describe(exc)}"
                    tokens.append(None)
                    rows.append(None)
            return tokens, rows

    def _update(self, seq: Sequence, token_id: int, logprobs_row, now: float) -> None:
        """Append one sampled token to seq: logprobs, detokenization, stop checks, metrics."""
        if seq.num_output_tokens == 0 and seq.index == 0:
            self.counters.prompt_tokens += seq.num_prompt_tokens
        if seq.logprobs is not None:
            seq.logprobs.append(
                token_logprobs(logprobs_row, token_id, seq.params.logprobs or 0, self.tokenizer)
            )
        append_token(seq, token_id, self.eos_token_ids, self.max_model_len)
        if seq.finish_reason is not None:
            self.scheduler.finish(seq)
        metrics = seq.metrics
        metrics.first_token_time = metrics.first_token_time or now
        metrics.last_token_time = now
        self.counters.generation_tokens += 1

    def _check_fault(self, phase: str, seqs: list[Sequence]) -> None:
        if self.fault_injector is not None:
            self.fault_injector.check(phase, seqs)

    def stats(self) -> EngineStats:
        return engine_stats(self)


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"

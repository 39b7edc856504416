"""LLMEngine: loads the model, sizes the KV pool, runs step() = schedule -> run model -> sample."""

from __future__ import annotations

import logging
import time

import torch

from backend.engine import cpu_kernels
from backend.engine.block_manager import BlockManager
from backend.engine.config import EngineConfig
from backend.engine.cpu_quota import limit_torch_threads
from backend.engine.detokenizer import IncrementalDetokenizer
from backend.engine.device import resolve_device, resolve_dtype
from backend.engine.exceptions import describe
from backend.engine.fault_injection import check_fault, fault_injector_from_env
from backend.engine.kv_cache_utils import size_kv_pool
from backend.engine.load_phases import LoadPhases
from backend.engine.loader import load_model
from backend.engine.model_runner import ModelRunner
from backend.engine.outputs import RequestMetrics, RequestOutput
from backend.engine.parallel_sampling import fork_samples
from backend.engine.prompt_logprobs import PromptLogprobs, TokenTexts
from backend.engine.request import Request
from backend.engine.sampler import Sampler
from backend.engine.sampling_params import SamplingParams
from backend.engine.scheduler import Scheduler
from backend.engine.sequence import Sequence, SequenceStatus
from backend.engine.sliding_window import describe as describe_windows
from backend.engine.sliding_window import freeable_window
from backend.engine.spec_decode.speculator import make_speculator
from backend.engine.stats import EngineCounters, EngineStats, engine_stats
from backend.engine.step_update import StepUpdate
from backend.engine.structured_output import StructuredOutputManager

log = logging.getLogger(__name__)


class LLMEngine:
    def __init__(self, config: EngineConfig, phases: LoadPhases | None = None) -> None:
        phases = phases if phases is not None else LoadPhases()
        self.config = config
        self.device = resolve_device(config.device)
        self.dtype = resolve_dtype(config.dtype, self.device)
        if self.device.type == "cpu":
            limit_torch_threads()  # a container's CPU quota (cpu_quota.py)
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
            num_blocks, self.max_model_len = size_kv_pool(config, self.hf_config, model, self.device)
            model.init_rope(self.max_model_len)
            self.runner = ModelRunner(model, num_blocks, config.block_size, config.kv_cache_dtype)
            self.capture_decode_steps(config)
        windows = model.sliding_windows
        self.kv_cache_layout = describe_windows(windows, config.block_size)
        log.info("KV cache: %d blocks of %d tokens; %s", num_blocks, config.block_size, self.kv_cache_layout)
        self.block_manager = BlockManager(
            num_blocks, config.block_size, config.enable_prefix_caching, freeable_window(windows)
        )
        self.sampler = Sampler(config.seed, use_kernel=self.runner.decode_kernel)
        self.speculator = make_speculator(self, num_blocks)
        self.scheduler = Scheduler(
            self.block_manager,
            config.max_num_seqs,
            config.max_num_batched_tokens,
            on_free=self.speculator.free if self.speculator else None,
        )
        eos = self.tokenizer.eos_token_id if self.tokenizer.eos_token_id is not None else None
        self.structured_output = StructuredOutputManager(self.tokenizer, model.args.vocab_size, eos)
        self.token_texts = TokenTexts(self.tokenizer)  # decoded tokens of prompt logprobs
        self.requests: dict[str, Request] = {}
        self.counters = EngineCounters()
        self.counters.compute_threads = torch.get_num_threads() if self.device.type == "cpu" else 0
        self.fault_injector = fault_injector_from_env(self.tokenizer)  # test-only; None unless set
        self.update = StepUpdate(self)

    def capture_decode_steps(self, config: EngineConfig) -> None:
        """Capture decode steps unless enforce_eager, and say once which path they take and why."""
        if config.enforce_eager:
            log.info("decode steps run the model's modules (enforce_eager)")
            return
        start = time.perf_counter()
        reason = self.runner.capture_decode_graph(config.max_num_seqs, self.max_model_len)
        if self.runner.decode_graph is not None:
            log.info(
                "Graph capturing finished in %.2f secs, took %.2f MiB: decode-only steps replay captured "
                "native kernel calls (enforce_eager=True to turn off)",
                time.perf_counter() - start,
                self.runner.decode_graph.buffer_bytes / 2**20,
            )
        else:
            log.info("decode steps run the model's modules: %s", reason)

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
        vocab = self.runner.model.args.vocab_size  # a tokenizer may know more tokens than the embedding
        if not all(isinstance(t, int) and 0 <= t < vocab for t in ids):
            raise ValueError(f"Prompt token ids must be integers in [0, {vocab - 1}]")
        if params.logit_bias and max(params.logit_bias) >= vocab:
            raise ValueError(
                f"logit_bias token id {max(params.logit_bias)} is out of vocabulary: [0, {vocab - 1}]"
            )
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
        if params.needs_prompt_logits:
            seqs[0].prompt_logprobs = PromptLogprobs(
                prompt_token_ids,
                params.prompt_logprobs,
                params.return_prompt_logprobs_tensor,
                self.runner.model.args.vocab_size,
            )
        self.requests[request_id] = Request(request_id, prompt, prompt_token_ids, params, seqs, metrics)
        first, *siblings = seqs  # the siblings share its prefill (parallel_sampling.py)
        for seq in siblings:
            seq.status = SequenceStatus.WAITING_FOR_FORK
        first.forks = siblings
        self.scheduler.add(first)

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
                why = f"proposing draft tokens failed: {describe(exc)}"
                return self._fail_requests({seq.request_id: why for seq in self.scheduler.running})
        scheduled = self.scheduler.schedule()
        if not scheduled:
            return []
        now = time.time()
        for item in scheduled:
            if item.seq.metrics.first_scheduled_time is None:
                item.seq.metrics.first_scheduled_time = now
        try:
            check_fault(self.fault_injector, "execute", [item.seq for item in scheduled])
            self.runner.copy_blocks(self.block_manager.take_copies())
            sampling, logits = self.runner.execute(scheduled)
        except Exception as exc:  # one forward pass serves the whole batch: fail the requests in it
            why = f"running the model failed: {describe(exc)}"
            return self._fail_requests({item.seq.request_id: why for item in scheduled})
        failed: dict[str, str] = {}
        num_sampling_rows = sum(1 + len(item.spec_token_ids) for item in sampling)
        self.update.record_prompt_logprobs(scheduled, logits[num_sampling_rows:], failed)
        for item in scheduled:
            if not item.spec_token_ids:  # a verification advances by what it accepts (StepUpdate)
                item.seq.num_computed_tokens += item.num_new_tokens
                self.block_manager.cache_full_blocks(item.seq)
        sampling, logits = fork_samples(sampling, logits[:num_sampling_rows], self.scheduler)
        now = time.time()
        touched = self.update.update_from_output(sampling, logits, failed, now)
        outputs = self._fail_requests(failed)
        for request_id in touched:
            if request_id in failed:
                continue
            request = self.requests[request_id]
            if request.finished:
                request.metrics.finished_time = now
                del self.requests[request.request_id]
                self.counters.num_requests_finished += 1
            outputs.append(request.output())
        self.counters.record_step(time.perf_counter() - start)
        return outputs

    def stats(self) -> EngineStats:
        return engine_stats(self)

"""`LLM`: TensorRT-LLM's LLM API (`tensorrt_llm.LLM`) over the one engine.

`LLM(model=..., speculative_config=...)` loads through the one loader (`build_engine`) and
runs the engine in the continuous-batching scheduler every server uses
(`runtime.serving.scheduler`), so `generate`, `generate_async` and the servers decode
through the same rounds. No speculative_config: AR (no drafter).
"""

from __future__ import annotations

import asyncio
import itertools
import sys
import threading
from typing import Any, AsyncIterator, Sequence

from cast_trtllm.llm_api_options import parse_llm_api_options
from cast_trtllm.sampling_params import SamplingParams
from cast_trtllm.spec_config import SpecConfig
from runtime.llm.outputs import OutputBuilder, RequestOutput
from runtime.llm.requests import engine_request, prompt_ids
from runtime.llm.stats import IterationStats
from runtime.serving.config import ServingConfig
from runtime.serving.scheduler import CANCELLED, Scheduler

_ONE = "this runtime runs one process on one device"
# TensorRT-LLM LLM arguments with no behaviour here: name -> (values accepted, why it is ignored)
IGNORED_ARGS: dict[str, tuple[tuple[Any, ...] | None, str]] = {
    "tensor_parallel_size": ((1,), _ONE), "pipeline_parallel_size": ((1,), _ONE), "gpus_per_node": (None, _ONE),
    "moe_expert_parallel_size": ((None, 1), _ONE), "enable_attention_dp": ((False,), _ONE),
    "backend": ((None, "pytorch", "_autodeploy", "tensorrt"), "one engine serves every backend name"),
    "tokenizer_mode": (None, "the model's own tokenizer is used"), "trust_remote_code": (None, "no remote code runs"),
    "skip_tokenizer_init": ((False,), "the tokenizer is needed for stop strings and text"),
    "revision": ((None,), "models load from local paths"), "tokenizer_revision": ((None,), "models load from local paths"),
    "kv_cache_config": (None, "the KV pool grows with the live requests (no fixed memory fraction)"),
    "max_seq_len": (None, "the context window is the model's"), "max_input_len": (None, "the context window is the model's"),
    "max_beam_width": ((None, 1), "beam search is not supported"),
    "cuda_graph_config": (None, "CUDA graphs are not captured (ARCHITECTURE.md)"),
    "enable_chunked_prefill": (None, "prompts are always prefilled in chunks inside the rounds"),
    "disable_overlap_scheduler": (None, "rounds do not overlap host and device work"),
    "enable_iter_perf_stats": (None, "iteration stats are always kept (get_stats)"),
    "print_iter_log": (None, "see get_stats"), "stream_interval": (None, "every round streams"),
    "sampler_type": (None, "one sampler: the lossless walk"), "attn_backend": (None, "one attention path"),
    "scheduler_config": (None, "one FCFS scheduler"), "build_config": (None, "see `cast-trtllm build`"),
    "enable_autotuner": (None, "execution is chosen by the first-use probe"),
    "torch_compile_config": (None, "eager torch or onnxruntime, chosen by the first-use probe"),
}
_ids = itertools.count()


def _say(message: str) -> None:
    print(f"[cast-trtllm] {message}", file=sys.stderr, flush=True)


def spec_options(speculative_config: Any):
    """(SpecConfig, drafter, notes) of a config object (`cast_trtllm.decoding_config`), a dict
    (one `speculative_config` block) or None (AR)."""
    if speculative_config is None:
        return SpecConfig(method="ar"), "none", ()
    opts = getattr(speculative_config, "options", None)
    if opts is None:
        if not isinstance(speculative_config, dict):
            raise ValueError(f"speculative_config must be a DFlashDecodingConfig, CASTDecodingConfig, a dict or "
                             f"None, got {type(speculative_config).__name__}")
        opts = parse_llm_api_options({"speculative_config": speculative_config})
    return opts.spec, opts.speculative_model or "default", opts.notes


class LLM:
    def __init__(self, model: str = "embedded", tokenizer: Any = None, speculative_config: Any = None,
                 dtype: str = "auto", *, max_batch_size: int = ServingConfig().max_batch, max_num_tokens: int = 512,
                 device: str = "auto", threads: int | None = None, **kwargs: Any) -> None:
        from runtime.engine.build import build_engine

        for name, value in kwargs.items():
            if name not in IGNORED_ARGS:
                raise ValueError(f"LLM got an unexpected argument {name!r}: not a TensorRT-LLM LLM argument this "
                                 f"runtime knows (known, ignored: {sorted(IGNORED_ARGS)})")
            allowed, why = IGNORED_ARGS[name]
            if allowed is not None and value not in allowed:
                raise ValueError(f"LLM argument {name}={value!r} is not supported: {why}")
            _say(f"LLM argument {name}: ignored ({why})")
        if tokenizer not in (None, model):
            raise ValueError(f"tokenizer={tokenizer!r}: the tokenizer is the model's own; leave it None")
        for name, value in (("max_batch_size", max_batch_size), ("max_num_tokens", max_num_tokens)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        spec, drafter, notes = spec_options(speculative_config)
        for note in notes:
            _say(f"speculative_config: {note}")
        self.built = build_engine(model, drafter, spec, device, None if dtype == "auto" else dtype, threads,
                                  say=_say, max_num_tokens=max_num_tokens)
        self.engine, self.tokenizer = self.built.engine, self.built.models.tokenizer
        self._stats = IterationStats(lambda: self._scheduler.num_queued)
        self._scheduler = Scheduler(self.engine, max_batch_size, 1 << 30, float("inf"), self._stats.on_round)
        self._scheduler.start()
        self._closed = False

    # ------------------------------------------------------------------ requests
    def _submit(self, prompt: str | Sequence[int], params: SamplingParams | None, streaming: bool) -> "PendingOutput":
        if self._closed:
            raise RuntimeError("this LLM has been shut down")
        params = SamplingParams() if params is None else params
        if not isinstance(params, SamplingParams):
            raise ValueError(f"sampling_params must be a cast_trtllm.SamplingParams, got {type(params).__name__}")
        ids = prompt_ids(self.tokenizer, prompt, params)
        window = self.engine.context_window
        if len(ids) >= window:
            raise ValueError(f"prompt has {len(ids)} tokens; the context window holds {window}")
        request_id = next(_ids)
        request = engine_request(params, ids, self.tokenizer, str(request_id))
        self.engine.check_request(request)
        pending = PendingOutput(self, OutputBuilder(request_id, prompt if isinstance(prompt, str) else None, ids,
                                                    params, self.tokenizer), streaming)
        self._scheduler.submit(request, pending.on_tokens, pending.on_done)
        return pending

    def generate(self, inputs: str | Sequence[int] | Sequence[str | Sequence[int]],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = True, **unused: Any) -> RequestOutput | list[RequestOutput]:
        """Run prompts to completion (continuous batching); one prompt -> one RequestOutput."""
        single = isinstance(inputs, str) or (len(inputs) > 0 and isinstance(inputs[0], int))
        prompts = [inputs] if single else list(inputs)
        params = list(sampling_params) if isinstance(sampling_params, (list, tuple)) else \
            [sampling_params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"sampling_params: {len(params)} given for {len(prompts)} prompts")
        pending = [self._submit(p, sp, streaming=False) for p, sp in zip(prompts, params)]
        outs = [p.result() for p in pending]
        return outs[0] if single else outs

    def generate_async(self, inputs: str | Sequence[int], sampling_params: SamplingParams | None = None,
                       streaming: bool = False, **unused: Any) -> "PendingOutput":
        """A request in flight: `async for out in ...` (streaming: one RequestOutput per round that
        added text), `await .aresult()`, `.result()`, `.abort()`."""
        return self._submit(inputs, sampling_params, streaming)

    # ------------------------------------------------------------------ stats and life
    def get_stats(self, timeout: float = 2) -> list[dict[str, Any]]:
        """The iterations since the last call (TensorRT-LLM's IterationStats as dicts)."""
        return self._stats.take(timeout)

    async def get_stats_async(self, timeout: float = 2) -> AsyncIterator[dict[str, Any]]:
        for stat in await asyncio.to_thread(self._stats.take, timeout):
            yield stat

    def shutdown(self) -> None:
        if not self._closed:
            self._closed = True
            self._scheduler.shutdown(grace_s=0.0)

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()


class PendingOutput:
    """One submitted request; the scheduler thread feeds it, callers wait on it (sync or async)."""

    def __init__(self, llm: LLM, builder: OutputBuilder, streaming: bool) -> None:
        self._llm, self._builder, self._streaming = llm, builder, streaming
        self._cv = threading.Condition()
        self._final: RequestOutput | None = None
        self._error: str | None = None
        try:
            self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
            self._queue: asyncio.Queue | None = asyncio.Queue()
        except RuntimeError:
            self._loop = self._queue = None
        self.request_id = builder.request_id

    # --- scheduler thread
    def on_tokens(self, live: Any) -> None:
        if self._streaming:
            self._push(self._builder.snapshot(live, None))

    def on_done(self, live: Any, error: str | None) -> None:
        if live is not None:
            out = self._builder.snapshot(live, live.finish_reason)
        elif error == CANCELLED:
            out = self._builder.snapshot(None, None, cancelled=True)
        else:
            out, self._error = None, error or "request failed"
        with self._cv:
            self._final = out
            self._cv.notify_all()
        self._push(out)

    def _push(self, out: RequestOutput | None) -> None:
        if self._loop is not None:
            try:
                self._loop.call_soon_threadsafe(self._queue.put_nowait, out)
            except RuntimeError:  # the loop has closed
                pass

    def _done(self) -> bool:
        return self._final is not None or self._error is not None

    # --- callers
    def result(self, timeout: float | None = None) -> RequestOutput:
        with self._cv:
            if not self._cv.wait_for(self._done, timeout):
                raise TimeoutError(f"request {self.request_id} did not finish within {timeout} s")
        if self._error is not None:
            raise RuntimeError(self._error)
        return self._final

    async def aresult(self) -> RequestOutput:
        async for _ in self:
            pass
        return self.result()

    async def __aiter__(self) -> AsyncIterator[RequestOutput]:
        if self._queue is None:
            raise RuntimeError("iterate a generate_async request inside the event loop that submitted it")
        while True:
            out = await self._queue.get()
            if out is None:
                raise RuntimeError(self._error)
            if self._streaming or out.finished:
                yield out
            if out.finished:
                return

    def abort(self) -> None:
        """Cancel it: it finishes with finish_reason "cancelled" and the tokens it had."""
        self._llm._scheduler.cancel(str(self.request_id))

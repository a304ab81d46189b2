"""`SamplingParams` with TensorRT-LLM's field names (`tensorrt_llm.SamplingParams`): what a
caller asks of one generation. The LLM API, the OpenAI server and the Triton model all build
their engine requests from it (`runtime.llm.requests.engine_request`).

Honoured, with TensorRT-LLM's meaning: max_tokens, end_id (-1: none), pad_id, stop,
stop_token_ids, include_stop_str_in_output, bad, bad_token_ids, min_tokens, ignore_eos,
temperature, top_k, top_p, seed, repetition_penalty, presence_penalty, frequency_penalty,
min_p, logprobs, detokenize, add_special_tokens, truncate_prompt_tokens,
skip_special_tokens, spaces_between_special_tokens, n = best_of = 1.
Penalties and min_p run on the target's verified rows (`cast_trtllm.penalties`), so greedy
CAST still equals AR under them. Everything else is accepted only at its neutral value;
otherwise construction raises one `ValueError` line naming the field.

Greedy as TensorRT-LLM decides it: temperature 0, top_k 1, top_p 0, or none of temperature
/ top_k / top_p given. A temperature alone samples at it (top_k, top_p off); None means
TensorRT-LLM's runtime default (temperature 1, top_k 0 = off, top_p 1 = off here).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from cast_trtllm.logit_processing import MAX_TOP_LOGPROBS
from cast_trtllm.penalties import Penalties
from cast_trtllm.sampling import SamplingParams as SamplingLaw

_BEAM = "beam search is not supported (CAST verifies one sequence per request)"
_LOGITS = "the engine returns no logits (use logprobs)"
# field -> (its neutral value(s), why nothing else is accepted)
UNSUPPORTED: dict[str, tuple[tuple[Any, ...], str]] = {
    "n": ((1,), "one sequence per request (send the prompt n times, with different seeds)"),
    "best_of": ((None, 1), "one sequence per request"),
    "use_beam_search": ((False,), _BEAM),
    "beam_search_diversity_rate": ((None,), _BEAM), "length_penalty": ((None,), _BEAM),
    "early_stopping": ((None,), _BEAM), "beam_width_array": ((None,), _BEAM),
    "guided_decoding": ((None,), "guided decoding is not supported"),
    "lookahead_config": ((None,), "lookahead decoding is a different speculative method"),
    "embedding_bias": ((None,), "a logit bias is not supported"),
    "logits_processor": ((None,), "custom logits processors are not supported (they may break losslessness)"),
    "apply_batched_logits_processor": ((False,), "custom logits processors are not supported"),
    "no_repeat_ngram_size": ((None,), "n-gram bans are not supported (use bad)"),
    "top_p_min": ((None,), "top-p decay is not supported"), "top_p_reset_ids": ((None,), "top-p decay is not supported"),
    "top_p_decay": ((None,), "top-p decay is not supported"),
    "prompt_logprobs": ((None, 0), "prompt logprobs are not kept"),
    "return_context_logits": ((False,), _LOGITS), "return_generation_logits": ((False,), _LOGITS),
    "return_encoder_output": ((False,), "the target is decoder-only"),
    "additional_model_outputs": ((None,), "no additional model outputs are gathered"),
    "exclude_input_from_output": ((True,), "outputs never repeat the prompt"),
    "return_perf_metrics": ((False,), "per-request perf metrics are not kept (LLM.get_stats has per-round ones)"),
}


def _number(name: str, value: Any, ok: bool, what: str) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not ok):
        raise ValueError(f"SamplingParams.{name} must be {what}, got {value!r}")


def _ints(name: str, value: Any) -> None:
    if value is not None and (not isinstance(value, (list, tuple)) or
                              any(isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in value)):
        raise ValueError(f"SamplingParams.{name} must be a list of token ids >= 0, got {value!r}")


def _strings(name: str, value: Any) -> tuple[str, ...]:
    words = (value,) if isinstance(value, str) else tuple(value or ())
    if any(not isinstance(w, str) or not w for w in words):
        raise ValueError(f"SamplingParams.{name} must be a non-empty string or a list of them, got {value!r}")
    return words


@dataclass(slots=True)
class SamplingParams:
    end_id: int | None = None
    pad_id: int | None = None
    max_tokens: int = 32
    bad: str | list[str] | None = None
    bad_token_ids: list[int] | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    embedding_bias: Any = None
    logits_processor: Any = None
    apply_batched_logits_processor: bool = False
    n: int = 1
    best_of: int | None = None
    use_beam_search: bool = False
    top_k: int | None = None
    top_p: float | None = None
    top_p_min: float | None = None
    top_p_reset_ids: int | None = None
    top_p_decay: float | None = None
    seed: int | None = None
    temperature: float | None = None
    min_tokens: int | None = None
    beam_search_diversity_rate: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    length_penalty: float | None = None
    early_stopping: int | None = None
    no_repeat_ngram_size: int | None = None
    min_p: float | None = None
    beam_width_array: list[int] | None = None
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    return_context_logits: bool = False
    return_generation_logits: bool = False
    exclude_input_from_output: bool = True
    return_encoder_output: bool = False
    return_perf_metrics: bool = False
    additional_model_outputs: Any = None
    lookahead_config: Any = None
    guided_decoding: Any = None
    ignore_eos: bool = False
    detokenize: bool = True
    add_special_tokens: bool = True
    truncate_prompt_tokens: int | None = None
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True

    def __post_init__(self) -> None:
        for name, (neutral, why) in UNSUPPORTED.items():
            value = getattr(self, name)
            if not any(value is v or (type(value) is type(v) and value == v) for v in neutral):
                raise ValueError(f"SamplingParams.{name}={value!r} is not supported: {why}")
        if isinstance(self.logprobs, bool):  # as TensorRT-LLM: True = the sampled token's logprob only
            self.logprobs = 0 if self.logprobs else None
        _number("max_tokens", self.max_tokens, isinstance(self.max_tokens, int) and self.max_tokens >= 1,
                "an integer >= 1")
        _number("temperature", self.temperature, self.temperature is not None and 0 <= self.temperature < 1e6,
                "a number >= 0 (0 = greedy)")
        _number("top_k", self.top_k, isinstance(self.top_k, int) and self.top_k >= 0, "an integer >= 0 (0 = off)")
        _number("top_p", self.top_p, self.top_p is not None and 0 <= self.top_p <= 1, "a number in [0, 1]")
        _number("seed", self.seed, isinstance(self.seed, int), "an integer")
        _number("min_tokens", self.min_tokens, isinstance(self.min_tokens, int) and self.min_tokens >= 0,
                "an integer >= 0")
        _number("end_id", self.end_id, isinstance(self.end_id, int) and self.end_id >= -1, "a token id or -1 (none)")
        _number("pad_id", self.pad_id, isinstance(self.pad_id, int) and self.pad_id >= 0, "a token id")
        _number("truncate_prompt_tokens", self.truncate_prompt_tokens,
                isinstance(self.truncate_prompt_tokens, int) and self.truncate_prompt_tokens >= 1, "an integer >= 1")
        _number("logprobs", self.logprobs, isinstance(self.logprobs, int) and 0 <= self.logprobs <= MAX_TOP_LOGPROBS,
                f"an integer in [0, {MAX_TOP_LOGPROBS}]")
        _ints("stop_token_ids", self.stop_token_ids)
        _ints("bad_token_ids", self.bad_token_ids)
        _strings("stop", self.stop)
        _strings("bad", self.bad)
        try:
            self.penalties()
        except ValueError as err:
            raise ValueError(f"SamplingParams.{err}") from None

    # ------------------------------------------------------------------ what the engine runs
    @property
    def greedy(self) -> bool:
        if self.temperature == 0 or self.top_k == 1 or self.top_p == 0:
            return True
        return self.temperature is None and self.top_k is None and self.top_p is None

    def law(self) -> SamplingLaw:
        """The target's sampling law (temperature, top-k, top-p, seed) the walk verifies against."""
        if self.greedy:
            return SamplingLaw(temperature=0.0, seed=self.seed)
        return SamplingLaw(temperature=1.0 if self.temperature is None else float(self.temperature),
                           top_k=self.top_k or 0, top_p=1.0 if self.top_p is None else float(self.top_p),
                           seed=None if self.seed is None else self.seed % (1 << 63))

    def penalties(self) -> Penalties | None:
        """The penalties and min_p applied to the target's rows (None: none asked for)."""
        pen = Penalties(repetition=1.0 if self.repetition_penalty is None else self.repetition_penalty,
                        presence=self.presence_penalty or 0.0, frequency=self.frequency_penalty or 0.0,
                        min_p=self.min_p or 0.0)
        return pen if pen.counts_tokens or pen.min_p > 0 else None

    @property
    def stop_strings(self) -> tuple[str, ...]:
        return _strings("stop", self.stop)

    @property
    def bad_words(self) -> tuple[str, ...]:
        return _strings("bad", self.bad)

    def replace(self, **changes: Any) -> SamplingParams:
        """A validated copy with `changes`."""
        return SamplingParams(**{**{f.name: getattr(self, f.name) for f in fields(self)}, **changes})

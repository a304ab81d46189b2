"""OpenAI request bodies (the fields `trtllm-serve` accepts), as pydantic models (responses:
`responses.py`, plain dicts of the same shapes).

Requests are strict (no "5" for 5, no true for 1) and closed: an unknown field is an
error, never silently dropped. Fields that OpenAI defines but this server cannot honour
without changing the output (n > 1, best_of, penalties, logit_bias, echo, suffix) are
declared so that `unsupported()` can name them in a 400 error. `logprobs` (completions:
an int, the top entries per token) and `logprobs` + `top_logprobs` (chat) are honoured.
Extensions, vLLM / trtllm-serve extra body fields: `top_k`, `min_tokens`, `min_p`,
`repetition_penalty` (with OpenAI's `presence_penalty` / `frequency_penalty`: run in the
engine, on the target's logits, `cast_trtllm.penalties`), `stop_token_ids`, `bad_words`,
`include_stop_str_in_output`, `skip_special_tokens`, `spaces_between_special_tokens`,
`chat_template_kwargs` (chat: passed to the chat template), and `cast` =
{"method": "ar" | "chain" | "cast", "budget": N | "auto"} choosing the speculative method.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from cast_trtllm.logit_processing import MAX_TOP_LOGPROBS

MAX_STOP_STRINGS = 4  # as OpenAI


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class CastOptions(_Strict):
    """Per-request speculative decoding: method and tree budget N ('auto': chosen per round)."""

    method: Literal["ar", "chain", "cast"] | None = None  # None: the server's --method
    budget: int | Literal["auto"] | None = None  # None: the server's --budget


class StreamOptions(_Strict):
    include_usage: bool = False  # one last chunk with `usage` and no choices


class GenerationRequest(_Strict):
    """Fields shared by /v1/completions and /v1/chat/completions."""

    model: str
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=2.0)  # OpenAI's default: sampled
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=-1)  # extension; 0 or -1: off
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    repetition_penalty: float = Field(1.0, gt=0.0)  # extension (trtllm-serve / vLLM)
    min_p: float = Field(0.0, ge=0.0, le=1.0)  # extension
    include_stop_str_in_output: bool = False  # extension: the text keeps the stop string that ended it
    skip_special_tokens: bool = True  # extension: how the output is detokenized
    spaces_between_special_tokens: bool = True  # extension
    logit_bias: dict[str, float] | None = None
    user: str | None = None  # accepted, unused (it does not change the output)
    ignore_eos: bool = False  # extension (vLLM / TensorRT-LLM): run to max_tokens
    min_tokens: int = Field(0, ge=0)  # extension: no EOS / stop token id before this many tokens
    stop_token_ids: list[int] | None = None  # extension: more token ids that end the answer (kept in it)
    bad_words: list[str] | None = None  # extension: words never generated (tokenized without special tokens)
    cast: CastOptions = Field(default_factory=CastOptions)

    def stop_strings(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    def top_logprobs_asked(self) -> int | None:
        """Top entries per token of the logprobs asked for (None: no logprobs)."""
        return None

    def unsupported(self) -> tuple[str, str] | None:
        """(field, message) of the first field this server cannot honour, or None."""
        checks = [
            ("n", self.n != 1, f"n={self.n} is not supported: this server returns exactly one choice (n must be 1)"),
            ("logit_bias", bool(self.logit_bias), "logit_bias is not supported"),
            ("stop", len(self.stop_strings()) > MAX_STOP_STRINGS, f"stop holds more than {MAX_STOP_STRINGS} strings"),
            ("stop", any(not s for s in self.stop_strings()),
             "stop holds an empty string; every stop must be non-empty"),
            ("cast.budget", isinstance(self.cast.budget, int) and self.cast.budget < 0,
             "cast.budget must be 'auto' or an integer >= 0"),
            ("stream_options", self.stream_options is not None and not self.stream,
             "stream_options is only allowed with stream=true"),
            ("bad_words", any(not w for w in self.bad_words or ()), "bad_words holds an empty word"),
            ("stop_token_ids", any(t < 0 for t in self.stop_token_ids or ()), "stop_token_ids must be >= 0"),
        ]
        return next(((field, message) for field, bad, message in checks if bad), None)


class CompletionRequest(GenerationRequest):
    prompt: str | list[str] | list[int]  # text, [text], or token ids
    logprobs: int | None = None
    best_of: int | None = None
    echo: bool = False
    suffix: str | None = None

    def single_prompt(self) -> str | list[int]:
        """The prompt text, or its token ids ([text] counts as text)."""
        if isinstance(self.prompt, list) and len(self.prompt) == 1 and isinstance(self.prompt[0], str):
            return self.prompt[0]
        return self.prompt

    def top_logprobs_asked(self) -> int | None:
        return self.logprobs

    def unsupported(self) -> tuple[str, str] | None:
        checks = [
            ("logprobs", self.logprobs is not None and not 0 <= self.logprobs <= MAX_TOP_LOGPROBS,
             f"logprobs={self.logprobs} is out of range: must be in [0, {MAX_TOP_LOGPROBS}]"),
            ("best_of", self.best_of not in (None, 1), f"best_of={self.best_of} is not supported (must be 1)"),
            ("echo", self.echo, "echo is not supported"),
            ("suffix", self.suffix is not None, "suffix is not supported"),
            ("prompt", isinstance(self.prompt, list) and len(self.prompt) > 1 and
             all(isinstance(p, str) for p in self.prompt), "send exactly one prompt per request"),
        ]
        own = next(((field, message) for field, bad, message in checks if bad), None)
        return own or super().unsupported()


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "user", "assistant"]
    content: str | list[TextPart]

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class ChatCompletionRequest(GenerationRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)  # the newer name of max_tokens
    logprobs: bool = False
    top_logprobs: int | None = None
    chat_template_kwargs: dict[str, object] | None = None  # extension: e.g. {"enable_thinking": false} (Qwen3)

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def top_logprobs_asked(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def unsupported(self) -> tuple[str, str] | None:
        checks = [
            ("top_logprobs", self.top_logprobs is not None and not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS,
             f"top_logprobs={self.top_logprobs} is out of range: must be in [0, {MAX_TOP_LOGPROBS}]"),
            ("top_logprobs", self.top_logprobs is not None and not self.logprobs,
             "top_logprobs needs logprobs=true"),
            ("max_completion_tokens", self.max_tokens is not None and self.max_completion_tokens is not None,
             "send max_tokens or max_completion_tokens, not both"),
            ("messages", self.messages[-1].role == "assistant",
             "the last message must not be from the assistant: this server generates the next assistant turn"),
        ]
        own = next(((field, message) for field, bad, message in checks if bad), None)
        return own or super().unsupported()

"""Response bodies of one request in OpenAI's shapes: a full completion, or the
server-sent-event chunks of a stream (`text_completion` / `chat.completion.chunk`), with
the logprobs of the tokens each one carries when the request asked for them.

Logprobs are the engine's (`Request.logprobs`): the log_softmax of the target row, after
min_tokens / bad_words, that produced each committed token; each token's are sent once
(streaming: the tokens that arrived since the last chunk)."""

from __future__ import annotations

import json
from typing import Any

from runtime.serving.openai.service import Update


class LogprobStream:
    """Logprobs of the tokens not yet sent, shaped for /v1/completions or /v1/chat/completions."""

    def __init__(self, tokenizer: Any, chat: bool) -> None:
        self.tokenizer, self.chat = tokenizer, chat
        self.sent = 0  # tokens whose logprobs were sent
        self.offset = 0  # completions' text_offset of the next token

    def _text(self, token: int) -> str:
        return self.tokenizer.decode([token], skip_special_tokens=False)

    def take(self, tokens: list[int], logprobs: list[float], top: list[list[tuple[int, float]]]) -> dict:
        """The logprobs object of tokens[sent:], marking them sent."""
        new = range(self.sent, min(len(tokens), len(logprobs)))
        self.sent = max(self.sent, new.stop)
        texts = [self._text(tokens[i]) for i in new]
        if self.chat:
            def entry(text: str, logprob: float) -> dict:
                return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

            return {"content": [{**entry(text, logprobs[i]),
                                 "top_logprobs": [entry(self._text(t), lp) for t, lp in top[i]]}
                                for i, text in zip(new, texts)]}
        offsets = []
        for text in texts:
            offsets.append(self.offset)
            self.offset += len(text)
        return {"tokens": texts, "token_logprobs": [logprobs[i] for i in new],
                "top_logprobs": [{self._text(t): lp for t, lp in top[i]} for i in new], "text_offset": offsets}


class ResponseFormat:
    def __init__(self, request_id: str, model: str, created: int, chat: bool, prompt_tokens: int,
                 logprobs: LogprobStream | None = None) -> None:
        self.request_id, self.model, self.created, self.chat = request_id, model, created, chat
        self.prompt_tokens, self.logprobs = prompt_tokens, logprobs

    def _usage(self, completion_tokens: int) -> dict[str, int]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": completion_tokens,
                "total_tokens": self.prompt_tokens + completion_tokens}

    def _body(self, choices: list[dict], stream: bool = True, **extra: Any) -> dict[str, Any]:
        kind = "text_completion" if not self.chat else "chat.completion.chunk" if stream else "chat.completion"
        return {"id": self.request_id, "object": kind, "created": self.created, "model": self.model,
                "choices": choices, **extra}

    def _choice(self, piece: dict[str, Any], finish_reason: str | None, update: Update | None) -> dict[str, Any]:
        """One choice, with the logprobs of the tokens `update` adds to what was sent (None: not asked for)."""
        logprobs = None
        if self.logprobs is not None and update is not None:
            logprobs = self.logprobs.take(update.tokens, update.logprobs, update.top_logprobs)
        choice = {"index": 0, **piece, "logprobs": logprobs, "finish_reason": finish_reason}
        if finish_reason is not None and update is not None:  # trtllm-serve's, on the choice that ends it
            choice["avg_decoded_tokens_per_iter"] = update.avg_decoded_tokens_per_iter
        return choice

    def full(self, text: str, final: Update) -> dict[str, Any]:
        """The whole answer of a non-streamed request."""
        piece = {"message": {"role": "assistant", "content": text}} if self.chat else {"text": text}
        return self._body([self._choice(piece, final.finish_reason, final)], stream=False,
                          usage=self._usage(len(final.tokens)))

    def role_chunk(self) -> dict[str, str]:
        """A chat stream's first chunk: who speaks."""
        return _event(self._body([self._choice({"delta": {"role": "assistant", "content": ""}}, None, None)]))

    def chunk(self, text: str, finish_reason: str | None, update: Update | None = None) -> dict[str, str]:
        """New text (may be empty on the last chunk, which carries the finish reason), with the
        logprobs of every token `update` holds that no earlier chunk carried."""
        piece = ({"delta": {"content": text} if text else {}}) if self.chat else {"text": text}
        return _event(self._body([self._choice(piece, finish_reason, update)]))

    def usage_chunk(self, completion_tokens: int) -> dict[str, str]:
        """The last chunk when `stream_options.include_usage`: no choices, the usage."""
        return _event(self._body([], usage=self._usage(completion_tokens)))


def _event(body: dict[str, Any]) -> dict[str, str]:
    return {"data": json.dumps(body)}

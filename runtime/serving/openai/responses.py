"""Response bodies of one request in OpenAI's shapes: a full completion, or the
server-sent-event chunks of a stream (`text_completion` / `chat.completion.chunk`), with
the logprobs of the tokens each one carries when the request asked for them."""

from __future__ import annotations

import json
from typing import Any

from runtime.serving.openai.logprobs import LogprobStream
from runtime.serving.openai.schemas import (
    ChatChoice, ChatCompletionResponse, CompletionChoice, CompletionResponse, Delta, Usage,
)
from runtime.serving.openai.service import Update


class ResponseFormat:
    def __init__(self, request_id: str, model: str, created: int, chat: bool, prompt_tokens: int,
                 logprobs: LogprobStream | None = None) -> None:
        self.request_id, self.model, self.created, self.chat = request_id, model, created, chat
        self.prompt_tokens, self.logprobs = prompt_tokens, logprobs

    def _logprobs(self, update: Update | None) -> dict | None:
        """The logprobs of the tokens `update` adds to what was sent (None: not asked for)."""
        if self.logprobs is None or update is None:
            return None
        return self.logprobs.take(update.tokens, update.logprobs, update.top_logprobs)

    def _usage(self, completion_tokens: int) -> Usage:
        return Usage(prompt_tokens=self.prompt_tokens, completion_tokens=completion_tokens,
                     total_tokens=self.prompt_tokens + completion_tokens)

    def _head(self, kind: str) -> dict[str, Any]:
        return {"id": self.request_id, "object": kind, "created": self.created, "model": self.model}

    def full(self, text: str, final: Update) -> CompletionResponse | ChatCompletionResponse:
        usage, logprobs = self._usage(len(final.tokens)), self._logprobs(final)
        if self.chat:
            choice = ChatChoice(message=Delta(role="assistant", content=text), logprobs=logprobs,
                                finish_reason=final.finish_reason)
            return ChatCompletionResponse(**self._head("chat.completion"), choices=[choice], usage=usage)
        choice = CompletionChoice(text=text, logprobs=logprobs, finish_reason=final.finish_reason)
        return CompletionResponse(**self._head("text_completion"), choices=[choice], usage=usage)

    def role_chunk(self) -> dict[str, str]:
        """A chat stream's first chunk: who speaks."""
        return self._chunk({"delta": {"role": "assistant", "content": ""}}, None)

    def chunk(self, text: str, finish_reason: str | None, update: Update | None = None) -> dict[str, str]:
        """New text (may be empty on the last chunk, which carries the finish reason), with the
        logprobs of every token `update` holds that no earlier chunk carried."""
        piece = ({"delta": {"content": text} if text else {}}) if self.chat else {"text": text}
        return self._chunk(piece, finish_reason, self._logprobs(update))

    def _chunk(self, piece: dict[str, Any], finish_reason: str | None, logprobs: dict | None = None) -> dict[str, str]:
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        choice = {"index": 0, **piece, "logprobs": logprobs, "finish_reason": finish_reason}
        return {"data": json.dumps({**self._head(kind), "choices": [choice]})}

    def usage_chunk(self, completion_tokens: int) -> dict[str, str]:
        """The last chunk when `stream_options.include_usage`: no choices, the usage."""
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        usage = self._usage(completion_tokens).model_dump()
        return {"data": json.dumps({**self._head(kind), "choices": [], "usage": usage})}

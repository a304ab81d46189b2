"""Response bodies of one request in OpenAI's shapes: a full completion, or the
server-sent-event chunks of a stream (`text_completion` / `chat.completion.chunk`)."""

from __future__ import annotations

import json
from typing import Any

from runtime.serving.openai.schemas import (
    ChatChoice, ChatCompletionResponse, CompletionChoice, CompletionResponse, Delta, Usage,
)
from runtime.serving.openai.service import Update


class ResponseFormat:
    def __init__(self, request_id: str, model: str, created: int, chat: bool, prompt_tokens: int) -> None:
        self.request_id, self.model, self.created, self.chat = request_id, model, created, chat
        self.prompt_tokens = prompt_tokens

    def _usage(self, completion_tokens: int) -> Usage:
        return Usage(prompt_tokens=self.prompt_tokens, completion_tokens=completion_tokens,
                     total_tokens=self.prompt_tokens + completion_tokens)

    def _head(self, kind: str) -> dict[str, Any]:
        return {"id": self.request_id, "object": kind, "created": self.created, "model": self.model}

    def full(self, text: str, final: Update) -> CompletionResponse | ChatCompletionResponse:
        usage = self._usage(len(final.tokens))
        if self.chat:
            choice = ChatChoice(message=Delta(role="assistant", content=text), finish_reason=final.finish_reason)
            return ChatCompletionResponse(**self._head("chat.completion"), choices=[choice], usage=usage)
        choice = CompletionChoice(text=text, finish_reason=final.finish_reason)
        return CompletionResponse(**self._head("text_completion"), choices=[choice], usage=usage)

    def role_chunk(self) -> dict[str, str]:
        """A chat stream's first chunk: who speaks."""
        return self._chunk({"delta": {"role": "assistant", "content": ""}}, None)

    def chunk(self, text: str, finish_reason: str | None) -> dict[str, str]:
        """New text (may be empty on the last chunk, which carries the finish reason)."""
        piece = ({"delta": {"content": text} if text else {}}) if self.chat else {"text": text}
        return self._chunk(piece, finish_reason)

    def _chunk(self, piece: dict[str, Any], finish_reason: str | None) -> dict[str, str]:
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        choice = {"index": 0, **piece, "logprobs": None, "finish_reason": finish_reason}
        return {"data": json.dumps({**self._head(kind), "choices": [choice]})}

    def usage_chunk(self, completion_tokens: int) -> dict[str, str]:
        """The last chunk when `stream_options.include_usage`: no choices, the usage."""
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        usage = self._usage(completion_tokens).model_dump()
        return {"data": json.dumps({**self._head(kind), "choices": [], "usage": usage})}

"""OpenAI `logprobs` objects of the committed tokens, sent once each (streaming: the tokens
that arrived since the last chunk). The values are the engine's (`Request.logprobs`): the
log_softmax of the target row, after min_tokens / bad_words, that produced each token."""

from __future__ import annotations

from typing import Any


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
